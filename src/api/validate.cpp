#include "api/validate.hpp"

#include <cmath>
#include <limits>

#include "api/buffer_checks.hpp"
#include "api/enum_bits.hpp"
#include "api/error.hpp"
#include "api/params_layouts.hpp"

namespace jfa::detail {
namespace {

constexpr int64_t kMaxTotal = std::numeric_limits<int32_t>::max();
// A bound on |softmax_scale| under which its product with log2(e) stays finite in float32.
constexpr float kMaxScale = std::numeric_limits<float>::max() / 1.443f;

// The furthest element of a [total, heads, d] tensor with these strides must be addressable in
// int64.
jfa_status check_reach(const char* name, const Layout& layout, int64_t total, int32_t heads,
                       int32_t d) {
  const __int128 ts = layout.token_stride, hs = layout.head_stride;
  const __int128 reach = (total > 0 ? (total - 1) * ts : 0) + (heads - 1) * hs + d;
  if (reach > std::numeric_limits<int64_t>::max()) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "%s: strides times sizes overflow int64: token_stride=%lld head_stride=%lld for "
                "[%lld, %d, %d]",
                name, static_cast<long long>(layout.token_stride),
                static_cast<long long>(layout.head_stride), static_cast<long long>(total), heads,
                d);
  }
  return JFA_SUCCESS;
}

// A tensor [total, heads, d] with the given strides: every (token, head) row must be distinct and
// the furthest element must be addressable in int64.
jfa_status check_layout(const char* name, Layout& layout, int64_t total, int32_t heads, int32_t d) {
  if (layout.token_stride == 0 && layout.head_stride == 0) {
    layout.head_stride = d;
    layout.token_stride = static_cast<int64_t>(heads) * d;
    return check_reach(name, layout, total, heads, d);  // the sizes alone can overflow
  }
  if (layout.token_stride <= 0 || layout.head_stride <= 0) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "%s strides must both be > 0 (or both 0 for packed), got token_stride=%lld "
                "head_stride=%lld",
                name, static_cast<long long>(layout.token_stride),
                static_cast<long long>(layout.head_stride));
  }
  // A stride of a dimension of size 1 is never used to address an element: make it the packed one,
  // so that the rules below (and the overlap check of the call) see how the elements really lie.
  if (heads <= 1) layout.head_stride = d;
  if (total <= 1) layout.token_stride = static_cast<int64_t>(heads) * layout.head_stride;
  const __int128 ts = layout.token_stride, hs = layout.head_stride;
  // Rows are distinct when one dimension nests inside the other without overlap.
  const bool heads_inner = (heads == 1 || hs >= d) && (total <= 1 || ts >= hs * heads);
  const bool tokens_inner = (total <= 1 || ts >= d) && (heads == 1 || hs >= ts * total);
  if (!heads_inner && !tokens_inner) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "%s strides make rows overlap: token_stride=%lld head_stride=%lld for "
                "[%lld, %d, %d] (need head_stride >= head_dim and token_stride >= heads * "
                "head_stride, or the transposed nesting)",
                name, static_cast<long long>(layout.token_stride),
                static_cast<long long>(layout.head_stride), static_cast<long long>(total), heads,
                d);
  }
  return check_reach(name, layout, total, heads, d);
}

}  // namespace

jfa_status check_batch_and_total_q(int64_t batch, int64_t total_q) {
  if (batch < 0 || batch >= kMaxTotal)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "batch must be in [0, 2^31 - 1), got %lld",
                static_cast<long long>(batch));
  if (total_q < 0 || total_q > kMaxTotal)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "total_q must be in [0, 2^31 - 1], got %lld",
                static_cast<long long>(total_q));
  return JFA_SUCCESS;
}

namespace {
// build_params of a struct already in the current layout (read_params' result).
jfa_status build_current_params(const jfa_attention_params* in, Params* out, bool needs_output) {
  Params p{};
  p.q = in->q;
  p.k = in->k;
  p.v = in->v;
  p.out = in->out;
  p.lse = in->lse;
  p.cu_seqlens_q = in->cu_seqlens_q;
  p.cu_seqlens_k = in->cu_seqlens_k;
  p.batch = in->batch;
  p.total_q = in->total_q;
  p.total_k = in->total_k;
  p.heads_q = in->heads_q;
  p.heads_kv = in->heads_kv;
  p.head_dim = in->head_dim;
  p.head_dim_v = in->head_dim_v == 0 ? in->head_dim : in->head_dim_v;
  const int32_t dtype = enum_bits(in->dtype);
  const int32_t backend = enum_bits(in->backend);
  p.q_layout = {in->q_layout.token_stride, in->q_layout.head_stride};
  p.k_layout = {in->k_layout.token_stride, in->k_layout.head_stride};
  p.v_layout = {in->v_layout.token_stride, in->v_layout.head_stride};
  p.out_layout = {in->out_layout.token_stride, in->out_layout.head_stride};
  p.causal = in->causal != 0;
  p.window = resolve_window(p.causal, in->window_left, in->window_right);
  p.softcap = in->softcap;
  p.sinks = in->sinks;
  p.max_seqlen_q = in->max_seqlen_q;
  p.max_seqlen_k = in->max_seqlen_k;
  p.stream = in->stream;
  p.workspace = in->workspace;
  p.workspace_bytes = in->workspace_bytes;
  p.device_check = in->device_check;

  if (const jfa_status s = check_batch_and_total_q(p.batch, p.total_q); s != JFA_SUCCESS) return s;
  if (p.total_k < 0 || p.total_k > kMaxTotal)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "total_k must be in [0, 2^31 - 1], got %lld",
                static_cast<long long>(p.total_k));
  // cu_seqlens[batch] is the end of the last sequence and must equal the totals: with no
  // sequence, no token (known without reading the offsets, which the CUDA path never does).
  if (p.batch == 0 && (p.total_q > 0 || p.total_k > 0))
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "batch is 0, so total_q and total_k must be 0 (cu_seqlens[batch] ends the last "
                "sequence), got total_q=%lld total_k=%lld",
                static_cast<long long>(p.total_q), static_cast<long long>(p.total_k));
  if (p.heads_q <= 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "heads_q must be > 0, got %d", p.heads_q);
  if (p.heads_kv <= 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "heads_kv must be > 0, got %d", p.heads_kv);
  if (p.heads_q % p.heads_kv != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "heads_q must be a multiple of heads_kv (GQA/MQA), got heads_q=%d heads_kv=%d",
                p.heads_q, p.heads_kv);
  if (p.head_dim <= 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "head_dim must be > 0, got %d", p.head_dim);
  if (p.head_dim > kMaxHeadDim)
    return fail(JFA_ERROR_UNSUPPORTED, "head_dim %d is not supported (at most %d)", p.head_dim,
                kMaxHeadDim);
  if (in->head_dim_v < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "head_dim_v must be > 0 (or 0 for head_dim), got %d",
                in->head_dim_v);
  if (p.head_dim_v > kMaxHeadDim)
    return fail(JFA_ERROR_UNSUPPORTED, "head_dim_v %d is not supported (at most %d)", p.head_dim_v,
                kMaxHeadDim);
  if (dtype != JFA_DTYPE_FLOAT16 && dtype != JFA_DTYPE_BFLOAT16 && dtype != JFA_DTYPE_FLOAT32)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "dtype %d is not a jfa_dtype (float16=0, bfloat16=1, float32=2)", dtype);
  p.dtype = static_cast<jfa_dtype>(dtype);
  if (backend != JFA_BACKEND_AUTO && backend != JFA_BACKEND_CPU && backend != JFA_BACKEND_CUDA)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "backend %d is not a jfa_backend (auto=0, cpu=1, cuda=2)", backend);
  if (p.cu_seqlens_q == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "cu_seqlens_q must not be NULL (batch + 1 offsets)");
  if (p.cu_seqlens_k == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "cu_seqlens_k must not be NULL (batch + 1 offsets)");
  if (p.total_q > 0 && p.q == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "q must not be NULL when total_q > 0");
  if (needs_output && p.total_q > 0 && p.out == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "out must not be NULL when total_q > 0");
  if (p.total_k > 0 && p.k == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "k must not be NULL when total_k > 0");
  if (p.total_k > 0 && p.v == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "v must not be NULL when total_k > 0");
  if (p.max_seqlen_q < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "max_seqlen_q must be >= 0 (0 = unknown), got %d",
                p.max_seqlen_q);
  if (p.max_seqlen_k < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "max_seqlen_k must be >= 0 (0 = unknown), got %d",
                p.max_seqlen_k);

  if (std::isnan(in->softmax_scale)) {
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  } else if (!std::isfinite(in->softmax_scale)) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "softmax_scale must be finite (or NaN for the default)");
  } else if (std::fabs(in->softmax_scale) > kMaxScale) {
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "softmax_scale %g cannot be used: the kernels fold log2(e) into it, and "
                "|softmax_scale| * log2(e) must stay finite in float32 (|softmax_scale| <= %g)",
                static_cast<double>(in->softmax_scale), static_cast<double>(kMaxScale));
  } else {
    p.softmax_scale = in->softmax_scale;
  }

  if (in->window_left < -1 || in->window_right < -1)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "window_left and window_right must be >= 0, or -1 for unbounded, got "
                "window_left=%d window_right=%d",
                in->window_left, in->window_right);
  if (!(in->softcap >= 0.0f) || !std::isfinite(in->softcap))
    return fail(JFA_ERROR_INVALID_ARGUMENT, "softcap must be finite and >= 0 (0 = off), got %g",
                static_cast<double>(in->softcap));

  jfa_status s;
  if ((s = check_layout("q", p.q_layout, p.total_q, p.heads_q, p.head_dim)) != JFA_SUCCESS)
    return s;
  if ((s = check_layout("k", p.k_layout, p.total_k, p.heads_kv, p.head_dim)) != JFA_SUCCESS)
    return s;
  if ((s = check_layout("v", p.v_layout, p.total_k, p.heads_kv, p.head_dim_v)) != JFA_SUCCESS)
    return s;
  if (needs_output &&
      (s = check_layout("out", p.out_layout, p.total_q, p.heads_q, p.head_dim_v)) != JFA_SUCCESS)
    return s;
  *out = p;
  return JFA_SUCCESS;
}
}  // namespace

jfa_status build_params(const jfa_attention_params* caller, Params* out, bool needs_output) {
  if (caller == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  jfa_attention_params current;
  if (const jfa_status s = read_params(caller, &current); s != JFA_SUCCESS) return s;
  return build_current_params(&current, out, needs_output);
}

jfa_status build_backward_params(const jfa_attention_backward_params* caller, BackwardParams* out,
                                 bool for_reference) {
  if (caller == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "params must not be NULL");
  jfa_attention_backward_params current;
  if (const jfa_status s = read_backward_params(caller, &current); s != JFA_SUCCESS) return s;
  const jfa_attention_backward_params* in = &current;
  BackwardParams b{};
  if (const jfa_status s = build_current_params(&in->forward, &b.fwd, !for_reference);
      s != JFA_SUCCESS)
    return s;
  const Params& p = b.fwd;
  b.dout = in->dout;
  b.dout_layout = {in->dout_layout.token_stride, in->dout_layout.head_stride};
  b.dlse = in->dlse;
  b.deterministic = in->deterministic != 0;
  b.dsinks = in->dsinks;
  if (b.dsinks != nullptr && p.sinks == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "dsinks is set but forward.sinks is NULL: there is no sink to differentiate");
  if (p.total_q > 0 && b.dout == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dout must not be NULL when total_q > 0");
  jfa_status s;
  if ((s = check_layout("dout", b.dout_layout, p.total_q, p.heads_q, p.head_dim_v)) != JFA_SUCCESS)
    return s;
  if (for_reference) {  // the reference reads q, k, v, dout, dlse and sinks only
    b.fwd.out = nullptr;
    b.fwd.lse = nullptr;
    b.dsinks = nullptr;
    *out = b;
    return JFA_SUCCESS;
  }
  if (p.total_q > 0 && p.lse == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT,
                "forward.lse must not be NULL: the backward needs the forward's LSE");
  b.dq = in->dq;
  b.dk = in->dk;
  b.dv = in->dv;
  b.dq_layout = {in->dq_layout.token_stride, in->dq_layout.head_stride};
  b.dk_layout = {in->dk_layout.token_stride, in->dk_layout.head_stride};
  b.dv_layout = {in->dv_layout.token_stride, in->dv_layout.head_stride};
  if (p.total_q > 0 && b.dq == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dq must not be NULL when total_q > 0");
  if (p.total_k > 0 && b.dk == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dk must not be NULL when total_k > 0");
  if (p.total_k > 0 && b.dv == nullptr)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "dv must not be NULL when total_k > 0");
  if ((s = check_layout("dq", b.dq_layout, p.total_q, p.heads_q, p.head_dim)) != JFA_SUCCESS)
    return s;
  if ((s = check_layout("dk", b.dk_layout, p.total_k, p.heads_kv, p.head_dim)) != JFA_SUCCESS)
    return s;
  if ((s = check_layout("dv", b.dv_layout, p.total_k, p.heads_kv, p.head_dim_v)) != JFA_SUCCESS)
    return s;
  *out = b;
  return JFA_SUCCESS;
}

jfa_status validate_offsets_named(const int32_t* offsets, int64_t batch, int64_t total,
                                  const char* name) {
  if (offsets == nullptr) return fail(JFA_ERROR_INVALID_ARGUMENT, "%s must not be NULL", name);
  if (const jfa_status s = check_aligned(name, offsets, sizeof(int32_t)); s != JFA_SUCCESS)
    return s;
  if (batch < 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "batch must be >= 0, got %lld",
                static_cast<long long>(batch));
  if (offsets[0] != 0)
    return fail(JFA_ERROR_INVALID_ARGUMENT, "%s[0] must be 0, got %d", name, offsets[0]);
  for (int64_t i = 1; i <= batch; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "%s must be non-decreasing; %s[%lld]=%d < %s[%lld]=%d", name, name,
                  static_cast<long long>(i), offsets[i], name, static_cast<long long>(i - 1),
                  offsets[i - 1]);
    }
  }
  if (total >= 0 && offsets[batch] != total) {
    return fail(JFA_ERROR_INVALID_ARGUMENT, "%s[batch]=%s[%lld]=%d must equal the total %lld", name,
                name, static_cast<long long>(batch), offsets[batch], static_cast<long long>(total));
  }
  return JFA_SUCCESS;
}

namespace {
jfa_status check_hint(const int32_t* offsets, int64_t batch, int32_t hint, const char* name) {
  if (hint == 0) return JFA_SUCCESS;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t len = offsets[b + 1] - offsets[b];
    if (len > hint) {
      return fail(JFA_ERROR_INVALID_ARGUMENT,
                  "%s=%d is smaller than the length %d of sequence %lld", name, hint, len,
                  static_cast<long long>(b));
    }
  }
  return JFA_SUCCESS;
}
}  // namespace

jfa_status validate_host_sinks(const Params& p) {
  if (p.sinks == nullptr) return JFA_SUCCESS;
  for (int32_t h = 0; h < p.heads_q; ++h)
    if (!std::isfinite(p.sinks[h]))
      return fail(JFA_ERROR_INVALID_ARGUMENT, "sinks[%d] is %g: sinks must be finite", h,
                  static_cast<double>(p.sinks[h]));
  return JFA_SUCCESS;
}

jfa_status validate_host_offsets(const Params& p) {
  jfa_status s;
  if ((s = validate_offsets_named(p.cu_seqlens_q, p.batch, p.total_q, "cu_seqlens_q")) !=
      JFA_SUCCESS)
    return s;
  if ((s = validate_offsets_named(p.cu_seqlens_k, p.batch, p.total_k, "cu_seqlens_k")) !=
      JFA_SUCCESS)
    return s;
  if ((s = check_hint(p.cu_seqlens_q, p.batch, p.max_seqlen_q, "max_seqlen_q")) != JFA_SUCCESS)
    return s;
  return check_hint(p.cu_seqlens_k, p.batch, p.max_seqlen_k, "max_seqlen_k");
}

}  // namespace jfa::detail
