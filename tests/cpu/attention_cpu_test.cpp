// The fast CPU path against the float64 reference on random jagged batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::tools::HostBuffer;
using jfa::tools::JaggedBatch;

struct Outcome {
  HostBuffer out;
  std::vector<float> lse;
};

Outcome run_cpu(JaggedBatch& b, const jfa::AttentionOptions& base) {
  Outcome r{b.make_output(), std::vector<float>(static_cast<size_t>(b.total_q()) * b.heads_q)};
  jfa::tools::poison(r.out);
  std::fill(r.lse.begin(), r.lse.end(), std::nanf(""));
  jfa::AttentionOptions options = base;
  options.backend = jfa::Backend::kCpu;
  options.lse = r.lse.data();
  jfa::JaggedTensor out{r.out.data(), b.dtype, b.total_q(), b.heads_q, b.head_dim, 0, 0};
  jfa::attention(b.q_view(), b.k_view(), b.v_view(), out, b.cu_q.data(), b.cu_k.data(), b.batch(),
                 options);
  return r;
}

// Checks the output and LSE of the fast path against the reference; every element must be set.
void expect_matches_reference(JaggedBatch& b, const jfa::AttentionOptions& options,
                              const std::string& what) {
  SCOPED_TRACE(what);
  const Outcome got = run_cpu(b, options);
  std::vector<double> ref_lse;
  const std::vector<double> ref =
      jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                               b.batch(), options, {}, &ref_lse);
  const double err = jfa::tools::relative_error(got.out, ref, {}, int64_t{b.heads_q} * b.head_dim);
  EXPECT_LE(err, jfa::tools::tolerance(b.dtype)) << "relative error " << err;
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) {
      ASSERT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << "lse[" << i << "] = " << got.lse[i];
    } else {
      ASSERT_NEAR(got.lse[i], ref_lse[i], 1e-4 * (1 + std::abs(ref_lse[i]))) << "lse[" << i << "]";
    }
  }
}

TEST(AttentionCpu, RandomJaggedBatchesMatchTheReference) {
  const uint64_t seed = jfa::testing::logged_seed();
  std::mt19937_64 rng(seed);
  const int32_t special[] = {0, 1, 31, 32, 33, 63, 64, 65, 100, 127, 129};
  const int32_t head_dims[] = {16, 32, 64, 96, 128};
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
  auto pick = [&](auto& values) {
    return values[std::uniform_int_distribution<size_t>(0, std::size(values) - 1)(rng)];
  };
  for (int c = 0; c < 24; ++c) {
    const int batch = std::uniform_int_distribution<int>(1, 6)(rng);
    const bool cross = c % 3 == 2;
    std::vector<int32_t> lq(batch), lk(batch);
    for (int i = 0; i < batch; ++i) {
      lq[i] = c % 2 ? pick(special) : std::uniform_int_distribution<int32_t>(0, 200)(rng);
      lk[i] = cross ? std::uniform_int_distribution<int32_t>(0, 200)(rng) : lq[i];
    }
    const int heads_kv = std::uniform_int_distribution<int>(1, 2)(rng);
    const int heads_q = heads_kv * std::uniform_int_distribution<int>(1, 3)(rng);
    JaggedBatch b =
        jfa::tools::make_batch(lq, lk, heads_q, heads_kv, pick(head_dims), pick(dtypes), rng());
    jfa::AttentionOptions options;
    options.causal = (c / 2) % 2 == 1;
    if (c % 5 == 0) options.softmax_scale = 0.05f;
    expect_matches_reference(b, options,
                             "case " + std::to_string(c) + " seed " + std::to_string(seed));
  }
}

TEST(AttentionCpu, ManyTinySequences) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  std::vector<int32_t> lengths(3000);
  for (auto& l : lengths) l = std::uniform_int_distribution<int32_t>(0, 9)(rng);
  for (bool causal : {false, true}) {
    JaggedBatch b = jfa::tools::make_batch(lengths, lengths, 2, 1, 32, DType::kFloat16, rng());
    jfa::AttentionOptions options;
    options.causal = causal;
    expect_matches_reference(b, options, causal ? "causal" : "full");
  }
}

TEST(AttentionCpu, EmptyBatchAndAllEmptySequences) {
  const std::vector<int32_t> none = {0};
  jfa::JaggedTensor q{nullptr, DType::kFloat16, 0, 2, 64, 0, 0};
  EXPECT_NO_THROW(
      jfa::attention(q, q, q, q, none.data(), none.data(), 0, {.backend = jfa::Backend::kCpu}));
  JaggedBatch b = jfa::tools::make_batch({0, 0, 0}, {0, 5, 0}, 2, 2, 64, DType::kBFloat16, 1);
  expect_matches_reference(b, {}, "zero-length queries");
  JaggedBatch keyless = jfa::tools::make_batch({3, 4}, {0, 0}, 2, 2, 64, DType::kFloat16, 2);
  const Outcome r = run_cpu(keyless, {});
  for (int64_t i = 0; i < r.out.count(); ++i)
    ASSERT_EQ(jfa::tools::element_as_double(r.out, i), 0.0);
  for (float l : r.lse) ASSERT_TRUE(std::isinf(l) && l < 0);
}

TEST(AttentionCpu, StridedViewsOfAPackedQkvTensor) {
  // qkv: [total, 3, heads, d]; out: head-major [heads, total, d].
  std::mt19937_64 rng(jfa::testing::logged_seed());
  const std::vector<int32_t> lengths = {37, 0, 70};
  const auto cu = jfa::lengths_to_offsets(lengths);
  const int heads = 3, d = 32;
  const int64_t total = cu.back();
  HostBuffer qkv(DType::kFloat16, total * 3 * heads * d);
  jfa::tools::fill_normal(qkv, rng);
  auto* base = static_cast<uint16_t*>(qkv.data());
  const int64_t ts = 3 * heads * d;
  jfa::JaggedTensor q{base, DType::kFloat16, total, heads, d, ts, d};
  jfa::JaggedTensor k{base + heads * d, DType::kFloat16, total, heads, d, ts, d};
  jfa::JaggedTensor v{base + 2 * heads * d, DType::kFloat16, total, heads, d, ts, d};
  HostBuffer out(DType::kFloat16, total * heads * d);
  jfa::tools::poison(out);
  jfa::JaggedTensor o{out.data(), DType::kFloat16, total, heads, d, d, total * d};
  for (bool causal : {false, true}) {
    jfa::AttentionOptions options;
    options.causal = causal;
    options.backend = jfa::Backend::kCpu;
    jfa::attention(q, k, v, o, cu.data(), cu.data(), 3, options);
    const auto ref = jfa::attention_reference(q, k, v, cu.data(), cu.data(), 3, options);
    // Bring the head-major output into the reference's token-major order.
    HostBuffer token_major(DType::kFloat16, total * heads * d);
    auto* src = static_cast<uint16_t*>(out.data());
    auto* dst = static_cast<uint16_t*>(token_major.data());
    for (int64_t t = 0; t < total; ++t)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < d; ++c) dst[(t * heads + h) * d + c] = src[(h * total + t) * d + c];
    EXPECT_LE(jfa::tools::relative_error(token_major, ref, {}, heads * d), 2e-3);
  }
}

TEST(AttentionCpu, RepeatedRunsAreBitIdentical) {
  JaggedBatch b = jfa::tools::make_batch({300, 17, 129}, {300, 17, 129}, 4, 2, 64, DType::kFloat16,
                                         jfa::testing::logged_seed());
  const Outcome first = run_cpu(b, {.causal = true});
  const Outcome second = run_cpu(b, {.causal = true});
  EXPECT_EQ(first.out.bytes, second.out.bytes);
  EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)));
}

// Calls from several threads at once share the worker pool (they take turns) and each gets its own
// right answer.
TEST(AttentionCpu, ConcurrentCallersGetTheirOwnResults) {
  const uint64_t seed = jfa::testing::logged_seed();
  constexpr int kCallers = 4;
  std::vector<JaggedBatch> batches;
  for (int c = 0; c < kCallers; ++c)
    batches.push_back(jfa::tools::make_batch({100 + 37 * c, 64, 5}, {90 + 11 * c, 64, 9}, 4, 2, 32,
                                             DType::kFloat32, seed + c));
  std::vector<Outcome> serial, parallel(kCallers);
  for (JaggedBatch& b : batches) serial.push_back(run_cpu(b, {}));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int repeat = 0; repeat < 5; ++repeat) parallel[c] = run_cpu(batches[c], {});
    });
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(serial[c].out.bytes, parallel[c].out.bytes) << "caller " << c;
    EXPECT_EQ(0,
              std::memcmp(serial[c].lse.data(), parallel[c].lse.data(), serial[c].lse.size() * 4))
        << "caller " << c;
  }
}

}  // namespace
