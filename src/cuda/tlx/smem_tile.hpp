// Shared-memory tiles in the 128-byte-swizzled layout that TMA writes and wgmma reads.
//
// A tile of kRows x kCols 16-bit elements is stored as kCols/64 column boxes; each box holds kRows
// rows of 64 elements (128 bytes). Inside a box, the 16-byte chunk c of row r sits at chunk
// c ^ (r % 8): TMA's CU_TENSOR_MAP_SWIZZLE_128B and wgmma's 128B layout type agree on this as long
// as every box starts on a 1024-byte boundary.
#pragma once

#include "cuda/tlx/arch.hpp"

namespace jfa::tlx {

inline constexpr int kSwizzleBytes = 128;
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

template <typename T, int kRows, int kCols>
struct SwizzledTile {
  static_assert(sizeof(T) == 2, "16-bit elements");
  static constexpr int kBoxCols = kSwizzleBytes / static_cast<int>(sizeof(T));  // 64
  static_assert(kCols % kBoxCols == 0, "columns come in 128-byte boxes");
  static_assert(kRows % 8 == 0, "rows come in 8-row swizzle atoms");
  static constexpr int kBoxes = kCols / kBoxCols;
  static constexpr int kBoxBytes = kRows * kSwizzleBytes;
  static constexpr int kBytes = kBoxes * kBoxBytes;
  static constexpr int rows = kRows;
  static constexpr int cols = kCols;

  alignas(kSwizzleAtomBytes) T data[kRows * kCols];

  // Byte offset of element (r, c) from the start of the tile.
  __host__ __device__ static constexpr int offset_bytes(int r, int c) {
    const int box = c / kBoxCols;
    const int in_row = (c % kBoxCols) * static_cast<int>(sizeof(T));
    const int chunk = (in_row >> 4) ^ (r & 7);
    return box * kBoxBytes + r * kSwizzleBytes + (chunk << 4) + (in_row & 15);
  }
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

// Two 32-bit words from an 8-byte-aligned shared-memory address.
JFA_DEVICE uint2 ld_shared_u32x2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

}  // namespace jfa::tlx
