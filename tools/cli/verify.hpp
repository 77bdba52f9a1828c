// Checks an output of the library against the float64 reference on all or some query tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/runner.hpp"
#include "common/jagged_batch.hpp"

namespace jfa::cli {

// Accepted error of the log-sum-exp: |lse - ref| <= kLseTolerance * (1 + |ref|).
inline constexpr double kLseTolerance = 1e-3;

struct CheckReport {
  int64_t rows = 0;        // query tokens compared (each with all heads)
  double rel_error = 0;    // ||out - ref|| / ||ref|| over those rows
  double tolerance = 0;    // tools::tolerance(dtype)
  int64_t non_finite = 0;  // NaN or infinite values anywhere in the output
  bool lse_checked = false;
  double lse_error = 0;  // worst |lse - ref| / (1 + |ref|) over those rows
  bool passed = false;
  std::string failure;  // why it failed; empty when it passed
};

// Every query token of the batch, in order.
std::vector<int64_t> all_tokens(const tools::JaggedBatch& batch);

// Up to `per_sequence` distinct random query tokens of each sequence (all of a shorter one), in
// increasing order; the first and last token of every sequence are always included.
std::vector<int64_t> sample_tokens(const tools::JaggedBatch& batch, int per_sequence,
                                   uint64_t seed);

// Compares `out` (and `lse` when not null: [heads_q, total_q]) with the float64 reference on the
// rows of `tokens`, and scans the whole output for non-finite values. With `paged`, the reference
// is the paged call's over that cache (host memory).
CheckReport check_against_reference(const tools::JaggedBatch& batch, bool causal,
                                    const tools::HostBuffer& out, const std::vector<float>* lse,
                                    const std::vector<int64_t>& tokens,
                                    const PagedCache* paged = nullptr);

struct BackwardReport {
  double dq_error = 0, dk_error = 0, dv_error = 0;  // relative errors (+inf for a NaN)
  double dsinks_error = 0;                          // 0 without sinks
  bool passed = false;
  std::string failure;
};

// Compares the gradients of `dout` with the float64 reference backward on every element.
BackwardReport check_backward_against_reference(const tools::JaggedBatch& batch, bool causal,
                                                const tools::HostBuffer& dout,
                                                const Gradients& grads);

}  // namespace jfa::cli
