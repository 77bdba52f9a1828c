// Buffers a call writes must not share memory with the call's other buffers: each overlap the
// library used to compute wrongly with status 0 is now rejected, naming both buffers, with nothing
// written; views that interleave in one fused tensor without sharing an element still run, and
// give the same result as separate buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/jagged_batch.hpp"
#include "float32_call.hpp"
#include "jfa/jfa.hpp"

namespace {

using jfa::DType;

constexpr int kTotal = 12, kHeads = 2, kDim = 8;
const std::vector<int32_t> kOffsets = {0, 5, 12};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 2654435761u + seed) % 997) / 500.f - 1;
  return v;
}

jfa_attention_params params(const void* q, const void* k, const void* v, void* out, float* lse) {
  return jfa::testing::float32_call({&kOffsets, kHeads, kDim}, q, k, v, out, lse);
}

jfa_attention_backward_params backward_params(const jfa_attention_params& forward,
                                              const float* dout, float* dq, float* dk, float* dv) {
  jfa_attention_backward_params b;
  jfa_attention_backward_params_init(&b);
  b.forward = forward;
  b.dout = dout;
  b.dq = dq;
  b.dk = dk;
  b.dv = dv;
  return b;
}

void expect_overlap_rejected(const jfa_attention_params& p, const char* written,
                             const char* other) {
  EXPECT_EQ(jfa_attention_forward(&p), JFA_ERROR_INVALID_ARGUMENT);
  const std::string message = jfa_last_error_message();
  EXPECT_NE(message.find(std::string(written) + " and " + other + " share memory"),
            std::string::npos)
      << message;
}

TEST(Overlap, OutputsSharingMemoryWithInputsAreRejected) {
  const size_t n = kTotal * kHeads * kDim;
  std::vector<float> q = random_floats(n, 1), k = random_floats(n, 2), v = random_floats(n, 3);
  std::vector<float> lse(kTotal * kHeads);
  // out over k shifted by one token, out == q (in place), lse inside out.
  std::vector<float> k_copy = k;
  expect_overlap_rejected(params(q.data(), k.data(), v.data(), k.data() + kHeads * kDim, nullptr),
                          "out", "k");
  EXPECT_EQ(k, k_copy) << "a rejected call wrote into k";
  expect_overlap_rejected(params(q.data(), k.data(), v.data(), q.data(), nullptr), "out", "q");
  std::vector<float> out(n);
  expect_overlap_rejected(params(q.data(), k.data(), v.data(), out.data(), out.data() + 3), "out",
                          "lse");
  // Offsets inside the output.
  jfa_attention_params p = params(q.data(), k.data(), v.data(), out.data(), nullptr);
  std::vector<float> out_with_offsets(n + 8);
  std::memcpy(out_with_offsets.data() + n + 1, kOffsets.data(), kOffsets.size() * 4);
  p.out = out_with_offsets.data() + 2;  // its last elements cover the offsets copy
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(out_with_offsets.data() + n + 1);
  expect_overlap_rejected(p, "out", "cu_seqlens_q");
}

TEST(Overlap, InterleavedSlotsOfOneFusedTensorRun) {
  // One buffer [total, 4, heads, d] holding q, k, v and out in its four slots.
  const int64_t slot = kHeads * kDim, token = 4 * slot;
  std::vector<float> fused = random_floats(kTotal * token, 7);
  jfa_attention_params p = params(fused.data(), fused.data() + slot, fused.data() + 2 * slot,
                                  fused.data() + 3 * slot, nullptr);
  for (jfa_tensor_layout* l : {&p.q_layout, &p.k_layout, &p.v_layout, &p.out_layout})
    *l = {token, kDim};
  // The same problem in separate packed buffers.
  const size_t n = kTotal * kHeads * kDim;
  std::vector<float> q(n), k(n), v(n), out(n);
  for (int t = 0; t < kTotal; ++t)
    for (int e = 0; e < slot; ++e) {
      q[t * slot + e] = fused[t * token + e];
      k[t * slot + e] = fused[t * token + slot + e];
      v[t * slot + e] = fused[t * token + 2 * slot + e];
    }
  ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
  jfa_attention_params separate = params(q.data(), k.data(), v.data(), out.data(), nullptr);
  ASSERT_EQ(jfa_attention_forward(&separate), JFA_SUCCESS) << jfa_last_error_message();
  for (int t = 0; t < kTotal; ++t)
    for (int e = 0; e < slot; ++e) ASSERT_EQ(fused[t * token + 3 * slot + e], out[t * slot + e]);
  // Shifted by one element, the out slot runs into the v slot: rejected.
  p.out = fused.data() + 3 * slot - 1;
  expect_overlap_rejected(p, "out", "v");
}

TEST(Overlap, GradientsSharingMemoryAreRejected) {
  const size_t n = kTotal * kHeads * kDim;
  std::vector<float> q = random_floats(n, 1), k = random_floats(n, 2), v = random_floats(n, 3);
  std::vector<float> out(n), lse(kTotal * kHeads), dout = random_floats(n, 4);
  jfa_attention_params f = params(q.data(), k.data(), v.data(), out.data(), lse.data());
  ASSERT_EQ(jfa_attention_forward(&f), JFA_SUCCESS) << jfa_last_error_message();
  std::vector<float> dq(n), dk(n), dv(n);
  jfa_attention_backward_params b =
      backward_params(f, dout.data(), dq.data(), dk.data(), dv.data());
  ASSERT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
  struct Case {
    void* dq;
    void* dk;
    const char* words;
  };
  for (const Case& c : {Case{dout.data(), dk.data(), "dq and dout share memory"},
                        Case{dq.data(), dq.data(), "dq and dk share memory"},
                        Case{dq.data(), q.data(), "dk and q share memory"},
                        Case{lse.data(), dk.data(), "dq and lse share memory"}}) {
    jfa_attention_backward_params broken = b;
    broken.dq = c.dq;
    broken.dk = c.dk;
    EXPECT_EQ(jfa_attention_backward(&broken), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find(c.words), std::string::npos)
        << jfa_last_error_message();
  }
}

// A caller's workspace is written by the CUDA path: it must not share memory with the call's
// buffers either (the CPU path ignores a disjoint one).
TEST(Overlap, WorkspaceSharingMemoryIsRejected) {
  const size_t n = kTotal * kHeads * kDim;
  std::vector<float> q = random_floats(n, 1), k = random_floats(n, 2), v = random_floats(n, 3);
  std::vector<float> out(n), lse(kTotal * kHeads), dout = random_floats(n, 4), scratch(64);
  jfa_attention_params f = params(q.data(), k.data(), v.data(), out.data(), lse.data());
  auto expect_named = [](const char* other) {
    const std::string message = jfa_last_error_message();
    EXPECT_NE(message.find("share memory"), std::string::npos) << message;
    EXPECT_NE(message.find("workspace"), std::string::npos) << message;
    EXPECT_NE(message.find(other), std::string::npos) << message;
  };
  for (auto [base, name] : {std::pair<void*, const char*>{out.data() + 5, "out"},
                            {q.data(), "q"},
                            {lse.data() + 1, "lse"}}) {
    jfa_attention_params broken = f;
    broken.workspace = base;
    broken.workspace_bytes = 64;
    EXPECT_EQ(jfa_attention_forward(&broken), JFA_ERROR_INVALID_ARGUMENT);
    expect_named(name);
  }
  jfa_attention_params with_scratch = f;
  with_scratch.workspace = scratch.data();
  with_scratch.workspace_bytes = scratch.size() * sizeof(float);
  ASSERT_EQ(jfa_attention_forward(&with_scratch), JFA_SUCCESS) << jfa_last_error_message();

  std::vector<float> dq(n), dk(n), dv(n);
  jfa_attention_backward_params b =
      backward_params(with_scratch, dout.data(), dq.data(), dk.data(), dv.data());
  ASSERT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
  for (auto [base, name] : {std::pair<void*, const char*>{dq.data() + 7, "dq"},
                            {dout.data(), "dout"},
                            {out.data(), "out"}}) {
    jfa_attention_backward_params broken = b;
    broken.forward.workspace = base;
    EXPECT_EQ(jfa_attention_backward(&broken), JFA_ERROR_INVALID_ARGUMENT);
    expect_named(name);
  }
}

// GQA gradients in the slots of one fused [total, heads_q + 2 heads_kv, d] buffer do not share an
// element and run; with MQA, a stride of the size-1 head dimension (never used to address) cannot
// hide dk and dv sharing memory; a layout whose own rows overlap (token_stride 1 with one head) is
// rejected.
TEST(Overlap, FusedGqaGradientsOddStridesAndSelfOverlappingRows) {
  constexpr int kHq = 4, kHkv = 1, kSlots = kHq + 2 * kHkv;
  const size_t nq = kTotal * kHq * kDim, nk = kTotal * kHkv * kDim;
  std::vector<float> q = random_floats(nq, 1), k = random_floats(nk, 2), v = random_floats(nk, 3);
  std::vector<float> out(nq), lse(kTotal * kHq), dout = random_floats(nq, 4);
  jfa_attention_params f = params(q.data(), k.data(), v.data(), out.data(), lse.data());
  f.heads_q = kHq;
  f.heads_kv = kHkv;
  ASSERT_EQ(jfa_attention_forward(&f), JFA_SUCCESS) << jfa_last_error_message();
  jfa_attention_backward_params b;
  jfa_attention_backward_params_init(&b);
  b.forward = f;
  b.dout = dout.data();
  std::vector<float> dq(nq), dk(nk), dv(nk);
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  ASSERT_EQ(jfa_attention_backward(&b), JFA_SUCCESS) << jfa_last_error_message();
  std::vector<float> fused(kTotal * kSlots * kDim);
  jfa_attention_backward_params in_fused = b;
  in_fused.dq = fused.data();
  in_fused.dk = fused.data() + kHq * kDim;
  in_fused.dv = fused.data() + (kHq + kHkv) * kDim;
  in_fused.dq_layout = in_fused.dk_layout = in_fused.dv_layout = {kSlots * kDim, kDim};
  ASSERT_EQ(jfa_attention_backward(&in_fused), JFA_SUCCESS) << jfa_last_error_message();
  for (int t = 0; t < kTotal; ++t)
    for (int e = 0; e < kHq * kDim; ++e)
      ASSERT_EQ(fused[t * kSlots * kDim + e], dq[t * kHq * kDim + e]);

  // dk and dv 4 tokens apart in one buffer, token stride 18 (> 3 d): dk's token 4 is dv's token 0.
  std::vector<float> shared(kTotal * 18 + 64);
  jfa_attention_backward_params hidden = b;
  hidden.dk = shared.data();
  hidden.dv = shared.data() + 4 * 18;
  hidden.dk_layout = hidden.dv_layout = {18, 32};  // head stride of the single head: unused
  EXPECT_EQ(jfa_attention_backward(&hidden), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("dk and dv share memory"), std::string::npos)
      << jfa_last_error_message();

  jfa_attention_backward_params rows = b;
  rows.dk_layout = {1, 1};  // one head: token rows 1 element apart overlap
  EXPECT_EQ(jfa_attention_backward(&rows), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("dk strides make rows overlap"),
            std::string::npos)
      << jfa_last_error_message();
}

}  // namespace
