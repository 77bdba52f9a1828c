// The checks of a call's buffers that come before anything reads them: each aligned to its element
// size, written ones disjoint from the rest, all on the side (host or device) of the backend.
#pragma once

#include <cstddef>
#include <vector>

#include "api/call_buffers.hpp"
#include "api/memory_probe.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// JFA_ERROR_INVALID_ARGUMENT naming the buffer when `base` is not a multiple of element_bytes
// (NULL passes: it is checked where it matters).
jfa_status check_aligned(const char* name, const void* base, size_t element_bytes);

// Every non-empty buffer of the list aligned to its element size.
jfa_status check_aligned(const std::vector<BufferView>& buffers);

// A call that computes: aligned, written buffers disjoint from the rest (overlap.hpp), all on one
// side, returned in *kind.
jfa_status check_call_buffers(const std::vector<BufferView>& buffers, MemoryKind* kind);

// A float64 reference: aligned, all in host memory.
jfa_status check_reference_buffers(const std::vector<BufferView>& buffers);

// The buffers' side suits the backend resolved for the call: host memory for the CPU backend,
// device memory for a CUDA backend that this libjfa has.
jfa_status check_backend_side(jfa_backend backend, MemoryKind kind);

}  // namespace jfa::detail
