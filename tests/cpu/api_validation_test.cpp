// Every validation rule of jfa_attention_forward: the right status and a message that names the
// argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "jfa/jfa.h"

namespace {

struct Fixture {
  std::vector<int32_t> cu = {0, 3, 5};
  std::vector<uint16_t> q = std::vector<uint16_t>(5 * 4 * 16, 0x3C00);
  std::vector<uint16_t> kv = std::vector<uint16_t>(5 * 2 * 16, 0x3C00);
  std::vector<uint16_t> out = std::vector<uint16_t>(5 * 4 * 16);
  jfa_attention_params p;

  Fixture() {
    jfa_attention_params_init(&p);
    p.q = q.data();
    p.k = kv.data();
    p.v = kv.data();
    p.out = out.data();
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.batch = 2;
    p.total_q = 5;
    p.total_k = 5;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim = 16;
    p.backend = JFA_BACKEND_CPU;
  }
};

struct Rule {
  const char* name;
  std::function<void(Fixture&)> breaks;
  jfa_status status;
  const char* message;
};

class ValidationTest : public ::testing::TestWithParam<Rule> {};

TEST_P(ValidationTest, ReportsStatusAndMessage) {
  Fixture f;
  ASSERT_EQ(jfa_attention_forward(&f.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_STREQ(jfa_last_error_message(), "");
  GetParam().breaks(f);
  EXPECT_EQ(jfa_attention_forward(&f.p), GetParam().status) << jfa_last_error_message();
  EXPECT_NE(std::string(jfa_last_error_message()).find(GetParam().message), std::string::npos)
      << "message: " << jfa_last_error_message();
}

const jfa_status kInvalid = JFA_ERROR_INVALID_ARGUMENT;

INSTANTIATE_TEST_SUITE_P(
    Rules, ValidationTest,
    ::testing::Values(
        Rule{"non_monotone",
             [](Fixture& f) {
               f.cu = {0, 4, 3};
               f.p.cu_seqlens_q = f.cu.data();
               f.p.total_q = 3;
             },
             kInvalid,
             "cu_seqlens_q must be non-decreasing; cu_seqlens_q[2]=3 < cu_seqlens_q[1]=4"},
        Rule{"first_offset",
             [](Fixture& f) {
               f.cu = {1, 3, 5};
             },
             kInvalid, "cu_seqlens_q[0] must be 0, got 1"},
        Rule{"last_offset", [](Fixture& f) { f.p.total_k = 4; }, kInvalid,
             "cu_seqlens_k[batch]=cu_seqlens_k[2]=5 must equal the total 4"},
        Rule{"negative_batch", [](Fixture& f) { f.p.batch = -1; }, kInvalid, "batch must be in"},
        Rule{"no_sequence_but_tokens", [](Fixture& f) { f.p.batch = 0; }, kInvalid,
             "batch is 0, so total_q and total_k must be 0"},
        Rule{"negative_total", [](Fixture& f) { f.p.total_q = -5; }, kInvalid,
             "total_q must be in"},
        Rule{"overflowing_total", [](Fixture& f) { f.p.total_k = int64_t{1} << 32; }, kInvalid,
             "total_k must be in"},
        Rule{"zero_heads", [](Fixture& f) { f.p.heads_q = 0; }, kInvalid, "heads_q must be > 0"},
        Rule{"heads_not_multiple", [](Fixture& f) { f.p.heads_kv = 3; }, kInvalid,
             "heads_q must be a multiple of heads_kv"},
        Rule{"zero_head_dim", [](Fixture& f) { f.p.head_dim = 0; }, kInvalid,
             "head_dim must be > 0"},
        Rule{"huge_head_dim", [](Fixture& f) { f.p.head_dim = 1024; }, JFA_ERROR_UNSUPPORTED,
             "head_dim 1024 is not supported"},
        Rule{"bad_dtype", [](Fixture& f) { f.p.dtype = static_cast<jfa_dtype>(7); }, kInvalid,
             "dtype 7 is not a jfa_dtype"},
        Rule{"bad_backend", [](Fixture& f) { f.p.backend = static_cast<jfa_backend>(9); }, kInvalid,
             "backend 9 is not a jfa_backend"},
        Rule{"null_q", [](Fixture& f) { f.p.q = nullptr; }, kInvalid, "q must not be NULL"},
        Rule{"null_out", [](Fixture& f) { f.p.out = nullptr; }, kInvalid, "out must not be NULL"},
        Rule{"null_offsets", [](Fixture& f) { f.p.cu_seqlens_k = nullptr; }, kInvalid,
             "cu_seqlens_k must not be NULL"},
        Rule{"negative_stride",
             [](Fixture& f) {
               f.p.k_layout = {-32, 16};
             },
             kInvalid, "k strides must both be > 0"},
        Rule{"overlapping_rows",
             [](Fixture& f) {
               f.p.q_layout = {16, 8};
             },
             kInvalid, "q strides make rows overlap"},
        Rule{"overflowing_stride",
             [](Fixture& f) {
               f.p.v_layout = {int64_t{1} << 62, 16};
             },
             kInvalid, "v: strides times sizes overflow int64"},
        Rule{"infinite_scale", [](Fixture& f) { f.p.softmax_scale = INFINITY; }, kInvalid,
             "softmax_scale must be finite"},
        Rule{"short_hint", [](Fixture& f) { f.p.max_seqlen_q = 2; }, kInvalid,
             "max_seqlen_q=2 is smaller than the length 3 of sequence 0"},
        Rule{"negative_hint", [](Fixture& f) { f.p.max_seqlen_k = -1; }, kInvalid,
             "max_seqlen_k must be >= 0"}),
    [](const ::testing::TestParamInfo<Rule>& info) { return std::string(info.param.name); });

// Packed strides (0, 0) follow from the sizes, and sizes alone can put the last element beyond
// int64: rejected like explicit strides, before any buffer is read (the pointers here point
// nowhere) or anything is allocated.
TEST(Validation, PackedSizesOverflowingInt64) {
  // Distinct addresses that point nowhere, and offsets that agree with the totals: only the sizes
  // are wrong.
  auto nowhere = [](int i) { return reinterpret_cast<void*>(uintptr_t{1} << (20 + i)); };
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const int32_t all[2] = {0, kMax}, one[2] = {0, 1};
  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.q = nowhere(0);
  p.k = nowhere(1);
  p.v = nowhere(2);
  p.out = nowhere(3);
  p.cu_seqlens_q = all;
  p.cu_seqlens_k = one;
  p.batch = 1;
  p.total_q = kMax;
  p.total_k = 1;
  p.heads_q = p.heads_kv = 1 << 24;
  p.head_dim = 512;
  p.backend = JFA_BACKEND_CPU;
  auto expect_overflow = [](jfa_status s, const char* name) {
    EXPECT_EQ(s, JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message())
                  .find(std::string(name) + ": strides times sizes overflow int64"),
              std::string::npos)
        << jfa_last_error_message();
  };
  expect_overflow(jfa_attention_forward(&p), "q");
  std::vector<double> rows(4);
  expect_overflow(jfa_attention_reference(&p, nullptr, p.total_q, rows.data(), nullptr), "q");
  jfa_attention_backward_params b;
  jfa_attention_backward_params_init(&b);
  b.forward = p;
  b.forward.lse = static_cast<float*>(nowhere(4));
  b.dout = nowhere(5);
  b.dq = nowhere(6);
  b.dk = nowhere(7);
  b.dv = nowhere(8);
  expect_overflow(jfa_attention_backward(&b), "q");
  // The keys' tensors alone (q fits).
  p.cu_seqlens_q = one;
  p.cu_seqlens_k = all;
  p.total_q = 1;
  p.total_k = kMax;
  expect_overflow(jfa_attention_forward(&p), "k");
}

TEST(Validation, NullParams) {
  EXPECT_EQ(jfa_attention_forward(nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("params must not be NULL"),
            std::string::npos);
}

TEST(Validation, CudaBackendOnHostBuffersIsAClearError) {
  Fixture f;
  f.p.backend = JFA_BACKEND_CUDA;
  const jfa_status s = jfa_attention_forward(&f.p);
  EXPECT_TRUE(s == JFA_ERROR_BACKEND_UNAVAILABLE || s == JFA_ERROR_INVALID_ARGUMENT) << s;
  EXPECT_NE(std::string(jfa_last_error_message()).find("backend=cuda"), std::string::npos)
      << jfa_last_error_message();
}

TEST(Validation, StatusStringsAndVersion) {
  EXPECT_STREQ(jfa_status_string(JFA_SUCCESS), "success");
  EXPECT_STREQ(jfa_status_string(JFA_ERROR_UNSUPPORTED), "unsupported");
  EXPECT_STREQ(jfa_version(), JFA_VERSION_STRING);
  EXPECT_EQ(jfa_dtype_size(JFA_DTYPE_BFLOAT16), 2u);
}

TEST(Validation, FlopsCountVisiblePairs) {
  const int32_t cu[] = {0, 4, 4};
  const int32_t cu_k[] = {0, 6, 9};
  double flops = 0;
  ASSERT_EQ(jfa_attention_flops(cu, cu, 2, 2, 8, 0, &flops), JFA_SUCCESS);
  EXPECT_EQ(flops, 4.0 * 16 * 2 * 8);
  ASSERT_EQ(jfa_attention_flops(cu, cu, 2, 2, 8, 1, &flops), JFA_SUCCESS);
  EXPECT_EQ(flops, 4.0 * 8 * 2 * 8);  // equal lengths: half
  // lq = 4, lk = 6, causal: rows see 3, 4, 5, 6 keys.
  ASSERT_EQ(jfa_attention_flops(cu, cu_k, 2, 1, 1, 1, &flops), JFA_SUCCESS);
  EXPECT_EQ(flops, 4.0 * 18);
}

}  // namespace

// The workspace size depends on batch and total_q alone, grows with both, and is 0 without the
// CUDA backend; its arguments are checked like the forward's.
TEST(Workspace, SizeQuery) {
  Fixture f;
  size_t small = 1, large = 1;
  ASSERT_EQ(jfa_attention_workspace_size(&f.p, &small), JFA_SUCCESS) << jfa_last_error_message();
  f.p.total_q = 100000;
  f.p.batch = 4096;
  f.p.q = nullptr;  // no pointer is read
  ASSERT_EQ(jfa_attention_workspace_size(&f.p, &large), JFA_SUCCESS) << jfa_last_error_message();
  if (jfa_cuda_available() || small > 0) {
    EXPECT_GT(small, 16u);
    EXPECT_GT(large, small);
  } else {
    EXPECT_EQ(large, 0u);
  }
  EXPECT_EQ(jfa_attention_workspace_size(nullptr, &small), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_attention_workspace_size(&f.p, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  f.p.batch = -1;
  EXPECT_EQ(jfa_attention_workspace_size(&f.p, &small), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("batch"), std::string::npos);
  f.p.batch = 2;
  f.p.total_q = -5;
  EXPECT_EQ(jfa_attention_workspace_size(&f.p, &small), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("total_q"), std::string::npos);
}

// A kept workspace gives host-memory calls no memory and leaves them unchanged.
TEST(Workspace, HostCallsGetNone) {
  Fixture f;
  jfa_workspace* ws = nullptr;
  ASSERT_EQ(jfa_workspace_create(&ws), JFA_SUCCESS);
  f.p.workspace = &f;  // stale values are overwritten
  f.p.workspace_bytes = 7;
  ASSERT_EQ(jfa_workspace_prepare(ws, &f.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(f.p.workspace, nullptr);
  EXPECT_EQ(f.p.workspace_bytes, 0u);
  EXPECT_EQ(jfa_attention_forward(&f.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(jfa_workspace_prepare(nullptr, &f.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_workspace_prepare(ws, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_workspace_create(nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_workspace_destroy(ws), JFA_SUCCESS);
  EXPECT_EQ(jfa_workspace_destroy(nullptr), JFA_SUCCESS);
}

// The checked mode on the CPU backend: the host validates the offsets, and a call that runs stores
// 0 in the word; a misaligned word, or one inside an output, is rejected; the message of each bit.
TEST(Validation, DeviceCheckWordOnTheCpu) {
  Fixture f;
  int32_t words[2] = {0x7F7F7F7F, 0x7F7F7F7F};
  f.p.device_check = &words[0];
  ASSERT_EQ(jfa_attention_forward(&f.p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(words[0], 0);
  f.p.device_check = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(&words[0]) + 2);
  EXPECT_EQ(jfa_attention_forward(&f.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("device_check"), std::string::npos)
      << jfa_last_error_message();
  f.p.device_check = static_cast<int32_t*>(f.p.out);
  EXPECT_EQ(jfa_attention_forward(&f.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("device_check"), std::string::npos)
      << jfa_last_error_message();

  EXPECT_STREQ(jfa_device_check_message(0), "valid");
  EXPECT_STREQ(jfa_device_check_message(JFA_OFFSETS_Q_DECREASING), "cu_seqlens_q decreases");
  const std::string both =
      jfa_device_check_message(JFA_OFFSETS_Q_FIRST_NOT_ZERO | JFA_OFFSETS_K_ABOVE_MAX | 1024);
  EXPECT_NE(both.find("cu_seqlens_q[0] is not 0"), std::string::npos) << both;
  EXPECT_NE(both.find("a k length is above max_seqlen_k"), std::string::npos) << both;
  EXPECT_NE(both.find("unknown bits 1024"), std::string::npos) << both;
  const std::string results = jfa_device_check_message(JFA_CHECK_RESULT_NOT_FINITE);
  EXPECT_NE(results.find("NaN or infinite"), std::string::npos) << results;
  EXPECT_EQ(results.find("unknown"), std::string::npos) << results;
}

// Enum fields and arguments holding ints outside their enumerators (as C callers and memset can
// make them) are rejected by value; the sanitizer build checks that nothing loads them as enums.
TEST(Validation, EnumsOutsideTheirValues) {
  const int32_t bad = -1;
  Fixture f;
  std::memcpy(&f.p.dtype, &bad, sizeof bad);
  EXPECT_EQ(jfa_attention_forward(&f.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("dtype -1 is not a jfa_dtype"),
            std::string::npos)
      << jfa_last_error_message();
  Fixture g;
  std::memcpy(&g.p.backend, &bad, sizeof bad);
  EXPECT_EQ(jfa_attention_forward(&g.p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("backend -1 is not a jfa_backend"),
            std::string::npos);
  jfa_workspace* ws = nullptr;
  ASSERT_EQ(jfa_workspace_create(&ws), JFA_SUCCESS);
  EXPECT_EQ(jfa_workspace_prepare(ws, &g.p), JFA_SUCCESS);  // host buffers: no workspace
  EXPECT_EQ(jfa_workspace_destroy(ws), JFA_SUCCESS);

  // A C caller passes any int where the prototype names an enum; C++ cannot, so these calls go
  // through the same functions typed with int32_t (the enums are 32-bit ints in the ABI).
  const auto dtype_size = reinterpret_cast<size_t (*)(int32_t)>(&jfa_dtype_size);
  EXPECT_EQ(dtype_size(bad), 0u);
  EXPECT_EQ(dtype_size(JFA_DTYPE_FLOAT32), 4u);
  const auto status_string = reinterpret_cast<const char* (*)(int32_t)>(&jfa_status_string);
  EXPECT_STREQ(status_string(bad), "unknown status");
  const auto to_padded =
      reinterpret_cast<jfa_status (*)(const void*, const int32_t*, int64_t, int64_t, int32_t,
                                      int32_t, double, void*)>(&jfa_jagged_to_padded);
  const int32_t offsets[] = {0, 1};
  float row[4] = {1, 2, 3, 4};
  float padded[4];
  EXPECT_EQ(to_padded(row, offsets, 1, 4, bad, 1, 0.0, padded), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("dtype -1"), std::string::npos);
}

// A struct not filled by jfa_attention_params_init (zero-filled, garbage, or laid out by another
// version of jfa.h) is told apart by struct_size and rejected before anything else is read.
TEST(Validation, StructNotFilledByInit) {
  for (const unsigned char fill : {0x00, 0xAB}) {
    Fixture f;
    jfa_attention_params raw;
    std::memset(&raw, fill, sizeof raw);
    EXPECT_EQ(jfa_attention_forward(&raw), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find("jfa_attention_params_init"),
              std::string::npos)
        << jfa_last_error_message();
    size_t bytes = 0;
    EXPECT_EQ(jfa_attention_workspace_size(&raw, &bytes), JFA_ERROR_INVALID_ARGUMENT);
    double out = 0;
    EXPECT_EQ(jfa_attention_reference(&raw, nullptr, 0, &out, nullptr), JFA_ERROR_INVALID_ARGUMENT);
    f.p.struct_size -= 4;  // neither the current size nor an earlier one
    EXPECT_EQ(jfa_attention_forward(&f.p), JFA_ERROR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(jfa_attention_params_init(nullptr), JFA_ERROR_INVALID_ARGUMENT);
  jfa_attention_params p;
  EXPECT_EQ(jfa_attention_params_init(&p), JFA_SUCCESS);
  EXPECT_EQ(p.struct_size, sizeof(jfa_attention_params));
}
