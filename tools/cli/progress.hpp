// Progress of long work on stderr (a CPU run of a large batch takes minutes): at most one line per
// interval, each with the runs done, the time elapsed and an estimate of the time left.
#pragma once

#include <string>

#include "cli/timing.hpp"

namespace jfa::cli {

class Progress {
 public:
  // interval_s <= 0: silent.
  explicit Progress(double interval_s = 0) : interval_s_(interval_s) {}

  // Starts a phase of `runs` runs (say "jagged layout") and says so; progress lines follow.
  void phase(std::string name, int runs);
  // One run of the phase is done.
  void step();

 private:
  double interval_s_;
  std::string name_;
  int runs_ = 0;
  int done_ = 0;
  Stopwatch phase_clock_;
  double last_print_s_ = 0;
};

// "1:05" for 65 seconds, "1:02:03" past an hour.
std::string clock_string(double seconds);

}  // namespace jfa::cli
