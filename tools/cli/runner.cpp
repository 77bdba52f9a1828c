#include "cli/runner.hpp"

#include <cstdlib>
#include <limits>
#include <utility>

namespace jfa::cli {
namespace {

JaggedTensor host_view(const tools::HostBuffer& buffer, int64_t total, int32_t heads,
                       int32_t head_dim) {
  // JaggedTensor carries a mutable pointer; the library only reads inputs.
  return {const_cast<void*>(buffer.data()), buffer.dtype, total, heads, head_dim, 0, 0};
}

}  // namespace

AttentionCall make_host_call(const tools::JaggedBatch& batch, const RunConfig& config,
                             Backend backend) {
  AttentionCall call;
  call.q = host_view(batch.q, batch.total_q(), batch.heads_q, batch.head_dim);
  call.k = host_view(batch.k, batch.total_k(), batch.heads_kv, batch.head_dim);
  call.v = host_view(batch.v, batch.total_k(), batch.heads_kv, batch.value_dim());
  call.out = call.q;  // q's tokens and heads, v's columns
  call.out.data = nullptr;
  call.out.head_dim = batch.value_dim();
  call.cu_seqlens_q = batch.cu_q.data();
  call.cu_seqlens_k = batch.cu_k.data();
  call.batch = batch.batch();
  call.options.causal = config.causal;
  call.options.max_seqlen_q = max_length(batch.cu_q);
  call.options.max_seqlen_k = max_length(batch.cu_k);
  call.options.backend = backend;
  call.options.window_left = batch.window_left;
  call.options.window_right = batch.window_right;
  call.options.softcap = batch.softcap;
  // Host memory: what the CPU backend reads; the device runner points it at a device copy.
  call.options.sinks = batch.sinks.empty() ? nullptr : batch.sinks.data();
  if (config.paged != nullptr) {
    call.paged = config.paged->view();
    // The cache holds the keys: the packed fields stay unset, as the paged call requires.
    call.k.data = call.v.data = nullptr;
    call.k.total = call.v.total = 0;
    call.cu_seqlens_k = nullptr;
  }
  return call;
}

void AttentionCall::operator()() const {
  if (!paged) {
    attention(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, options);
    return;
  }
  const jfa_attention_params params = paged_params();
  check(jfa_attention_forward_paged(&params, &*paged));
}

jfa_attention_params AttentionCall::paged_params() const {
  jfa_attention_params params =
      make_params(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, options);
  params.workspace = paged_workspace;
  params.workspace_bytes = paged_workspace_bytes;
  return params;
}

std::vector<double> reference_of(const AttentionCall& call, std::span<const int64_t> tokens,
                                 std::vector<double>* lse) {
  if (!call.paged) {
    return attention_reference(call.q, call.k, call.v, call.cu_seqlens_q, call.cu_seqlens_k,
                               call.batch, call.options, tokens, lse);
  }
  jfa_attention_params params = call.paged_params();
  params.device_check = nullptr;  // the reference has no checked mode
  ReferenceRows rows = reference_rows(output_shape(call.q, call.v), tokens, lse);
  check(jfa_attention_reference_paged(&params, &*call.paged, rows.tokens, rows.n, rows.out.data(),
                                      lse != nullptr ? lse->data() : nullptr));
  return std::move(rows.out);
}

Gradients poisoned_gradients(const AttentionCall& call) {
  auto buffer = [](const JaggedTensor& like) {
    tools::HostBuffer b(like.dtype, like.total * like.heads * like.head_dim);
    tools::poison(b);
    return b;
  };
  Gradients g{buffer(call.q), buffer(call.k), buffer(call.v), {}};
  if (call.options.sinks != nullptr)
    g.dsinks.assign(static_cast<size_t>(call.q.heads), std::numeric_limits<float>::quiet_NaN());
  return g;
}

int cpu_threads() { return jfa::cpu_thread_count(); }

bool device_runner_available() {
#ifdef JFA_WITH_CUDA
  return cuda_available();
#else
  return false;
#endif
}

std::unique_ptr<Runner> make_runner(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::kCpu:
      return make_cpu_runner();
    case BackendChoice::kCuda:
      // Asked for on the command line: a build or machine without it is a usage error (exit 2).
      try {
        return make_device_runner();
      } catch (const Error& e) {
        if (e.status() != Status::kBackendUnavailable) throw;
        throw UsageError(e.what());
      }
    default:
      return device_runner_available() ? make_device_runner() : make_cpu_runner();
  }
}

}  // namespace jfa::cli
