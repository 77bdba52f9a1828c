// Shared-memory tiles in the swizzled layouts that TMA writes and wgmma reads.
//
// A tile of kRows x kCols 16-bit elements is stored as column boxes of kSwizzle bytes a row (64
// elements for the 128-byte swizzle, 32 for the 64-byte one); each box holds kRows rows. Inside a
// box, the 16-byte chunk c of row r sits at chunk c ^ ((r / (128 / kSwizzle)) % (kSwizzle / 16)):
// TMA's CU_TENSOR_MAP_SWIZZLE_{128B,64B} and wgmma's matching layout types agree on this as long as
// every box starts on a multiple of its swizzle atom (8 rows, 1024 or 512 bytes). A tile takes the
// widest swizzle its columns divide into: 128 bytes for multiples of 64 columns, else 64 (32 and 96
// columns).
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes: the widest atom

// The widest swizzle (bytes a box row) whose boxes tile kCols 16-bit columns; 0 if none does.
constexpr int swizzle_for_columns(int cols) {
  return cols % 64 == 0 ? 128 : cols % 32 == 0 ? 64 : 0;
}

template <typename T, int kRows, int kCols, int kSwizzle = swizzle_for_columns(kCols)>
struct SwizzledTile {
  static_assert(sizeof(T) == 2, "16-bit elements");
  static_assert(kSwizzle == 128 || kSwizzle == 64, "columns come in 128- or 64-byte boxes");
  static constexpr int kSwizzleRowBytes = kSwizzle;
  static constexpr int kBoxCols = kSwizzle / static_cast<int>(sizeof(T));  // 64 or 32
  static_assert(kCols % kBoxCols == 0, "columns come in whole boxes");
  static_assert(kRows % 8 == 0, "rows come in 8-row swizzle atoms");
  static constexpr int kAtomBytes = 8 * kSwizzle;
  static constexpr int kBoxes = kCols / kBoxCols;
  static constexpr int kBoxBytes = kRows * kSwizzle;
  static constexpr int kBytes = kBoxes * kBoxBytes;
  // wgmma's K extent (16 elements, 32 bytes) fits this many times in a box row.
  static constexpr int kKStepsPerBox = kSwizzle / 32;
  static constexpr int rows = kRows;
  static constexpr int cols = kCols;

  alignas(kSwizzleAtomBytes) T data[kRows * kCols];

  // Byte offset of element (r, c) from the start of the tile.
  __host__ __device__ static constexpr int offset_bytes(int r, int c) {
    const int box = c / kBoxCols;
    const int in_row = (c % kBoxCols) * static_cast<int>(sizeof(T));
    const int chunk = (in_row >> 4) ^ ((r / (128 / kSwizzle)) % (kSwizzle / 16));
    return box * kBoxBytes + r * kSwizzle + (chunk << 4) + (in_row & 15);
  }
  // Byte offset of the 16-column K step kk (a K-major operand's columns) from the tile's start.
  __host__ __device__ static constexpr int k_step_bytes(int kk) {
    return (kk / kKStepsPerBox) * kBoxBytes + (kk % kKStepsPerBox) * 32;
  }
  // Byte offset of row r inside each box (a multiple of 8 keeps the swizzle phase).
  __host__ __device__ static constexpr int row_bytes(int r) { return r * kSwizzle; }
  JFA_DEVICE T& at(int r, int c) {
    return *reinterpret_cast<T*>(reinterpret_cast<char*>(data) + offset_bytes(r, c));
  }
  JFA_DEVICE const T& at(int r, int c) const {
    return *reinterpret_cast<const T*>(reinterpret_cast<const char*>(data) + offset_bytes(r, c));
  }
  JFA_DEVICE T* box(int b) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(data) + b * kBoxBytes);
  }
  JFA_DEVICE uint32_t box_addr(int b) const { return smem_addr(data) + b * kBoxBytes; }
};

// A 32-bit store to a shared-memory address (32-bit addresses keep register use low where a
// generic pointer would take two registers per address).
JFA_DEVICE void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(value) : "memory");
}

// Two floats to an 8-byte-aligned shared-memory address.
JFA_DEVICE void st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Four floats from a 16-byte-aligned shared-memory address.
JFA_DEVICE float4 ld_shared_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Two floats from an 8-byte-aligned shared-memory address.
JFA_DEVICE float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// A 32-bit word from a shared-memory address.
JFA_DEVICE uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Two 32-bit words from an 8-byte-aligned shared-memory address.
JFA_DEVICE uint2 ld_shared_u32x2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

}  // namespace jfa::tlx
