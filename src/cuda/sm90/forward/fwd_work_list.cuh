// Work list of the sm90 forward: the kernel that lists the q tiles (one block of kListThreads
// threads), launched before the attention kernel.
#pragma once

#include <cstdint>

#include "cuda/sm90/forward/workspace.hpp"
#include "cuda/sm90/shared/sequence_lister.cuh"
#include "cuda/sm90/shared/work_list.cuh"
#include "cuda/tlx/grid_dependency.hpp"

namespace jfa::sm90 {

// Forward entries: a sequence's q tiles, the last first, and shared tiles with query rows.
template <int kBlockM>
struct ForwardLister {
  __device__ int32_t tiles(int32_t len_q, int32_t) const { return q_tile_count<kBlockM>(len_q); }
  __device__ WorkListEntry tile(int32_t seq, int32_t t, int32_t tiles) const {
    return WorkListEntry{seq, tiles - 1 - t, 1};
  }
  __device__ WorkListEntry pack(int32_t seq, int32_t n_seqs) const {
    return WorkListEntry{seq, 0, n_seqs};
  }
  __device__ bool keeps_pack(int32_t rows, int32_t) const { return rows > 0; }
};

// Step 1 (list_sequences), in sequence order: runs of short sequences packed into shared tiles (at
// most kBlockM query and kBlockN key tokens each), every other sequence's q tiles, the last first.
// Step 2: heaviest sequences first (a counting sort of whole sequences on the K tiles of their
// heaviest tile; the order inside a bucket is unspecified) from `list` into `work`; with `sort` 0,
// step 1 writes `work` itself. Entries past `capacity` (only reachable with invalid offsets) are
// dropped. Without kShareTiles (a paged cache, whose sequences' keys are not neighbours) every
// sequence gets tiles of its own.
template <int kBlockM, int kBlockN, bool kShareTiles = true>
__global__ void __launch_bounds__(kListThreads)
    build_work_list(const int32_t* cu_q, const int32_t* cu_k, int64_t batch, int64_t total_q,
                    int64_t total_k, int32_t causal, int32_t sort, WorkListEntry* list,
                    WorkListEntry* work, int32_t* count, unsigned long long* next_item,
                    int32_t capacity, int32_t max_q, int32_t max_k, int32_t* device_check) {
  // The forward kernel may start now: it sets up its CTAs while the list is built.
  tlx::allow_dependent_launch();
  if (device_check != nullptr)
    check_offsets(cu_q, cu_k, batch, total_q, total_k, max_q, max_k, device_check);
  __shared__ int64_t scratch[32];
  __shared__ int32_t bucket_next[kListThreads];
  WorkListEntry* const step1_out = sort ? list : work;
  const int64_t running = list_sequences < kBlockM,
                kShareTiles ? kBlockN
                            : -1 > (ForwardLister<kBlockM>{}, cu_q, cu_k, batch, total_q, total_k,
                                    step1_out, capacity, scratch);
  const int32_t n = static_cast<int32_t>(running < capacity ? running : capacity);
  __syncthreads();  // list complete

  auto bucket_of = [&](const WorkListEntry& t) {
    const EntrySequences es = clamp_entry_sequences(t.seq, t.n_seqs, batch);
    const SeqBounds sb = seq_bounds(cu_q, cu_k, total_q, total_k, es.first, es.n);
    // Single or shared by the entry's own count (the clamp may leave a shared tile one sequence).
    const bool shared = t.n_seqs > 1;
    const int32_t blocks =
        tile_k_blocks<kBlockM, kBlockN>(sb, shared ? 0 : t.m_block, causal && !shared);
    return blocks < kListThreads - 1 ? blocks : kListThreads - 1;
  };
  if (sort) {
    bucket_next[threadIdx.x] = 0;
    __syncthreads();
    // Units: the q tiles of one sequence (consecutive in `list`) or one shared tile. A unit moves
    // as a whole and keeps its inner order, so the tiles that share a sequence's K/V stay
    // neighbours; its key is the cost of its first (heaviest) tile.
    auto unit_starts = [&](int32_t i) {
      return i == 0 || list[i].n_seqs > 1 || list[i - 1].n_seqs > 1 ||
             list[i].seq != list[i - 1].seq;
    };
    auto unit_size = [&](int32_t i) {
      int32_t len = 1;
      while (i + len < n && !unit_starts(i + len)) ++len;
      return len;
    };
    for (int32_t i = threadIdx.x; i < n; i += kListThreads)
      if (unit_starts(i)) atomicAdd(&bucket_next[bucket_of(list[i])], unit_size(i));
    __syncthreads();
    // Thread t owns bucket kListThreads - 1 - t: heavier buckets come first.
    const int bucket = kListThreads - 1 - threadIdx.x;
    int64_t unused = 0;
    const int32_t start =
        static_cast<int32_t>(block_exclusive_scan(bucket_next[bucket], scratch, &unused));
    bucket_next[bucket] = start;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += kListThreads) {
      if (!unit_starts(i)) continue;
      const int32_t len = unit_size(i);
      const int32_t to = atomicAdd(&bucket_next[bucket_of(list[i])], len);
      for (int32_t e = 0; e < len; ++e) work[to + e] = list[i + e];
    }
  }
  if (threadIdx.x == 0) {
    *count = n;
    *next_item = 0;  // the forward kernel's item counter
  }
}

}  // namespace jfa::sm90
