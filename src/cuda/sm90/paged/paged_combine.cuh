// The end of a paged row: its softmax state (maximum in score units, sum, O) normalised into out
// and the LSE, with its head's sink in the denominator (the LSE includes it, as in the packed
// kernels: lse = log(exp(sink) + sum exp(s))); and, with several splits, the kernel that first
// merges the splits' states of each row, each weighted by its sum relative to the largest maximum.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_vec.cuh"
#include "cuda/sm90/shared/row_end.cuh"
#include "cuda/tlx/grid_dependency.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// A row whose sum is 0 saw no key (row_end: out 0 and LSE -inf, or its sink).
__device__ __forceinline__ RowEnd paged_row_end(const PagedArgs& a, float m, float l,
                                                int32_t head) {
  return row_end(a.sinks, a.score_scale, head, m, l, l == 0.f);
}

// Whether the checked mode reports a row: one that saw a key without a finite positive sum (a
// score float32 cannot hold, or a NaN input), or an LSE written that is not finite where the row
// saw a key or has a sink.
__device__ __forceinline__ bool paged_row_not_finite(const PagedArgs& a, bool saw_key, float l,
                                                     const RowEnd& e) {
  if (saw_key && !(l > 0.f && l < INFINITY)) return true;
  return a.lse != nullptr && (l != 0.f || a.sinks != nullptr) && !(fabsf(e.lse) < INFINITY);
}

inline constexpr int kPagedCombineThreads = 128;

// One warp per row (token * heads_q + head), kD / 32 columns a lane. A split's O is read only
// where it saw a key (the others left it unwritten). kAfterPrior: launched as the programmatic
// dependent of the kernel that writes the partials, it waits for that kernel's writes first.
template <typename T, int kD, bool kAfterPrior = false>
__global__ void __launch_bounds__(kPagedCombineThreads) paged_combine_kernel(const PagedArgs a) {
  if constexpr (kAfterPrior) tlx::wait_for_prior_grid();
  constexpr int kCols = kD / 32;
  constexpr int kWarps = kPagedCombineThreads / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = a.total_q * a.heads_q;
  bool not_finite = false;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    float m = -INFINITY;
    for (int32_t s = 0; s < a.splits; ++s) m = fmaxf(m, a.part_ml[s * rows + row].x);
    float l = 0.f, o[kCols] = {};
    if (m != -INFINITY) {
      for (int32_t s = 0; s < a.splits; ++s) {
        const float2 ml = a.part_ml[s * rows + row];
        if (ml.x == -INFINITY) continue;
        const float w = exp2f((ml.x - m) * a.score_scale_log2);
        l = fmaf(w, ml.y, l);
        const float* src = a.part_o + (s * rows + row) * kD + lane * kCols;
#pragma unroll
        for (int c = 0; c < kCols; c += 2) {
          const float2 x = *reinterpret_cast<const float2*>(src + c);
          o[c] = fmaf(w, x.x, o[c]);
          o[c + 1] = fmaf(w, x.y, o[c + 1]);
        }
      }
    }
    const int64_t token = row / a.heads_q;
    const int32_t head = static_cast<int32_t>(row % a.heads_q);
    const RowEnd e = paged_row_end(a, m, l, head);
    T* dst = static_cast<T*>(a.out) + token * a.out_token_stride + head * a.out_head_stride +
             lane * kCols;
    store_scaled<T, kCols>(dst, o, e.inv);
    if (a.lse != nullptr && lane == 0) a.lse[head * a.total_q + token] = e.lse;
    if (a.device_check != nullptr) not_finite |= paged_row_not_finite(a, m != -INFINITY, l, e);
  }
  if (not_finite) atomicOr(a.device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

// The combine of a's splits (a.part_o, a.part_ml, a.splits) into a.out and a.lse, on `stream`: a
// warp a row, at most 16 blocks an SM. kAfterPrior: launched as the programmatic dependent of the
// kernel before it (which lets it start early), waiting for that kernel's partials in the kernel.
template <typename T, int kD, bool kAfterPrior = false>
jfa_status launch_paged_combine(const PagedArgs& a, int sm_count, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kPagedCombineThreads / 32;
  const int64_t rows = a.total_q * a.heads_q;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock,
                                           int64_t{16} * std::max(sm_count, 1));
  if constexpr (!kAfterPrior) {
    paged_combine_kernel<T, kD>
        <<<static_cast<unsigned>(blocks), kPagedCombineThreads, 0, stream>>>(a);
  } else {
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(kPagedCombineThreads);
    config.stream = stream;
    config.attrs = &dependent;
    config.numAttrs = 1;
    // A failed launch's error is the last one, which launch_error reports.
    static_cast<void>(cudaLaunchKernelEx(&config, paged_combine_kernel<T, kD, true>, a));
  }
  return launch_error("paged combine kernel");
}

}  // namespace jfa::sm90
