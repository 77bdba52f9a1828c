#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::Status;

Status status_of(auto&& fn) {
  try {
    fn();
  } catch (const jfa::Error& e) {
    return e.status();
  }
  return Status::kSuccess;
}

TEST(JaggedUtils, LengthsToOffsetsMatchesTheSeedExample) {
  const std::vector<int32_t> lengths = {128, 4096, 512, 2048};
  EXPECT_EQ(jfa::lengths_to_offsets(lengths), (std::vector<int32_t>{0, 128, 4224, 4736, 6784}));
  EXPECT_EQ(jfa::max_length(jfa::lengths_to_offsets(lengths)), 4096);
}

TEST(JaggedUtils, EmptyBatchAndZeroLengths) {
  EXPECT_EQ(jfa::lengths_to_offsets(std::vector<int32_t>{}), (std::vector<int32_t>{0}));
  EXPECT_EQ(jfa::max_length(std::vector<int32_t>{0}), 0);
  const std::vector<int32_t> offsets = jfa::lengths_to_offsets(std::vector<int32_t>{0, 3, 0});
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 0, 3, 3}));
  EXPECT_NO_THROW(jfa::validate_offsets(offsets, 3));
}

TEST(JaggedUtils, LengthsToOffsetsRejectsNegativeAndOverflow) {
  const std::vector<int32_t> negative = {3, -1};
  EXPECT_EQ(status_of([&] { jfa::lengths_to_offsets(negative); }), Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("lengths[1]=-1"), std::string::npos);
  const std::vector<int32_t> huge = {2000000000, 2000000000};
  EXPECT_EQ(status_of([&] { jfa::lengths_to_offsets(huge); }), Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("overflows int32"), std::string::npos);
}

// In place (offsets == lengths, the array one element longer than the lengths) is supported;
// any other overlap of the two is rejected, with nothing written.
TEST(JaggedUtils, LengthsToOffsetsInPlace) {
  std::vector<int32_t> buffer = {3, 0, 4, -1};
  ASSERT_EQ(jfa_lengths_to_offsets(buffer.data(), 3, buffer.data()), JFA_SUCCESS)
      << jfa_last_error_message();
  EXPECT_EQ(buffer, (std::vector<int32_t>{0, 3, 3, 7}));
  buffer = {5, -1};
  ASSERT_EQ(jfa_lengths_to_offsets(buffer.data(), 1, buffer.data()), JFA_SUCCESS);
  EXPECT_EQ(buffer, (std::vector<int32_t>{0, 5}));
  int32_t only = -1;
  ASSERT_EQ(jfa_lengths_to_offsets(&only, 0, &only), JFA_SUCCESS);
  EXPECT_EQ(only, 0);

  for (const int shift : {1, -1}) {
    SCOPED_TRACE(shift);
    std::vector<int32_t> partial = {-9, 3, 0, 4, -9};
    const std::vector<int32_t> before = partial;
    EXPECT_EQ(jfa_lengths_to_offsets(partial.data() + 1, 3, partial.data() + 1 + shift),
              JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find("offsets and lengths share memory"),
              std::string::npos)
        << jfa_last_error_message();
    EXPECT_EQ(partial, before);
  }
}

TEST(JaggedUtils, ValidateOffsetsNamesTheBrokenRule) {
  EXPECT_EQ(status_of([] {
              jfa::validate_offsets(std::vector<int32_t>{1, 2});
            }),
            Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("offsets[0] must be 0"), std::string::npos);
  EXPECT_EQ(status_of([] {
              jfa::validate_offsets(std::vector<int32_t>{0, 52, 40});
            }),
            Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("offsets[2]=40 < offsets[1]=52"),
            std::string::npos);
  EXPECT_EQ(status_of([] {
              jfa::validate_offsets(std::vector<int32_t>{0, 5}, 6);
            }),
            Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("must equal the total 6"),
            std::string::npos);
  EXPECT_EQ(jfa_validate_offsets(nullptr, 1, -1), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_validate_offsets(std::vector<int32_t>{0}.data(), -1, -1),
            JFA_ERROR_INVALID_ARGUMENT);
}

class PaddedRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(PaddedRoundTrip, JaggedToPaddedAndBackIsIdentity) {
  const DType dtype = GetParam();
  std::mt19937_64 rng(jfa::testing::logged_seed());
  std::uniform_int_distribution<int32_t> length(0, 9);
  std::vector<int32_t> lengths(7);
  for (auto& l : lengths) l = length(rng);
  lengths[2] = 0;
  const std::vector<int32_t> offsets = jfa::lengths_to_offsets(lengths);
  const int32_t max_len = jfa::max_length(offsets) + 2;  // longer than needed is allowed
  const int64_t row = 5;
  jfa::tools::HostBuffer jagged(dtype, offsets.back() * row);
  jfa::tools::fill_normal(jagged, rng);
  jfa::tools::HostBuffer padded(dtype, static_cast<int64_t>(lengths.size()) * max_len * row);
  jfa::tools::poison(padded);
  jfa::jagged_to_padded(jagged.data(), offsets, row, dtype, max_len, -7.5, padded.data());
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int32_t t = 0; t < max_len; ++t) {
      for (int64_t e = 0; e < row; ++e) {
        const int64_t p = (static_cast<int64_t>(b) * max_len + t) * row + e;
        const double got = jfa::tools::element_as_double(padded, p);
        if (t < lengths[b]) {
          EXPECT_EQ(got, jfa::tools::element_as_double(jagged, (offsets[b] + t) * row + e));
        } else {
          EXPECT_EQ(got, -7.5) << "padding of sequence " << b << " row " << t;
        }
      }
    }
  }
  jfa::tools::HostBuffer back(dtype, jagged.count());
  jfa::tools::poison(back);
  jfa::padded_to_jagged(padded.data(), offsets, row, dtype, max_len, back.data());
  EXPECT_EQ(back.bytes, jagged.bytes);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, PaddedRoundTrip,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32));

// The copies read one buffer while writing the other: an output sharing memory with the input or
// the offsets is rejected, naming both, with nothing written.
TEST(JaggedUtils, CopiesRejectOverlappingBuffers) {
  // jagged [3, 2] and padded [2, 2, 2] float32 rows.
  std::vector<int32_t> offsets = {0, 2, 3};
  std::vector<float> buffer(16);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
  const std::vector<float> before = buffer;
  auto expect_rejected = [&](jfa_status s, const char* written, const char* other) {
    EXPECT_EQ(s, JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message())
                  .find(std::string(written) + " and " + other + " share memory"),
              std::string::npos)
        << jfa_last_error_message();
    EXPECT_EQ(buffer, before) << "a rejected call wrote its output";
  };
  float* b = buffer.data();
  expect_rejected(jfa_jagged_to_padded(b, offsets.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, 0.0, b),
                  "padded", "jagged");
  expect_rejected(jfa_jagged_to_padded(b + 5, offsets.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, 0.0, b),
                  "padded", "jagged");
  expect_rejected(jfa_padded_to_jagged(b, offsets.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, b), "jagged",
                  "padded");
  expect_rejected(jfa_padded_to_jagged(b + 3, offsets.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, b + 8),
                  "jagged", "padded");
  // The output over the offsets it reads.
  std::vector<int32_t> words(16, 0);
  words[1] = 2;
  words[2] = 3;
  const std::vector<int32_t> words_before = words;
  EXPECT_EQ(
      jfa_jagged_to_padded(b, words.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, 0.0, words.data() + 2),
      JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("padded and offsets share memory"),
            std::string::npos)
      << jfa_last_error_message();
  EXPECT_EQ(words, words_before);
  // Adjacent buffers do not overlap.
  EXPECT_EQ(jfa_jagged_to_padded(b, offsets.data(), 2, 2, JFA_DTYPE_FLOAT32, 2, 0.0, b + 6),
            JFA_SUCCESS)
      << jfa_last_error_message();
  EXPECT_EQ(std::vector<float>(buffer.begin() + 6, buffer.begin() + 14),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 0, 0}));
}

TEST(JaggedUtils, PaddedRejectsSequencesLongerThanMaxLength) {
  const std::vector<int32_t> offsets = {0, 3, 8};
  std::vector<float> jagged(8), padded(2 * 4);
  EXPECT_EQ(status_of([&] {
              jfa::jagged_to_padded(jagged.data(), offsets, 1, DType::kFloat32, 4, 0.0,
                                    padded.data());
            }),
            Status::kInvalidArgument);
  EXPECT_NE(std::string(jfa_last_error_message()).find("sequence 1 has length 5 > max_length 4"),
            std::string::npos);
  EXPECT_EQ(
      jfa_jagged_to_padded(jagged.data(), offsets.data(), 2, 1, JFA_DTYPE_FLOAT32, 8, 0.0, nullptr),
      JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_padded_to_jagged(padded.data(), offsets.data(), 2, -1, JFA_DTYPE_FLOAT32, 8,
                                 jagged.data()),
            JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_padded_to_jagged(padded.data(), offsets.data(), 2, 1, static_cast<jfa_dtype>(9), 8,
                                 jagged.data()),
            JFA_ERROR_INVALID_ARGUMENT);
}

}  // namespace
