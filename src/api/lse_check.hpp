// The forward's LSE as the CPU backward reads it from host memory: the backward divides by
// exp(LSE), so a value the forward cannot have written would turn into silent zeros (or NaN).
#pragma once

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// JFA_ERROR_INVALID_ARGUMENT naming the head, the token and the value for an lse entry that is NaN
// or +inf, or -inf in a row that sees a key (rows that see none have LSE -inf). p.lse is
// [heads_q, total_q] in host memory; the offsets have passed validate_host_offsets.
jfa_status check_host_lse(const Params& p);

}  // namespace jfa::detail
