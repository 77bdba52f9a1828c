// The producer role over a paged KV cache (WithPagedKV): the whole warp group copies each K/V tile
// from its pages with cp.async, 16 bytes a copy, a tile's page lookups before its copies
// (copy_paged_tile); Q still comes by TMA from
// thread 0, which also claims the items (the other 127 threads take them from the item ring, as
// the consumers do). A row whose key lies past its sequence's keys, or whose page entry is outside
// [0, num_pages), is zero-filled without a load: a tile never holds the stale rows of a page past
// the sequence's keys, which may be NaN and would reach O through P V's zero weights. Each thread
// arrives on the stage's full barrier once its copies have landed (the barrier expects the 128
// threads); the consumers fence the async proxy before their wgmma reads the tile (wait_kv).
// The K/V tile order is producer_loop's: K tiles from the last to the first, K one tile ahead of V.
// Taken for pages that TMA boxes of 8 rows cannot cover (producer_paged_tma.cuh, paged_loads.hpp).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/producer.cuh"
#include "cuda/sm90/forward/scheduler.cuh"
#include "cuda/sm90/shared/async_copy.cuh"
#include "cuda/tlx/tma.hpp"

namespace jfa::sm90 {

inline constexpr int kPagedProducerThreads = 128;

// Rows [0, Tile::rows) of one K or V tile of the item's sequence `seq`, keys first_key onwards,
// into `tile`, for producer thread t: chunk t % kChunks of every kRowStep-th row from t / kChunks.
template <typename Tile>
__device__ __forceinline__ void copy_paged_tile(Tile& tile, const FwdPagedArgs& a,
                                                const void* cache, int32_t head_dim,
                                                int32_t kv_head, int32_t seq, int32_t first_key,
                                                int32_t len_k, int t) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(tile.data[0])>>;
  constexpr int kChunks = Tile::cols * static_cast<int>(sizeof(T)) / 16;  // 16-byte chunks a row
  static_assert(kPagedProducerThreads % kChunks == 0, "whole rows a pass");
  constexpr int kRowStep = kPagedProducerThreads / kChunks;
  static_assert(Tile::rows % kRowStep == 0, "whole passes a tile");
  // Rows 2 kRowStep apart keep the swizzle phase (its period is 8 rows): two row offsets serve all
  // of the thread's rows.
  static_assert(2 * kRowStep % 8 == 0, "rows two passes apart keep the swizzle phase");
  const int chunk = t % kChunks;
  const int col = chunk * (16 / static_cast<int>(sizeof(T)));
  const uint32_t tile_addr = tlx::smem_addr(&tile);
  const uint32_t dst_even = tile_addr + Tile::offset_bytes(t / kChunks, col);
  const uint32_t dst_odd = tile_addr + Tile::offset_bytes(t / kChunks + kRowStep, col);
  const T* base = static_cast<const T*>(cache) + static_cast<int64_t>(kv_head) * head_dim + col;
  const int64_t row_elems = static_cast<int64_t>(a.heads_kv) * head_dim;
  const int32_t* table = a.block_table + static_cast<int64_t>(seq) * a.max_pages_per_seq;
  const int32_t key0 = first_key + t / kChunks;  // the thread's first row's key
  constexpr int kRows = Tile::rows / kRowStep;   // the thread's rows, kRowStep keys apart
  auto copy_row = [&](int i, int32_t key, int32_t page, int32_t page_index) {
    const bool valid = key < len_k && page >= 0 && page < a.num_pages;
    const int32_t in_page = key - page_index * a.page_size;
    const T* src =
        valid ? base + (static_cast<int64_t>(page) * a.page_size + in_page) * row_elems : base;
    const uint32_t dst = (i % 2 == 0 ? dst_even : dst_odd) +
                         static_cast<uint32_t>(i / 2 * 2 * Tile::row_bytes(kRowStep));
    cp_async_16_or_zero(dst, src, valid);
  };
  // The page lookups must not sit between two copies: the copies' asm is a memory clobber, so a
  // lookup there waits a full L2 round trip, each row. Where the tile spans at most 32 pages, each
  // lane looks up one of them first and the rows take theirs by a shuffle; smaller pages look up
  // four rows at a time. Past the sequence's keys no entry is read (the table may end there).
  auto copy_rows = [&](auto page_of) {
    const int32_t last_page = page_of(len_k - 1);  // len_k > 0: an item has keys
    if ((Tile::rows - 1) / a.page_size <= 30) {
      const int32_t first_page = page_of(first_key);
      const int lane = t % 32;
      const int32_t lane_page =
          first_page + lane <= last_page ? __ldg(table + first_page + lane) : -1;
#pragma unroll 1
      for (int i = 0; i < kRows; ++i) {
        const int32_t key = key0 + i * kRowStep;
        const int32_t page_index = page_of(key);
        const int32_t page = __shfl_sync(0xffffffffu, lane_page, (page_index - first_page) & 31);
        copy_row(i, key, page, page_index);
      }
    } else {
      constexpr int kBatch = 4;
      static_assert(kRows % kBatch == 0, "whole batches of rows");
#pragma unroll 1
      for (int i0 = 0; i0 < kRows; i0 += kBatch) {
        int32_t pages[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int32_t key = key0 + (i0 + j) * kRowStep;
          pages[j] = key < len_k ? __ldg(table + page_of(key)) : -1;
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int32_t key = key0 + (i0 + j) * kRowStep;
          copy_row(i0 + j, key, pages[j], page_of(key));
        }
      }
    }
  };
  if (a.page_shift >= 0)
    copy_rows([&](int32_t key) { return key >> a.page_shift; });
  else
    copy_rows([&](int32_t key) { return key / a.page_size; });
}

// Called by all kPagedProducerThreads threads of warp group 0.
template <typename Cfg>
__device__ __forceinline__ void producer_loop_paged(typename Cfg::Shared& s,
                                                    const CUtensorMap* tm_q, const FwdPagedArgs& a,
                                                    int64_t n_items) {
  static_assert(Cfg::kPaged && Cfg::kDynamicItems, "the paged kernels' producer");
  const int t = static_cast<int>(threadIdx.x);
  using Ring = tlx::PipelineState<Cfg::kStages>;
  Ring ks, vs;
  tlx::PipelineState<Cfg::kQStages> qs;  // thread 0's
  auto load = [&](auto ring, auto* tiles, Ring& st, const void* cache, int32_t head_dim,
                  const typename Cfg::Item& w, int32_t kv_head, int it) {
    // Key offsets inside the sequence: a paged item is one sequence (no shared tiles), its keys
    // from 0 (no window shifts them), or from its split's first key.
    int32_t first_key = (w.n_blocks - 1 - it) * Cfg::kBlockN, len_k = w.seq.len_k;
    if constexpr (Cfg::kKeySplits) first_key += w.key_shift, len_k += w.key_shift;
    ring.acquire(st);
    copy_paged_tile(tiles[st.stage], a, cache, head_dim, kv_head, w.first_seq, first_key, len_k, t);
    cp_async_arrive_on(&ring.full[st.stage]);
    st.advance();
  };
  // Thread 0 claims each item into the item ring, from which all 128 threads take it (the
  // consumers too), so that the warps' reads of it are warp-uniform.
  ItemScheduler<Cfg, true> claim;
  ItemScheduler<Cfg, false> take;
  typename Cfg::Item w;
  for (;;) {
    if (t == 0) claim.next(s, a, n_items, w);
    if (!take.next(s, a, n_items, w)) break;
    if (!w.active || w.n_blocks == 0) continue;
    const int32_t kv_head = w.head / a.group;
    if (t == 0) {
      load_q<Cfg>(s, tm_q, qs, w);
      qs.advance();  // thread 0's alone: the others load no Q
    }
    load_item_kv(
        w.n_blocks, [&](int it) { load(s.k_ring(), s.k, ks, a.k_cache, Cfg::kD, w, kv_head, it); },
        [&](int it) { load(s.v_ring(), s.v, vs, a.v_cache, Cfg::kDv, w, kv_head, it); });
  }
}

}  // namespace jfa::sm90
