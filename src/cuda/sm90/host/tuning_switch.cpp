#include "cuda/sm90/host/tuning_switch.hpp"

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>

namespace jfa::sm90 {
namespace {

struct SwitchSpec {
  const char* name;
  std::initializer_list<int> values;
};

constexpr int kUnset = -1;
constexpr int kSwitchCount = static_cast<int>(TuningSwitch::kCount);

const SwitchSpec kSpecs[kSwitchCount] = {
    {"JFA_SM90_D64_ROWS", {128, 192}},   // Q tile rows at head_dim 64
    {"JFA_SM90_D128_KEYS", {128, 160}},  // keys per K tile at head_dim 128
    {"JFA_SM90_SCHEDULE", {0, 1, 2}},    // main loop schedule
    {"JFA_SM90_LPT", {1}},               // work list heaviest sequences first
    {"JFA_SM90_HEAD_MAJOR", {0}},        // tile-major item order without the causal mask
    {"JFA_SM90_PDL", {0}},               // two plain launches instead of a dependent launch
};

std::atomic<int> forced[kSwitchCount];
std::once_flag loaded;

void read_environment() {
  for (int i = 0; i < kSwitchCount; ++i) {
    int value = kUnset;
    if (const char* env = std::getenv(kSpecs[i].name)) {
      for (int v : kSpecs[i].values)
        if (std::to_string(v) == env) value = v;
    }
    forced[i].store(value, std::memory_order_relaxed);
  }
}

}  // namespace

int tuning_switch(TuningSwitch which, int otherwise) {
  std::call_once(loaded, read_environment);
  const int value = forced[static_cast<int>(which)].load(std::memory_order_relaxed);
  return value == kUnset ? otherwise : value;
}

}  // namespace jfa::sm90

extern "C" void jfa_sm90_reload_tuning_switches(void) {
  std::call_once(jfa::sm90::loaded, [] {});
  jfa::sm90::read_environment();
}
