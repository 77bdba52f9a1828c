// Hopper backward kernel of jagged attention. A work item is one K tile (128 keys) of one kv head
// of one sequence, or the keys of several short sequences together (a shared tile, at most 128
// keys and 128 query rows; bwd_work_list.cuh); a persistent grid claims items from a global
// counter. The item's K and V stay in shared memory while it walks the query rows (64 per step at
// head_dim 128, 128 at 64) of each query head of its group that see any of its keys; dK and dV
// accumulate in registers over the whole walk, so they need no atomics and are summed over the
// group's query heads in a fixed order; at the item's end they go out by TMA stores
// (store_key_rows).
//
// Roles (128 threads per warp group, one CTA per SM):
//   warp group 0   producer: one thread loads K and V per item and, per step, Q and dO with their
//                  rows of LSE and D (TMA) into a ring guarded by mbarriers.
//   warp groups 1, 2  consumers, keys 64 g .. 64 g + 63 of the tile each, per step:
//                  S^T = K Q^T and dP^T = V dO^T (SS wgmma), P^T = exp2(S^T scale log2e - LSE2),
//                  dS^T = P^T (dP^T - D); dV += P^T dO and dK += dS^T Q (RS wgmma, dO and Q read
//                  as MN-major B); dS^T to shared memory, dQ = dS K (SS wgmma, both operands
//                  MN-major; each group one 64 x 64 part: half the columns at head_dim 128, one
//                  q tile's rows at 64), staged in shared memory for the dQ writer.
//   warp 1 of group 0  dQ writer: adds each group's staged dQ with one bulk reduction per step (in
//                  deterministic mode in a fixed order of the K tiles, one semaphore per q tile;
//                  a shared tile's rows get dQ from that item alone and need no order).
// A step's rows of LSE and D are those of its query tokens; the rows past the sequence's end (the
// next sequence's, or past total_q), keys past its end and, under the causal mask, keys a query
// does not see are set to P = 0 on the steps that hold any (StepMask); in a shared tile each row
// sees its own sequence's keys (the masks set P and dS to 0 after the MMAs: a NaN or infinite
// input element of one sequence can reach the gradients of the other sequences of its shared tile,
// and of the sequence before it, whose last q tile loads its first rows). Offsets are not validated
// on the device; they are clamped so that no access leaves the caller's buffers (results for
// invalid offsets are unspecified).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/ragged_rows_store.cuh"
#include "cuda/sm90/shared_tile_keys.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/fragment.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "cuda/tlx/wgmma.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// The items of one CTA: the producer claims each from the global counter and hands it to the
// consumers through a ring in shared memory; an invalid item ends the walk.
template <typename Cfg, bool kProducer>
struct BwdItemScheduler {
  tlx::PipelineState<kItemSlots> slot;

  __device__ __forceinline__ bool next(typename Cfg::Shared& s, const BwdArgs& a, int64_t n_items,
                                       BwdItem& w) {
    if constexpr (kProducer) {
      const int64_t claimed = static_cast<int64_t>(atomicAdd(a.next_item, 1ull));
      w = claimed < n_items ? decode_bwd_item<Cfg::kBlockM>(a, claimed) : BwdItem{};
      s.item_empty[slot.stage].wait_suspended(slot.phase ^ 1u);
      s.item[slot.stage] = w;
      s.item_full[slot.stage].arrive();
    } else {
      s.item_full[slot.stage].wait(slot.phase);
      w = warp_uniform(s.item[slot.stage]);
      s.item_empty[slot.stage].arrive();  // every thread releases its own reads
    }
    slot.advance();
    return w.valid != 0;
  }
};

// Where a step's LSE and D rows come from (bwd_workspace.hpp): the first column, on a 16-byte
// boundary as TMA needs, the first row of the array (0, or the shifted copy's when the step's
// first token is odd), and where in the loaded stage the step's first token lies (0 or 2 floats:
// the consumers read pairs on 8 bytes).
struct RowTermsAt {
  int32_t col, row, first;
};

__device__ __forceinline__ RowTermsAt row_terms_at(int32_t first_token, int32_t heads_q) {
  const int32_t odd = first_token & 1, col = first_token + odd;
  return RowTermsAt{col & ~3, odd * kShiftedRowTerms * heads_q, col & 3};
}

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
    if (w.q_tiles() <= 0) continue;
    s.kv_empty.wait_suspended(kv_phase ^ 1u);
    s.kv_full.arrive_expect_tx(2 * Cfg::KVTile::kBytes);
    const int32_t key_row = w.seq.k_start + w.n_block * kBwdBlockN;
#pragma unroll
    for (int bx = 0; bx < Cfg::KVTile::kBoxes; ++bx) {
      const int col = bx * Cfg::KVTile::kBoxCols;
      tlx::tma_load_3d(tm_k, &s.kv_full, s.k.box(bx), col, w.kv_head, key_row);
      tlx::tma_load_3d(tm_v, &s.kv_full, s.v.box(bx), col, w.kv_head, key_row);
    }
    kv_phase ^= 1u;
    for (int32_t g = 0; g < a.group; ++g) {
      const int32_t head = w.kv_head * a.group + g;
      for (int32_t i = 0; i < w.q_tiles(); ++i) {
        const int32_t m = walk_q_tile(a, w, i);
        s.empty[st.stage].wait_suspended(st.phase ^ 1u);
        tlx::MBarrier* full = &s.full[st.stage];
        full->arrive_expect_tx(2 * Cfg::QTile::kBytes + 2 * kRowBytes);
        const int32_t q_row = w.seq.q_start + m * Cfg::kBlockM;
#pragma unroll
        for (int bx = 0; bx < Cfg::QTile::kBoxes; ++bx) {
          const int col = bx * Cfg::QTile::kBoxCols;
          tlx::tma_load_3d(tm_q, full, s.q[st.stage].box(bx), col, head, q_row);
          tlx::tma_load_3d(tm_do, full, s.dout[st.stage].box(bx), col, head, q_row);
        }
        const RowTermsAt at = row_terms_at(q_row, a.heads_q);
        tlx::tma_load_2d(tm_rows, full, s.lse2[st.stage], at.col, at.row + head);
        tlx::tma_load_2d(tm_rows, full, s.dpsum[st.stage], at.col, at.row + a.heads_q + head);
        st.advance();
      }
    }
  }
}

// A group's 64 keys x the step's queries (S^T, dP^T), and a dQ part (64 rows x 64 columns).
template <typename Cfg>
using ScoreTile = tlx::AccumFragment<Cfg::kBlockM>;
using DqTile = tlx::AccumFragment<kDqPartCols>;

// out = rows x cols^T for this group's 64 keys: S^T = K Q^T or dP^T = V dO^T (SS wgmma, both
// operands K-major over head_dim).
template <typename Cfg>
__device__ __forceinline__ void gemm_keys_by_rows(ScoreTile<Cfg>& out,
                                                  const typename Cfg::KVTile& keys,
                                                  const typename Cfg::QTile& rows, int group) {
  using T = typename Cfg::Element;
  using KVTile = typename Cfg::KVTile;
  using QTile = typename Cfg::QTile;
  const uint64_t a_desc =
      tlx::k_major_desc<KVTile>(keys.box_addr(0) + KVTile::row_bytes(group * 64));
  const uint64_t b_desc = tlx::k_major_desc<QTile>(rows.box_addr(0));
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kD / 16; ++kk)
    tlx::wgmma_ss<T, Cfg::kBlockM, 0>(out.reg, tlx::desc_advance(a_desc, KVTile::k_step_bytes(kk)),
                                      tlx::desc_advance(b_desc, QTile::k_step_bytes(kk)),
                                      kk > 0 ? 1u : 0u);
  tlx::wgmma_commit();
}

// acc += a * rows: dV += P^T dO or dK += dS^T Q (RS wgmma, the q tile read as an MN-major B).
template <typename Cfg>
__device__ __forceinline__ void gemm_accumulate(
    tlx::AccumFragment<Cfg::kD>& acc, const tlx::AFragment<typename Cfg::Element, Cfg::kBlockM>& a,
    const typename Cfg::QTile& rows) {
  using T = typename Cfg::Element;
  using QTile = typename Cfg::QTile;
  const uint64_t desc = tlx::mn_major_desc<QTile>(rows.box_addr(0));
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
    tlx::wgmma_rs<T, Cfg::kD, 1>(acc.reg, a.reg[kk],
                                 tlx::desc_advance(desc, QTile::row_bytes(16 * kk)), 1u);
  tlx::wgmma_commit();
}

// This group's part of dQ (see DqSplit) = dS K: dS read from its transposed tile (M-major A; with
// kRows the group's q tile is the tile's column box `group`, with kKeys its keys are the group's
// rows), K as an MN-major B (with kColumns its column box `group`).
template <typename Cfg>
__device__ __forceinline__ void gemm_dq(DqTile& dq, const typename Cfg::DsTile& ds,
                                        const typename Cfg::KVTile& k, int group) {
  using T = typename Cfg::Element;
  using DsTile = typename Cfg::DsTile;
  using KVTile = typename Cfg::KVTile;
  static_assert(DsTile::kSwizzleRowBytes == KVTile::kSwizzleRowBytes, "one row pitch for both");
  const int key_rows = Cfg::kDqSplit == DqSplit::kKeys ? KVTile::row_bytes(group * 64) : 0;
  const uint32_t a_addr = ds.box_addr(Cfg::kDqSplit == DqSplit::kRows ? group : 0) + key_rows;
  const uint32_t b_addr = k.box_addr(Cfg::kDqSplit == DqSplit::kColumns ? group : 0) + key_rows;
  const uint64_t a_desc = tlx::mn_major_desc<DsTile>(a_addr);
  const uint64_t b_desc = tlx::mn_major_desc<KVTile>(b_addr);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kDqKeys / 16; ++kk)
    tlx::wgmma_ss<T, kDqPartCols, 1, 1>(
        dq.reg, tlx::desc_advance(a_desc, DsTile::row_bytes(16 * kk)),
        tlx::desc_advance(b_desc, KVTile::row_bytes(16 * kk)), kk > 0 ? 1u : 0u);
  tlx::wgmma_commit();
}

__device__ __forceinline__ int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Hands this group's dQ part of a step (rows m of `head`) to the dQ writer: waits until the writer
// has read the group's previous one, stores it in the accumulator's layout and says where it goes.
// Its q tile, rows and rank come from dq_add_of_step: with kRows a group's q tile may lie past the
// sequence's end or (causal) before the first row that sees the item's keys; then it adds nothing
// (no bytes), and in deterministic mode it does not count on the q tile's semaphore.
template <typename Cfg>
__device__ __forceinline__ void stage_dq(typename Cfg::Shared& s, const DqTile& dq,
                                         const BwdArgs& a, const BwdItem& w, int32_t head,
                                         int32_t m, int group, uint32_t& dq_phase) {
  s.dq_empty[group].wait(dq_phase ^ 1u);
  // Row r and the column pair (c, c + 1) of the fragment: chunk c / 4 of the row, permuted by the
  // token's index (dq_chunk_offset); the thread's two rows are 8 apart, so they share it.
  const int r0 = DqTile::row(0);
  const int perm = ((w.seq.q_start + r0) & 3) << 1;  // q_start + 64 (q tile) + r0 = the token
  const uint32_t base = tlx::smem_addr(&s.dq[group][r0 * kDqPartCols]);
  const int pair = DqTile::col(0, 0);  // 2 (t % 4): chunk (t % 4) / 2, offset 2 (t % 2)
#pragma unroll
  for (int j = 0; j < DqTile::kBlocks; ++j) {
    const int chunk = ((2 * j + (pair >> 2)) ^ perm);
    const uint32_t at = base + ((chunk << 2) + (pair & 3)) * sizeof(float);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      tlx::st_shared_f32x2(at + 8 * h * kDqPartCols * sizeof(float), dq.at(j, h, 0),
                           dq.at(j, h, 1));
  }
  if (threadIdx.x % 128 == 0) {
    const DqAdd add = dq_add_of_step<Cfg::kBlockM>(a, w, m, group);
    const int64_t tile = static_cast<int64_t>(head) * a.sem_tiles + w.sem_tile + add.q_tile;
    const int part = Cfg::kDqSplit == DqSplit::kColumns ? group : 0;
    const int32_t first = w.seq.q_start + add.q_tile * kBwdTileRows;
    s.dq_dest[group] = DqDestination{a.dq_acc + dq_part_base(a.total_q, Cfg::kD, head, part) +
                                         static_cast<int64_t>(first) * kDqPartCols,
                                     w.n_seqs > 1 ? nullptr : a.sems + tile,
                                     add.rank,
                                     static_cast<uint32_t>(add.rows * kDqPartCols * sizeof(float)),
                                     head,
                                     first};
  }
  tlx::fence_proxy_async_smem();  // the writer's bulk reduction reads it (async proxy)
  // The writer threads that convert a shared tile's part read what each thread staged, so then
  // every thread arrives; otherwise only the bulk reduction reads it, and a warp's leader arrives
  // for the warp.
  if (w.n_seqs > 1) {
    s.dq_full[group].arrive();
  } else {
    __syncwarp();
    if (tlx::lane_is_leader()) s.dq_full[group].arrive(32);
  }
  dq_phase ^= 1u;
}

// Lane 0's destination, in every lane of the warp.
__device__ __forceinline__ DqDestination warp_broadcast(const DqDestination& d) {
  auto lane0 = [](auto x) { return __shfl_sync(0xffffffffu, x, 0); };
  return DqDestination{reinterpret_cast<float*>(lane0(reinterpret_cast<uintptr_t>(d.part))),
                       reinterpret_cast<int32_t*>(lane0(reinterpret_cast<uintptr_t>(d.sem))),
                       lane0(d.target),
                       lane0(d.bytes),
                       lane0(d.head),
                       lane0(d.first)};
}

// Converts a shared tile's staged dQ part into dq: softmax_scale times the part's rows (with kKeys,
// times the sum of both groups' parts, which cover the same rows over different keys), rounded to
// T, at columns col0 .. col0 + 63 of the destination's head. The writer threads take the part's
// 16-byte chunks in row order (16 per row), so that a row's stores go together. Returns whether an
// element was NaN or infinite.
template <typename Cfg>
__device__ __forceinline__ bool store_staged_dq(const float* staged, const float* other,
                                                const DqDestination& d, int col0, const BwdArgs& a,
                                                int writer) {
  using T = typename Cfg::Element;
  constexpr int kChunks = kDqPartCols / 4;
  const int n = static_cast<int>(d.bytes / (4 * sizeof(float)));  // rows x kChunks
  T* dq = static_cast<T*>(a.dq) + d.head * a.dq_head_stride + col0;
  const uint32_t base = tlx::smem_addr(staged);
  const uint32_t other_base = other != nullptr ? tlx::smem_addr(other) : 0;
  bool not_finite = false;
  for (int i = writer; i < n; i += Cfg::kDqWriterThreads) {
    const int r = i / kChunks, c = 4 * (i % kChunks);
    const int64_t token = d.first + r;
    const uint32_t at = (r * kDqPartCols + dq_chunk_offset(token, c)) * sizeof(float);
    float4 x = tlx::ld_shared_f32x4(base + at);
    if (other != nullptr) {
      const float4 y = tlx::ld_shared_f32x4(other_base + at);
      x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    const float k = a.softmax_scale;
    const uint2 packed =
        make_uint2(tlx::pack2<T>(x.x * k, x.y * k), tlx::pack2<T>(x.z * k, x.w * k));
    *reinterpret_cast<uint2*>(dq + token * a.dq_token_stride + c) = packed;
    not_finite |= tlx::pair_not_finite<T>(packed.x) || tlx::pair_not_finite<T>(packed.y);
  }
  return not_finite;
}

// The dQ writer (warps 1 to 3 of the producer group). Per step, its first thread adds each group's
// staged 64 x 64 part to the accumulator in L2 with one bulk reduction; a group's staging area is
// free again once its reduction has read it. In deterministic mode the adds to one q tile go in a
// fixed order of the K tiles (dq_add_rank): the q tile's semaphore counts the K tiles added, and
// each K tile waits for the ones before it. The groups' parts belong to one q tile (one
// semaphore; with kKeys both add to the same part, group 0's add completes first) or, with kRows,
// to two (two semaphores; a part without bytes adds nothing and does not count). A shared tile's
// parts (no semaphore) are the only dQ of their rows: all writer threads convert them straight
// into dq, and the accumulator's copy of those rows is neither cleared nor converted.
template <typename Cfg>
__device__ __forceinline__ void bwd_dq_writer(typename Cfg::Shared& s, const BwdArgs& a) {
  constexpr bool kRows = Cfg::kDqSplit == DqSplit::kRows;
  constexpr bool kKeys = Cfg::kDqSplit == DqSplit::kKeys;
  const int writer = static_cast<int>(threadIdx.x) - Cfg::kDqWriterFirstThread;
  const bool leader = writer == 0;
  const int lane = writer & 31;
  bool not_finite = false;
  uint32_t phase = 0;
  for (;;) {
    s.dq_full[0].wait_suspended(phase);
    s.dq_full[1].wait_suspended(phase);
    phase ^= 1u;
    // Lane 0 of each warp reads the destinations for its warp. In a step that only the bulk
    // reductions serve, a warp's lane 0 arrives on dq_empty for the warp (which lets the groups
    // write the next ones), so no other lane may read what they rewrite; in a shared tile's step
    // every thread reads staged dQ and arrives for itself.
    DqDestination d0{}, d1{};
    if (lane == 0) {
      d0 = s.dq_dest[0];
      d1 = s.dq_dest[1];
    }
    if (__shfl_sync(0xffffffffu, d0.part == nullptr ? 1 : 0, 0)) break;  // both groups stop
    if (__shfl_sync(0xffffffffu, d0.sem == nullptr ? 1 : 0, 0)) {        // a shared tile's step
      d0 = warp_broadcast(d0);
      d1 = warp_broadcast(d1);
      if (d0.bytes > 0)
        not_finite |= store_staged_dq<Cfg>(s.dq[0], kKeys ? s.dq[1] : nullptr, d0, 0, a, writer);
      if (!kKeys && d1.bytes > 0)
        not_finite |=
            store_staged_dq<Cfg>(s.dq[1], nullptr, d1, kRows ? 0 : kDqPartCols, a, writer);
      s.dq_empty[0].arrive();
      s.dq_empty[1].arrive();
      continue;
    }
    const bool adds0 = d0.bytes > 0, adds1 = d1.bytes > 0;  // lane 0's
    if (leader) {
      if (adds0) {
        if (a.deterministic)
          while (load_acquire(d0.sem) < d0.target) __nanosleep(64);
        tlx::bulk_reduce_add_f32(d0.part, s.dq[0], d0.bytes);
      }
      if (kKeys && a.deterministic) {
        tlx::tma_store_commit();
        tlx::tma_store_wait<0>();
      }
      if (adds1) {
        if (kRows && a.deterministic)
          while (load_acquire(d1.sem) < d1.target) __nanosleep(64);
        tlx::bulk_reduce_add_f32(d1.part, s.dq[1], d1.bytes);
      }
      tlx::tma_store_commit();
      tlx::tma_store_wait_read<0>();
    }
    if (lane == 0) {
      s.dq_empty[0].arrive(32);
      s.dq_empty[1].arrive(32);
    }
    if (leader && a.deterministic) {
      tlx::tma_store_wait<0>();
      tlx::fence_proxy_async();
      __threadfence();
      if (adds0) atomicAdd(d0.sem, 1);
      if (kRows && adds1) atomicAdd(d1.sem, 1);
    }
  }
  if (leader) tlx::tma_store_wait<0>();
  if (not_finite && a.device_check != nullptr)
    atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

// The scores of a step, S^T = K Q^T for this group's keys, issued once the stage's Q, dO, LSE and
// D have arrived (dP^T follows in step_gradients: issued here too, it would hold its registers
// while the previous step's dQ is in flight).
template <typename Cfg>
__device__ __forceinline__ void issue_scores(typename Cfg::Shared& s, ScoreTile<Cfg>& sc,
                                             const tlx::PipelineState<Cfg::kStages>& st,
                                             int group) {
  s.full[st.stage].wait(st.phase);
  gemm_keys_by_rows<Cfg>(sc, s.k, s.q[st.stage], group);
}

// Which pairs of a step may see each other, beyond P = exp2(S^T scale log2e - LSE2).
enum class StepMask {
  kNone,        // every key of the group sees every query row of the step
  kSequence,    // one sequence: keys past its end, query rows past its end (whose terms are the
                // next sequence's) and (causal) keys past a query's diagonal get P = 0
  kSharedTile,  // several short sequences: each query row sees its key range (a KeyRange per row
                // of the item in shared memory), which is empty past the item's rows
};

// P^T = exp2(S^T scale log2e - LSE2) in place, each column with its query row's LSE, masked as
// kMask says; the thread's keys start at key0 and the step's query rows at q0 (in the item).
template <StepMask kMask, typename Tile>
__device__ __forceinline__ void probabilities(Tile& sc, uint32_t lse2, float scale_log2,
                                              int32_t key0, int32_t q0, int32_t len_k,
                                              int32_t len_q, int32_t diag, bool causal,
                                              uint32_t key_ranges) {
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
        float p = fast_exp2(fmaf(sc.at(j, h, c), scale_log2, -(c == 0 ? l.x : l.y)));
        const int32_t key = key0 + Tile::row(h), query = q0 + Tile::col(j, c);
        if constexpr (kMask == StepMask::kSequence) {
          if (key >= len_k || query >= len_q || (causal && key > query + diag)) p = 0.f;
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
                                               tlx::AccumFragment<Cfg::kD>& dv, DqTile& dq,
                                               StepOperands<Cfg>& ops, const BwdArgs& a,
                                               const BwdItem& w, int32_t m, int group,
                                               const tlx::PipelineState<Cfg::kStages>& st,
                                               int ds_buf) {
  using T = typename Cfg::Element;
  using Tile = ScoreTile<Cfg>;
  // Which keys the step's queries see: all, unless the tile holds keys past the sequence's end,
  // rows past it or (causal) keys past the diagonal of its first query row; a shared tile always
  // masks.
  const int32_t key0 = w.n_block * kBwdBlockN + group * 64;  // of this group, in the sequence
  const int32_t q0 = m * Cfg::kBlockM;
  const int32_t diag = w.seq.causal_shift();
  const bool masked = key0 + 64 > w.seq.len_k || q0 + Cfg::kBlockM > w.seq.len_q ||
                      (a.causal && q0 + diag < key0 + 63);
  // The thread's first column of the step's LSE and D rows; column block j is 8 j further.
  const int32_t first = row_terms_at(w.seq.q_start + q0, a.heads_q).first;
  const uint32_t lse2 = tlx::smem_addr(s.lse2[st.stage] + first + Tile::col(0, 0));
  const uint32_t dpsum = tlx::smem_addr(s.dpsum[st.stage] + first + Tile::col(0, 0));
  gemm_keys_by_rows<Cfg>(dp, s.v, s.dout[st.stage], group);

  // P^T (S^T done, dP^T may still run), packed at once as the A operand of dV += P^T dO.
  tlx::wgmma_wait<1>();
  tlx::fence_operand(sc.reg);
  const uint32_t key_ranges = tlx::smem_addr(&s.key_rows[group]);  // shared_tile_key_ranges
  if (w.n_seqs > 1)
    probabilities<StepMask::kSharedTile>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q,
                                         diag, a.causal != 0, key_ranges);
  else if (masked)
    probabilities<StepMask::kSequence>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q,
                                       diag, a.causal != 0, key_ranges);
  else
    probabilities<StepMask::kNone>(sc, lse2, a.scale_log2, key0, q0, w.seq.len_k, w.seq.len_q, diag,
                                   a.causal != 0, key_ranges);
  sc.to_a(ops.p);
  gemm_accumulate<Cfg>(dv, ops.p, s.dout[st.stage]);

  // dS^T = P^T (dP^T - D), packed, then dK += dS^T Q. P^T comes from its packed form, which the
  // dV MMA holds anyway (a float32 copy would need as many registers again); to_a's order:
  // register reg[j / 2][2 (j % 2) + h] holds column block j, row half h. In bf16 the difference is
  // rounded to bf16 too and multiplied in pairs (three roundings where the float32 product has two,
  // 13–15% more rounding error in dQ and dK, for ~48 fewer instructions per step); in fp16 the
  // difference can exceed fp16's range where dS does not, so the product is formed in float32.
  tlx::wgmma_wait<1>();
  tlx::fence_operand(dp.reg);
#pragma unroll
  for (int j = 0; j < Tile::kBlocks; ++j) {
    const float2 d = tlx::ld_shared_f32x2(dpsum + 32 * j);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pj = ops.p.reg[j / 2][2 * (j % 2) + h];
      if constexpr (Cfg::kPackedDs) {
        ops.ds.reg[j / 2][2 * (j % 2) + h] =
            tlx::mul2<T>(pj, tlx::pack2<T>(dp.at(j, h, 0) - d.x, dp.at(j, h, 1) - d.y));
      } else {
        const float2 p = tlx::unpack2<T>(pj);
        dp.at(j, h, 0) = p.x * (dp.at(j, h, 0) - d.x);
        dp.at(j, h, 1) = p.y * (dp.at(j, h, 1) - d.y);
      }
    }
  }
  if constexpr (!Cfg::kPackedDs) dp.to_a(ops.ds);

  // dS^T into shared memory for dQ, from its packed form (register ds.reg[kk][i] holds the pair
  // of column block 2 kk + i / 2, row half i % 2); the other group's dQ of two steps ago has read
  // this buffer (it waited for its MMAs before the last barrier).
  typename Cfg::DsTile& ds = s.ds[ds_buf];
  const uint32_t ds_addr = tlx::smem_addr(&ds);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      tlx::st_shared_u32(ds_addr + Cfg::DsTile::offset_bytes(group * 64 + Tile::row(i % 2),
                                                             Tile::col(2 * kk + i / 2, 0)),
                         ops.ds.reg[kk][i]);
  tlx::fence_proxy_async_smem();
  if constexpr (Cfg::kDqSplit == DqSplit::kKeys)
    tlx::NamedBarrier::sync(Cfg::kDsBarrier0 + group, 128);
  else
    tlx::NamedBarrier::sync(Cfg::kDsBarrier0, 256);
  // dQ before dK, so that dQ is staged for the writer while dK's MMA runs.
  gemm_dq<Cfg>(dq, ds, s.k, group);
  gemm_accumulate<Cfg>(dk, ops.ds, s.q[st.stage]);
}

// Walks an item's steps (the q tiles of each query head of its group, in walk_q_tile's order) for
// one consumer group; each step's dQ goes to the dQ writer. No MMA is in flight across the loop's
// back edge: an accumulator carried in flight from one iteration to the next makes the compiler
// serialize every MMA of the kernel.
template <typename Cfg>
__device__ __forceinline__ void walk_item(typename Cfg::Shared& s, tlx::AccumFragment<Cfg::kD>& dk,
                                          tlx::AccumFragment<Cfg::kD>& dv, const BwdArgs& a,
                                          const BwdItem& w, int group,
                                          tlx::PipelineState<Cfg::kStages>& st, int& ds_buf,
                                          uint32_t& dq_phase) {
  const int32_t steps = a.group * w.q_tiles();
  int32_t head = w.kv_head * a.group, i_head = 0, m = walk_q_tile(a, w, 0);
  for (int32_t i = 0; i < steps; ++i) {
    ScoreTile<Cfg> sc, dp;
    DqTile dq;
    issue_scores<Cfg>(s, sc, st, group);
    StepOperands<Cfg> ops;
    step_gradients<Cfg>(s, sc, dp, dk, dv, dq, ops, a, w, m, group, st, ds_buf);
    tlx::wgmma_wait<1>();  // dV and dQ done, dK still running
    tlx::fence_operand(dv.reg);
    tlx::fence_operand(dq.reg);
    tlx::fence_operand(ops.p.reg);
    stage_dq<Cfg>(s, dq, a, w, head, m, group, dq_phase);
    tlx::wgmma_wait<0>();
    tlx::fence_operand(dk.reg);
    tlx::fence_operand(ops.ds.reg);
    // The stage has been read (by the MMAs, waited for above, and by every lane for LSE and D,
    // whose values are in registers and used): back to the producer. No proxy fence: a read that
    // has returned its value cannot see the producer's next TMA write, and the fence (with the
    // MEMBAR it brings) stood between every step's last MMA and the next step's first.
    __syncwarp();
    if (tlx::lane_is_leader()) s.empty[st.stage].arrive();
    st.advance();
    ds_buf ^= 1;
    if (++i_head == w.q_tiles()) {
      i_head = 0;
      ++head;
    }
    m = walk_q_tile(a, w, i_head);
  }
}

// dK (times `scale`) or dV rows of this group's keys, staged in the group's tile and stored through
// the ragged map `tm` (ragged_rows_store.cuh). dK's staging waits until dV's store has read the
// tile: 16 KB at head_dim 128, in place of the 64 scattered 4-byte global stores per thread and
// gradient that it replaces.
template <typename Cfg>
__device__ __forceinline__ void store_key_rows(const tlx::AccumFragment<Cfg::kD>& acc, float scale,
                                               typename Cfg::KeyRowsTile& tile,
                                               const CUtensorMap* tm, const BwdArgs& a,
                                               const BwdItem& w, int group) {
  using T = typename Cfg::Element;
  using Frag = tlx::AccumFragment<Cfg::kD>;
  const int32_t key0 = w.n_block * kBwdBlockN + group * 64;
  if (key0 < 0 || key0 >= w.seq.len_k) return;  // warp-group uniform: no key of the group
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
      tlx::st_shared_u32(tile_addr + Cfg::KeyRowsTile::offset_bytes(Frag::row(h), Frag::col(j, 0)),
                         pair);
    }
  }
  if (not_finite) atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
  const int64_t first = static_cast<int64_t>(w.seq.k_start) + key0;
  out.store(tile, tm, w.kv_head, a.key_ragged_rows, first,
            static_cast<int64_t>(w.seq.k_start) + w.seq.len_k);
}

// A shared tile's key range for each of its rows (KeyRange as lo | hi << 16: the item has at most
// kBwdPackRows rows and kBwdBlockN keys), one row per thread, in the group's dK/dV staging tile,
// which is idle during the walk: acquired as store_key_rows acquires it (the previous item's
// stores have read it, and every warp of the group is done with the previous walk), and the
// item's stores acquire it back.
template <typename Cfg>
__device__ __forceinline__ void shared_tile_key_ranges(typename Cfg::Shared& s, const BwdArgs& a,
                                                       const BwdItem& w, int group) {
  static_assert(kBwdPackRows == 128 && kBwdPackRows * 4 <= sizeof(typename Cfg::KeyRowsTile),
                "one row per thread of the group, in the staging tile");
  const RaggedRowsStore tile{Cfg::kKeyRowsBarrier0 + group, threadIdx.x % 128 == 0};
  tile.acquire();
  const int32_t row = threadIdx.x % 128;
  const KeyRange r = shared_tile_row_keys(a.cu_q, a.cu_k, a.total_q, w.seq, w.first_seq, w.n_seqs,
                                          a.causal != 0, row);
  tlx::st_shared_u32(tlx::smem_addr(&s.key_rows[group]) + 4 * row,
                     static_cast<uint32_t>(r.lo) | static_cast<uint32_t>(r.hi) << 16);
  tlx::NamedBarrier::sync(Cfg::kKeyRowsBarrier0 + group, 128);
}

template <typename Cfg>
__device__ __forceinline__ void bwd_consumer(typename Cfg::Shared& s, const CUtensorMap* tm_dk,
                                             const CUtensorMap* tm_dv, const BwdArgs& a,
                                             int64_t n_items, int group) {
  tlx::AccumFragment<Cfg::kD> dk, dv;
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t kv_phase = 0, dq_phase = 0;
  int ds_buf = 0;
  BwdItemScheduler<Cfg, false> items;
  BwdItem w;
  while (items.next(s, a, n_items, w)) {
    dk.fill(0.f);
    dv.fill(0.f);
    if (w.n_seqs > 1 && w.q_tiles() > 0) shared_tile_key_ranges<Cfg>(s, a, w, group);
    if (w.q_tiles() > 0) {
      s.kv_full.wait(kv_phase);
      kv_phase ^= 1u;
      walk_item<Cfg>(s, dk, dv, a, w, group, st, ds_buf, dq_phase);
      if (tlx::lane_is_leader()) s.kv_empty.arrive();
    }
    store_key_rows<Cfg>(dv, 1.f, s.key_rows[group], tm_dv, a, w, group);
    store_key_rows<Cfg>(dk, a.softmax_scale, s.key_rows[group], tm_dk, a, w, group);
  }
  if (threadIdx.x % 128 == 0) tlx::tma_store_wait<0>();  // dK and dV written before the CTA ends
  // No more steps: the dQ writer stops.
  s.dq_empty[group].wait(dq_phase ^ 1u);
  if (threadIdx.x % 128 == 0) s.dq_dest[group] = DqDestination{};
  s.dq_full[group].arrive();
}

template <typename Cfg>
__device__ __forceinline__ void init_bwd_barriers(typename Cfg::Shared& s) {
  s.kv_full.init(1);
  s.kv_empty.init(Cfg::kConsumerWarps);
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    s.dq_full[g].init(Cfg::kConsumerWarps / 2 * 32);  // a count per consumer thread
    s.dq_empty[g].init(Cfg::kDqWriterThreads);        // a count per writer thread
  }
#pragma unroll
  for (int i = 0; i < Cfg::kStages; ++i) {
    s.full[i].init(1);
    s.empty[i].init(Cfg::kConsumerWarps);
  }
#pragma unroll
  for (int i = 0; i < kItemSlots; ++i) {
    s.item_full[i].init(1);
    s.item_empty[i].init(Cfg::kConsumerWarps * 32);
  }
  tlx::fence_barrier_init();
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const __grid_constant__ CUtensorMap tm_rows,
               const __grid_constant__ CUtensorMap tm_dk, const __grid_constant__ CUtensorMap tm_dv,
               const BwdArgs args) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = shared_layout<typename Cfg::Shared>(smem_raw);
  const int group = tlx::warp_group_index();
  if (threadIdx.x == 0) {
    init_bwd_barriers<Cfg>(s);
    tlx::tma_prefetch_descriptor(&tm_q);
    tlx::tma_prefetch_descriptor(&tm_k);
    tlx::tma_prefetch_descriptor(&tm_v);
    tlx::tma_prefetch_descriptor(&tm_do);
    tlx::tma_prefetch_descriptor(&tm_rows);
    tlx::tma_prefetch_descriptor(&tm_dk);
    tlx::tma_prefetch_descriptor(&tm_dv);
  }
  __syncthreads();
  const int64_t n_items =
      static_cast<int64_t>(min(*args.work_count, args.work_capacity)) * args.heads_kv;
  if (group == 0) {
    tlx::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0)
      bwd_producer<Cfg>(s, &tm_q, &tm_k, &tm_v, &tm_do, &tm_rows, args, n_items);
    else if (threadIdx.x >= Cfg::kDqWriterFirstThread)
      bwd_dq_writer<Cfg>(s, args);
  } else {
    tlx::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    bwd_consumer<Cfg>(s, &tm_dk, &tm_dv, args, n_items, group - 1);
  }
}

}  // namespace jfa::sm90
