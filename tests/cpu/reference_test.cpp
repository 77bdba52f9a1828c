// The float64 reference against an independent computation: full score matrices per sequence and
// head, an explicit softmax, and a matrix product.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::tools::JaggedBatch;

struct Explicit {
  std::vector<double> out;  // [total_q, heads_q, d]
  std::vector<double> lse;  // [heads_q, total_q]
};

Explicit explicit_attention(const JaggedBatch& b, bool causal, double scale) {
  const int d = b.head_dim;
  Explicit r;
  r.out.assign(static_cast<size_t>(b.total_q()) * b.heads_q * d, 0.0);
  r.lse.assign(static_cast<size_t>(b.total_q()) * b.heads_q, 0.0);
  auto at = [&](const jfa::tools::HostBuffer& t, int64_t token, int heads, int h, int c) {
    return jfa::tools::element_as_double(t, (token * heads + h) * d + c);
  };
  for (int64_t s = 0; s < b.batch(); ++s) {
    const int lq = b.lengths_q[s], lk = b.lengths_k[s];
    for (int h = 0; h < b.heads_q; ++h) {
      const int hk = h / (b.heads_q / b.heads_kv);
      // S = scale * Q K^T with -inf where the causal mask hides a key.
      std::vector<double> S(static_cast<size_t>(lq) * lk);
      for (int i = 0; i < lq; ++i)
        for (int j = 0; j < lk; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c)
            dot +=
                at(b.q, b.cu_q[s] + i, b.heads_q, h, c) * at(b.k, b.cu_k[s] + j, b.heads_kv, hk, c);
          const bool hidden = causal && j > i + (lk - lq);
          S[i * lk + j] = hidden ? -std::numeric_limits<double>::infinity() : scale * dot;
        }
      for (int i = 0; i < lq; ++i) {
        double z = 0;
        for (int j = 0; j < lk; ++j) z += std::exp(S[i * lk + j]);
        const int64_t token = b.cu_q[s] + i;
        r.lse[h * b.total_q() + token] = std::log(z);  // log(0) = -inf for a row with no keys
        for (int c = 0; c < d && z > 0; ++c) {
          double acc = 0;
          for (int j = 0; j < lk; ++j)
            acc += std::exp(S[i * lk + j]) / z * at(b.v, b.cu_k[s] + j, b.heads_kv, hk, c);
          r.out[(token * b.heads_q + h) * d + c] = acc;
        }
      }
    }
  }
  return r;
}

struct TinyCase {
  std::vector<int32_t> lq, lk;
  int heads_q, heads_kv, d;
  bool causal;
};

class ReferenceTest : public ::testing::TestWithParam<TinyCase> {};

TEST_P(ReferenceTest, MatchesExplicitSoftmax) {
  const TinyCase& c = GetParam();
  const uint64_t seed = jfa::testing::logged_seed();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    JaggedBatch b = jfa::tools::make_batch(c.lq, c.lk, c.heads_q, c.heads_kv, c.d, dtype, seed);
    const double scale = 0.37;
    jfa::AttentionOptions options;
    options.causal = c.causal;
    options.softmax_scale = static_cast<float>(scale);
    std::vector<double> lse;
    const std::vector<double> out =
        jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                                 b.batch(), options, {}, &lse);
    const Explicit want = explicit_attention(b, c.causal, static_cast<float>(scale));
    ASSERT_EQ(out.size(), want.out.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want.out[i], 1e-12) << i;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(want.lse[i])) {
        ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << i;
      } else {
        ASSERT_NEAR(lse[i], want.lse[i], 1e-12) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, ReferenceTest,
    ::testing::Values(TinyCase{{3}, {3}, 1, 1, 4, false},
                      TinyCase{{5, 1, 7}, {5, 1, 7}, 2, 2, 8, false},
                      TinyCase{{5, 1, 7}, {5, 1, 7}, 2, 2, 8, true},
                      TinyCase{{0, 4, 3}, {2, 0, 6}, 4, 2, 3, false},  // empty q and empty k
                      TinyCase{{6, 2}, {3, 5}, 4, 1, 5, true},         // lq > lk: rows with no key
                      TinyCase{{1}, {9}, 3, 3, 16, true}),
    [](const ::testing::TestParamInfo<TinyCase>& info) {
      return "case" + std::to_string(info.index);
    });

TEST(Reference, SubsetOfTokensMatchesTheFullRun) {
  JaggedBatch b = jfa::tools::make_batch({4, 0, 9}, {4, 0, 9}, 2, 1, 8, DType::kFloat16,
                                         jfa::testing::logged_seed());
  const auto full = jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(),
                                             b.cu_k.data(), b.batch());
  const std::vector<int64_t> tokens = {12, 0, 5};
  const auto part = jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(),
                                             b.cu_k.data(), b.batch(), {}, tokens);
  const int64_t row = 2 * 8;
  for (size_t r = 0; r < tokens.size(); ++r)
    for (int64_t e = 0; e < row; ++e) EXPECT_EQ(part[r * row + e], full[tokens[r] * row + e]);
  const std::vector<int64_t> bad = {13};
  EXPECT_THROW(jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(),
                                        b.cu_k.data(), b.batch(), {}, bad),
               jfa::Error);
}

}  // namespace
