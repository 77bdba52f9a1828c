// The end of an item for one consumer group: O normalised into the group's staging tile and
// stored through the ragged output map (ragged_rows_store.cuh), in one pass or, where the tile
// holds part of O's columns (Cfg::kOStageCols), in several; LSE goes out directly. The last store
// only has to finish reading the tile before the group's next epilogue, so the group moves on to
// its next item at once.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/mask.cuh"
#include "cuda/sm90/shared/ragged_rows_store.cuh"
#include "cuda/sm90/shared/row_end.cuh"
#include "cuda/sm90/shared/softmax.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/tma.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// The end of an item that holds one split of its keys (Cfg::kKeySplits), for one consumer thread:
// its two rows' softmax state (maximum in score units, sum) and O relative to that maximum, not
// normalised, into the split's partials (FwdPagedSplitArgs), which the paged combine kernel merges
// into out and the LSE (sinks there); (-inf, 0) and no O for a row that saw no key of the split
// (`no_keys`: no row of the item did). A row that saw keys without a finite positive sum (NaN or
// -inf scores, whose maximum stays -inf) is reported here, as the unsplit epilogue does, and keeps
// a finite maximum so that the combine carries its NaN or 0 sum into out instead of an empty row's
// 0.
template <typename Cfg>
__device__ __forceinline__ void split_epilogue(const tlx::AccumFragment<Cfg::kDv>& o,
                                               const OnlineSoftmax& softmax,
                                               const FwdPagedSplitArgs& a, const SplitWorkItem& w,
                                               const typename Cfg::Mask& mask, bool no_keys) {
  using Frag = tlx::AccumFragment<Cfg::kDv>;
  const int64_t rows = a.total_q * a.heads_q;
  const int col0 = Frag::col(0, 0);
  float l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = no_keys ? 0.f : softmax.total(h);  // quad-wide: every lane
  bool not_finite = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t row = mask.row0 + 8 * h;
    if (row >= w.seq.len_q) continue;
    const int64_t token = static_cast<int64_t>(w.seq.q_start) + row;
    const int64_t at = w.split * rows + token * a.heads_q + w.head;
    const bool saw_keys = !no_keys && mask.keys.hi[h] > mask.keys.lo[h];
    const bool finite = l[h] > 0.f && l[h] < INFINITY;
    not_finite |= saw_keys && !finite;
    float m = l[h] == 0.f ? -INFINITY : softmax.row_max[h];
    if (saw_keys && !finite && !(fabsf(m) < INFINITY)) m = 0.f;
    if (threadIdx.x % 4 == 0) a.part_ml[at] = make_float2(m, l[h]);
    if (m == -INFINITY) continue;  // the combine reads no O of this split's row
    float* dst = a.part_o + at * Cfg::kDv + col0;
#pragma unroll
    for (int j = 0; j < Cfg::kDv / 8; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o.at(j, h, 0), o.at(j, h, 1));
  }
  if (not_finite && a.device_check != nullptr)
    atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

// `no_keys`: no row of the item sees a key (O is zero, LSE -inf or the row's sink; mask.keys not
// loaded). An item that holds a split of its keys ends in split_epilogue instead.
template <typename Cfg>
__device__ __forceinline__ void epilogue(const tlx::AccumFragment<Cfg::kDv>& o,
                                         const OnlineSoftmax& softmax, typename Cfg::Shared& s,
                                         const CUtensorMap* tm_o, const FwdArgs& a,
                                         const typename Cfg::Item& w, int group,
                                         const typename Cfg::Mask& mask, bool no_keys) {
  if constexpr (Cfg::kKeySplits) {
    split_epilogue<Cfg>(o, softmax, static_cast<const FwdPagedSplitArgs&>(a), w, mask, no_keys);
    return;
  }
  using T = typename Cfg::Element;
  using Frag = tlx::AccumFragment<Cfg::kDv>;
  const RaggedRowsStore out{Cfg::kEpilogueBarrier0 + group, threadIdx.x % 128 == 0};
  const int64_t first = static_cast<int64_t>(w.seq.q_start) + w.m_block * Cfg::kBlockM + group * 64;
  const int64_t end = static_cast<int64_t>(w.seq.q_start) + w.seq.len_q;
  if (first >= end) return;  // warp-group uniform: no row of the group lies inside the item
  typename Cfg::OTile& tile = s.o[group];
  const uint32_t tile_addr = tlx::smem_addr(&tile);
  const int row0 = Frag::row(0), col0 = Frag::col(0, 0);
  float inv[2];
  bool not_finite = false;  // a row of the item that sees a key got no finite sum or LSE
  // With sinks every row's LSE is finite, an empty row's too (its sink): so is a non-finite sink.
  const bool sunk = a.sinks != nullptr;
  float score_scale = a.softmax_scale;
  if constexpr (Cfg::kLocal) score_scale = static_cast<const FwdLocalArgs&>(a).score_scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = softmax.total(h);
    // A row that sees a key has l >= 1 (its reference maximum's own term); l is NaN where a score
    // is (q.k beyond float32, or a NaN or infinite q or k), and then so is its output row.
    const bool empty = no_keys || l == 0.f;
    const RowEnd e = row_end(a.sinks, score_scale, w.head, softmax.row_max[h], l, empty);
    inv[h] = e.inv;
    const int32_t row = mask.row0 + 8 * h;
    // The checked mode: a row that sees a key without a finite positive sum had a score that
    // float32 cannot hold (+inf, NaN, or every one -inf).
    if (a.device_check != nullptr && row < w.seq.len_q && !no_keys &&
        mask.keys.hi[h] > mask.keys.lo[h])
      not_finite |= !(l > 0.f && l < INFINITY);
    if (row < w.seq.len_q && a.lse != nullptr && threadIdx.x % 4 == 0) {
      const int64_t token = static_cast<int64_t>(w.seq.q_start) + row;
      a.lse[static_cast<int64_t>(w.head) * a.total_q + token] = e.lse;
      if (a.device_check != nullptr) not_finite |= (!empty || sunk) && !(fabsf(e.lse) < INFINITY);
    }
  }
  if (not_finite && a.device_check != nullptr)
    atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
  constexpr int kPassBlocks = Cfg::kOStageCols / 8;  // 8-column fragment blocks a pass
#pragma unroll
  for (int pass = 0; pass < Cfg::kDv / Cfg::kOStageCols; ++pass) {
    out.acquire();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < kPassBlocks; ++j) {
        const int jo = pass * kPassBlocks + j;
        tlx::st_shared_u32(tile_addr + Cfg::OTile::offset_bytes(row0 + 8 * h, col0 + 8 * j),
                           tlx::pack2<T>(o.at(jo, h, 0) * inv[h], o.at(jo, h, 1) * inv[h]));
      }
    }
    out.store(tile, tm_o, w.head, a.out_ragged_rows, first, end, pass * Cfg::kOStageCols);
  }
}

}  // namespace jfa::sm90
