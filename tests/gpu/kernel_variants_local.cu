// The local-attention kernels (windows, softcap, sinks) on the shipped choices: not routed to by
// the shipped library yet, tested here against the float64 reference.
#include "kernel_variants.cuh"

namespace jfa::gpu_test {
jfa_status forward_local(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                         const KernelVariant& v) {
  return forward_with<jfa::sm90::WithLocalAttention<jfa::sm90::ShippedKernel>>(p, device, v);
}
}  // namespace jfa::gpu_test
