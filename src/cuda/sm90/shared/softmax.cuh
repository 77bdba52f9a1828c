// Online softmax over the K tiles of an item, in registers: per row a reference maximum and a
// running sum, P = exp2((S - max) * scale_log2) in place of S, and the factors by which O must be
// rescaled when a reference maximum moves.
//
// The exponent is one fused S * scale_log2 - max * scale_log2 while |max * scale_log2| < 2^10:
// the rounding of max * scale_log2 then moves it by at most 2^-14, far below the 16-bit rounding
// of P. Past that (huge scales or scores) a warp takes the difference before scaling, which
// stays finite and exact for any scale whose scores are finite, where the fused form overflows
// or loses the exponent to rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/tlx/fragment.hpp"

namespace jfa::sm90 {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp2 on the FMA and integer pipes instead of the MUFU unit (which softcap's tanh loads as much
// as the exponentials): 2^x = 2^f 2^n with n = round(x) (the 1.5 2^23 trick: the sum's low
// mantissa bits hold n) and f in [-1/2, 1/2], 2^f by a cubic fitted for relative error (7.8e-5 at
// most, below the 16-bit rounding of P), times 2^n built from n's bits. x is at most 2^8 here (the
// online softmax's reference maximum lags by at most that); below -125 (-inf where masked) it
// gives 0, as the MUFU's flush to zero does below -126, and NaN stays NaN.
// Host code too, for its test (tests/cuda_host).
__host__ __device__ __forceinline__ float fma_exp2(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  const bool tiny = x < -125.f;
  const float t = tiny ? -125.f : x;
  const float r = t + kRound;
  const float f = t - (r - kRound);
  const float p = fmaf(fmaf(fmaf(0.05517132f, f, 0.24261055f), f, 0.69326099f), f, 0.99992811f);
  // (n + 127) << 23: n sits in r's low bits, above which r's own bits shift out.
  uint32_t r_bits;
  std::memcpy(&r_bits, &r, sizeof r_bits);
  const uint32_t two_n_bits = (r_bits << 23) + 0x3f800000u;
  float two_n;
  std::memcpy(&two_n, &two_n_bits, sizeof two_n);
  return tiny ? 0.f : p * two_n;
}

// Softcap's tanh (the local-attention kernels, forward and backward).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
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
  // itself is left alone: it may still be the target of an MMA in flight). kFmaExp2Every: every
  // that many column blocks of 8 one takes its exponentials from fma_exp2 (0: none), where the
  // MUFU unit has other work (softcap's tanh).
  template <int kCols, int kFmaExp2Every = 0>
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
    constexpr float kFusedLimit = 1024.f;  // |max * scale_log2| below which the fused form is used
    const bool grew = (m[0] - row_max[0]) * scale_log2 > kMaxGrowthLog2 ||
                      (m[1] - row_max[1]) * scale_log2 > kMaxGrowthLog2;
    rescale = __any_sync(0xffffffffu, grew);
    const float m_old[2] = {row_max[0], row_max[1]};
    float base[2];  // what is subtracted: the reference maximum, 0 while a row has seen no key
    float neg_scaled[2];  // -base * scale_log2, for the fused form
    bool large = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float ref = rescale ? m[h] : row_max[h];
      base[h] = ref == -INFINITY ? 0.f : ref;
      neg_scaled[h] = -(base[h] * scale_log2);
      large |= !(fabsf(neg_scaled[h]) < kFusedLimit);
      row_max[h] = ref;  // the old value stays in m_old below
    }
    const bool exact = __any_sync(0xffffffffu, large);
    float tile_sum[2];
    if (!exact) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        alpha[h] = rescale ? fast_exp2(fmaf(m_old[h], scale_log2, neg_scaled[h])) : 1.f;
      if constexpr (kFmaExp2Every > 0)
        s.map_and_sum_rows(
            [&](float x, int h, int j) {
              const float e = fmaf(x, scale_log2, neg_scaled[h]);
              return j % kFmaExp2Every == kFmaExp2Every - 1 ? fma_exp2(e) : fast_exp2(e);
            },
            tile_sum);
      else
        s.map_and_sum_rows(
            [&](float x, int h) { return fast_exp2(fmaf(x, scale_log2, neg_scaled[h])); },
            tile_sum);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        alpha[h] = rescale ? fast_exp2((m_old[h] - base[h]) * scale_log2) : 1.f;
      s.map_and_sum_rows([&](float x, int h) { return fast_exp2((x - base[h]) * scale_log2); },
                         tile_sum);
    }
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
