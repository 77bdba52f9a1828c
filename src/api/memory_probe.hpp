// Where a pointer lives: the dispatcher sends device memory to CUDA and host memory to the CPU.
#pragma once

#include <vector>

#include "api/call_buffers.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

enum class MemoryKind { kHost, kDevice };

// Host unless the CUDA runtime is built in and reports device (or managed) memory.
MemoryKind memory_kind(const void* ptr);

// All buffers must live on one side; returns the side in *kind or fails naming the odd one out.
// Buffers that are not part of the call (NULL) are skipped.
jfa_status locate_buffers(const std::vector<BufferView>& buffers, MemoryKind* kind);

// The backend of a call: the requested one, or for `auto` the one of the side the buffers are on.
inline jfa_backend resolve_backend(jfa_backend requested, MemoryKind kind) {
  if (requested != JFA_BACKEND_AUTO) return requested;
  return kind == MemoryKind::kDevice ? JFA_BACKEND_CUDA : JFA_BACKEND_CPU;
}

}  // namespace jfa::detail
