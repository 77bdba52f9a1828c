// C entry points of the attention forward: validation, backend choice, dispatch.
#include <cmath>
#include <vector>

#include "api/buffer_checks.hpp"
#include "api/error.hpp"
#include "api/params_layouts.hpp"
#include "api/validate.hpp"
#include "cpu/attention_cpu.hpp"
#include "cpu/parallel.hpp"
#ifdef JFA_WITH_CUDA
#include "cuda/gpu_backends.hpp"
#endif

using jfa::detail::BufferView;
using jfa::detail::fail;
using jfa::detail::guarded;
using jfa::detail::MemoryKind;
using jfa::detail::Params;

extern "C" {

jfa_status jfa_attention_params_init_sized(jfa_attention_params* params, size_t struct_size) {
  if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  jfa::detail::clear_error();
  return jfa::detail::write_default_params(params, struct_size);
}

jfa_status(jfa_attention_params_init)(jfa_attention_params* params) {
  return jfa_attention_params_init_sized(params, sizeof(jfa::detail::AttentionParamsV1));
}

jfa_status jfa_attention_forward(const jfa_attention_params* params) {
  return guarded([&] {
    Params p;
    jfa_status s = jfa::detail::build_params(params, &p);
    if (s != JFA_SUCCESS) return s;
    MemoryKind kind;
    if ((s = jfa::detail::check_call_buffers(jfa::detail::forward_buffers(p), &kind)) !=
        JFA_SUCCESS)
      return s;
    const jfa_backend backend = jfa::detail::resolve_backend(params->backend, kind);
    if ((s = jfa::detail::check_backend_side(backend, kind)) != JFA_SUCCESS) return s;
#ifdef JFA_WITH_CUDA
    if (backend == JFA_BACKEND_CUDA) {
      const jfa::cuda::GpuBackend* gpu = nullptr;
      if ((s = jfa::cuda::current_gpu_backend(&gpu)) != JFA_SUCCESS) return s;
      return gpu->forward(p);
    }
#endif
    if ((s = jfa::detail::validate_host_offsets(p)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_sinks(p)) != JFA_SUCCESS) return s;
    if (p.device_check != nullptr) *p.device_check = 0;  // checked on the host, valid
    return jfa::detail::attention_forward_cpu(p);
  });
}

jfa_status jfa_attention_workspace_size(const jfa_attention_params* params, size_t* bytes) {
  return guarded([&] {
    if (params == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
    if (bytes == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "bytes must not be NULL");
    jfa_attention_params p;  // the caller's params in the current layout
    if (const jfa_status s = jfa::detail::read_params(params, &p); s != JFA_SUCCESS) return s;
    if (const jfa_status s = jfa::detail::check_batch_and_total_q(p.batch, p.total_q);
        s != JFA_SUCCESS)
      return s;
#ifdef JFA_WITH_CUDA
    *bytes = jfa::cuda::forward_workspace_bytes(p.total_q, p.batch);
#else
    *bytes = 0;
#endif
    return JFA_SUCCESS;
  });
}

jfa_status jfa_attention_reference(const jfa_attention_params* params, const int64_t* q_tokens,
                                   int64_t n_tokens, double* out, double* lse) {
  return guarded([&] {
    Params p;
    jfa_status s = jfa::detail::build_params(params, &p, /*needs_output=*/false);
    p.out = nullptr;
    p.lse = nullptr;
    if (s != JFA_SUCCESS) return s;
    if (q_tokens == nullptr && n_tokens != p.total_q)
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "n_tokens must equal total_q (%lld) when q_tokens is NULL, got %lld",
                  static_cast<long long>(p.total_q), static_cast<long long>(n_tokens));
    if (n_tokens < 0)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "n_tokens must be >= 0, got %lld",
                  static_cast<long long>(n_tokens));
    // The reference's own arrays too: the rows' tokens, out [n_tokens, heads_q, head_dim_v] and
    // lse [heads_q, n_tokens], in float64.
    std::vector<BufferView> buffers = jfa::detail::forward_buffers(p);
    buffers.push_back(
        jfa::detail::array_view("q_tokens", q_tokens, n_tokens, sizeof(int64_t), false));
    buffers.push_back(jfa::detail::packed_view("out", out, n_tokens, p.heads_q, p.head_dim_v,
                                               sizeof(double), true));
    buffers.push_back(
        jfa::detail::packed_view("lse", lse, n_tokens, p.heads_q, 1, sizeof(double), true));
    if ((s = jfa::detail::check_reference_buffers(buffers)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_offsets(p)) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_host_sinks(p)) != JFA_SUCCESS) return s;
    if (q_tokens != nullptr) {
      for (int64_t i = 0; i < n_tokens; ++i) {
        if (q_tokens[i] < 0 || q_tokens[i] >= p.total_q)
          return fail(JFA_ERROR_INVALID_ARGUMENT,
                      "q_tokens[%lld]=%lld is outside [0, total_q=%lld)", static_cast<long long>(i),
                      static_cast<long long>(q_tokens[i]), static_cast<long long>(p.total_q));
      }
    }
    if (n_tokens > 0 && out == nullptr)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "out must not be NULL when there are rows");
    jfa::detail::attention_reference_cpu(p, q_tokens, n_tokens, out, lse);
    return JFA_SUCCESS;
  });
}

jfa_status jfa_attention_flops(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                               int64_t batch, int32_t heads_q, int32_t head_dim, int causal,
                               double* flops) {
  return jfa_attention_flops_v(cu_seqlens_q, cu_seqlens_k, batch, heads_q, head_dim, head_dim,
                               causal, flops);
}

jfa_status jfa_attention_flops_v(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                 int64_t batch, int32_t heads_q, int32_t head_dim,
                                 int32_t head_dim_v, int causal, double* flops) {
  return guarded([&] {
    jfa_status s;
    if ((s = jfa::detail::check_aligned("flops", flops, sizeof(double))) != JFA_SUCCESS) return s;
    if ((s = jfa::detail::validate_offsets_named(cu_seqlens_q, batch, -1, "cu_seqlens_q")) !=
        JFA_SUCCESS)
      return s;
    if ((s = jfa::detail::validate_offsets_named(cu_seqlens_k, batch, -1, "cu_seqlens_k")) !=
        JFA_SUCCESS)
      return s;
    if (heads_q <= 0 || head_dim <= 0)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "heads_q and head_dim must be > 0");
    if (head_dim_v < 0)
      return fail(JFA_ERROR_INVALID_ARGUMENT, "head_dim_v must be > 0 (or 0 for head_dim)");
    if (flops == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "flops must not be NULL");
    double pairs = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const double lq = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
      const double lk = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
      if (!causal) {
        pairs += lq * lk;
      } else if (lq == lk) {
        pairs += lq * lk / 2;  // the usual convention: causal with equal lengths counts half
      } else {
        // Row i sees clamp(i + lk - lq + 1, 0, lk) keys (bottom-right aligned); sum in closed form.
        auto prefix = [lk](double x) {  // sum of min(a, lk) for a = 1..x
          if (x <= 0) return 0.0;
          return x <= lk ? x * (x + 1) / 2 : lk * (lk + 1) / 2 + (x - lk) * lk;
        };
        pairs += prefix(lk) - prefix(lk - lq);
      }
    }
    // Q K^T and P V, 2 FLOPs per multiply-add each; with equal sizes exactly 4 * pairs * heads *
    // head_dim (the factors of two are exact).
    const int64_t columns = int64_t{head_dim} + (head_dim_v == 0 ? head_dim : head_dim_v);
    *flops = 2.0 * pairs * heads_q * static_cast<double>(columns);
    return JFA_SUCCESS;
  });
}

const char* jfa_version(void) { return JFA_VERSION_STRING; }

int jfa_cpu_thread_count(void) { return jfa::detail::cpu_thread_count(); }

int jfa_cuda_available(void) {
#ifdef JFA_WITH_CUDA
  return jfa::cuda::gpu_backend_available() ? 1 : 0;
#else
  return 0;
#endif
}

}  // extern "C"
