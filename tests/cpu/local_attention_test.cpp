// Local attention (sliding windows), score soft-capping and attention sinks: the CPU forward and
// backward against the float64 references, the references against a naive loop written out here
// and against finite differences, the validation of the new fields, and callers built against the
// layout that ended at head_dim_v.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/jagged_batch.hpp"
#include "earlier_layouts.hpp"
#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::tools::HostBuffer;
using jfa::tools::JaggedBatch;

enum class Sinks { kNone, kLarge, kSmall, kRandom };

struct Feature {
  bool causal;
  int32_t left, right;
  float softcap;
  Sinks sinks;
};

std::string name(const Feature& f) {
  static const char* sinks[] = {"none", "+10", "-10", "random"};
  return std::string(f.causal ? "causal" : "full") + " window " + std::to_string(f.left) + "," +
         std::to_string(f.right) + " softcap " + std::to_string(f.softcap) + " sinks " +
         sinks[static_cast<int>(f.sinks)];
}

// Windows of 0 and 1, longer than any sequence, left or right only, with and without causal;
// softcap 2 on scores of about +-5; large and small sinks; and combinations.
const Feature kFeatures[] = {
    {false, 0, 0, 0, Sinks::kNone},      {false, 1, 1, 0, Sinks::kNone},
    {false, 3, -1, 0, Sinks::kNone},     {false, -1, 2, 0, Sinks::kNone},
    {false, 500, 500, 0, Sinks::kNone},  {true, 4, -1, 0, Sinks::kNone},
    {true, 0, 7, 0, Sinks::kNone},       {false, -1, 0, 0, Sinks::kNone},
    {false, -1, -1, 2.0f, Sinks::kNone}, {true, -1, -1, 2.0f, Sinks::kNone},
    {false, -1, -1, 0, Sinks::kLarge},   {false, -1, -1, 0, Sinks::kSmall},
    {true, -1, -1, 0, Sinks::kRandom},   {false, 5, 1, 2.0f, Sinks::kRandom},
    {true, 2, -1, 30.0f, Sinks::kLarge}, {false, 70, 3, 0.5f, Sinks::kSmall},
};

std::vector<float> make_sinks(Sinks kind, int32_t heads, std::mt19937_64& rng) {
  std::vector<float> s(static_cast<size_t>(heads));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : s)
    x = kind == Sinks::kLarge ? 10.0f : kind == Sinks::kSmall ? -10.0f : normal(rng);
  return s;
}

jfa::AttentionOptions options_for(const Feature& f, const std::vector<float>& sinks) {
  jfa::AttentionOptions o{.causal = f.causal, .backend = jfa::Backend::kCpu};
  o.softmax_scale = 1.25f;  // scores of about +-5 from unit normals at head_dim 16
  o.window_left = f.left;
  o.window_right = f.right;
  o.softcap = f.softcap;
  o.sinks = f.sinks == Sinks::kNone ? nullptr : sinks.data();
  return o;
}

jfa::JaggedTensor view(HostBuffer& buffer, const JaggedBatch& b, bool keys, int32_t d) {
  return {buffer.data(),
          b.dtype,
          keys ? b.total_k() : b.total_q(),
          keys ? b.heads_kv : b.heads_q,
          d,
          0,
          0};
}

// Lengths 0 and 1, partial and whole tiles, len_q > len_k and len_q < len_k, an empty key
// sequence, and whole q tiles whose rows see no key under the causal mask or a window (300 / 100).
const std::vector<int32_t> kLq = {0, 1, 70, 5, 130, 9, 3, 300},
                           kLk = {3, 1, 70, 0, 100, 20, 67, 100};

TEST(LocalAttention, CpuForwardMatchesReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (const Feature& f : kFeatures)
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(name(f) + " " + jfa::tools::dtype_name(dtype));
      JaggedBatch b = jfa::tools::make_batch(kLq, kLk, 4, 2, 16, dtype, rng(), 8);
      const std::vector<float> sinks = make_sinks(f.sinks, b.heads_q, rng);
      HostBuffer out = b.make_output();
      jfa::tools::poison(out);
      std::vector<float> lse(static_cast<size_t>(b.total_q()) * b.heads_q, std::nanf(""));
      jfa::AttentionOptions options = options_for(f, sinks);
      options.lse = lse.data();
      jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, 8), b.cu_q.data(),
                     b.cu_k.data(), b.batch(), options);
      std::vector<double> ref_lse;
      const std::vector<double> ref =
          jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                                   b.batch(), options, {}, &ref_lse);
      const double err = jfa::tools::relative_error(out, ref, {}, int64_t{b.heads_q} * 8);
      EXPECT_LE(err, jfa::tools::tolerance(dtype)) << "relative error " << err;
      for (size_t i = 0; i < ref_lse.size(); ++i) {
        if (std::isinf(ref_lse[i]))
          ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "lse[" << i << "] = " << lse[i];
        else
          ASSERT_NEAR(lse[i], ref_lse[i], 1e-4 * (1 + std::abs(ref_lse[i]))) << "lse[" << i << "]";
      }
    }
}

// The edge lengths above, and one long sequence under MQA: fewer (sequence, kv head) pairs than
// CPU threads (with two or more), so its keys are split into blocks, and under a window each block
// walks only the q tiles that see its keys.
TEST(LocalAttention, CpuBackwardMatchesReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (bool long_mqa : {false, true})
    for (const Feature& f : kFeatures)
      for (DType dtype : {DType::kFloat32, DType::kFloat16})
        for (bool with_dlse : {false, true}) {
          SCOPED_TRACE(name(f) + " " + jfa::tools::dtype_name(dtype) + (with_dlse ? " dlse" : "") +
                       (long_mqa ? " one long sequence, MQA" : ""));
          JaggedBatch b = long_mqa ? jfa::tools::make_batch({700}, {700}, 4, 1, 16, dtype, rng(), 8)
                                   : jfa::tools::make_batch(kLq, kLk, 4, 2, 16, dtype, rng(), 8);
          const std::vector<float> sinks = make_sinks(f.sinks, b.heads_q, rng);
          HostBuffer out = b.make_output(), dout = b.make_output();
          std::mt19937_64 fill(rng());
          jfa::tools::fill_normal(dout, fill);
          std::vector<float> lse(static_cast<size_t>(b.total_q()) * b.heads_q);
          std::vector<float> dlse(lse.size());
          std::normal_distribution<float> normal;
          for (float& x : dlse) x = normal(fill);
          jfa::AttentionOptions options = options_for(f, sinks);
          options.lse = lse.data();
          jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, 8), b.cu_q.data(),
                         b.cu_k.data(), b.batch(), options);
          HostBuffer dq(dtype, b.total_q() * b.heads_q * 16);
          HostBuffer dk(dtype, b.total_k() * b.heads_kv * 16);
          HostBuffer dv(dtype, b.total_k() * b.heads_kv * 8);
          for (HostBuffer* g : {&dq, &dk, &dv}) jfa::tools::poison(*g);
          std::vector<float> dsinks(b.heads_q, std::nanf(""));
          jfa::BackwardViews grads{view(dout, b, false, 8),
                                   view(dq, b, false, 16),
                                   view(dk, b, true, 16),
                                   view(dv, b, true, 8),
                                   with_dlse ? dlse.data() : nullptr,
                                   f.sinks == Sinks::kNone ? nullptr : dsinks.data()};
          jfa::attention_backward(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, 8), grads,
                                  b.cu_q.data(), b.cu_k.data(), b.batch(), options);
          const jfa::ReferenceGradients ref = jfa::attention_backward_reference(
              b.q_view(), b.k_view(), b.v_view(), view(dout, b, false, 8), b.cu_q.data(),
              b.cu_k.data(), b.batch(), options, with_dlse ? dlse.data() : nullptr);
          const double tol = jfa::tools::tolerance(dtype);
          // Rows that see one key only have P = 1 and dQ = dK = 0 exactly; float32 gets a rounding
          // of that zero (relative_error is then absolute).
          const bool one_key = f.left == 0 && (f.causal || f.right == 0);
          const double dqk_tol = one_key ? std::max(tol, 1e-4) : tol;
          EXPECT_LE(jfa::tools::relative_error(dq, ref.dq, {}, int64_t{b.heads_q} * 16), dqk_tol);
          EXPECT_LE(jfa::tools::relative_error(dk, ref.dk, {}, int64_t{b.heads_kv} * 16), dqk_tol);
          EXPECT_LE(jfa::tools::relative_error(dv, ref.dv, {}, int64_t{b.heads_kv} * 8), tol);
          if (f.sinks != Sinks::kNone) {
            double norm = 0;
            for (double x : ref.dsinks) norm = std::max(norm, std::abs(x));
            for (int32_t h = 0; h < b.heads_q; ++h)
              EXPECT_NEAR(dsinks[h], ref.dsinks[h], 10 * tol * (1 + norm)) << "dsinks[" << h << "]";
          } else {
            for (double x : ref.dsinks) EXPECT_EQ(x, 0.0);
          }
        }
}

// A naive forward of one sequence: the mask written as the inequality of jfa.h, every score
// capped, the sink as an extra term of the denominator.
struct Naive {
  std::vector<double> out, lse;
};

Naive naive_forward(const float* q, const float* k, const float* v, int lq, int lk, int d, int dv,
                    double scale, const Feature& f, const float* sinks) {
  Naive r{std::vector<double>(lq * dv, 0.0), std::vector<double>(lq)};
  for (int i = 0; i < lq; ++i) {
    const int diagonal = i + lk - lq;
    const int right = f.causal ? 0 : f.right;
    std::vector<double> w(lk, 0.0);
    double sum = sinks ? std::exp(double{sinks[0]}) : 0.0;
    for (int j = 0; j < lk; ++j) {
      if (f.left >= 0 && j < diagonal - f.left) continue;
      if (right >= 0 && j > diagonal + right) continue;
      double s = 0;
      for (int c = 0; c < d; ++c) s += double{q[i * d + c]} * k[j * d + c];
      s *= scale;
      if (f.softcap > 0) s = f.softcap * std::tanh(s / f.softcap);
      sum += w[j] = std::exp(s);
    }
    for (int j = 0; j < lk; ++j)
      for (int c = 0; c < dv; ++c) r.out[i * dv + c] += sum > 0 ? w[j] / sum * v[j * dv + c] : 0.0;
    r.lse[i] = sum > 0 ? std::log(sum) : -INFINITY;
  }
  return r;
}

TEST(LocalAttention, ReferenceMatchesNaiveLoop) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (const Feature& f : kFeatures)
    for (auto [lq, lk] : {std::pair{5, 7}, std::pair{7, 4}, std::pair{6, 6}}) {
      SCOPED_TRACE(name(f) + " lq " + std::to_string(lq) + " lk " + std::to_string(lk));
      const int d = 4, dv = 3;
      JaggedBatch b = jfa::tools::make_batch({lq}, {lk}, 1, 1, d, DType::kFloat32, rng(), dv);
      const std::vector<float> sinks = make_sinks(f.sinks, 1, rng);
      jfa::AttentionOptions options = options_for(f, sinks);
      std::vector<double> lse;
      const std::vector<double> ref = jfa::attention_reference(
          b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(), 1, options, {}, &lse);
      const Naive n = naive_forward(
          static_cast<const float*>(b.q.data()), static_cast<const float*>(b.k.data()),
          static_cast<const float*>(b.v.data()), lq, lk, d, dv, 1.25f, f, options.sinks);
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(ref[i], n.out[i], 1e-12 * (1 + std::abs(n.out[i]))) << "out[" << i << "]";
      for (int i = 0; i < lq; ++i) {
        if (std::isinf(n.lse[i]))
          EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "lse[" << i << "]";
        else
          EXPECT_NEAR(lse[i], n.lse[i], 1e-12 * (1 + std::abs(n.lse[i]))) << "lse[" << i << "]";
      }
    }
}

// The reference backward against central differences of the reference forward, for the loss
// L = sum(W o out) + sum(U o lse): dout = W, dlse = U. Inputs are float32, so each difference
// divides by the perturbation float32 really made; a step of 1e-3 keeps the truncation error
// (about step^2 times the third derivative) well under the tolerance, the loss being float64.
TEST(LocalAttention, ReferenceGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  const Feature features[] = {{false, 1, 2, 1.5f, Sinks::kRandom},
                              {true, 2, -1, 0, Sinks::kRandom},
                              {false, -1, 0, 3.0f, Sinks::kNone},
                              {false, 0, 0, 0, Sinks::kRandom}};
  for (const Feature& f : features) {
    SCOPED_TRACE(name(f));
    const int d = 3, dv = 2;
    JaggedBatch b =
        jfa::tools::make_batch({4, 2, 0}, {5, 0, 3}, 2, 1, d, DType::kFloat32, rng(), dv);
    std::vector<float> sinks = make_sinks(f.sinks, 2, rng);
    HostBuffer w = b.make_output();
    std::mt19937_64 fill(rng());
    jfa::tools::fill_normal(w, fill);
    std::vector<float> u(b.total_q() * b.heads_q);
    std::normal_distribution<float> normal;
    for (float& x : u) x = normal(fill);
    jfa::AttentionOptions options = options_for(f, sinks);
    auto loss = [&] {
      std::vector<double> lse;
      const std::vector<double> out =
          jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                                   b.batch(), options, {}, &lse);
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * static_cast<const float*>(w.data())[i];
      for (size_t i = 0; i < lse.size(); ++i)
        if (std::isfinite(lse[i])) l += lse[i] * u[i];
      return l;
    };
    const jfa::ReferenceGradients g = jfa::attention_backward_reference(
        b.q_view(), b.k_view(), b.v_view(), view(w, b, false, dv), b.cu_q.data(), b.cu_k.data(),
        b.batch(), options, u.data());
    auto check = [&](float* x, size_t n, const std::vector<double>& grad, const char* what) {
      for (size_t i = 0; i < n; ++i) {
        const float x0 = x[i];
        const float hi = x0 + 1e-3f, lo = x0 - 1e-3f;
        x[i] = hi;
        const double l_hi = loss();
        x[i] = lo;
        const double l_lo = loss();
        x[i] = x0;
        const double fd = (l_hi - l_lo) / (double{hi} - lo);
        EXPECT_NEAR(grad[i], fd, 2e-4 * (1 + std::abs(fd))) << what << "[" << i << "]";
      }
    };
    check(static_cast<float*>(b.q.data()), g.dq.size(), g.dq, "dq");
    check(static_cast<float*>(b.k.data()), g.dk.size(), g.dk, "dk");
    check(static_cast<float*>(b.v.data()), g.dv.size(), g.dv, "dv");
    if (f.sinks != Sinks::kNone) check(sinks.data(), sinks.size(), g.dsinks, "dsinks");
  }
}

// The rule's edges, exactly: causal wins over window_right; window_right 0 is causal; a window
// longer than every sequence is no window; a row with no key but a sink has out 0, lse = sink.
TEST(LocalAttention, EquivalentWindowsGiveIdenticalResults) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  JaggedBatch b = jfa::tools::make_batch(kLq, kLk, 2, 1, 16, DType::kFloat32, rng());
  auto run = [&](const jfa::AttentionOptions& o, std::vector<float>* lse = nullptr) {
    HostBuffer out = b.make_output();
    jfa::AttentionOptions options = o;
    std::vector<float> own(b.total_q() * b.heads_q);
    options.lse = lse ? (lse->resize(own.size()), lse->data()) : own.data();
    jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, 16), b.cu_q.data(),
                   b.cu_k.data(), b.batch(), options);
    return out.bytes;
  };
  const jfa::AttentionOptions causal{.causal = true, .backend = jfa::Backend::kCpu};
  jfa::AttentionOptions o = causal;
  o.window_right = 9;
  EXPECT_EQ(run(o), run(causal));
  o = {.backend = jfa::Backend::kCpu};
  o.window_right = 0;
  EXPECT_EQ(run(o), run(causal));
  const jfa::AttentionOptions full{.backend = jfa::Backend::kCpu};
  o = full;
  o.window_left = o.window_right = 1000;
  EXPECT_EQ(run(o), run(full));

  // Sequence 3 has no keys; with window_left 0 and right 0 and len_q > len_k, the first rows of
  // sequence 2 see none either.
  const std::vector<float> sinks = {3.5f, -2.0f};
  o = full;
  o.sinks = sinks.data();
  o.window_left = 0;
  o.window_right = 0;
  std::vector<float> lse;
  const std::vector<unsigned char> bytes = run(o, &lse);
  const float* out = reinterpret_cast<const float*>(bytes.data());
  int rows_without_keys = 0;
  for (int64_t seq = 0; seq < b.batch(); ++seq)
    for (int32_t i = 0; i < b.lengths_q[seq]; ++i) {
      if (i + b.lengths_k[seq] - b.lengths_q[seq] >= 0 && b.lengths_k[seq] > 0) continue;
      const int64_t t = b.cu_q[seq] + i;
      ++rows_without_keys;
      for (int32_t h = 0; h < 2; ++h) {
        EXPECT_EQ(lse[h * b.total_q() + t], sinks[h]);
        for (int c = 0; c < 16; ++c) EXPECT_EQ(out[(t * 2 + h) * 16 + c], 0.0f);
      }
    }
  EXPECT_GT(rows_without_keys, 5);
}

// A call of 2 sequences, 4/2 heads, head_dim 16, float32, packed.
struct Call {
  std::vector<int32_t> cu = {0, 3, 5};
  std::vector<float> q = std::vector<float>(5 * 4 * 16, 0.25f);
  std::vector<float> k = std::vector<float>(5 * 2 * 16, 0.5f);
  std::vector<float> v = std::vector<float>(5 * 2 * 16, 1.0f);
  std::vector<float> out = std::vector<float>(5 * 4 * 16);
  std::vector<float> lse = std::vector<float>(5 * 4);
  std::vector<float> sinks = std::vector<float>(4, 0.5f);
  jfa_attention_params p;

  Call() {
    jfa_attention_params_init(&p);
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.out = out.data();
    p.lse = lse.data();
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.batch = 2;
    p.total_q = p.total_k = 5;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim = 16;
    p.dtype = JFA_DTYPE_FLOAT32;
    p.backend = JFA_BACKEND_CPU;
  }
};

void expect_failure(jfa_status got, jfa_status status, const std::string& text) {
  EXPECT_EQ(got, status) << jfa_last_error_message();
  EXPECT_NE(std::string(jfa_last_error_message()).find(text), std::string::npos)
      << "message: " << jfa_last_error_message();
}

TEST(LocalAttention, Validation) {
  {
    Call c;
    EXPECT_EQ(c.p.window_left, -1);
    EXPECT_EQ(c.p.window_right, -1);
    EXPECT_EQ(c.p.softcap, 0.0f);
    EXPECT_EQ(c.p.sinks, nullptr);
    c.p.sinks = c.sinks.data();
    c.p.window_left = 0;
    c.p.softcap = 1.0f;
    EXPECT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS) << jfa_last_error_message();
  }
  for (auto [left, right] : {std::pair{-2, -1}, std::pair{0, -7}}) {
    Call c;
    c.p.window_left = left;
    c.p.window_right = right;
    expect_failure(jfa_attention_forward(&c.p), JFA_ERROR_INVALID_ARGUMENT,
                   "window_left and window_right must be >= 0, or -1");
  }
  for (float cap : {-1.0f, std::nanf(""), INFINITY}) {
    Call c;
    c.p.softcap = cap;
    expect_failure(jfa_attention_forward(&c.p), JFA_ERROR_INVALID_ARGUMENT, "softcap must be");
    std::vector<double> ref(5 * 4 * 16);
    expect_failure(jfa_attention_reference(&c.p, nullptr, 5, ref.data(), nullptr),
                   JFA_ERROR_INVALID_ARGUMENT, "softcap must be");
  }
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    Call c;
    c.sinks[1] = bad;
    c.p.sinks = c.sinks.data();
    expect_failure(jfa_attention_forward(&c.p), JFA_ERROR_INVALID_ARGUMENT, "sinks[1] is");
  }
  {
    Call c;  // sinks are aligned and never share an element with a written buffer
    std::vector<float> room(8);
    c.p.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(room.data()) + 2);
    expect_failure(jfa_attention_forward(&c.p), JFA_ERROR_INVALID_ARGUMENT, "sinks");
    c.p.sinks = c.out.data() + 8;
    expect_failure(jfa_attention_forward(&c.p), JFA_ERROR_INVALID_ARGUMENT, "sinks");
  }
  {
    // The backward: dsinks needs sinks, must not overlap another buffer; an LSE of -inf is one
    // the forward cannot have written when there are sinks.
    Call c;
    c.p.sinks = c.sinks.data();
    ASSERT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS) << jfa_last_error_message();
    std::vector<float> dout(c.out.size(), 1.0f), dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
    std::vector<float> dsinks(4, std::nanf(""));
    jfa_attention_backward_params b;
    jfa_attention_backward_params_init(&b);
    b.forward = c.p;
    b.dout = dout.data();
    b.dq = dq.data();
    b.dk = dk.data();
    b.dv = dv.data();
    b.dsinks = dsinks.data();
    ASSERT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
    for (float x : dsinks) EXPECT_TRUE(std::isfinite(x));
    b.dsinks = dq.data() + 4;
    expect_failure(jfa_attention_backward(&b), JFA_ERROR_INVALID_ARGUMENT, "dsinks");
    b.dsinks = nullptr;  // sinks without dsinks: no sink gradient, the rest as before
    EXPECT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
    b.forward.sinks = nullptr;
    b.dsinks = dsinks.data();
    expect_failure(jfa_attention_backward(&b), JFA_ERROR_INVALID_ARGUMENT,
                   "dsinks is set but forward.sinks is NULL");
    b.forward.sinks = c.sinks.data();
    c.lse[3] = -INFINITY;
    expect_failure(jfa_attention_backward(&b), JFA_ERROR_INVALID_ARGUMENT, "has a sink");
  }
  {
    // Windows, softcap and sinks leave the workspace queries as they are.
    Call c;
    size_t plain = 1, featured = 2;
    ASSERT_EQ(jfa_attention_workspace_size(&c.p, &plain), JFA_SUCCESS);
    c.p.window_left = 3;
    c.p.softcap = 5;
    c.p.sinks = c.sinks.data();
    ASSERT_EQ(jfa_attention_workspace_size(&c.p, &featured), JFA_SUCCESS);
    EXPECT_EQ(plain, featured);
  }
}

// ---- Callers built against the layout that ended at head_dim_v -------------------------------

using jfa::testing::BackwardParamsV2;
using jfa::testing::copy_v2_fields;
using jfa::testing::GuardedPage;
using jfa::testing::ParamsV2;

// The tail padding of a ParamsV2 (where the current struct has window_left) filled with a value
// that would be an invalid window: the library must not read it.
void dirty_padding(ParamsV2* p) {
  const size_t end = offsetof(ParamsV2, head_dim_v) + sizeof(int32_t);
  std::memset(reinterpret_cast<unsigned char*>(p) + end, 0xF0, sizeof(ParamsV2) - end);
}

TEST(StructSizeV2, SizesAndInitialisers) {
  EXPECT_EQ(sizeof(ParamsV2), 232u);
  EXPECT_EQ(sizeof(BackwardParamsV2), 352u);
  GuardedPage page;
  auto* p = page.place<ParamsV2>();
  ASSERT_EQ(
      jfa_attention_params_init_sized(reinterpret_cast<jfa_attention_params*>(p), sizeof(ParamsV2)),
      JFA_SUCCESS);
  EXPECT_EQ(p->struct_size, sizeof(ParamsV2));
  EXPECT_TRUE(std::isnan(p->softmax_scale));
  EXPECT_EQ(p->head_dim_v, 0);
  auto* b = page.place<BackwardParamsV2>();
  ASSERT_EQ(jfa_attention_backward_params_init_sized(
                reinterpret_cast<jfa_attention_backward_params*>(b), sizeof(BackwardParamsV2)),
            JFA_SUCCESS);
  EXPECT_EQ(b->struct_size, sizeof(BackwardParamsV2));
  EXPECT_EQ(b->forward.struct_size, sizeof(ParamsV2));
  EXPECT_TRUE(std::isnan(b->forward.softmax_scale));
  EXPECT_EQ(b->dlse, nullptr);
}

// A struct of the head_dim_v layout, ending where memory ends, gives the bytes the current struct
// gives with the new fields at their defaults.
TEST(StructSizeV2, EarlierLayoutGivesTheSameResults) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  JaggedBatch b =
      jfa::tools::make_batch({3, 70, 0, 9}, {5, 64, 2, 9}, 4, 2, 24, DType::kFloat16, rng(), 8);
  HostBuffer out_new = b.make_output(), out_old = b.make_output();
  std::vector<float> lse_new(b.total_q() * b.heads_q), lse_old(lse_new.size());
  jfa_attention_params p = jfa::make_params(
      b.q_view(), b.k_view(), b.v_view(), view(out_new, b, false, 8), b.cu_q.data(), b.cu_k.data(),
      b.batch(), {.causal = true, .lse = lse_new.data(), .backend = jfa::Backend::kCpu});
  ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();

  GuardedPage page;
  ParamsV2* old = page.place<ParamsV2>();
  ASSERT_EQ(
      jfa_attention_params_init_sized(reinterpret_cast<jfa_attention_params*>(old), sizeof *old),
      JFA_SUCCESS);
  copy_v2_fields(p, *old);
  dirty_padding(old);
  old->out = out_old.data();
  old->lse = lse_old.data();
  auto* old_as_current = reinterpret_cast<jfa_attention_params*>(old);
  ASSERT_EQ(jfa_attention_forward(old_as_current), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(out_old.bytes, out_new.bytes);
  EXPECT_EQ(lse_old, lse_new);

  std::vector<double> ref_new(b.total_q() * b.heads_q * 8), ref_old(ref_new.size());
  ASSERT_EQ(jfa_attention_reference(&p, nullptr, b.total_q(), ref_new.data(), nullptr),
            JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_reference(old_as_current, nullptr, b.total_q(), ref_old.data(), nullptr),
            JFA_SUCCESS);
  EXPECT_EQ(ref_old, ref_new);
  size_t bytes_new = 1, bytes_old = 2;
  ASSERT_EQ(jfa_attention_workspace_size(&p, &bytes_new), JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_workspace_size(old_as_current, &bytes_old), JFA_SUCCESS);
  EXPECT_EQ(bytes_old, bytes_new);

  HostBuffer dout = b.make_output();
  std::mt19937_64 fill(rng());
  jfa::tools::fill_normal(dout, fill);
  struct Grads {
    HostBuffer dq, dk, dv;
  };
  auto grads = [&] {
    return Grads{HostBuffer(b.dtype, b.total_q() * b.heads_q * b.head_dim),
                 HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim),
                 HostBuffer(b.dtype, b.total_k() * b.heads_kv * 8)};
  };
  Grads g_new = grads(), g_old = grads();
  jfa_attention_backward_params bp = jfa::make_backward_params(
      b.q_view(), b.k_view(), b.v_view(), view(out_new, b, false, 8),
      {view(dout, b, false, 8), view(g_new.dq, b, false, b.head_dim),
       view(g_new.dk, b, true, b.head_dim), view(g_new.dv, b, true, 8)},
      b.cu_q.data(), b.cu_k.data(), b.batch(),
      {.causal = true, .lse = lse_new.data(), .backend = jfa::Backend::kCpu}, true);
  ASSERT_EQ(jfa_attention_backward(&bp), JFA_SUCCESS) << jfa_last_error_message();

  BackwardParamsV2* old_b = page.place<BackwardParamsV2>();
  ASSERT_EQ(jfa_attention_backward_params_init_sized(
                reinterpret_cast<jfa_attention_backward_params*>(old_b), sizeof *old_b),
            JFA_SUCCESS);
  copy_v2_fields(bp.forward, old_b->forward);
  dirty_padding(&old_b->forward);
  old_b->forward.out = out_old.data();
  old_b->forward.lse = lse_old.data();
  old_b->dout = dout.data();
  old_b->dq = g_old.dq.data();
  old_b->dk = g_old.dk.data();
  old_b->dv = g_old.dv.data();
  old_b->deterministic = 1;
  auto* as_current = reinterpret_cast<jfa_attention_backward_params*>(old_b);
  ASSERT_EQ(jfa_attention_backward(as_current), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(g_old.dq.bytes, g_new.dq.bytes);
  EXPECT_EQ(g_old.dk.bytes, g_new.dk.bytes);
  EXPECT_EQ(g_old.dv.bytes, g_new.dv.bytes);

  std::vector<double> rq_new(g_new.dq.count()), rk_new(g_new.dk.count()), rv_new(g_new.dv.count());
  std::vector<double> rq_old(rq_new.size()), rk_old(rk_new.size()), rv_old(rv_new.size());
  ASSERT_EQ(jfa_attention_backward_reference(&bp, rq_new.data(), rk_new.data(), rv_new.data()),
            JFA_SUCCESS);
  ASSERT_EQ(
      jfa_attention_backward_reference(as_current, rq_old.data(), rk_old.data(), rv_old.data()),
      JFA_SUCCESS);
  EXPECT_EQ(rq_old, rq_new);
  EXPECT_EQ(rk_old, rk_new);
  EXPECT_EQ(rv_old, rv_new);
  ASSERT_EQ(jfa_attention_backward_workspace_size(&bp, &bytes_new), JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_backward_workspace_size(as_current, &bytes_old), JFA_SUCCESS);
  EXPECT_EQ(bytes_old, bytes_new);

  // This backward layout embeds the forward of its release only.
  old_b->forward.struct_size = sizeof(jfa_attention_params);
  expect_failure(jfa_attention_backward(as_current), JFA_ERROR_INVALID_ARGUMENT,
                 "forward.struct_size");
}

}  // namespace
