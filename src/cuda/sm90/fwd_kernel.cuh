// Hopper forward kernel of jagged attention: one Q tile (64 rows per consumer warp group) of one
// head of one sequence per work item; a persistent grid takes the items (from a global counter with
// two consumer groups, round-robin with three; see ItemSource).
//
// Roles (128 threads per warp group, one CTA per SM):
//   warp group 0  producer: one thread issues TMA for Q (once per item, double-buffered where
//                 shared memory allows, so that the next item's Q arrives during this one) and
//                 K/V through rings of
//                 kStages stages guarded by full/empty mbarriers, K one tile ahead of V (the
//                 order in which the overlapped schedule consumes them); registers given away.
//   warp groups 1.. consumers (two or three, see FwdConfig): 64 Q rows each; S = Q K^T
//                 (SS wgmma), online softmax in registers (exp2, scale folded into one FMA), P
//                 packed to 16 bits as the A operand of O += P V (RS wgmma, V read through the
//                 transposed-B descriptor); O staged in shared memory and written by TMA stores.
//
// Packed tensors are addressed through one 3-D tensor map each, dims (head_dim, heads, total), box
// (64, 1, rows): a tile of sequence b starts at token cu_seqlens[b] + row0. Keys past the end of a
// sequence in its last K tile are masked; Q rows past the end are computed, and their part of an
// O tile is clipped by the ragged output map (FwdArgs::out_ragged_rows).
// Short sequences share tiles: a run of consecutive sequences with at most kBlockM query and
// kBlockN key tokens in all is one work item whose rows each see only their own sequence's keys
// (a block-diagonal mask built from per-row key ranges), so no tile is mostly padding.
// Offsets are not validated on the device; they are clamped to [0, total] so that no access leaves
// the caller's buffers (results for invalid offsets are unspecified).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/fwd_params.hpp"
#include "cuda/sm90/work_list.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/grid_dependency.hpp"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/smem_tile.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

// One work item as both roles see it; they derive it from the same inputs so they agree on every
// skip and on the number of K tiles (and thus on the pipeline phases).
struct TileWork {
  SeqBounds seq;  // of all sequences of the item
  int32_t first_seq;
  int32_t n_seqs;  // > 1: a shared tile of several short sequences (m_block 0)
  int32_t head;
  int32_t m_block;
  int32_t n_blocks;  // K tiles to visit, 0 when no query row of the tile sees a key
  bool active;       // the tile has query rows
};

// kGroups consumer warp groups of 64 rows each: three (192-row tiles) at head_dim 64, where the
// softmax weighs the most per FLOP and more warps hide its latency; two (128 rows) at 128, and at
// 64 for batches of short sequences (fwd_dispatch.cu says when). K tiles of kKeys keys: 128, or 160
// at head_dim 128 on long sequences without the causal mask (fwd_dispatch.cu).
template <typename T, int kHeadDim, int kGroups, int kKeys = 128>
struct FwdConfig {
  static_assert(kGroups == 2 || kGroups == 3, "two or three consumer warp groups");
  // Sizes with wgmma wrappers (tools/gen_wgmma_ops.py) and a power-of-two number of partial row
  // maxima and sums in the softmax (8 from 64 keys up).
  static_assert(kKeys == 128 || kKeys == 160, "K tiles of 128 or 160 keys");
  using Element = T;
  static constexpr int kD = kHeadDim;
  static constexpr int kConsumerGroups = kGroups;
  static constexpr int kBlockM = 64 * kConsumerGroups;
  static constexpr int kBlockN = kKeys;
#ifdef JFA_SM90_KV_STAGES  // tuning builds only; the default is the measured best
  static constexpr int kStages = JFA_SM90_KV_STAGES;
#else
  static constexpr int kStages = kHeadDim <= 64 ? 4 : 2;
#endif
  // The next item's Q loads while this one runs, where shared memory has room for a second Q tile
  // (not with 160-key tiles at head_dim 128; measured: a second Q tile gains little there).
  static constexpr int kQStagesThatFit =
      (2 * kBlockM + 2 * kStages * kBlockN + 64 * kGroups) * kHeadDim * 2 + 2048 <= 232448 ? 2 : 1;
#ifdef JFA_SM90_Q_STAGES  // tuning builds only; capped where it does not fit
  static constexpr int kQStages =
      JFA_SM90_Q_STAGES < kQStagesThatFit ? JFA_SM90_Q_STAGES : kQStagesThatFit;
#else
  static constexpr int kQStages = kQStagesThatFit;
#endif
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerWarps = 4 * kConsumerGroups;
  // Work items: with two consumer groups the producer claims them from a global counter and hands
  // them out (measured: +4-10% causal); three groups have no registers to spare for that (every
  // split spills) and walk the items round-robin.
  static constexpr bool kDynamicItems = kConsumerGroups == 2;
  // Groups skip the K tiles none of their rows sees (overlapped schedule). It pays with 192-row
  // tiles, whose first group sees up to 128 fewer keys than the last under the causal mask
  // (measured +6% causal); with two groups it rarely applies and the extra code cost 2-5% on tiny
  // sequences.
  static constexpr bool kSkipUnseenKTiles = kConsumerGroups == 3;
#if defined(JFA_SM90_PRODUCER_REGS) && defined(JFA_SM90_CONSUMER_REGS)  // tuning builds, 2 groups
  static constexpr int kProducerRegs = kConsumerGroups == 2 ? JFA_SM90_PRODUCER_REGS : 32;
  static constexpr int kConsumerRegs = kConsumerGroups == 2 ? JFA_SM90_CONSUMER_REGS : 160;
#else
  // A producer that decodes and hands out the items keeps more than a bare TMA issuer.
  static constexpr int kProducerRegs = kConsumerGroups == 2 ? 56 : 32;
  static constexpr int kConsumerRegs = kConsumerGroups == 2 ? 224 : 160;
#endif
  // setmaxnreg only moves registers between the warp groups of the CTA: the split must fit in what
  // the CTA holds at launch (the per-thread count of __launch_bounds__(kThreads, 1), a multiple of
  // 8), or the consumers' increase waits forever.
  static_assert((kProducerRegs + kConsumerGroups * kConsumerRegs) * 128 <=
                    65536 / kThreads / 8 * 8 * kThreads,
                "register split exceeds the CTA's allocation");

  static constexpr int kItemSlots = 4;  // work items the producer has claimed ahead (dynamic)
  // Named barriers: 1 .. kConsumerGroups are the turn ring, then one per group for its epilogue.
  static constexpr uint32_t kEpilogueBarrier0 = 1 + kConsumerGroups;
  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using KVTile = tlx::SwizzledTile<T, kBlockN, kD>;
  using OTile = tlx::SwizzledTile<T, 64, kD>;  // one group's rows of O, staged for the TMA store

  struct Shared {
    QTile q[kQStages];
    KVTile k[kStages];
    KVTile v[kStages];
    OTile o[kConsumerGroups];
    // The small members last, so that no 1024-byte-aligned tile follows them.
    tlx::MBarrier q_full[kQStages], q_empty[kQStages];
    tlx::MBarrier item_full[kItemSlots], item_empty[kItemSlots];
    TileWork item[kItemSlots];  // decoded by the producer, read by the consumers
    tlx::MBarrier k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(Shared)) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 232448, "over the 227 KB of shared memory a CTA may opt in to");
};

// Item `item` of the work list. Items go tile by tile, the heads of one q tile neighbours, except
// (kHeadMajorRuns, no causal mask) inside the run of list entries that holds the q tiles of one
// sequence, whose items go head by head: the CTAs at work then read the K/V of a few heads of one
// sequence, which stay in L2 also for long sequences (with 16 heads of 8K keys, the tile-major
// order streams 64 MB). Under the causal mask the tiles of a head differ in cost and the
// tile-major order keeps the items in flight alike. Dynamic items only: in the round-robin walk of
// three groups every thread decodes, and the extra arithmetic spills.
template <int kBlockM, int kBlockN, bool kHeadMajorRuns = false>
__device__ __forceinline__ TileWork decode_item(const FwdArgs& a, int64_t item) {
  TileWork w;
  const int64_t tile = item / a.heads_q;
  w.head = static_cast<int32_t>(item - tile * a.heads_q);
  const WorkTile wt = a.work[tile];
  const int32_t b =
      wt.seq < 0 ? 0 : (wt.seq >= a.batch ? static_cast<int32_t>(a.batch - 1) : wt.seq);
  const int64_t left = a.batch - b;
  w.first_seq = b;
  w.n_seqs = wt.n_seqs < 1 ? 1 : (wt.n_seqs > left ? static_cast<int32_t>(left) : wt.n_seqs);
  w.seq = seq_bounds(a.cu_q, a.cu_k, a.total_q, a.total_k, b, w.n_seqs);
  w.m_block = w.n_seqs > 1 ? 0 : wt.m_block;
  if (kHeadMajorRuns && a.head_major_runs && !a.causal && w.n_seqs == 1) {
    // The run holds m_block = tiles - 1 .. 0 at list entries run_first .. run_first + tiles - 1,
    // so its items are [run_first, run_first + tiles) * heads_q and `item` lies inside.
    const int32_t tiles = q_tile_count<kBlockM>(w.seq.len_q);
    if (wt.m_block >= 0 && wt.m_block < tiles) {
      const int64_t run_first = tile - (tiles - 1 - wt.m_block);
      const int64_t local = item - run_first * a.heads_q;  // in [0, tiles * heads_q)
      const int64_t head = local / tiles;
      w.head = static_cast<int32_t>(head);
      w.m_block = tiles - 1 - static_cast<int32_t>(local - head * tiles);
    }
  }
  w.active = w.m_block >= 0 && static_cast<int64_t>(w.m_block) * kBlockM < w.seq.len_q;
  w.n_blocks = tile_k_blocks<kBlockM, kBlockN>(w.seq, w.m_block, a.causal && w.n_seqs == 1);
  return w;
}

// The item as lane 0 of the warp has it. Every lane holds the same values already; taking them from
// one lane lets the compiler prove it, so that the ring positions, barrier addresses and wgmma
// descriptors derived from the item live in uniform registers instead of being moved there before
// every wgmma.
__device__ __forceinline__ TileWork warp_uniform(const TileWork& w) {
  TileWork u;
  u.seq.q_start = __shfl_sync(0xffffffffu, w.seq.q_start, 0);
  u.seq.len_q = __shfl_sync(0xffffffffu, w.seq.len_q, 0);
  u.seq.k_start = __shfl_sync(0xffffffffu, w.seq.k_start, 0);
  u.seq.len_k = __shfl_sync(0xffffffffu, w.seq.len_k, 0);
  u.first_seq = __shfl_sync(0xffffffffu, w.first_seq, 0);
  u.n_seqs = __shfl_sync(0xffffffffu, w.n_seqs, 0);
  u.head = __shfl_sync(0xffffffffu, w.head, 0);
  u.m_block = __shfl_sync(0xffffffffu, w.m_block, 0);
  u.n_blocks = __shfl_sync(0xffffffffu, w.n_blocks, 0);
  u.active = __shfl_sync(0xffffffffu, static_cast<int>(w.active), 0) != 0;
  return u;
}

// The work items of one CTA, in the same order for every role. Round-robin: CTA b takes items b,
// b + grid, ... and every role decodes them itself. Dynamic (Cfg::kDynamicItems): the producer
// claims the next item from a global counter whenever it has room and hands the decoded item to
// the consumer warps through a ring in shared memory; a negative n_blocks ends the walk.
template <typename Cfg, bool kProducer>
struct ItemSource {
  int64_t item = blockIdx.x;
  tlx::PipelineState<Cfg::kItemSlots> is;

  // The next item; false when there is none left.
  __device__ __forceinline__ bool next(typename Cfg::Shared& s, const FwdArgs& a, int64_t n_items,
                                       TileWork& w) {
    if constexpr (!Cfg::kDynamicItems) {
      if (item >= n_items) return false;
      w = decode_item<Cfg::kBlockM, Cfg::kBlockN>(a, item);
      item += gridDim.x;
      return true;
    } else if constexpr (kProducer) {
      const int64_t claimed = static_cast<int64_t>(atomicAdd(a.next_item, 1ull));
      w = TileWork{};
      if (claimed < n_items)
        w = decode_item<Cfg::kBlockM, Cfg::kBlockN, true>(a, claimed);
      else
        w.n_blocks = -1;
      s.item_empty[is.stage].wait_suspended(is.phase ^ 1u);
      s.item[is.stage] = w;
      s.item_full[is.stage].arrive();
      is.advance();
      return w.n_blocks >= 0;
    } else {
      s.item_full[is.stage].wait(is.phase);
      w = warp_uniform(s.item[is.stage]);
      // Every thread releases its own reads of the slot (a lane's arrive would not cover the
      // others' loads, which may still be in flight).
      s.item_empty[is.stage].arrive();
      is.advance();
      return w.n_blocks >= 0;
    }
  }
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread.
template <typename Cfg>
__device__ __forceinline__ void producer_loop(typename Cfg::Shared& s, const CUtensorMap* tm_q,
                                              const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                              const FwdArgs& a, int64_t n_items) {
  constexpr int kBoxes = Cfg::kD / 64;
  constexpr uint32_t kQBytes = Cfg::QTile::kBytes;
  constexpr uint32_t kKVBytes = Cfg::KVTile::kBytes;
  tlx::PipelineState<Cfg::kStages> ks, vs;
  tlx::PipelineState<Cfg::kQStages> qs;
  // One K or V tile into its ring; tiles are visited from the last (the one that may need a mask)
  // to the first.
  auto load_kv = [&](const CUtensorMap* map, tlx::MBarrier* full, tlx::MBarrier* empty,
                     typename Cfg::KVTile* tiles, tlx::PipelineState<Cfg::kStages>& st,
                     const TileWork& w, int32_t kv_head, int it) {
    const int32_t row = w.seq.k_start + (w.n_blocks - 1 - it) * Cfg::kBlockN;
    empty[st.stage].wait_suspended(st.phase ^ 1u);
    full[st.stage].arrive_expect_tx(kKVBytes);
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx)
      tlx::tma_load_3d(map, &full[st.stage], tiles[st.stage].box(bx), bx * 64, kv_head, row);
    st.advance();
  };
  auto load_k = [&](const TileWork& w, int32_t kv_head, int it) {
    load_kv(tm_k, s.k_full, s.k_empty, s.k, ks, w, kv_head, it);
  };
  auto load_v = [&](const TileWork& w, int32_t kv_head, int it) {
    load_kv(tm_v, s.v_full, s.v_empty, s.v, vs, w, kv_head, it);
  };
  ItemSource<Cfg, true> items;
  TileWork w;
  while (items.next(s, a, n_items, w)) {
    if (!w.active || w.n_blocks == 0) continue;
    const int32_t kv_head = w.head / a.group;
    s.q_empty[qs.stage].wait_suspended(qs.phase ^ 1u);
    s.q_full[qs.stage].arrive_expect_tx(kQBytes);
    const int32_t q_row = w.seq.q_start + w.m_block * Cfg::kBlockM;
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx)
      tlx::tma_load_3d(tm_q, &s.q_full[qs.stage], s.q[qs.stage].box(bx), bx * 64, w.head, q_row);
    load_k(w, kv_head, 0);
    for (int it = 1; it < w.n_blocks; ++it) {
      load_k(w, kv_head, it);
      load_v(w, kv_head, it - 1);
    }
    load_v(w, kv_head, w.n_blocks - 1);
    qs.advance();
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer pieces: one warp group, 64 rows; each thread owns rows r and r + 8 (see wgmma.hpp).

template <typename Cfg>
struct ConsumerState {
  static constexpr int kD = Cfg::kD;
  static constexpr int kN = Cfg::kBlockN;
  float o[kD / 2];
  // The reference maxima of the exponentials (not always the running maxima: see
  // softmax_scores); row_sum and O are relative to them.
  float row_max[2];
  float row_sum[2];  // per-thread partial sums, reduced across the quad at the end
  bool rescale;      // the last softmax moved row_max of some row of this warp: O needs alpha
};

// S = Q K^T for this warp group's 64 rows.
template <typename Cfg>
__device__ __forceinline__ void gemm_qk(float (&s_acc)[Cfg::kBlockN / 2],
                                        const typename Cfg::QTile& q, const typename Cfg::KVTile& k,
                                        int group) {
  using T = typename Cfg::Element;
  const uint64_t q_desc =
      tlx::make_desc_sw128(q.box_addr(0) + group * 64 * tlx::kSwizzleBytes, 16, 1024);
  const uint64_t k_desc = tlx::make_desc_sw128(k.box_addr(0), 16, 1024);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kD / 16; ++kk) {
    tlx::wgmma_ss<T, Cfg::kBlockN, 0>(
        s_acc, tlx::desc_advance(q_desc, (kk / 4) * Cfg::QTile::kBoxBytes + (kk % 4) * 32),
        tlx::desc_advance(k_desc, (kk / 4) * Cfg::KVTile::kBoxBytes + (kk % 4) * 32),
        kk > 0 ? 1u : 0u);
  }
  tlx::wgmma_commit();
}

// O += P V: P as register A fragments, V [kBlockN x D] read as an MN-major B.
template <typename Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kD / 2],
                                        const uint32_t (&p)[Cfg::kBlockN / 16][4],
                                        const typename Cfg::KVTile& v) {
  using T = typename Cfg::Element;
  const uint64_t v_desc = tlx::make_desc_sw128(v.box_addr(0), Cfg::KVTile::kBoxBytes, 1024);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
    tlx::wgmma_rs<T, Cfg::kD, 1>(o, p[kk], tlx::desc_advance(v_desc, kk * 16 * tlx::kSwizzleBytes),
                                 1u);
  tlx::wgmma_commit();
}

// Keys [lo, hi) of the K range of the item that each of this thread's two rows may see.
struct RowKeys {
  int32_t lo[2], hi[2];
};

// One sequence per item: keys before the sequence end and (causal) up to the row's diagonal,
// bottom-right aligned. A shared tile: the keys of the row's own sequence, found by binary search
// in cu_seqlens_q; rows past the last sequence see none.
template <typename Cfg>
__device__ __forceinline__ RowKeys row_key_ranges(const FwdArgs& a, const TileWork& w,
                                                  int32_t row0) {
  RowKeys rk;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t row = row0 + 8 * h;
    int32_t lo = 0, hi = w.seq.len_k;
    if (w.n_seqs == 1) {
      if (a.causal) {
        const int64_t last = static_cast<int64_t>(row) + w.seq.len_k - w.seq.len_q + 1;
        hi = last < 0 ? 0 : (last < hi ? static_cast<int32_t>(last) : hi);
      }
    } else if (row >= w.seq.len_q) {
      hi = 0;
    } else {
      const int32_t token = w.seq.q_start + row;
      int32_t first = w.first_seq, last = w.first_seq + w.n_seqs - 1;
      while (first < last) {
        const int32_t mid = (first + last + 1) / 2;
        if (clamp_offset(__ldg(a.cu_q + mid), 0, a.total_q) <= token)
          first = mid;
        else
          last = mid - 1;
      }
      const int32_t qs = clamp_offset(__ldg(a.cu_q + first), 0, a.total_q);
      const int32_t qe = clamp_offset(__ldg(a.cu_q + first + 1), qs, a.total_q);
      const int64_t k_end = static_cast<int64_t>(w.seq.k_start) + w.seq.len_k;
      const int32_t ks = clamp_offset(__ldg(a.cu_k + first), w.seq.k_start, k_end);
      const int32_t ke = clamp_offset(__ldg(a.cu_k + first + 1), ks, k_end);
      lo = ks - w.seq.k_start;
      hi = ke - w.seq.k_start;
      if (a.causal) {
        const int64_t last_key =
            static_cast<int64_t>(lo) + (token - qs) + (ke - ks) - (qe - qs) + 1;
        hi = last_key < lo ? lo : (last_key < hi ? static_cast<int32_t>(last_key) : hi);
      }
    }
    rk.lo[h] = lo;
    rk.hi[h] = hi;
  }
  return rk;
}

// Masks the scores of keys outside each row's range.
template <typename Cfg>
__device__ __forceinline__ void apply_mask(float (&s_acc)[Cfg::kBlockN / 2], int32_t key0,
                                           const RowKeys& rk) {
  const int lane = threadIdx.x & 31;
  const int32_t col0 = key0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t key = col0 + 8 * j + (e & 1);
      const int h = e >> 1;
      if (key < rk.lo[h] || key >= rk.hi[h]) s_acc[4 * j + e] = -INFINITY;
    }
  }
}

// Online softmax on one S tile: updates the running max and sums and returns P in s_acc and the
// factors (alpha) by which O must be rescaled; O itself is left alone (it may still be the target
// of an MMA in flight).
template <typename Cfg>
__device__ __forceinline__ void softmax_scores(float (&s_acc)[Cfg::kBlockN / 2],
                                               ConsumerState<Cfg>& cs, float scale_log2,
                                               float (&alpha)[2]) {
  // Row maxima and sums over kParts independent partial results each, combined as a tree: a single
  // running value would make a dependency chain as long as the row.
  constexpr int kCols = Cfg::kBlockN / 8;  // column pairs per row of this thread
  constexpr int kParts = kCols < 8 ? kCols : 8;
  float mx[2][kParts];
#pragma unroll
  for (int q = 0; q < kParts; ++q) {
    mx[0][q] = fmaxf(s_acc[4 * q + 0], s_acc[4 * q + 1]);
    mx[1][q] = fmaxf(s_acc[4 * q + 2], s_acc[4 * q + 3]);
  }
#pragma unroll
  for (int j = kParts; j < kCols; ++j) {
    mx[0][j % kParts] = fmaxf(mx[0][j % kParts], fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
    mx[1][j % kParts] = fmaxf(mx[1][j % kParts], fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
  }
#pragma unroll
  for (int width = kParts / 2; width > 0; width /= 2)
#pragma unroll
    for (int q = 0; q < width; ++q) {
      mx[0][q] = fmaxf(mx[0][q], mx[0][q + width]);
      mx[1][q] = fmaxf(mx[1][q], mx[1][q + width]);
    }
  float m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = fmaxf(cs.row_max[h], mx[h][0]);
    m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
    m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
  }
  // The reference maximum moves only when some row of the warp grew by more than
  // kMaxGrowthLog2 (the exponentials stay <= 2^kMaxGrowthLog2, exact in fp32 and in 16-bit P), so
  // most tiles after the first skip the rescaling of O; the result is the same softmax.
  constexpr float kMaxGrowthLog2 = 8.f;
  const bool grew = (m[0] - cs.row_max[0]) * scale_log2 > kMaxGrowthLog2 ||
                    (m[1] - cs.row_max[1]) * scale_log2 > kMaxGrowthLog2;
  cs.rescale = __any_sync(0xffffffffu, grew);
  float neg_m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float ref = cs.rescale ? m[h] : cs.row_max[h];
    const float m_scaled = ref == -INFINITY ? 0.f : ref * scale_log2;
    neg_m[h] = -m_scaled;
    alpha[h] = cs.rescale ? fast_exp2(fmaf(cs.row_max[h], scale_log2, neg_m[h])) : 1.f;
    cs.row_max[h] = ref;
  }
  float sum[2][kParts];
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      const float p = fast_exp2(fmaf(s_acc[4 * j + e], scale_log2, neg_m[h]));
      s_acc[4 * j + e] = p;
      if (j < kParts && (e & 1) == 0)
        sum[h][j] = p;
      else
        sum[h][j % kParts] += p;
    }
  }
#pragma unroll
  for (int width = kParts / 2; width > 0; width /= 2)
#pragma unroll
    for (int q = 0; q < width; ++q) {
      sum[0][q] += sum[0][q + width];
      sum[1][q] += sum[1][q + width];
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) cs.row_sum[h] = cs.row_sum[h] * alpha[h] + sum[h][0];
}

template <typename Cfg>
__device__ __forceinline__ void rescale_o(ConsumerState<Cfg>& cs, const float (&alpha)[2]) {
  if (!cs.rescale) return;  // warp-uniform: alpha is 1 for every row of the warp
#pragma unroll
  for (int j = 0; j < Cfg::kD / 8; ++j) {
    cs.o[4 * j + 0] *= alpha[0];
    cs.o[4 * j + 1] *= alpha[0];
    cs.o[4 * j + 2] *= alpha[1];
    cs.o[4 * j + 3] *= alpha[1];
  }
}

// Normalises O into this group's staging tile, from which one thread writes the group's 64 rows
// with TMA stores through the ragged output map (rows past the item's last query row are clipped
// by the map, see FwdArgs::out_ragged_rows); LSE goes out directly. The store only has to finish
// reading the tile before the group's next epilogue, so the group moves on to its next item at
// once.
template <typename Cfg>
__device__ __forceinline__ void epilogue(ConsumerState<Cfg>& cs, typename Cfg::Shared& s,
                                         const CUtensorMap* tm_o, const FwdArgs& a,
                                         const TileWork& w, int group, int32_t row0_in_seq,
                                         bool no_keys) {
  using T = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  const int tid = threadIdx.x - 128 * (group + 1);
  const uint32_t barrier = Cfg::kEpilogueBarrier0 + group;
  const int64_t first = static_cast<int64_t>(w.seq.q_start) + w.m_block * Cfg::kBlockM + group * 64;
  const int64_t end = static_cast<int64_t>(w.seq.q_start) + w.seq.len_q;
  if (first >= end) return;  // warp-group uniform: no row of the group lies inside the item
  typename Cfg::OTile& tile = s.o[group];
  const uint32_t tile_addr = tlx::smem_addr(&tile);
  if (tid == 0) tlx::tma_store_wait_read<0>();  // the previous item's store has read the tile
  tlx::NamedBarrier::sync(barrier, 128);
  const int local_row = (tid / 32) * 16 + lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = cs.row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool empty = no_keys || !(l > 0.f);
    const float inv = empty ? 0.f : 1.f / l;
#pragma unroll
    for (int j = 0; j < Cfg::kD / 8; ++j) {
      const uint32_t packed =
          tlx::pack2<T>(cs.o[4 * j + 2 * h] * inv, cs.o[4 * j + 2 * h + 1] * inv);
      tlx::st_shared_u32(
          tile_addr + Cfg::OTile::offset_bytes(local_row + 8 * h, 8 * j + 2 * (lane & 3)), packed);
    }
    const int32_t row = row0_in_seq + 8 * h;
    if (row < w.seq.len_q && a.lse != nullptr && (lane & 3) == 0) {
      const int64_t token = static_cast<int64_t>(w.seq.q_start) + row;
      const float lse = empty ? -INFINITY : cs.row_max[h] * a.softmax_scale + logf(l);
      a.lse[static_cast<int64_t>(w.head) * a.total_q + token] = lse;
    }
  }
  tlx::fence_proxy_async_smem();
  tlx::NamedBarrier::sync(barrier, 128);
  if (tid == 0) {
    const int32_t r = static_cast<int32_t>(a.out_ragged_rows - (end - first));
#pragma unroll
    for (int bx = 0; bx < Cfg::kD / 64; ++bx)
      tlx::tma_store_4d(tm_o, tile.box(bx), bx * 64, w.head, r, static_cast<int32_t>(end));
    tlx::tma_store_commit();
  }
}

// What a consumer thread knows about its item: the first of its two rows (inside the item's rows),
// the key ranges of both rows, and whether a K tile can skip the mask.
struct ItemView {
  int32_t row0;
  RowKeys keys;
  int32_t first_row;   // of the tile
  int32_t diag_shift;  // len_k - len_q
  int32_t key_end;     // no row of this warp group sees a key at or past this one
  bool causal;
  bool shared;  // several sequences in the tile: always mask

  // A K tile needs the mask when it reaches past the key range's end or (causal) past the diagonal
  // of the tile's first row.
  __device__ __forceinline__ bool needs_mask(int32_t key0, int32_t block_n, int32_t len_k) const {
    return shared || key0 + block_n > len_k ||
           (causal && key0 + block_n - 1 > first_row + diag_shift);
  }
};

// Masks one S tile where it needs it and runs the online softmax on it.
template <typename Cfg>
__device__ __forceinline__ void tile_scores(float (&s_acc)[Cfg::kBlockN / 2],
                                            ConsumerState<Cfg>& cs, const ItemView& v, int32_t key0,
                                            int32_t len_k, float scale_log2, float (&alpha)[2]) {
  if (v.needs_mask(key0, Cfg::kBlockN, len_k)) apply_mask<Cfg>(s_acc, key0, v.keys);
  softmax_scores<Cfg>(s_acc, cs, scale_log2, alpha);
}

// Starts an item for one consumer thread: clears the running state; an item whose rows see no key
// is finished here (zeros, LSE -inf) and false is returned.
template <typename Cfg>
__device__ __forceinline__ bool start_item(ConsumerState<Cfg>& cs, typename Cfg::Shared& s,
                                           const CUtensorMap* tm_o, const FwdArgs& a,
                                           const TileWork& w, int group, ItemView& v) {
  const int tid = threadIdx.x - 128 * (group + 1);
  v.first_row = w.m_block * Cfg::kBlockM;
  v.row0 = v.first_row + group * 64 + (tid / 32) * 16 + (tid & 31) / 4;
  v.diag_shift = w.seq.len_k - w.seq.len_q;
  v.causal = a.causal != 0;
  v.shared = w.n_seqs > 1;
  // Warp-group uniform: the group's rows start at group_first; under the causal mask its last row
  // sees keys up to its diagonal.
  const int64_t group_first = static_cast<int64_t>(v.first_row) + group * 64;
  int64_t key_end = w.seq.len_k;
  if (group_first >= w.seq.len_q)
    key_end = 0;
  else if (v.causal && !v.shared)
    key_end = group_first + 64 + v.diag_shift;
  v.key_end =
      static_cast<int32_t>(key_end < 0 ? 0 : (key_end < w.seq.len_k ? key_end : w.seq.len_k));
#pragma unroll
  for (int i = 0; i < Cfg::kD / 2; ++i) cs.o[i] = 0.f;
  cs.row_max[0] = cs.row_max[1] = -INFINITY;
  cs.rescale = false;
  cs.row_sum[0] = cs.row_sum[1] = 0.f;
  if (w.n_blocks == 0) {
    epilogue<Cfg>(cs, s, tm_o, a, w, group, v.row0, true);
    return false;
  }
  v.keys = row_key_ranges<Cfg>(a, w, v.row0);
  return true;
}

// K tile `it` of the item (at ring position `k_stage`) goes back to the producer, and with the
// item's last K tile its Q tile (at `q_stage`); one arrival per warp.
template <typename Cfg>
__device__ __forceinline__ void release_k_tile(typename Cfg::Shared& s, int k_stage, int q_stage,
                                               int it, int n_blocks, bool leader) {
  if (!leader) return;
  s.k_empty[k_stage].arrive();
  if (it == n_blocks - 1) s.q_empty[q_stage].arrive();
}

// O += P V on the V tile at ring position `st` once it has arrived, waited for; then the tile goes
// back to the producer and `st` moves on.
template <typename Cfg>
__device__ __forceinline__ void pv_and_release(typename Cfg::Shared& s, ConsumerState<Cfg>& cs,
                                               const uint32_t (&p)[Cfg::kBlockN / 16][4],
                                               tlx::PipelineState<Cfg::kStages>& st, bool leader) {
  s.v_full[st.stage].wait(st.phase);
  tlx::fence_operand(cs.o);
  gemm_pv<Cfg>(cs.o, p, s.v[st.stage]);
  tlx::wgmma_wait<0>();
  tlx::fence_operand(cs.o);
  if (leader) s.v_empty[st.stage].arrive();
  st.advance();
}

// One K tile at a time: S = Q K^T, softmax, O += P V, each waited for before the next step.
template <typename Cfg>
__device__ __forceinline__ void consumer_loop(typename Cfg::Shared& s, const CUtensorMap* tm_o,
                                              const FwdArgs& a, int64_t n_items, int group) {
  constexpr int kN = Cfg::kBlockN;
  const bool leader = (threadIdx.x & 31) == 0;
  tlx::PipelineState<Cfg::kStages> st;
  tlx::PipelineState<Cfg::kQStages> qs;
  ConsumerState<Cfg> cs;
  ItemSource<Cfg, false> items;
  TileWork w;
  while (items.next(s, a, n_items, w)) {
    if (!w.active) continue;
    ItemView v;
    if (!start_item<Cfg>(cs, s, tm_o, a, w, group, v)) continue;
    s.q_full[qs.stage].wait(qs.phase);
    for (int it = 0; it < w.n_blocks; ++it) {
      const int32_t key0 = (w.n_blocks - 1 - it) * kN;
      float s_acc[kN / 2];
      s.k_full[st.stage].wait(st.phase);
      gemm_qk<Cfg>(s_acc, s.q[qs.stage], s.k[st.stage], group);
      tlx::wgmma_wait<0>();
      tlx::fence_operand(s_acc);
      release_k_tile<Cfg>(s, st.stage, qs.stage, it, w.n_blocks, leader);
      float alpha[2];
      tile_scores<Cfg>(s_acc, cs, v, key0, w.seq.len_k, a.scale_log2, alpha);
      rescale_o<Cfg>(cs, alpha);
      uint32_t p[kN / 16][4];
      tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
      pv_and_release<Cfg>(s, cs, p, st, leader);
    }
    qs.advance();
    epilogue<Cfg>(cs, s, tm_o, a, w, group, v.row0, false);
  }
}

// Overlapped schedule: S(n) = Q K(n)^T is issued together with O += P(n-1) V(n-1), so the tensor
// cores work on one tile while the softmax of the previous one runs. With `take_turns` the consumer
// groups issue their MMAs in turn (named barriers 1 .. kConsumerGroups, in a ring), so one group's
// softmax runs under the others' MMAs.
template <typename Cfg>
__device__ __forceinline__ void consumer_loop_overlapped(typename Cfg::Shared& s,
                                                         const CUtensorMap* tm_o, const FwdArgs& a,
                                                         int64_t n_items, int group,
                                                         bool take_turns) {
  constexpr int kN = Cfg::kBlockN;
  // Turn barrier g + 1 belongs to group g: it waits there, and the group before it arrives there.
  constexpr uint32_t kTurnThreads = 256;
  const uint32_t my_turn = 1 + group;
  const uint32_t next_turn = 1 + (group + 1) % Cfg::kConsumerGroups;
  const bool leader = (threadIdx.x & 31) == 0;
  tlx::PipelineState<Cfg::kStages> ks, vs;
  tlx::PipelineState<Cfg::kQStages> qs;
  ConsumerState<Cfg> cs;
  auto begin_turn = [&] {
    if (take_turns) tlx::NamedBarrier::sync(my_turn, kTurnThreads);
  };
  auto end_turn = [&] {
    if (take_turns) tlx::NamedBarrier::arrive(next_turn, kTurnThreads);
  };
  if (group == Cfg::kConsumerGroups - 1 && take_turns)
    tlx::NamedBarrier::arrive(1, kTurnThreads);  // group 0 goes first
  ItemSource<Cfg, false> items;
  TileWork w;
  while (items.next(s, a, n_items, w)) {
    if (!w.active) continue;
    ItemView v;
    if (!start_item<Cfg>(cs, s, tm_o, a, w, group, v)) continue;
    s.q_full[qs.stage].wait(qs.phase);

    // Leading K tiles (the last ones of the sequence) that no row of this group sees: the far side
    // of the diagonal in a 192-row tile, or every tile for a group past the item's last row. They
    // are released untouched once they have arrived (so that each arrival counts for its own use of
    // the slot), and the group still takes its turns so that the ring stays in step.
    int first_it = 0;
    while (Cfg::kSkipUnseenKTiles && first_it < w.n_blocks &&
           (w.n_blocks - 1 - first_it) * kN >= v.key_end) {
      s.k_full[ks.stage].wait(ks.phase);
      begin_turn();
      end_turn();
      release_k_tile<Cfg>(s, ks.stage, qs.stage, first_it, w.n_blocks, leader);
      ks.advance();
      s.v_full[vs.stage].wait(vs.phase);
      if (leader) s.v_empty[vs.stage].arrive();
      vs.advance();
      ++first_it;
    }
    if (Cfg::kSkipUnseenKTiles && first_it == w.n_blocks) {
      qs.advance();
      epilogue<Cfg>(cs, s, tm_o, a, w, group, v.row0, false);  // no key: zeros, LSE -inf
      continue;
    }

    uint32_t p[kN / 16][4];
    // S(it) is ready: release its K tile, mask where needed, online softmax (alpha rescales O
    // before the next P V is added).
    float alpha[2];
    // may_mask: false where no tile of the range needs the mask (no check either).
    auto scores = [&](float(&s_acc)[kN / 2], int it, bool may_mask) {
      release_k_tile<Cfg>(s, ks.stage, qs.stage, it, w.n_blocks, leader);
      ks.advance();
      const int32_t key0 = (w.n_blocks - 1 - it) * kN;
      if (may_mask)
        tile_scores<Cfg>(s_acc, cs, v, key0, w.seq.len_k, a.scale_log2, alpha);
      else
        softmax_scores<Cfg>(s_acc, cs, a.scale_log2, alpha);
    };
    // First tile this group sees (the diagonal or last one): S only.
    {
      float s_acc[kN / 2];
      s.k_full[ks.stage].wait(ks.phase);
      begin_turn();
      gemm_qk<Cfg>(s_acc, s.q[qs.stage], s.k[ks.stage], group);
      end_turn();
      tlx::wgmma_wait<0>();
      tlx::fence_operand(s_acc);
      scores(s_acc, first_it, true);
      tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
    }
    // Steady state: S(it) and P(it-1) V(it-1) in flight together; the softmax of S(it) runs under
    // the P V MMA.
    // Tiles are visited from the last key to the first, so the ones that need the mask (past the
    // end of the keys, across the diagonal) come first; the loop is unrolled into a copy for them
    // and a copy for the rest, which runs without the check.
    int unmasked_from = first_it + 1;
    while (unmasked_from < w.n_blocks &&
           v.needs_mask((w.n_blocks - 1 - unmasked_from) * kN, kN, w.seq.len_k))
      ++unmasked_from;
    int it = first_it + 1;
#pragma unroll
    for (int may_mask = 1; may_mask >= 0; --may_mask) {
      for (const int end = may_mask ? unmasked_from : w.n_blocks; it < end; ++it) {
        float s_acc[kN / 2];
        s.k_full[ks.stage].wait(ks.phase);
        begin_turn();
        gemm_qk<Cfg>(s_acc, s.q[qs.stage], s.k[ks.stage], group);
        rescale_o<Cfg>(cs, alpha);
        s.v_full[vs.stage].wait(vs.phase);
        gemm_pv<Cfg>(cs.o, p, s.v[vs.stage]);
        end_turn();
        tlx::wgmma_wait<1>();
        tlx::fence_operand(s_acc);
        scores(s_acc, it, may_mask != 0);
        tlx::wgmma_wait_after<0>(cs.row_sum[0] + cs.row_sum[1]);  // the softmax runs under P V
        tlx::fence_operand(cs.o);
        tlx::fence_operand(p);
        if (leader) s.v_empty[vs.stage].arrive();
        vs.advance();
        tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
      }
    }
    // The last P V.
    rescale_o<Cfg>(cs, alpha);
    pv_and_release<Cfg>(s, cs, p, vs, leader);
    qs.advance();
    epilogue<Cfg>(cs, s, tm_o, a, w, group, v.row0, false);
  }
  if (group == 0 && take_turns)
    tlx::NamedBarrier::sync(1, kTurnThreads);  // the last group's last hand-over
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
               const FwdArgs args) {
  extern __shared__ unsigned char smem_raw[];
  const uintptr_t aligned =
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023);
  auto& s = *reinterpret_cast<typename Cfg::Shared*>(aligned);
  const int group = tlx::warp_group_index();

  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < Cfg::kQStages; ++i) {
      s.q_full[i].init(1);
      s.q_empty[i].init(Cfg::kConsumerWarps);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kItemSlots; ++i) {
      s.item_full[i].init(1);
      s.item_empty[i].init(Cfg::kConsumerWarps * 32);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kStages; ++i) {
      s.k_full[i].init(1);
      s.v_full[i].init(1);
      s.k_empty[i].init(Cfg::kConsumerWarps);
      s.v_empty[i].init(Cfg::kConsumerWarps);
    }
    tlx::fence_barrier_init();
    tlx::tma_prefetch_descriptor(&tm_q);
    tlx::tma_prefetch_descriptor(&tm_k);
    tlx::tma_prefetch_descriptor(&tm_v);
    tlx::tma_prefetch_descriptor(&tm_o);
  }
  // Launched as a programmatic dependent of the work-list kernel, the CTA gets here while the list
  // is being built; nothing before this point reads it.
  tlx::wait_for_prior_grid();
  __syncthreads();

  const int64_t n_items =
      static_cast<int64_t>(min(*args.work_count, args.work_capacity)) * args.heads_q;

  if (group == 0) {
    tlx::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) producer_loop<Cfg>(s, &tm_q, &tm_k, &tm_v, args, n_items);
  } else {
    tlx::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    if (args.schedule == 0)
      consumer_loop<Cfg>(s, &tm_o, args, n_items, group - 1);
    else
      consumer_loop_overlapped<Cfg>(s, &tm_o, args, n_items, group - 1, args.schedule == 1);
    // The group's last stores must have read shared memory before the CTA ends.
    if (threadIdx.x % 128 == 0) tlx::tma_store_wait<0>();
  }
}

}  // namespace jfa::sm90
