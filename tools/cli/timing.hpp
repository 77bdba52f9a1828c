// Timings of repeated runs: the per-run samples and their summary statistics.
#pragma once

#include <chrono>
#include <vector>

namespace jfa::cli {

// Milliseconds of each measured run (warm-up runs excluded).
struct Timing {
  std::vector<double> ms;

  double median() const;  // NaN when there are no samples
  double min() const;
  double max() const;
};

// A wall-clock stopwatch on the steady clock.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace jfa::cli
