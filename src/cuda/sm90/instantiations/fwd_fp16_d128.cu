// Forward instantiation: fp16, head_dim 128, 128-key tiles (fwd_dispatch.cu says when).
#include "cuda/sm90/fwd_launch.cuh"

namespace jfa::sm90 {
template jfa_status run_forward<__half, 128, 2, 128>(const jfa::detail::Params& p,
                                                     const DeviceFacts& device);
}  // namespace jfa::sm90
