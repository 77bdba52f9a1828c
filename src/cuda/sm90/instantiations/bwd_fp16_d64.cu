// Backward instantiation: fp16, head_dim 64, steps of two q tiles.
#include "cuda/sm90/bwd_launch.cuh"

namespace jfa::sm90 {
template jfa_status backward_shape<__half, 64, 128>(const jfa::detail::BackwardParams& b,
                                                    const DeviceFacts& device);
}  // namespace jfa::sm90
