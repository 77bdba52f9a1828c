// Validation of the public parameters into the internal Params struct.
#pragma once

#include "common/params.hpp"
#include "jfa/jfa.h"

namespace jfa::detail {

// Largest head_dim any backend accepts; backends narrow it further.
inline constexpr int32_t kMaxHeadDim = JFA_MAX_HEAD_DIM;

// The ranges of batch and total_q (int32 offsets), shared by the forward and the workspace query.
jfa_status check_batch_and_total_q(int64_t batch, int64_t total_q);

// Checks everything that does not need to read the offsets; fills `out` on success. `in` is the
// caller's struct, of any accepted struct_size (read_params). The reference writes into its own
// buffers, so it passes needs_output = false.
jfa_status build_params(const jfa_attention_params* in, Params* out, bool needs_output = true);

// The backward's checks: the forward's (build_params, out and lse required), dout, and the
// gradients' buffers and layouts; fills `out` on success. for_reference: only what the float64
// reference reads (q, k, v, dout; out, lse and the gradient buffers left NULL).
jfa_status build_backward_params(const jfa_attention_backward_params* in, BackwardParams* out,
                                 bool for_reference = false);

// Offsets rules for host-visible offsets (aligned, 0 first, non-decreasing, the total last unless
// total < 0); `name` appears in the message.
jfa_status validate_offsets_named(const int32_t* offsets, int64_t batch, int64_t total,
                                  const char* name);

// Host-side checks of both offsets arrays and the max-length hints.
jfa_status validate_host_offsets(const Params& p);

// Sinks in host memory must be finite.
jfa_status validate_host_sinks(const Params& p);

}  // namespace jfa::detail
