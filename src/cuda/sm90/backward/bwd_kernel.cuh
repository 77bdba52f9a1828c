// Hopper backward kernel of jagged attention. A work item is one K tile (128 keys) of one kv head
// of one sequence, or the keys of several short sequences together (a shared tile, at most 128
// keys and 128 query rows; bwd_work_list.cuh); a persistent grid claims items from a global
// counter. The item's K and V stay in shared memory while it walks the query rows (64 per step at
// head_dim 96 and 128, 128 at 32 and 64) of each query head of its group that see any of its
// keys; dK and dV accumulate in registers over the whole walk, so they need no atomics and are
// summed over the group's query heads in a fixed order; at the item's end they go out by TMA
// stores (store_key_rows). Where (K tile, kv head) items are too few to fill the GPU, a call may
// split each into slices of the group's query heads (bwd_head_splits.hpp), whose dK and dV meet
// in float32 accumulators instead.
//
// Roles (128 threads per warp group, one CTA per SM):
//   warp group 0   producer: one thread loads K and V per item and, per step, Q and dO with their
//                  rows of LSE and D (TMA) into a ring guarded by mbarriers.
//   warp groups 1, 2  consumers, keys 64 g .. 64 g + 63 of the tile each, per step:
//                  S^T = K Q^T and dP^T = V dO^T (SS wgmma), P^T = exp2(S^T scale log2e - LSE2),
//                  dS^T = P^T (dP^T - D); dV += P^T dO and dK += dS^T Q (RS wgmma, dO and Q read
//                  as MN-major B); dS^T to shared memory, dQ = dS K (SS wgmma, both operands
//                  MN-major; each group one part of 64 rows: half the columns at head_dim 128,
//                  one q tile's rows at 32 and 64, all 96 columns over its own keys at 96),
//                  staged in shared memory for the dQ writer.
//   warp 1 of group 0  dQ writer: adds each group's staged dQ with one bulk reduction per step (in
//                  deterministic mode in a fixed order of the K tiles, one semaphore per q tile;
//                  a shared tile's rows get dQ from that item alone and need no order).
// A step's rows of LSE and D are those of its query tokens; the rows past the sequence's end (the
// next sequence's, or past total_q), keys past its end and, under the causal mask, keys a query
// does not see are set to P = 0 on the steps that hold any (StepMask); in a shared tile each row
// sees its own sequence's keys (the masks set P and dS to 0 after the MMAs: a NaN or infinite
// input element of one sequence can reach the gradients of the other sequences of its shared tile,
// and of the sequence before it, whose last q tile loads its first rows). Offsets are not validated
// on the device; they are clamped so that no access leaves the caller's buffers (results for
// invalid offsets are unspecified).
//
// The roles live in bwd_scheduler.cuh, bwd_producer.cuh, bwd_gemms.cuh, bwd_mainloop.cuh,
// bwd_dq_writer.cuh and bwd_epilogue.cuh; this file holds the consumer role and the kernel entry.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/backward/bwd_dq_writer.cuh"
#include "cuda/sm90/backward/bwd_epilogue.cuh"
#include "cuda/sm90/backward/bwd_mainloop.cuh"
#include "cuda/sm90/backward/bwd_producer.cuh"
#include "cuda/sm90/backward/bwd_scheduler.cuh"
#include "cuda/sm90/backward/bwd_split_roles.cuh"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/warpgroup.hpp"

namespace jfa::sm90 {

template <typename Cfg>
__device__ __forceinline__ void bwd_consumer(typename Cfg::Shared& s, const CUtensorMap* tm_dk,
                                             const CUtensorMap* tm_dv, const BwdArgs& a,
                                             int64_t n_items, int group) {
  tlx::AccumFragment<Cfg::kD> dk, dv;
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t kv_phase = 0, dq_phase = 0;
  int ds_buf = 0;
  BwdItemScheduler<Cfg, false> items;
  BwdItem w;
  while (items.next(s, a, n_items, w)) {
    dk.fill(0.f);
    dv.fill(0.f);
    static_assert(kBwdPackRows * 4 <= sizeof(typename Cfg::Shared::KeyRowsTile),
                  "a shared tile's key ranges fit in the staging tile");
    if (w.n_seqs > 1 && w.q_tiles() > 0)
      shared_tile_key_ranges<Cfg>(tlx::smem_addr(&s.key_rows[group]), Cfg::kKeyRowsBarrier0 + group,
                                  a, w);
    if (w.q_tiles() > 0) {
      s.sync.kv_ring.wait(kv_phase);
      kv_phase ^= 1u;
      walk_item<Cfg>(s, dk, dv, a, w, group, st, ds_buf, dq_phase);
      if (tlx::lane_is_leader()) s.sync.kv_ring.release();
    }
    const int32_t key0 = w.n_block * Cfg::kBlockN + group * 64;
    store_key_rows<Cfg>(dv, 1.f, s.key_rows[group], tm_dv, a.dv_acc, a, w, group, key0);
    store_key_rows<Cfg>(dk, a.softmax_scale, s.key_rows[group], tm_dk, a.dk_acc, a, w, group, key0);
  }
  if (threadIdx.x % 128 == 0) tlx::tma_store_wait<0>();  // dK and dV written before the CTA ends
  s.sync.stop_dq_writer(group, dq_phase);
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const __grid_constant__ CUtensorMap tm_rows,
               const __grid_constant__ CUtensorMap tm_dk, const __grid_constant__ CUtensorMap tm_dv,
               const typename Cfg::Args args) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = shared_layout<typename Cfg::Shared>(smem_raw);
  const int group = tlx::warp_group_index();
  if (threadIdx.x == 0) {
    s.sync.init(Cfg::kConsumerWarps, Cfg::kDqWriterThreads);
    tlx::fence_barrier_init();
    tlx::tma_prefetch_descriptors(&tm_q, &tm_k, &tm_v, &tm_do, &tm_rows, &tm_dk, &tm_dv);
  }
  __syncthreads();
  const int64_t n_items = static_cast<int64_t>(min(*args.work_count, args.work_capacity)) *
                          args.heads_kv * (Cfg::kHeadSplits ? args.head_splits : 1);
  if (group == 0) {
    tlx::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0)
      bwd_producer<Cfg>(s, &tm_q, &tm_k, &tm_v, &tm_do, &tm_rows, args, n_items);
    else if (threadIdx.x >= Cfg::kDqWriterFirstThread)
      bwd_dq_writer<Cfg>(s, args);
  } else {
    tlx::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    if constexpr (Cfg::kSplitRoles) {
      if (group == 1)
        bwd_consumer_split_roles<Cfg, 0>(s, &tm_dk, &tm_dv, args, n_items);
      else
        bwd_consumer_split_roles<Cfg, 1>(s, &tm_dk, &tm_dv, args, n_items);
    } else {
      bwd_consumer<Cfg>(s, &tm_dk, &tm_dv, args, n_items, group - 1);
    }
  }
}

}  // namespace jfa::sm90
