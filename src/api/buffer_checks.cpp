#include "api/buffer_checks.hpp"

#include <cstdint>

#include "api/overlap.hpp"
#include "common/status.hpp"

namespace jfa::detail {

jfa_status check_aligned(const char* name, const void* base, size_t element_bytes) {
  // A misaligned element cannot be loaded as its type: the values read would be garbage (or, on
  // the device, a fault).
  if (base != nullptr && element_bytes > 1 &&
      reinterpret_cast<uintptr_t>(base) % element_bytes != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "%s is not aligned to its element size (%zu bytes)",
                name, element_bytes);
  return JFA_SUCCESS;
}

jfa_status check_aligned(const std::vector<BufferView>& buffers) {
  for (const BufferView& b : buffers) {
    if (b.total <= 0 || b.heads <= 0 || b.d <= 0) continue;  // nothing of it is read or written
    if (const jfa_status s = check_aligned(b.name, b.base, b.element_bytes); s != JFA_SUCCESS)
      return s;
  }
  return JFA_SUCCESS;
}

jfa_status check_call_buffers(const std::vector<BufferView>& buffers, MemoryKind* kind) {
  jfa_status s;
  if ((s = check_aligned(buffers)) != JFA_SUCCESS) return s;
  if ((s = check_outputs_disjoint(buffers)) != JFA_SUCCESS) return s;
  return locate_buffers(buffers, kind);
}

jfa_status check_reference_buffers(const std::vector<BufferView>& buffers) {
  jfa_status s;
  if ((s = check_aligned(buffers)) != JFA_SUCCESS) return s;
  MemoryKind kind;
  if ((s = locate_buffers(buffers, &kind)) != JFA_SUCCESS) return s;
  if (kind == MemoryKind::kDevice)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "the reference needs host buffers");
  return JFA_SUCCESS;
}

jfa_status check_backend_side(jfa_backend backend, MemoryKind kind) {
  if (backend == JFA_BACKEND_CPU) {
    if (kind == MemoryKind::kDevice)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "backend=cpu needs host buffers, but the buffers are in device memory");
    return JFA_SUCCESS;
  }
#ifndef JFA_WITH_CUDA
  return fail(JFA_ERROR_BACKEND_UNAVAILABLE, "backend=cuda: this libjfa was built without CUDA");
#else
  if (kind == MemoryKind::kHost)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "backend=cuda needs device buffers, but the buffers are in host memory");
  return JFA_SUCCESS;
#endif
}

}  // namespace jfa::detail
