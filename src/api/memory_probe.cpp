#include "api/memory_probe.hpp"

#include "common/status.hpp"

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

jfa_status locate_buffers(const std::vector<BufferView>& buffers, MemoryKind* kind) {
  const BufferView* first = nullptr;
  MemoryKind first_kind = MemoryKind::kHost;
  for (const BufferView& b : buffers) {
    if (b.base == nullptr) continue;
    const MemoryKind k = memory_kind(b.base);
    if (first == nullptr) {
      first = &b;
      first_kind = k;
    } else if (k != first_kind) {
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "%s is in %s memory but %s is in %s memory; all buffers must be on one side",
                  b.name, k == MemoryKind::kDevice ? "device" : "host", first->name,
                  first_kind == MemoryKind::kDevice ? "device" : "host");
    }
  }
  *kind = first_kind;
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
