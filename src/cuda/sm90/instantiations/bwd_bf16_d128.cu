// Backward instantiation: bf16, head_dim 128.
#include "cuda/sm90/bwd_launch.cuh"

namespace jfa::sm90 {
template jfa_status backward_shape<__nv_bfloat16, 128, 64>(const jfa::detail::BackwardParams& b,
                                                           const DeviceFacts& device);
}  // namespace jfa::sm90
