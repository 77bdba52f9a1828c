// Jagged attention against its padded baseline on one runner: time both, optionally check the
// jagged output. Shared by `jfa demo` and `jfa bench`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/runner.hpp"
#include "cli/timing.hpp"
#include "cli/verify.hpp"
#include "common/jagged_batch.hpp"

namespace jfa::cli {

struct Measurement {
  std::string layout;  // "jagged", "paged" (keys and values in a paged cache) or "padded"
  Timing timing;
  double useful_flops = 0;  // of the real (jagged) offsets: padding earns nothing
  int64_t tokens_q = 0;     // query tokens the run processed, padding included
  int64_t tokens_k = 0;

  double median_ms() const { return timing.median(); }
  double useful_flops_per_second() const { return useful_flops / (median_ms() * 1e-3); }
};

struct CompareOptions {
  RunConfig config;
  int warmup = 1;
  int repeats = 10;
  bool padded = true;                 // also time the padded baseline (never for a paged run)
  bool check = false;                 // check the jagged output against the reference
  int check_tokens_per_sequence = 8;  // sampled query tokens per sequence (all heads)
  uint64_t check_seed = 0x5A3B1E;
  double progress_interval_s = 0;  // > 0: progress lines on stderr at most this often
};

struct Comparison {
  Measurement jagged;                 // the batch as given: packed, or over config.paged's cache
  std::optional<Measurement> padded;  // untimed (no samples) when jagged is
  std::optional<CheckReport> check;

  // Whether anything was timed: a batch without query tokens has nothing to time.
  bool timed() const { return !jagged.timing.ms.empty(); }
  // Padded median time over jagged median time (NaN when nothing was timed).
  double speedup() const { return padded ? padded->median_ms() / jagged.median_ms() : 0.0; }
};

Comparison compare(Runner& runner, const tools::JaggedBatch& batch, const CompareOptions& options);

}  // namespace jfa::cli
