// Compile-time guard and small helpers shared by every tile-layer header.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Device passes for other targets still parse these headers, but the sm_90a instructions
// (wgmma, setmaxnreg) exist only under the architecture-specific target.
#define JFA_TLX_SM90A 0
#else
#define JFA_TLX_SM90A 1
#endif

#define JFA_DEVICE __device__ __forceinline__

namespace jfa::tlx {

// Shared-memory address (32-bit, in the shared window) of a generic pointer.
JFA_DEVICE uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Index of the calling thread's warp group (4 warps) within the block, warp-uniform.
JFA_DEVICE int warp_group_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// One lane of the warp elected to act for it (lane 0).
JFA_DEVICE bool lane_is_leader() { return (threadIdx.x & 31u) == 0; }

}  // namespace jfa::tlx
