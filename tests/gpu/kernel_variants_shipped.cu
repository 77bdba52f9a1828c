// The shipped kernel choices, for forced tile shapes and other launch choices.
#include "kernel_variants.cuh"

namespace jfa::gpu_test {
jfa_status forward_shipped(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                           const KernelVariant& v) {
  return forward_with<jfa::sm90::ShippedKernel>(p, device, v);
}
}  // namespace jfa::gpu_test
