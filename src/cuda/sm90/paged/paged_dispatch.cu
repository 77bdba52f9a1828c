// The Hopper paged forward: what it takes (checked before anything is launched), the plan
// (paged_plan.hpp), then the launches on the call's stream: the checked mode's kernels, the append,
// the decode kernel per (dtype, head_dim) and, with several splits, the combine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/params.hpp"
#include "common/status.hpp"
#include "cuda/common/device_facts.hpp"
#include "cuda/sm90/host/call_workspace.hpp"
#include "cuda/sm90/host/env_switch.hpp"
#include "cuda/sm90/host/head_sizes.hpp"
#include "cuda/sm90/host/launch_error.hpp"
#include "cuda/sm90/host/shared_memory_opt_in.hpp"
#include "cuda/sm90/host/support.hpp"
#include "cuda/sm90/paged/paged_append.cuh"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_check.cuh"
#include "cuda/sm90/paged/paged_combine.cuh"
#include "cuda/sm90/paged/paged_config.hpp"
#include "cuda/sm90/paged/paged_decode.cuh"
#include "cuda/sm90/paged/paged_head_dims.hpp"
#include "cuda/sm90/paged/paged_plan.hpp"
#include "cuda/sm90/paged/paged_prefill.hpp"
#include "cuda/sm90/paged/paged_sm90.hpp"

namespace jfa::sm90 {
namespace {

using jfa::detail::fail;
using jfa::detail::Params;

// "64, 128 and 256" of this build (JFA_SM90_HEAD_DIMS may leave some out).
std::string paged_head_dims() {
  std::string list;
  int left = 0;
  for (int d : kPagedHeadDims) left += head_dim_built(d) ? 1 : 0;
  for (int d : kPagedHeadDims) {
    if (!head_dim_built(d)) continue;
    if (!list.empty()) list += left == 1 ? " and " : ", ";
    list += std::to_string(d);
    --left;
  }
  return list.empty() ? "none" : list;
}

bool paged_head_dim(int d) {
  return std::find(std::begin(kPagedHeadDims), std::end(kPagedHeadDims), d) !=
             std::end(kPagedHeadDims) &&
         head_dim_built(d);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// What the kernels take, JFA_ERROR_UNSUPPORTED naming the rest; *facts is the current device's.
jfa_status check_paged_supported(const Params& p, const jfa_paged_kv& kv,
                                 const jfa::cuda::DeviceFacts** facts_out) {
  const jfa::cuda::DeviceFacts* facts = nullptr;
  if (const jfa_status s =
          current_hopper_device("the CUDA paged forward runs on 9.0 (Hopper)", &facts);
      s != JFA_SUCCESS)
    return s;
  if (p.dtype != JFA_DTYPE_FLOAT16 && p.dtype != JFA_DTYPE_BFLOAT16)
    return fail(JFA_ERROR_UNSUPPORTED,
                "dtype float32: the CUDA paged forward takes fp16 and bf16 (float32 on the CPU "
                "backend)");
  if (p.head_dim_v != p.head_dim)
    return fail(JFA_ERROR_UNSUPPORTED,
                "head_dim %d with head_dim_v %d: the CUDA paged forward takes equal key and value "
                "head sizes",
                p.head_dim, p.head_dim_v);
  if (!paged_head_dim(p.head_dim))
    return fail(JFA_ERROR_UNSUPPORTED,
                "head_dim %d: the CUDA paged forward takes head_dim %s in this build", p.head_dim,
                paged_head_dims().c_str());
  if (!(p.softmax_scale > 0.f))
    return fail(JFA_ERROR_UNSUPPORTED,
                "softmax_scale %g: the CUDA paged forward takes softmax_scale > 0",
                static_cast<double>(p.softmax_scale));
  // The launch is planned from the hint alone: cu_seqlens_q is device memory, and reading it
  // would block the host and break graph capture.
  constexpr int32_t most_tokens = kPagedMaxQueryTokens;
  if (p.max_seqlen_q == 0)
    return fail(JFA_ERROR_UNSUPPORTED,
                "the CUDA paged forward needs max_seqlen_q (the longest query sequence, at most "
                "%d) to plan its launch without reading cu_seqlens_q: set the hint",
                most_tokens);
  if (p.max_seqlen_q > most_tokens)
    return fail(JFA_ERROR_UNSUPPORTED,
                "max_seqlen_q %d: the CUDA paged forward takes at most %d query tokens per "
                "sequence (split a longer chunked prefill into chunks of at most that many)",
                p.max_seqlen_q, most_tokens);
  if (p.total_q > p.batch * p.max_seqlen_q)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "max_seqlen_q=%d is smaller than the longest q sequence: total_q %lld is more than "
                "batch %lld times it",
                p.max_seqlen_q, static_cast<long long>(p.total_q), static_cast<long long>(p.batch));
  const TensorArg tensors[] = {{p.q, &p.q_layout, "q"}, {p.out, &p.out_layout, "out"}};
  if (const jfa_status s = check_tensors_supported(tensors, 2); s != JFA_SUCCESS) return s;
  if (!aligned16(kv.k_cache) || !aligned16(kv.v_cache))
    return fail(JFA_ERROR_UNSUPPORTED,
                "kv->k_cache and kv->v_cache must be 16-byte aligned for the CUDA paged forward");
  if (kv.k_new != nullptr && (!aligned16(kv.k_new) || !aligned16(kv.v_new)))
    return fail(JFA_ERROR_UNSUPPORTED,
                "kv->k_new and kv->v_new must be 16-byte aligned for the CUDA paged forward's "
                "append");
  // A sequence's rows (query heads of a KV head times tokens) are counted in int32.
  if (static_cast<int64_t>(p.group_size()) * p.max_seqlen_q > INT32_MAX)
    return fail(JFA_ERROR_UNSUPPORTED,
                "%d query heads per KV head times max_seqlen_q %d: too many rows for the CUDA "
                "paged forward",
                p.group_size(), p.max_seqlen_q);
  *facts_out = facts;
  return JFA_SUCCESS;
}

// What the plan reads of p: the launch and the size query build it alike.
PagedShape paged_shape(const Params& p) {
  return {p.batch,    p.total_q,      p.heads_q,      p.heads_kv,
          p.head_dim, p.max_seqlen_q, p.max_seqlen_k, p.window.left};
}

// The shapes check_paged_supported lets through, from sizes and hints alone (every head size the
// kernels have, built or not: the answer may exceed what a build that lacks one runs).
bool paged_kernels_take(const Params& p) {
  return (p.dtype == JFA_DTYPE_FLOAT16 || p.dtype == JFA_DTYPE_BFLOAT16) &&
         p.head_dim_v == p.head_dim && paged_rows_per_cta(p.head_dim) != 0 && p.max_seqlen_q >= 1 &&
         p.max_seqlen_q <= kPagedMaxQueryTokens;
}

// The kernels' arguments. maybe_unused, as launch_checks: a build whose JFA_SM90_HEAD_DIMS holds
// none of the paged head sizes launches nothing.
[[maybe_unused]] PagedArgs make_args(const Params& p, const jfa_paged_kv& kv,
                                     const PagedPlan& plan) {
  PagedArgs a{};
  a.q = p.q;
  a.out = p.out;
  a.lse = p.lse;
  a.k_cache = kv.k_cache;
  a.v_cache = kv.v_cache;
  a.block_table = kv.block_table;
  a.seqused_k = kv.seqused_k;
  a.cu_q = p.cu_seqlens_q;
  a.k_new = kv.k_new;
  a.v_new = kv.v_new;
  a.cu_new = kv.k_new != nullptr ? kv.cu_seqlens_new : nullptr;
  a.total_new = kv.k_new != nullptr ? kv.total_new : 0;
  // Whole 16-byte vectors: head_dim is 64, 128 or 256 of 2-byte elements.
  a.k_row_vecs = static_cast<int32_t>(int64_t{p.heads_kv} * p.head_dim * 2 / 16);
  a.v_row_vecs = static_cast<int32_t>(int64_t{p.heads_kv} * p.head_dim_v * 2 / 16);
  a.sinks = p.sinks;
  a.device_check = p.device_check;
  a.q_token_stride = p.q_layout.token_stride;
  a.q_head_stride = p.q_layout.head_stride;
  a.out_token_stride = p.out_layout.token_stride;
  a.out_head_stride = p.out_layout.head_stride;
  a.batch = p.batch;
  a.total_q = p.total_q;
  a.num_pages = kv.num_pages;
  a.heads_q = p.heads_q;
  a.heads_kv = p.heads_kv;
  a.group = p.group_size();
  a.page_size = kv.page_size;
  a.max_pages_per_seq = kv.max_pages_per_seq;
  a.page_shift = page_shift_of(kv.page_size);
  a.max_q = p.max_seqlen_q;
  a.max_k = p.max_seqlen_k;
  a.row_blocks = plan.row_blocks;
  a.splits = plan.splits;
  a.min_split_keys = kPagedMinSplitKeys;
  a.window = p.window;
  a.softcap = p.softcap;
  a.softcap_in = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  a.score_scale = p.softcap > 0.f ? 1.f : p.softmax_scale;
  a.score_scale_log2 = static_cast<float>(static_cast<double>(a.score_scale) * 1.4426950408889634);
  return a;
}

// The checked mode's kernels: the lengths (storing the word), then the table and, with an append,
// the pages that receive new rows.
[[maybe_unused]] jfa_status launch_checks(const PagedArgs& a, const jfa::cuda::DeviceFacts& device,
                                          cudaStream_t stream) {
  if (a.device_check == nullptr) return JFA_SUCCESS;
  paged_check_lengths_kernel<<<1, kPagedCheckThreads, 0, stream>>>(a);
  if (const jfa_status s = launch_error("paged lengths check"); s != JFA_SUCCESS) return s;
  const int64_t entries = a.batch * a.max_pages_per_seq;
  if (entries == 0) return JFA_SUCCESS;
  const int64_t blocks =
      std::min<int64_t>((entries + kPagedTableCheckThreads - 1) / kPagedTableCheckThreads,
                        int64_t{4} * std::max(device.sm_count, 1));
  paged_check_table_kernel<<<static_cast<unsigned>(blocks), kPagedTableCheckThreads, 0, stream>>>(
      a);
  if (const jfa_status s = launch_error("paged block-table check"); s != JFA_SUCCESS) return s;
  if (a.cu_new == nullptr || a.batch < 2) return JFA_SUCCESS;
  paged_check_append_pages_kernel<<<static_cast<unsigned>(blocks), kPagedTableCheckThreads, 0,
                                    stream>>>(a);
  return launch_error("paged append pages check");
}

// JFA_CUDA_UNVERIFIED_PAGED_PDL=1: the combine after the decode kernel launched as its
// programmatic dependent, so that its launch overlaps the decode kernel's last CTAs (built for
// measurement beside the separate launch, not yet run on a GPU; few sequences, where the combine's
// launch is a visible share of a step).
[[maybe_unused]] bool dependent_combine_asked() {
  return env_is("JFA_CUDA_UNVERIFIED_PAGED_PDL", "1");
}

// The append: the new rows into their pages, before the decode kernel reads them.
[[maybe_unused]] jfa_status launch_append(const PagedArgs& a, const jfa::cuda::DeviceFacts& device,
                                          cudaStream_t stream) {
  if (a.cu_new == nullptr || a.total_new == 0 || a.batch == 0) return JFA_SUCCESS;
  const int64_t blocks = std::min<int64_t>(a.total_new, int64_t{16} * std::max(device.sm_count, 1));
  paged_append_kernel<<<static_cast<unsigned>(blocks), kPagedAppendThreads, 0, stream>>>(a);
  return launch_error("paged append kernel");
}

template <typename T, int kD>
jfa_status run_paged(const Params& p, const jfa_paged_kv& kv,
                     const jfa::cuda::DeviceFacts& device) {
  using C = PagedConfig<kD>;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  static_assert(paged_rows_per_cta(kD) == C::kRowsPerCta, "the plan counts the CTA's rows");
  const PagedPlan plan = plan_paged(paged_shape(p), device.sm_count);
  if (plan.ctas > INT32_MAX)
    return fail(JFA_ERROR_UNSUPPORTED,
                "batch %lld with %d KV heads: too many CTAs (%lld) for the CUDA paged forward",
                static_cast<long long>(p.batch), p.heads_kv, static_cast<long long>(plan.ctas));
  PagedArgs a = make_args(p, kv, plan);
  // Everything that can reject the call comes before the first launch: a rejected call writes
  // nothing, the checked mode's word included.
  const bool compute = p.total_q > 0 && p.batch > 0;
  // The caller's workspace (jfa_attention_paged_workspace_size, which plans with at least this
  // device's SMs) when it is large enough, else one allocated in stream order (a caller's sized for
  // the packed forward is usually too small, and stays usable that way).
  auto acquire = [&](CallWorkspace& workspace, size_t bytes) {
    Params wp = p;
    if (wp.workspace != nullptr && wp.workspace_bytes < bytes) wp.workspace = nullptr;
    return workspace.acquire(wp, bytes, stream);
  };
  if (compute && paged_prefill_takes(p, kv, device)) {
    CallWorkspace workspace;
    if (const jfa_status s = acquire(workspace, paged_prefill_workspace_bytes(p)); s != JFA_SUCCESS)
      return s;
    if (const jfa_status s = launch_checks(a, device, stream); s != JFA_SUCCESS) return s;
    if (const jfa_status s = launch_append(a, device, stream); s != JFA_SUCCESS) return s;
    return paged_prefill_forward(p, kv, a, device, workspace.base());
  }
  // The combine as the decode kernel's programmatic dependent (built for measurement).
  const bool dependent_combine = compute && plan.splits > 1 && dependent_combine_asked();
  if (compute) {
    if (const jfa_status s =
            dependent_combine
                ? opt_in_shared_memory<paged_decode_kernel<T, kD, true>>(C::kSmemBytes,
                                                                         device.ordinal)
                : opt_in_shared_memory<paged_decode_kernel<T, kD>>(C::kSmemBytes, device.ordinal);
        s != JFA_SUCCESS)
      return s;
  }
  // The splits' partials.
  CallWorkspace workspace;
  if (compute && plan.splits > 1) {
    if (const jfa_status s = acquire(workspace, plan.workspace_bytes); s != JFA_SUCCESS) return s;
    a.part_o = reinterpret_cast<float*>(workspace.base());
    a.part_ml = reinterpret_cast<float2*>(workspace.base() + plan.workspace_ml_offset);
  }
  if (const jfa_status s = launch_checks(a, device, stream); s != JFA_SUCCESS) return s;
  if (const jfa_status s = launch_append(a, device, stream); s != JFA_SUCCESS) return s;
  if (!compute) return JFA_SUCCESS;
  if (dependent_combine)
    paged_decode_kernel<T, kD, true>
        <<<static_cast<unsigned>(plan.ctas), C::kThreads, C::kSmemBytes, stream>>>(a);
  else
    paged_decode_kernel<T, kD>
        <<<static_cast<unsigned>(plan.ctas), C::kThreads, C::kSmemBytes, stream>>>(a);
  if (const jfa_status s = launch_error("paged decode kernel"); s != JFA_SUCCESS) return s;
  if (plan.splits == 1) return JFA_SUCCESS;
  return dependent_combine ? launch_paged_combine<T, kD, true>(a, device.sm_count, stream)
                           : launch_paged_combine<T, kD>(a, device.sm_count, stream);
}

template <int kD>
jfa_status run_paged_dtype(const Params& p, const jfa_paged_kv& kv,
                           const jfa::cuda::DeviceFacts& device) {
  return p.dtype == JFA_DTYPE_FLOAT16 ? run_paged<__half, kD>(p, kv, device)
                                      : run_paged<__nv_bfloat16, kD>(p, kv, device);
}

}  // namespace

jfa_status paged_forward_workspace_bytes(const Params& p, size_t* bytes) {
  *bytes = 0;
  if (!paged_kernels_take(p)) return JFA_SUCCESS;
  // The partials of the most splits, total_q * heads_q rows of head_dim + 2 floats each, must fit
  // size_t (calls whose q fits in memory are far from it).
  if (static_cast<double>(p.total_q) * p.heads_q * kPagedMaxSplits * (p.head_dim + 2) *
          sizeof(float) >
      9.0e18)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "total_q %lld times heads_q %d is too large for the CUDA paged forward's workspace",
                static_cast<long long>(p.total_q), p.heads_q);
  *bytes = paged_workspace_bytes(paged_shape(p));
  if (paged_prefill_may_take(p)) *bytes = std::max(*bytes, paged_prefill_workspace_bytes(p));
  return JFA_SUCCESS;
}

jfa_status paged_forward(const Params& p, const jfa_paged_kv& kv) {
  const jfa::cuda::DeviceFacts* facts = nullptr;
  if (const jfa_status s = check_paged_supported(p, kv, &facts); s != JFA_SUCCESS) return s;
  return visit_paged_head_dim(p.head_dim, [&](auto head_dim) {
    return run_paged_dtype<decltype(head_dim)::value>(p, kv, *facts);
  });
}

}  // namespace jfa::sm90
