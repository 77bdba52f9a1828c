// jfa — Jagged Flash Attention: the C++ API, a thin header-only layer over the C ABI in jfa.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "jfa/jfa.h"

namespace jfa {

enum class Status : int {
  kSuccess = JFA_SUCCESS,
  kInvalidArgument = JFA_ERROR_INVALID_ARGUMENT,
  kUnsupported = JFA_ERROR_UNSUPPORTED,
  kBackendUnavailable = JFA_ERROR_BACKEND_UNAVAILABLE,
  kCuda = JFA_ERROR_CUDA,
  kOutOfMemory = JFA_ERROR_OUT_OF_MEMORY,
  kInternal = JFA_ERROR_INTERNAL,
};

enum class DType : int {
  kFloat16 = JFA_DTYPE_FLOAT16,
  kBFloat16 = JFA_DTYPE_BFLOAT16,
  kFloat32 = JFA_DTYPE_FLOAT32,
};

enum class Backend : int {
  kAuto = JFA_BACKEND_AUTO,
  kCpu = JFA_BACKEND_CPU,
  kCuda = JFA_BACKEND_CUDA
};

// Thrown by the C++ API when a C entry point fails; carries the status and the message.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

inline void check(jfa_status status) {
  if (status != JFA_SUCCESS) {
    throw Error(static_cast<Status>(status), jfa_last_error_message());
  }
}

inline std::string version() { return jfa_version(); }
inline bool cuda_available() { return jfa_cuda_available() != 0; }
inline int cpu_thread_count() { return jfa_cpu_thread_count(); }
inline std::size_t dtype_size(DType dtype) { return jfa_dtype_size(static_cast<jfa_dtype>(dtype)); }

// A view of a jagged tensor [total, heads, head_dim]; strides in elements, 0 meaning packed. v and
// out (dout and dv in the backward) may have a head_dim of their own (head_dim_v in jfa.h).
struct JaggedTensor {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
  int64_t total = 0;
  int32_t heads = 0;
  int32_t head_dim = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// Device scratch memory that the library keeps across calls (see jfa_workspace in jfa.h): pass it
// in AttentionOptions so that a steady stream of calls allocates nothing. One per stream and
// device; not thread-safe. Move-only.
class Workspace {
 public:
  Workspace() { check(jfa_workspace_create(&handle_)); }
  ~Workspace() { jfa_workspace_destroy(handle_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      jfa_workspace_destroy(handle_);
      handle_ = other.handle_;
      other.handle_ = nullptr;
    }
    return *this;
  }
  // Points p.workspace at enough memory for a call with p, growing it if needed.
  void prepare(jfa_attention_params& p) {
    if (handle_ == nullptr) throw Error(Status::kInvalidArgument, "moved-from jfa::Workspace");
    check(jfa_workspace_prepare(handle_, &p));
  }
  // The same for a backward call (p.forward.workspace).
  void prepare(jfa_attention_backward_params& p) {
    if (handle_ == nullptr) throw Error(Status::kInvalidArgument, "moved-from jfa::Workspace");
    check(jfa_workspace_prepare_backward(handle_, &p));
  }
  // The same for a call over a paged KV cache (jfa_attention_forward_paged with kv).
  void prepare(jfa_attention_params& p, const jfa_paged_kv& kv) {
    if (handle_ == nullptr) throw Error(Status::kInvalidArgument, "moved-from jfa::Workspace");
    check(jfa_workspace_prepare_paged(handle_, &p, &kv));
  }

 private:
  jfa_workspace* handle_ = nullptr;
};

struct AttentionOptions {
  bool causal = false;
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  float* lse = nullptr;                // optional float32 [heads_q, total_q]
  int32_t max_seqlen_q = 0;            // optional hints, 0 = unknown
  int32_t max_seqlen_k = 0;
  Backend backend = Backend::kAuto;
  void* stream = nullptr;          // cudaStream_t
  Workspace* workspace = nullptr;  // optional; without one the CUDA backend allocates per call
  // Optional checked mode: one int32 in the memory of the tensors (jfa_attention_params::
  // device_check); device_check_message() says what a word read back reports.
  int32_t* device_check = nullptr;
  // Local attention (jfa_attention_params::window_left/right): -1 unbounded; causal wins over
  // window_right.
  int32_t window_left = -1;
  int32_t window_right = -1;
  float softcap = 0.0f;          // 0: off; c > 0 maps scores s to c tanh(s / c)
  const float* sinks = nullptr;  // optional float32 [heads_q], in the tensors' memory
};

inline std::string device_check_message(int32_t word) { return jfa_device_check_message(word); }

inline jfa_attention_params make_params(const JaggedTensor& q, const JaggedTensor& k,
                                        const JaggedTensor& v, const JaggedTensor& out,
                                        const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                        int64_t batch, const AttentionOptions& options) {
  jfa_attention_params p;
  check(jfa_attention_params_init(&p));
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = options.lse;
  p.cu_seqlens_q = cu_seqlens_q;
  p.cu_seqlens_k = cu_seqlens_k;
  p.batch = batch;
  p.total_q = q.total;
  p.total_k = k.total;
  p.heads_q = q.heads;
  p.heads_kv = k.heads;
  p.head_dim = q.head_dim;
  p.head_dim_v = v.head_dim;
  p.dtype = static_cast<jfa_dtype>(q.dtype);
  p.q_layout = {q.token_stride, q.head_stride};
  p.k_layout = {k.token_stride, k.head_stride};
  p.v_layout = {v.token_stride, v.head_stride};
  p.out_layout = {out.token_stride, out.head_stride};
  if (options.softmax_scale) p.softmax_scale = *options.softmax_scale;
  p.causal = options.causal ? 1 : 0;
  p.max_seqlen_q = options.max_seqlen_q;
  p.max_seqlen_k = options.max_seqlen_k;
  p.backend = static_cast<jfa_backend>(options.backend);
  p.stream = options.stream;
  p.device_check = options.device_check;
  p.window_left = options.window_left;
  p.window_right = options.window_right;
  p.softcap = options.softcap;
  p.sinks = options.sinks;
  return p;
}

// Checks that the views agree with each other (the C layer checks everything else).
inline void check_views(const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v,
                        const JaggedTensor& out) {
  if (k.dtype != q.dtype || v.dtype != q.dtype || out.dtype != q.dtype)
    throw Error(Status::kInvalidArgument, "q, k, v and out must have the same dtype");
  if (v.total != k.total || v.heads != k.heads)
    throw Error(Status::kInvalidArgument, "v must have the shape of k ([total_k, heads_kv, d])");
  if (out.total != q.total || out.heads != q.heads)
    throw Error(Status::kInvalidArgument, "out must have the shape of q ([total_q, heads_q, d])");
  if (k.head_dim != q.head_dim)
    throw Error(Status::kInvalidArgument, "q and k must have the same head_dim");
  if (out.head_dim != v.head_dim)
    throw Error(Status::kInvalidArgument, "out must have the head_dim of v (head_dim_v)");
}

// A view of out's shape (q's tokens and heads, v's head_dim) without data, for the references.
inline JaggedTensor output_shape(const JaggedTensor& q, const JaggedTensor& v) {
  JaggedTensor out = q;
  out.data = nullptr;
  out.head_dim = v.head_dim;
  out.token_stride = out.head_stride = 0;
  return out;
}

inline bool same_shape(const JaggedTensor& a, const JaggedTensor& b) {
  return a.dtype == b.dtype && a.total == b.total && a.heads == b.heads && a.head_dim == b.head_dim;
}

// out = jagged attention of q, k, v. cu_seqlens_k may be the same pointer as cu_seqlens_q.
inline void attention(const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v,
                      const JaggedTensor& out, const int32_t* cu_seqlens_q,
                      const int32_t* cu_seqlens_k, int64_t batch,
                      const AttentionOptions& options = {}) {
  check_views(q, k, v, out);
  jfa_attention_params p = make_params(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, options);
  if (options.workspace != nullptr) options.workspace->prepare(p);
  check(jfa_attention_forward(&p));
}

// The gradients of a forward call (see jfa_attention_backward): q, k, v, out and the forward's
// LSE (options.lse, required) as that call had them, dout the gradient of the loss with respect to
// out; dq, dk, dv receive the gradients (views shaped like q, k, v). `deterministic` asks for
// bit-identical results from run to run.
struct BackwardViews {
  JaggedTensor dout, dq, dk, dv;
  const float* dlse = nullptr;  // optional: the gradient with respect to the forward's LSE
  float* dsinks = nullptr;      // optional float32 [heads_q]: the gradient of options.sinks
};

inline jfa_attention_backward_params make_backward_params(
    const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v, const JaggedTensor& out,
    const BackwardViews& grads, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
    int64_t batch, const AttentionOptions& options, bool deterministic) {
  check_views(q, k, v, out);
  if (!same_shape(grads.dout, out) || !same_shape(grads.dq, q) || !same_shape(grads.dk, k) ||
      !same_shape(grads.dv, v))
    throw Error(Status::kInvalidArgument,
                "dout must have the shape and dtype of out, dq, dk and dv those of q, k and v");
  jfa_attention_backward_params p;
  check(jfa_attention_backward_params_init(&p));
  p.forward = make_params(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, options);
  p.dout = grads.dout.data;
  p.dq = grads.dq.data;
  p.dk = grads.dk.data;
  p.dv = grads.dv.data;
  p.dlse = grads.dlse;
  p.dsinks = grads.dsinks;
  p.dout_layout = {grads.dout.token_stride, grads.dout.head_stride};
  p.dq_layout = {grads.dq.token_stride, grads.dq.head_stride};
  p.dk_layout = {grads.dk.token_stride, grads.dk.head_stride};
  p.dv_layout = {grads.dv.token_stride, grads.dv.head_stride};
  p.deterministic = deterministic ? 1 : 0;
  return p;
}

inline void attention_backward(const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v,
                               const JaggedTensor& out, const BackwardViews& grads,
                               const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                               int64_t batch, const AttentionOptions& options = {},
                               bool deterministic = false) {
  jfa_attention_backward_params p = make_backward_params(
      q, k, v, out, grads, cu_seqlens_q, cu_seqlens_k, batch, options, deterministic);
  if (options.workspace != nullptr) options.workspace->prepare(p);
  check(jfa_attention_backward(&p));
}

// The float64 reference backward over host memory: packed dq [total_q, heads_q, d], dk
// [total_k, heads_kv, d] and dv [total_k, heads_kv, d_v] from q, k, v, dout and dlse alone (out
// and the LSE are not read), and dsinks [heads_q] (zeros without sinks).
struct ReferenceGradients {
  std::vector<double> dq, dk, dv, dsinks;
};

inline ReferenceGradients attention_backward_reference(
    const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v, const JaggedTensor& dout,
    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t batch,
    const AttentionOptions& options = {}, const float* dlse = nullptr) {
  JaggedTensor none_q = q, none_k = k, none_v = v;
  none_q.data = nullptr;
  none_k.data = nullptr;
  none_v.data = nullptr;
  jfa_attention_backward_params p = make_backward_params(
      q, k, v, output_shape(q, v), {dout, none_q, none_k, none_v, dlse, nullptr}, cu_seqlens_q,
      cu_seqlens_k, batch, options, true);
  p.forward.device_check = nullptr;  // the reference has no checked mode
  ReferenceGradients g;
  g.dq.resize(static_cast<std::size_t>(q.total) * q.heads * q.head_dim);
  g.dk.resize(static_cast<std::size_t>(k.total) * k.heads * k.head_dim);
  g.dv.resize(static_cast<std::size_t>(v.total) * v.heads * v.head_dim);
  g.dsinks.resize(static_cast<std::size_t>(q.heads));
  check(jfa_attention_backward_reference_sinks(&p, g.dq.data(), g.dk.data(), g.dv.data(),
                                               g.dsinks.data()));
  return g;
}

// The rows a reference call computes: those of q_tokens (every token of out_view when nullopt),
// the list pointer its C entry takes (not null for an empty selection, which computes nothing),
// out [n, heads_q, d_v] to fill, and lse (when given) sized [heads_q, n].
struct ReferenceRows {
  int64_t n;
  const int64_t* tokens;
  std::vector<double> out;
};

inline ReferenceRows reference_rows(const JaggedTensor& out_view,
                                    std::optional<std::span<const int64_t>> q_tokens,
                                    std::vector<double>* lse) {
  static const int64_t kNoToken = 0;
  ReferenceRows rows;
  rows.n = q_tokens ? static_cast<int64_t>(q_tokens->size()) : out_view.total;
  rows.tokens = q_tokens ? (q_tokens->empty() ? &kNoToken : q_tokens->data()) : nullptr;
  rows.out.resize(static_cast<std::size_t>(rows.n) * out_view.heads * out_view.head_dim);
  if (lse) lse->assign(static_cast<std::size_t>(rows.n) * out_view.heads, 0.0);
  return rows;
}

// The float64 reference over host memory: rows of the given query tokens (every token when
// q_tokens is nullopt; an empty list computes nothing). Returns out [n, heads_q, d_v]; fills lse
// [heads_q, n] when given.
inline std::vector<double> attention_reference(
    const JaggedTensor& q, const JaggedTensor& k, const JaggedTensor& v,
    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t batch,
    const AttentionOptions& options = {}, std::optional<std::span<const int64_t>> q_tokens = {},
    std::vector<double>* lse = nullptr) {
  const JaggedTensor out_view = output_shape(q, v);
  check_views(q, k, v, out_view);
  jfa_attention_params p =
      make_params(q, k, v, out_view, cu_seqlens_q, cu_seqlens_k, batch, options);
  p.device_check = nullptr;  // the reference has no checked mode
  ReferenceRows rows = reference_rows(out_view, q_tokens, lse);
  check(jfa_attention_reference(&p, rows.tokens, rows.n, rows.out.data(),
                                lse ? lse->data() : nullptr));
  return std::move(rows.out);
}

// ---- A paged KV cache (serving; jfa_paged_kv in jfa.h) ----

// The cache: k_cache [num_pages, page_size, heads_kv, head_dim] and v_cache [.., head_dim_v],
// packed, in q's dtype; block_table [batch, max_pages_per_seq] (page indices) and seqused_k
// [batch] (each sequence's keys before the call), all in the memory of q.
struct PagedKvCache {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t num_pages = 0;
  int32_t page_size = 0;
  int32_t heads_kv = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;  // 0: head_dim
  const int32_t* block_table = nullptr;
  int32_t max_pages_per_seq = 0;
  const int32_t* seqused_k = nullptr;
};

// An optional append: the step's new keys and values, packed by cu_seqlens_new (batch + 1
// offsets, the last total_new), which the call writes into each sequence's pages after its
// seqused_k rows before it attends over them all (a decode or prefill step in one call).
struct PagedAppend {
  const void* k_new = nullptr;  // [total_new, heads_kv, head_dim]
  const void* v_new = nullptr;  // [total_new, heads_kv, head_dim_v]
  const int32_t* cu_seqlens_new = nullptr;
  int64_t total_new = 0;
};

inline jfa_paged_kv make_paged_kv(const PagedKvCache& cache, const PagedAppend& append = {}) {
  jfa_paged_kv kv;
  check(jfa_paged_kv_init(&kv));
  kv.k_cache = cache.k_cache;
  kv.v_cache = cache.v_cache;
  kv.block_table = cache.block_table;
  kv.seqused_k = cache.seqused_k;
  kv.num_pages = cache.num_pages;
  kv.page_size = cache.page_size;
  kv.max_pages_per_seq = cache.max_pages_per_seq;
  kv.k_new = append.k_new;
  kv.v_new = append.v_new;
  kv.cu_seqlens_new = append.cu_seqlens_new;
  kv.total_new = append.total_new;
  return kv;
}

// The cache's keys and values as views without data: the shapes make_params and check_views read
// (heads_kv, head_dim, head_dim_v, q's dtype; no packed tokens).
struct PagedViews {
  JaggedTensor k, v;
};

inline PagedViews paged_views(const PagedKvCache& cache, DType dtype) {
  PagedViews views;
  views.k.dtype = dtype;
  views.k.heads = cache.heads_kv;
  views.k.head_dim = cache.head_dim;
  views.v = views.k;
  views.v.head_dim = cache.head_dim_v == 0 ? cache.head_dim : cache.head_dim_v;
  return views;
}

// out = attention of q over each sequence's keys in the cache (after the append, where one is
// given); see jfa_attention_forward_paged.
inline void paged_attention(const JaggedTensor& q, const JaggedTensor& out,
                            const PagedKvCache& cache, const int32_t* cu_seqlens_q, int64_t batch,
                            const AttentionOptions& options = {}, const PagedAppend& append = {}) {
  const PagedViews kv_views = paged_views(cache, q.dtype);
  check_views(q, kv_views.k, kv_views.v, out);
  jfa_attention_params p =
      make_params(q, kv_views.k, kv_views.v, out, cu_seqlens_q, nullptr, batch, options);
  const jfa_paged_kv kv = make_paged_kv(cache, append);
  if (options.workspace != nullptr) options.workspace->prepare(p, kv);
  check(jfa_attention_forward_paged(&p, &kv));
}

// The bytes of workspace a paged call of these sizes and hints needs on the CUDA backend
// (jfa_attention_paged_workspace_size: no buffer is read, q's and the cache's data may be null).
inline std::size_t paged_workspace_size(const JaggedTensor& q, const PagedKvCache& cache,
                                        int64_t batch, const AttentionOptions& options = {}) {
  const PagedViews kv_views = paged_views(cache, q.dtype);
  const jfa_attention_params p = make_params(q, kv_views.k, kv_views.v, output_shape(q, kv_views.v),
                                             nullptr, nullptr, batch, options);
  const jfa_paged_kv kv = make_paged_kv(cache);
  std::size_t bytes = 0;
  check(jfa_attention_paged_workspace_size(&p, &kv, &bytes));
  return bytes;
}

// The float64 reference of a paged call on host buffers (jfa_attention_reference_paged): rows as
// attention_reference returns them; the append is read, not written.
inline std::vector<double> paged_attention_reference(
    const JaggedTensor& q, const PagedKvCache& cache, const int32_t* cu_seqlens_q, int64_t batch,
    const AttentionOptions& options = {}, const PagedAppend& append = {},
    std::optional<std::span<const int64_t>> q_tokens = {}, std::vector<double>* lse = nullptr) {
  const PagedViews kv_views = paged_views(cache, q.dtype);
  const JaggedTensor out_view = output_shape(q, kv_views.v);
  check_views(q, kv_views.k, kv_views.v, out_view);
  jfa_attention_params p =
      make_params(q, kv_views.k, kv_views.v, out_view, cu_seqlens_q, nullptr, batch, options);
  p.device_check = nullptr;  // the reference has no checked mode
  const jfa_paged_kv kv = make_paged_kv(cache, append);
  ReferenceRows rows = reference_rows(out_view, q_tokens, lse);
  check(jfa_attention_reference_paged(&p, &kv, rows.tokens, rows.n, rows.out.data(),
                                      lse ? lse->data() : nullptr));
  return std::move(rows.out);
}

// The forward's FLOPs (jfa_attention_flops_v); head_dim_v 0 means head_dim.
inline double attention_flops(std::span<const int32_t> cu_seqlens_q,
                              std::span<const int32_t> cu_seqlens_k, int32_t heads_q,
                              int32_t head_dim, bool causal, int32_t head_dim_v = 0) {
  if (cu_seqlens_q.empty() || cu_seqlens_k.size() != cu_seqlens_q.size())
    throw Error(Status::kInvalidArgument,
                "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 offsets");
  double flops = 0;
  check(jfa_attention_flops_v(cu_seqlens_q.data(), cu_seqlens_k.data(),
                              static_cast<int64_t>(cu_seqlens_q.size()) - 1, heads_q, head_dim,
                              head_dim_v, causal ? 1 : 0, &flops));
  return flops;
}

// ---- Jagged utilities ------------------------------------------------------------------------

inline std::vector<int32_t> lengths_to_offsets(std::span<const int32_t> lengths) {
  std::vector<int32_t> offsets(lengths.size() + 1);
  check(
      jfa_lengths_to_offsets(lengths.data(), static_cast<int64_t>(lengths.size()), offsets.data()));
  return offsets;
}

inline void validate_offsets(std::span<const int32_t> offsets, int64_t total = -1) {
  if (offsets.empty()) throw Error(Status::kInvalidArgument, "offsets must hold batch + 1 entries");
  check(jfa_validate_offsets(offsets.data(), static_cast<int64_t>(offsets.size()) - 1, total));
}

inline int32_t max_length(std::span<const int32_t> offsets) {
  if (offsets.empty()) throw Error(Status::kInvalidArgument, "offsets must hold batch + 1 entries");
  int32_t m = 0;
  check(jfa_max_length(offsets.data(), static_cast<int64_t>(offsets.size()) - 1, &m));
  return m;
}

inline void jagged_to_padded(const void* jagged, std::span<const int32_t> offsets,
                             int64_t row_elems, DType dtype, int32_t max_len, double padding_value,
                             void* padded) {
  if (offsets.empty()) throw Error(Status::kInvalidArgument, "offsets must hold batch + 1 entries");
  check(jfa_jagged_to_padded(jagged, offsets.data(), static_cast<int64_t>(offsets.size()) - 1,
                             row_elems, static_cast<jfa_dtype>(dtype), max_len, padding_value,
                             padded));
}

inline void padded_to_jagged(const void* padded, std::span<const int32_t> offsets,
                             int64_t row_elems, DType dtype, int32_t max_len, void* jagged) {
  if (offsets.empty()) throw Error(Status::kInvalidArgument, "offsets must hold batch + 1 entries");
  check(jfa_padded_to_jagged(padded, offsets.data(), static_cast<int64_t>(offsets.size()) - 1,
                             row_elems, static_cast<jfa_dtype>(dtype), max_len, jagged));
}

}  // namespace jfa
