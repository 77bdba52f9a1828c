// The kernels around the sm90 backward's main kernel: the preprocess, which writes the per-row
// terms the main kernel reads for each q tile (LSE in base 2, and D = rowsum(dO * O) - dLSE), one
// row per query token, and the conversion of the float32 dQ accumulator into dq.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "cuda/sm90/shared/work_list.cuh"
#include "cuda/tlx/wgmma.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

inline constexpr int kPreprocessThreads = 256;  // 8 warps, 8 rows each: one q tile

// A block fills rows [64 t, 64 t + 64) of a head h, one per query token (a grid of (tiles, heads)
// blocks, t and h from the block's linear index): rows past total_q add nothing (LSE +inf: P = 0,
// and D = 0), and so does a row without keys (forward LSE -inf) or one whose LSE is not finite
// although it sees keys (NaN, +inf, or -inf from scores below float32's range), which the checked
// mode reports. The kernel masks the rows of a step past its sequence's end, which hold the next
// sequence's terms. Each row is written twice, the second time into the copy one row later. The
// rows of tokens also clear their row of the dQ accumulator, except those a shared tile stores
// (the stored rows).
//
// A row of O and dO (kDv columns) is read by kDv / 8 lanes rounded up to a power of two (lanes past
// the row's end read nothing), 16 bytes each (the supported strides and alignment keep them
// aligned), so that a warp's load takes several whole rows and its sum needs only a few shuffles:
// the kernel is short of instructions, not bytes, when the rows are few per sequence. A warp
// issues the loads of all its rows before its first sum: one row's loads at a time leave too few
// bytes in flight where no clearing writes fill the time (batches of tiny sequences, whose rows
// are stored).
//
// kLocal: whether a row sees a key follows `window` (the local-attention kernels; else `causal`).
template <typename T, int kD, int kDv, bool kLocal = false>
__global__ void __launch_bounds__(kPreprocessThreads)
    bwd_preprocess(const T* out, int64_t out_token_stride, int64_t out_head_stride, const T* dout,
                   int64_t dout_token_stride, int64_t dout_head_stride, const float* lse,
                   const float* dlse, const int32_t* cu_q, const int32_t* cu_k, int64_t batch,
                   int64_t total_q, int64_t total_k, int32_t causal, jfa::detail::Window window,
                   int64_t row_len, float* lse2, float* dpsum, float* dq_acc,
                   const uint32_t* stored_rows, int32_t* device_check) {
  constexpr int kWarps = kPreprocessThreads / 32, kRows = kBwdTileRows / kWarps;
  constexpr int kLanesPerRow = kDv <= 32 ? 4 : kDv <= 64 ? 8 : kDv <= 128 ? 16 : 32;
  constexpr int kRowsPerLoad = 32 / kLanesPerRow;
  constexpr int kLoads = kRows / kRowsPerLoad;
  static_assert(kRows <= 32 && kRows % kRowsPerLoad == 0, "whole rows per load; a lane per LSE");
  // Blocks start in order of their linear index; numbering the heads fastest has the blocks
  // that run at a time read whole token rows of O and dO (heads x head_dim contiguous), where one
  // head's blocks side by side would read a head_dim slice of each and revisit its DRAM pages
  // for every other head.
  const int64_t heads = gridDim.y;
  const int64_t linear = blockIdx.x + static_cast<int64_t>(blockIdx.y) * gridDim.x;
  const int64_t h = linear % heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  // The warp's rows are consecutive; load j reads rows kRowsPerLoad j .. of them, lane group
  // `sub` one row, lane `part` of the group 8 elements.
  const int sub = lane / kLanesPerRow, part = lane % kLanesPerRow;
  const int64_t first = linear / heads * kBwdTileRows + warp * kRows;
  constexpr float kLog2e = 1.4426950408889634f;
  uint4 o[kLoads], g[kLoads];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int64_t token = first + j * kRowsPerLoad + sub;
    if (token < total_q && 8 * part < kDv) {
      o[j] = *reinterpret_cast<const uint4*>(out + token * out_token_stride + h * out_head_stride +
                                             8 * part);
      g[j] = *reinterpret_cast<const uint4*>(dout + token * dout_token_stride +
                                             h * dout_head_stride + 8 * part);
    } else {
      o[j] = g[j] = make_uint4(0, 0, 0, 0);
    }
  }
  // Lane r < kRows loads row r's LSE and dLSE.
  float lse_lane = 0.f, dlse_lane = 0.f;
  if (const int64_t token = first + lane; lane < kRows && token < total_q) {
    lse_lane = __ldg(lse + h * total_q + token);
    if (dlse != nullptr) dlse_lane = __ldg(dlse + h * total_q + token);
  }
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int r = j * kRowsPerLoad + sub;
    const int64_t token = first + r;
    const uint32_t op[4] = {o[j].x, o[j].y, o[j].z, o[j].w};
    const uint32_t gp[4] = {g[j].x, g[j].y, g[j].z, g[j].w};
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = tlx::unpack2<T>(op[i]), y = tlx::unpack2<T>(gp[i]);
      d = fmaf(x.x, y.x, fmaf(x.y, y.y, d));
    }
#pragma unroll
    for (int m = kLanesPerRow / 2; m > 0; m >>= 1) d += __shfl_xor_sync(0xffffffffu, d, m);
    const float l = __shfl_sync(0xffffffffu, lse_lane, r);
    const float dl = __shfl_sync(0xffffffffu, dlse_lane, r);
    float l2 = INFINITY, dp = 0.f;
    if (token < total_q) {
      // A row without keys (LSE -inf; or any LSE the forward cannot have written) adds nothing,
      // whatever its dO and dLSE hold: P = 0 and D = 0 keep 0 * inf out of dS.
      if (isfinite(l)) {
        l2 = l * kLog2e;
        dp = d - dl;
      } else if (device_check != nullptr && part == 0 && batch > 0) {
        const SeqBounds sb =
            seq_bounds(cu_q, cu_k, total_q, total_k,
                       sequence_holding_token<int64_t>(cu_q, 0, batch - 1, total_q, token), 1);
        const int64_t row = token - sb.q_start;
        const bool inside = row >= 0 && row < sb.len_q;
        bool sees_key;
        if constexpr (kLocal)
          sees_key = inside && jfa::detail::sees_any_key(window, row, sb.len_q, sb.len_k);
        else
          sees_key = inside && sb.len_k > 0 && (causal == 0 || row + sb.causal_shift() >= 0);
        if (!(l < INFINITY) || sees_key) atomicOr(device_check, JFA_CHECK_RESULT_NOT_FINITE);
      }
      // The token's row of the dQ accumulator starts at 0 (chunks of 4 floats stay together),
      // unless its shared tile stores it.
      if (!is_stored_row(stored_rows, token)) {
#pragma unroll
        for (int c = 4 * part; c < kD; c += 4 * kLanesPerRow)
          *reinterpret_cast<float4*>(dq_acc + dq_acc_offset(total_q, kD, token, h, c)) =
              make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if (part == 0 && token < row_len) {
      lse2[h * row_len + token] = l2;
      dpsum[h * row_len + token] = dp;
      // The copy one row later (bwd_workspace.hpp), whose row 0 no step reads.
      const int64_t shifted = kShiftedRowTerms * heads * row_len + h * row_len + 1;
      if (token + 1 < row_len) {
        lse2[shifted + token] = l2;
        dpsum[shifted + token] = dp;
      }
    }
  }
}

inline constexpr int kSinkThreads = 1024;

// The sinks' gradient, one block per query head h: dsinks[h] = -sum over the head's rows t of
// exp(sinks[h] - lse_t) (dO_t . O_t - dlse_t), the second factor being the preprocess's D row
// (every row's, as with sinks no LSE is -inf; one that is not finite, from a sink that is not,
// gives a non-finite sum, which the checked mode reports as it does the other gradients'). One
// SM sums all of a head's rows: each thread keeps four sums over rows kThreads apart, so that four
// pairs of loads are in flight at a time. Summed in a fixed order: the same bits every run. (A
// template, as every kernel defined in a header here: one definition in each instantiation's
// object.)
template <int kThreads = kSinkThreads>
__global__ void __launch_bounds__(kThreads)
    bwd_sink_gradient(const float* lse, const float* dpsum, int64_t row_len, int64_t total_q,
                      const float* sinks, float* dsinks, int32_t* device_check) {
  constexpr int kSums = 4;
  const int64_t h = blockIdx.x;
  const float sink = __ldg(sinks + h);
  const float* head_lse = lse + h * total_q;
  const float* head_d = dpsum + h * row_len;
  float sums[kSums] = {};
  int64_t t = threadIdx.x;
  for (; t + (kSums - 1) * kThreads < total_q; t += kSums * kThreads)
#pragma unroll
    for (int i = 0; i < kSums; ++i)
      sums[i] +=
          __expf(sink - __ldg(head_lse + t + i * kThreads)) * __ldg(head_d + t + i * kThreads);
  for (; t < total_q; t += kThreads)
    sums[0] += __expf(sink - __ldg(head_lse + t)) * __ldg(head_d + t);
  float sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  __shared__ float part[kThreads / 32];
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += part[w];
    dsinks[h] = -total;
    if (device_check != nullptr && !isfinite(total))
      atomicOr(device_check, JFA_CHECK_RESULT_NOT_FINITE);
  }
}

inline constexpr int kConvertThreads = 256;

// dq = softmax_scale * the accumulator, rounded to T, for the rows of tokens no shared tile stores
// (the main kernel wrote those): a warp per token, grid-stride, its lanes over (head, 4 columns).
// The checked mode learns of an element that is NaN or infinite.
template <typename T, int kD>
__global__ void __launch_bounds__(kConvertThreads)
    bwd_convert_dq(const float* dq_acc, T* dq, int64_t dq_token_stride, int64_t dq_head_stride,
                   int64_t total_q, int32_t heads_q, float scale, const uint32_t* stored_rows,
                   int32_t* device_check) {
  constexpr int kQuads = kD / 4;
  const int lane = threadIdx.x & 31;
  const int n = heads_q * kQuads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  bool not_finite = false;
  for (int64_t token = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       token < total_q; token += warps) {
    if (is_stored_row(stored_rows, token)) continue;
    for (int i = lane; i < n; i += 32) {
      const int head = i / kQuads, c = (i - head * kQuads) * 4;
      const float4 x =
          *reinterpret_cast<const float4*>(dq_acc + dq_acc_offset(total_q, kD, token, head, c));
      const uint2 packed = make_uint2(tlx::pack2<T>(x.x * scale, x.y * scale),
                                      tlx::pack2<T>(x.z * scale, x.w * scale));
      *reinterpret_cast<uint2*>(dq + token * dq_token_stride + head * dq_head_stride + c) = packed;
      not_finite |= tlx::pair_not_finite<T>(packed.x) || tlx::pair_not_finite<T>(packed.y);
    }
  }
  if (not_finite && device_check != nullptr) atomicOr(device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

}  // namespace jfa::sm90
