// The producer role over a paged KV cache with PagedLoads::kPagesByTma (where pages come in boxes
// of 8 rows or more; paged_loads.hpp): one warp (warp 0; the warp group's other warps leave) loads
// a K/V tile as boxes of paged_tma_box_rows rows, each inside one page, by TMA through a 4-D map
// over the cache (dims head_dim, heads_kv, page_size, num_pages), so that a tile costs a few
// instructions instead of a cp.async per row and 16 bytes. Lane b looks up box b's page, the next K
// tile's before the waits for a stage (V reuses K's). A box that reaches past the sequence's keys
// is not loaded by TMA: the tile's rows from the first such box on are copied by cp.async, and
// zero-filled past the keys (a page's stale rows there may be NaN and would reach O through P V's
// zero weights). A page entry outside [0, num_pages) loads a box wholly out of the map's bounds:
// zeros, no access. Each stage's full barrier expects lane 0's arrival with the TMA bytes and one
// cp.async arrival per lane (kPagedTmaFullArrivals); the consumers fence the async proxy before
// reading (wait_kv). The K/V tile order is producer_loop's: K tiles from the last to the first, K
// one tile ahead of V.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/producer.cuh"
#include "cuda/sm90/forward/scheduler.cuh"
#include "cuda/sm90/paged/paged_loads.hpp"
#include "cuda/sm90/shared/async_copy.cuh"
#include "cuda/tlx/tma.hpp"

namespace jfa::sm90 {

inline constexpr int kPagedTmaProducerThreads = 32;
inline constexpr uint32_t kPagedTmaFullArrivals = 1 + kPagedTmaProducerThreads;

// Where a tile's keys lie in the pages, for one lane: box `lane`'s page entry (-1 for a box past
// the sequence's keys or past the tile) and the tile's rows in boxes wholly inside the keys.
struct PagedTileBoxes {
  int32_t lane_page;
  int32_t tma_rows;
};

template <int kBlockN>
__device__ __forceinline__ PagedTileBoxes paged_tile_boxes(const FwdPagedArgs& a,
                                                           const int32_t* table, int32_t first_key,
                                                           int32_t len_k, int lane) {
  const int32_t box_rows = paged_tma_box_rows(a.page_size, kBlockN);
  const int32_t box_key = first_key + lane * box_rows;
  PagedTileBoxes b;
  b.lane_page = -1;
  if (lane * box_rows < kBlockN && box_key < len_k)
    b.lane_page = __ldg(table + page_index_of(box_key, a.page_shift, a.page_size));
  b.tma_rows = paged_tma_rows(first_key, len_k, box_rows, kBlockN);
  return b;
}

// One K or V tile (keys first_key onwards of the item's sequence) into `tile` on the stage whose
// full barrier is `full`, by lane `lane` of the producer warp, `boxes` looked up for this tile.
template <typename Tile>
__device__ __forceinline__ void load_paged_tile_tma(Tile& tile, tlx::MBarrier* full,
                                                    const CUtensorMap* map, const FwdPagedArgs& a,
                                                    const void* cache, int32_t head_dim,
                                                    int32_t kv_head, int32_t first_key,
                                                    int32_t len_k, const PagedTileBoxes& boxes,
                                                    int lane) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(tile.data[0])>>;
  constexpr int kChunks = Tile::cols * static_cast<int>(sizeof(T)) / 16;  // 16-byte chunks a row
  static_assert(kPagedTmaProducerThreads % kChunks == 0, "whole rows a pass");
  constexpr int kRowStep = kPagedTmaProducerThreads / kChunks;
  const int32_t box_rows = paged_tma_box_rows(a.page_size, Tile::rows);
  if (lane == 0)
    full->arrive_expect_tx(static_cast<uint32_t>(boxes.tma_rows) * Tile::cols * sizeof(T));
  __syncwarp();  // the bytes are expected before any box can land
  const int32_t lane_row = lane * box_rows;
  if (lane_row < boxes.tma_rows) {
    const int32_t key = first_key + lane_row;
    const int32_t page_index = page_index_of(key, a.page_shift, a.page_size);
    // Out of the map's bounds (zeros, nothing read) for an entry outside [0, num_pages).
    const int32_t page = boxes.lane_page >= 0 && boxes.lane_page < a.num_pages
                             ? boxes.lane_page
                             : static_cast<int32_t>(a.num_pages);
#pragma unroll
    for (int bx = 0; bx < Tile::kBoxes; ++bx)
      tlx::tma_load_4d(map, full, reinterpret_cast<char*>(tile.box(bx)) + Tile::row_bytes(lane_row),
                       bx * Tile::kBoxCols, kv_head, key - page_index * a.page_size, page);
  }
  // The rows from the first box that reaches past the keys: those keys lie in that box's page.
  const int32_t tail_box = boxes.tma_rows >> (__ffs(box_rows) - 1);  // box_rows: a power of two
  const int32_t tail_page = __shfl_sync(0xffffffffu, boxes.lane_page, tail_box & 31);
  const int chunk = lane % kChunks;
  const int col = chunk * (16 / static_cast<int>(sizeof(T)));
  const T* base = static_cast<const T*>(cache) + static_cast<int64_t>(kv_head) * head_dim + col;
  const int64_t row_elems = static_cast<int64_t>(a.heads_kv) * head_dim;
  const uint32_t tile_addr = tlx::smem_addr(&tile);
#pragma unroll 1
  for (int32_t r = boxes.tma_rows + lane / kChunks; r < Tile::rows; r += kRowStep) {
    const int32_t key = first_key + r;
    const bool valid = key < len_k && tail_page >= 0 && tail_page < a.num_pages;
    const int32_t in_page = key - page_index_of(key, a.page_shift, a.page_size) * a.page_size;
    const T* src =
        valid ? base + (static_cast<int64_t>(tail_page) * a.page_size + in_page) * row_elems : base;
    cp_async_16_or_zero(tile_addr + Tile::offset_bytes(r, col), src, valid);
  }
  cp_async_arrive_on(full);
}

// Called by the kPagedTmaProducerThreads threads of warp 0.
template <typename Cfg>
__device__ __forceinline__ void producer_loop_paged_tma(typename Cfg::Shared& s,
                                                        const CUtensorMap* tm_q,
                                                        const CUtensorMap* tm_k,
                                                        const CUtensorMap* tm_v,
                                                        const FwdPagedArgs& a, int64_t n_items) {
  static_assert(Cfg::kPagedTma && Cfg::kDynamicItems, "the paged kernels' TMA producer");
  const int lane = static_cast<int>(threadIdx.x);
  using Ring = tlx::PipelineState<Cfg::kStages>;
  Ring ks, vs;
  tlx::PipelineState<Cfg::kQStages> qs;  // lane 0's
  auto load = [&](auto ring, auto* tiles, Ring& st, const CUtensorMap* map, const void* cache,
                  int32_t head_dim, const typename Cfg::Item& w, int32_t kv_head, int it,
                  const PagedTileBoxes& boxes) {
    const int32_t first_key = key_shift_of(w) + (w.n_blocks - 1 - it) * Cfg::kBlockN;
    ring.acquire(st);
    load_paged_tile_tma(tiles[st.stage], &ring.full[st.stage], map, a, cache, head_dim, kv_head,
                        first_key, key_shift_of(w) + w.seq.len_k, boxes, lane);
    st.advance();
  };
  // Lane 0 claims each item into the item ring, from which the warp's lanes take it (the consumers
  // too), so that the lanes' reads of it are warp-uniform.
  ItemScheduler<Cfg, true> claim;
  ItemScheduler<Cfg, false> take;
  typename Cfg::Item w;
  for (;;) {
    if (lane == 0) claim.next(s, a, n_items, w);
    if (!take.next(s, a, n_items, w)) break;
    if (!w.active || w.n_blocks == 0) continue;
    const int32_t kv_head = w.head / a.group;
    if (lane == 0) {
      load_q<Cfg>(s, tm_q, qs, w);
      qs.advance();  // lane 0's alone: the others load no Q
    }
    const int32_t* table = a.block_table + static_cast<int64_t>(w.first_seq) * a.max_pages_per_seq;
    auto boxes_of_tile = [&](int it) {
      return paged_tile_boxes<Cfg::kBlockN>(a, table,
                                            key_shift_of(w) + (w.n_blocks - 1 - it) * Cfg::kBlockN,
                                            key_shift_of(w) + w.seq.len_k, lane);
    };
    // K tile it+1's pages are looked up before the waits for K tile it's and V tile it-1's stages,
    // so that the lookup's round trip is not on the loads' path.
    PagedTileBoxes next = boxes_of_tile(0), v_boxes{};
#pragma unroll 1
    for (int it = 0; it < w.n_blocks; ++it) {
      const PagedTileBoxes k_boxes = next;
      if (it + 1 < w.n_blocks) next = boxes_of_tile(it + 1);
      load(s.k_ring(), s.k, ks, tm_k, a.k_cache, Cfg::kD, w, kv_head, it, k_boxes);
      if (it > 0) load(s.v_ring(), s.v, vs, tm_v, a.v_cache, Cfg::kDv, w, kv_head, it - 1, v_boxes);
      v_boxes = k_boxes;
    }
    load(s.v_ring(), s.v, vs, tm_v, a.v_cache, Cfg::kDv, w, kv_head, w.n_blocks - 1, v_boxes);
  }
}

}  // namespace jfa::sm90
