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

// Device workspace bytes of a backward call (any dtype and head size).
size_t backward_workspace_bytes(int64_t total_q, int64_t total_k, int64_t batch, int32_t heads_q,
                                int32_t head_dim);

// One per (dtype, head_dim, value head size, query rows per step) instantiation, generated from
// the table of src/CMakeLists.txt.
template <typename T, int kHeadDim, int kHeadDimV, int kRowsPerStep>
jfa_status backward_shape(const jfa::detail::BackwardParams& b,
                          const jfa::cuda::DeviceFacts& device);

}  // namespace jfa::sm90
