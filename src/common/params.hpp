// The one parameter struct that flows from the API to every backend. Built once by validation
// (src/api/validate.cpp); backends never re-derive what is here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/visibility.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

struct Layout {
  int64_t token_stride;  // elements
  int64_t head_stride;   // elements
};

struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // nullable, [heads_q, total_q]
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim;    // columns of q and k
  int32_t head_dim_v;  // columns of v and out (and dout, dv)
  jfa_dtype dtype;
  Layout q_layout, k_layout, v_layout, out_layout;
  float softmax_scale;  // resolved: never NaN
  bool causal;
  // The keys each row sees (common/visibility.hpp): causal folded in, so window.right is 0 under
  // it; -1 unbounded.
  Window window;
  float softcap;         // 0: off, else the cap c of c * tanh(s / c)
  const float* sinks;    // nullable, [heads_q]
  int32_t max_seqlen_q;  // hint, 0 = unknown
  int32_t max_seqlen_k;
  void* stream;
  void* workspace;  // nullable: the CUDA backend then allocates one per call
  size_t workspace_bytes;
  int32_t* device_check;  // nullable: the word of the checked mode (jfa.h)

  int32_t group_size() const { return heads_q / heads_kv; }
  // A window beyond the causal mask, or softcap: what changes the keys a row sees or its scores.
  bool uses_window_or_softcap() const {
    return window.left != -1 || (window.right != -1 && !causal) || softcap != 0.0f;
  }
};

// The backward's parameters: the forward's (out and lse as the forward wrote them) and the
// gradients. Built once by validation, like Params.
struct BackwardParams {
  Params fwd;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  Layout dout_layout, dq_layout, dk_layout, dv_layout;
  const float* dlse;  // nullable, [heads_q, total_q]
  bool deterministic;
  float* dsinks;  // nullable, [heads_q]; only with fwd.sinks
};

// What the backward's workspace size query reads of a call (jfa_attention_backward_workspace_size):
// sizes only, not yet validated; heads_kv 0 (or not a divisor of heads_q) where the caller left it
// out, which sizes the workspace for a call without head splits.
struct BackwardSizes {
  int64_t total_q, total_k, batch;
  int32_t heads_q, heads_kv, head_dim, head_dim_v;
  bool deterministic;
};

}  // namespace jfa::detail
