// Earlier released layouts of the public parameter structs, which the library keeps accepting
// (jfa.h: new fields go at the end, every earlier size stays accepted), and reading any accepted
// layout into the current one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "jfa/jfa.h"

namespace jfa::detail {

// jfa_attention_params of jfa.h 0.1.0: the current struct up to device_check.
struct AttentionParamsV1 {
  uint32_t struct_size;
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim;
  jfa_dtype dtype;
  jfa_tensor_layout q_layout, k_layout, v_layout, out_layout;
  float softmax_scale;
  int causal;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  jfa_backend backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  int32_t* device_check;
};

// jfa_attention_backward_params of an earlier release, embedding that release's forward: every
// field after `forward` lies earlier than in the current struct.
template <typename Forward>
struct BackwardParamsOf {
  uint32_t struct_size;
  Forward forward;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  jfa_tensor_layout dout_layout, dq_layout, dk_layout, dv_layout;
  const float* dlse;
  int deterministic;
};

// jfa_attention_backward_params of jfa.h 0.1.0.
using AttentionBackwardParamsV1 = BackwardParamsOf<AttentionParamsV1>;

// jfa_attention_params with head_dim_v, before the window, softcap and sinks: V1 and head_dim_v.
struct AttentionParamsV2 {
  AttentionParamsV1 v1;
  int32_t head_dim_v;
};

// jfa_attention_backward_params of that release.
using AttentionBackwardParamsV2 = BackwardParamsOf<AttentionParamsV2>;

// The bytes of each earlier forward layout that hold fields: V2's tail padding lies where the
// current struct has window_left, so it must not be read as such.
inline constexpr size_t kFieldBytesV1 = sizeof(AttentionParamsV1);
inline constexpr size_t kFieldBytesV2 = offsetof(AttentionParamsV2, head_dim_v) + sizeof(int32_t);
static_assert(kFieldBytesV2 == offsetof(jfa_attention_params, window_left));
static_assert(offsetof(AttentionBackwardParamsV2, forward) ==
              offsetof(jfa_attention_backward_params, forward));
static_assert(sizeof(AttentionBackwardParamsV2) < sizeof(jfa_attention_backward_params));

// The 0.1.0 forward is a prefix of the current one, and the backward's `forward` starts at the
// same offset in every layout, so the fields a workspace call writes (forward.workspace,
// forward.workspace_bytes) lie at the same place in each layout.
static_assert(sizeof(AttentionParamsV1) == offsetof(jfa_attention_params, head_dim_v));
static_assert(offsetof(AttentionParamsV1, device_check) ==
              offsetof(jfa_attention_params, device_check));
static_assert(offsetof(AttentionBackwardParamsV1, forward) ==
              offsetof(jfa_attention_backward_params, forward));
static_assert(sizeof(AttentionBackwardParamsV1) < sizeof(jfa_attention_backward_params));

// Every jfa_attention_params with its default (the current layout, struct_size its size).
jfa_attention_params default_params();

// The caller's params, of any accepted struct_size, in the current layout: the fields past the
// caller's size take their defaults, and nothing past that size is read. Rejects a struct_size
// that is not accepted (the caller has checked `in` for NULL).
jfa_status read_params(const jfa_attention_params* in, jfa_attention_params* out);

// The same for the backward's params, whose accepted sizes each come with their forward's size.
jfa_status read_backward_params(const jfa_attention_backward_params* in,
                                jfa_attention_backward_params* out);

// Writes the defaults of the layout of `size` bytes (an accepted size) to `dst`, those bytes only.
jfa_status write_default_params(jfa_attention_params* dst, size_t size);
jfa_status write_default_backward_params(jfa_attention_backward_params* dst, size_t size);

}  // namespace jfa::detail

// The initialisers that binaries built against jfa.h 0.1.0 call by these names: they fill the
// 0.1.0 layouts (jfa.h now maps the names to the sized initialisers; the parentheses keep those
// macros from expanding here).
extern "C" {
JFA_API jfa_status(jfa_attention_params_init)(jfa_attention_params* params);
JFA_API jfa_status(jfa_attention_backward_params_init)(jfa_attention_backward_params* params);
}
