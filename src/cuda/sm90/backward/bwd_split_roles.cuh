// The consumer role from head_dim 192 up (BwdConfig::kSplitRoles): both groups take the item's 64
// keys; group 0 forms S^T = K Q^T, P^T and dV += P^T dO and hands P^T to group 1, which forms
// dP^T = V dO^T, dS^T = P^T (dP^T - D) and dK += dS^T Q; each then computes its half of dQ's
// columns from dS^T in shared memory. At the item's end group 0 stages dV in V's tile and group 1
// dK in K's, and the producer loads the next item's K and V once both stores have read them.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/backward/bwd_dq_writer.cuh"
#include "cuda/sm90/backward/bwd_epilogue.cuh"
#include "cuda/sm90/backward/bwd_gemms.cuh"
#include "cuda/sm90/backward/bwd_mainloop.cuh"
#include "cuda/sm90/backward/bwd_row_terms.cuh"
#include "cuda/sm90/backward/bwd_scheduler.cuh"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

// The gradient a role accumulates over the walk: dV (value head size columns) for group 0, dK
// (head_dim columns) for group 1.
template <typename Cfg, int kRole>
using RoleGradient = tlx::AccumFragment<kRole == 0 ? Cfg::kDv : Cfg::kD>;

// One step of role kRole up to its dQ MMA: leaves dQ's MMA in flight (the gradient's is done).
template <typename Cfg, int kRole>
__device__ __forceinline__ void split_roles_step(
    typename Cfg::Shared& s, RoleGradient<Cfg, kRole>& grad, DqTile<Cfg>& dq,
    tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& op, const BwdArgs& a, const BwdItem& w,
    int32_t m, const tlx::PipelineState<Cfg::kStages>& st, int ds_buf) {
  using Tile = ScoreTile<Cfg>;
  const int32_t key0 = w.n_block * Cfg::kBlockN;
  const int32_t q0 = m * Cfg::kBlockM;
  // The thread's first column of the step's LSE and D rows; column block j is 8 j further.
  const int32_t first = row_terms_at(w.seq.q_start + q0, a.heads_q).first + Tile::col(0, 0);
  const uint32_t thread = threadIdx.x % 128;
  s.sync.q_ring.wait(st);
  Tile sc;
  if constexpr (kRole == 0) {
    gemm_keys_by_rows<Cfg>(sc, s.k, s.q[st.stage], 0);
    tlx::wgmma_wait<0>();
    tlx::fence_operand(sc.reg);
    step_probabilities<Cfg>(sc, tlx::smem_addr(s.lse2[st.stage] + first), a, w, key0, q0,
                            tlx::smem_addr(&s.key_ranges[0]));
    sc.to_a(op);
    // P^T to group 1, word i of every thread side by side. Group 1 read the previous step's P^T
    // before the last dS barrier, which this group has passed.
#pragma unroll
    for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        tlx::st_shared_u32(tlx::smem_addr(&s.p[4 * kk + i][thread]), op.reg[kk][i]);
    tlx::NamedBarrier::sync(Cfg::kPBarrier, 256);
    gemm_accumulate<Cfg>(grad, op, s.dout[st.stage]);  // dV += P^T dO
  } else {
    gemm_keys_by_rows<Cfg>(sc, s.v, s.dout[st.stage], 0);  // dP^T
    tlx::AFragment<typename Cfg::Element, Cfg::kBlockM> p;
    tlx::wgmma_wait<0>();
    tlx::fence_operand(sc.reg);
    tlx::NamedBarrier::sync(Cfg::kPBarrier, 256);
#pragma unroll
    for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        p.reg[kk][i] = tlx::ld_shared_u32(tlx::smem_addr(&s.p[4 * kk + i][thread]));
    form_ds<Cfg>(p, sc, tlx::smem_addr(s.dpsum[st.stage] + first), op, a,
                 tlx::smem_addr(s.lse2[st.stage] + first));
    // Both groups' dQ of two steps ago has read this buffer (they waited for their MMAs before
    // the last dS barrier).
    store_ds<Cfg>(op, s.ds[ds_buf], 0);
    tlx::fence_proxy_async_smem();
    gemm_accumulate<Cfg>(grad, op, s.q[st.stage]);  // dK += dS^T Q
  }
  tlx::NamedBarrier::sync(Cfg::kDsBarrier0, 256);  // dS^T of the step in shared memory
  // The gradient's MMA (issued before the barrier, so mostly done during its wait) is waited for
  // before dQ's: its register operand and dQ's accumulator together do not fit beside the
  // gradient, and ptxas would then serialize every MMA of the kernel.
  tlx::wgmma_wait<0>();
  tlx::fence_operand(grad.reg);
  tlx::fence_operand(op.reg);
  gemm_dq<Cfg>(dq, s.ds[ds_buf], s.k, kRole);
}

// Walks an item's steps (walk_q_tile's order, each of the item's query heads) for role kRole; each
// step's dQ half goes to the dQ writer. No MMA is in flight across the loop's back edge.
template <typename Cfg, int kRole>
__device__ __forceinline__ void walk_item_split_roles(typename Cfg::Shared& s,
                                                      RoleGradient<Cfg, kRole>& grad,
                                                      const BwdArgs& a, const BwdItem& w,
                                                      tlx::PipelineState<Cfg::kStages>& st,
                                                      int& ds_buf, uint32_t& dq_phase) {
  const int32_t steps = item_heads<Cfg::kHeadSplits>(a) * w.q_tiles();
  StepCursor<Cfg::kLocal> at(a, w, item_first_q_head<Cfg::kHeadSplits>(a, w));
  for (int32_t i = 0; i < steps; ++i) {
    DqTile<Cfg> dq;
    tlx::AFragment<typename Cfg::Element, Cfg::kBlockM> op;
    split_roles_step<Cfg, kRole>(s, grad, dq, op, a, w, at.m, st, ds_buf);
    tlx::wgmma_wait<0>();
    tlx::fence_operand(grad.reg);
    tlx::fence_operand(dq.reg);
    tlx::fence_operand(op.reg);
    stage_dq<Cfg>(s, dq, a, w, at.head, at.m, kRole, dq_phase);
    end_step<Cfg>(s, a, w, st, ds_buf, at);
  }
}

// A shared tile's key ranges, one row per thread of group 0, for group 0's masks; the previous
// item's reads of them are behind its item-end barrier. Group 1 reads none but waits for them
// too (it waits for group 0's first P^T anyway): with both groups passing the same barriers,
// compute-sanitizer's racecheck sees the P^T hand-off ordered, which it does not when one group
// alone passes a barrier between two hand-offs.
template <typename Cfg, int kRole>
__device__ __forceinline__ void split_roles_key_ranges(typename Cfg::Shared& s, const BwdArgs& a,
                                                       const BwdItem& w) {
  static_assert(kBwdPackRows == 128, "one row per thread of group 0");
  if constexpr (kRole == 0)
    store_shared_tile_row_keys<Cfg::kLocal>(tlx::smem_addr(&s.key_ranges[0]), a, w,
                                            threadIdx.x % 128);
  tlx::NamedBarrier::sync(Cfg::kKeyRangesBarrier, 256);
}

template <typename Cfg, int kRole>
__device__ __forceinline__ void bwd_consumer_split_roles(typename Cfg::Shared& s,
                                                         const CUtensorMap* tm_dk,
                                                         const CUtensorMap* tm_dv, const BwdArgs& a,
                                                         int64_t n_items) {
  RoleGradient<Cfg, kRole> grad;
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t kv_phase = 0, dq_phase = 0;
  int ds_buf = 0;
  BwdItemScheduler<Cfg, false> items;
  BwdItem w;
  while (items.next(s, a, n_items, w)) {
    grad.fill(0.f);
    if (w.n_seqs > 1 && w.q_tiles() > 0) split_roles_key_ranges<Cfg, kRole>(s, a, w);
    // The K and V tiles are this item's (loaded, or with no steps only free to stage in).
    s.sync.kv_ring.wait(kv_phase);
    kv_phase ^= 1u;
    if (w.q_tiles() > 0) walk_item_split_roles<Cfg, kRole>(s, grad, a, w, st, ds_buf, dq_phase);
    // Both groups are done with K and V: dV goes out from V's tile, dK from K's.
    tlx::NamedBarrier::sync(Cfg::kItemEndBarrier, 256);
    const int32_t key0 = w.n_block * Cfg::kBlockN;
    if constexpr (kRole == 0)
      store_key_rows<Cfg>(grad, 1.f, s.v, tm_dv, a.dv_acc, a, w, kRole, key0);
    else
      store_key_rows<Cfg>(grad, a.softmax_scale, s.k, tm_dk, a.dk_acc, a, w, kRole, key0);
    // The store has read the tile before the next item's K and V may arrive there.
    if (threadIdx.x % 128 == 0) tlx::tma_store_wait_read<0>();
    tlx::NamedBarrier::sync(Cfg::kKeyRowsBarrier0 + kRole, 128);
    if (tlx::lane_is_leader()) s.sync.kv_ring.release();
  }
  if (threadIdx.x % 128 == 0) tlx::tma_store_wait<0>();  // dK and dV written before the CTA ends
  s.sync.stop_dq_writer(kRole, dq_phase);
}

}  // namespace jfa::sm90
