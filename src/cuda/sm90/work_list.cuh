// Work list of the sm90 forward, built on the device from cu_seqlens (no host read of offsets, so
// the forward can be captured in a CUDA graph): sequence bounds, the K tiles a q tile visits, and
// the kernel that lists the q tiles (one block of kListThreads threads), launched before the
// attention kernel.
#pragma once

#include <cstdint>

#include "cuda/sm90/workspace.hpp"
#include "cuda/tlx/grid_dependency.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// Sequence bounds of one work item, clamped into [0, total].
struct SeqBounds {
  int32_t q_start, len_q, k_start, len_k;

  // The causal mask is aligned bottom-right: query row r sees keys 0 .. r + causal_shift().
  __host__ __device__ __forceinline__ int32_t causal_shift() const { return len_k - len_q; }
};

// The decode of work items is host code too, for the tests of the order of the backward's work
// (tests/cuda_host); on the device an offset is read through the read-only cache.
__host__ __device__ __forceinline__ int32_t load_offset(const int32_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

__host__ __device__ __forceinline__ int32_t clamp_offset(int32_t v, int32_t lo, int64_t hi) {
  const int64_t x = v < lo ? lo : v;
  return static_cast<int32_t>(x > hi ? hi : x);
}

// Token ranges of sequences [b, b + n) taken together, offsets clamped into [0, total].
__host__ __device__ __forceinline__ SeqBounds seq_bounds(const int32_t* cu_q, const int32_t* cu_k,
                                                         int64_t total_q, int64_t total_k,
                                                         int64_t b, int64_t n) {
  SeqBounds s;
  s.q_start = clamp_offset(load_offset(cu_q + b), 0, total_q);
  const int32_t q_end = clamp_offset(load_offset(cu_q + b + n), s.q_start, total_q);
  s.len_q = q_end - s.q_start;
  s.k_start = clamp_offset(load_offset(cu_k + b), 0, total_k);
  const int32_t k_end = clamp_offset(load_offset(cu_k + b + n), s.k_start, total_k);
  s.len_k = k_end - s.k_start;
  return s;
}

// Q tiles of a sequence of len_q query rows: the work list gives each its own entry, and the
// item decode relies on that count.
template <int kBlockM>
__device__ __forceinline__ int32_t q_tile_count(int32_t len_q) {
  return (len_q + kBlockM - 1) / kBlockM;
}

// K tiles that q tile m_block visits: the whole key range, or (causal, one sequence) the keys up
// to the diagonal of the tile's last row, bottom-right aligned; 0 for a tile without rows.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int32_t tile_k_blocks(const SeqBounds& s, int32_t m_block,
                                                 bool causal_one_seq) {
  const int64_t row0 = static_cast<int64_t>(m_block) * kBlockM;
  if (m_block < 0 || row0 >= s.len_q) return 0;
  int64_t visible = s.len_k;
  if (causal_one_seq) {
    const int64_t last_row = min(row0 + kBlockM, static_cast<int64_t>(s.len_q)) - 1;
    visible = last_row + s.len_k - s.len_q + 1;
    visible = visible < 0 ? 0 : (visible > s.len_k ? s.len_k : visible);
  }
  return static_cast<int32_t>((visible + kBlockN - 1) / kBlockN);
}

inline constexpr int kListThreads = 1024;

// The checked mode (jfa_attention_params::device_check): the rules the raw offsets break, as
// jfa_device_check bits ORed over the block and stored in *word (0 when they are valid). Called by
// every thread of a block of kListThreads before the block reads the offsets for anything else.
__device__ __forceinline__ void check_offsets(const int32_t* cu_q, const int32_t* cu_k,
                                              int64_t batch, int64_t total_q, int64_t total_k,
                                              int32_t max_q, int32_t max_k, int32_t* word) {
  __shared__ int32_t broken;
  if (threadIdx.x == 0) broken = 0;
  __syncthreads();
  auto rules = [&](const int32_t* cu, int64_t total, int32_t max_len) {
    int32_t bits = 0;
    if (threadIdx.x == 0) {
      if (__ldg(cu) != 0) bits |= JFA_OFFSETS_Q_FIRST_NOT_ZERO;
      if (batch == 0 && __ldg(cu) != total) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    }
    for (int64_t b = threadIdx.x; b < batch; b += kListThreads) {
      const int64_t lo = __ldg(cu + b), hi = __ldg(cu + b + 1);
      if (hi < lo)
        bits |= JFA_OFFSETS_Q_DECREASING;
      else if (max_len > 0 && hi - lo > max_len)
        bits |= JFA_OFFSETS_Q_ABOVE_MAX;
      if (b == batch - 1 && hi != total) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    }
    return bits;
  };
  // The k rules are the q rules four bits up (jfa.h).
  const int32_t mine = rules(cu_q, total_q, max_q) | (rules(cu_k, total_k, max_k) << 4);
  if (mine != 0) atomicOr(&broken, mine);
  __syncthreads();
  if (threadIdx.x == 0) *word = broken;
}

// The check alone, for calls that launch no list kernel (no keys, or no query rows).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    offsets_check_kernel(const int32_t* cu_q, const int32_t* cu_k, int64_t batch, int64_t total_q,
                         int64_t total_k, int32_t max_q, int32_t max_k, int32_t* word) {
  static_assert(kThreads == kListThreads, "check_offsets strides by kListThreads");
  check_offsets(cu_q, cu_k, batch, total_q, total_k, max_q, max_k, word);
}

// Exclusive prefix sum of one value per thread over the block; *total gets the sum. 64-bit
// throughout: with invalid offsets (clamped, each sequence up to the whole total) 1024 counts can
// exceed int32. Uses `scratch` (32 values) and synchronises the block.
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t value, int64_t* scratch,
                                                        int64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  int64_t incl = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t x = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += x;
  }
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int64_t ws = scratch[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t x = __shfl_up_sync(0xffffffffu, ws, d);
      if (lane >= d) ws += x;
    }
    scratch[lane] = ws;  // inclusive over warps
  }
  __syncthreads();
  *total = scratch[31];
  return (warp > 0 ? scratch[warp - 1] : 0) + incl - value;
}

// Step 1, in sequence order: each warp takes 32 consecutive sequences and packs runs of short ones
// greedily into shared tiles (at most kBlockM query and kBlockN key tokens each; runs do not cross
// the warp's 32 sequences); every other sequence gets its q tiles, the last first. A warp without
// short sequences lists them lane by lane; the others walk their sequences in order.
// Step 2: heaviest sequences first (a counting sort of whole sequences on the K tiles of their
// heaviest tile; the order inside a bucket is unspecified) from `list` into `work`; with `sort` 0,
// step 1 writes `work` itself. Entries past `capacity` (only reachable with invalid offsets) are
// dropped.
template <int kBlockM, int kBlockN>
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
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  WorkListEntry* const step1_out = sort ? list : work;
  int64_t running = 0;
  for (int64_t base = 0; base < batch; base += kListThreads) {
    const int64_t warp_base = base + 32 * warp;
    const int64_t b = warp_base + lane;
    const int valid = static_cast<int>(min(max(batch - warp_base, int64_t{0}), int64_t{32}));
    int32_t len_q = 0, len_k = 0;
    if (b < batch) {
      const SeqBounds sb = seq_bounds(cu_q, cu_k, total_q, total_k, b, 1);
      len_q = sb.len_q;
      len_k = sb.len_k;
    }
    const bool short_seq = b < batch && len_q <= kBlockM && len_k <= kBlockN;
    int32_t sum_q = len_q, sum_k = len_k;  // inclusive prefix sums over the warp's sequences
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t xq = __shfl_up_sync(0xffffffffu, sum_q, d);
      const int32_t xk = __shfl_up_sync(0xffffffffu, sum_k, d);
      if (lane >= d) {
        sum_q += xq;
        sum_k += xk;
      }
    }
    // Walks the warp's sequences (warp-uniform control flow); emit(index, entry, writer) stores
    // an entry when `writer` is true. Returns the number of entries.
    auto walk = [&](auto&& emit) {
      int32_t n_out = 0;
      int start = 0;
      while (start < valid) {
        const bool start_short = __shfl_sync(0xffffffffu, short_seq, start);
        const int32_t start_len_q = __shfl_sync(0xffffffffu, len_q, start);
        if (!start_short) {
          const int32_t tiles = q_tile_count<kBlockM>(start_len_q);
          for (int32_t t = lane; t < tiles; t += 32)
            emit(n_out + t,
                 WorkListEntry{static_cast<int32_t>(warp_base + start), tiles - 1 - t, 1}, true);
          n_out += tiles;
          ++start;
          continue;
        }
        const int32_t before_q = start > 0 ? __shfl_sync(0xffffffffu, sum_q, start - 1) : 0;
        const int32_t before_k = start > 0 ? __shfl_sync(0xffffffffu, sum_k, start - 1) : 0;
        const bool fits = short_seq && sum_q - before_q <= kBlockM && sum_k - before_k <= kBlockN;
        const uint32_t stop = __ballot_sync(0xffffffffu, !fits) & (~0u << start);
        const int end = stop != 0 ? __ffs(stop) - 1 : 32;
        const int32_t rows = __shfl_sync(0xffffffffu, sum_q, end - 1) - before_q;
        if (rows > 0) {
          emit(n_out, WorkListEntry{static_cast<int32_t>(warp_base + start), 0, end - start},
               lane == 0);
          ++n_out;
        }
        start = end;
      }
      return n_out;
    };
    // Without short sequences the lanes list their own sequences' tiles side by side (the walk
    // would take the 32 sequences one after another).
    const bool all_long = !__any_sync(0xffffffffu, short_seq);
    const int32_t my_tiles = all_long && b < batch ? q_tile_count<kBlockM>(len_q) : 0;
    int32_t tiles_through_me = my_tiles;  // inclusive prefix sum over the warp's lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t x = __shfl_up_sync(0xffffffffu, tiles_through_me, d);
      if (lane >= d) tiles_through_me += x;
    }
    const int32_t mine = all_long ? __shfl_sync(0xffffffffu, tiles_through_me, 31)
                                  : walk([](int32_t, WorkListEntry, bool) {});
    int64_t round_total = 0;
    const int64_t first =
        running + block_exclusive_scan(lane == 0 ? mine : 0, scratch, &round_total);
    const int64_t warp_first = __shfl_sync(0xffffffffu, first, 0);
    if (all_long) {
      const int64_t my_first = warp_first + tiles_through_me - my_tiles;
      for (int32_t t = 0; t < my_tiles && my_first + t < capacity; ++t)
        step1_out[my_first + t] = WorkListEntry{static_cast<int32_t>(b), my_tiles - 1 - t, 1};
    } else {
      walk([&](int32_t i, WorkListEntry t, bool writer) {
        if (writer && warp_first + i < capacity) step1_out[warp_first + i] = t;
      });
    }
    running += round_total;
  }
  const int32_t n = static_cast<int32_t>(running < capacity ? running : capacity);
  __syncthreads();  // list complete

  auto bucket_of = [&](const WorkListEntry& t) {
    const int32_t b = t.seq < 0 ? 0 : (t.seq >= batch ? static_cast<int32_t>(batch - 1) : t.seq);
    const int32_t n_seqs = t.n_seqs < 1 ? 1 : t.n_seqs;
    const SeqBounds sb =
        seq_bounds(cu_q, cu_k, total_q, total_k, b, n_seqs > batch - b ? batch - b : n_seqs);
    const int32_t blocks =
        tile_k_blocks<kBlockM, kBlockN>(sb, n_seqs > 1 ? 0 : t.m_block, causal && n_seqs == 1);
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
