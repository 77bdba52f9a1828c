#include "common/float_convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "test_seed.hpp"

namespace jfa::detail {
namespace {

TEST(FloatConvert, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = half_to_float(h);
    const float expected = static_cast<float>(std::bit_cast<_Float16>(h));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(expected)) << bits;
    ASSERT_EQ(float_to_half(f), h) << bits;
  }
}

TEST(FloatConvert, FloatToHalfRoundsToNearestEvenLikeTheCompiler) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(f)) continue;
    const uint16_t expected = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(float_to_half(f), expected)
        << "float bits 0x" << std::hex << std::bit_cast<uint32_t>(f);
  }
}

TEST(FloatConvert, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 0.00390625f), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0.00390625f), 0x3F82);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
}

}  // namespace
}  // namespace jfa::detail
