#include "kernel_variants.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "api/validate.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"

namespace jfa::gpu_test {

std::string KernelVariant::describe() const {
  const char* loops[] = {"shipped", "one-tile", "independent/tile-major"};
  return std::string("variant loop=") + loops[static_cast<int>(loop)] +
         " d64_groups=" + std::to_string(d64_groups) + " d128_keys=" + std::to_string(d128_keys) +
         " sorted=" + (sort_work_list ? "1" : "0") + " pdl=" + (dependent_launch ? "1" : "0");
}

namespace {

const KernelVariant* g_variant = nullptr;

jfa_status run_variant(const jfa_attention_params* params, const KernelVariant& v) {
  jfa::detail::Params p;
  if (const jfa_status s = jfa::detail::build_params(params, &p); s != JFA_SUCCESS) return s;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return jfa::detail::fail(JFA_ERROR_CUDA, "cudaGetDevice failed");
  const jfa::cuda::DeviceFacts& facts = jfa::cuda::device_facts(device);
  switch (v.loop) {
    case VariantLoop::kOneTileAtATime:
      return forward_one_tile(p, facts, v);
    case VariantLoop::kOverlappedIndependent:
      return forward_independent(p, facts, v);
    case VariantLoop::kShipped:
      break;
  }
  return forward_shipped(p, facts, v);
}

}  // namespace

jfa_status forward_variant(const jfa_attention_params* params, const KernelVariant& v) {
  jfa::detail::clear_error();
  const jfa_status s = run_variant(params, v);
  if (s != JFA_SUCCESS)
    std::fprintf(stderr, "%s: status %d: %s\n", v.describe().c_str(), static_cast<int>(s),
                 jfa::detail::last_error_message().c_str());
  return s;
}

const KernelVariant* active_variant() { return g_variant; }

ScopedVariant::ScopedVariant(const KernelVariant& v) : previous_(g_variant), variant_(v) {
  g_variant = &variant_;
}
ScopedVariant::~ScopedVariant() { g_variant = previous_; }

}  // namespace jfa::gpu_test
