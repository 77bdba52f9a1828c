// Pointers of the C ABI must be aligned to their element size (an element at a misaligned address
// cannot be loaded as its type): every entry point rejects a misaligned buffer, naming it and the
// size, before reading or writing anything.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "float32_call.hpp"
#include "jfa/jfa.h"

namespace {

constexpr int kTotal = 6, kHeads = 2, kDim = 8;
const std::vector<int32_t> kOffsets = {0, 2, 6};
constexpr size_t kElements = kTotal * kHeads * kDim;

// `bytes` past the start of a buffer: a pointer misaligned for its element type.
template <typename T>
T* shifted(std::vector<unsigned char>& buffer, size_t bytes) {
  return reinterpret_cast<T*>(buffer.data() + bytes);
}

void expect_misaligned(jfa_status s, const std::string& name, size_t element_bytes) {
  EXPECT_EQ(s, JFA_ERROR_INVALID_ARGUMENT);
  const std::string want =
      name + " is not aligned to its element size (" + std::to_string(element_bytes) + " bytes)";
  EXPECT_NE(std::string(jfa_last_error_message()).find(want), std::string::npos)
      << jfa_last_error_message();
}

// Host buffers of a float32 forward and backward, each with spare bytes to misalign it in, all
// starting at an aligned address (vector storage).
struct Buffers {
  std::vector<unsigned char> q, k, v, out, dout, dq, dk, dv;
  std::vector<unsigned char> lse, dlse, offsets;

  Buffers() {
    for (auto* b : {&q, &k, &v, &out, &dout, &dq, &dk, &dv}) b->assign(kElements * 4 + 8, 0);
    for (auto* b : {&lse, &dlse}) b->assign(kTotal * kHeads * 4 + 8, 0);
    offsets.assign(kOffsets.size() * 4 + 8, 0);
    std::memcpy(offsets.data(), kOffsets.data(), kOffsets.size() * 4);
    const float one = 1.0f;
    for (size_t i = 0; i < kElements; ++i)
      for (auto* b : {&q, &k, &v, &dout}) std::memcpy(b->data() + 4 * i, &one, 4);
  }

  jfa_attention_params forward() {
    jfa_attention_params p =
        jfa::testing::float32_call({&kOffsets, kHeads, kDim}, q.data(), k.data(), v.data(),
                                   out.data(), shifted<float>(lse, 0));
    p.cu_seqlens_q = p.cu_seqlens_k = shifted<int32_t>(offsets, 0);
    return p;
  }

  jfa_attention_backward_params backward() {
    jfa_attention_backward_params b;
    jfa_attention_backward_params_init(&b);
    b.forward = forward();
    b.dout = dout.data();
    b.dq = dq.data();
    b.dk = dk.data();
    b.dv = dv.data();
    b.dlse = shifted<float>(dlse, 0);
    return b;
  }
};

TEST(Alignment, ForwardRejectsMisalignedBuffers) {
  {
    Buffers b;
    jfa_attention_params p = b.forward();
    ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
  }
  struct Case {
    const char* name;
    void (*misalign)(jfa_attention_params&, Buffers&);
    size_t bytes;
  };
  const Case cases[] = {
      {"q", [](auto& p, auto& b) { p.q = shifted<float>(b.q, 2); }, 4},
      {"k", [](auto& p, auto& b) { p.k = shifted<float>(b.k, 1); }, 4},
      {"v", [](auto& p, auto& b) { p.v = shifted<float>(b.v, 3); }, 4},
      {"out", [](auto& p, auto& b) { p.out = shifted<float>(b.out, 2); }, 4},
      {"lse", [](auto& p, auto& b) { p.lse = shifted<float>(b.lse, 2); }, 4},
      {"cu_seqlens_q", [](auto& p, auto& b) { p.cu_seqlens_q = shifted<int32_t>(b.offsets, 2); },
       4},
      {"cu_seqlens_k", [](auto& p, auto& b) { p.cu_seqlens_k = shifted<int32_t>(b.offsets, 1); },
       4},
      {"device_check", [](auto& p, auto& b) { p.device_check = shifted<int32_t>(b.dlse, 2); }, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Buffers b;
    jfa_attention_params p = b.forward();
    c.misalign(p, b);
    const std::vector<unsigned char> out_before = b.out;
    expect_misaligned(jfa_attention_forward(&p), c.name, c.bytes);
    EXPECT_EQ(b.out, out_before) << "a rejected call wrote its output";
  }
  // 16-bit elements: any odd address.
  Buffers b;
  jfa_attention_params p = b.forward();
  p.dtype = JFA_DTYPE_FLOAT16;
  p.q = shifted<uint16_t>(b.q, 1);
  expect_misaligned(jfa_attention_forward(&p), "q", 2);
  p.q = shifted<uint16_t>(b.q, 2);  // aligned for fp16
  p.out = shifted<uint16_t>(b.out, 3);
  expect_misaligned(jfa_attention_forward(&p), "out", 2);
  p.out = shifted<uint16_t>(b.out, 2);
  EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
}

TEST(Alignment, BackwardRejectsMisalignedBuffers) {
  struct Case {
    const char* name;
    void (*misalign)(jfa_attention_backward_params&, Buffers&);
  };
  const Case cases[] = {
      {"dout", [](auto& p, auto& b) { p.dout = shifted<float>(b.dout, 2); }},
      {"dq", [](auto& p, auto& b) { p.dq = shifted<float>(b.dq, 1); }},
      {"dk", [](auto& p, auto& b) { p.dk = shifted<float>(b.dk, 2); }},
      {"dv", [](auto& p, auto& b) { p.dv = shifted<float>(b.dv, 3); }},
      {"dlse", [](auto& p, auto& b) { p.dlse = shifted<float>(b.dlse, 2); }},
      {"lse", [](auto& p, auto& b) { p.forward.lse = shifted<float>(b.lse, 2); }},
      {"q", [](auto& p, auto& b) { p.forward.q = shifted<float>(b.q, 2); }},
      {"cu_seqlens_q",
       [](auto& p, auto& b) { p.forward.cu_seqlens_q = shifted<int32_t>(b.offsets, 2); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Buffers b;
    jfa_attention_params forward = b.forward();
    ASSERT_EQ(jfa_attention_forward(&forward), JFA_SUCCESS) << jfa_last_error_message();
    jfa_attention_backward_params p = b.backward();
    ASSERT_EQ(jfa_attention_backward(&p), JFA_SUCCESS) << jfa_last_error_message();
    c.misalign(p, b);
    const std::vector<unsigned char> dq = b.dq, dk = b.dk, dv = b.dv;
    expect_misaligned(jfa_attention_backward(&p), c.name, 4);
    EXPECT_TRUE(b.dq == dq && b.dk == dk && b.dv == dv) << "a rejected call wrote a gradient";
  }
}

TEST(Alignment, ReferencesRejectMisalignedBuffers) {
  Buffers b;
  jfa_attention_params p = b.forward();
  std::vector<unsigned char> out(kElements * 8 + 8), lse(kTotal * kHeads * 8 + 8);
  std::vector<unsigned char> tokens(2 * 8 + 8);
  EXPECT_EQ(jfa_attention_reference(&p, nullptr, kTotal, shifted<double>(out, 0),
                                    shifted<double>(lse, 0)),
            JFA_SUCCESS)
      << jfa_last_error_message();
  expect_misaligned(jfa_attention_reference(&p, nullptr, kTotal, shifted<double>(out, 4),
                                            shifted<double>(lse, 0)),
                    "out", 8);
  expect_misaligned(jfa_attention_reference(&p, nullptr, kTotal, shifted<double>(out, 0),
                                            shifted<double>(lse, 2)),
                    "lse", 8);
  expect_misaligned(
      jfa_attention_reference(&p, shifted<int64_t>(tokens, 4), 2, shifted<double>(out, 0), nullptr),
      "q_tokens", 8);
  jfa_attention_params odd = p;
  odd.k = shifted<float>(b.k, 2);
  expect_misaligned(
      jfa_attention_reference(&odd, nullptr, kTotal, shifted<double>(out, 0), nullptr), "k", 4);

  jfa_attention_backward_params g = b.backward();
  std::vector<unsigned char> dq(kElements * 8 + 8), dk = dq, dv = dq;
  EXPECT_EQ(jfa_attention_backward_reference(&g, shifted<double>(dq, 0), shifted<double>(dk, 0),
                                             shifted<double>(dv, 0)),
            JFA_SUCCESS)
      << jfa_last_error_message();
  expect_misaligned(jfa_attention_backward_reference(
                        &g, shifted<double>(dq, 0), shifted<double>(dk, 4), shifted<double>(dv, 0)),
                    "dk", 8);
  g.dout = shifted<float>(b.dout, 1);
  expect_misaligned(jfa_attention_backward_reference(
                        &g, shifted<double>(dq, 0), shifted<double>(dk, 0), shifted<double>(dv, 0)),
                    "dout", 4);
}

TEST(Alignment, JaggedUtilitiesRejectMisalignedBuffers) {
  Buffers b;
  const int32_t* offsets = shifted<int32_t>(b.offsets, 0);
  const int32_t* odd_offsets = shifted<int32_t>(b.offsets, 2);
  std::vector<unsigned char> jagged(kTotal * 3 * 4 + 8), padded(2 * 4 * 3 * 4 + 8);
  // jagged [6, 3] and padded [2, 4, 3] float32 or float16 rows.
  for (const jfa_dtype dtype : {JFA_DTYPE_FLOAT32, JFA_DTYPE_FLOAT16}) {
    const size_t size = dtype == JFA_DTYPE_FLOAT32 ? 4 : 2;
    SCOPED_TRACE(size);
    void* ok_jagged = jagged.data();
    void* ok_padded = padded.data();
    ASSERT_EQ(jfa_jagged_to_padded(ok_jagged, offsets, 2, 3, dtype, 4, 0.0, ok_padded), JFA_SUCCESS)
        << jfa_last_error_message();
    ASSERT_EQ(jfa_padded_to_jagged(ok_padded, offsets, 2, 3, dtype, 4, ok_jagged), JFA_SUCCESS)
        << jfa_last_error_message();
    expect_misaligned(
        jfa_jagged_to_padded(jagged.data() + size / 2, offsets, 2, 3, dtype, 4, 0.0, ok_padded),
        "jagged", size);
    expect_misaligned(
        jfa_jagged_to_padded(ok_jagged, offsets, 2, 3, dtype, 4, 0.0, padded.data() + 1), "padded",
        size);
    expect_misaligned(jfa_padded_to_jagged(padded.data() + 1, offsets, 2, 3, dtype, 4, ok_jagged),
                      "padded", size);
    expect_misaligned(
        jfa_padded_to_jagged(ok_padded, offsets, 2, 3, dtype, 4, jagged.data() + size / 2),
        "jagged", size);
    expect_misaligned(jfa_jagged_to_padded(ok_jagged, odd_offsets, 2, 3, dtype, 4, 0.0, ok_padded),
                      "offsets", 4);
  }
  int32_t m = 0;
  expect_misaligned(jfa_max_length(odd_offsets, 2, &m), "offsets", 4);
  expect_misaligned(jfa_max_length(offsets, 2, shifted<int32_t>(b.dlse, 2)), "max_length", 4);
  expect_misaligned(jfa_validate_offsets(odd_offsets, 2, 6), "offsets", 4);
  std::vector<unsigned char> lengths(4 * 4 + 8), out(4 * 4 + 8);
  expect_misaligned(
      jfa_lengths_to_offsets(shifted<int32_t>(lengths, 2), 3, shifted<int32_t>(out, 0)), "lengths",
      4);
  expect_misaligned(
      jfa_lengths_to_offsets(shifted<int32_t>(lengths, 0), 3, shifted<int32_t>(out, 1)), "offsets",
      4);
  double flops = 0;
  EXPECT_EQ(jfa_attention_flops(offsets, offsets, 2, kHeads, kDim, 0, &flops), JFA_SUCCESS);
  expect_misaligned(jfa_attention_flops(odd_offsets, offsets, 2, kHeads, kDim, 0, &flops),
                    "cu_seqlens_q", 4);
}

}  // namespace
