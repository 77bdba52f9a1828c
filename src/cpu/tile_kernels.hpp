// Register-blocked float32 micro-kernels of the CPU paths, on tiles of kRows x kCols: scores
// (a row tile times a transposed column tile) and accumulation of a tile product. Inline, so that
// each target clone of a caller compiles them for its instruction set.
#pragma once

#include <cstddef>
#include <cstring>

namespace jfa::detail {

inline constexpr int kRows = 64;  // queries per tile
inline constexpr int kCols = 64;  // keys per tile

// Register-blocked micro-kernels: kBlockRows x kBlockCols accumulators stay in registers while the
// inner dimension streams through, which is what lets the compiler keep the FMA units busy.
inline constexpr int kBlockRows = 4;
inline constexpr int kBlockCols = 16;

// A row of `columns` floats padded to whole register blocks (the micro-kernels' row stride).
constexpr int round_up_to_block(int columns) {
  return (columns + kBlockCols - 1) / kBlockCols * kBlockCols;
}

// Eight floats; the compiler maps it to one AVX register or two SSE registers. The helpers are
// always inlined, so the ABI note GCC gives for such types does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Vec8 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((always_inline)) inline void store8(float* p, Vec8 v) {
  std::memcpy(p, &v, sizeof(v));
}

// s[kRows][kCols] = q[kRows][:d] * kt[d][kCols]
__attribute__((always_inline)) inline void scores_tile(const float* __restrict q,
                                                       const float* __restrict kt,
                                                       float* __restrict s, int d, int width) {
  for (int i0 = 0; i0 < kRows; i0 += kBlockRows) {
    for (int j0 = 0; j0 < kCols; j0 += kBlockCols) {
      Vec8 acc[kBlockRows][2] = {};
      for (int c = 0; c < d; ++c) {
        const float* krow = kt + static_cast<size_t>(c) * kCols + j0;
        const Vec8 k0 = load8(krow), k1 = load8(krow + 8);
        for (int r = 0; r < kBlockRows; ++r) {
          const float qv = q[static_cast<size_t>(i0 + r) * width + c];
          acc[r][0] += qv * k0;
          acc[r][1] += qv * k1;
        }
      }
      for (int r = 0; r < kBlockRows; ++r) {
        store8(&s[(i0 + r) * kCols + j0], acc[r][0]);
        store8(&s[(i0 + r) * kCols + j0 + 8], acc[r][1]);
      }
    }
  }
}

// o[kRows][width] += p[kRows][kCols] * v[kCols][width]
__attribute__((always_inline)) inline void accumulate_pv(const float* __restrict p,
                                                         const float* __restrict v,
                                                         float* __restrict o, int width) {
  for (int i0 = 0; i0 < kRows; i0 += kBlockRows) {
    for (int c0 = 0; c0 < width; c0 += kBlockCols) {
      Vec8 acc[kBlockRows][2];
      for (int r = 0; r < kBlockRows; ++r) {
        acc[r][0] = load8(&o[static_cast<size_t>(i0 + r) * width + c0]);
        acc[r][1] = load8(&o[static_cast<size_t>(i0 + r) * width + c0 + 8]);
      }
      for (int j = 0; j < kCols; ++j) {
        const float* vrow = v + static_cast<size_t>(j) * width + c0;
        const Vec8 v0 = load8(vrow), v1 = load8(vrow + 8);
        for (int r = 0; r < kBlockRows; ++r) {
          const float pv = p[(i0 + r) * kCols + j];
          acc[r][0] += pv * v0;
          acc[r][1] += pv * v1;
        }
      }
      for (int r = 0; r < kBlockRows; ++r) {
        store8(&o[static_cast<size_t>(i0 + r) * width + c0], acc[r][0]);
        store8(&o[static_cast<size_t>(i0 + r) * width + c0 + 8], acc[r][1]);
      }
    }
  }
}

}  // namespace jfa::detail
