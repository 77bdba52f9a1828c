// Where a pointer lives: the dispatcher sends device memory to CUDA and host memory to the CPU.
#pragma once

#include <initializer_list>

#include "jfa/jfa.h"

namespace jfa::detail {

enum class MemoryKind { kHost, kDevice };

// Host unless the CUDA runtime is built in and reports device (or managed) memory.
MemoryKind memory_kind(const void* ptr);

struct NamedBuffer {
  const void* ptr;  // NULL buffers are skipped
  const char* name;
};

// All buffers must live on one side; returns the side in *kind or fails naming the odd one out.
jfa_status locate_buffers(std::initializer_list<NamedBuffer> buffers, MemoryKind* kind);

}  // namespace jfa::detail
