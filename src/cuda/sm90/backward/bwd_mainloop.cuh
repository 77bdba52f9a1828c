// A backward consumer group's walk over an item's steps: the scores, the probabilities under the
// step's mask, dP, dS, the dV and dK accumulations and the step's dQ part.
#pragma once

#include <cstdint>

#include "common/tile_visibility.hpp"
#include "cuda/sm90/backward/bwd_config.cuh"
#include "cuda/sm90/backward/bwd_dq_writer.cuh"
#include "cuda/sm90/backward/bwd_gemms.cuh"
#include "cuda/sm90/backward/bwd_row_terms.cuh"
#include "cuda/sm90/shared/shared_tile_keys.cuh"
#include "cuda/sm90/shared/softmax.cuh"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

// The scores of a step, S^T = K Q^T for this group's keys, issued once the stage's Q, dO, LSE and
// D have arrived (dP^T follows in step_gradients: issued here too, it would hold its registers
// while the previous step's dQ is in flight).
template <typename Cfg>
__device__ __forceinline__ void issue_scores(typename Cfg::Shared& s, ScoreTile<Cfg>& sc,
                                             const tlx::PipelineState<Cfg::kStages>& st,
                                             int group) {
  s.sync.q_ring.wait(st);
  gemm_keys_by_rows<Cfg>(sc, s.k, s.q[st.stage], group * 64);
}

// Which pairs of a step may see each other, beyond P = exp2(S^T scale log2e - LSE2).
enum class StepMask {
  kNone,        // every key of the group sees every query row of the step
  kSequence,    // one sequence: keys past its end, query rows past its end (whose terms are the
                // next sequence's) and (causal) keys past a query's diagonal get P = 0
  kSharedTile,  // several short sequences: each query row sees its key range (a KeyRange per row
                // of the item in shared memory), which is empty past the item's rows
  kWindow,      // kSequence's bounds, and a window's (the local-attention kernels), by the rule of
                // common/visibility.hpp
};

// The local-attention kernels' score rule (BwdLocalArgs): the window, and softcap, under which
// P = exp2(softcap_log2 tanh(S softcap_in) - LSE2).
struct LocalScores {
  jfa::detail::Window window;
  float softcap_in, softcap_log2;
};

// P^T = exp2(S^T scale log2e - LSE2) in place (kSoftcap: exp2(softcap_log2 tanh(S^T softcap_in) -
// LSE2)), each column with its query row's LSE, masked as kMask says; the thread's keys start at
// key0 and the step's query rows at q0 (in the item).
template <StepMask kMask, typename Tile, bool kSoftcap = false>
__device__ __forceinline__ void probabilities(Tile& sc, uint32_t lse2, float scale_log2,
                                              int32_t key0, int32_t q0, int32_t len_k,
                                              int32_t len_q, int32_t diag, bool causal,
                                              uint32_t key_ranges, const LocalScores& local = {}) {
  // kWindow: the window's rule (common/visibility.hpp) as bounds of key - the query's diagonal,
  // in int32 ((key - len_k) + (len_q - query) lies in (-len_k, len_q]); keys are >= 0 and those
  // past len_k are checked apart.
  const int32_t rel_lo = local.window.left < 0 ? INT32_MIN : -local.window.left;
  const int32_t rel_hi = local.window.right < 0 ? INT32_MAX : local.window.right;
#pragma unroll
  for (int j = 0; j < Tile::kBlocks; ++j) {
    const float2 l = tlx::ld_shared_f32x2(lse2 + 32 * j);
    uint2 ranges{};  // the KeyRange (lo | hi << 16) of the pair's two query rows
    if constexpr (kMask == StepMask::kSharedTile)
      ranges = tlx::ld_shared_u32x2(key_ranges + sizeof(uint32_t) * (q0 + Tile::col(j, 0)));
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float p;
        if constexpr (kSoftcap)
          p = fast_exp2(local.softcap_log2 * fast_tanh(sc.at(j, h, c) * local.softcap_in) -
                        (c == 0 ? l.x : l.y));
        else
          p = fast_exp2(fmaf(sc.at(j, h, c), scale_log2, -(c == 0 ? l.x : l.y)));
        const int32_t key = key0 + Tile::row(h), query = q0 + Tile::col(j, c);
        if constexpr (kMask == StepMask::kSequence) {
          if (key >= len_k || query >= len_q || (causal && key > query + diag)) p = 0.f;
        } else if constexpr (kMask == StepMask::kWindow) {
          const int32_t rel = (key - len_k) + (len_q - query);
          if (query >= len_q || key >= len_k || rel < rel_lo || rel > rel_hi) p = 0.f;
        } else if constexpr (kMask == StepMask::kSharedTile) {
          const uint32_t range = c == 0 ? ranges.x : ranges.y;
          if (key < static_cast<int32_t>(range & 0xffffu) ||
              key >= static_cast<int32_t>(range >> 16))
            p = 0.f;
        }
        sc.at(j, h, c) = p;
      }
  }
}

// P^T of a step's 64 keys from key0 (in the item's sequence) and its rows from q0, masked as the
// step needs: all keys seen, unless the tile holds keys past the sequence's end, rows past it or
// (causal) keys past the diagonal of its first query row; a shared tile always masks (its rows'
// key ranges at shared address `key_ranges`).
template <typename Cfg, bool kSoftcap>
__device__ __forceinline__ void local_step_probabilities(ScoreTile<Cfg>& sc, uint32_t lse2,
                                                         const BwdLocalArgs& a, const BwdItem& w,
                                                         int32_t key0, int32_t q0,
                                                         uint32_t key_ranges) {
  using Tile = ScoreTile<Cfg>;
  const LocalScores local{a.window, a.softcap_in, a.softcap_log2};
  const int32_t diag = w.seq.causal_shift();
  if (w.n_seqs > 1)
    probabilities<StepMask::kSharedTile, Tile, kSoftcap>(
        sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q, diag, false, key_ranges, local);
  else if (!jfa::detail::block_fully_visible(a.window, q0, q0 + Cfg::kBlockM, key0, key0 + 64,
                                             w.seq.len_q, w.seq.len_k) ||
           q0 + Cfg::kBlockM > w.seq.len_q)
    probabilities<StepMask::kWindow, Tile, kSoftcap>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k,
                                                     w.seq.len_q, diag, false, key_ranges, local);
  else
    probabilities<StepMask::kNone, Tile, kSoftcap>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k,
                                                   w.seq.len_q, diag, false, key_ranges, local);
}

template <typename Cfg>
__device__ __forceinline__ void step_probabilities(ScoreTile<Cfg>& sc, uint32_t lse2,
                                                   const BwdArgs& a, const BwdItem& w, int32_t key0,
                                                   int32_t q0, uint32_t key_ranges) {
  if constexpr (Cfg::kLocal) {
    // Windows under the window's rule; softcap's tanh in its kernels.
    local_step_probabilities<Cfg, Cfg::kSoftcap>(sc, lse2, static_cast<const BwdLocalArgs&>(a), w,
                                                 key0, q0, key_ranges);
    return;
  }
  const int32_t diag = w.seq.causal_shift();
  const bool masked = key0 + 64 > w.seq.len_k || q0 + Cfg::kBlockM > w.seq.len_q ||
                      (a.causal && q0 + diag < key0 + 63);
  if (w.n_seqs > 1)
    probabilities<StepMask::kSharedTile>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q,
                                         diag, a.causal != 0, key_ranges);
  else if (masked)
    probabilities<StepMask::kSequence>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q,
                                       diag, a.causal != 0, key_ranges);
  else
    probabilities<StepMask::kNone>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q, diag,
                                   a.causal != 0, key_ranges);
}

// dS^T = P^T (dP^T - D) as the A operand of dK += dS^T Q, from P^T's packed form (which the dV
// MMA holds anyway: a float32 copy would need as many registers again) and dP^T; the thread's D
// values start at shared address `dpsum`. to_a's order: register reg[j / 2][2 (j % 2) + h] holds
// column block j, row half h. In bf16 the difference is rounded to bf16 too and multiplied in
// pairs (three roundings where the float32 product has two, 13–15% more rounding error in dQ and
// dK, for ~48 fewer instructions per step); in fp16 the difference can exceed fp16's range where
// dS does not, so the product is formed in float32.
//
// Under softcap (the local-attention kernels) the scores passed through c tanh(s / c), whose
// derivative 1 - tanh^2 scales dS: tanh comes back from P and the row's LSE (both at hand, where
// keeping tanh from the scores would hold another tile of registers through the step),
// tanh = (log2 P + LSE2) / (c log2 e), to P's 16-bit precision; a P of 0 gives dS 0.
template <typename Cfg>
__device__ __forceinline__ void softcap_form_ds(
    const tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& p, ScoreTile<Cfg>& dp,
    uint32_t dpsum, uint32_t lse2, float inv_softcap_log2,
    tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& ds) {
  using T = typename Cfg::Element;
  using Tile = ScoreTile<Cfg>;
#pragma unroll
  for (int j = 0; j < Tile::kBlocks; ++j) {
    const float2 d = tlx::ld_shared_f32x2(dpsum + 32 * j);
    const float2 l = tlx::ld_shared_f32x2(lse2 + 32 * j);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 pf = tlx::unpack2<T>(p.reg[j / 2][2 * (j % 2) + h]);
      const float t0 = (__log2f(pf.x) + l.x) * inv_softcap_log2;
      const float t1 = (__log2f(pf.y) + l.y) * inv_softcap_log2;
      dp.at(j, h, 0) = pf.x > 0.f ? pf.x * (dp.at(j, h, 0) - d.x) * (1.f - t0 * t0) : 0.f;
      dp.at(j, h, 1) = pf.y > 0.f ? pf.y * (dp.at(j, h, 1) - d.y) * (1.f - t1 * t1) : 0.f;
    }
  }
  dp.to_a(ds);
}

template <typename Cfg>
__device__ __forceinline__ void form_ds(
    const tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& p, ScoreTile<Cfg>& dp,
    uint32_t dpsum, tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& ds, const BwdArgs& a,
    uint32_t lse2) {
  using T = typename Cfg::Element;
  using Tile = ScoreTile<Cfg>;
  if constexpr (Cfg::kSoftcap) {
    softcap_form_ds<Cfg>(p, dp, dpsum, lse2, static_cast<const BwdLocalArgs&>(a).inv_softcap_log2,
                         ds);
  } else {
#pragma unroll
    for (int j = 0; j < Tile::kBlocks; ++j) {
      const float2 d = tlx::ld_shared_f32x2(dpsum + 32 * j);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t pj = p.reg[j / 2][2 * (j % 2) + h];
        if constexpr (Cfg::kPackedDs) {
          ds.reg[j / 2][2 * (j % 2) + h] =
              tlx::mul2<T>(pj, tlx::pack2<T>(dp.at(j, h, 0) - d.x, dp.at(j, h, 1) - d.y));
        } else {
          const float2 pf = tlx::unpack2<T>(pj);
          dp.at(j, h, 0) = pf.x * (dp.at(j, h, 0) - d.x);
          dp.at(j, h, 1) = pf.y * (dp.at(j, h, 1) - d.y);
        }
      }
    }
    if constexpr (!Cfg::kPackedDs) dp.to_a(ds);
  }
}

// dS^T into rows key0 .. key0 + 63 of a dS^T tile, from its packed form (register ds.reg[kk][i]
// holds the pair of column block 2 kk + i / 2, row half i % 2).
template <typename Cfg>
__device__ __forceinline__ void store_ds(
    const tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& ds, typename Cfg::DsTile& tile,
    int key0) {
  using Tile = ScoreTile<Cfg>;
  const uint32_t addr = tlx::smem_addr(&tile);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      tlx::st_shared_u32(
          addr + Cfg::DsTile::offset_bytes(key0 + Tile::row(i % 2), Tile::col(2 * kk + i / 2, 0)),
          ds.reg[kk][i]);
}

// The operands of a step's RS MMAs, which must keep their registers until those MMAs are waited
// for.
template <typename Cfg>
struct StepOperands {
  tlx::AFragment<typename Cfg::Element, Cfg::kBlockM> p;   // P^T
  tlx::AFragment<typename Cfg::Element, Cfg::kBlockM> ds;  // dS^T
};

// The rest of a step once its scores are issued: dP^T = V dO^T, P^T, dV += P^T dO,
// dS^T = P^T (dP^T - D), dS^T to shared memory, dQ = dS K and dK += dS^T Q issued. Leaves dV, dQ
// and dK in flight (three commit groups, in that order).
template <typename Cfg>
__device__ __forceinline__ void step_gradients(typename Cfg::Shared& s, ScoreTile<Cfg>& sc,
                                               ScoreTile<Cfg>& dp, tlx::AccumFragment<Cfg::kD>& dk,
                                               tlx::AccumFragment<Cfg::kD>& dv, DqTile<Cfg>& dq,
                                               StepOperands<Cfg>& ops, const BwdArgs& a,
                                               const BwdItem& w, int32_t m, int group,
                                               const tlx::PipelineState<Cfg::kStages>& st,
                                               int ds_buf) {
  using Tile = ScoreTile<Cfg>;
  const int32_t key0 = w.n_block * Cfg::kBlockN + group * 64;  // of this group, in the sequence
  const int32_t q0 = m * Cfg::kBlockM;
  // The thread's first column of the step's LSE and D rows; column block j is 8 j further.
  const int32_t first = row_terms_at(w.seq.q_start + q0, a.heads_q).first;
  const uint32_t lse2 = tlx::smem_addr(s.lse2[st.stage] + first + Tile::col(0, 0));
  const uint32_t dpsum = tlx::smem_addr(s.dpsum[st.stage] + first + Tile::col(0, 0));
  gemm_keys_by_rows<Cfg>(dp, s.v, s.dout[st.stage], group * 64);

  // P^T (S^T done, dP^T may still run), packed at once as the A operand of dV += P^T dO.
  tlx::wgmma_wait<1>();
  tlx::fence_operand(sc.reg);
  step_probabilities<Cfg>(sc, lse2, a, w, key0, q0,
                          tlx::smem_addr(&s.key_rows[group]));  // shared_tile_key_ranges
  sc.to_a(ops.p);
  gemm_accumulate<Cfg>(dv, ops.p, s.dout[st.stage]);

  // dS^T = P^T (dP^T - D), packed, then dK += dS^T Q; dS^T into shared memory for dQ (the other
  // group's dQ of two steps ago has read this buffer: it waited for its MMAs before the last
  // barrier).
  tlx::wgmma_wait<1>();
  tlx::fence_operand(dp.reg);
  form_ds<Cfg>(ops.p, dp, dpsum, ops.ds, a, lse2);
  typename Cfg::DsTile& ds = s.ds[ds_buf];
  store_ds<Cfg>(ops.ds, ds, group * 64);
  tlx::fence_proxy_async_smem();
  if constexpr (Cfg::kDqSplit == DqSplit::kKeys)
    tlx::NamedBarrier::sync(Cfg::kDsBarrier0 + group, 128);
  else
    tlx::NamedBarrier::sync(Cfg::kDsBarrier0, 256);
  // dQ before dK, so that dQ is staged for the writer while dK's MMA runs.
  gemm_dq<Cfg>(dq, ds, s.k, group);
  gemm_accumulate<Cfg>(dk, ops.ds, s.q[st.stage]);
}

// Where an item's walk stands: the step's query head and q tile (walk_q_tile's order), from the
// item's first query head `head0`.
template <bool kLocal>
struct StepCursor {
  int32_t head, i_head, m;

  __device__ __forceinline__ StepCursor(const BwdArgs& a, const BwdItem& w, int32_t head0)
      : head(head0), i_head(0), m(walk_q_tile<kLocal>(a, w, 0)) {}
};

// A step's end in either consumer layout: its Q/dO stage has been read (the MMAs waited for, LSE
// and D in registers) and goes back to the producer; then the next step's stage, dS^T buffer,
// query head and q tile. No proxy fence before the release: a read that has returned its value
// cannot see the producer's next TMA write, and the fence (with the MEMBAR it brings) stood
// between every step's last MMA and the next step's first.
template <typename Cfg>
__device__ __forceinline__ void end_step(typename Cfg::Shared& s, const BwdArgs& a,
                                         const BwdItem& w, tlx::PipelineState<Cfg::kStages>& st,
                                         int& ds_buf, StepCursor<Cfg::kLocal>& at) {
  __syncwarp();
  if (tlx::lane_is_leader()) s.sync.q_ring.release(st);
  st.advance();
  ds_buf ^= 1;
  if (++at.i_head == w.q_tiles()) {
    at.i_head = 0;
    ++at.head;
  }
  at.m = walk_q_tile<Cfg::kLocal>(a, w, at.i_head);
}

// Walks an item's steps (the q tiles of each of its query heads, in walk_q_tile's order) for
// one consumer group; each step's dQ goes to the dQ writer. No MMA is in flight across the loop's
// back edge: an accumulator carried in flight from one iteration to the next makes the compiler
// serialize every MMA of the kernel.
template <typename Cfg>
__device__ __forceinline__ void walk_item(typename Cfg::Shared& s, tlx::AccumFragment<Cfg::kD>& dk,
                                          tlx::AccumFragment<Cfg::kD>& dv, const BwdArgs& a,
                                          const BwdItem& w, int group,
                                          tlx::PipelineState<Cfg::kStages>& st, int& ds_buf,
                                          uint32_t& dq_phase) {
  const int32_t steps = item_heads<Cfg::kHeadSplits>(a) * w.q_tiles();
  StepCursor<Cfg::kLocal> at(a, w, item_first_q_head<Cfg::kHeadSplits>(a, w));
  for (int32_t i = 0; i < steps; ++i) {
    ScoreTile<Cfg> sc, dp;
    DqTile<Cfg> dq;
    issue_scores<Cfg>(s, sc, st, group);
    StepOperands<Cfg> ops;
    step_gradients<Cfg>(s, sc, dp, dk, dv, dq, ops, a, w, at.m, group, st, ds_buf);
    tlx::wgmma_wait<1>();  // dV and dQ done, dK still running
    tlx::fence_operand(dv.reg);
    tlx::fence_operand(dq.reg);
    tlx::fence_operand(ops.p.reg);
    stage_dq<Cfg>(s, dq, a, w, at.head, at.m, group, dq_phase);
    tlx::wgmma_wait<0>();
    tlx::fence_operand(dk.reg);
    tlx::fence_operand(ops.ds.reg);
    end_step<Cfg>(s, a, w, st, ds_buf, at);
  }
}

}  // namespace jfa::sm90
