// A jfa_attention_params filled from a call's buffers and sizes (packed layouts, defaults for the
// rest), for the tests, the CLI and the benchmarks. Not part of the public API.
#pragma once

#include <cstdint>

#include "jfa/jfa.h"

namespace jfa::tools {

struct CallBuffers {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
};

struct CallShape {
  int64_t batch, total_q, total_k;
  int32_t heads_q, heads_kv, head_dim;
  jfa_dtype dtype;
  int32_t head_dim_v = 0;  // 0: head_dim
};

inline jfa_attention_params call_params(const CallBuffers& b, const CallShape& s) {
  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.q = b.q;
  p.k = b.k;
  p.v = b.v;
  p.out = b.out;
  p.lse = b.lse;
  p.cu_seqlens_q = b.cu_seqlens_q;
  p.cu_seqlens_k = b.cu_seqlens_k;
  p.batch = s.batch;
  p.total_q = s.total_q;
  p.total_k = s.total_k;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.head_dim = s.head_dim;
  p.dtype = s.dtype;
  p.head_dim_v = s.head_dim_v;
  return p;
}

}  // namespace jfa::tools
