// A main loop that lost to the overlapped one (see choices.hpp): one K tile at a time, S = Q K^T,
// softmax, O += P V, each waited for before the next step. Kept for tuning builds and tests.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/forward/consumer.cuh"

namespace jfa::sm90 {

template <typename Cfg>
__device__ __forceinline__ void consumer_loop_one_tile(typename Cfg::Shared& s,
                                                       const CUtensorMap* tm_o, const FwdArgs& a,
                                                       int64_t n_items, int group) {
  constexpr int kN = Cfg::kBlockN;
  tlx::PipelineState<Cfg::kStages> st;
  ConsumerState<Cfg> cs;
  tlx::PipelineState<Cfg::kQStages> qs;
  for_each_item<Cfg>(
      cs, s, tm_o, a, n_items, group, qs, [&](const WorkItem& w, const typename Cfg::Mask& mask) {
        for (int it = 0; it < w.n_blocks; ++it) {
          const int32_t key0 = (w.n_blocks - 1 - it) * kN;
          ScoreTile<Cfg> s_tile;
          wait_kv<Cfg>(s.k_ring(), st);
          gemm_qk<Cfg>(s_tile, s.q[qs.stage], s.k[st.stage], group);
          tlx::wgmma_wait<0>();
          tlx::fence_operand(s_tile);
          release_k_tile<Cfg>(s, st, qs, it, w.n_blocks);
          float alpha[2];
          if constexpr (Cfg::kLocal)
            local_tile_scores<Cfg>(s_tile, cs, static_cast<const FwdLocalArgs&>(a), mask, key0,
                                   w.seq.len_k, true, alpha);
          else
            tile_scores<Cfg>(s_tile, cs, mask, key0, w.seq.len_k, a.scale_log2, alpha);
          cs.softmax.rescale_o(cs.o, alpha);
          ProbTile<Cfg> p;
          s_tile.to_a(p);
          pv_and_release<Cfg>(s, cs, p, st);
        }
        qs.advance();
        epilogue<Cfg>(cs.o, cs.softmax, s, tm_o, a, w, group, mask, false);
      });
}

}  // namespace jfa::sm90
