// Support checks of the Hopper kernels.
#include "cuda/sm90/host/support.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.hpp"
#include "cuda/sm90/host/head_sizes.hpp"

namespace jfa::sm90 {
namespace {

constexpr const char* kSupported =
    "the CUDA backend supports fp16 and bf16, softmax_scale > 0, tensors 16-byte aligned with "
    "token and head strides that are multiples of 8 elements, on compute capability 9.0 (Hopper) "
    "GPUs";

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
bool stride_ok(const jfa::detail::Layout& l) {
  return l.token_stride % 8 == 0 && l.head_stride % 8 == 0;
}

}  // namespace

jfa_status check_tensors_supported(const TensorArg* tensors, int n) {
  using jfa::detail::fail;
  for (int i = 0; i < n; ++i) {
    const TensorArg& t = tensors[i];
    if (t.ptr != nullptr && !aligned16(t.ptr))
      return fail(JFA_ERROR_UNSUPPORTED, "%s is not 16-byte aligned; %s", t.name, kSupported);
    if (!stride_ok(*t.layout))
      return fail(
          JFA_ERROR_UNSUPPORTED,
          "%s strides (token_stride=%lld, head_stride=%lld) are not multiples of 8 elements; %s",
          t.name, static_cast<long long>(t.layout->token_stride),
          static_cast<long long>(t.layout->head_stride), kSupported);
  }
  return JFA_SUCCESS;
}

jfa_status current_hopper_device(const char* supported, const jfa::cuda::DeviceFacts** facts_out) {
  using jfa::detail::fail;
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(JFA_ERROR_CUDA, "cannot query the current CUDA device: %s", cudaGetErrorString(e));
  }
  const jfa::cuda::DeviceFacts& facts = jfa::cuda::device_facts(device);
  if (facts.error != cudaSuccess)
    return fail(JFA_ERROR_CUDA, "cannot query CUDA device %d: %s", device,
                cudaGetErrorString(facts.error));
  if (facts.major != 9 || facts.minor != 0)
    return fail(JFA_ERROR_UNSUPPORTED, "device %d has compute capability %d.%d; %s", device,
                facts.major, facts.minor, supported);
  *facts_out = &facts;
  return JFA_SUCCESS;
}

jfa_status check_supported(const jfa::detail::Params& p, Pass pass,
                           const jfa::cuda::DeviceFacts** facts_out) {
  using jfa::detail::fail;
  const jfa::cuda::DeviceFacts* facts = nullptr;
  if (const jfa_status s = current_hopper_device(kSupported, &facts); s != JFA_SUCCESS) return s;
  if (p.dtype != JFA_DTYPE_FLOAT16 && p.dtype != JFA_DTYPE_BFLOAT16)
    return fail(JFA_ERROR_UNSUPPORTED, "dtype float32 is not supported on CUDA; %s", kSupported);
  if (!has_kernels(pass, p.head_dim, p.head_dim_v)) {
    const char* what = pass == Pass::kForward ? "forward" : "backward";
    if (p.head_dim == p.head_dim_v)
      return fail(JFA_ERROR_UNSUPPORTED,
                  "head_dim %d: the CUDA %s takes head_dim %s (head_dim / value head size) in "
                  "this build",
                  p.head_dim, what, built_head_sizes(pass).c_str());
    return fail(JFA_ERROR_UNSUPPORTED,
                "head_dim %d with value head size %d: the CUDA %s takes head_dim %s (head_dim / "
                "value head size) in this build",
                p.head_dim, p.head_dim_v, what, built_head_sizes(pass).c_str());
  }
  if (!(p.softmax_scale > 0.f))
    return fail(JFA_ERROR_UNSUPPORTED, "softmax_scale %g is not supported; %s",
                static_cast<double>(p.softmax_scale), kSupported);
  const TensorArg tensors[] = {{p.q, &p.q_layout, "q"},
                               {p.k, &p.k_layout, "k"},
                               {p.v, &p.v_layout, "v"},
                               {p.out, &p.out_layout, "out"}};
  if (const jfa_status s = check_tensors_supported(tensors, 4); s != JFA_SUCCESS) return s;
  if (p.lse != nullptr && (reinterpret_cast<uintptr_t>(p.lse) & 3u) != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "lse must be 4-byte aligned");
  *facts_out = facts;
  return JFA_SUCCESS;
}

}  // namespace jfa::sm90
