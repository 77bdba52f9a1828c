// The pieces of a consumer warp group's main loop (64 rows of the item's Q tile per group): the two
// MMAs, the scores of one K tile (mask, online softmax), the start of an item and the hand-back of
// ring slots to the producer.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/forward/epilogue.cuh"
#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/mask.cuh"
#include "cuda/sm90/forward/scheduler.cuh"
#include "cuda/sm90/shared/softmax.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

template <typename Cfg>
using ScoreTile = tlx::AccumFragment<Cfg::kBlockN>;
template <typename Cfg>
using ProbTile = tlx::AFragment<typename Cfg::Element, Cfg::kBlockN>;

// A consumer's wait for the K or V tile at ring position `st`. The paged producer's cp.async
// copies are generic-proxy writes: a proxy fence orders them before the wgmma that reads the tile.
template <typename Cfg, typename Ring, typename State>
__device__ __forceinline__ void wait_kv(Ring ring, const State& st) {
  ring.wait(st);
  if constexpr (Cfg::kPaged) tlx::fence_proxy_async_smem();
}

// What a consumer thread carries through an item.
template <typename Cfg>
struct ConsumerState {
  tlx::AccumFragment<Cfg::kDv> o;
  OnlineSoftmax softmax;
};

// S = Q K^T for this warp group's 64 rows (SS wgmma).
template <typename Cfg>
__device__ __forceinline__ void gemm_qk(ScoreTile<Cfg>& s, const typename Cfg::QTile& q,
                                        const typename Cfg::KTile& k, int group) {
  tlx::gemm_ss_k_major(s, q, group * 64, k);
}

// O += P V: P from registers, V [kBlockN x D] read as an MN-major B (RS wgmma).
template <typename Cfg>
__device__ __forceinline__ void gemm_pv(tlx::AccumFragment<Cfg::kDv>& o, const ProbTile<Cfg>& p,
                                        const typename Cfg::VTile& v) {
  tlx::gemm_rs_mn_major(o, p, v);
}

// Masks one S tile where it needs it and runs the online softmax on it.
template <typename Cfg>
__device__ __forceinline__ void tile_scores(ScoreTile<Cfg>& s, ConsumerState<Cfg>& cs,
                                            const typename Cfg::Mask& mask, int32_t key0,
                                            int32_t len_k, float scale_log2, float (&alpha)[2]) {
  if (mask.needs_mask(key0, Cfg::kBlockN, len_k)) mask.apply(s, key0);
  cs.softmax.update(s, scale_log2, alpha);
}

// The scores of one S tile in the local-attention kernels: softcap bends the raw scores first (so
// that masked keys stay -inf), then the mask where the tile needs it (may_mask: where some tile of
// the range may), then the online softmax. In the softcap kernels (Cfg::kSoftcap) the scores it
// takes are tanh(s / c), the cap c folded into score_scale (fwd_args.hpp), and half the
// exponentials run on the FMA pipe: the tanh doubles the MUFU unit's work, which then outlasts the
// MMAs it should hide under.
// Every how many column blocks of an S tile one takes its exponentials off the MUFU unit: half of
// them in the softcap kernels, none elsewhere.
template <typename Cfg>
inline constexpr int kFmaExp2Every = Cfg::kSoftcap ? 2 : 0;

template <typename Cfg>
__device__ __forceinline__ void local_tile_scores(ScoreTile<Cfg>& s, ConsumerState<Cfg>& cs,
                                                  const FwdLocalArgs& a,
                                                  const typename Cfg::Mask& mask, int32_t key0,
                                                  int32_t len_k, bool may_mask, float (&alpha)[2]) {
  if constexpr (Cfg::kSoftcap)
    s.for_each([&](float& x, int, int) { x = fast_tanh(x * a.softcap_in); });
  if (may_mask && mask.needs_mask(key0, Cfg::kBlockN, len_k)) mask.apply(s, key0);
  cs.softmax.template update<Cfg::kBlockN, kFmaExp2Every<Cfg>>(s, a.score_scale_log2, alpha);
}

// Starts an item for one consumer thread: clears the running state; an item whose rows see no key
// is finished here (zeros, LSE -inf) and false is returned.
template <typename Cfg>
__device__ __forceinline__ bool start_item(ConsumerState<Cfg>& cs, typename Cfg::Shared& s,
                                           const CUtensorMap* tm_o, const FwdArgs& a,
                                           const typename Cfg::Item& w, int group,
                                           typename Cfg::Mask& mask) {
  mask = Cfg::Mask::template of<Cfg::kBlockM, Cfg::kD>(a, w, group);
  cs.o.fill(0.f);
  cs.softmax.reset();
  if (w.n_blocks == 0) {
    epilogue<Cfg>(cs.o, cs.softmax, s, tm_o, a, w, group, mask, true);
    return false;
  }
  mask.load_keys(a, w);
  return true;
}

// Runs body(item, mask) on each of the group's items, started (see start_item) with its Q tile
// (at ring position qs) arrived: items without rows are skipped, and those whose rows see no key
// are finished on the way.
template <typename Cfg, typename Body>
__device__ __forceinline__ void for_each_item(ConsumerState<Cfg>& cs, typename Cfg::Shared& s,
                                              const CUtensorMap* tm_o, const FwdArgs& a,
                                              int64_t n_items, int group,
                                              const tlx::PipelineState<Cfg::kQStages>& qs,
                                              Body&& body) {
  ItemScheduler<Cfg, false> items;
  typename Cfg::Item w;
  while (items.next(s, a, n_items, w)) {
    if (!w.active) continue;
    typename Cfg::Mask mask;
    if (!start_item<Cfg>(cs, s, tm_o, a, w, group, mask)) continue;
    s.q_ring.wait(qs);
    body(static_cast<const typename Cfg::Item&>(w), static_cast<const typename Cfg::Mask&>(mask));
  }
}

// K tile `it` of the item (at ring position `ks`) goes back to the producer, and with the item's
// last K tile its Q tile (at `qs`); one arrival per warp.
template <typename Cfg>
__device__ __forceinline__ void release_k_tile(typename Cfg::Shared& s,
                                               const tlx::PipelineState<Cfg::kStages>& ks,
                                               const tlx::PipelineState<Cfg::kQStages>& qs, int it,
                                               int n_blocks) {
  if (!tlx::lane_is_leader()) return;
  s.k_ring().release(ks);
  if (it == n_blocks - 1) s.q_ring.release(qs);
}

// O += P V on the V tile at ring position `st` once it has arrived, waited for; then the tile goes
// back to the producer and `st` moves on.
template <typename Cfg>
__device__ __forceinline__ void pv_and_release(typename Cfg::Shared& s, ConsumerState<Cfg>& cs,
                                               const ProbTile<Cfg>& p,
                                               tlx::PipelineState<Cfg::kStages>& st) {
  wait_kv<Cfg>(s.v_ring(), st);
  tlx::fence_operand(cs.o);
  gemm_pv<Cfg>(cs.o, p, s.v[st.stage]);
  tlx::wgmma_wait<0>();
  tlx::fence_operand(cs.o);
  if (tlx::lane_is_leader()) s.v_ring().release(st);
  st.advance();
}

}  // namespace jfa::sm90
