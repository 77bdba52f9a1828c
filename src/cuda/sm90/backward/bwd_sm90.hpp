// Entry of the Hopper backward: support checks, then the (dtype, head_dim) instantiation.
#pragma once

#include <cstddef>

#include "common/params.hpp"
#include "cuda/common/device_facts.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// Runs the backward on the stream in `b.fwd`; returns a status and sets the error message on
// failure.
jfa_status backward(const jfa::detail::BackwardParams& b);

// Device workspace bytes of a backward call (any dtype and head size; the accumulators of head
// splits where a call of these sizes on any GPU may take them).
size_t backward_workspace_bytes(const jfa::detail::BackwardSizes& sizes);

// One per (dtype, head_dim, value head size, query rows per step) instantiation, generated from
// the table of src/CMakeLists.txt.
template <typename T, int kHeadDim, int kHeadDimV, int kRowsPerStep>
jfa_status backward_shape(const jfa::detail::BackwardParams& b,
                          const jfa::cuda::DeviceFacts& device);

}  // namespace jfa::sm90
