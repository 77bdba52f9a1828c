// Run-time tuning switches of the Hopper forward: environment variables that force a choice the
// library otherwise makes itself, for A/B measurements and tests (every choice computes the same
// function).
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace jfa::sm90 {

// The value that environment variable `name` spells exactly (in decimal, as std::to_string writes
// it) when it is one of `values`, else `otherwise`.
inline int tuning_switch(const char* name, std::initializer_list<int> values, int otherwise) {
  const char* env = std::getenv(name);
  if (env == nullptr) return otherwise;
  for (int value : values)
    if (std::to_string(value) == env) return value;
  return otherwise;
}

}  // namespace jfa::sm90
