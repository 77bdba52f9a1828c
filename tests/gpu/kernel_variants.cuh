// The forward of one set of kernel choices at every tile shape; each kernel_variants_*.cu file
// instantiates one set.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/fwd_launch.cuh"
#include "kernel_variants.hpp"

namespace jfa::gpu_test {

// Head_dim 64 and 32: two or three consumer groups, forced by the variant or by the mean length.
template <typename Choices, int kD>
jfa_status forward_by_rows(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                           const KernelVariant& v) {
  using jfa::sm90::FwdConfig;
  using jfa::sm90::run_forward;
  const jfa::sm90::LaunchChoices launch{v.sort_work_list, v.dependent_launch};
  const bool half = p.dtype == JFA_DTYPE_FLOAT16;
  const int groups =
      v.d64_groups != 0 ? v.d64_groups : jfa::sm90::head_dim_64_groups(p.total_q, p.batch);
  if (groups == 2)
    return half ? run_forward<FwdConfig<__half, kD, 2, 128, Choices>>(p, device, launch)
                : run_forward<FwdConfig<__nv_bfloat16, kD, 2, 128, Choices>>(p, device, launch);
  return half ? run_forward<FwdConfig<__half, kD, 3, 128, Choices>>(p, device, launch)
              : run_forward<FwdConfig<__nv_bfloat16, kD, 3, 128, Choices>>(p, device, launch);
}

template <typename Choices>
jfa_status forward_with(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                        const KernelVariant& v) {
  using jfa::sm90::FwdConfig;
  using jfa::sm90::run_forward;
  const jfa::sm90::LaunchChoices launch{v.sort_work_list, v.dependent_launch};
  const bool half = p.dtype == JFA_DTYPE_FLOAT16;
  if (p.head_dim == 32) return forward_by_rows<Choices, 32>(p, device, v);
  if (p.head_dim == 64) return forward_by_rows<Choices, 64>(p, device, v);
  if (p.head_dim == 96)
    return half ? run_forward<FwdConfig<__half, 96, 2, 128, Choices>>(p, device, launch)
                : run_forward<FwdConfig<__nv_bfloat16, 96, 2, 128, Choices>>(p, device, launch);
  if (p.head_dim == 128) {
    const int keys =
        v.d128_keys != 0 ? v.d128_keys : jfa::sm90::head_dim_128_keys(p.total_q, p.batch, p.causal);
    if (keys == 160)
      return half ? run_forward<FwdConfig<__half, 128, 2, 160, Choices>>(p, device, launch)
                  : run_forward<FwdConfig<__nv_bfloat16, 128, 2, 160, Choices>>(p, device, launch);
    return half ? run_forward<FwdConfig<__half, 128, 2, 128, Choices>>(p, device, launch)
                : run_forward<FwdConfig<__nv_bfloat16, 128, 2, 128, Choices>>(p, device, launch);
  }
  if (p.head_dim == 192 && p.head_dim_v == 128)
    return half
               ? run_forward<FwdConfig<__half, 192, 2, 64, Choices, 128>>(p, device, launch)
               : run_forward<FwdConfig<__nv_bfloat16, 192, 2, 64, Choices, 128>>(p, device, launch);
  if (p.head_dim == 192 && p.head_dim_v == 192)
    return half ? run_forward<FwdConfig<__half, 192, 2, 64, Choices>>(p, device, launch)
                : run_forward<FwdConfig<__nv_bfloat16, 192, 2, 64, Choices>>(p, device, launch);
  if (p.head_dim == 256)
    return half ? run_forward<FwdConfig<__half, 256, 2, 64, Choices>>(p, device, launch)
                : run_forward<FwdConfig<__nv_bfloat16, 256, 2, 64, Choices>>(p, device, launch);
  // A size without a variant must fail the test, never run another size's kernel.
  return jfa::detail::fail(JFA_ERROR_INTERNAL, "no kernel variant for head_dim %d / %d", p.head_dim,
                           p.head_dim_v);
}

}  // namespace jfa::gpu_test
