// Device-side arguments of the sm90 backward (a POD passed by value next to the tensor maps): the
// call's Problem and what only the backward reads.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "common/visibility.hpp"
#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "cuda/sm90/shared/problem.hpp"

namespace jfa::sm90 {

struct BwdArgs : Problem {
  const BwdListEntry* work;  // built by the work-list kernel
  const float* lse2;         // [heads_q, row_len] per query token: LSE * log2(e), +inf for none
  const float* dpsum;        // [heads_q, row_len] per query token: rowsum(dO * O) - dLSE
  int32_t* sems;             // [heads_q, sem_tiles] dQ adds done per q tile (first_sem_tile)
  float* dq_acc;             // total_q x heads_q x head_dim, see dq_acc_offset
  int64_t row_len;
  int64_t sem_tiles;
  // The ragged dK and dV maps' row bound, total_k + 1: a TMA store at rows (R - (end - first),
  // end) writes rows first .. end - 1 and clips the rest (see FwdArgs::out_ragged_rows).
  int32_t key_ragged_rows;
  int32_t deterministic;
  // dq itself (T): a shared tile's rows are written there directly (bwd_dq_writer).
  void* dq;
  int64_t dq_token_stride;
  int64_t dq_head_stride;
  // The head-split kernels' (bwd_head_splits.hpp, BwdConfig::kHeadSplits): items per (K tile, kv
  // head), query heads per item (group / head_splits), and the float32 accumulators that dK
  // (unscaled) and dV are added into ([total_k, heads_kv, head_dim or head_dim_v]); the other
  // kernels read none of them.
  int32_t head_splits;
  int32_t item_heads;
  float* dk_acc;
  float* dv_acc;
};

// What the local-attention backward reads besides (BwdConfig's kLocal): the window, for the
// items' row ranges, the masks and the order of dQ's adds (causal = 0 there: the window's right
// bound of 0 holds the causal mask), and softcap, whose derivative scales dS. The sinks enter
// through the LSE alone; their gradient comes from a kernel of its own after the preprocess
// (bwd_sink_gradient).
struct BwdLocalArgs : BwdArgs {
  jfa::detail::Window window;  // resolved: the causal mask is right = 0
  float softcap_in;            // softmax_scale / softcap (0: no softcap)
  float softcap_log2;      // softcap * log2(e): P = exp2(softcap_log2 tanh(s softcap_in) - LSE2)
  float inv_softcap_log2;  // its inverse, to recover tanh from P (bwd_mainloop's form_ds)
};

inline BwdLocalArgs local_args(const BwdArgs& base, const jfa::detail::Params& p) {
  BwdLocalArgs a{};
  static_cast<BwdArgs&>(a) = base;
  a.causal = 0;
  a.window = p.window;
  if (p.softcap > 0.f) {
    const double cap_log2 = static_cast<double>(p.softcap) * 1.4426950408889634;
    a.softcap_in = p.softmax_scale / p.softcap;
    a.softcap_log2 = static_cast<float>(cap_log2);
    a.inv_softcap_log2 = static_cast<float>(1.0 / cap_log2);
  }
  return a;
}

}  // namespace jfa::sm90
