// Host conversions between float and the 16-bit storage types (round to nearest even).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "jfa/jfa.h"

namespace jfa::detail {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {  // inf / nan
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan
    return sign | (abs > 0x7F800000u ? 0x7E00u : 0x7C00u);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504: inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return sign;           // under half of the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 .. 24
    const uint32_t rounded = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = rounded;
    if (rest > halfway || (rest == halfway && (rounded & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  const uint32_t rebased = abs - (112u << 23);
  uint32_t result = rebased >> 13;
  const uint32_t rest = rebased & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

inline float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Element i of a buffer of the given dtype, as float.
inline float load_as_float(const void* base, int64_t i, jfa_dtype dtype) {
  switch (dtype) {
    case JFA_DTYPE_FLOAT16:
      return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case JFA_DTYPE_BFLOAT16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline void store_from_float(void* base, int64_t i, jfa_dtype dtype, float value) {
  switch (dtype) {
    case JFA_DTYPE_FLOAT16:
      static_cast<uint16_t*>(base)[i] = float_to_half(value);
      break;
    case JFA_DTYPE_BFLOAT16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(value);
      break;
    default:
      static_cast<float*>(base)[i] = value;
      break;
  }
}

// Converts n contiguous elements of dtype into floats.
inline void load_row_as_float(const void* base, int64_t offset, int64_t n, jfa_dtype dtype,
                              float* dst) {
  switch (dtype) {
    case JFA_DTYPE_FLOAT16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
      break;
    }
    case JFA_DTYPE_BFLOAT16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      break;
    }
    default:
      std::memcpy(dst, static_cast<const float*>(base) + offset, static_cast<size_t>(n) * 4);
      break;
  }
}

}  // namespace jfa::detail
