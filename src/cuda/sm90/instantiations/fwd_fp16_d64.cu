// Forward instantiation: fp16, head_dim 64, 192-row tiles.
#include "cuda/sm90/fwd_shape.cuh"

namespace jfa::sm90 {
template jfa_status forward_shape<__half, 64, 3, 128>(const jfa::detail::Params& p,
                                                      const DeviceFacts& device);
}  // namespace jfa::sm90
