// Register fragments of a warp group's wgmma tiles: the fp32 accumulator of an m64nN MMA as one
// thread holds it, and the 16-bit A operand made from it. The accumulator's thread owns two rows
// of the 64-row tile (`row(0)` and `row(1)`, 8 apart) and, in each block of 8 columns, the pair
// of columns `col(j, 0)`, `col(j, 1)`; the four threads of a quad hold the rest of those rows.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/tlx/arch.hpp"
#include "cuda/tlx/wgmma.hpp"

namespace jfa::tlx {

// A operand of an m64nNk16 MMA taken from registers: kCols / 16 chunks of 16 columns, 4 registers
// of two 16-bit values each per thread.
template <typename T, int kCols>
struct AFragment {
  static constexpr int kChunks = kCols / 16;
  uint32_t reg[kChunks][4];
};

template <int kCols>
struct AccumFragment {
  static_assert(kCols % 16 == 0, "wgmma tiles are 16 columns wide per k-chunk");
  static constexpr int kBlocks = kCols / 8;  // blocks of 8 columns
  static constexpr int kRegs = kCols / 2;
  float reg[kRegs];

  // Row of the warp group's 64-row tile that this thread's half `h` (0 or 1) holds.
  static JFA_DEVICE int row(int h) {
    const unsigned t = threadIdx.x % 128u;
    return static_cast<int>((t / 32u) * 16u + (t % 32u) / 4u) + 8 * h;
  }
  // Column of element `c` (0 or 1) of column block `j` that this thread holds.
  static JFA_DEVICE int col(int j, int c) {
    return 8 * j + 2 * static_cast<int>(threadIdx.x % 4u) + c;
  }

  JFA_DEVICE float& at(int j, int h, int c) { return reg[4 * j + 2 * h + c]; }
  JFA_DEVICE float at(int j, int h, int c) const { return reg[4 * j + 2 * h + c]; }

  JFA_DEVICE void fill(float value) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) reg[i] = value;
  }

  // f(element, h, column) on every element this thread holds.
  template <typename F>
  JFA_DEVICE void for_each(F&& f) {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) f(at(j, h, c), h, col(j, c));
  }

  // Multiplies the elements of this thread's row h by factor[h].
  JFA_DEVICE void scale_rows(const float (&factor)[2]) {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        at(j, h, 0) *= factor[h];
        at(j, h, 1) *= factor[h];
      }
  }

  // Partial rows reduce through kParts independent values each, combined as a tree at the end: one
  // running value would make a dependency chain as long as the row.
  static constexpr int kParts = kBlocks < 8 ? kBlocks : 8;

  // Maximum of this thread's part of each row (combine across the quad with quad_max).
  JFA_DEVICE void thread_row_max(float (&out)[2]) const {
    float part[2][kParts];
#pragma unroll
    for (int j = 0; j < kBlocks; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float pair = fmaxf(at(j, h, 0), at(j, h, 1));
        part[h][j % kParts] = j < kParts ? pair : fmaxf(part[h][j % kParts], pair);
      }
#pragma unroll
    for (int width = kParts / 2; width > 0; width /= 2)
#pragma unroll
      for (int q = 0; q < width; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) part[h][q] = fmaxf(part[h][q], part[h][q + width]);
    out[0] = part[0][0];
    out[1] = part[1][0];
  }

  // Replaces every element x of row h by f(x, h) (f(x, h, j) where f takes the column block j too)
  // and returns in `sum` the sums of this thread's part of each row of the new values (combine
  // across the quad with quad_sum).
  template <typename F>
  JFA_DEVICE void map_and_sum_rows(F&& f, float (&sum)[2]) {
    float part[2][kParts];
#pragma unroll
    for (int j = 0; j < kBlocks; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float y;
          if constexpr (std::is_invocable_v<F, float, int, int>)
            y = f(at(j, h, c), h, j);
          else
            y = f(at(j, h, c), h);
          at(j, h, c) = y;
          if (j < kParts && c == 0)
            part[h][j] = y;
          else
            part[h][j % kParts] += y;
        }
#pragma unroll
    for (int width = kParts / 2; width > 0; width /= 2)
#pragma unroll
      for (int q = 0; q < width; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) part[h][q] += part[h][q + width];
    sum[0] = part[0][0];
    sum[1] = part[1][0];
  }

  // The A operand of the next MMA: elements rounded to T, chunk by chunk of 16 columns.
  template <typename T>
  JFA_DEVICE void to_a(AFragment<T, kCols>& a) const {
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        a.reg[kk][i] = pack2<T>(reg[8 * kk + 2 * i], reg[8 * kk + 2 * i + 1]);
  }
};

// A row value combined over the four threads that hold the row.
JFA_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
JFA_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Keeps the compiler from moving reads or writes of a fragment across an MMA that uses it.
template <int kCols>
JFA_DEVICE void fence_operand(AccumFragment<kCols>& f) {
  fence_operand(f.reg);
}
template <typename T, int kCols>
JFA_DEVICE void fence_operand(AFragment<T, kCols>& f) {
  fence_operand(f.reg);
}

// acc = A B^T for rows a_row0 .. a_row0 + 63 of A and every row of B, both tiles read K-major
// (their columns are K: Q K^T in the forward, K Q^T and V dO^T in the backward): one SS wgmma per
// 16 columns, committed as one group.
template <typename T, int kRowsA, int kK, int kSwA, int kN, int kSwB>
JFA_DEVICE void gemm_ss_k_major(AccumFragment<kN>& acc, const SwizzledTile<T, kRowsA, kK, kSwA>& a,
                                int a_row0, const SwizzledTile<T, kN, kK, kSwB>& b) {
  using ATile = SwizzledTile<T, kRowsA, kK, kSwA>;
  using BTile = SwizzledTile<T, kN, kK, kSwB>;
  const uint64_t a_desc = k_major_desc<ATile>(a.box_addr(0) + ATile::row_bytes(a_row0));
  const uint64_t b_desc = k_major_desc<BTile>(b.box_addr(0));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma_ss<T, kN, 0>(acc.reg, desc_advance(a_desc, ATile::k_step_bytes(kk)),
                       desc_advance(b_desc, BTile::k_step_bytes(kk)), kk > 0 ? 1u : 0u);
  wgmma_commit();
}

// acc (+)= A B, A as register fragments over K and B a SwizzledTile read MN-major (its columns
// are N, its rows K: P V in the forward, P^T dO and dS^T Q in the backward): one RS wgmma per 16
// rows of B, committed as one group.
template <typename T, typename BTile, int kN, int kK>
JFA_DEVICE void gemm_rs_mn_major(AccumFragment<kN>& acc, const AFragment<T, kK>& a,
                                 const BTile& b) {
  static_assert(BTile::cols == kN && BTile::rows >= kK, "B holds N columns and K rows");
  const uint64_t desc = mn_major_desc<BTile>(b.box_addr(0));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma_rs<T, kN, 1>(acc.reg, a.reg[kk], desc_advance(desc, BTile::row_bytes(16 * kk)), 1u);
  wgmma_commit();
}

}  // namespace jfa::tlx
