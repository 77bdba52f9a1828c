#include "cpu/parallel.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace jfa::detail {

int parse_thread_cap(const char* text, int hardware, std::string* warning) {
  hardware = std::max(hardware, 1);
  if (text == nullptr || *text == '\0') return hardware;
  bool digits = *text != '\0';
  for (const char* c = text; *c != '\0'; ++c) digits = digits && *c >= '0' && *c <= '9';
  errno = 0;
  const unsigned long long n = digits ? std::strtoull(text, nullptr, 10) : 0;
  if (!digits || errno == ERANGE || n < 1) {
    if (warning != nullptr)
      *warning = "JFA_NUM_THREADS=\"" + std::string(text) +
                 "\" is not a whole number >= 1; using the " + std::to_string(hardware) +
                 " hardware threads";
    return hardware;
  }
  return static_cast<int>(std::min<unsigned long long>(n, static_cast<unsigned>(hardware)));
}

int workers_for_flops(double flops) {
  constexpr double kMinFlopsPerThread = 4e6;
  const double useful = std::max(1.0, flops / kMinFlopsPerThread);
  return static_cast<int>(std::min<double>(cpu_thread_count(), useful));
}

int cpu_thread_count() {
  static const int count = [] {
    std::string warning;
    const int n = parse_thread_cap(std::getenv("JFA_NUM_THREADS"),
                                   static_cast<int>(std::thread::hardware_concurrency()), &warning);
    if (!warning.empty()) std::fprintf(stderr, "jfa: %s\n", warning.c_str());
    return n;
  }();
  return count;
}

}  // namespace jfa::detail
