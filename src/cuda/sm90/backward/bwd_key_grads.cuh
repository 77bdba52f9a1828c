// The end of a backward with head splits (bwd_head_splits.hpp): dK and dV out of the float32
// accumulators that the slices of each (K tile, kv head) added into (bwd_epilogue.cuh's
// add_key_rows), into the caller's tensors.
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_preprocess.cuh"
#include "cuda/tlx/wgmma.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// out = scale * sum rounded to T, for every key token and kv head of sum ([total_k, heads_kv,
// kCols] floats): a warp per token, grid-stride, its lanes over (head, 4 columns), as dQ's
// conversion (bwd_convert_dq). The checked mode learns of an element that is NaN or infinite.
template <typename T, int kCols>
__global__ void __launch_bounds__(kConvertThreads)
    bwd_convert_key_grads(const float* sum, T* out, int64_t token_stride, int64_t head_stride,
                          int64_t total_k, int32_t heads_kv, float scale, int32_t* device_check) {
  static_assert(kCols % 4 == 0, "four columns a lane");
  constexpr int kQuads = kCols / 4;
  const int lane = threadIdx.x & 31;
  const int n = heads_kv * kQuads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  bool not_finite = false;
  for (int64_t token = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       token < total_k; token += warps) {
    for (int i = lane; i < n; i += 32) {
      const int head = i / kQuads, c = (i - head * kQuads) * 4;
      const float4 x =
          *reinterpret_cast<const float4*>(sum + (token * heads_kv + head) * kCols + c);
      const uint2 packed = make_uint2(tlx::pack2<T>(x.x * scale, x.y * scale),
                                      tlx::pack2<T>(x.z * scale, x.w * scale));
      *reinterpret_cast<uint2*>(out + token * token_stride + head * head_stride + c) = packed;
      not_finite |= tlx::pair_not_finite<T>(packed.x) || tlx::pair_not_finite<T>(packed.y);
    }
  }
  if (not_finite && device_check != nullptr) atomicOr(device_check, JFA_CHECK_RESULT_NOT_FINITE);
}

}  // namespace jfa::sm90
