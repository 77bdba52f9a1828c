// Entry of the Hopper forward: support checks, then the (dtype, head_dim, tile shape)
// instantiation.
#pragma once

#include "common/params.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/host/support.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// Runs the forward on the stream in `p`; returns a status and sets the error message on failure.
jfa_status forward(const jfa::detail::Params& p);

// One per (dtype, head_dim, consumer warp groups, keys per K tile, value head size) instantiation
// (the table of src/CMakeLists.txt).
template <typename T, int kHeadDim, int kGroups, int kKeys, int kHeadDimV>
jfa_status forward_shape(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device);

}  // namespace jfa::sm90
