// The shipped main loop of a consumer warp group: S(n) = Q K(n)^T is issued together with
// O += P(n-1) V(n-1), so the tensor cores work on one tile while the softmax of the previous one
// runs. With kTakeTurns the consumer groups issue their MMAs in turn (named barriers
// 1 .. kConsumerGroups, in a ring), so one group's softmax runs under the others' MMAs.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/forward/consumer.cuh"
#include "cuda/tlx/named_barrier.hpp"

namespace jfa::sm90 {

template <typename Cfg, bool kTakeTurns>
__device__ __forceinline__ void consumer_loop_overlapped(typename Cfg::Shared& s,
                                                         const CUtensorMap* tm_o, const FwdArgs& a,
                                                         int64_t n_items, int group) {
  constexpr int kN = Cfg::kBlockN;
  // Turn barrier g + 1 belongs to group g: it waits there, and the group before it arrives there.
  constexpr uint32_t kTurnThreads = 256;
  const uint32_t my_turn = 1 + group;
  const uint32_t next_turn = 1 + (group + 1) % Cfg::kConsumerGroups;
  const bool leader = tlx::lane_is_leader();
  tlx::PipelineState<Cfg::kStages> ks, vs;
  ConsumerState<Cfg> cs;
  auto begin_turn = [&] {
    if (kTakeTurns) tlx::NamedBarrier::sync(my_turn, kTurnThreads);
  };
  auto end_turn = [&] {
    if (kTakeTurns) tlx::NamedBarrier::arrive(next_turn, kTurnThreads);
  };
  if (group == Cfg::kConsumerGroups - 1 && kTakeTurns)
    tlx::NamedBarrier::arrive(1, kTurnThreads);  // group 0 goes first
  tlx::PipelineState<Cfg::kQStages> qs;
  for_each_item<Cfg>(
      cs, s, tm_o, a, n_items, group, qs,
      [&](const typename Cfg::Item& w, const typename Cfg::Mask& mask) {
        // Leading K tiles (the last ones of the sequence) that no row of this group sees: the far
        // side of the diagonal in a 192-row tile, or every tile for a group past the item's last
        // row. They are released untouched once they have arrived (so that each arrival counts for
        // its own use of the slot), and the group still takes its turns so that the ring stays in
        // step.
        int first_it = 0;
        while (Cfg::kSkipUnseenKTiles && first_it < w.n_blocks &&
               (w.n_blocks - 1 - first_it) * kN >= mask.key_end) {
          wait_kv<Cfg>(s.k_ring(), ks);
          begin_turn();
          end_turn();
          release_k_tile<Cfg>(s, ks, qs, first_it, w.n_blocks);
          ks.advance();
          wait_kv<Cfg>(s.v_ring(), vs);
          if (leader) s.v_ring().release(vs);
          vs.advance();
          ++first_it;
        }
        if (Cfg::kSkipUnseenKTiles && first_it == w.n_blocks) {
          qs.advance();
          epilogue<Cfg>(cs.o, cs.softmax, s, tm_o, a, w, group, mask, false);  // no key seen
          return;
        }

        ProbTile<Cfg> p;
        // S(it) is ready: release its K tile, mask where needed, online softmax (alpha rescales O
        // before the next P V is added).
        float alpha[2];
        // may_mask: false where no tile of the range needs the mask (no check either).
        auto scores = [&](ScoreTile<Cfg>& s_tile, int it, bool may_mask) {
          release_k_tile<Cfg>(s, ks, qs, it, w.n_blocks);
          ks.advance();
          const int32_t key0 = (w.n_blocks - 1 - it) * kN;
          if constexpr (Cfg::kLocal)
            local_tile_scores<Cfg>(s_tile, cs, static_cast<const FwdLocalArgs&>(a), mask, key0,
                                   w.seq.len_k, may_mask, alpha);
          else if (may_mask)
            tile_scores<Cfg>(s_tile, cs, mask, key0, w.seq.len_k, a.scale_log2, alpha);
          else
            cs.softmax.update(s_tile, a.scale_log2, alpha);
        };
        // First tile this group sees (the diagonal or last one): S only.
        {
          ScoreTile<Cfg> s_tile;
          wait_kv<Cfg>(s.k_ring(), ks);
          begin_turn();
          gemm_qk<Cfg>(s_tile, s.q[qs.stage], s.k[ks.stage], group);
          end_turn();
          tlx::wgmma_wait<0>();
          tlx::fence_operand(s_tile);
          scores(s_tile, first_it, true);
          s_tile.to_a(p);
        }
        // Steady state: S(it) and P(it-1) V(it-1) in flight together; the softmax of S(it) runs
        // under the P V MMA. Tiles are visited from the last key to the first, so the ones that
        // need the mask (past the end of the keys, across the diagonal) come first; the loop is
        // unrolled into a copy for them and a copy for the rest, which runs without the check.
        // Under a window's left bound the last tiles visited (the first keys) need it again: the
        // local kernels take the masked copy once more for that tail (the tiles every row of the
        // item sees form one run, so there is one tail at most).
        int unmasked_from = first_it + 1;
        while (unmasked_from < w.n_blocks &&
               mask.needs_mask((w.n_blocks - 1 - unmasked_from) * kN, kN, w.seq.len_k))
          ++unmasked_from;
        int unmasked_end = w.n_blocks;
        if constexpr (Cfg::kLocal) {
          while (unmasked_end > unmasked_from &&
                 mask.needs_mask((w.n_blocks - unmasked_end) * kN, kN, w.seq.len_k))
            --unmasked_end;
        }
        int it = first_it + 1;
        for (int masked_end = unmasked_from;; masked_end = w.n_blocks) {
#pragma unroll
          for (int may_mask = 1; may_mask >= 0; --may_mask) {
            for (const int end = may_mask ? masked_end : unmasked_end; it < end; ++it) {
              ScoreTile<Cfg> s_tile;
              wait_kv<Cfg>(s.k_ring(), ks);
              begin_turn();
              gemm_qk<Cfg>(s_tile, s.q[qs.stage], s.k[ks.stage], group);
              cs.softmax.rescale_o(cs.o, alpha);
              wait_kv<Cfg>(s.v_ring(), vs);
              gemm_pv<Cfg>(cs.o, p, s.v[vs.stage]);
              end_turn();
              tlx::wgmma_wait<1>();
              tlx::fence_operand(s_tile);
              scores(s_tile, it, may_mask != 0);
              // The softmax runs under P V.
              tlx::wgmma_wait_after<0>(cs.softmax.row_sum[0] + cs.softmax.row_sum[1]);
              tlx::fence_operand(cs.o);
              tlx::fence_operand(p);
              if (leader) s.v_ring().release(vs);
              vs.advance();
              s_tile.to_a(p);
            }
          }
          if (!Cfg::kLocal || it >= w.n_blocks) break;
        }
        // The last P V.
        cs.softmax.rescale_o(cs.o, alpha);
        pv_and_release<Cfg>(s, cs, p, vs);
        qs.advance();
        epilogue<Cfg>(cs.o, cs.softmax, s, tm_o, a, w, group, mask, false);
      });
  if (group == 0 && kTakeTurns)
    tlx::NamedBarrier::sync(1, kTurnThreads);  // the last group's last hand-over
}

}  // namespace jfa::sm90
