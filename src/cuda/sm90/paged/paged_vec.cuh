// 16-bit elements (fp16, bf16) to and from fp32 in registers, a 16-byte vector (8 elements) or a
// part of one at a time: the paged kernels' loads of q, keys and values and stores of out.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jfa::sm90 {

// Two packed elements (the first in the low half) as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t bits);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t bits) {
  __half2 h;
  static_assert(sizeof h == sizeof bits, "two halves");
  __builtin_memcpy(&h, &bits, sizeof bits);
  return __half22float2(h);
}

// bf16 is the high half of a float: a shift, no conversion.
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t bits;
  __builtin_memcpy(&bits, &h, sizeof bits);
  return bits;
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  __builtin_memcpy(&bits, &h, sizeof bits);
  return bits;
}

// Eight elements (one uint4) as floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = unpack2<T>(w[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// kN (2, 4 or 8) floats times `scale`, rounded to T and stored at `dst` (aligned to kN elements).
template <typename T, int kN>
__device__ __forceinline__ void store_scaled(T* dst, const float (&f)[kN], float scale) {
  static_assert(kN == 2 || kN == 4 || kN == 8, "2, 4 or 8 elements");
  uint32_t w[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) w[i] = pack2<T>(f[2 * i] * scale, f[2 * i + 1] * scale);
  if constexpr (kN == 2) {
    *reinterpret_cast<uint32_t*>(dst) = w[0];
  } else if constexpr (kN == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace jfa::sm90
