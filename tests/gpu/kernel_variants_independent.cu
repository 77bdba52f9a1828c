// The overlapped main loop with the consumer groups independent, items in tile-major order.
#include "kernel_variants.cuh"

namespace jfa::gpu_test {
jfa_status forward_independent(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                               const KernelVariant& v) {
  using Choices = jfa::sm90::KernelChoices<jfa::sm90::Mainloop::kOverlappedIndependent, false>;
  return forward_with<Choices>(p, device, v);
}
}  // namespace jfa::gpu_test
