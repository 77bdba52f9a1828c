// The Hopper backward: the forward's support checks plus those of its own tensors, then the
// instantiation of the call's row of the table of shapes (shape_rows.hpp) for its dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/sm90/backward/bwd_head_splits.hpp"
#include "cuda/sm90/backward/bwd_sm90.hpp"
#include "cuda/sm90/backward/bwd_workspace.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "cuda/sm90/host/shape_rows.hpp"
#include "cuda/sm90/host/support.hpp"

namespace jfa::sm90 {

size_t backward_workspace_bytes(const jfa::detail::BackwardSizes& z) {
  // The K tiles of 128 keys (the fewest items) on the most SMs: a superset of the calls that split.
  const bool known_group = z.heads_kv > 0 && z.heads_q % z.heads_kv == 0;
  const int32_t splits = known_group
                             ? chosen_head_splits(z.total_k, z.heads_kv, z.heads_q / z.heads_kv,
                                                  z.deterministic, kBwdBlockN, kHeadSplitsMaxSms)
                             : 1;
  return backward_workspace_layout(
             z.total_q, z.total_k, z.batch, z.heads_q, z.head_dim,
             head_split_accumulator_floats(splits, z.total_k, z.heads_kv, z.head_dim, z.head_dim_v))
      .bytes;
}

jfa_status backward(const jfa::detail::BackwardParams& b) {
  using jfa::detail::fail;
  const jfa::detail::Params& p = b.fwd;
  const jfa::cuda::DeviceFacts* facts = nullptr;
  if (const jfa_status s = check_supported(p, Pass::kBackward, &facts); s != JFA_SUCCESS) return s;
  const TensorArg tensors[] = {{b.dout, &b.dout_layout, "dout"},
                               {b.dq, &b.dq_layout, "dq"},
                               {b.dk, &b.dk_layout, "dk"},
                               {b.dv, &b.dv_layout, "dv"}};
  if (const jfa_status s = check_tensors_supported(tensors, 4); s != JFA_SUCCESS) return s;
  // The preprocess runs one block row per query head (a grid dimension of at most 65535).
  if (p.heads_q > 65535)
    return fail(JFA_ERROR_UNSUPPORTED, "heads_q %d: the CUDA backward takes at most 65535 heads",
                p.heads_q);
  if (b.dlse != nullptr && (reinterpret_cast<uintptr_t>(b.dlse) & 3u) != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dlse must be 4-byte aligned");
  const int row = select_backward_shape(p);
  if (row < 0)
    return fail(JFA_ERROR_INTERNAL,
                "no backward kernel for head_dim %d / %d with the step shape chosen for the call",
                p.head_dim, p.head_dim_v);
  return visit_backward_row(row, [&](auto r) -> jfa_status {
    constexpr BackwardShape s = kBackwardShapes[decltype(r)::value];
    // A head size that this build leaves out is never referenced (check_supported rejects it).
    if constexpr (head_dim_built(s.head_dim)) {
      if (p.dtype == JFA_DTYPE_FLOAT16)
        return backward_shape<__half, s.head_dim, s.head_dim_v, s.rows>(b, *facts);
      return backward_shape<__nv_bfloat16, s.head_dim, s.head_dim_v, s.rows>(b, *facts);
    } else {
      return fail(JFA_ERROR_INTERNAL, "no backward kernel for head_dim %d in this build",
                  s.head_dim);
    }
  });
}

}  // namespace jfa::sm90
