// The CPU backend: the float64 reference and the fast float32 tiled path.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// Float64 oracle over host memory (offsets already validated). Rows of q_tokens (all when null).
void attention_reference_cpu(const Params& p, const int64_t* q_tokens, int64_t n_tokens,
                             double* out, double* lse);

// Fast path: float32 accumulation, tiled online softmax, threads over (sequence, head, q tile).
// JFA_ERROR_UNSUPPORTED when a scaled score is not finite in float32 (see score_overflow.hpp).
jfa_status attention_forward_cpu(const Params& p);

}  // namespace jfa::detail
