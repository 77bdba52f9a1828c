// The CPU backward: the float64 reference and the float32 path.
#pragma once

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// Float64 oracle over host memory (offsets already validated): packed float64 gradients
// dq [total_q, heads_q, d], dk and dv [total_k, heads_kv, d], from q, k, v, dout and dlse alone;
// dsinks (nullable) [heads_q], zeros without sinks.
void attention_backward_reference_cpu(const BackwardParams& p, double* dq, double* dk, double* dv,
                                      double* dsinks);

// Float32 accumulation from the forward's out and LSE, threads over (sequence, kv head); the
// result does not depend on the number of threads. JFA_ERROR_UNSUPPORTED when a scaled score is
// not finite in float32 (see score_overflow.hpp).
jfa_status attention_backward_cpu(const BackwardParams& p);

}  // namespace jfa::detail
