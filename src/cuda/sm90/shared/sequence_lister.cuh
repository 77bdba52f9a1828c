// The first pass of both work-list kernels, in sequence order: each warp takes 32 consecutive
// sequences and packs runs of short ones greedily into shared tiles (at most kMaxQ query and kMaxK
// key tokens each; runs do not cross the warp's 32 sequences); every other sequence gets its own
// tiles. A warp without short sequences lists them lane by lane; the others walk their sequences
// in order (kMaxK < 0: none is short, every sequence gets tiles of its own). What a tile is comes
// from the Lister:
//   int32_t tiles(len_q, len_k)           entries of a sequence that is not packed
//   Entry tile(seq, t, tiles)             its entry t
//   Entry pack(seq, n_seqs)               the shared tile of sequences seq .. seq + n_seqs - 1
//   bool keeps_pack(rows, keys)           whether a run with these sums gets an entry
#pragma once

#include <cstdint>

#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

// Lists every sequence's entries into out[0, capacity) (entries past it, which only invalid offsets
// reach, are dropped) and returns their number. Called by all kListThreads threads of the block.
template <int kMaxQ, int kMaxK, typename Lister, typename Entry>
__device__ __forceinline__ int64_t list_sequences(const Lister& lister, const int32_t* cu_q,
                                                  const int32_t* cu_k, int64_t batch,
                                                  int64_t total_q, int64_t total_k, Entry* out,
                                                  int64_t capacity, int64_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
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
    const bool short_seq = b < batch && len_q <= kMaxQ && len_k <= kMaxK;
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
        const int32_t start_len_k = __shfl_sync(0xffffffffu, len_k, start);
        const int32_t seq = static_cast<int32_t>(warp_base + start);
        if (!start_short) {
          const int32_t tiles = lister.tiles(start_len_q, start_len_k);
          for (int32_t t = lane; t < tiles; t += 32)
            emit(n_out + t, lister.tile(seq, t, tiles), true);
          n_out += tiles;
          ++start;
          continue;
        }
        const int32_t before_q = start > 0 ? __shfl_sync(0xffffffffu, sum_q, start - 1) : 0;
        const int32_t before_k = start > 0 ? __shfl_sync(0xffffffffu, sum_k, start - 1) : 0;
        const bool fits = short_seq && sum_q - before_q <= kMaxQ && sum_k - before_k <= kMaxK;
        const uint32_t stop = __ballot_sync(0xffffffffu, !fits) & (~0u << start);
        const int end = stop != 0 ? __ffs(stop) - 1 : 32;
        const int32_t rows = __shfl_sync(0xffffffffu, sum_q, end - 1) - before_q;
        const int32_t keys = __shfl_sync(0xffffffffu, sum_k, end - 1) - before_k;
        if (lister.keeps_pack(rows, keys)) {
          emit(n_out, lister.pack(seq, end - start), lane == 0);
          ++n_out;
        }
        start = end;
      }
      return n_out;
    };
    // Without short sequences the lanes list their own sequences' tiles side by side (the walk
    // would take the 32 sequences one after another).
    const bool all_long = !__any_sync(0xffffffffu, short_seq);
    const int32_t my_tiles = all_long && b < batch ? lister.tiles(len_q, len_k) : 0;
    int32_t tiles_through_me = my_tiles;  // inclusive prefix sum over the warp's lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t x = __shfl_up_sync(0xffffffffu, tiles_through_me, d);
      if (lane >= d) tiles_through_me += x;
    }
    const int32_t mine = all_long ? __shfl_sync(0xffffffffu, tiles_through_me, 31)
                                  : walk([](int32_t, Entry, bool) {});
    int64_t round_total = 0;
    const int64_t first =
        running + block_exclusive_scan(lane == 0 ? mine : 0, scratch, &round_total);
    const int64_t warp_first = __shfl_sync(0xffffffffu, first, 0);
    if (all_long) {
      const int64_t my_first = warp_first + tiles_through_me - my_tiles;
      for (int32_t t = 0; t < my_tiles && my_first + t < capacity; ++t)
        out[my_first + t] = lister.tile(static_cast<int32_t>(b), t, my_tiles);
    } else {
      walk([&](int32_t i, Entry e, bool writer) {
        if (writer && warp_first + i < capacity) out[warp_first + i] = e;
      });
    }
    running += round_total;
  }
  return running;
}

}  // namespace jfa::sm90
