// Fresh random seeds for every test run, printed so a failure can be replayed with JFA_TEST_SEED.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>

namespace jfa::testing {

inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("JFA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Records the seed in the test's output (shown on failure) and returns it.
inline uint64_t logged_seed() {
  const uint64_t seed = fresh_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[   SEED   ] JFA_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace jfa::testing
