// Where a pointer lives: the dispatcher sends device memory to CUDA and host memory to the CPU.
#pragma once

namespace jfa::detail {

enum class MemoryKind { kHost, kDevice };

// Host unless the CUDA runtime is built in and reports device (or managed) memory.
MemoryKind memory_kind(const void* ptr);

}  // namespace jfa::detail
