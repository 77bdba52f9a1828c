// The forward of one set of kernel choices at every row of the table of shapes (shape_rows.hpp);
// each kernel_variants_*.cu file instantiates one set.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/fwd_launch.cuh"
#include "cuda/sm90/host/shape_rows.hpp"
#include "kernel_variants.hpp"

namespace jfa::gpu_test {

template <typename Choices>
jfa_status forward_with(const jfa::detail::Params& p, const jfa::cuda::DeviceFacts& device,
                        const KernelVariant& v) {
  using jfa::sm90::FwdConfig;
  using jfa::sm90::run_forward;
  const jfa::sm90::LaunchChoices launch{v.sort_work_list, v.dependent_launch};
  // The consumer groups and keys per K tile that the variant forces, else the library's choices;
  // they pick among a head size's rows where those differ in them.
  const int groups =
      v.d64_groups != 0 ? v.d64_groups : jfa::sm90::head_dim_64_groups(p.total_q, p.batch);
  const int keys =
      v.d128_keys != 0 ? v.d128_keys : jfa::sm90::head_dim_128_keys(p.total_q, p.batch, p.causal);
  const int row = jfa::sm90::forward_shape_row(p.head_dim, p.head_dim_v, groups, keys);
  // A size without a variant must fail the test, never run another size's kernel.
  if (row < 0)
    return jfa::detail::fail(JFA_ERROR_INTERNAL,
                             "no kernel variant for head_dim %d / %d with %d groups, %d keys",
                             p.head_dim, p.head_dim_v, groups, keys);
  return jfa::sm90::visit_forward_row(row, [&](auto r) -> jfa_status {
    constexpr jfa::sm90::ForwardShape s = jfa::sm90::kForwardShapes[decltype(r)::value];
    using Half = FwdConfig<__half, s.head_dim, s.groups, s.keys, Choices, s.head_dim_v>;
    using Bf16 = FwdConfig<__nv_bfloat16, s.head_dim, s.groups, s.keys, Choices, s.head_dim_v>;
    return p.dtype == JFA_DTYPE_FLOAT16 ? run_forward<Half>(p, device, launch)
                                        : run_forward<Bf16>(p, device, launch);
  });
}

}  // namespace jfa::gpu_test
