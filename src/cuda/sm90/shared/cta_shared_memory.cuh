// What both kernels' shared-memory layouts share: the dynamic shared memory a CTA may take on
// sm_90 and the alignment of the layout.
#pragma once

#include <cstdint>

namespace jfa::sm90 {

// The dynamic shared memory a CTA may opt in to on sm_90, and the slack that aligning the layout to
// 1024 bytes (the 128-byte swizzle's period) may take.
inline constexpr int kMaxDynamicSmemBytes = 232448;
inline constexpr int kSmemAlignBytes = 1024;

// The CTA's shared-memory layout at the first kSmemAlignBytes boundary of its dynamic shared memory
// (the kernels ask for kSmemAlignBytes more than the layout takes).
template <typename Shared>
__device__ __forceinline__ Shared& shared_layout(unsigned char* smem_raw) {
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlignBytes - 1) &
                            ~static_cast<uintptr_t>(kSmemAlignBytes - 1);
  return *reinterpret_cast<Shared*>(aligned);
}

// The dynamic shared memory a kernel asks for to hold `Shared` from an aligned start, and whether a
// CTA may have that much.
template <typename Shared>
inline constexpr int kCtaSmemBytes = static_cast<int>(sizeof(Shared)) + kSmemAlignBytes;
template <typename Shared>
inline constexpr bool kFitsInCta = kCtaSmemBytes<Shared> <= kMaxDynamicSmemBytes;

}  // namespace jfa::sm90
