// C entry points of the attention backward: validation, backend choice, dispatch.
#include "api/error.hpp"
#include "api/memory_probe.hpp"
#include "api/overlap.hpp"
#include "api/validate.hpp"
#include "cpu/backward_cpu.hpp"
#ifdef JFA_WITH_CUDA
#include "cuda/sm90/bwd_sm90.hpp"
#endif

using jfa::detail::BackwardParams;
using jfa::detail::fail;
using jfa::detail::guarded;
using jfa::detail::MemoryKind;

extern "C" {

jfa_status jfa_attention_backward_params_init(jfa_attention_backward_params* params) {
  if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  *params = jfa_attention_backward_params{};
  params->struct_size = sizeof(jfa_attention_backward_params);
  return jfa_attention_params_init(&params->forward);
}

jfa_status jfa_attention_backward(const jfa_attention_backward_params* params) {
  return guarded([&] {
    BackwardParams b;
    jfa_status s = jfa::detail::build_backward_params(params, &b);
    if (s != JFA_SUCCESS) return s;
    const std::vector<jfa::detail::BufferView> buffers = jfa::detail::backward_buffers(b);
    if ((s = jfa::detail::check_outputs_disjoint(buffers)) != JFA_SUCCESS) return s;
    MemoryKind kind;
    if ((s = jfa::detail::locate_buffers(buffers, &kind)) != JFA_SUCCESS) return s;
    if (jfa::detail::resolve_backend(params->forward.backend, kind) == JFA_BACKEND_CUDA) {
#ifndef JFA_WITH_CUDA
      return fail(JFA_ERROR_BACKEND_UNAVAILABLE,
                  "backend=cuda: this libjfa was built without CUDA");
#else
      if (kind == MemoryKind::kHost)
        return fail(JFA_ERROR_INVALID_ARGUMENT,
                    "backend=cuda needs device buffers, but the buffers are in host memory");
      return jfa::sm90::backward(b);
#endif
    }
    if (kind == MemoryKind::kDevice)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "backend=cpu needs host buffers, but the buffers are in device memory");
    if ((s = jfa::detail::validate_host_offsets(b.fwd)) != JFA_SUCCESS) return s;
    if (b.fwd.device_check != nullptr) *b.fwd.device_check = 0;  // checked on the host, valid
    return jfa::detail::attention_backward_cpu(b);
  });
}

jfa_status jfa_attention_backward_workspace_size(const jfa_attention_backward_params* params,
                                                 size_t* bytes) {
  return guarded([&] {
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    if (bytes == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "bytes must not be NULL");
    if (params->struct_size != sizeof(jfa_attention_backward_params))
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "params->struct_size is %u: fill the struct with "
                  "jfa_attention_backward_params_init() first",
                  static_cast<unsigned>(params->struct_size));
    if (const jfa_status s = jfa::detail::check_struct_size(&params->forward); s != JFA_SUCCESS)
      return s;
    if (const jfa_status s =
            jfa::detail::check_batch_and_total_q(params->forward.batch, params->forward.total_q);
        s != JFA_SUCCESS)
      return s;
#ifdef JFA_WITH_CUDA
    // What the CUDA backward needs (the CPU backward needs none). The sizes are bounded here so
    // that the arithmetic cannot overflow; the call itself validates them fully.
    const jfa_attention_params& f = params->forward;
    constexpr int64_t kMaxTokens = int64_t{1} << 40;
    if (f.total_k < 0 || f.total_k > kMaxTokens || f.heads_q <= 0 || f.heads_q > 65536 ||
        f.head_dim <= 0 || f.head_dim > 1024)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "total_k (%lld), heads_q (%d) or head_dim (%d) is out of range",
                  static_cast<long long>(f.total_k), f.heads_q, f.head_dim);
    *bytes =
        jfa::sm90::backward_workspace_bytes(f.total_q, f.total_k, f.batch, f.heads_q, f.head_dim);
#else
    *bytes = 0;  // the CPU backward needs none
#endif
    return JFA_SUCCESS;
  });
}

jfa_status jfa_attention_backward_reference(const jfa_attention_backward_params* params, double* dq,
                                            double* dk, double* dv) {
  return guarded([&] {
    BackwardParams b;
    jfa_status s = jfa::detail::build_backward_params(params, &b, /*for_reference=*/true);
    if (s != JFA_SUCCESS) return s;
    const jfa::detail::Params& p = b.fwd;
    if ((p.total_q > 0 && dq == nullptr) || (p.total_k > 0 && (dk == nullptr || dv == nullptr)))
      return fail(JFA_ERROR_INVALID_ARGUMENT, "the dq, dk and dv arrays must not be NULL");
    MemoryKind kind;
    if ((s = jfa::detail::locate_buffers(jfa::detail::backward_buffers(b), &kind)) != JFA_SUCCESS)
      return s;
    if (kind == MemoryKind::kDevice)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "the reference needs host buffers");
    if ((s = jfa::detail::validate_host_offsets(p)) != JFA_SUCCESS) return s;
    jfa::detail::attention_backward_reference_cpu(b, dq, dk, dv);
    return JFA_SUCCESS;
  });
}

}  // extern "C"
