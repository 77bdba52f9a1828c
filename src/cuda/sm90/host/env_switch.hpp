// The library's run-time switches (JFA_CUDA_* environment variables), read at each call: the A/B
// knobs of measurements and tests.
#pragma once

#include <cstdlib>
#include <string_view>

namespace jfa::sm90 {

// The variable `name` as an integer (std::atoi: 0 for text that is not one), 0 where it is unset.
inline int env_int(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr ? std::atoi(env) : 0;
}

// Whether the variable `name` is set to exactly `value`.
inline bool env_is(const char* name, std::string_view value) {
  const char* env = std::getenv(name);
  return env != nullptr && value == env;
}

}  // namespace jfa::sm90
