// The backward on the CPU: the float64 reference against finite differences of the float64
// forward, the float32 path against the reference on random jagged batches, and the rules of the
// C entry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::tools::HostBuffer;
using jfa::tools::JaggedBatch;

JaggedBatch make(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, int32_t hq,
                 int32_t hkv, int32_t d, DType dtype, uint64_t seed) {
  return jfa::tools::make_batch(lq, lk, hq, hkv, d, dtype, seed);
}

jfa::JaggedTensor view(HostBuffer& buffer, const JaggedBatch& b, bool keys) {
  return {buffer.data(),
          b.dtype,
          keys ? b.total_k() : b.total_q(),
          keys ? b.heads_kv : b.heads_q,
          b.head_dim,
          0,
          0};
}

// sum(dout * out) + sum(dlse * lse) over the rows that see a key, with out and lse from the
// float64 reference forward.
double loss(JaggedBatch& b, const std::vector<double>& dout, const std::vector<float>& dlse,
            bool causal) {
  jfa::AttentionOptions options;
  options.causal = causal;
  std::vector<double> lse;
  const std::vector<double> out =
      jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                               b.batch(), options, {}, &lse);
  double l = 0;
  for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isfinite(lse[i])) l += dlse[i] * lse[i];
  return l;
}

TEST(Backward, ReferenceMatchesFiniteDifferences) {
  const uint64_t seed = jfa::testing::logged_seed();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    // Lengths 0 and 1, more queries than keys and the reverse (rows without keys under the mask).
    JaggedBatch b = make({0, 1, 3, 5, 2}, {2, 1, 3, 4, 0}, 4, 2, 8, DType::kFloat32, seed);
    HostBuffer dout_buffer(DType::kFloat32, b.total_q() * b.heads_q * b.head_dim);
    std::mt19937_64 rng(seed + 1);
    jfa::tools::fill_normal(dout_buffer, rng);
    std::vector<double> dout(static_cast<size_t>(dout_buffer.count()));
    for (size_t i = 0; i < dout.size(); ++i)
      dout[i] = jfa::tools::element_as_double(dout_buffer, i);

    std::vector<float> dlse(static_cast<size_t>(b.total_q()) * b.heads_q);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : dlse) x = normal(rng);

    jfa::AttentionOptions options;
    options.causal = causal;
    const jfa::ReferenceGradients g = jfa::attention_backward_reference(
        b.q_view(), b.k_view(), b.v_view(), view(dout_buffer, b, false), b.cu_q.data(),
        b.cu_k.data(), b.batch(), options, dlse.data());
    // Central differences with a step of 2^-9: exact in float32 for these inputs, truncation error
    // of order step^2.
    const float step = 1.0f / 512.0f;
    auto check = [&](HostBuffer& x, const std::vector<double>& grad, const char* name) {
      double diff = 0, norm = 0;
      float* data = static_cast<float*>(x.data());
      for (int64_t e = 0; e < x.count(); ++e) {
        const float saved = data[e];
        data[e] = saved + step;
        const double up = loss(b, dout, dlse, causal);
        data[e] = saved - step;
        const double down = loss(b, dout, dlse, causal);
        data[e] = saved;
        const double fd = (up - down) / (2.0 * step);
        diff += (fd - grad[e]) * (fd - grad[e]);
        norm += grad[e] * grad[e];
      }
      ASSERT_GT(norm, 0) << name << ": the gradient is all zeros";
      EXPECT_LE(std::sqrt(diff / norm), 2e-5) << name;
    };
    check(b.q, g.dq, "dq");
    check(b.k, g.dk, "dk");
    check(b.v, g.dv, "dv");
  }
}

struct Gradients {
  HostBuffer dq, dk, dv;
};

// Forward on the CPU (out and LSE), then the backward into poisoned gradient buffers.
Gradients run_backward(JaggedBatch& b, const HostBuffer& dout, bool causal,
                       const float* dlse = nullptr) {
  HostBuffer out = b.make_output();
  std::vector<float> lse(static_cast<size_t>(b.total_q()) * b.heads_q);
  jfa::AttentionOptions options;
  options.causal = causal;
  options.backend = jfa::Backend::kCpu;
  options.lse = lse.data();
  jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false), b.cu_q.data(),
                 b.cu_k.data(), b.batch(), options);
  Gradients g{HostBuffer(b.dtype, b.total_q() * b.heads_q * b.head_dim),
              HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim),
              HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim)};
  jfa::tools::poison(g.dq);
  jfa::tools::poison(g.dk);
  jfa::tools::poison(g.dv);
  HostBuffer dout_copy = dout;
  jfa::attention_backward(
      b.q_view(), b.k_view(), b.v_view(), view(out, b, false),
      {view(dout_copy, b, false), view(g.dq, b, false), view(g.dk, b, true), view(g.dv, b, true)},
      b.cu_q.data(), b.cu_k.data(), b.batch(), options);
  return g;
}

// with_dlse: the loss also uses the forward's LSE.
void expect_backward_matches_reference(JaggedBatch& b, bool causal, uint64_t seed,
                                       const std::string& what, bool with_dlse = false) {
  SCOPED_TRACE(what + (causal ? " causal" : " non-causal"));
  HostBuffer dout(b.dtype, b.total_q() * b.heads_q * b.head_dim);
  std::mt19937_64 rng(seed);
  jfa::tools::fill_normal(dout, rng);
  std::vector<float> dlse(static_cast<size_t>(b.total_q()) * b.heads_q);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : dlse) x = normal(rng);
  const float* dlse_ptr = with_dlse ? dlse.data() : nullptr;
  const Gradients got = run_backward(b, dout, causal, dlse_ptr);
  jfa::AttentionOptions options;
  options.causal = causal;
  HostBuffer dout_copy = dout;
  const jfa::ReferenceGradients ref = jfa::attention_backward_reference(
      b.q_view(), b.k_view(), b.v_view(), view(dout_copy, b, false), b.cu_q.data(), b.cu_k.data(),
      b.batch(), options);
  // relative_error is +inf when an element is NaN: the poison of an unwritten element included.
  const double tol = jfa::tools::tolerance(b.dtype);  // the forward's
  const double err_q =
      jfa::tools::relative_error(got.dq, ref.dq, {}, int64_t{b.heads_q} * b.head_dim);
  const double err_k =
      jfa::tools::relative_error(got.dk, ref.dk, {}, int64_t{b.heads_kv} * b.head_dim);
  const double err_v =
      jfa::tools::relative_error(got.dv, ref.dv, {}, int64_t{b.heads_kv} * b.head_dim);
  std::printf("  %s %s%s: rel err dq %.2g dk %.2g dv %.2g (tol %.g)\n", what.c_str(),
              jfa::tools::dtype_name(b.dtype), causal ? " causal" : "", err_q, err_k, err_v, tol);
  EXPECT_LE(err_q, tol) << "dq";
  EXPECT_LE(err_k, tol) << "dk";
  EXPECT_LE(err_v, tol) << "dv";
}

std::vector<int32_t> random_lengths(std::mt19937_64& rng, int n, int lo, int hi) {
  std::uniform_int_distribution<int32_t> len(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = len(rng);
  return v;
}

// Two runs on the same inputs give the same bytes.
void expect_bit_identical_runs(JaggedBatch& b, bool causal, std::mt19937_64& rng) {
  HostBuffer dout(b.dtype, b.total_q() * b.heads_q * b.head_dim);
  jfa::tools::fill_normal(dout, rng);
  const Gradients first = run_backward(b, dout, causal);
  const Gradients second = run_backward(b, dout, causal);
  EXPECT_EQ(first.dq.bytes, second.dq.bytes);
  EXPECT_EQ(first.dk.bytes, second.dk.bytes);
  EXPECT_EQ(first.dv.bytes, second.dv.bytes);
}

TEST(Backward, CpuMatchesReference) {
  const uint64_t seed = jfa::testing::logged_seed();
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> edge = {0, 1, 63, 64, 65, 127, 129, 7};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true}) {
      JaggedBatch same = make(edge, edge, 4, 2, 64, dtype, rng());
      expect_backward_matches_reference(same, causal, rng(), "edge lengths, GQA");
      // Cross lengths (rows without keys under the causal mask), MQA, a head_dim that is not a
      // power of two.
      JaggedBatch cross = make(random_lengths(rng, 6, 0, 150), random_lengths(rng, 6, 0, 150), 4, 1,
                               40, dtype, rng());
      expect_backward_matches_reference(cross, causal, rng(), "cross lengths, MQA, d=40");
      expect_backward_matches_reference(cross, causal, rng(), "with the LSE in the loss", true);
    }
}

TEST(Backward, ManyTinySequences) {
  const uint64_t seed = jfa::testing::logged_seed();
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> lengths = random_lengths(rng, 4096, 0, 8);
  JaggedBatch b = make(lengths, lengths, 2, 2, 32, DType::kFloat16, rng());
  expect_backward_matches_reference(b, true, rng(), "4096 sequences of 0-8 tokens");
}

TEST(Backward, Deterministic) {
  const uint64_t seed = jfa::testing::logged_seed();
  std::mt19937_64 rng(seed);
  JaggedBatch b = make(random_lengths(rng, 5, 50, 300), random_lengths(rng, 5, 50, 300), 8, 2, 64,
                       DType::kBFloat16, rng());
  expect_bit_identical_runs(b, false, rng);
}

// Fewer (sequence, kv head) pairs than workers: the keys of a sequence are split into blocks whose
// parts of dq are summed afterwards (with two or more CPU threads). Still the oracle's gradients,
// and still bit-identical from run to run.
TEST(Backward, FewLongSequencesSplitTheirKeys) {
  const uint64_t seed = jfa::testing::logged_seed();
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16})
    for (bool causal : {false, true}) {
      JaggedBatch one = make({700}, {700}, 4, 1, 64, dtype, rng());
      expect_backward_matches_reference(one, causal, rng(), "one sequence, MQA");
      JaggedBatch cross = make({300, 0}, {900, 100}, 4, 1, 32, dtype, rng());
      expect_backward_matches_reference(cross, causal, rng(), "cross lengths, a q-less sequence");
      JaggedBatch short_keys = make({200}, {100}, 2, 1, 64, dtype, rng());
      expect_backward_matches_reference(short_keys, causal, rng(), "fewer key tiles than blocks",
                                        true);
    }
  JaggedBatch b = make({900}, {900}, 4, 1, 64, DType::kFloat32, rng());
  expect_bit_identical_runs(b, true, rng);
}

// No sequence at all (batch 0): nothing to compute, success.
TEST(Backward, EmptyBatch) {
  JaggedBatch b = make({}, {}, 2, 1, 16, DType::kFloat32, 3);
  HostBuffer dout(b.dtype, 0);
  const Gradients got = run_backward(b, dout, false);
  EXPECT_TRUE(got.dq.bytes.empty());
}

// A valid backward call on host buffers, to be broken one rule at a time.
struct BackwardCall {
  JaggedBatch b;
  HostBuffer out = b.make_output(), dout = b.make_output(), dq = b.make_output();
  HostBuffer dk = HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim);
  HostBuffer dv = dk;
  std::vector<float> lse = std::vector<float>(static_cast<size_t>(b.total_q()) * b.heads_q, 0.f);
  jfa_attention_backward_params p{};

  BackwardCall() : BackwardCall(make({3, 5}, {4, 2}, 2, 1, 16, DType::kFloat32, 7)) {}
  explicit BackwardCall(JaggedBatch batch) : b(std::move(batch)) {
    std::mt19937_64 rng(11);
    jfa::tools::fill_normal(dout, rng);
    jfa::AttentionOptions options;
    options.lse = lse.data();
    options.backend = jfa::Backend::kCpu;
    cxx_forward(options);
    p = jfa::make_backward_params(
        b.q_view(), b.k_view(), b.v_view(), view(out, b, false),
        {view(dout, b, false), view(dq, b, false), view(dk, b, true), view(dv, b, true)},
        b.cu_q.data(), b.cu_k.data(), b.batch(), options, false);
    jfa::tools::poison(dq);
    jfa::tools::poison(dk);
    jfa::tools::poison(dv);
  }

  // The forward (out and the LSE of options.lse) and the backward through the C++ API.
  void cxx_forward(const jfa::AttentionOptions& options) {
    jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false), b.cu_q.data(),
                   b.cu_k.data(), b.batch(), options);
  }
  void cxx_backward(const jfa::AttentionOptions& options) {
    jfa::attention_backward(
        b.q_view(), b.k_view(), b.v_view(), view(out, b, false),
        {view(dout, b, false), view(dq, b, false), view(dk, b, true), view(dv, b, true)},
        b.cu_q.data(), b.cu_k.data(), b.batch(), options);
  }

  bool untouched() const {
    auto all_poison = [](const HostBuffer& h) {
      for (unsigned char c : h.bytes)
        if (c != 0xFF) return false;
      return true;
    };
    return all_poison(dq) && all_poison(dk) && all_poison(dv);
  }
};

// One rule of the C entry broken: the status, words of the message, and no gradient written.
struct Breakage {
  const char* what;
  void (*apply)(jfa_attention_backward_params& p, std::vector<int32_t>& spare_offsets);
  jfa_status status;
  const char* words;
};

const Breakage kBreakages[] = {
    {"struct not filled by init", [](auto& p, auto&) { p.struct_size = 0; },
     JFA_ERROR_INVALID_ARGUMENT, "jfa_attention_backward_params_init"},
    {"no forward LSE", [](auto& p, auto&) { p.forward.lse = nullptr; }, JFA_ERROR_INVALID_ARGUMENT,
     "forward.lse"},
    {"no dout", [](auto& p, auto&) { p.dout = nullptr; }, JFA_ERROR_INVALID_ARGUMENT, "dout"},
    {"no dk", [](auto& p, auto&) { p.dk = nullptr; }, JFA_ERROR_INVALID_ARGUMENT, "dk"},
    {"negative dq stride",
     [](auto& p, auto&) {
       p.dq_layout = {-1, 16};
     },
     JFA_ERROR_INVALID_ARGUMENT, "dq strides"},
    {"heads_q not a multiple of heads_kv", [](auto& p, auto&) { p.forward.heads_kv = 3; },
     JFA_ERROR_INVALID_ARGUMENT, "heads_kv"},
    {"decreasing offsets",
     [](auto& p, auto& spare) {
       spare.assign(p.forward.cu_seqlens_q, p.forward.cu_seqlens_q + p.forward.batch + 1);
       spare[1] = spare[2] + 1;
       p.forward.cu_seqlens_q = spare.data();
     },
     JFA_ERROR_INVALID_ARGUMENT, "non-decreasing"},
};

// A kept workspace serves the backward too: host-memory calls get none (stale values are
// overwritten), bad arguments are rejected, and the C++ call with one runs.
TEST(Backward, KeptWorkspaceGivesHostCallsNone) {
  BackwardCall call;
  jfa_workspace* ws = nullptr;
  ASSERT_EQ(jfa_workspace_create(&ws), JFA_SUCCESS);
  call.p.forward.workspace = &call;
  call.p.forward.workspace_bytes = 7;
  ASSERT_EQ(jfa_workspace_prepare_backward(ws, &call.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(call.p.forward.workspace, nullptr);
  EXPECT_EQ(call.p.forward.workspace_bytes, 0u);
  EXPECT_EQ(jfa_attention_backward(&call.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_FALSE(call.untouched());
  EXPECT_EQ(jfa_workspace_prepare_backward(nullptr, &call.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_workspace_prepare_backward(ws, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  jfa_attention_backward_params unset = call.p;
  unset.struct_size = 0;
  EXPECT_EQ(jfa_workspace_prepare_backward(ws, &unset), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_workspace_destroy(ws), JFA_SUCCESS);

  BackwardCall cxx;
  jfa::Workspace workspace;
  jfa::AttentionOptions options;
  options.lse = cxx.lse.data();
  options.backend = jfa::Backend::kCpu;
  options.workspace = &workspace;
  // The forward's LSE of this call (BackwardCall ran it with its own options).
  cxx.cxx_forward(options);
  cxx.cxx_backward(options);
  EXPECT_FALSE(cxx.untouched());
}

// The checked mode through the C++ options: the CPU backend stores 0 in a host word once the
// offsets pass its check, and the float64 references leave the word alone.
TEST(Backward, CxxOptionsCarryTheCheckedModeWord) {
  BackwardCall cxx;
  int32_t word = -1;
  jfa::AttentionOptions options;
  options.lse = cxx.lse.data();
  options.backend = jfa::Backend::kCpu;
  options.device_check = &word;
  cxx.cxx_forward(options);
  EXPECT_EQ(word, 0) << jfa::device_check_message(word);
  word = -1;
  cxx.cxx_backward(options);
  EXPECT_EQ(word, 0) << jfa::device_check_message(word);
  EXPECT_FALSE(cxx.untouched());
  word = -1;
  jfa::attention_reference(cxx.b.q_view(), cxx.b.k_view(), cxx.b.v_view(), cxx.b.cu_q.data(),
                           cxx.b.cu_k.data(), cxx.b.batch(), options);
  jfa::attention_backward_reference(cxx.b.q_view(), cxx.b.k_view(), cxx.b.v_view(),
                                    view(cxx.dout, cxx.b, false), cxx.b.cu_q.data(),
                                    cxx.b.cu_k.data(), cxx.b.batch(), options);
  EXPECT_EQ(word, -1);
  EXPECT_EQ(jfa::device_check_message(JFA_OFFSETS_Q_DECREASING), "cu_seqlens_q decreases");
}

// The CPU backward reads the forward's LSE from host memory: an entry the forward cannot have
// written (NaN, +inf, or -inf in a row that sees a key) is rejected before anything is written,
// checked-mode word included, naming the entry; -inf in a row that sees no key is what the forward
// writes there.
TEST(Backward, LseTheForwardCannotHaveWrittenIsRejected) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Bad {
    float value;
    const char* shown;
  };
  for (const Bad& bad : {Bad{nan, "nan"}, Bad{inf, "inf"}, Bad{-inf, "-inf"}}) {
    SCOPED_TRACE(bad.shown);
    BackwardCall call;  // every row sees a key
    int32_t word = -1;
    call.p.forward.device_check = &word;
    call.lse[1 * call.b.total_q() + 4] = bad.value;  // head 1, token 4 (row 1 of sequence 1)
    EXPECT_EQ(jfa_attention_backward(&call.p), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message())
                  .find(std::string("lse of head 1, token 4 is ") + bad.shown + ":"),
              std::string::npos)
        << jfa_last_error_message();
    EXPECT_TRUE(call.untouched()) << "a rejected call wrote a gradient";
    EXPECT_EQ(word, -1);
  }
  // Causal with more queries than keys: the first rows of sequence 1 see no key.
  jfa::AttentionOptions causal;
  causal.causal = true;
  BackwardCall call(make({3, 4}, {3, 2}, 2, 1, 16, DType::kFloat32, 9));
  causal.lse = call.lse.data();
  call.cxx_forward(causal);
  call.p.forward.causal = 1;
  const size_t no_key = 1 * call.b.total_q() + 4;  // head 1, token 4: row 1 of sequence 1
  ASSERT_EQ(call.lse[no_key], -inf);
  jfa_attention_backward_params p = call.p;
  EXPECT_EQ(jfa_attention_backward(&p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_FALSE(call.untouched());
  for (const float bad : {nan, inf}) {
    BackwardCall again(make({3, 4}, {3, 2}, 2, 1, 16, DType::kFloat32, 9));
    causal.lse = again.lse.data();
    again.cxx_forward(causal);
    again.p.forward.causal = 1;
    again.lse[no_key] = bad;
    EXPECT_EQ(jfa_attention_backward(&again.p), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find("lse of head 1, token 4 is "),
              std::string::npos)
        << jfa_last_error_message();
    EXPECT_TRUE(again.untouched());
  }
}

TEST(Backward, RulesOfTheCEntry) {
  EXPECT_EQ(jfa_attention_backward(nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_attention_backward_params_init(nullptr), JFA_ERROR_INVALID_ARGUMENT);
  for (const Breakage& broken : kBreakages) {
    SCOPED_TRACE(broken.what);
    BackwardCall call;
    jfa_attention_backward_params p = call.p;
    std::vector<int32_t> spare;
    broken.apply(p, spare);
    EXPECT_EQ(jfa_attention_backward(&p), broken.status);
    EXPECT_NE(std::string(jfa_last_error_message()).find(broken.words), std::string::npos)
        << jfa_last_error_message();
    EXPECT_TRUE(call.untouched()) << "a rejected call wrote a gradient";
  }
  {
    // Host buffers cannot go to the CUDA backend: it is not built, or it needs device buffers.
    BackwardCall call;
    call.p.forward.backend = JFA_BACKEND_CUDA;
    const jfa_status s = jfa_attention_backward(&call.p);
    EXPECT_TRUE(s == JFA_ERROR_BACKEND_UNAVAILABLE || s == JFA_ERROR_INVALID_ARGUMENT) << s;
    EXPECT_NE(std::string(jfa_last_error_message()).find("backend=cuda"), std::string::npos)
        << jfa_last_error_message();
    EXPECT_TRUE(call.untouched());
  }
  BackwardCall call;
  size_t bytes = 1;
  // What the CUDA backward would need (0 without it); the CPU backward ignores the workspace.
  EXPECT_EQ(jfa_attention_backward_workspace_size(&call.p, &bytes), JFA_SUCCESS);
  EXPECT_EQ(jfa_attention_backward(&call.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_FALSE(call.untouched());
}

}  // namespace
