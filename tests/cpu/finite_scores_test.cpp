// Finite inputs never come back as NaN with a success: a softmax_scale whose product with log2(e)
// leaves float32 is rejected up front; scores beyond float32's range (scale times q.k), which the
// float32 paths cannot represent, are reported as JFA_ERROR_UNSUPPORTED by the forward and the
// backward instead of NaN outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "float32_call.hpp"
#include "jfa/jfa.h"

namespace {

constexpr int kTotal = 6, kHeads = 1, kDim = 4;
const std::vector<int32_t> kOffsets = {0, 2, 6};

struct Problem {
  std::vector<float> q, k, v, out, lse;
  jfa_attention_params p;

  explicit Problem(float magnitude, float scale) {
    for (int i = 0; i < kTotal * kHeads * kDim; ++i) {
      q.push_back(magnitude * static_cast<float>((i % 5) - 2) / 2);
      k.push_back(magnitude * static_cast<float>((i % 3) - 1));
      v.push_back(static_cast<float>(i % 7));
    }
    out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
    lse.assign(kTotal * kHeads, 0.f);
    p = jfa::testing::float32_call({&kOffsets, kHeads, kDim}, q.data(), k.data(), v.data(),
                                   out.data(), lse.data());
    p.softmax_scale = scale;
  }
};

TEST(FiniteScores, ScaleWhoseProductWithLog2eOverflowsIsRejected) {
  for (float scale : {std::numeric_limits<float>::max(), -3e38f, 2.4e38f}) {
    Problem problem(1.f, scale);
    EXPECT_EQ(jfa_attention_forward(&problem.p), JFA_ERROR_INVALID_ARGUMENT) << scale;
    EXPECT_NE(std::string(jfa_last_error_message()).find("softmax_scale"), std::string::npos);
    for (float x : problem.out) EXPECT_TRUE(std::isnan(x)) << "a rejected call wrote out";
  }
  Problem fine(1.f, 2.3e38f / 1e30f);  // large but representable scores
  EXPECT_EQ(jfa_attention_forward(&fine.p), JFA_SUCCESS) << jfa_last_error_message();
  for (float x : fine.out) EXPECT_TRUE(std::isfinite(x));
}

TEST(FiniteScores, ScoresBeyondFloat32AreAnErrorNotNaN) {
  // q = k = 1e19 (q.k = 4e38) with a unit scale, and q = k = 1 with a scale of 2.3e38: the float64
  // reference is finite, the float32 paths cannot represent the scores.
  for (auto [value, scale] : {std::pair{1e19f, 1.f}, std::pair{1.f, 2.3e38f}}) {
    Problem problem(1.f, scale);
    std::fill(problem.q.begin(), problem.q.end(), value);
    std::fill(problem.k.begin(), problem.k.end(), value);
    EXPECT_EQ(jfa_attention_forward(&problem.p), JFA_ERROR_UNSUPPORTED) << value << " " << scale;
    EXPECT_NE(std::string(jfa_last_error_message()).find("not finite in float32"),
              std::string::npos)
        << jfa_last_error_message();
    std::vector<double> ref(problem.q.size()), ref_lse(kTotal);
    ASSERT_EQ(jfa_attention_reference(&problem.p, nullptr, kTotal, ref.data(), ref_lse.data()),
              JFA_SUCCESS);
    for (double x : ref) EXPECT_TRUE(std::isfinite(x));
  }
  // The backward reports the same instead of NaN gradients: the forward's out and LSE of moderate
  // inputs, then q and k of 1e19.
  Problem ok(1.f, 1.f);  // scale 1: (q scale log2(e)).k = 4 * 1.44e38, beyond float32
  ASSERT_EQ(jfa_attention_forward(&ok.p), JFA_SUCCESS) << jfa_last_error_message();
  std::vector<float> dout(ok.q.size(), 1.f), dq(ok.q.size()), dk(ok.q.size()), dv(ok.q.size());
  std::vector<float> big(ok.q.size(), 1e19f);
  jfa_attention_backward_params b;
  jfa_attention_backward_params_init(&b);
  b.forward = ok.p;
  b.forward.q = big.data();
  b.forward.k = big.data();
  b.dout = dout.data();
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  EXPECT_EQ(jfa_attention_backward(&b), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("not finite in float32"), std::string::npos)
      << jfa_last_error_message();
}

// What the forward can represent, the backward can: scores computed from q scaled first in both.
TEST(FiniteScores, BackwardTakesWhatTheForwardTook) {
  Problem problem(1.f, 1e-30f);  // q.k = 4e38 overflows; scale * log2(e) * q.k = 5.8e8 does not
  std::fill(problem.q.begin(), problem.q.end(), 1e19f);
  std::fill(problem.k.begin(), problem.k.end(), 1e19f);
  ASSERT_EQ(jfa_attention_forward(&problem.p), JFA_SUCCESS) << jfa_last_error_message();
  std::vector<float> dout(problem.q.size(), 1.f), dq(problem.q.size()), dk(problem.q.size()),
      dv(problem.q.size());
  jfa_attention_backward_params b;
  jfa_attention_backward_params_init(&b);
  b.forward = problem.p;
  b.dout = dout.data();
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  ASSERT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
  for (const std::vector<float>* g : {&dq, &dk, &dv})
    for (float x : *g) EXPECT_TRUE(std::isfinite(x));
}

// A NaN among finite keys, and rows whose every score is -inf (beyond float32 on the negative
// side): reported, not NaN or zeros with a success.
TEST(FiniteScores, NaNKeysAndAllNegativeInfiniteRowsAreReported) {
  Problem nan_key(1.f, 0.5f);
  nan_key.k[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(jfa_attention_forward(&nan_key.p), JFA_ERROR_UNSUPPORTED);
  Problem negative(1.f, 1.f);
  std::fill(negative.q.begin(), negative.q.end(), 1e19f);
  std::fill(negative.k.begin(), negative.k.end(), -1e19f);
  EXPECT_EQ(jfa_attention_forward(&negative.p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("not finite in float32"), std::string::npos)
      << jfa_last_error_message();
}

}  // namespace
