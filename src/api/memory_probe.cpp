#include "api/memory_probe.hpp"

#ifdef JFA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace jfa::detail {

MemoryKind memory_kind(const void* ptr) {
#ifdef JFA_WITH_CUDA
  if (ptr == nullptr) return MemoryKind::kHost;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: the pointer cannot be device memory
    return MemoryKind::kHost;
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged)
    return MemoryKind::kDevice;
#else
  (void)ptr;
#endif
  return MemoryKind::kHost;
}

}  // namespace jfa::detail
