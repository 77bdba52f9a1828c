// C entry points of the attention backward: validation, backend choice, dispatch.
#include <vector>

#include "api/buffer_checks.hpp"
#include "api/error.hpp"
#include "api/lse_check.hpp"
#include "api/params_layouts.hpp"
#include "api/validate.hpp"
#include "cpu/backward_cpu.hpp"
#ifdef JFA_WITH_CUDA
#include "cuda/gpu_backends.hpp"
#endif

using jfa::detail::BackwardParams;
using jfa::detail::fail;
using jfa::detail::guarded;
using jfa::detail::MemoryKind;

extern "C" {

jfa_status jfa_attention_backward_params_init_sized(jfa_attention_backward_params* params,
                                                    size_t struct_size) {
  if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  jfa::detail::clear_error();
  return jfa::detail::write_default_backward_params(params, struct_size);
}

jfa_status(jfa_attention_backward_params_init)(jfa_attention_backward_params* params) {
  return jfa_attention_backward_params_init_sized(params,
                                                  sizeof(jfa::detail::AttentionBackwardParamsV1));
}

jfa_status jfa_attention_backward(const jfa_attention_backward_params* params) {
  return guarded([&] {
    BackwardParams b;
    jfa_status s = jfa::detail::build_backward_params(params, &b);
    if (s != JFA_SUCCESS) return s;
    MemoryKind kind;
    if ((s = jfa::detail::check_call_buffers(jfa::detail::backward_buffers(b), &kind)) !=
        JFA_SUCCESS)
      return s;
    const jfa_backend backend = jfa::detail::resolve_backend(params->forward.backend, kind);
    if ((s = jfa::detail::check_backend_side(backend, kind)) != JFA_SUCCESS) return s;
#ifdef JFA_WITH_CUDA
    if (backend == JFA_BACKEND_CUDA) {
      const jfa::cuda::GpuBackend* gpu = nullptr;
      if ((s = jfa::cuda::current_gpu_backend(&gpu)) != JFA_SUCCESS) return s;
      return gpu->backward(b);
    }
#endif
    if ((s = jfa::detail::validate_host_offsets(b.fwd)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_sinks(b.fwd)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::check_host_lse(b.fwd)) != JFA_SUCCESS) return s;
    if (b.fwd.device_check != nullptr) *b.fwd.device_check = 0;  // checked on the host, valid
    return jfa::detail::attention_backward_cpu(b);
  });
}

jfa_status jfa_attention_backward_workspace_size(const jfa_attention_backward_params* params,
                                                 size_t* bytes) {
  return guarded([&] {
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    if (bytes == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "bytes must not be NULL");
    jfa_attention_backward_params current;  // the caller's params in the current layout
    if (const jfa_status s = jfa::detail::read_backward_params(params, &current); s != JFA_SUCCESS)
      return s;
    const jfa_attention_params& f = current.forward;
    if (const jfa_status s = jfa::detail::check_batch_and_total_q(f.batch, f.total_q);
        s != JFA_SUCCESS)
      return s;
#ifdef JFA_WITH_CUDA
    // What the CUDA backward needs (the CPU backward needs none); its dq accumulator has q's
    // head_dim columns. The sizes are bounded here so that the arithmetic cannot overflow; the
    // call itself validates them fully.
    constexpr int64_t kMaxTokens = int64_t{1} << 40;
    if (f.total_k < 0 || f.total_k > kMaxTokens || f.heads_q <= 0 || f.heads_q > 65536 ||
        f.head_dim <= 0 || f.head_dim > 1024 || f.head_dim_v < 0 || f.head_dim_v > 1024)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "total_k (%lld), heads_q (%d), head_dim (%d) or head_dim_v (%d) is out of range",
                  static_cast<long long>(f.total_k), f.heads_q, f.head_dim, f.head_dim_v);
    *bytes = jfa::cuda::backward_workspace_bytes(jfa::detail::BackwardSizes{
        f.total_q, f.total_k, f.batch, f.heads_q, f.heads_kv, f.head_dim,
        f.head_dim_v == 0 ? f.head_dim : f.head_dim_v, current.deterministic != 0});
#else
    *bytes = 0;  // the CPU backward needs none
#endif
    return JFA_SUCCESS;
  });
}

jfa_status jfa_attention_backward_reference(const jfa_attention_backward_params* params, double* dq,
                                            double* dk, double* dv) {
  return jfa_attention_backward_reference_sinks(params, dq, dk, dv, nullptr);
}

jfa_status jfa_attention_backward_reference_sinks(const jfa_attention_backward_params* params,
                                                  double* dq, double* dk, double* dv,
                                                  double* dsinks) {
  return guarded([&] {
    BackwardParams b;
    jfa_status s = jfa::detail::build_backward_params(params, &b, /*for_reference=*/true);
    if (s != JFA_SUCCESS) return s;
    const jfa::detail::Params& p = b.fwd;
    if ((p.total_q > 0 && dq == nullptr) || (p.total_k > 0 && (dk == nullptr || dv == nullptr)))
      return fail(JFA_ERROR_INVALID_ARGUMENT, "the dq, dk and dv arrays must not be NULL");
    // The reference's float64 gradients, packed, too.
    std::vector<jfa::detail::BufferView> buffers = jfa::detail::backward_buffers(b);
    buffers.push_back(
        jfa::detail::packed_view("dq", dq, p.total_q, p.heads_q, p.head_dim, sizeof(double), true));
    buffers.push_back(jfa::detail::packed_view("dk", dk, p.total_k, p.heads_kv, p.head_dim,
                                               sizeof(double), true));
    buffers.push_back(jfa::detail::packed_view("dv", dv, p.total_k, p.heads_kv, p.head_dim_v,
                                               sizeof(double), true));
    buffers.push_back(jfa::detail::array_view("dsinks", dsinks, p.heads_q, sizeof(double), true));
    if ((s = jfa::detail::check_reference_buffers(buffers)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_offsets(p)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_sinks(p)) != JFA_SUCCESS) return s;
    jfa::detail::attention_backward_reference_cpu(b, dq, dk, dv, dsinks);
    return JFA_SUCCESS;
  });
}

}  // extern "C"
