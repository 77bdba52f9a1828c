// The Hopper forward: support checks (support.hpp), then the (dtype, head_dim, tile shape)
// instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/fwd_sm90.hpp"
#include "cuda/sm90/host/support.hpp"
#ifdef JFA_SM90_TUNING
#include "cuda/sm90/host/tuning_switch.hpp"
#endif

namespace jfa::sm90 {
namespace {

// Consumer groups at head_dim 64 (and 32) and keys per K tile at 128, from the mean query length
// (choices.hpp); a tuning build lets JFA_SM90_D64_ROWS=128|192 and JFA_SM90_D128_KEYS=128|160 force
// a shape.
int groups_at_head_dim_64(const jfa::detail::Params& p) {
  const int groups = jfa::sm90::head_dim_64_groups(p.total_q, p.batch);
#ifdef JFA_SM90_TUNING
  return tuning_switch(TuningSwitch::kD64Rows, 64 * groups) / 64;
#else
  return groups;
#endif
}

int keys_at_head_dim_128(const jfa::detail::Params& p) {
  const int keys = jfa::sm90::head_dim_128_keys(p.total_q, p.batch, p.causal);
#ifdef JFA_SM90_TUNING
  return tuning_switch(TuningSwitch::kD128Keys, keys);
#else
  return keys;
#endif
}

// Head_dim 64 and 32: 128- or 192-row Q tiles (two or three consumer groups) by the mean query
// length, K tiles of 128 keys.
template <int kD>
jfa_status forward_by_rows(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& facts) {
  const bool half = p.dtype == JFA_DTYPE_FLOAT16;
  if (groups_at_head_dim_64(p) == 2)
    return half ? forward_shape<__half, kD, 2, 128, kD>(p, facts)
                : forward_shape<__nv_bfloat16, kD, 2, 128, kD>(p, facts);
  return half ? forward_shape<__half, kD, 3, 128, kD>(p, facts)
              : forward_shape<__nv_bfloat16, kD, 3, 128, kD>(p, facts);
}

}  // namespace

jfa_status forward(const jfa::detail::Params& p) {
  const jfa::cuda::DeviceFacts* facts_ptr = nullptr;
  if (const jfa_status s = check_supported(p, Pass::kForward, &facts_ptr); s != JFA_SUCCESS)
    return s;
  const jfa::cuda::DeviceFacts& facts = *facts_ptr;
  const bool half = p.dtype == JFA_DTYPE_FLOAT16;
#ifdef JFA_SM90_BUILT_D32
  if (p.head_dim == 32) return forward_by_rows<32>(p, facts);
#endif
#ifdef JFA_SM90_BUILT_D64
  if (p.head_dim == 64) return forward_by_rows<64>(p, facts);
#endif
#ifdef JFA_SM90_BUILT_D96
  if (p.head_dim == 96)
    return half ? forward_shape<__half, 96, 2, 128, 96>(p, facts)
                : forward_shape<__nv_bfloat16, 96, 2, 128, 96>(p, facts);
#endif
#ifdef JFA_SM90_BUILT_D128
  if (p.head_dim == 128) {
    if (keys_at_head_dim_128(p) == 160)
      return half ? forward_shape<__half, 128, 2, 160, 128>(p, facts)
                  : forward_shape<__nv_bfloat16, 128, 2, 160, 128>(p, facts);
    return half ? forward_shape<__half, 128, 2, 128, 128>(p, facts)
                : forward_shape<__nv_bfloat16, 128, 2, 128, 128>(p, facts);
  }
#endif
#ifdef JFA_SM90_BUILT_D192
  // K tiles of 64 keys: Q, the two-stage K/V ring and the O staging tiles fill the shared memory.
  if (p.head_dim == 192 && p.head_dim_v == 128)
    return half ? forward_shape<__half, 192, 2, 64, 128>(p, facts)
                : forward_shape<__nv_bfloat16, 192, 2, 64, 128>(p, facts);
  if (p.head_dim == 192)
    return half ? forward_shape<__half, 192, 2, 64, 192>(p, facts)
                : forward_shape<__nv_bfloat16, 192, 2, 64, 192>(p, facts);
#endif
#ifdef JFA_SM90_BUILT_D256
  // K tiles of 64 keys and O staged half its columns at a time: Q and the two-stage K/V ring take
  // 192 KB.
  if (p.head_dim == 256)
    return half ? forward_shape<__half, 256, 2, 64, 256>(p, facts)
                : forward_shape<__nv_bfloat16, 256, 2, 64, 256>(p, facts);
#endif
  (void)half;
  return jfa::detail::fail(JFA_ERROR_INTERNAL, "no forward kernel for head_dim %d", p.head_dim);
}

}  // namespace jfa::sm90
