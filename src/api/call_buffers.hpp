// The buffers of one call as the API layer checks them: where each lies and what the call does
// with it. The same list serves the overlap check and the host/device location check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/params.hpp"

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

// A packed [total, heads, d] view.
BufferView packed_view(const char* name, const void* base, int64_t total, int32_t heads, int32_t d,
                       size_t element_bytes, bool written);

// The buffers of a forward call (p validated) and of a backward call.
std::vector<BufferView> forward_buffers(const Params& p);
std::vector<BufferView> backward_buffers(const BackwardParams& b);

}  // namespace jfa::detail
