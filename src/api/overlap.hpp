// Buffers that a call writes must not share memory with any other buffer of the call: an output
// overlapping an input (or another output) would be read after it was written, and the result
// would depend on the order of the work. Views that interleave without sharing an element (e.g.
// slots of one fused tensor) are allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// A [total, heads, d] view with strides in elements (a 1-D array of n elements: total n, heads 1,
// d 1, strides 1).
struct BufferView {
  const char* name;
  const void* base;  // NULL: not part of the call
  int64_t total;
  int32_t heads;
  int32_t d;
  Layout layout;
  size_t element_bytes;
  bool written;
};

BufferView array_view(const char* name, const void* base, int64_t n, size_t element_bytes,
                      bool written);

// JFA_ERROR_INVALID_ARGUMENT naming both buffers when a written buffer shares an element with
// another one.
jfa_status check_outputs_disjoint(const std::vector<BufferView>& buffers);

// The buffers of a forward call (p validated) and of a backward call.
std::vector<BufferView> forward_buffers(const Params& p);
std::vector<BufferView> backward_buffers(const BackwardParams& b);

}  // namespace jfa::detail
