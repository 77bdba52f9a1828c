// The main loop that takes one K tile at a time.
#include "kernel_variants.cuh"

namespace jfa::gpu_test {
jfa_status forward_one_tile(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                            const KernelVariant& v) {
  using Choices = jfa::sm90::KernelChoices<jfa::sm90::Mainloop::kOneTileAtATime, true>;
  return forward_with<Choices>(p, device, v);
}
}  // namespace jfa::gpu_test
