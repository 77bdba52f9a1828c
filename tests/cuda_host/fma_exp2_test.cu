// fma_exp2 (the softcap forward's exponentials on the FMA pipe, shared/softmax.cuh) as host code,
// against exp2 in double: relative error below 1e-4 (under the 16-bit rounding of P) over the range
// the online softmax gives it, 0 below -125 and at -inf (masked keys), NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "cuda/sm90/shared/softmax.cuh"
#include "test_seed.hpp"

namespace {

using jfa::sm90::fma_exp2;

TEST(FmaExp2, MatchesExp2OverTheSoftmaxRange) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  std::uniform_real_distribution<float> any(-125.f, 8.f), near(-1.f, 1.f);
  double worst = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = i % 2 ? any(rng) : near(rng);
    const double want = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::abs(fma_exp2(x) - want) / want);
  }
  // Integers and half-integers, where the rounding of n and the fit's ends meet.
  for (float x = -125.f; x <= 8.f; x += 0.5f) {
    const double want = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::abs(fma_exp2(x) - want) / want);
    const float below = std::nextafter(x, -1000.f), above = std::nextafter(x, 1000.f);
    if (below >= -125.f)
      worst = std::max(
          worst, std::abs(fma_exp2(below) - std::exp2(double{below})) / std::exp2(double{below}));
    worst = std::max(
        worst, std::abs(fma_exp2(above) - std::exp2(double{above})) / std::exp2(double{above}));
  }
  EXPECT_LT(worst, 1e-4);
}

TEST(FmaExp2, ZeroBelowTheRangeAndNanKept) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fma_exp2(-inf), 0.f);
  EXPECT_EQ(fma_exp2(std::nextafter(-125.f, -1000.f)), 0.f);
  EXPECT_EQ(fma_exp2(-1e30f), 0.f);
  EXPECT_GT(fma_exp2(-125.f), 0.f);
  EXPECT_TRUE(std::isnan(fma_exp2(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(fma_exp2(0.f), fma_exp2(0.f));  // deterministic
  EXPECT_NEAR(fma_exp2(0.f), 1.f, 1e-4f);
}

}  // namespace
