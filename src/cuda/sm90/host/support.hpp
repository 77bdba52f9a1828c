// What the Hopper kernels support, checked per call before anything is launched: the device, the
// dtype, head_dim, scale, and the alignment and strides of the tensors that TMA reads or the
// kernels store to.
#pragma once

#include "common/params.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

// A 16-bit tensor the kernels read or write: its base and layout.
struct TensorArg {
  const void* ptr;
  const jfa::detail::Layout* layout;
  const char* name;
};

// The current device's facts when it is a Hopper GPU (compute capability 9.0); otherwise
// JFA_ERROR_CUDA, or JFA_ERROR_UNSUPPORTED ending with `supported` (what the kernels run on).
jfa_status current_hopper_device(const char* supported, const jfa::cuda::DeviceFacts** facts);

// Checks the current device and the forward's parameters (q, k, v, out and lse) for the pass (its
// head sizes); on success *facts is the current device's. Returns the status and sets the message
// otherwise.
jfa_status check_supported(const jfa::detail::Params& p, Pass pass,
                           const jfa::cuda::DeviceFacts** facts);

// The alignment and stride rules of check_supported for further tensors.
jfa_status check_tensors_supported(const TensorArg* tensors, int n);

}  // namespace jfa::sm90
