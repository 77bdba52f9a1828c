// A forward call on small packed float32 host tensors (self-attention, one offsets array), for the
// tests of the rules of the C entry.
#pragma once

#include <cstdint>
#include <vector>

#include "common/call_params.hpp"
#include "jfa/jfa.h"

namespace jfa::testing {

struct Float32Shape {
  const std::vector<int32_t>* offsets;  // batch + 1, used for q and k
  int32_t heads;
  int32_t head_dim;
};

inline jfa_attention_params float32_call(const Float32Shape& shape, const void* q, const void* k,
                                         const void* v, void* out, float* lse) {
  const int32_t* cu = shape.offsets->data();
  const int64_t total = shape.offsets->back();
  jfa_attention_params p = jfa::tools::call_params(
      {q, k, v, out, lse, cu, cu}, {static_cast<int64_t>(shape.offsets->size()) - 1, total, total,
                                    shape.heads, shape.heads, shape.head_dim, JFA_DTYPE_FLOAT32});
  p.backend = JFA_BACKEND_CPU;
  return p;
}

}  // namespace jfa::testing
