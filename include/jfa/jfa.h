/* jfa — Jagged Flash Attention: the C ABI.
 *
 * Sequences are packed end to end (no padding) in tensors of shape [total, heads, head_dim]
 * (head_dim_v columns for v and out) and addressed by cumulative offsets ("cu_seqlens", B+1
 * int32, cu_seqlens[0] = 0, cu_seqlens[B] = total). Every entry point that can fail returns a
 * jfa_status; on failure jfa_last_error_message() names the argument and the rule that was broken.
 * No entry aborts the process. */
#ifndef JFA_JFA_H_
#define JFA_JFA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define JFA_API __declspec(dllexport)
#else
#define JFA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define JFA_VERSION_MAJOR 0
#define JFA_VERSION_MINOR 1
#define JFA_VERSION_PATCH 0
#define JFA_VERSION_STRING "0.1.0"

/* The largest head_dim (and head_dim_v) any backend takes (the CUDA backend takes 32, 64, 96,
 * 128, 192, 256 and 192 with head_dim_v 128, forward and backward). */
#define JFA_MAX_HEAD_DIM 512

typedef enum jfa_status {
  JFA_SUCCESS = 0,
  JFA_ERROR_INVALID_ARGUMENT = 1,    /* a value breaks a documented rule */
  JFA_ERROR_UNSUPPORTED = 2,         /* valid, but not implemented for this backend/dtype/shape */
  JFA_ERROR_BACKEND_UNAVAILABLE = 3, /* the requested backend is not built or has no device */
  JFA_ERROR_CUDA = 4,                /* a CUDA runtime call or kernel launch failed */
  JFA_ERROR_OUT_OF_MEMORY = 5,
  JFA_ERROR_INTERNAL = 6,
  JFA_STATUS_MAX_ENUM = 0x7FFFFFFF /* keeps the enum 32-bit: any int read back is well defined */
} jfa_status;

typedef enum jfa_dtype {
  JFA_DTYPE_FLOAT16 = 0,
  JFA_DTYPE_BFLOAT16 = 1,
  JFA_DTYPE_FLOAT32 = 2, /* CPU backend only */
  JFA_DTYPE_MAX_ENUM = 0x7FFFFFFF
} jfa_dtype;

typedef enum jfa_backend {
  JFA_BACKEND_AUTO = 0, /* CUDA when the tensors live on a supported GPU, else CPU */
  JFA_BACKEND_CPU = 1,  /* fast float32 tiled path, multithreaded */
  JFA_BACKEND_CUDA = 2,
  JFA_BACKEND_MAX_ENUM = 0x7FFFFFFF
} jfa_backend;

/* Strides are in elements; the last dimension (head_dim) is contiguous. */
typedef struct jfa_tensor_layout {
  int64_t token_stride;
  int64_t head_stride;
} jfa_tensor_layout;

/* Parameters of the attention forward. Fill with jfa_attention_params_init() first, then set the
 * fields you need.
 *
 * The layout only grows: new fields go at the end (of this struct and of
 * jfa_attention_backward_params), and every earlier size stays accepted, so that a caller built
 * against an earlier jfa.h keeps working; the fields past the size it set take their defaults,
 * and the library never reads or writes past that size. Accepted struct_size values of
 * jfa_attention_params (the sizes on LP64 targets such as x86-64 and aarch64): 224 (0.1.0, up to
 * device_check), 232 (head_dim_v added) and 248 (window_left, window_right, softcap and sinks
 * added). Of jfa_attention_backward_params: 344 (0.1.0, with a 224-byte forward), 352 (with a
 * 232-byte forward) and 376 (with a 248-byte forward; dsinks added). */
typedef struct jfa_attention_params {
  /* The size of the layout the caller filled, set by jfa_attention_params_init: a struct that was
   * not filled by it (uninitialised, zero-filled) or whose size is not one of the accepted ones
   * above is rejected. */
  uint32_t struct_size;
  const void* q; /* [total_q, heads_q, head_dim] */
  const void* k; /* [total_k, heads_kv, head_dim] */
  const void* v; /* [total_k, heads_kv, head_dim_v] */
  void* out;     /* [total_q, heads_q, head_dim_v], same dtype as q */
  float* lse;    /* optional, NULL or float32 [heads_q, total_q] contiguous: natural-log log-sum-exp
                    of the scaled scores of each row; -inf for a row with no keys */

  const int32_t* cu_seqlens_q; /* batch + 1 offsets into q/out */
  const int32_t* cu_seqlens_k; /* batch + 1 offsets into k/v; may equal cu_seqlens_q */
  int64_t batch;
  int64_t total_q;
  int64_t total_k;

  int32_t heads_q;
  int32_t heads_kv; /* heads_q must be a multiple of heads_kv (GQA / MQA) */
  int32_t head_dim; /* columns of q and k; v and out have head_dim_v (the last field) */
  jfa_dtype dtype;

  /* Zero strides mean "packed": token_stride = heads * columns, head_stride = columns (head_dim
   * for q and k, head_dim_v for v and out). */
  jfa_tensor_layout q_layout, k_layout, v_layout, out_layout;

  float softmax_scale; /* NaN (the default) means 1/sqrt(head_dim); |scale| <= 2.3e38 (its product
                          with log2(e) must be finite in float32) */
  int causal;          /* nonzero: key j is seen by query i iff j <= i + (len_k - len_q) */

  /* Optional hints: the longest q / k sequence, or 0 when unknown. A hint smaller than the real
   * maximum is an error where it can be detected; the result never depends on it. */
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;

  jfa_backend backend;
  void* stream; /* cudaStream_t for the CUDA backend; ignored by the CPU backend */

  /* Optional device scratch memory of the CUDA backend, at least
   * jfa_attention_workspace_size() bytes, 16-byte aligned, on the device of the tensors. It is
   * used in stream order: the next call on the same stream may reuse it, a call running at the same
   * time on another stream needs its own. NULL: the library allocates and frees one in stream
   * order on every call (cudaMallocAsync), which costs host time and, after a synchronize, may
   * map memory again. Nothing is read from it before the call writes it. Ignored by the CPU
   * backend. */
  void* workspace;
  size_t workspace_bytes;

  /* Optional checked mode (CUDA backend): one int32 in device memory. Non-NULL asks the call to
   * check cu_seqlens_q and cu_seqlens_k on the device, in the same stream before its kernels use
   * them, and to store there 0 or the OR of the jfa_device_check bits of every rule they break;
   * its kernels then add JFA_CHECK_RESULT_NOT_FINITE to the word when a result is not finite (see
   * the bit). Every call stores the word afresh, so it tells of the last call that wrote it (under
   * autograd, the backward): give calls you want to check words of their own. The call does not
   * wait for either (no host synchronization): read the word once the stream has got there (e.g.
   * after cudaStreamSynchronize); jfa_device_check_message() says what it means. With invalid
   * offsets the kernels still stay inside every buffer; their results are unspecified, and so is
   * whether JFA_CHECK_RESULT_NOT_FINITE comes with the offsets' bits. The CPU
   * backend checks host offsets before every call (an invalid call fails with
   * JFA_ERROR_INVALID_ARGUMENT), fails on a score it cannot hold (see jfa_attention_forward; the
   * status says so), and stores 0 here (host memory) once the offsets pass its check. */
  int32_t* device_check;

  /* ---- Added after 0.1.0 (a struct of the 0.1.0 size leaves these at their defaults) ---- */

  /* Columns of v and out (and of dout and dv in the backward): 0 (the default) means head_dim.
   * At most JFA_MAX_HEAD_DIM (JFA_ERROR_UNSUPPORTED above, JFA_ERROR_INVALID_ARGUMENT when
   * negative); backends narrow the pairs (head_dim, head_dim_v) they take: the CPU backend any,
   * the CUDA forward and backward 192 with 128 besides equal sizes. The
   * default softmax scale stays 1/sqrt(head_dim). */
  int32_t head_dim_v;

  /* ---- Added after head_dim_v (an earlier struct size leaves these at their defaults) ---- */

  /* Local (sliding-window) attention, bottom-right aligned as the causal mask: query i of a
   * sequence sees key j iff i + len_k - len_q - window_left <= j <= i + len_k - len_q +
   * window_right. -1 (the default) leaves that side unbounded; other negative values are
   * JFA_ERROR_INVALID_ARGUMENT. causal is window_right = 0 and wins: with causal set, the right
   * bound is 0 whatever window_right holds. Both backends, forward and backward. */
  int32_t window_left;
  int32_t window_right;
  /* Score soft-capping: 0 (the default) is off; a cap c > 0 maps every scaled score s to
   * c * tanh(s / c) before the softmax. Negative, NaN or infinite: JFA_ERROR_INVALID_ARGUMENT.
   * Both backends, forward and backward. */
  float softcap;
  /* Optional attention sinks: NULL (the default) or float32 [heads_q], finite, in the memory of
   * the other buffers (host for the CPU backend, device for CUDA): a logit per query head that
   * joins the softmax denominator of each of its rows,
   * p_ij = exp(s_ij) / (exp(sinks[h]) + sum_j exp(s_ij)); it carries no value. The LSE includes
   * it, lse = log(exp(sinks[h]) + sum_j exp(s_ij)), so a row that sees no key has out 0 and
   * lse = sinks[h]. The CPU backend rejects a sink that is not finite
   * (JFA_ERROR_INVALID_ARGUMENT); on CUDA its rows' lse are not finite and the checked mode
   * reports them (JFA_CHECK_RESULT_NOT_FINITE). */
  const float* sinks;
} jfa_attention_params;

/* Bits of the word of jfa_attention_params::device_check: the rules offsets must follow, and one
 * for results. */
typedef enum jfa_device_check_bits {
  JFA_OFFSETS_Q_FIRST_NOT_ZERO = 1, /* cu_seqlens_q[0] != 0 */
  JFA_OFFSETS_Q_DECREASING = 2,     /* cu_seqlens_q[b + 1] < cu_seqlens_q[b] for some b */
  JFA_OFFSETS_Q_LAST_NOT_TOTAL = 4, /* cu_seqlens_q[batch] != total_q */
  JFA_OFFSETS_Q_ABOVE_MAX = 8,      /* a q length above max_seqlen_q (a hint that was given) */
  JFA_OFFSETS_K_FIRST_NOT_ZERO = 16,
  JFA_OFFSETS_K_DECREASING = 32,
  JFA_OFFSETS_K_LAST_NOT_TOTAL = 64,
  JFA_OFFSETS_K_ABOVE_MAX = 128,
  /* Forward: a query row that sees a key got no finite softmax sum, or (when lse is written) an LSE
   * that is NaN or infinite. A sum that is not finite comes from a score q.k beyond float32 (inputs
   * near the range of bf16) or a NaN or infinite q or k, and the row's out is then NaN; an LSE
   * beyond float32 (|scale * q.k| above 3.4e38) is +-inf while out stays accurate, since such
   * rows take their exponentials from score differences. Backward: an element of dq, dk or dv is
   * NaN or infinite, or an lse row that sees keys is not finite. */
  JFA_CHECK_RESULT_NOT_FINITE = 256,
  /* A paged call's append (jfa_paged_kv::k_new), on CUDA: cu_seqlens_new breaks the rules of
   * offsets (first 0, nondecreasing, last total_new), or a page that receives a sequence's new rows
   * holds another sequence's keys. */
  JFA_PAGED_APPEND_INVALID = 512
} jfa_device_check_bits;

/* What a word of device_check reports, as text ("valid" for 0); valid until the next call on
 * this thread. */
JFA_API const char* jfa_device_check_message(int32_t word);

/* Buffers a call writes (out and lse; dq, dk and dv for the backward) must not share an element
 * with any other buffer of the call, inputs and offsets included, not even in place (out == q):
 * JFA_ERROR_INVALID_ARGUMENT names both. Views that interleave in one tensor without sharing an
 * element (slots of a fused [total, n, heads, head_dim] buffer) are fine. Every pointer must be
 * aligned to its element size (2 bytes for float16/bfloat16, 4 for float32, float and int32, 8 for
 * double and int64), and each tensor's furthest element addressable in int64 (packed strides
 * included): JFA_ERROR_INVALID_ARGUMENT names the buffer. */

/* Semantics of a query row with no visible key (an empty key sequence, causal with len_q > len_k
 * for its first len_q - len_k rows, or a window that holds no key of its sequence): its output is
 * zeros and its LSE is -inf, or sinks[h] when sinks are given. */

/* Fills every field of the layout of `struct_size` bytes (one of the accepted sizes, see
 * jfa_attention_params) with its default and sets struct_size; it writes those bytes only.
 * JFA_ERROR_INVALID_ARGUMENT for NULL or a size that is not accepted. */
JFA_API jfa_status jfa_attention_params_init_sized(jfa_attention_params* params,
                                                   size_t struct_size);
/* Fills every field with its default (and struct_size). A macro, so that the size is the one of
 * the header the caller is built with; the exported function of this name, which binaries built
 * against jfa.h 0.1.0 call, fills the 0.1.0 layout. */
#define jfa_attention_params_init(params) \
  jfa_attention_params_init_sized((params), sizeof(jfa_attention_params))

/* out = softmax(softcap(scale * q k^T) [+ causal mask, window] [+ sink]) v, per sequence and head.
 * On the CPU backend a scaled score that float32 cannot hold (+inf or NaN: too large, or from a NaN
 * or infinite q or k), or a row whose every score is -inf, gives JFA_ERROR_UNSUPPORTED, after which
 * out and lse are unspecified. The CUDA backend takes any positive scale (up to 2.3e38) whose
 * scores q.k are finite in float32 (out is accurate; an LSE beyond float32 is +-inf); what it
 * cannot compute, it reports in the checked mode (JFA_CHECK_RESULT_NOT_FINITE of device_check) and
 * not in the status, which is returned before the kernels run. Non-finite values of v reach out. */
JFA_API jfa_status jfa_attention_forward(const jfa_attention_params* params);

/* The bytes of params->workspace that jfa_attention_forward needs for these sizes: it reads
 * batch and total_q only (no pointer, nothing on the device), so it can be asked once for the
 * largest batch a caller will run. 0 without the CUDA backend. */
JFA_API jfa_status jfa_attention_workspace_size(const jfa_attention_params* params, size_t* bytes);

/* A workspace the library keeps for a caller: device memory that grows to the largest size its
 * calls have needed (a growth frees the old memory, which waits for the device, and allocates
 * anew), so that a steady stream of calls allocates nothing. One per stream: it is not
 * thread-safe, and calls that share it must run in one stream's order. */
typedef struct jfa_workspace jfa_workspace;
JFA_API jfa_status jfa_workspace_create(jfa_workspace** workspace);
/* Frees the memory (after the device is done with it) and the handle; NULL is a no-op. */
JFA_API jfa_status jfa_workspace_destroy(jfa_workspace* workspace);
/* Sets params->workspace and params->workspace_bytes for a call of jfa_attention_forward with
 * these params, growing the memory on the current device when needed. Host-memory calls (the CPU
 * backend) get no workspace and allocate nothing. */
JFA_API jfa_status jfa_workspace_prepare(jfa_workspace* workspace, jfa_attention_params* params);

/* The float64 reference (the oracle of every test): host memory only, any dtype. Computes the
 * rows of the query tokens listed in q_tokens (n_tokens entries, each in [0, total_q)), or of every
 * token when q_tokens is NULL (then n_tokens must equal total_q). out: [n_tokens, heads_q,
 * head_dim_v] float64; lse: NULL or [heads_q, n_tokens] float64. params->out and params->lse are
 * ignored. */
JFA_API jfa_status jfa_attention_reference(const jfa_attention_params* params,
                                           const int64_t* q_tokens, int64_t n_tokens, double* out,
                                           double* lse);

/* ---- A paged KV cache (serving) ----------------------------------------------------------------
 *
 * Keys and values in fixed-size pages, as inference servers keep them: sequence b's keys are the
 * first seqused_k[b] rows of its pages block_table[b * max_pages_per_seq + 0], [.. + 1], ..., in
 * order, page_size rows a page (a page may serve several sequences, and pages need not be in
 * order). Queries stay packed by cu_seqlens_q, and every rule of jfa_attention_params holds with
 * len_k = seqused_k[b]: the causal mask and windows aligned bottom-right, GQA, softcap, sinks, the
 * LSE. The CPU backend (host memory) takes every such call. The CUDA backend (the cache in device
 * memory, or backend=cuda; Hopper) takes decode, speculative decode and chunked prefill: at most
 * 4096 query tokens a sequence, max_seqlen_q given (the launch is planned from the hints: nothing
 * is read on the host, so the call can be captured in a CUDA graph), float16 and bfloat16, head_dim
 * 64, 128 or 256 with head_dim_v equal, softmax_scale > 0, caches 16-byte aligned, q and out as its
 * packed forward takes them, with the append (k_new, v_new 16-byte aligned; max_seqlen_k, where
 * given, counts the appended rows); JFA_ERROR_UNSUPPORTED names the rest (longer chunks among
 * them). It reads the block table, seqused_k and cu_seqlens_new on the device only, so their errors
 * are not a status there but the checked mode's (device_check) bits: the append's rules
 * (cu_seqlens_new's, and a page receiving new rows that holds another sequence's keys)
 * JFA_PAGED_APPEND_INVALID; the cache's, until jfa.h has bits of their own, the closest k bits:
 * JFA_OFFSETS_K_DECREASING for a negative seqused_k, JFA_OFFSETS_K_ABOVE_MAX for a sequence's keys
 * (seqused_k plus its new rows) above max_pages_per_seq * page_size (or max_seqlen_k where given),
 * JFA_OFFSETS_K_LAST_NOT_TOTAL for a page outside [0, num_pages) that holds keys; the kernels then
 * stay inside every buffer (a new row bound outside the table or the cache is not written), their
 * results unspecified. */
typedef struct jfa_paged_kv {
  uint32_t struct_size;       /* set by jfa_paged_kv_init; other values are rejected */
  void* k_cache;              /* [num_pages, page_size, heads_kv, head_dim], dtype of q, packed */
  void* v_cache;              /* [num_pages, page_size, heads_kv, head_dim_v], packed */
  const int32_t* block_table; /* [batch, max_pages_per_seq]: page indices in [0, num_pages) (only
                                 the pages that hold a sequence's keys are read) */
  const int32_t* seqused_k;   /* [batch]: keys of each sequence in the cache before this call, 0
                                 to max_pages_per_seq * page_size (their sum at most 2^31 - 1) */
  int64_t num_pages;
  int32_t page_size;         /* rows of a page, >= 1 */
  int32_t max_pages_per_seq; /* columns of block_table, >= 0 */
  /* Optional append, so that a decode or prefill step is one call: NULL k_new (the default)
   * appends nothing. Else the step's new keys and values, packed by cu_seqlens_new (batch + 1
   * offsets, last = total_new): k_new [total_new, heads_kv, head_dim], v_new [total_new, heads_kv,
   * head_dim_v], dtype of q, packed. The forward writes sequence b's new rows into its pages at
   * rows seqused_k[b] .. seqused_k[b] + len_new - 1 (which must fit its table), then attends over
   * seqused_k[b] + len_new keys; seqused_k itself is not updated. A page that receives new rows
   * must belong to that sequence alone (JFA_ERROR_INVALID_ARGUMENT where another sequence's table
   * holds it among its keys' pages). The reference computes the same without writing. */
  const void* k_new;
  const void* v_new;
  const int32_t* cu_seqlens_new;
  int64_t total_new;
} jfa_paged_kv;

JFA_API jfa_status jfa_paged_kv_init_sized(jfa_paged_kv* kv, size_t struct_size);
/* Zeroes *kv and sets struct_size; call it before filling the fields. */
#define jfa_paged_kv_init(kv) jfa_paged_kv_init_sized((kv), sizeof(jfa_paged_kv))

/* The forward over a paged cache (after the append, where kv asks for one): params as for
 * jfa_attention_forward, except that k, v, cu_seqlens_k and total_k are unused and must be NULL / 0
 * (and k_layout, v_layout zero; max_seqlen_k a hint of the longest key count, or 0), and *kv holds
 * the keys and values. A block table entry outside [0, num_pages) for a page that holds keys, or a
 * key count outside its range, is JFA_ERROR_INVALID_ARGUMENT naming it on the CPU backend (on the
 * CUDA backend the checked mode reports them, see above); a call rejected for its arguments writes
 * nothing, appended rows included. out and lse must not share memory with any input, nor the
 * caches (when appending) with anything else. */
JFA_API jfa_status jfa_attention_forward_paged(const jfa_attention_params* params,
                                               const jfa_paged_kv* kv);

/* The bytes of params->workspace that jfa_attention_forward_paged needs on the CUDA backend for
 * these sizes, on any device this build serves: the partial results where each sequence's keys are
 * split over the SMs. It reads sizes and hints only (batch, total_q, heads_q, heads_kv, head_dim,
 * head_dim_v, dtype, backend, max_seqlen_q, max_seqlen_k, the window) and kv's struct_size, nothing
 * through a pointer, so it can be asked before the buffers exist. 0 for calls the CPU backend takes
 * (backend=cpu, or auto with the buffers in host memory or none given: set backend=cuda to ask
 * ahead of them), for calls that need no split (many sequences, or few keys by max_seqlen_k or
 * window_left), for those the CUDA paged kernels do not take (they fail before they allocate), and
 * without the CUDA backend. Not monotone in batch (more sequences, fewer splits): a caller that
 * keeps one workspace asks for each batch size it runs. A workspace of at least this size serves as
 * for jfa_attention_forward (16-byte aligned, in stream order); with a smaller one, or none, the
 * call allocates its own in stream order. JFA_ERROR_INVALID_ARGUMENT for NULL arguments, a
 * struct_size that is not accepted, and values of the fields it reads that the forward rejects. */
JFA_API jfa_status jfa_attention_paged_workspace_size(const jfa_attention_params* params,
                                                      const jfa_paged_kv* kv, size_t* bytes);

/* As jfa_workspace_prepare, for a call of jfa_attention_forward_paged with these params and kv:
 * sets params->workspace and workspace_bytes to the workspace's memory, grown to
 * jfa_attention_paged_workspace_size's answer on the current device (none for host-memory calls).
 */
JFA_API jfa_status jfa_workspace_prepare_paged(jfa_workspace* workspace,
                                               jfa_attention_params* params,
                                               const jfa_paged_kv* kv);

/* The float64 reference over a paged cache (jfa_attention_reference's rows and outputs): host
 * memory only, whatever params->backend says, as jfa_attention_reference. */
JFA_API jfa_status jfa_attention_reference_paged(const jfa_attention_params* params,
                                                 const jfa_paged_kv* kv, const int64_t* q_tokens,
                                                 int64_t n_tokens, double* out, double* lse);

/* ---- Backward (gradients for training) ---------------------------------------------------------
 */

/* Parameters of the attention backward: `forward` as for the forward call (q, k, v, offsets, sizes,
 * scale, mask, backend, stream, workspace) with its out and lse as that call wrote them (both
 * required here: lse is float32 [heads_q, total_q]), plus the gradient of the loss with respect to
 * out and the buffers for the gradients with respect to q, k and v. All in the dtype of q; zero
 * strides mean packed. Fill with jfa_attention_backward_params_init() first. */
typedef struct jfa_attention_backward_params {
  /* The size of the layout the caller filled, set by jfa_attention_backward_params_init (which
   * also fills `forward`): one of the accepted sizes (see jfa_attention_params), and forward's
   * struct_size the forward size of the same release. New fields go at the end of this struct;
   * since `forward` is embedded, a forward that grows moves every field after it, and the library
   * reads each accepted size in its own layout. */
  uint32_t struct_size;
  jfa_attention_params forward;
  const void* dout; /* [total_q, heads_q, head_dim_v] */
  void* dq;         /* [total_q, heads_q, head_dim], every element written */
  void* dk; /* [total_k, heads_kv, head_dim], every element written; with GQA/MQA the sum over
               the query heads of each group. Keys no query sees get zeros. */
  void* dv; /* [total_k, heads_kv, head_dim_v], as dk */
  jfa_tensor_layout dout_layout, dq_layout, dk_layout, dv_layout;
  /* Optional, NULL or float32 [heads_q, total_q] contiguous: the gradient of the loss with respect
   * to the forward's lse, where the loss uses it. */
  const float* dlse;
  /* Nonzero: bit-identical gradients from run to run. The CPU backend always is. */
  int deterministic;

  /* ---- Added after head_dim_v (an earlier struct size leaves this NULL) ---- */

  /* Optional, NULL or float32 [heads_q]: the gradient of the loss with respect to forward.sinks,
   * summed over the batch: dsinks[h] = -sum over the rows i of head h of p_sink_i (dO_i . O_i -
   * dlse_i), with p_sink_i = exp(sinks[h] - lse_i). Every element written. NULL with sinks set:
   * no sink gradient is written; set without sinks: JFA_ERROR_INVALID_ARGUMENT. */
  float* dsinks;
} jfa_attention_backward_params;

/* Fills every field of the layout of `struct_size` bytes (one of the accepted sizes, see
 * jfa_attention_params) with its default, `forward` with the forward layout of that release
 * included; it writes those bytes only. JFA_ERROR_INVALID_ARGUMENT for NULL or a size that is not
 * accepted. */
JFA_API jfa_status jfa_attention_backward_params_init_sized(jfa_attention_backward_params* params,
                                                            size_t struct_size);
/* Fills every field with its default (struct_size, forward's defaults); a macro, as
 * jfa_attention_params_init. */
#define jfa_attention_backward_params_init(params) \
  jfa_attention_backward_params_init_sized((params), sizeof(jfa_attention_backward_params))

/* dq, dk, dv (and dsinks) of out = softmax(softcap(scale * q k^T) [+ causal mask, window]
 * [+ sink]) v given dout, per sequence and head. Rows with no visible key contribute nothing to dq,
 * dk and dv (to dsinks, their dlse). Backends: CPU (float32 accumulation, any dtype,
 * always deterministic) and CUDA (Hopper, the forward's dtypes, head_dims and alignment rules;
 * float32 accumulation; out and lse as the CUDA forward wrote them; a device workspace, see
 * jfa_attention_backward_workspace_size; no host read of the offsets, so the call can be captured
 * in a CUDA graph; deterministic = 0 accumulates dq, and dk and dv where grouped query heads
 * share the work of too few K tiles and kv heads to fill the GPU, with float32 reductions in an
 * order that may differ from run to run). Nothing is written when a call is rejected; on the CPU, an lse entry
 * the forward cannot have written (NaN or +inf, or -inf in a row that sees a key or has a sink) is
 * JFA_ERROR_INVALID_ARGUMENT, and scores that float32 cannot hold (see jfa_attention_forward) give
 * JFA_ERROR_UNSUPPORTED after which dq, dk and dv are unspecified; on CUDA, the checked mode
 * (forward.device_check) reports gradients and lse rows that are not finite. Like every backward
 * that recomputes P = exp(scale q.k - lse), it loses precision when |lse| is large (about 2^-24
 * |lse| absolute error in the exponent). */
JFA_API jfa_status jfa_attention_backward(const jfa_attention_backward_params* params);

/* The bytes of forward.workspace that the CUDA backward needs for these sizes (reads total_q,
 * total_k, batch, heads_q, heads_kv, head_dim, head_dim_v and deterministic only; 0 in a library
 * built without CUDA). With forward.workspace NULL the call allocates and frees one in stream
 * order. It holds the float32 dq accumulator, so it grows with total_q * heads_q * head_dim, and,
 * for calls whose grouped query heads share too few K tiles, float32 dk and dv accumulators
 * (total_k * heads_kv * (head_dim + head_dim_v)); a smaller workspace, sized without them (with
 * heads_kv 0, say), runs such calls without sharing. */
JFA_API jfa_status
jfa_attention_backward_workspace_size(const jfa_attention_backward_params* params, size_t* bytes);

/* As jfa_workspace_prepare, for a call of jfa_attention_backward with these params: sets
 * params->forward.workspace and workspace_bytes (one jfa_workspace may serve the forward and the
 * backward calls of a training step; it grows to the larger of the two). */
JFA_API jfa_status jfa_workspace_prepare_backward(jfa_workspace* workspace,
                                                  jfa_attention_backward_params* params);

/* The float64 reference backward (the oracle of the tests): host memory only, any dtype. Computes
 * the gradients from q, k, v, dout and dlse alone (the softmax recomputed in float64; forward.out
 * and forward.lse are ignored, and dq, dk, dv of params too). dq: [total_q, heads_q, head_dim], dk:
 * [total_k, heads_kv, head_dim] and dv: [total_k, heads_kv, head_dim_v], packed float64. */
JFA_API jfa_status jfa_attention_backward_reference(const jfa_attention_backward_params* params,
                                                    double* dq, double* dk, double* dv);
/* The same, and the gradient of the sinks: dsinks NULL or float64 [heads_q] (zeros without
 * forward.sinks); params->dsinks is ignored. */
JFA_API jfa_status
jfa_attention_backward_reference_sinks(const jfa_attention_backward_params* params, double* dq,
                                       double* dk, double* dv, double* dsinks);

/* Useful floating-point operations of the forward, 4 * pairs * heads_q * head_dim, from host
 * offsets. pairs: len_q * len_k per sequence; causal: half of that for equal lengths (the usual
 * convention), the exact count of visible (query, key) pairs otherwise. */
JFA_API jfa_status jfa_attention_flops(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                       int64_t batch, int32_t heads_q, int32_t head_dim, int causal,
                                       double* flops);
/* The same with a value head size of its own: 2 * pairs * heads_q * (head_dim + head_dim_v) (Q K^T
 * and P V); head_dim_v 0 means head_dim, which gives jfa_attention_flops' count exactly. */
JFA_API jfa_status jfa_attention_flops_v(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                         int64_t batch, int32_t heads_q, int32_t head_dim,
                                         int32_t head_dim_v, int causal, double* flops);

/* ---- Jagged utilities (host memory) ---------------------------------------------------------- */

/* offsets[0] = 0, offsets[i+1] = offsets[i] + lengths[i]. Lengths must be >= 0 and the total must
 * fit in int32. In place (offsets == lengths, batch + 1 elements) works; any other overlap of the
 * two is JFA_ERROR_INVALID_ARGUMENT. */
JFA_API jfa_status jfa_lengths_to_offsets(const int32_t* lengths, int64_t batch, int32_t* offsets);

/* Checks offsets[0] == 0, non-decreasing, and offsets[batch] == total (skipped when total < 0). */
JFA_API jfa_status jfa_validate_offsets(const int32_t* offsets, int64_t batch, int64_t total);

/* The longest sequence, max(offsets[i+1] - offsets[i]), 0 for an empty batch. */
JFA_API jfa_status jfa_max_length(const int32_t* offsets, int64_t batch, int32_t* max_length);

/* Rows of row_elems elements of dtype. jagged: [offsets[batch], row_elems]; padded:
 * [batch, max_length, row_elems]. Rows of a sequence beyond max_length are an error; padded rows
 * past a sequence's end are set to padding_value (converted to dtype). The output must not share
 * memory with the input or the offsets (JFA_ERROR_INVALID_ARGUMENT names both). */
JFA_API jfa_status jfa_jagged_to_padded(const void* jagged, const int32_t* offsets, int64_t batch,
                                        int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                                        double padding_value, void* padded);
JFA_API jfa_status jfa_padded_to_jagged(const void* padded, const int32_t* offsets, int64_t batch,
                                        int64_t row_elems, jfa_dtype dtype, int32_t max_length,
                                        void* jagged);

/* ---- Errors, version, capabilities --------------------------------------------------------- */

/* The message of the last failed call on this thread ("" after a success). */
JFA_API const char* jfa_last_error_message(void);
JFA_API const char* jfa_status_string(jfa_status status);
JFA_API const char* jfa_version(void);
/* Bytes of one element of dtype; 0 for a value that is not a jfa_dtype. */
JFA_API size_t jfa_dtype_size(jfa_dtype dtype);
/* Threads the CPU backend uses at most: the hardware threads, capped by JFA_NUM_THREADS when it
 * holds a whole number >= 1 (read once; any other value is reported once on stderr and ignored).
 * A call uses about one thread per 4 MFLOP of work, up to this: the calling thread and threads of a
 * pool that are started once, when a call first needs them, and kept (a forked child starts its
 * own). A thread that cannot be started leaves its share to the others; calls from several
 * threads at once take turns on the pool. */
JFA_API int jfa_cpu_thread_count(void);
/* 1 when the CUDA backend is built and a supported GPU is visible, else 0. */
JFA_API int jfa_cuda_available(void);

#ifdef __cplusplus
}
#endif

#endif /* JFA_JFA_H_ */
