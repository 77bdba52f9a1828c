// The opt-in of a kernel to more than the default 48 KB of dynamic shared memory: per device,
// done once per kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "common/status.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

template <auto kKernel>
jfa_status opt_in_shared_memory(int bytes, int device) {
  static std::atomic<bool> done[64];
  if (device >= 0 && device < 64 && done[device].load(std::memory_order_acquire))
    return JFA_SUCCESS;
  const cudaError_t e =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return jfa::detail::fail(JFA_ERROR_CUDA,
                             "cudaFuncSetAttribute (%d bytes of shared memory) failed: %s", bytes,
                             cudaGetErrorString(e));
  }
  if (device >= 0 && device < 64) done[device].store(true, std::memory_order_release);
  return JFA_SUCCESS;
}

}  // namespace jfa::sm90
