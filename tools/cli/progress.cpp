#include "cli/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace jfa::cli {

std::string clock_string(double seconds) {
  const long long s = std::llround(std::max(seconds, 0.0));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

void Progress::phase(std::string name, int runs) {
  name_ = std::move(name);
  runs_ = runs;
  done_ = 0;
  phase_clock_ = Stopwatch();
  last_print_s_ = 0;
  if (interval_s_ > 0) {
    std::fprintf(stderr, "jfa: %s: %d run%s\n", name_.c_str(), runs_, runs_ == 1 ? "" : "s");
    std::fflush(stderr);
  }
}

void Progress::step() {
  ++done_;
  if (interval_s_ <= 0 || done_ >= runs_) return;
  const double elapsed = phase_clock_.elapsed_ms() * 1e-3;
  if (elapsed - last_print_s_ < interval_s_) return;
  last_print_s_ = elapsed;
  const double left = elapsed / done_ * (runs_ - done_);
  std::fprintf(stderr, "jfa: %s: %d/%d runs, %s elapsed, about %s left\n", name_.c_str(), done_,
               runs_, clock_string(elapsed).c_str(), clock_string(left).c_str());
  std::fflush(stderr);
}

}  // namespace jfa::cli
