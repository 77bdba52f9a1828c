// A value head size of its own (head_dim_v): the CPU forward and backward against the float64
// references, the references against naive loops written out here, the validation of head_dim_v
// and of the tensors it shapes, and callers built against the 0.1.0 layouts of the structs.
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

struct Dims {
  int32_t d, dv;
};
const Dims kDims[] = {{192, 128}, {32, 64}, {8, 3}, {1, 5}, {24, 24}};

jfa::JaggedTensor view(HostBuffer& buffer, const JaggedBatch& b, bool keys, int32_t d) {
  return {buffer.data(),
          b.dtype,
          keys ? b.total_k() : b.total_q(),
          keys ? b.heads_kv : b.heads_q,
          d,
          0,
          0};
}

std::string name(const Dims& dims, DType dtype, bool causal) {
  return std::to_string(dims.d) + "/" + std::to_string(dims.dv) + " " +
         jfa::tools::dtype_name(dtype) + (causal ? " causal" : "");
}

TEST(HeadDimV, CpuForwardMatchesReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  // Lengths 0 and 1, a partial tile and more than one tile; cross lengths, GQA.
  const std::vector<int32_t> lq = {0, 1, 70, 5, 130}, lk = {3, 1, 70, 0, 100};
  for (const Dims& dims : kDims)
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(name(dims, dtype, causal));
        JaggedBatch b = jfa::tools::make_batch(lq, lk, 4, 2, dims.d, dtype, rng(), dims.dv);
        HostBuffer out = b.make_output();
        jfa::tools::poison(out);
        std::vector<float> lse(static_cast<size_t>(b.total_q()) * b.heads_q, std::nanf(""));
        jfa::AttentionOptions options{.causal = causal, .backend = jfa::Backend::kCpu};
        options.lse = lse.data();
        jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, dims.dv),
                       b.cu_q.data(), b.cu_k.data(), b.batch(), options);
        std::vector<double> ref_lse;
        const std::vector<double> ref =
            jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(),
                                     b.cu_k.data(), b.batch(), options, {}, &ref_lse);
        ASSERT_EQ(ref.size(), static_cast<size_t>(b.total_q() * b.heads_q * dims.dv));
        const double err = jfa::tools::relative_error(out, ref, {}, int64_t{b.heads_q} * dims.dv);
        EXPECT_LE(err, jfa::tools::tolerance(dtype)) << "relative error " << err;
        for (size_t i = 0; i < ref_lse.size(); ++i) {
          if (std::isinf(ref_lse[i]))
            ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "lse[" << i << "] = " << lse[i];
          else
            ASSERT_NEAR(lse[i], ref_lse[i], 1e-4 * (1 + std::abs(ref_lse[i])))
                << "lse[" << i << "]";
        }
      }
}

TEST(HeadDimV, CpuBackwardMatchesReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  const std::vector<int32_t> lq = {0, 1, 70, 5, 130}, lk = {3, 1, 70, 0, 100};
  for (const Dims& dims : kDims)
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(name(dims, dtype, causal));
        JaggedBatch b = jfa::tools::make_batch(lq, lk, 4, 2, dims.d, dtype, rng(), dims.dv);
        HostBuffer out = b.make_output(), dout = b.make_output();
        std::mt19937_64 fill(rng());
        jfa::tools::fill_normal(dout, fill);
        std::vector<float> lse(static_cast<size_t>(b.total_q()) * b.heads_q);
        jfa::AttentionOptions options{.causal = causal, .backend = jfa::Backend::kCpu};
        options.lse = lse.data();
        jfa::attention(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, dims.dv),
                       b.cu_q.data(), b.cu_k.data(), b.batch(), options);
        HostBuffer dq(dtype, b.total_q() * b.heads_q * dims.d);
        HostBuffer dk(dtype, b.total_k() * b.heads_kv * dims.d);
        HostBuffer dv(dtype, b.total_k() * b.heads_kv * dims.dv);
        for (HostBuffer* g : {&dq, &dk, &dv}) jfa::tools::poison(*g);
        jfa::attention_backward(b.q_view(), b.k_view(), b.v_view(), view(out, b, false, dims.dv),
                                {view(dout, b, false, dims.dv), view(dq, b, false, dims.d),
                                 view(dk, b, true, dims.d), view(dv, b, true, dims.dv)},
                                b.cu_q.data(), b.cu_k.data(), b.batch(), options);
        const jfa::ReferenceGradients ref = jfa::attention_backward_reference(
            b.q_view(), b.k_view(), b.v_view(), view(dout, b, false, dims.dv), b.cu_q.data(),
            b.cu_k.data(), b.batch(), {.causal = causal});
        ASSERT_EQ(ref.dv.size(), static_cast<size_t>(b.total_k() * b.heads_kv * dims.dv));
        const double tol = jfa::tools::tolerance(dtype);
        // +inf when an element is NaN: the poison of an unwritten element included.
        EXPECT_LE(jfa::tools::relative_error(dq, ref.dq, {}, int64_t{b.heads_q} * dims.d), tol);
        EXPECT_LE(jfa::tools::relative_error(dk, ref.dk, {}, int64_t{b.heads_kv} * dims.d), tol);
        EXPECT_LE(jfa::tools::relative_error(dv, ref.dv, {}, int64_t{b.heads_kv} * dims.dv), tol);
      }
}

// The references against the definition written out naively for one sequence, float32 inputs:
// out = softmax(scale q k^T) v, and the gradients dV = P^T dO, dP = dO V^T,
// dS = P (dP - rowsum(dO o out)), dQ = scale dS K, dK = scale dS^T Q.
TEST(HeadDimV, ReferencesMatchNaiveLoops) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (const Dims& dims : {Dims{8, 3}, Dims{1, 5}, Dims{6, 6}}) {
    SCOPED_TRACE(std::to_string(dims.d) + "/" + std::to_string(dims.dv));
    const int lq = 4, lk = 6, d = dims.d, dv = dims.dv;
    JaggedBatch b = jfa::tools::make_batch({lq}, {lk}, 1, 1, d, DType::kFloat32, rng(), dv);
    HostBuffer dout_buffer = b.make_output();
    std::mt19937_64 fill(rng());
    jfa::tools::fill_normal(dout_buffer, fill);
    const float* q = static_cast<const float*>(b.q.data());
    const float* k = static_cast<const float*>(b.k.data());
    const float* v = static_cast<const float*>(b.v.data());
    const float* dout = static_cast<const float*>(dout_buffer.data());
    const double scale = 1.0f / std::sqrt(static_cast<float>(d));  // the default, in float32
    std::vector<double> out(lq * dv, 0.0), p(lq * lk);
    std::vector<double> dq(lq * d, 0.0), dk(lk * d, 0.0), dvv(lk * dv, 0.0);
    for (int i = 0; i < lq; ++i) {
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < lk; ++j) {
        double s = 0;
        for (int c = 0; c < d; ++c) s += double{q[i * d + c]} * k[j * d + c];
        p[i * lk + j] = s * scale;
        m = std::max(m, p[i * lk + j]);
      }
      for (int j = 0; j < lk; ++j) sum += p[i * lk + j] = std::exp(p[i * lk + j] - m);
      for (int j = 0; j < lk; ++j) {
        p[i * lk + j] /= sum;
        for (int c = 0; c < dv; ++c) out[i * dv + c] += p[i * lk + j] * v[j * dv + c];
      }
      double delta = 0;
      for (int c = 0; c < dv; ++c) delta += dout[i * dv + c] * out[i * dv + c];
      for (int j = 0; j < lk; ++j) {
        double dp = 0;
        for (int c = 0; c < dv; ++c) dp += double{dout[i * dv + c]} * v[j * dv + c];
        const double ds = p[i * lk + j] * (dp - delta) * scale;
        for (int c = 0; c < d; ++c) {
          dq[i * d + c] += ds * k[j * d + c];
          dk[j * d + c] += ds * q[i * d + c];
        }
        for (int c = 0; c < dv; ++c) dvv[j * dv + c] += p[i * lk + j] * dout[i * dv + c];
      }
    }
    const std::vector<double> ref = jfa::attention_reference(
        b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(), b.batch());
    const jfa::ReferenceGradients g = jfa::attention_backward_reference(
        b.q_view(), b.k_view(), b.v_view(), view(dout_buffer, b, false, dv), b.cu_q.data(),
        b.cu_k.data(), b.batch());
    auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want,
                          const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << what << "[" << i << "]";
    };
    expect_near(ref, out, "out");
    expect_near(g.dq, dq, "dq");
    expect_near(g.dk, dk, "dk");
    expect_near(g.dv, dvv, "dv");
  }
}

// A call of 2 sequences, 4/2 heads, head_dim 16, head_dim_v 8, float32, packed.
struct Call {
  std::vector<int32_t> cu = {0, 3, 5};
  std::vector<float> q = std::vector<float>(5 * 4 * 16, 0.25f);
  std::vector<float> k = std::vector<float>(5 * 2 * 16, 0.5f);
  std::vector<float> v = std::vector<float>(5 * 2 * 8, 1.0f);
  std::vector<float> out = std::vector<float>(5 * 4 * 8);
  jfa_attention_params p;

  Call() {
    jfa_attention_params_init(&p);
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.out = out.data();
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.batch = 2;
    p.total_q = p.total_k = 5;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim = 16;
    p.head_dim_v = 8;
    p.dtype = JFA_DTYPE_FLOAT32;
    p.backend = JFA_BACKEND_CPU;
  }
};

void expect_failure(const jfa_attention_params& p, jfa_status status, const std::string& text) {
  EXPECT_EQ(jfa_attention_forward(&p), status) << jfa_last_error_message();
  EXPECT_NE(std::string(jfa_last_error_message()).find(text), std::string::npos)
      << "message: " << jfa_last_error_message();
}

TEST(HeadDimV, Validation) {
  {
    Call c;
    ASSERT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS) << jfa_last_error_message();
    EXPECT_FLOAT_EQ(c.out[0], 1.0f);  // softmax weights sum to 1 over values of 1
  }
  {
    Call c;
    c.p.head_dim_v = -1;
    expect_failure(c.p, JFA_ERROR_INVALID_ARGUMENT, "head_dim_v must be > 0");
  }
  {
    Call c;
    c.p.head_dim_v = JFA_MAX_HEAD_DIM + 1;
    expect_failure(c.p, JFA_ERROR_UNSUPPORTED, "head_dim_v 513 is not supported");
  }
  {
    Call c;  // v rows of head_dim_v: a head stride of 8 is packed, one of 7 overlaps
    c.p.v_layout = {16, 8};
    EXPECT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS) << jfa_last_error_message();
    c.p.v_layout = {14, 7};
    expect_failure(c.p, JFA_ERROR_INVALID_ARGUMENT, "v strides make rows overlap");
    c.p.v_layout = {0, 0};
    c.p.out_layout = {28, 7};
    expect_failure(c.p, JFA_ERROR_INVALID_ARGUMENT, "out strides make rows overlap");
  }
  {
    // out reaches head_dim_v columns only: an lse right after it does not overlap, one that starts
    // a column early does.
    Call c;
    std::vector<float> both(5 * 4 * 8 + 5 * 4);
    c.p.out = both.data();
    c.p.lse = both.data() + 5 * 4 * 8;
    EXPECT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS) << jfa_last_error_message();
    c.p.lse = both.data() + 5 * 4 * 8 - 1;
    expect_failure(c.p, JFA_ERROR_INVALID_ARGUMENT, "out");
  }
  {
    Call c;  // the default scale stays 1/sqrt(head_dim), not 1/sqrt(head_dim_v)
    std::vector<float> lse_default(5 * 4), lse_scaled(5 * 4);
    c.p.lse = lse_default.data();
    ASSERT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS);
    c.p.lse = lse_scaled.data();
    c.p.softmax_scale = 0.25f;  // 1/sqrt(16)
    ASSERT_EQ(jfa_attention_forward(&c.p), JFA_SUCCESS);
    EXPECT_EQ(lse_default, lse_scaled);
  }
  {
    // The C++ API: k takes q's head_dim, out v's.
    Call c;
    jfa::JaggedTensor q{c.q.data(), DType::kFloat32, 5, 4, 16};
    jfa::JaggedTensor k{c.k.data(), DType::kFloat32, 5, 2, 16};
    jfa::JaggedTensor v{c.v.data(), DType::kFloat32, 5, 2, 8};
    jfa::JaggedTensor out{c.out.data(), DType::kFloat32, 5, 4, 8};
    EXPECT_NO_THROW(
        jfa::attention(q, k, v, out, c.cu.data(), c.cu.data(), 2, {.backend = jfa::Backend::kCpu}));
    jfa::JaggedTensor wrong = out;
    wrong.head_dim = 16;
    EXPECT_THROW(jfa::attention(q, k, v, wrong, c.cu.data(), c.cu.data(), 2), jfa::Error);
  }
}

TEST(HeadDimV, FlopsCountBothProducts) {
  const std::vector<int32_t> cu = {0, 3, 10}, cu_k = {0, 5, 6};
  for (bool causal : {false, true}) {
    double old_count = 0, same = 0, zero = 0, split = 0;
    ASSERT_EQ(jfa_attention_flops(cu.data(), cu_k.data(), 2, 3, 64, causal, &old_count),
              JFA_SUCCESS);
    ASSERT_EQ(jfa_attention_flops_v(cu.data(), cu_k.data(), 2, 3, 64, 64, causal, &same),
              JFA_SUCCESS);
    ASSERT_EQ(jfa_attention_flops_v(cu.data(), cu_k.data(), 2, 3, 64, 0, causal, &zero),
              JFA_SUCCESS);
    ASSERT_EQ(jfa_attention_flops_v(cu.data(), cu_k.data(), 2, 3, 192, 128, causal, &split),
              JFA_SUCCESS);
    EXPECT_EQ(same, old_count);
    EXPECT_EQ(zero, old_count);
    EXPECT_EQ(split, old_count / (4 * 64) * 2 * (192 + 128));
    EXPECT_EQ(jfa::attention_flops(cu, cu_k, 3, 192, causal, 128), split);
  }
  double f = 0;
  EXPECT_EQ(jfa_attention_flops_v(cu.data(), cu_k.data(), 2, 3, 64, -1, 0, &f),
            JFA_ERROR_INVALID_ARGUMENT);
}

}  // namespace

// The initialisers such a caller links to (jfa.h now maps these names to the sized ones).
extern "C" jfa_status(jfa_attention_params_init)(void* params);
extern "C" jfa_status(jfa_attention_backward_params_init)(void* params);

namespace {

// ---- Callers built against jfa.h 0.1.0 -------------------------------------------------------

using jfa::testing::BackwardParamsV1;
using jfa::testing::copy_v1_fields;
using jfa::testing::GuardedPage;
using jfa::testing::ParamsV1;

TEST(StructSize, TheSizesOfEachRelease) {
  EXPECT_EQ(sizeof(ParamsV1), 224u);
  EXPECT_EQ(sizeof(BackwardParamsV1), 344u);
  EXPECT_EQ(sizeof(jfa_attention_params), 248u);  // head_dim_v, then window, softcap, sinks
  EXPECT_EQ(sizeof(jfa_attention_backward_params), 376u);
}

TEST(StructSize, InitialisersWriteTheirLayoutOnly) {
  GuardedPage page;
  ParamsV1* old = page.place<ParamsV1>();
  ASSERT_EQ((jfa_attention_params_init)(old), JFA_SUCCESS);  // the 0.1.0 symbol
  EXPECT_EQ(old->struct_size, sizeof(ParamsV1));
  EXPECT_TRUE(std::isnan(old->softmax_scale));
  BackwardParamsV1* old_b = page.place<BackwardParamsV1>();
  ASSERT_EQ((jfa_attention_backward_params_init)(old_b), JFA_SUCCESS);
  EXPECT_EQ(old_b->struct_size, sizeof(BackwardParamsV1));
  EXPECT_EQ(old_b->forward.struct_size, sizeof(ParamsV1));
  EXPECT_TRUE(std::isnan(old_b->forward.softmax_scale));
  jfa_attention_params p;
  EXPECT_EQ(jfa_attention_params_init_sized(&p, sizeof(ParamsV1) + 4), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(
      std::string(jfa_last_error_message()).find("232 with head_dim_v as its last field; or 224"),
      std::string::npos)
      << jfa_last_error_message();
  ASSERT_EQ(jfa_attention_params_init(&p), JFA_SUCCESS);  // the macro: this header's layout
  EXPECT_EQ(p.struct_size, sizeof(jfa_attention_params));
  EXPECT_EQ(p.head_dim_v, 0);
}

// A 0.1.0 struct, ending where memory ends, gives the bytes the current struct gives (head_dim_v
// at its default) in the forward, the reference, the workspace calls and the backward.
TEST(StructSize, EarlierLayoutsGiveTheSameResults) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  JaggedBatch b =
      jfa::tools::make_batch({3, 70, 0, 9}, {5, 64, 2, 9}, 4, 2, 24, DType::kFloat16, rng());
  HostBuffer out_new = b.make_output(), out_old = b.make_output();
  std::vector<float> lse_new(b.total_q() * b.heads_q), lse_old(lse_new.size());
  jfa_attention_params p =
      jfa::make_params(b.q_view(), b.k_view(), b.v_view(), view(out_new, b, false, b.head_dim),
                       b.cu_q.data(), b.cu_k.data(), b.batch(),
                       {.causal = true, .lse = lse_new.data(), .backend = jfa::Backend::kCpu});
  ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();

  GuardedPage page;
  ParamsV1* old = page.place<ParamsV1>();
  ASSERT_EQ((jfa_attention_params_init)(old), JFA_SUCCESS);
  copy_v1_fields(p, *old);
  old->out = out_old.data();
  old->lse = lse_old.data();
  ASSERT_EQ(jfa_attention_forward(reinterpret_cast<jfa_attention_params*>(old)), JFA_SUCCESS)
      << jfa_last_error_message();
  EXPECT_EQ(out_old.bytes, out_new.bytes);
  EXPECT_EQ(lse_old, lse_new);

  std::vector<double> ref_new(b.total_q() * b.heads_q * b.head_dim), ref_old(ref_new.size());
  ASSERT_EQ(jfa_attention_reference(&p, nullptr, b.total_q(), ref_new.data(), nullptr),
            JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_reference(reinterpret_cast<jfa_attention_params*>(old), nullptr,
                                    b.total_q(), ref_old.data(), nullptr),
            JFA_SUCCESS);
  EXPECT_EQ(ref_old, ref_new);

  size_t bytes_new = 1, bytes_old = 2;
  ASSERT_EQ(jfa_attention_workspace_size(&p, &bytes_new), JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_workspace_size(reinterpret_cast<jfa_attention_params*>(old), &bytes_old),
            JFA_SUCCESS);
  EXPECT_EQ(bytes_old, bytes_new);
  jfa_workspace* workspace = nullptr;
  ASSERT_EQ(jfa_workspace_create(&workspace), JFA_SUCCESS);
  old->workspace_bytes = 99;
  EXPECT_EQ(jfa_workspace_prepare(workspace, reinterpret_cast<jfa_attention_params*>(old)),
            JFA_SUCCESS);
  EXPECT_EQ(old->workspace_bytes, 0u);  // host memory: no workspace

  // The backward, through both layouts.
  HostBuffer dout = b.make_output();
  std::mt19937_64 fill(rng());
  jfa::tools::fill_normal(dout, fill);
  struct Grads {
    HostBuffer dq, dk, dv;
  };
  auto grads = [&] {
    return Grads{HostBuffer(b.dtype, b.total_q() * b.heads_q * b.head_dim),
                 HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim),
                 HostBuffer(b.dtype, b.total_k() * b.heads_kv * b.head_dim)};
  };
  Grads g_new = grads(), g_old = grads();
  jfa_attention_backward_params bp = jfa::make_backward_params(
      b.q_view(), b.k_view(), b.v_view(), view(out_new, b, false, b.head_dim),
      {view(dout, b, false, b.head_dim), view(g_new.dq, b, false, b.head_dim),
       view(g_new.dk, b, true, b.head_dim), view(g_new.dv, b, true, b.head_dim)},
      b.cu_q.data(), b.cu_k.data(), b.batch(),
      {.causal = true, .lse = lse_new.data(), .backend = jfa::Backend::kCpu}, true);
  ASSERT_EQ(jfa_attention_backward(&bp), JFA_SUCCESS) << jfa_last_error_message();

  BackwardParamsV1* old_b = page.place<BackwardParamsV1>();
  ASSERT_EQ((jfa_attention_backward_params_init)(old_b), JFA_SUCCESS);
  copy_v1_fields(bp.forward, old_b->forward);
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

  std::vector<double> rq_new(g_new.dq.count()), rk_new(g_new.dk.count()), rv_new(rk_new.size());
  std::vector<double> rq_old(rq_new.size()), rk_old(rk_new.size()), rv_old(rk_new.size());
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
  old_b->forward.workspace_bytes = 99;
  EXPECT_EQ(jfa_workspace_prepare_backward(workspace, as_current), JFA_SUCCESS);
  EXPECT_EQ(old_b->forward.workspace_bytes, 0u);
  jfa_workspace_destroy(workspace);

  // A 0.1.0 backward must embed a 0.1.0 forward.
  old_b->forward.struct_size = sizeof(jfa_attention_params);
  EXPECT_EQ(jfa_attention_backward(as_current), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("forward.struct_size"), std::string::npos)
      << jfa_last_error_message();
}

TEST(StructSize, OtherSizesAreRejectedNamingTheAcceptedOnes) {
  Call c;
  for (uint32_t size : {0u, 1u, 228u, 240u}) {
    c.p.struct_size = size;
    expect_failure(c.p, JFA_ERROR_INVALID_ARGUMENT,
                   "(248; 232 with head_dim_v as its last field; or 224 as in jfa.h 0.1.0)");
    size_t bytes = 0;
    EXPECT_EQ(jfa_attention_workspace_size(&c.p, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  }
  jfa_attention_backward_params b;
  ASSERT_EQ(jfa_attention_backward_params_init(&b), JFA_SUCCESS);
  for (uint32_t size : {0u, 232u, 348u, 400u}) {
    b.struct_size = size;
    EXPECT_EQ(jfa_attention_backward(&b), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message())
                  .find("(376; 352 with a forward whose last field is head_dim_v; or 344 as in "
                        "jfa.h 0.1.0)"),
              std::string::npos)
        << jfa_last_error_message();
    size_t bytes = 0;
    EXPECT_EQ(jfa_attention_backward_workspace_size(&b, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  }
  b.struct_size = sizeof b;
  b.forward.struct_size = sizeof(ParamsV1);  // the current backward embeds the current forward
  EXPECT_EQ(jfa_attention_backward(&b), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(jfa_attention_backward_params_init_sized(&b, 300), JFA_ERROR_INVALID_ARGUMENT);
}

}  // namespace
