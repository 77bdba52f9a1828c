// wgmma (warp-group MMA, sm_90a): D[64 x N] (+)= A[64 x 16] * B[16 x N] per instruction, fp16/bf16
// operands, fp32 accumulators in registers, issued by a whole warp group (128 threads).
//
// Accumulator fragment of m64nN (N/2 floats per thread): thread t (warp w = t/32 within the
// group, lane l) holds, for j in [0, N/8):
//   d[4j + 0], d[4j + 1] -> row 16w + l/4,     cols 8j + 2(l%4) + {0, 1}
//   d[4j + 2], d[4j + 3] -> row 16w + l/4 + 8, cols 8j + 2(l%4) + {0, 1}
// A fragment of the register form (m64k16, 4 x b32 of two 16-bit values each):
//   a[0] row r, cols 2(l%4)+{0,1};  a[1] row r+8, same cols;  a[2] row r, cols 8+2(l%4)+{0,1};
//   a[3] row r+8, cols 8+2(l%4)+{0,1}   (r = 16w + l/4)
// so k-chunk kk of a 64 x N accumulator becomes an A fragment by packing d[8kk .. 8kk+7] in order.
//
// Shared-memory operands are described by 64-bit matrix descriptors (see make_desc).
// Ordering rules: wgmma_fence() before the first wgmma after ordinary code wrote its accumulator or
// A registers; wgmma_commit() after issuing; wgmma_wait<N>() before reading results.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/tlx/arch.hpp"
#include "cuda/tlx/smem_tile.hpp"

namespace jfa::tlx {

// Matrix descriptor of a swizzled operand.
//   bits  0-13 start address >> 4      bits 16-29 leading byte offset >> 4
//   bits 32-45 stride byte offset >> 4 bits 49-51 base offset (0: atoms are aligned)
//   bits 62-63 layout: 1 = 128-byte swizzle, 2 = 64-byte swizzle
// K-major operand (rows of K-elements per box): the K extent of one instruction (16 elements,
// 32 bytes) stays inside a row, LBO is unused, SBO = the swizzle atom (the next 8-row group).
// Advance along K by adding 32 bytes to the start address inside a box, and by a box past its
// row's end (SwizzledTile::k_step_bytes).
// MN-major operand (B read transposed: rows of N-elements per box, K along rows): LBO = the byte
// distance between N boxes, SBO = the swizzle atom (the next 8 K-rows). Advance along K by 16 rows.
JFA_DEVICE uint64_t make_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                              int swizzle_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  desc |= static_cast<uint64_t>(swizzle_bytes == 128 ? 1 : 2) << 62;
  return desc;
}

// The descriptors of a SwizzledTile read K-major (its columns are K) or MN-major (its columns are
// N), starting at byte address `addr` inside it.
template <typename Tile>
JFA_DEVICE uint64_t k_major_desc(uint32_t addr) {
  return make_desc(addr, 16, Tile::kAtomBytes, Tile::kSwizzleRowBytes);
}
template <typename Tile>
JFA_DEVICE uint64_t mn_major_desc(uint32_t addr) {
  return make_desc(addr, Tile::kBoxBytes, Tile::kAtomBytes, Tile::kSwizzleRowBytes);
}

// Adds a byte offset to a descriptor's start address (the 14-bit address field cannot carry into
// the next field inside the shared window, so adding to the whole descriptor is exact). The add is
// opaque to the compiler so that it stays next to its wgmma (one uniform 64-bit add): folded into
// the descriptor and hoisted out of a loop, the advanced descriptors of a loop-invariant operand
// would sit in ordinary registers and each be moved to uniform registers before every use.
JFA_DEVICE uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  uint64_t out;
  asm volatile("add.s64 %0, %1, %2;" : "=l"(out) : "l"(desc), "l"(uint64_t{bytes >> 4}));
  return out;
}

JFA_DEVICE void wgmma_fence() {
#if JFA_TLX_SM90A
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

JFA_DEVICE void wgmma_commit() {
#if JFA_TLX_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int kPending>
JFA_DEVICE void wgmma_wait() {
#if JFA_TLX_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}

// wgmma_wait<N>(), issued only once `anchor` has been computed. The wait carries no register
// operands, so the compiler's scheduler may otherwise put it ahead of independent arithmetic that
// comes before it in the source (e.g. a softmax meant to run while the MMA is in flight). A
// warp-uniform branch on `anchor` fences it; both sides wait, so the condition never matters.
template <int kPending>
JFA_DEVICE void wgmma_wait_after(float anchor) {
#if JFA_TLX_SM90A
  if (__all_sync(0xffffffffu, __float_as_uint(anchor) != 0xffffffffu))
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
  else
    asm volatile("wgmma.wait_group.sync.aligned %0; // anchored" ::"n"(kPending) : "memory");
#endif
}

// Pins accumulator registers so the compiler neither reads nor moves them across the points where
// the asynchronous MMA owns them.
template <int kN>
JFA_DEVICE void fence_operand(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
JFA_DEVICE void fence_operand(uint32_t (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

template <int kM, int kN>
JFA_DEVICE void fence_operand(uint32_t (&d)[kM][kN]) {
#pragma unroll
  for (int i = 0; i < kM; ++i) fence_operand(d[i]);
}

#include "cuda/tlx/wgmma_ops.inc"

// D[64 x N] (+)= A * B, A and B from shared memory. accumulate = 0 overwrites D. kTransA = 1 reads
// A as MN-major (M contiguous; its descriptor as for an MN-major B, see make_desc).
template <typename T, int kN, int kTransB, int kTransA = 0>
JFA_DEVICE void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                         uint32_t accumulate) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  static_assert(kHalf || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 operands");
  if constexpr (kHalf)
    wgmma_ss_k16_Fp16<kTransB, kTransA>(d, desc_a, desc_b, accumulate);
  else
    wgmma_ss_k16_Bf16<kTransB, kTransA>(d, desc_a, desc_b, accumulate);
}

// D[64 x N] (+)= A * B, A from registers (fragment above), B from shared memory.
template <typename T, int kN, int kTransB>
JFA_DEVICE void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                         uint32_t accumulate) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  static_assert(kHalf || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 operands");
  if constexpr (kHalf)
    wgmma_rs_k16_Fp16<kTransB>(d, a, desc_b, accumulate);
  else
    wgmma_rs_k16_Bf16<kTransB>(d, a, desc_b, accumulate);
}

// Two floats packed as one b32 of 16-bit values (low half = first), round to nearest.
template <typename T>
JFA_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Whether either 16-bit value of a packed pair is NaN or infinite (every exponent bit set).
template <typename T>
JFA_DEVICE bool pair_not_finite(uint32_t packed) {
  constexpr uint32_t kExponent = std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u;
  return (packed & kExponent) == kExponent || (packed & (kExponent << 16)) == (kExponent << 16);
}

// The two floats of a b32 of 16-bit values (pack2's inverse, exact).
template <typename T>
JFA_DEVICE float2 unpack2(uint32_t packed) {
  if constexpr (std::is_same_v<T, __half>)
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  else
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
}

// The elementwise product of two b32s of bf16 values, rounded once to bf16 (the backward's packed
// dS; fp16 has no user of it).
template <typename T>
JFA_DEVICE uint32_t mul2(uint32_t x, uint32_t y) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "bf16 pairs");
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
  return r;
}

}  // namespace jfa::tlx
