// The backward's producer role: one thread loads an item's K and V once, then per step the Q and
// dO tiles with their rows of LSE and D (TMA) into a ring guarded by mbarriers.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/backward/bwd_row_terms.cuh"
#include "cuda/sm90/backward/bwd_scheduler.cuh"
#include "cuda/tlx/tma.hpp"

namespace jfa::sm90 {

template <typename Cfg>
__device__ __forceinline__ void bwd_producer(typename Cfg::Shared& s, const CUtensorMap* tm_q,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             const CUtensorMap* tm_do, const CUtensorMap* tm_rows,
                                             const BwdArgs& a, int64_t n_items) {
  constexpr uint32_t kRowBytes = Cfg::Shared::kRowTermsBox * sizeof(float);
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t kv_phase = 0;
  BwdItemScheduler<Cfg, true> items;
  BwdItem w;
  while (items.next(s, a, n_items, w)) {
    if constexpr (Cfg::kSplitRoles) {
      // The consumers stage dK and dV in the K and V tiles, so they own the tiles for every item:
      // an item without steps gets them with nothing loaded.
      s.sync.kv_ring.acquire(kv_phase);
      kv_phase ^= 1u;
      if (w.q_tiles() <= 0) {
        s.sync.kv_ring.commit_empty();
        continue;
      }
    } else {
      if (w.q_tiles() <= 0) continue;
      s.sync.kv_ring.acquire(kv_phase);
      kv_phase ^= 1u;
    }
    tlx::MBarrier* kv_full = s.sync.kv_ring.commit(Cfg::KTile::kBytes + Cfg::VTile::kBytes);
    const int32_t key_row = w.seq.k_start + w.n_block * Cfg::kBlockN;
    const int32_t kv_head = item_kv_head<Cfg::kHeadSplits>(a, w);
#pragma unroll
    for (int bx = 0; bx < Cfg::KTile::kBoxes; ++bx)
      tlx::tma_load_3d(tm_k, kv_full, s.k.box(bx), bx * Cfg::KTile::kBoxCols, kv_head, key_row);
#pragma unroll
    for (int bx = 0; bx < Cfg::VTile::kBoxes; ++bx)
      tlx::tma_load_3d(tm_v, kv_full, s.v.box(bx), bx * Cfg::VTile::kBoxCols, kv_head, key_row);
    for (int32_t g = 0; g < item_heads<Cfg::kHeadSplits>(a); ++g) {
      const int32_t head = item_first_q_head<Cfg::kHeadSplits>(a, w) + g;
      for (int32_t i = 0; i < w.q_tiles(); ++i) {
        const int32_t m = walk_q_tile<Cfg::kLocal>(a, w, i);
        s.sync.q_ring.acquire(st);
        tlx::MBarrier* full =
            s.sync.q_ring.commit(st, Cfg::QTile::kBytes + Cfg::DoTile::kBytes + 2 * kRowBytes);
        const int32_t q_row = w.seq.q_start + m * Cfg::kBlockM;
#pragma unroll
        for (int bx = 0; bx < Cfg::QTile::kBoxes; ++bx)
          tlx::tma_load_3d(tm_q, full, s.q[st.stage].box(bx), bx * Cfg::QTile::kBoxCols, head,
                           q_row);
#pragma unroll
        for (int bx = 0; bx < Cfg::DoTile::kBoxes; ++bx)
          tlx::tma_load_3d(tm_do, full, s.dout[st.stage].box(bx), bx * Cfg::DoTile::kBoxCols, head,
                           q_row);
        const RowTermsAt at = row_terms_at(q_row, a.heads_q);
        tlx::tma_load_2d(tm_rows, full, s.lse2[st.stage], at.col, at.row + head);
        tlx::tma_load_2d(tm_rows, full, s.dpsum[st.stage], at.col, at.row + a.heads_q + head);
        st.advance();
      }
    }
  }
}

}  // namespace jfa::sm90
