// The end of a backward with head splits (bwd_head_splits.hpp): dK and dV out of the float32
// accumulators that the slices of each (K tile, kv head) added into (bwd_epilogue.cuh's
// add_key_rows), into the caller's tensors.
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_preprocess.cuh"

namespace jfa::sm90 {

// out = scale * sum rounded to T for every key token and kv head of sum ([total_k, heads_kv,
// kCols] floats), as dQ's conversion (convert_accumulator).
template <typename T, int kCols>
__global__ void __launch_bounds__(kConvertThreads)
    bwd_convert_key_grads(const float* sum, T* out, int64_t token_stride, int64_t head_stride,
                          int64_t total_k, int32_t heads_kv, float scale, int32_t* device_check) {
  convert_accumulator<T, kCols>(
      [=](int64_t token, int head, int c) { return sum + (token * heads_kv + head) * kCols + c; },
      [](int64_t) { return true; }, out, token_stride, head_stride, total_k, heads_kv, scale,
      device_check);
}

}  // namespace jfa::sm90
