// The paged decode kernel (decode, speculative decode and chunked prefill over a paged KV cache):
// one CTA per (sequence, KV head, split of the sequence's keys, block of rows) (paged_cta.cuh).
// The keys of the split stream through shared memory a chunk at a time (paged_stream.cuh: cp.async,
// kStages deep, each row fetched from its own page through the block table). The scores and P V
// are mma.sync m16n8k16 steps (mma_sync.cuh): a warp takes 16 rows of the CTA (the query heads of
// the KV head times the tokens, padded with rows of zeros) and, where the rows are few, a share of
// each chunk's 16-key sub-tiles (key warps, merged through shared memory at the end), so that a
// decode step of 4 to 16 rows a KV head runs on the tensor cores.
//
// q sits in registers as A fragments (head_dim / 16 of them; in shared memory past 128), O as C
// fragments (head_dim / 8). The stages hold each key's 16-byte vectors XOR-swizzled by the key's
// low 3 bits, so that ldmatrix's 8 rows of one column fall on different banks: K as B fragments
// (ldmatrix), V as B fragments of P V (ldmatrix.trans). The online softmax runs on the C fragments
// of S, its row maximum and sum reduced over the 4 lanes of a row; softcap and the window
// (common/visibility.hpp, per token) apply per element, 16 keys at a time.
#pragma once

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/paged/mma_sync.cuh"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_combine.cuh"
#include "cuda/sm90/paged/paged_config.hpp"
#include "cuda/sm90/paged/paged_cta.cuh"
#include "cuda/sm90/paged/paged_stream.cuh"
#include "cuda/sm90/paged/paged_vec.cuh"
#include "cuda/sm90/shared/softmax.cuh"
#include "cuda/tlx/grid_dependency.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// Element offset of key `key`'s 16-byte vector `vec` in a stage.
template <int kD>
__device__ __forceinline__ int swizzled(int key, int vec) {
  return key * kD + ((vec ^ (key & 7)) * 8);
}

// kLetsCombineStart (built for measurement, not shipped: JFA_CUDA_UNVERIFIED_PAGED_PDL=1): the
// combine kernel after this one, launched as its programmatic dependent, may start at once and
// waits for this kernel's partials itself (paged_combine_kernel's kAfterPrior).
template <typename T, int kD, bool kLetsCombineStart = false>
__global__ void __launch_bounds__(PagedConfig<kD>::kThreads)
    paged_decode_kernel(const PagedArgs a) {
  using C = PagedConfig<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  if constexpr (kLetsCombineStart) tlx::allow_dependent_launch();
  PagedCta w;
  if (!paged_cta<C::kRowsPerCta, C::kChunkKeys>(a, &w)) return;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  // The fewest row warps (a power of two) that hold the rows; the other warps split the keys.
  int row_warps = 1;
  while (row_warps * 16 < w.rows) row_warps *= 2;
  const int key_warps = C::kWarps / row_warps;
  const int wr = warp % row_warps, z = warp / row_warps;

  // This thread's rows g and g + 8 of the warp's 16: head, token and the keys of the split each
  // sees (none for a padding row); the warp's bounds over its rows, for the sub-tiles to skip or
  // leave unmasked (warp-uniform).
  int32_t lo[2], hi[2], head[2];
  int64_t token[2];
  bool valid[2];
  PagedBounds bounds;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t r = wr * 16 + g + 8 * h;
    valid[h] = r < w.rows;
    lo[h] = hi[h] = head[h] = 0;
    token[h] = 0;
    if (!valid[h]) continue;
    const PagedRow x = paged_row(a, w, r);
    head[h] = x.head;
    token[h] = x.token;
    lo[h] = x.lo;
    hi[h] = x.hi;
    bounds.add(x.lo, x.hi);
  }
  const int32_t any_lo = __reduce_min_sync(0xffffffffu, bounds.any_lo);
  const int32_t any_hi = __reduce_max_sync(0xffffffffu, bounds.any_hi);
  const int32_t all_lo = __reduce_max_sync(0xffffffffu, bounds.all_lo);
  const int32_t all_hi = __reduce_min_sync(0xffffffffu, bounds.all_hi);

  // q as A fragments: register j of step kk holds row g + 8 (j & 1), columns kk 16 + 8 (j >> 1)
  // + 2t and + 1; zeros for padding rows. With kQShared, the warp's 16 rows go to shared memory
  // instead (written by the row warp's first warp, visible after the pipeline's first barrier).
  constexpr int kQRegSteps = C::kQShared ? 1 : C::kKSteps;
  uint32_t qf[kQRegSteps][4];
  T* const q_shared = reinterpret_cast<T*>(smem + C::kStageBytes) + wr * 16 * kD;
  if constexpr (C::kQShared) {
    if (z == 0) {
      for (int v = lane; v < 16 * C::kVecsPerKey; v += 32) {
        const int rr = v / C::kVecsPerKey, col = v % C::kVecsPerKey;
        const int32_t r = wr * 16 + rr;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < w.rows) {
          const int32_t row = w.row0 + r;
          const int64_t tok = static_cast<int64_t>(w.q_start) + row / a.group;
          const int32_t hd = w.kv_head * a.group + row % a.group;
          x = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) +
                                                   tok * a.q_token_stride + hd * a.q_head_stride +
                                                   col * 8));
        }
        *reinterpret_cast<uint4*>(q_shared + swizzled<kD>(rr, col)) = x;
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < C::kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int h = j & 1;
        const int col = kk * 16 + (j >> 1) * 8 + 2 * t;
        qf[kk][j] = valid[h] ? __ldg(reinterpret_cast<const uint32_t*>(
                                   static_cast<const T*>(a.q) + token[h] * a.q_token_stride +
                                   head[h] * a.q_head_stride + col))
                             : 0u;
      }
    }
  }

  float o[C::kNTiles][4];
#pragma unroll
  for (int n = 0; n < C::kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  T* const stages = reinterpret_cast<T*>(smem);
  const T* const k_cache = static_cast<const T*>(a.k_cache);
  const T* const v_cache = static_cast<const T*>(a.v_cache);
  const int32_t* const table = a.block_table + w.seq * a.max_pages_per_seq;
  const int32_t n_chunks = (w.key_end - w.key_begin + C::kChunkKeys - 1) / C::kChunkKeys;

  // Chunk c's keys and values into stage s, swizzled.
  auto load_chunk = [&](int32_t c, int s) {
    T* const sk = stages + s * 2 * C::kStageElems;
    paged_load_chunk<T, kD, C::kChunkKeys, C::kThreads>(
        a, k_cache, v_cache, table, w.kv_head, w.key_begin + c * C::kChunkKeys, w.key_end, sk,
        sk + C::kStageElems,
        [](T* stage, int key, int col) { return stage + swizzled<kD>(key, col); });
  };

  // This key warp's sub-tiles of chunk c (in stage s): S = q K^T, mask, online softmax, O += P V.
  auto compute_chunk = [&](int32_t c, int s) {
    const T* const sk = stages + s * 2 * C::kStageElems;
    const T* const sv = sk + C::kStageElems;
    const int32_t key0 = w.key_begin + c * C::kChunkKeys;
    for (int st = z; st < C::kSubTiles; st += key_warps) {
      const int32_t k0 = key0 + st * C::kSubKeys;
      if (k0 >= any_hi) break;  // no row of the warp sees a key from here on
      if (k0 + C::kSubKeys <= any_lo) continue;
      const bool unmasked = k0 >= all_lo && k0 + C::kSubKeys <= all_hi;
      // S: sc[nt] holds rows g, g + 8 of keys nt 8 + 2t and + 1. Lane i addresses row i % 8 of
      // matrix i / 8: keys (i / 16) 8 + i % 8, vector 2 kk + (i / 8) % 2.
      float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      const int k_row = st * C::kSubKeys + (lane >> 4) * 8 + (lane & 7);
      // With kQShared, lane i addresses row ((i / 8) % 2) 8 + i % 8 of q, vector 2 kk + i / 16.
      const int q_row = ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int kk = 0; kk < C::kKSteps; ++kk) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + swizzled<kD>(k_row, kk * 2 + ((lane >> 3) & 1)));
        if constexpr (C::kQShared) {
          uint32_t qa[4];
          ldmatrix_x4(qa, q_shared + swizzled<kD>(q_row, kk * 2 + (lane >> 4)));
          mma_m16n8k16<T>(sc[0], qa, b[0], b[1]);
          mma_m16n8k16<T>(sc[1], qa, b[2], b[3]);
        } else {
          mma_m16n8k16<T>(sc[0], qf[kk], b[0], b[1]);
          mma_m16n8k16<T>(sc[1], qf[kk], b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float u = sc[nt][2 * h + e];
            if (a.softcap > 0.f) u = a.softcap * fast_tanh(u * a.softcap_in);
            const int32_t key = k0 + nt * 8 + 2 * t + e;
            if (!unmasked && (key < lo[h] || key >= hi[h])) u = -INFINITY;
            sc[nt][2 * h + e] = u;
            tile_max = fmaxf(tile_max, u);
          }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(m[h], tile_max);
        if (m_new == -INFINITY) {  // the row sees none of these keys, nor any before
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) sc[nt][2 * h] = sc[nt][2 * h + 1] = 0.f;
          continue;
        }
        if (m_new != m[h]) {
          const float alpha = fast_exp2((m[h] - m_new) * a.score_scale_log2);
          l[h] *= alpha;
#pragma unroll
          for (int n = 0; n < C::kNTiles; ++n) {
            o[n][2 * h] *= alpha;
            o[n][2 * h + 1] *= alpha;
          }
          m[h] = m_new;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2((sc[nt][2 * h + e] - m_new) * a.score_scale_log2);
            sc[nt][2 * h + e] = p;
            l[h] += p;
          }
      }
      // P as an A fragment (keys as its columns), then O += P V: lane i addresses row i % 8 of
      // matrix i / 8 of V's transposed load: keys ((i / 8) % 2) 8 + i % 8, vector 2 n2 + i / 16.
      const uint32_t pa[4] = {pack2<T>(sc[0][0], sc[0][1]), pack2<T>(sc[0][2], sc[0][3]),
                              pack2<T>(sc[1][0], sc[1][1]), pack2<T>(sc[1][2], sc[1][3])};
      const int v_row = st * C::kSubKeys + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int n2 = 0; n2 < C::kNTiles / 2; ++n2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sv + swizzled<kD>(v_row, n2 * 2 + (lane >> 4)));
        mma_m16n8k16<T>(o[2 * n2], pa, b[0], b[1]);
        mma_m16n8k16<T>(o[2 * n2 + 1], pa, b[2], b[3]);
      }
    }
  };

  paged_pipeline<C::kStages>(n_chunks, load_chunk, compute_chunk);

  // Each row's sum over its 4 lanes (their maxima agree).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }

  // The key warps' states of each row merged into the warp with z == 0, through the stages.
  if (key_warps > 1) {
    float* const merge_o = reinterpret_cast<float*>(smem);
    float2* const merge_ml = reinterpret_cast<float2*>(smem + C::kMergeOBytes);
    if (z > 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + g + 8 * h;
#pragma unroll
        for (int n = 0; n < C::kNTiles; ++n)
          *reinterpret_cast<float2*>(merge_o + row * kD + n * 8 + 2 * t) =
              make_float2(o[n][2 * h], o[n][2 * h + 1]);
        if (t == 0) merge_ml[row] = make_float2(m[h], l[h]);
      }
    }
    __syncthreads();
    if (z == 0) {
      for (int zz = 1; zz < key_warps; ++zz) {
        const int other = wr + row_warps * zz;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = other * 16 + g + 8 * h;
          const float2 ml = merge_ml[row];
          const float m_new = fmaxf(m[h], ml.x);
          if (m_new == -INFINITY) continue;
          const float mine = fast_exp2((m[h] - m_new) * a.score_scale_log2);
          const float theirs = fast_exp2((ml.x - m_new) * a.score_scale_log2);
          l[h] = l[h] * mine + ml.y * theirs;
#pragma unroll
          for (int n = 0; n < C::kNTiles; ++n) {
            const float2 x = *reinterpret_cast<const float2*>(merge_o + row * kD + n * 8 + 2 * t);
            o[n][2 * h] = o[n][2 * h] * mine + x.x * theirs;
            o[n][2 * h + 1] = o[n][2 * h + 1] * mine + x.y * theirs;
          }
          m[h] = m_new;
        }
      }
    }
  }
  if (z != 0) return;

  // One split: the rows' ends. Several: the split's state of each row, for the combine.
  bool not_finite = false;
  const int64_t rows_all = a.total_q * a.heads_q;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!valid[h]) continue;
    if (a.splits == 1) {
      const RowEnd e = paged_row_end(a, m[h], l[h], head[h]);
      T* dst = static_cast<T*>(a.out) + token[h] * a.out_token_stride + head[h] * a.out_head_stride;
#pragma unroll
      for (int n = 0; n < C::kNTiles; ++n)
        *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * t) =
            pack2<T>(o[n][2 * h] * e.inv, o[n][2 * h + 1] * e.inv);
      if (a.lse != nullptr && t == 0) a.lse[head[h] * a.total_q + token[h]] = e.lse;
      if (a.device_check != nullptr) not_finite |= paged_row_not_finite(a, lo[h] < hi[h], l[h], e);
    } else {
      const int64_t at = w.split * rows_all + token[h] * a.heads_q + head[h];
      if (m[h] != -INFINITY) {
#pragma unroll
        for (int n = 0; n < C::kNTiles; ++n)
          *reinterpret_cast<float2*>(a.part_o + at * kD + n * 8 + 2 * t) =
              make_float2(o[n][2 * h], o[n][2 * h + 1]);
      }
      if (t == 0) a.part_ml[at] = make_float2(m[h], l[h]);
      if (a.device_check != nullptr && lo[h] < hi[h] && !(l[h] > 0.f && l[h] < INFINITY))
        not_finite = true;
    }
  }
  if (not_finite) atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

}  // namespace jfa::sm90
