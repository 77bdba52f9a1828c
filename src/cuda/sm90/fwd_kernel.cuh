// Hopper forward kernel of jagged attention: one 128-row Q tile of one head of one sequence per
// work item; a persistent grid walks the items.
//
// Roles (384 threads, one CTA per SM):
//   warp group 0  producer: one thread issues TMA for Q (once per item) and K/V through a ring of
//                 kStages stages guarded by full/empty mbarriers; registers given away.
//   warp groups 1-2 consumers: 64 Q rows each; S = Q K^T (SS wgmma), online softmax in registers
//                 (exp2, scale folded into one FMA), P packed to 16 bits as the A operand of
//                 O += P V (RS wgmma, V read through the transposed-B descriptor), predicated
//                 stores.
//
// Packed tensors are addressed through one 3-D tensor map each, dims (head_dim, heads, total), box
// (64, 1, rows): a tile of sequence b starts at token cu_seqlens[b] + row0. Keys past the end of a
// sequence in its last K tile are masked; Q rows past the end are computed and dropped.
// Offsets are not validated on the device; they are clamped to [0, total] so that no access leaves
// the caller's buffers (results for invalid offsets are unspecified).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/fwd_params.hpp"
#include "cuda/tlx/fence.hpp"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/named_barrier.hpp"
#include "cuda/tlx/smem_tile.hpp"
#include "cuda/tlx/tma.hpp"
#include "cuda/tlx/warpgroup.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::sm90 {

template <typename T, int kHeadDim>
struct FwdConfig {
  using Element = T;
  static constexpr int kD = kHeadDim;
  static constexpr int kBlockM = 128;  // two consumer warp groups of 64 rows
  static constexpr int kBlockN = 128;
  static constexpr int kStages = kHeadDim <= 64 ? 4 : 2;
  static constexpr int kConsumerGroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerWarps = 4 * kConsumerGroups;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using KVTile = tlx::SwizzledTile<T, kBlockN, kD>;

  struct Shared {
    QTile q;
    KVTile k[kStages];
    KVTile v[kStages];
    tlx::MBarrier q_full, q_empty;
    tlx::MBarrier k_full[kStages], v_full[kStages], kv_empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(Shared)) + 1024;  // + alignment slack
};

// Sequence bounds of one work item, clamped into [0, total].
struct SeqBounds {
  int32_t q_start, len_q, k_start, len_k;
};

__device__ __forceinline__ int32_t clamp_offset(int32_t v, int32_t lo, int64_t hi) {
  const int64_t x = v < lo ? lo : v;
  return static_cast<int32_t>(x > hi ? hi : x);
}

__device__ __forceinline__ SeqBounds load_bounds(const FwdArgs& a, int32_t b) {
  SeqBounds s;
  s.q_start = clamp_offset(__ldg(a.cu_q + b), 0, a.total_q);
  const int32_t q_end = clamp_offset(__ldg(a.cu_q + b + 1), s.q_start, a.total_q);
  s.len_q = q_end - s.q_start;
  s.k_start = clamp_offset(__ldg(a.cu_k + b), 0, a.total_k);
  const int32_t k_end = clamp_offset(__ldg(a.cu_k + b + 1), s.k_start, a.total_k);
  s.len_k = k_end - s.k_start;
  return s;
}

// One work item as both roles see it; they derive it from the same inputs so they agree on every
// skip and on the number of K tiles (and thus on the pipeline phases).
struct TileWork {
  SeqBounds seq;
  int32_t head;
  int32_t m_block;
  int32_t n_blocks;  // K tiles to visit, 0 when no query row of the tile sees a key
  bool active;       // the tile has query rows
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileWork decode_item(const FwdArgs& a, int64_t item) {
  TileWork w;
  const int64_t tile = item / a.heads_q;
  w.head = static_cast<int32_t>(item - tile * a.heads_q);
  const WorkTile wt = a.work[tile];
  const int32_t b =
      wt.seq < 0 ? 0 : (wt.seq >= a.batch ? static_cast<int32_t>(a.batch - 1) : wt.seq);
  w.seq = load_bounds(a, b);
  w.m_block = wt.m_block;
  const int64_t row0 = static_cast<int64_t>(w.m_block) * kBlockM;
  w.active = wt.m_block >= 0 && row0 < w.seq.len_q;
  int64_t visible = w.seq.len_k;  // keys seen by the tile's last row (an upper bound for the tile)
  if (a.causal) {
    const int64_t last_row = min(row0 + kBlockM, static_cast<int64_t>(w.seq.len_q)) - 1;
    visible = last_row + w.seq.len_k - w.seq.len_q + 1;
    visible = visible < 0 ? 0 : (visible > w.seq.len_k ? w.seq.len_k : visible);
  }
  w.n_blocks = w.active ? static_cast<int32_t>((visible + kBlockN - 1) / kBlockN) : 0;
  return w;
}

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
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t q_phase = 0;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const TileWork w = decode_item<Cfg::kBlockM, Cfg::kBlockN>(a, item);
    if (!w.active || w.n_blocks == 0) continue;
    const int32_t kv_head = w.head / a.group;
    s.q_empty.wait(q_phase ^ 1u);
    s.q_full.arrive_expect_tx(kQBytes);
    const int32_t q_row = w.seq.q_start + w.m_block * Cfg::kBlockM;
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx)
      tlx::tma_load_3d(tm_q, &s.q_full, s.q.box(bx), bx * 64, w.head, q_row);
    for (int it = 0; it < w.n_blocks; ++it) {
      const int32_t n = w.n_blocks - 1 - it;
      const int32_t k_row = w.seq.k_start + n * Cfg::kBlockN;
      s.kv_empty[st.stage].wait(st.phase ^ 1u);
      s.k_full[st.stage].arrive_expect_tx(kKVBytes);
#pragma unroll
      for (int bx = 0; bx < kBoxes; ++bx)
        tlx::tma_load_3d(tm_k, &s.k_full[st.stage], s.k[st.stage].box(bx), bx * 64, kv_head, k_row);
      s.v_full[st.stage].arrive_expect_tx(kKVBytes);
#pragma unroll
      for (int bx = 0; bx < kBoxes; ++bx)
        tlx::tma_load_3d(tm_v, &s.v_full[st.stage], s.v[st.stage].box(bx), bx * 64, kv_head, k_row);
      st.advance();
    }
    q_phase ^= 1u;
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer pieces: one warp group, 64 rows; each thread owns rows r and r + 8 (see wgmma.hpp).

template <typename Cfg>
struct ConsumerState {
  static constexpr int kD = Cfg::kD;
  static constexpr int kN = Cfg::kBlockN;
  float o[kD / 2];
  float row_max[2];
  float row_sum[2];  // per-thread partial sums, reduced across the quad at the end
};

// S = Q K^T for this warp group's 64 rows.
template <typename Cfg>
__device__ __forceinline__ void gemm_qk(float (&s_acc)[Cfg::kBlockN / 2],
                                        const typename Cfg::QTile& q, const typename Cfg::KVTile& k,
                                        int group) {
  using T = typename Cfg::Element;
  const uint32_t q_base = q.box_addr(0) + group * 64 * tlx::kSwizzleBytes;
  const uint32_t k_base = k.box_addr(0);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kD / 16; ++kk) {
    const uint32_t qa = q_base + (kk / 4) * Cfg::QTile::kBoxBytes + (kk % 4) * 32;
    const uint32_t kb = k_base + (kk / 4) * Cfg::KVTile::kBoxBytes + (kk % 4) * 32;
    tlx::wgmma_ss<T, Cfg::kBlockN, 0>(s_acc, tlx::make_desc_sw128(qa, 16, 1024),
                                      tlx::make_desc_sw128(kb, 16, 1024), kk > 0 ? 1u : 0u);
  }
  tlx::wgmma_commit();
}

// O += P V: P as register A fragments, V [kBlockN x D] read as an MN-major B.
template <typename Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kD / 2],
                                        const uint32_t (&p)[Cfg::kBlockN / 16][4],
                                        const typename Cfg::KVTile& v) {
  using T = typename Cfg::Element;
  const uint32_t v_base = v.box_addr(0);
  tlx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    const uint32_t vb = v_base + kk * 16 * tlx::kSwizzleBytes;
    tlx::wgmma_rs<T, Cfg::kD, 1>(o, p[kk], tlx::make_desc_sw128(vb, Cfg::KVTile::kBoxBytes, 1024),
                                 1u);
  }
  tlx::wgmma_commit();
}

// Masks keys that are past the sequence end or (causal) after the row's diagonal.
template <typename Cfg>
__device__ __forceinline__ void apply_mask(float (&s_acc)[Cfg::kBlockN / 2], int32_t key0,
                                           int32_t row0_in_seq, int32_t len_k, int32_t diag_shift,
                                           bool causal) {
  const int lane = threadIdx.x & 31;
  const int32_t col0 = key0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t key = col0 + 8 * j + (e & 1);
      const int32_t row = row0_in_seq + ((e & 2) ? 8 : 0);
      const bool ok = key < len_k && (!causal || key <= row + diag_shift);
      if (!ok) s_acc[4 * j + e] = -INFINITY;
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
  float mx[2] = {cs.row_max[0], cs.row_max[1]};
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  float neg_m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_scaled = mx[h] == -INFINITY ? 0.f : mx[h] * scale_log2;
    neg_m[h] = -m_scaled;
    alpha[h] = fast_exp2(fmaf(cs.row_max[h], scale_log2, neg_m[h]));
    cs.row_max[h] = mx[h];
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      const float p = fast_exp2(fmaf(s_acc[4 * j + e], scale_log2, neg_m[h]));
      s_acc[4 * j + e] = p;
      sum[h] += p;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) cs.row_sum[h] = cs.row_sum[h] * alpha[h] + sum[h];
}

template <typename Cfg>
__device__ __forceinline__ void rescale_o(ConsumerState<Cfg>& cs, const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < Cfg::kD / 8; ++j) {
    cs.o[4 * j + 0] *= alpha[0];
    cs.o[4 * j + 1] *= alpha[0];
    cs.o[4 * j + 2] *= alpha[1];
    cs.o[4 * j + 3] *= alpha[1];
  }
}

// Normalises O and writes this thread's part of the rows that lie inside the sequence, plus LSE.
template <typename Cfg>
__device__ __forceinline__ void epilogue(ConsumerState<Cfg>& cs, const FwdArgs& a,
                                         const TileWork& w, int32_t row0_in_seq, bool no_keys) {
  using T = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = cs.row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const bool empty = no_keys || !(l > 0.f);
    const float inv = empty ? 0.f : 1.f / l;
    const int32_t row = row0_in_seq + 8 * h;
    if (row < w.seq.len_q) {
      const int64_t token = static_cast<int64_t>(w.seq.q_start) + row;
      T* dst = out + token * a.out_token_stride + static_cast<int64_t>(w.head) * a.out_head_stride +
               2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < Cfg::kD / 8; ++j) {
        const uint32_t packed =
            tlx::pack2<T>(cs.o[4 * j + 2 * h] * inv, cs.o[4 * j + 2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = packed;
      }
      if (a.lse != nullptr && (lane & 3) == 0) {
        const float lse = empty ? -INFINITY : cs.row_max[h] * a.softmax_scale + logf(l);
        a.lse[static_cast<int64_t>(w.head) * a.total_q + token] = lse;
      }
    }
  }
}

template <typename Cfg>
__device__ __forceinline__ void consumer_loop(typename Cfg::Shared& s, const FwdArgs& a,
                                              int64_t n_items, int group) {
  constexpr int kN = Cfg::kBlockN;
  const int tid = threadIdx.x - 128 * (group + 1);
  const int warp = tid / 32;
  const int lane = tid & 31;
  const bool leader = lane == 0;
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t q_phase = 0;
  ConsumerState<Cfg> cs;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const TileWork w = decode_item<Cfg::kBlockM, Cfg::kBlockN>(a, item);
    if (!w.active) continue;
    // First of this thread's two rows, as a row index inside the sequence.
    const int32_t row0 = w.m_block * Cfg::kBlockM + group * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int i = 0; i < Cfg::kD / 2; ++i) cs.o[i] = 0.f;
    cs.row_max[0] = cs.row_max[1] = -INFINITY;
    cs.row_sum[0] = cs.row_sum[1] = 0.f;
    if (w.n_blocks == 0) {
      epilogue<Cfg>(cs, a, w, row0, true);
      continue;
    }
    const int32_t diag_shift = w.seq.len_k - w.seq.len_q;
    // A K tile needs the mask when it reaches past the sequence end or (causal) past the diagonal
    // of the tile's first row.
    const int32_t first_row = w.m_block * Cfg::kBlockM;
    s.q_full.wait(q_phase);
    for (int it = 0; it < w.n_blocks; ++it) {
      const int32_t n = w.n_blocks - 1 - it;
      const int32_t key0 = n * kN;
      float s_acc[kN / 2];
      s.k_full[st.stage].wait(st.phase);
      gemm_qk<Cfg>(s_acc, s.q, s.k[st.stage], group);
      tlx::wgmma_wait<0>();
      tlx::fence_operand(s_acc);
      if (it == w.n_blocks - 1 && leader) s.q_empty.arrive();
      const bool need_mask =
          key0 + kN > w.seq.len_k || (a.causal && key0 + kN - 1 > first_row + diag_shift);
      if (need_mask) apply_mask<Cfg>(s_acc, key0, row0, w.seq.len_k, diag_shift, a.causal != 0);
      float alpha[2];
      softmax_scores<Cfg>(s_acc, cs, a.scale_log2, alpha);
      rescale_o<Cfg>(cs, alpha);
      uint32_t p[kN / 16][4];
      tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
      s.v_full[st.stage].wait(st.phase);
      tlx::fence_operand(cs.o);
      gemm_pv<Cfg>(cs.o, p, s.v[st.stage]);
      tlx::wgmma_wait<0>();
      tlx::fence_operand(cs.o);
      if (leader) s.kv_empty[st.stage].arrive();
      st.advance();
    }
    q_phase ^= 1u;
    epilogue<Cfg>(cs, a, w, row0, false);
  }
}

// Overlapped schedule: S(n) = Q K(n)^T is issued together with O += P(n-1) V(n-1), so the tensor
// cores work on one tile while the softmax of the previous one runs; the two consumer groups take
// turns issuing (named barriers 1 and 2), so one group's softmax overlaps the other's MMAs.
template <typename Cfg>
__device__ __forceinline__ void consumer_loop_overlapped(typename Cfg::Shared& s, const FwdArgs& a,
                                                         int64_t n_items, int group) {
  constexpr int kN = Cfg::kBlockN;
  constexpr uint32_t kTurnThreads = 128 * Cfg::kConsumerGroups;
  const uint32_t my_turn = 1 + group, other_turn = 2 - group;
  const int tid = threadIdx.x - 128 * (group + 1);
  const int warp = tid / 32;
  const int lane = tid & 31;
  const bool leader = lane == 0;
  tlx::PipelineState<Cfg::kStages> st;
  uint32_t q_phase = 0;
  ConsumerState<Cfg> cs;
  if (group == 1) tlx::NamedBarrier::arrive(1, kTurnThreads);  // group 0 goes first
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const TileWork w = decode_item<Cfg::kBlockM, Cfg::kBlockN>(a, item);
    if (!w.active) continue;
    const int32_t row0 = w.m_block * Cfg::kBlockM + group * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int i = 0; i < Cfg::kD / 2; ++i) cs.o[i] = 0.f;
    cs.row_max[0] = cs.row_max[1] = -INFINITY;
    cs.row_sum[0] = cs.row_sum[1] = 0.f;
    if (w.n_blocks == 0) {
      epilogue<Cfg>(cs, a, w, row0, true);
      continue;
    }
    const int32_t diag_shift = w.seq.len_k - w.seq.len_q;
    const int32_t first_row = w.m_block * Cfg::kBlockM;
    const bool causal = a.causal != 0;
    s.q_full.wait(q_phase);

    uint32_t p[kN / 16][4];
    // Mask (where needed) and online softmax of one S tile; alpha rescales O afterwards.
    auto scores = [&](float(&s_acc)[kN / 2], int32_t key0, float(&alpha)[2]) {
      const bool need_mask =
          key0 + kN > w.seq.len_k || (causal && key0 + kN - 1 > first_row + diag_shift);
      if (need_mask) apply_mask<Cfg>(s_acc, key0, row0, w.seq.len_k, diag_shift, causal);
      softmax_scores<Cfg>(s_acc, cs, a.scale_log2, alpha);
    };
    // First (diagonal or last) tile: S only.
    int prev_stage = st.stage;
    {
      float s_acc[kN / 2];
      s.k_full[st.stage].wait(st.phase);
      tlx::NamedBarrier::sync(my_turn, kTurnThreads);
      gemm_qk<Cfg>(s_acc, s.q, s.k[st.stage], group);
      tlx::NamedBarrier::arrive(other_turn, kTurnThreads);
      tlx::wgmma_wait<0>();
      tlx::fence_operand(s_acc);
      if (w.n_blocks == 1 && leader) s.q_empty.arrive();
      float alpha[2];
      scores(s_acc, (w.n_blocks - 1) * kN, alpha);
      tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
      st.advance();
    }
    // Steady state: S(n) and P(n-1) V(n-1) in flight together.
    for (int it = 1; it < w.n_blocks; ++it) {
      float s_acc[kN / 2];
      s.k_full[st.stage].wait(st.phase);
      tlx::NamedBarrier::sync(my_turn, kTurnThreads);
      gemm_qk<Cfg>(s_acc, s.q, s.k[st.stage], group);
      s.v_full[prev_stage].wait(st.stage == 0 ? st.phase ^ 1u : st.phase);
      gemm_pv<Cfg>(cs.o, p, s.v[prev_stage]);
      tlx::NamedBarrier::arrive(other_turn, kTurnThreads);
      tlx::wgmma_wait<1>();
      tlx::fence_operand(s_acc);
      if (it == w.n_blocks - 1 && leader) s.q_empty.arrive();
      float alpha[2];
      scores(s_acc, (w.n_blocks - 1 - it) * kN, alpha);
      tlx::wgmma_wait<0>();
      tlx::fence_operand(cs.o);
      tlx::fence_operand(p);
      if (leader) s.kv_empty[prev_stage].arrive();
      rescale_o<Cfg>(cs, alpha);
      tlx::accum_to_a_frags<typename Cfg::Element, kN>(s_acc, p);
      prev_stage = st.stage;
      st.advance();
    }
    // The last P V.
    s.v_full[prev_stage].wait(st.stage == 0 ? st.phase ^ 1u : st.phase);
    tlx::fence_operand(cs.o);
    gemm_pv<Cfg>(cs.o, p, s.v[prev_stage]);
    tlx::wgmma_wait<0>();
    tlx::fence_operand(cs.o);
    if (leader) s.kv_empty[prev_stage].arrive();
    q_phase ^= 1u;
    epilogue<Cfg>(cs, a, w, row0, false);
  }
  if (group == 0) tlx::NamedBarrier::sync(1, kTurnThreads);  // take group 1's last hand-over
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const FwdArgs args) {
  extern __shared__ unsigned char smem_raw[];
  const uintptr_t aligned =
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023);
  auto& s = *reinterpret_cast<typename Cfg::Shared*>(aligned);
  const int group = tlx::warp_group_index();

  if (threadIdx.x == 0) {
    s.q_full.init(1);
    s.q_empty.init(Cfg::kConsumerWarps);
#pragma unroll
    for (int i = 0; i < Cfg::kStages; ++i) {
      s.k_full[i].init(1);
      s.v_full[i].init(1);
      s.kv_empty[i].init(Cfg::kConsumerWarps);
    }
    tlx::fence_barrier_init();
  }
  __syncthreads();

  const int64_t n_items =
      static_cast<int64_t>(min(*args.work_count, args.work_capacity)) * args.heads_q;

  if (group == 0) {
    tlx::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      tlx::tma_prefetch_descriptor(&tm_q);
      tlx::tma_prefetch_descriptor(&tm_k);
      tlx::tma_prefetch_descriptor(&tm_v);
      producer_loop<Cfg>(s, &tm_q, &tm_k, &tm_v, args, n_items);
    }
  } else {
    tlx::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    if (args.schedule == 0)
      consumer_loop<Cfg>(s, args, n_items, group - 1);
    else
      consumer_loop_overlapped<Cfg>(s, args, n_items, group - 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Prologue: the work list, one entry per (sequence, q tile), from cu_seqlens_q on the device.
// One block; entries past `capacity` (only reachable with invalid offsets) are dropped.
template <int kBlockM>
__global__ void __launch_bounds__(1024)
    build_work_list(const int32_t* cu_q, int64_t batch, int64_t total_q, WorkTile* work,
                    int32_t* count, int32_t capacity) {
  __shared__ int32_t warp_sums[32];
  __shared__ int64_t running;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int64_t base = 0; base < batch; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    int32_t tiles = 0;
    if (b < batch) {
      const int32_t start = clamp_offset(cu_q[b], 0, total_q);
      const int32_t end = clamp_offset(cu_q[b + 1], start, total_q);
      tiles = (end - start + kBlockM - 1) / kBlockM;
    }
    int32_t incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t x = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += x;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int32_t ws = warp_sums[lane];
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int32_t x = __shfl_up_sync(0xffffffffu, ws, d);
        if (lane >= d) ws += x;
      }
      warp_sums[lane] = ws;  // inclusive over warps
    }
    __syncthreads();
    const int64_t first = running + (warp > 0 ? warp_sums[warp - 1] : 0) + incl - tiles;
    for (int32_t m = 0; m < tiles; ++m) {
      // Later q tiles first within a sequence: under a causal mask they carry more work.
      const int64_t idx = first + m;
      if (idx < capacity) work[idx] = WorkTile{static_cast<int32_t>(b), tiles - 1 - m};
    }
    __syncthreads();
    if (threadIdx.x == 0) running += warp_sums[31];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = static_cast<int32_t>(running < capacity ? running : capacity);
}

}  // namespace jfa::sm90
