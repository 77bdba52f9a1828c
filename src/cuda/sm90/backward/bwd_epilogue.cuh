// The end of a backward item for a consumer group: dK and dV staged and stored through the ragged
// maps, or added into float32 accumulators where the call splits items by query heads; and the
// shared tiles' key ranges, kept in the same staging tile during the walk.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/shared/ragged_rows_store.cuh"
#include "cuda/sm90/shared/shared_tile_keys.cuh"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/named_barrier.hpp"

namespace jfa::sm90 {

// Head splits (bwd_head_splits.hpp): the group's rows of dK (unscaled) or dV from key0 added into
// the float32 accumulator `sum` ([total_k, heads_kv, kCols]) with one 8-byte atomic per pair of
// columns, the rows past the sequence's keys left out. The other slices of the item's query heads
// add to the same rows; the conversion after the kernel writes them out (bwd_key_grads.cuh).
template <int kCols>
__device__ __forceinline__ void add_key_rows(const tlx::AccumFragment<kCols>& acc, float* sum,
                                             const BwdArgs& a, const BwdItem& w, int32_t key0) {
  using Frag = tlx::AccumFragment<kCols>;
  const int32_t kv_head = item_kv_head<true>(a, w);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t key = key0 + Frag::row(h);
    if (key >= w.seq.len_k) continue;
    float* row = sum + ((static_cast<int64_t>(w.seq.k_start) + key) * a.heads_kv + kv_head) * kCols;
#pragma unroll
    for (int j = 0; j < Frag::kBlocks; ++j)
      atomicAdd(reinterpret_cast<float2*>(row + Frag::col(j, 0)),
                make_float2(acc.at(j, h, 0), acc.at(j, h, 1)));
  }
}

// dK (times `scale`) or dV rows of the group's 64 keys from key0 (in the item's sequence), staged
// in `tile` and stored through the ragged map `tm` (ragged_rows_store.cuh); with head splits
// (Cfg::kHeadSplits) added into `sum`, the gradient's accumulator, instead (add_key_rows). dK's
// staging waits until dV's store has read the tile: 16 KB at head_dim 128, in place of the 64
// scattered 4-byte global stores per thread and gradient that it replaces.
template <typename Cfg, int kCols, typename Tile>
__device__ __forceinline__ void store_key_rows(const tlx::AccumFragment<kCols>& acc, float scale,
                                               Tile& tile, const CUtensorMap* tm, float* sum,
                                               const BwdArgs& a, const BwdItem& w, int group,
                                               int32_t key0) {
  using T = typename Cfg::Element;
  using Frag = tlx::AccumFragment<kCols>;
  static_assert(Tile::cols == kCols && Tile::rows >= 64, "the tile holds the group's rows");
  if (key0 < 0 || key0 >= w.seq.len_k) return;  // warp-group uniform: no key of the group
  if constexpr (Cfg::kHeadSplits) {
    add_key_rows(acc, sum, a, w, key0);
    return;
  }
  const RaggedRowsStore out{Cfg::kKeyRowsBarrier0 + group, threadIdx.x % 128 == 0};
  const uint32_t tile_addr = tlx::smem_addr(&tile);
  out.acquire();
  bool not_finite = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // The checked mode looks at the rows the store keeps, those inside the sequence.
    const bool check = a.device_check != nullptr && key0 + Frag::row(h) < w.seq.len_k;
#pragma unroll
    for (int j = 0; j < Frag::kBlocks; ++j) {
      const uint32_t pair = tlx::pack2<T>(acc.at(j, h, 0) * scale, acc.at(j, h, 1) * scale);
      if (check) not_finite |= tlx::pair_not_finite<T>(pair);
      tlx::st_shared_u32(tile_addr + Tile::offset_bytes(Frag::row(h), Frag::col(j, 0)), pair);
    }
  }
  if (not_finite) atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
  const int64_t first = static_cast<int64_t>(w.seq.k_start) + key0;
  out.store(tile, tm, w.kv_head, a.key_ragged_rows, first,
            static_cast<int64_t>(w.seq.k_start) + w.seq.len_k);
}

// Row `row`'s key range of a shared tile (KeyRange as lo | hi << 16: the item has at most
// kBwdPackRows rows and kBlockN keys) into word `row` at shared address `ranges`.
// (kLocal: under the window of the BwdLocalArgs behind `a`.)
template <bool kLocal = false>
__device__ __forceinline__ void store_shared_tile_row_keys(uint32_t ranges, const BwdArgs& a,
                                                           const BwdItem& w, int32_t row) {
  KeyRange r;
  if constexpr (kLocal)
    r = shared_tile_row_keys(a.cu_q, a.cu_k, a.total_q, w.seq, w.first_seq, w.n_seqs,
                             static_cast<const BwdLocalArgs&>(a).window, row);
  else
    r = shared_tile_row_keys(a.cu_q, a.cu_k, a.total_q, w.seq, w.first_seq, w.n_seqs, a.causal != 0,
                             row);
  tlx::st_shared_u32(ranges + 4 * row, static_cast<uint32_t>(r.lo) | static_cast<uint32_t>(r.hi)
                                                                         << 16);
}

// A shared tile's key range for each of its rows, one row per thread of the group, at shared
// address `ranges` (kBwdPackRows words): the group's dK/dV staging tile, idle during the walk,
// acquired as store_key_rows acquires it (the previous item's stores have read it, and every warp
// of the group is done with the previous walk); the item's stores acquire it back.
template <typename Cfg>
__device__ __forceinline__ void shared_tile_key_ranges(uint32_t ranges, uint32_t barrier,
                                                       const BwdArgs& a, const BwdItem& w) {
  static_assert(kBwdPackRows == 128, "one row per thread of the group");
  const RaggedRowsStore tile{barrier, threadIdx.x % 128 == 0};
  tile.acquire();
  store_shared_tile_row_keys<Cfg::kLocal>(ranges, a, w, threadIdx.x % 128);
  tlx::NamedBarrier::sync(barrier, 128);
}

}  // namespace jfa::sm90
