// Online softmax over the K tiles of an item, in registers: per row a reference maximum and a
// running sum, P = exp2((S - max) * scale_log2) in place of S, and the factors by which O must be
// rescaled when a reference maximum moves. The difference is taken before scaling so that any
// scale whose scores are finite gives finite, exact exponents (S * scale_log2 - max * scale_log2
// overflows, and loses the exponent to rounding once |max * scale_log2| is large).
#pragma once

#include <cstdint>

#include "cuda/tlx/fragment.hpp"

namespace jfa::sm90 {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The state of a consumer thread's two rows.
struct OnlineSoftmax {
  // The reference maxima of the exponentials (not always the running maxima: see update); the
  // sums and O are relative to them.
  float row_max[2];
  float row_sum[2];  // this thread's part, combined across the quad by total()
  bool rescale;      // the last update moved row_max of some row of this warp: O needs alpha

  __device__ __forceinline__ void reset() {
    row_max[0] = row_max[1] = -INFINITY;
    rescale = false;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // S (scores of one K tile) becomes P; alpha gets the factors by which O must be rescaled (O
  // itself is left alone: it may still be the target of an MMA in flight).
  template <int kCols>
  __device__ __forceinline__ void update(tlx::AccumFragment<kCols>& s, float scale_log2,
                                         float (&alpha)[2]) {
    float tile_max[2];
    s.thread_row_max(tile_max);
    float m[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) m[h] = tlx::quad_max(fmaxf(row_max[h], tile_max[h]));
    // The reference maximum moves only when some row of the warp grew by more than
    // kMaxGrowthLog2 (the exponentials stay <= 2^kMaxGrowthLog2, exact in fp32 and in 16-bit P),
    // so most tiles after the first skip the rescaling of O; the result is the same softmax.
    constexpr float kMaxGrowthLog2 = 8.f;
    const bool grew = (m[0] - row_max[0]) * scale_log2 > kMaxGrowthLog2 ||
                      (m[1] - row_max[1]) * scale_log2 > kMaxGrowthLog2;
    rescale = __any_sync(0xffffffffu, grew);
    float base[2];  // what is subtracted: the reference maximum, 0 while a row has seen no key
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float ref = rescale ? m[h] : row_max[h];
      base[h] = ref == -INFINITY ? 0.f : ref;
      alpha[h] = rescale ? fast_exp2((row_max[h] - base[h]) * scale_log2) : 1.f;
      row_max[h] = ref;
    }
    float tile_sum[2];
    s.map_and_sum_rows([&](float x, int h) { return fast_exp2((x - base[h]) * scale_log2); },
                       tile_sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * alpha[h] + tile_sum[h];
  }

  // O scaled by the factors of the last update, where it moved a reference maximum.
  template <int kCols>
  __device__ __forceinline__ void rescale_o(tlx::AccumFragment<kCols>& o,
                                            const float (&alpha)[2]) const {
    if (rescale) o.scale_rows(alpha);  // warp-uniform: alpha is 1 for every row of the warp
  }

  // The full sum of row h (all four threads of the quad call it).
  __device__ __forceinline__ float total(int h) const { return tlx::quad_sum(row_sum[h]); }
};

}  // namespace jfa::sm90
