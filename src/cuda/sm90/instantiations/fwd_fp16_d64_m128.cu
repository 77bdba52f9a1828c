// Forward instantiation: fp16, head_dim 64, 128-row tiles (batches of short sequences).
#include "cuda/sm90/fwd_shape.cuh"

namespace jfa::sm90 {
template jfa_status forward_shape<__half, 64, 2, 128>(const jfa::detail::Params& p,
                                                      const DeviceFacts& device);
}  // namespace jfa::sm90
