// The Hopper forward: support checks (support.hpp), then the instantiation of the call's row of the
// table of shapes (shape_rows.hpp) for its dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/fwd_sm90.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "cuda/sm90/host/shape_rows.hpp"
#include "cuda/sm90/host/support.hpp"
#ifdef JFA_SM90_TUNING
#include "cuda/sm90/host/tuning_switch.hpp"
#endif

namespace jfa::sm90 {
namespace {

// The call's row (-1: none); a tuning build lets JFA_SM90_D64_ROWS=128|192 and
// JFA_SM90_D128_KEYS=128|160 force the consumer groups and the keys per K tile where a head size
// has rows of both.
int forward_row(const jfa::detail::Params& p) {
#ifdef JFA_SM90_TUNING
  // Not under softcap, whose kernels exist for its own choices only (choices.hpp).
  if (p.softcap > 0.f) return select_forward_shape(p);
  const int groups =
      tuning_switch(TuningSwitch::kD64Rows, 64 * head_dim_64_groups(p.total_q, p.batch)) / 64;
  const int keys =
      tuning_switch(TuningSwitch::kD128Keys, head_dim_128_keys(p.total_q, p.batch, p.causal));
  return forward_shape_row(p.head_dim, p.head_dim_v, groups, keys);
#else
  return select_forward_shape(p);
#endif
}

}  // namespace

jfa_status forward(const jfa::detail::Params& p) {
  using jfa::detail::fail;
  const jfa::cuda::DeviceFacts* facts_ptr = nullptr;
  if (const jfa_status s = check_supported(p, Pass::kForward, &facts_ptr); s != JFA_SUCCESS)
    return s;
  const jfa::cuda::DeviceFacts& facts = *facts_ptr;
  const int row = forward_row(p);
  if (row < 0)
    return fail(JFA_ERROR_INTERNAL,
                "no forward kernel for head_dim %d / %d with the tile shape chosen for the call",
                p.head_dim, p.head_dim_v);
  return visit_forward_row(row, [&](auto r) -> jfa_status {
    constexpr ForwardShape s = kForwardShapes[decltype(r)::value];
    // A head size that this build leaves out is never referenced (check_supported rejects it).
    if constexpr (head_dim_built(s.head_dim)) {
      if (p.dtype == JFA_DTYPE_FLOAT16)
        return forward_shape<__half, s.head_dim, s.groups, s.keys, s.head_dim_v>(p, facts);
      return forward_shape<__nv_bfloat16, s.head_dim, s.groups, s.keys, s.head_dim_v>(p, facts);
    } else {
      return fail(JFA_ERROR_INTERNAL, "no forward kernel for head_dim %d in this build",
                  s.head_dim);
    }
  });
}

}  // namespace jfa::sm90
