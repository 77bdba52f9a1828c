// The producer role: one thread issues the TMA loads of each item, Q once per item (into a ring of
// kQStages tiles, so the next item's Q arrives during this one where two fit) and K/V through rings
// of kStages stages guarded by full/empty barriers, K one tile ahead of V (the order in which the
// overlapped main loop consumes them). K tiles go from the last (the one that may need a mask) to
// the first.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/forward/fwd_config.cuh"
#include "cuda/sm90/forward/scheduler.cuh"
#include "cuda/tlx/tma.hpp"

namespace jfa::sm90 {

// The item's Q tile by TMA into the Q ring's stage `qs` (one thread; the stage acquired here).
template <typename Cfg>
__device__ __forceinline__ void load_q(typename Cfg::Shared& s, const CUtensorMap* tm_q,
                                       const tlx::PipelineState<Cfg::kQStages>& qs,
                                       const WorkItem& w) {
  s.q_ring.acquire(qs);
  tlx::MBarrier* q_full = s.q_ring.commit(qs, Cfg::QTile::kBytes);
  const int32_t q_row = w.seq.q_start + w.m_block * Cfg::kBlockM;
#pragma unroll
  for (int bx = 0; bx < Cfg::QTile::kBoxes; ++bx)
    tlx::tma_load_3d(tm_q, q_full, s.q[qs.stage].box(bx), bx * Cfg::QTile::kBoxCols, w.head, q_row);
}

// The order of an item's K/V loads, the one the overlapped main loop consumes: K one tile ahead
// of V; load_k(it) and load_v(it) load K/V tile `it` of the walk (from the last K tile).
template <typename LoadK, typename LoadV>
__device__ __forceinline__ void load_item_kv(int32_t n_blocks, LoadK&& load_k, LoadV&& load_v) {
  load_k(0);
  for (int it = 1; it < n_blocks; ++it) {
    load_k(it);
    load_v(it - 1);
  }
  load_v(n_blocks - 1);
}

template <typename Cfg>
__device__ __forceinline__ void producer_loop(typename Cfg::Shared& s, const CUtensorMap* tm_q,
                                              const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                              const FwdArgs& a, int64_t n_items) {
  using Ring = tlx::PipelineState<Cfg::kStages>;
  Ring ks, vs;
  tlx::PipelineState<Cfg::kQStages> qs;
  auto load_kv = [&](const CUtensorMap* map, tlx::TmaRingRef<Cfg::kStages> ring, auto* tiles,
                     Ring& st, const WorkItem& w, int32_t kv_head, int it) {
    using Tile = std::remove_pointer_t<decltype(tiles)>;
    const int32_t row = w.seq.k_start + (w.n_blocks - 1 - it) * Cfg::kBlockN;
    ring.acquire(st);
    tlx::MBarrier* full = ring.commit(st, Tile::kBytes);
#pragma unroll
    for (int bx = 0; bx < Tile::kBoxes; ++bx)
      tlx::tma_load_3d(map, full, tiles[st.stage].box(bx), bx * Tile::kBoxCols, kv_head, row);
    st.advance();
  };
  ItemScheduler<Cfg, true> items;
  typename Cfg::Item w;
  while (items.next(s, a, n_items, w)) {
    if (!w.active || w.n_blocks == 0) continue;
    const int32_t kv_head = w.head / a.group;
    load_q<Cfg>(s, tm_q, qs, w);
    load_item_kv(
        w.n_blocks, [&](int it) { load_kv(tm_k, s.k_ring(), s.k, ks, w, kv_head, it); },
        [&](int it) { load_kv(tm_v, s.v_ring(), s.v, vs, w, kv_head, it); });
    qs.advance();
  }
}

}  // namespace jfa::sm90
