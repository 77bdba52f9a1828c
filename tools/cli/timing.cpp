#include "cli/timing.hpp"

#include <algorithm>
#include <limits>

namespace jfa::cli {

double Timing::median() const {
  if (ms.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

double Timing::min() const {
  if (ms.empty()) return std::numeric_limits<double>::quiet_NaN();
  return *std::min_element(ms.begin(), ms.end());
}

double Timing::max() const {
  if (ms.empty()) return std::numeric_limits<double>::quiet_NaN();
  return *std::max_element(ms.begin(), ms.end());
}

}  // namespace jfa::cli
