// Hopper forward kernel of jagged attention: one Q tile (64 rows per consumer warp group) of one
// head of one sequence per work item; a persistent grid takes the items (from a global counter with
// two consumer groups, round-robin with three; see scheduler.cuh).
//
// Roles (128 threads per warp group, one CTA per SM):
//   warp group 0   producer (producer.cuh): one thread issues the TMA loads of Q, K and V into
//                  rings guarded by mbarriers; its registers go to the consumers. Over a paged
//                  KV cache (producer_paged.cuh) all 128 threads copy K/V by cp.async (or one
//                  warp loads whole pages by TMA, producer_paged_tma.cuh).
//   warp groups 1.. consumers (two or three, see choices.hpp): 64 Q rows each; S = Q K^T (SS
//                  wgmma), mask (mask.cuh) and online softmax (softmax.cuh) in registers, P packed
//                  to 16 bits as the A operand of O += P V (RS wgmma, V read through the
//                  transposed-B descriptor); O staged in shared memory and written by TMA stores
//                  (epilogue.cuh).
//
// Packed tensors are addressed through one 3-D tensor map each, dims (head_dim, heads, total), box
// (64, 1, rows): a tile of sequence b starts at token cu_seqlens[b] + row0. Keys past the end of a
// sequence in its last K tile are masked; Q rows past the end are computed, and their part of an
// O tile is clipped by the ragged output map (FwdArgs::out_ragged_rows). Short sequences share
// tiles (fwd_work_list.cuh builds them, mask.cuh keeps each row to its own keys). Offsets are not
// validated on the device; they are clamped to [0, total] so that no access leaves the caller's
// buffers (results for invalid offsets are unspecified).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/mainloop_one_tile.cuh"
#include "cuda/sm90/forward/mainloop_overlapped.cuh"
#include "cuda/sm90/forward/producer.cuh"
#include "cuda/sm90/forward/producer_paged.cuh"
#include "cuda/sm90/forward/producer_paged_tma.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/grid_dependency.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/warpgroup.hpp"

namespace jfa::sm90 {

template <typename Cfg>
__device__ __forceinline__ void init_barriers(typename Cfg::Shared& s) {
  // The paged producer's 128 threads take every item and arrive on each K/V tile's full barrier
  // (producer_paged.cuh), its TMA form's 32 threads likewise, with lane 0's byte count
  // (producer_paged_tma.cuh); the TMA producer is one thread.
  constexpr uint32_t kFullArrivals = Cfg::kPagedTma ? kPagedTmaFullArrivals
                                     : Cfg::kPaged  ? kPagedProducerThreads
                                                    : 1;
  constexpr uint32_t kItemTakers = Cfg::kPagedTma ? kPagedTmaProducerThreads
                                   : Cfg::kPaged  ? kPagedProducerThreads
                                                  : 0;
  s.q_ring.init(Cfg::kConsumerWarps);
  s.items.init(Cfg::kConsumerWarps * 32 + kItemTakers);
#pragma unroll
  for (int i = 0; i < Cfg::kStages; ++i) {  // in the order they lie
    s.k_full[i].init(kFullArrivals);
    s.v_full[i].init(kFullArrivals);
    s.k_empty[i].init(Cfg::kConsumerWarps);
    s.v_empty[i].init(Cfg::kConsumerWarps);
  }
  tlx::fence_barrier_init();
}

template <typename Cfg>
__device__ __forceinline__ void consumer_loop(typename Cfg::Shared& s, const CUtensorMap* tm_o,
                                              const FwdArgs& a, int64_t n_items, int group) {
  constexpr Mainloop kLoop = Cfg::Kernel::kMainloop;
  if constexpr (kLoop == Mainloop::kOverlappedTakingTurns) {
    consumer_loop_overlapped<Cfg, true>(s, tm_o, a, n_items, group);
  } else if constexpr (kLoop == Mainloop::kOverlappedIndependent) {
    consumer_loop_overlapped<Cfg, false>(s, tm_o, a, n_items, group);
  } else {
    consumer_loop_one_tile<Cfg>(s, tm_o, a, n_items, group);
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
               const typename Cfg::Args args) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = shared_layout<typename Cfg::Shared>(smem_raw);
  const int group = tlx::warp_group_index();

  if (threadIdx.x == 0) {
    init_barriers<Cfg>(s);
    tlx::tma_prefetch_descriptors(&tm_q, &tm_k, &tm_v, &tm_o);
  }
  // Launched as a programmatic dependent of the work-list kernel, the CTA gets here while the list
  // is being built; nothing before this point reads it.
  tlx::wait_for_prior_grid();
  __syncthreads();

  int64_t n_items = static_cast<int64_t>(min(*args.work_count, args.work_capacity)) * args.heads_q;
  if constexpr (Cfg::kKeySplits) n_items *= args.splits;  // each item's splits

  if (group == 0) {
    tlx::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if constexpr (Cfg::kPagedTma) {
      if (threadIdx.x < kPagedTmaProducerThreads)
        producer_loop_paged_tma<Cfg>(s, &tm_q, &tm_k, &tm_v, args, n_items);
    } else if constexpr (Cfg::kPaged)
      producer_loop_paged<Cfg>(s, &tm_q, args, n_items);
    else if (threadIdx.x == 0)
      producer_loop<Cfg>(s, &tm_q, &tm_k, &tm_v, args, n_items);
  } else {
    tlx::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    consumer_loop<Cfg>(s, &tm_o, args, n_items, group - 1);
    // The group's last stores must have read shared memory before the CTA ends.
    if (threadIdx.x % 128 == 0) tlx::tma_store_wait<0>();
  }
}

}  // namespace jfa::sm90
