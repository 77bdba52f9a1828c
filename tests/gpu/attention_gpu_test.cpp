// The CUDA forward through the public API against the float64 CPU reference: jagged batches with
// fresh seeds, both dtypes, every built head_dim, causal or not, GQA/MQA, q/k lengths that differ,
// LSE, strided layouts, guard regions around the outputs, determinism, graph capture, and the error
// paths (unsupported combinations, host/device mix-ups).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/call_params.hpp"
#include "common/jagged_batch.hpp"
#include "gpu_test_util.hpp"
#include "jfa/jfa.h"
#include "jfa/jfa.hpp"
#include "kernel_variants.hpp"

using jfa::DType;
using jfa::gpu_test::default_pool_peak;
using jfa::gpu_test::DeviceBuffer;
using jfa::gpu_test::fresh_seed;
using jfa::gpu_test::KernelVariant;
using jfa::gpu_test::quick_mode;
using jfa::gpu_test::ScopedVariant;
using jfa::gpu_test::VariantLoop;
using jfa::tools::HostBuffer;
using jfa::tools::JaggedBatch;

namespace {

constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};
constexpr size_t kGuardBytes = 4096;  // poisoned bytes before and after every output buffer

struct Case {
  std::vector<int32_t> lq, lk;
  int32_t heads_q = 2, heads_kv = 2, head_dim = 64;
  int32_t head_dim_v = 0;  // columns of v and out; 0: head_dim
  DType dtype = DType::kFloat16;
  bool causal = false;
  bool with_lse = true;
  int64_t token_pad = 0;  // extra elements per token row in every tensor (strided layout)
  int64_t max_check = 0;  // > 0: compare only this many sampled query tokens
  bool hints = false;     // pass max_seqlen hints
  float scale = std::numeric_limits<float>::quiet_NaN();
  bool integer_qk = false;  // q and k rounded to integers in [-2, 2]: exact scores, exact ties
  float qk_gain = 1.f;      // q and k multiplied by it (bf16 scores beyond float32)
  // Local attention (jfa.h): window bounds (-1 unbounded), softcap (0 off), sinks (empty: none).
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<float> sinks;

  int32_t dv() const { return head_dim_v == 0 ? head_dim : head_dim_v; }
};

// q or k as the case asks: integers in [-2, 2] (so that huge scales pick the same keys as the
// float64 reference) and/or multiplied by a gain.
void shape_values(HostBuffer& x, const Case& c) {
  const auto dtype = static_cast<jfa_dtype>(x.dtype);
  for (int64_t i = 0; i < x.count(); ++i) {
    double value = jfa::tools::element_as_double(x, i);
    if (c.integer_qk) value = std::clamp(std::round(1.5 * value), -2.0, 2.0);
    jfa::detail::store_from_float(x.data(), i, dtype, static_cast<float>(value * c.qk_gain));
  }
}

std::string describe(const Case& c) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s d=%d dv=%d hq=%d hkv=%d causal=%d batch=%zu pad=%lld lse=%d window=(%d,%d) "
                "softcap=%g sinks=%d",
                jfa::tools::dtype_name(c.dtype), c.head_dim, c.dv(), c.heads_q, c.heads_kv,
                c.causal ? 1 : 0, c.lq.size(), static_cast<long long>(c.token_pad),
                c.with_lse ? 1 : 0, c.window_left, c.window_right, static_cast<double>(c.softcap),
                c.sinks.empty() ? 0 : 1);
  return buf;
}

// Host copy of a packed tensor laid out with `pad` extra elements per token, padding filled with
// NaN.
HostBuffer with_padding(const HostBuffer& packed, int64_t total, int32_t heads, int32_t d,
                        int64_t pad) {
  HostBuffer out(packed.dtype, total * (heads * d + pad));
  std::fill(out.bytes.begin(), out.bytes.end(), 0xFF);
  const size_t es = jfa::dtype_size(packed.dtype);
  for (int64_t t = 0; t < total; ++t)
    std::memcpy(out.bytes.data() + t * (heads * d + pad) * es,
                packed.bytes.data() + t * heads * d * es, heads * d * es);
  return out;
}

struct DeviceRun {
  std::vector<unsigned char> out_bytes;  // with guards
  std::vector<float> lse;                // with guards (as floats)
};

class AttentionRunner {
 public:
  explicit AttentionRunner(const Case& c, uint64_t seed) : c_(c) {
    b_ = jfa::tools::make_batch(c.lq, c.lk, c.heads_q, c.heads_kv, c.head_dim, c.dtype, seed,
                                c.head_dim_v);
    if (c.integer_qk || c.qk_gain != 1.f) {
      shape_values(b_.q, c);
      shape_values(b_.k, c);
    }
    es_ = jfa::dtype_size(c.dtype);
    q_host_ = with_padding(b_.q, b_.total_q(), c.heads_q, c.head_dim, c.token_pad);
    k_host_ = with_padding(b_.k, b_.total_k(), c.heads_kv, c.head_dim, c.token_pad);
    v_host_ = with_padding(b_.v, b_.total_k(), c.heads_kv, c.dv(), c.token_pad);
    out_elems_ = b_.total_q() * (c.heads_q * c.dv() + c.token_pad);
  }

  jfa_attention_params params(const void* q, const void* k, const void* v, void* out, float* lse,
                              const int32_t* cu_q, const int32_t* cu_k,
                              const float* sinks = nullptr) const {
    jfa_attention_params p =
        jfa::tools::call_params({q, k, v, out, lse, cu_q, cu_k},
                                {b_.batch(), b_.total_q(), b_.total_k(), c_.heads_q, c_.heads_kv,
                                 c_.head_dim, static_cast<jfa_dtype>(c_.dtype), c_.head_dim_v});
    const int64_t qts = c_.heads_q * c_.head_dim + c_.token_pad;
    const int64_t kts = c_.heads_kv * c_.head_dim + c_.token_pad;
    p.q_layout = {qts, c_.head_dim};
    p.k_layout = {kts, c_.head_dim};
    p.v_layout = {c_.heads_kv * c_.dv() + c_.token_pad, c_.dv()};
    p.out_layout = {c_.heads_q * c_.dv() + c_.token_pad, c_.dv()};
    p.softmax_scale = c_.scale;
    p.causal = c_.causal ? 1 : 0;
    p.device_check = device_check_;
    p.window_left = c_.window_left;
    p.window_right = c_.window_right;
    p.softcap = c_.softcap;
    p.sinks = c_.sinks.empty() ? nullptr : sinks;
    if (c_.hints) {
      p.max_seqlen_q = *std::max_element(c_.lq.begin(), c_.lq.end());
      p.max_seqlen_k = *std::max_element(c_.lk.begin(), c_.lk.end());
    }
    return p;
  }

  // Uploads inputs once.
  void upload() {
    dq_ = DeviceBuffer(std::max<size_t>(q_host_.bytes.size(), 16));
    dk_ = DeviceBuffer(std::max<size_t>(k_host_.bytes.size(), 16));
    dv_ = DeviceBuffer(std::max<size_t>(v_host_.bytes.size(), 16));
    dcq_ = DeviceBuffer(b_.cu_q.size() * 4);
    dck_ = DeviceBuffer(b_.cu_k.size() * 4);
    cudaMemcpy(dq_.ptr, q_host_.data(), q_host_.bytes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dk_.ptr, k_host_.data(), k_host_.bytes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dv_.ptr, v_host_.data(), v_host_.bytes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dcq_.ptr, b_.cu_q.data(), b_.cu_q.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dck_.ptr, b_.cu_k.data(), b_.cu_k.size() * 4, cudaMemcpyHostToDevice);
    const size_t out_bytes = out_elems_ * es_ + 2 * kGuardBytes;
    const size_t lse_bytes = b_.total_q() * c_.heads_q * 4 + 2 * kGuardBytes;
    dout_ = DeviceBuffer(out_bytes);
    dlse_ = DeviceBuffer(lse_bytes);
    if (!c_.sinks.empty()) {
      dsinks_ = DeviceBuffer(c_.sinks.size() * 4);
      cudaMemcpy(dsinks_.ptr, c_.sinks.data(), c_.sinks.size() * 4, cudaMemcpyHostToDevice);
    }
  }

  // Poisons the outputs (guards included), runs, downloads. Returns the status.
  jfa_status run(DeviceRun* r, jfa_backend backend = JFA_BACKEND_AUTO,
                 cudaStream_t stream = nullptr) {
    poison();
    jfa_attention_params p = device_params();
    p.backend = backend;
    p.stream = stream;
    const KernelVariant* variant = jfa::gpu_test::active_variant();
    const jfa_status s = variant != nullptr ? jfa::gpu_test::forward_variant(&p, *variant)
                                            : jfa_attention_forward(&p);
    if (s != JFA_SUCCESS) return s;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return JFA_ERROR_CUDA;
    download(r);
    return s;
  }

  void poison() {
    cudaMemset(dout_.ptr, 0xFF, dout_.bytes);
    cudaMemset(dlse_.ptr, 0xFF, dlse_.bytes);
  }

  jfa_attention_params device_params() {
    return params(
        dq_.ptr, b_.total_k() ? dk_.ptr : nullptr, b_.total_k() ? dv_.ptr : nullptr,
        static_cast<unsigned char*>(dout_.ptr) + kGuardBytes,
        c_.with_lse ? reinterpret_cast<float*>(static_cast<unsigned char*>(dlse_.ptr) + kGuardBytes)
                    : nullptr,
        dcq_.as<int32_t>(), dck_.as<int32_t>(), dsinks_.as<float>());
  }

  void download(DeviceRun* r) {
    r->out_bytes.resize(dout_.bytes);
    cudaMemcpy(r->out_bytes.data(), dout_.ptr, dout_.bytes, cudaMemcpyDeviceToHost);
    r->lse.resize(dlse_.bytes / 4);
    cudaMemcpy(r->lse.data(), dlse_.ptr, dlse_.bytes, cudaMemcpyDeviceToHost);
  }

  // Checks guards, poison, padding, and the values against the reference.
  void check(const DeviceRun& r, uint64_t seed) {
    SCOPED_TRACE(describe(c_) + " seed=" + std::to_string(seed));
    const unsigned char* bytes = r.out_bytes.data();
    for (size_t i = 0; i < kGuardBytes; ++i) {
      ASSERT_EQ(bytes[i], 0xFF) << "write before the output buffer at byte " << i;
      ASSERT_EQ(bytes[r.out_bytes.size() - kGuardBytes + i], 0xFF)
          << "write after the output buffer";
    }
    const int64_t row_elems = c_.heads_q * c_.dv();
    const int64_t qts = row_elems + c_.token_pad;        // out's token stride
    HostBuffer out(c_.dtype, b_.total_q() * row_elems);  // packed copy of the result
    for (int64_t t = 0; t < b_.total_q(); ++t) {
      const unsigned char* row = bytes + kGuardBytes + t * qts * es_;
      std::memcpy(out.bytes.data() + t * row_elems * es_, row, row_elems * es_);
      for (int64_t e = row_elems * es_; e < qts * static_cast<int64_t>(es_); ++e)
        ASSERT_EQ(row[e], 0xFF) << "write into the padding of token " << t;
    }
    int64_t non_finite = 0;
    for (int64_t i = 0; i < out.count(); ++i)
      if (!std::isfinite(jfa::tools::element_as_double(out, i))) ++non_finite;
    ASSERT_EQ(non_finite, 0) << "unwritten (poisoned) or non-finite output elements";

    // Rows to compare.
    std::vector<int64_t> rows;
    if (c_.max_check > 0 && b_.total_q() > c_.max_check) {
      std::mt19937_64 rng(seed ^ 0x5eed);
      std::uniform_int_distribution<int64_t> pick(0, b_.total_q() - 1);
      for (int64_t i = 0; i < c_.max_check; ++i) rows.push_back(pick(rng));
      for (size_t s = 0;
           s + 1 < b_.cu_q.size() && rows.size() < static_cast<size_t>(2 * c_.max_check); ++s) {
        if (b_.cu_q[s + 1] > b_.cu_q[s]) {
          rows.push_back(b_.cu_q[s]);
          rows.push_back(b_.cu_q[s + 1] - 1);
        }
      }
    }
    jfa_attention_params hp = params(q_host_.data(), b_.total_k() ? k_host_.data() : nullptr,
                                     b_.total_k() ? v_host_.data() : nullptr, nullptr, nullptr,
                                     b_.cu_q.data(), b_.cu_k.data(), c_.sinks.data());
    hp.max_seqlen_q = hp.max_seqlen_k = 0;
    hp.device_check = nullptr;  // a device word: not for the host reference
    const int64_t n = rows.empty() ? b_.total_q() : static_cast<int64_t>(rows.size());
    std::vector<double> ref(n * row_elems), ref_lse(n * c_.heads_q);
    ASSERT_EQ(jfa_attention_reference(&hp, rows.empty() ? nullptr : rows.data(), n, ref.data(),
                                      ref_lse.data()),
              JFA_SUCCESS)
        << jfa_last_error_message();
    const double err = jfa::tools::relative_error(out, ref, rows, row_elems);
    std::printf("  %s: rel err %.3g over %lld rows (tol %.g)\n", describe(c_).c_str(), err,
                static_cast<long long>(n), jfa::tools::tolerance(c_.dtype));
    EXPECT_LE(err, jfa::tools::tolerance(c_.dtype));

    // LSE: guards, then values (abs tolerance; -inf must match exactly).
    const size_t guard_floats = kGuardBytes / 4;
    const uint32_t* lse_bits = reinterpret_cast<const uint32_t*>(r.lse.data());
    for (size_t i = 0; i < guard_floats; ++i) {
      ASSERT_EQ(lse_bits[i], 0xFFFFFFFFu) << "LSE write before its buffer";
      ASSERT_EQ(lse_bits[r.lse.size() - guard_floats + i], 0xFFFFFFFFu)
          << "LSE write after its buffer";
    }
    if (!c_.with_lse) {
      for (size_t i = 0; i < r.lse.size(); ++i)
        ASSERT_EQ(lse_bits[i], 0xFFFFFFFFu) << "LSE written while NULL";
      return;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t token = rows.empty() ? i : rows[i];
      for (int h = 0; h < c_.heads_q; ++h) {
        const float got = r.lse[guard_floats + h * b_.total_q() + token];
        const double want = ref_lse[h * n + i];
        // -inf: a row without keys; beyond float32: the infinity of its sign.
        const bool ok = std::abs(want) > std::numeric_limits<float>::max()
                            ? std::isinf(got) && (got < 0) == (want < 0)
                            : std::abs(got - want) <= 2e-3 * (1 + std::abs(want));
        if (!ok && bad++ < 5)
          ADD_FAILURE() << "LSE token " << token << " head " << h << ": got " << got << " want "
                        << want;
      }
    }
    EXPECT_EQ(bad, 0);
  }

  JaggedBatch& batch() { return b_; }
  // The checked mode's word of the device calls (NULL: off).
  void set_device_check(int32_t* word) { device_check_ = word; }

 private:
  Case c_;
  JaggedBatch b_;
  size_t es_ = 2;
  HostBuffer q_host_, k_host_, v_host_;
  int64_t out_elems_ = 0;
  DeviceBuffer dq_, dk_, dv_, dcq_, dck_, dout_, dlse_, dsinks_;
  int32_t* device_check_ = nullptr;
};

void run_case(const Case& c, bool check_determinism = true) {
  const uint64_t seed = fresh_seed(describe(c).c_str());
  AttentionRunner runner(c, seed);
  runner.upload();
  DeviceRun first;
  const jfa_status s = runner.run(&first);
  ASSERT_EQ(s, JFA_SUCCESS) << jfa_last_error_message();
  runner.check(first, seed);
  if (check_determinism) {
    DeviceRun second;
    ASSERT_EQ(runner.run(&second), JFA_SUCCESS) << jfa_last_error_message();
    EXPECT_TRUE(first.out_bytes == second.out_bytes) << "two runs differ (output)";
    EXPECT_TRUE(std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * 4) == 0)
        << "two runs differ (LSE)";
  }
}

std::vector<int32_t> random_lengths(std::mt19937_64& rng, int n, int lo, int hi) {
  std::uniform_int_distribution<int> len(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = len(rng);
  return v;
}

const std::vector<int32_t> kEdgeLengths = {0, 1, 63, 64, 65, 127, 129, 200, 128, 2};

TEST(AttentionGpu, EdgeLengthsAllDtypesHeadDimsMasks) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int d : kHeadDims)
      for (bool causal : {false, true}) {
        Case c;
        c.lq = c.lk = kEdgeLengths;
        c.heads_q = c.heads_kv = 3;
        c.head_dim = d;
        c.dtype = dt;
        c.causal = causal;
        run_case(c);
      }
}

// head_dim 192 with v and out of 128 columns (the forward's one pair of unequal sizes), as the
// d192 cases above: both dtypes and masks, edge lengths (0 and 1 included), cross lengths under
// GQA, MQA with a strided layout and no LSE, random batches.
TEST(AttentionGpu, HeadDim192Value128MatchesReference) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true}) {
      Case c;
      c.head_dim = 192;
      c.head_dim_v = 128;
      c.dtype = dt;
      c.causal = causal;
      c.lq = c.lk = kEdgeLengths;
      c.heads_q = c.heads_kv = 3;
      run_case(c);
      c.lq = {1, 100, 300, 0, 64, 129, 5, 250};
      c.lk = {200, 17, 300, 50, 0, 64, 260, 129};
      c.heads_q = 8;
      c.heads_kv = 2;
      c.hints = true;
      run_case(c);
      c.lq = c.lk = {0, 1, 2, 77, 130, 1};
      c.heads_q = 4;
      c.heads_kv = 1;
      c.token_pad = 8;
      c.with_lse = false;
      c.hints = false;
      run_case(c);
    }
  std::mt19937_64 rng(fresh_seed("d192/128 random batches"));
  for (int i = 0; i < (quick_mode() ? 2 : 8); ++i) {
    Case c;
    c.head_dim = 192;
    c.head_dim_v = 128;
    c.dtype = i % 2 ? DType::kBFloat16 : DType::kFloat16;
    c.causal = i % 4 >= 2;
    const int n = 1 + static_cast<int>(rng() % 12);
    c.lq = random_lengths(rng, n, 0, 400);
    c.lk = i % 3 ? c.lq : random_lengths(rng, n, 0, 400);
    c.heads_kv = 1 + static_cast<int>(rng() % 3);
    c.heads_q = c.heads_kv * (1 + static_cast<int>(rng() % 3));
    run_case(c, false);
  }
}

TEST(AttentionGpu, DifferentQueryAndKeyLengthsGqa) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int d : kHeadDims)
      for (bool causal : {false, true}) {
        Case c;
        c.lq = {1, 100, 300, 0, 64, 129, 5, 250};
        c.lk = {200, 17, 300, 50, 0, 64, 260, 129};
        c.heads_q = 8;
        c.heads_kv = 2;
        c.head_dim = d;
        c.dtype = dt;
        c.causal = causal;
        c.hints = causal;
        run_case(c);
      }
}

TEST(AttentionGpu, MqaAndStridedLayoutWithoutLse) {
  for (int d : kHeadDims) {
    Case c;
    c.lq = {77, 300, 1, 128};
    c.lk = {150, 300, 40, 1};
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = d;
    c.causal = d == 128;
    c.token_pad = 24;
    c.with_lse = d == 64;
    c.scale = 0.3f;
    run_case(c);
  }
}

TEST(AttentionGpu, RandomBatchesFreshSeeds) {
  std::mt19937_64 rng(fresh_seed("random batch shapes"));
  const int iters = quick_mode() ? 3 : 10;
  for (int i = 0; i < iters; ++i) {
    Case c;
    const int batch = std::uniform_int_distribution<int>(1, 12)(rng);
    c.lq = random_lengths(rng, batch, 0, 400);
    c.lk = (rng() % 2) ? c.lq : random_lengths(rng, batch, 0, 400);
    c.heads_kv = std::uniform_int_distribution<int>(1, 3)(rng);
    c.heads_q = c.heads_kv * std::uniform_int_distribution<int>(1, 3)(rng);
    c.head_dim = kHeadDims[rng() % std::size(kHeadDims)];
    c.dtype = (rng() % 2) ? DType::kFloat16 : DType::kBFloat16;
    c.causal = rng() % 2;
    c.hints = rng() % 2;
    run_case(c, false);
  }
}

TEST(AttentionGpu, LongSequencesSampled) {
  if (quick_mode()) GTEST_SKIP() << "quick mode";
  for (bool causal : {false, true}) {
    Case c;
    c.lq = {4096, 1000, 4500};
    c.lk = {4096, 1000, 3000};
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 128;
    c.causal = causal;
    c.max_check = 300;
    run_case(c);
  }
  Case c;
  c.lq = c.lk = {5000, 17};
  c.heads_q = c.heads_kv = 2;
  c.head_dim = 64;
  c.dtype = DType::kBFloat16;
  c.max_check = 300;
  run_case(c);
}

// Large softmax scales spread the scores over tens of units of log2, so the running row maximum
// often grows by more than the kernel lets its reference maximum lag (rescaling O), and at other
// tiles grows by less (no rescaling): both paths, on several K tiles per row.
TEST(AttentionGpu, WidelySpreadScoresAcrossKeyTiles) {
  for (int d : kHeadDims)
    for (bool causal : {false, true})
      for (float scale : {0.35f, 1.5f}) {
        Case c;
        c.lq = {700, 1, 129, 1030};
        c.lk = {700, 900, 129, 1030};
        c.heads_q = c.heads_kv = 2;
        c.head_dim = d;
        c.dtype = scale > 1.f ? DType::kBFloat16 : DType::kFloat16;
        c.causal = causal;
        c.scale = scale;
        run_case(c, false);
      }
}

TEST(AttentionGpu, ManyTinySequences) {
  std::mt19937_64 rng(fresh_seed("tiny lengths"));
  for (bool causal : {false, true}) {
    Case c;
    c.lq = random_lengths(rng, quick_mode() ? 300 : 4096, 0, 64);
    c.lk = causal ? c.lq : random_lengths(rng, static_cast<int>(c.lq.size()), 0, 64);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = causal ? 128 : 64;
    c.dtype = causal ? DType::kFloat16 : DType::kBFloat16;
    c.causal = causal;
    c.max_check = quick_mode() ? 0 : 2000;
    run_case(c);
  }
}

// Many more work items than CTAs, so that every CTA of the persistent grid runs a long chain of
// items and everything that carries from one item to the next (rings, phases, staged outputs,
// groups that skip an item's K tiles) is exercised; every shape and both masks, output checked on
// sampled query tokens.
TEST(AttentionGpu, PersistentCtasRunManyItems) {
  std::mt19937_64 rng(fresh_seed("many items per CTA"));
  for (int groups : {2, 3}) {
    KernelVariant variant;
    variant.d64_groups = groups;
    SCOPED_TRACE(variant.describe());
    const ScopedVariant use(variant);
    for (int d : kHeadDims)
      for (bool causal : {false, true}) {
        if (d != 64 && groups == 3) continue;  // one tile height above 64
        Case c;
        c.lq = random_lengths(rng, 48, 150, 900);
        c.lk = causal ? c.lq : random_lengths(rng, 48, 100, 1000);
        c.heads_q = 16;
        c.heads_kv = 4;
        c.head_dim = d;
        c.dtype = causal ? DType::kBFloat16 : DType::kFloat16;
        c.causal = causal;
        c.max_check = 400;
        run_case(c, false);
      }
  }
}

// Short sequences share tiles (a block-diagonal mask from per-row key ranges): runs of short
// sequences broken by long ones, zero-length queries or keys inside a run, q/k lengths that differ
// (rows with no visible key under the causal mask), a sequence of exactly one tile, runs longer
// than a warp's 32 sequences, and more sequences than the work-list kernel takes per round.
std::vector<Case> shared_tile_cases(std::mt19937_64& rng) {
  std::vector<Case> cases;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int d : kHeadDims)
      for (bool causal : {false, true}) {
        Case c;
        c.lq = {3, 0, 17, 128, 1, 60, 300, 5, 64, 64, 2, 0, 9};
        c.lk = {3, 7, 17, 128, 1, 60, 250, 5, 64, 64, 2, 0, 9};
        if (d == 128) {  // cross lengths: some rows see nothing under the causal mask
          c.lk = {1, 7, 40, 128, 0, 3, 250, 9, 20, 100, 1, 4, 9};
        }
        std::vector<int32_t> more_q = random_lengths(rng, 70, 0, 40);
        std::vector<int32_t> more_k = random_lengths(rng, 70, 0, 40);
        c.lq.insert(c.lq.end(), more_q.begin(), more_q.end());
        c.lk.insert(c.lk.end(), more_k.begin(), more_k.end());
        c.heads_q = 4;
        c.heads_kv = 2;
        c.head_dim = d;
        c.dtype = dt;
        c.causal = causal;
        cases.push_back(c);
      }
  Case ones;  // 2100 sequences of one token: several rounds of the work-list kernel
  ones.lq = ones.lk = std::vector<int32_t>(2100, 1);
  ones.heads_q = ones.heads_kv = 2;
  ones.head_dim = 128;
  ones.causal = true;
  cases.push_back(ones);
  return cases;
}

TEST(AttentionGpu, ShortSequencesShareTiles) {
  std::mt19937_64 rng(fresh_seed("shared tiles"));
  for (const Case& c : shared_tile_cases(rng)) run_case(c);
}

// The main loops that lost to the shipped one (one K tile at a time; overlapped with the groups
// independent and the items tile-major), with the work list heaviest sequences first, on the cases
// that stress masks, GQA, lengths and shared tiles; every tile shape (both Q tile heights at
// head_dim 64, both K tile sizes at 128).
TEST(AttentionGpu, AlternativeSchedulesMatchReference) {
  for (VariantLoop loop : {VariantLoop::kOneTileAtATime, VariantLoop::kOverlappedIndependent})
    for (int shape : {0, 1}) {
      KernelVariant variant;
      variant.loop = loop;
      variant.d64_groups = shape == 0 ? 2 : 3;
      variant.d128_keys = shape == 0 ? 128 : 160;
      variant.sort_work_list = true;
      SCOPED_TRACE(variant.describe());
      const ScopedVariant use(variant);
      std::mt19937_64 rng(fresh_seed("overlapped schedule"));
      for (DType dt : {DType::kFloat16, DType::kBFloat16})
        for (int d : kHeadDims)
          for (bool causal : {false, true}) {
            Case c;
            c.lq = kEdgeLengths;
            c.lk = (d == 64) ? kEdgeLengths
                             : random_lengths(rng, static_cast<int>(kEdgeLengths.size()), 0, 500);
            c.heads_q = 4;
            c.heads_kv = 2;
            c.head_dim = d;
            c.dtype = dt;
            c.causal = causal;
            run_case(c);
          }
      for (const Case& c : shared_tile_cases(rng)) run_case(c, false);
    }
}

// The shipped kernels launched as two plain launches (no programmatic dependency), and with the
// work list sorted heaviest first.
TEST(AttentionGpu, OtherLaunchChoicesMatchReference) {
  for (int choice : {0, 1}) {
    KernelVariant variant;
    variant.dependent_launch = choice != 0;
    variant.sort_work_list = choice != 0;
    SCOPED_TRACE(variant.describe());
    const ScopedVariant use(variant);
    std::mt19937_64 rng(fresh_seed("launch choices"));
    for (const Case& c : shared_tile_cases(rng)) run_case(c, false);
    Case c;
    c.lq = random_lengths(rng, 24, 0, 700);
    c.lk = c.lq;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_dim = 128;
    c.causal = true;
    run_case(c);
  }
}

// Windows, softcap and sinks (sinks alone run the plain kernels): sliding windows at their edges
// (0, 1, longer than the sequence, one side only, with the causal mask), softcap small enough to
// bend the scores, sinks small and large, and all together; over every head size (and 192/128) and
// both dtypes, on edge lengths, cross lengths with long sequences (whole K tiles below a window
// skipped) and shared tiles of short sequences, against the float64 reference, which applies the
// same rule (common/visibility.hpp).
TEST(AttentionGpu, LocalAttentionMatchesReference) {
  std::mt19937_64 rng(fresh_seed("local attention"));
  std::normal_distribution<float> logit(0.f, 1.f);
  struct Dims {
    int d, dv;
  };
  std::vector<Dims> dims;
  for (int d : kHeadDims) dims.push_back({d, 0});
  dims.push_back({192, 128});
  for (const Dims& hd : dims)
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (size_t k = 0; k < std::size(jfa::gpu_test::kLocalKinds); ++k) {
        if (quick_mode() && (k + hd.d / 32) % 4 != 0) continue;
        const jfa::gpu_test::LocalKind& l = jfa::gpu_test::kLocalKinds[k];
        Case c;
        c.head_dim = hd.d;
        c.head_dim_v = hd.dv;
        c.dtype = dt;
        c.causal = l.causal;
        c.window_left = l.left;
        c.window_right = l.right;
        c.softcap = l.softcap;
        c.heads_q = 4;
        c.heads_kv = 2;
        for (int h = 0; l.sink_sd > 0.f && h < c.heads_q; ++h)
          c.sinks.push_back(l.sink_sd * logit(rng));
        c.lq = c.lk = kEdgeLengths;
        run_case(c, false);
        c.lq = {1, 700, 300, 0, 64, 129};
        c.lk = {200, 517, 300, 50, 0, 64};
        run_case(c, false);
        c.lq = c.lk = random_lengths(rng, 200, 0, 40);
        run_case(c, false);
      }
}

// Both tile shapes at head_dim 64 and 32 (forced, so also the one the mean length would not pick):
// edge and cross lengths under both masks (groups of a 192-row tile that see no key of the last K
// tiles skip them; groups past a tile's last row skip all), shared tiles, and longer sequences.
TEST(AttentionGpu, HeadDim64TileShapesMatchReference) {
  for (int groups : {2, 3}) {
    KernelVariant variant;
    variant.d64_groups = groups;
    SCOPED_TRACE(variant.describe());
    const ScopedVariant use(variant);
    std::mt19937_64 rng(fresh_seed("head_dim 64 tile shapes"));
    for (int d : {32, 64})
      for (DType dt : {DType::kFloat16, DType::kBFloat16})
        for (bool causal : {false, true}) {
          Case c;
          c.lq = kEdgeLengths;
          c.lk = kEdgeLengths;
          c.heads_q = c.heads_kv = 2;
          c.head_dim = d;
          c.dtype = dt;
          c.causal = causal;
          run_case(c, false);
          c.lq = {1, 100, 300, 0, 64, 129, 5, 250, 700, 193};
          c.lk = {200, 17, 300, 50, 0, 64, 260, 129, 500, 900};
          c.heads_q = 4;
          run_case(c, false);
          c.lq = random_lengths(rng, 6, 150, 1500);
          c.lk = c.lq;
          run_case(c, false);
        }
    for (const Case& c : shared_tile_cases(rng))
      if (c.head_dim == 64 || c.head_dim == 32) run_case(c, false);
  }
}

// Both K tile sizes at head_dim 128 (forced; the library's choice depends on the mask and the mean
// length): lengths on both sides of multiples of 128 and 160, cross lengths, GQA,
// shared tiles (which pack up to one K tile of keys) and longer sequences, under both masks.
TEST(AttentionGpu, HeadDim128KeyTilesMatchReference) {
  for (int keys : {128, 160}) {
    KernelVariant variant;
    variant.d128_keys = keys;
    SCOPED_TRACE(variant.describe());
    const ScopedVariant use(variant);
    std::mt19937_64 rng(fresh_seed("head_dim 128 key tiles"));
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true}) {
        Case c;
        c.lq = {159, 160, 161, 1, 0, 320, 127, 129, 481, 33};
        c.lk = {160, 159, 161, 321, 7, 320, 128, 0, 479, 161};
        c.heads_q = 4;
        c.heads_kv = 2;
        c.head_dim = 128;
        c.dtype = dt;
        c.causal = causal;
        run_case(c, false);
        c.lq = random_lengths(rng, 5, 200, 1700);
        c.lk = c.lq;
        c.heads_kv = 4;
        run_case(c, false);
        // Short sequences with 100-160 keys: one sequence per tile.
        c.lq = random_lengths(rng, 60, 0, 50);
        c.lk = random_lengths(rng, 60, 100, 160);
        run_case(c, false);
        // Runs of short sequences whose keys fill 129-160 of a tile: shared by two or three
        // sequences with 160-key tiles, by at most two with 128.
        c.lq = {40, 40, 40, 30, 2, 50, 45, 1, 0, 33, 60};
        c.lk = {50, 50, 50, 40, 90, 70, 65, 1, 29, 64, 96};
        run_case(c, false);
      }
    for (const Case& c : shared_tile_cases(rng))
      if (c.head_dim == 128) run_case(c, false);
  }
}

TEST(AttentionGpu, NoKeysAnywhere) {
  Case c;
  c.lq = {5, 130, 0};
  c.lk = {0, 0, 0};
  c.head_dim = 128;
  run_case(c);
}

TEST(AttentionGpu, EmptyBatchAndZeroTokens) {
  Case c;
  c.lq = {0, 0};
  c.lk = {3, 0};
  run_case(c);
}

TEST(AttentionGpu, GraphCaptureReplaysWithNewLengths) {
  // Capture once, then change the offsets in place (same totals) and replay: the result must
  // follow.
  Case c;
  c.lq = c.lk = {100, 200, 50};
  c.head_dim = 128;
  c.causal = true;
  const uint64_t seed = fresh_seed("graph");
  AttentionRunner runner(c, seed);
  runner.upload();
  cudaStream_t stream;
  JFA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  jfa_attention_params p = runner.device_params();
  p.stream = stream;
  cudaGraph_t graph;
  JFA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const jfa_status s = jfa_attention_forward(&p);
  JFA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(s, JFA_SUCCESS) << jfa_last_error_message();
  cudaGraphExec_t exec;
  JFA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  DeviceRun direct, replayed;
  ASSERT_EQ(runner.run(&direct, JFA_BACKEND_AUTO, stream), JFA_SUCCESS);
  JFA_CUDA_OK(cudaMemset(const_cast<void*>(static_cast<const void*>(p.out)), 0xFF, 16));
  JFA_CUDA_OK(cudaGraphLaunch(exec, stream));
  JFA_CUDA_OK(cudaStreamSynchronize(stream));
  runner.download(&replayed);
  EXPECT_TRUE(direct.out_bytes == replayed.out_bytes) << "graph replay differs from a direct run";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A caller's workspace gives the same result as the library's own, and the call then allocates
// nothing; a workspace that is too small or misaligned is rejected before anything is written.
TEST(AttentionGpuApi, CallerWorkspace) {
  Case c;
  c.lq = c.lk = {70, 0, 300, 1, 129};
  c.head_dim = 128;
  c.causal = true;
  const uint64_t seed = fresh_seed("workspace");
  AttentionRunner runner(c, seed);
  runner.upload();
  DeviceRun own, given;
  ASSERT_EQ(default_pool_peak(/*reset=*/true), 0u);
  ASSERT_EQ(runner.run(&own), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_GT(default_pool_peak(/*reset=*/false), 0u) << "no workspace: the library allocates one";
  runner.check(own, seed);

  jfa_attention_params p = runner.device_params();
  size_t bytes = 0;
  ASSERT_EQ(jfa_attention_workspace_size(&p, &bytes), JFA_SUCCESS) << jfa_last_error_message();
  DeviceBuffer workspace(bytes + 16);
  JFA_CUDA_OK(cudaMemset(workspace.ptr, 0xA5, bytes + 16));  // stale contents must not matter
  p.workspace = workspace.ptr;
  p.workspace_bytes = bytes;
  runner.poison();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(default_pool_peak(/*reset=*/true), 0u);
  ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(default_pool_peak(/*reset=*/false), 0u) << "a call with a workspace allocated memory";
  runner.download(&given);
  EXPECT_TRUE(own.out_bytes == given.out_bytes) << "the caller's workspace changed the output";

  struct Bad {
    void* ptr;
    size_t bytes;
    const char* message;
  };
  const Bad bad[] = {{workspace.ptr, bytes - 1, "workspace_bytes"},
                     {static_cast<char*>(workspace.ptr) + 8, bytes, "aligned"}};
  for (const Bad& b : bad) {
    runner.poison();
    p.workspace = b.ptr;
    p.workspace_bytes = b.bytes;
    EXPECT_EQ(jfa_attention_forward(&p), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find(b.message), std::string::npos)
        << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    DeviceRun untouched;
    runner.download(&untouched);
    EXPECT_TRUE(std::all_of(untouched.out_bytes.begin(), untouched.out_bytes.end(),
                            [](unsigned char x) { return x == 0xFF; }))
        << "a rejected call wrote its output";
  }
}

// jfa::Workspace keeps one allocation for calls that need no more, grows for one that does, and
// gives the same results as the library's own workspace.
TEST(AttentionGpuApi, KeptWorkspaceGrows) {
  jfa::Workspace kept;
  size_t previous = 0;
  for (const std::vector<int32_t>& lengths :
       std::vector<std::vector<int32_t>>{{5, 300}, {1, 2, 3}, std::vector<int32_t>(600, 40)}) {
    Case c;
    c.lq = c.lk = lengths;
    const uint64_t seed = fresh_seed("kept workspace");
    AttentionRunner runner(c, seed);
    runner.upload();
    DeviceRun own, with_kept;
    ASSERT_EQ(runner.run(&own), JFA_SUCCESS) << jfa_last_error_message();
    jfa_attention_params p = runner.device_params();
    kept.prepare(p);
    ASSERT_NE(p.workspace, nullptr);
    size_t needed = 0;
    ASSERT_EQ(jfa_attention_workspace_size(&p, &needed), JFA_SUCCESS);
    EXPECT_GE(p.workspace_bytes, needed);
    EXPECT_EQ(p.workspace_bytes, std::max(previous, needed)) << "grows only when needed";
    previous = p.workspace_bytes;
    runner.poison();
    ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    runner.download(&with_kept);
    EXPECT_TRUE(own.out_bytes == with_kept.out_bytes);
  }
}

// The checked mode: the call checks the device offsets on the device and reports each rule broken
// in a device word, without a host synchronization; valid offsets give 0. q and k offsets are
// checked separately (k's rules are q's four bits up). Run under compute-sanitizer too.
TEST(AttentionGpu, CheckedModeReportsInvalidDeviceOffsets) {
  Case c;
  c.lq = c.lk = {100, 200, 50};  // total 350
  c.head_dim = 64;
  AttentionRunner runner(c, fresh_seed("checked offsets"));
  runner.upload();
  const jfa_attention_params valid = runner.device_params();
  DeviceBuffer word(sizeof(int32_t)), cu_q(16), cu_k(16);
  struct Probe {
    std::vector<int32_t> q, k;
    int32_t max_q, max_k;
    int32_t expected;
  };
  const Probe probes[] = {
      {{0, 100, 300, 350}, {0, 100, 300, 350}, 0, 0, 0},
      {{0, 100, 300, 350}, {0, 100, 300, 350}, 200, 200, 0},
      {{5, 100, 300, 350}, {0, 100, 300, 350}, 0, 0, JFA_OFFSETS_Q_FIRST_NOT_ZERO},
      {{0, 300, 100, 350}, {0, 100, 300, 350}, 0, 0, JFA_OFFSETS_Q_DECREASING},
      {{0, 100, 300, 349}, {0, 100, 300, 350}, 0, 0, JFA_OFFSETS_Q_LAST_NOT_TOTAL},
      {{0, 100, 300, 350}, {0, 100, 300, 350}, 199, 0, JFA_OFFSETS_Q_ABOVE_MAX},
      {{0, 100, 300, 350},
       {-1, 400, 300, 351},
       0,
       150,
       JFA_OFFSETS_K_FIRST_NOT_ZERO | JFA_OFFSETS_K_DECREASING | JFA_OFFSETS_K_LAST_NOT_TOTAL |
           JFA_OFFSETS_K_ABOVE_MAX},
      {{7, 3, 500, -1},
       {0, 100, 300, 350},
       0,
       0,
       JFA_OFFSETS_Q_FIRST_NOT_ZERO | JFA_OFFSETS_Q_DECREASING | JFA_OFFSETS_Q_LAST_NOT_TOTAL},
  };
  for (const Probe& probe : probes) {
    SCOPED_TRACE(jfa_device_check_message(probe.expected));
    JFA_CUDA_OK(cudaMemcpy(cu_q.ptr, probe.q.data(), 16, cudaMemcpyHostToDevice));
    JFA_CUDA_OK(cudaMemcpy(cu_k.ptr, probe.k.data(), 16, cudaMemcpyHostToDevice));
    jfa_attention_params p = valid;
    p.cu_seqlens_q = cu_q.as<int32_t>();
    p.cu_seqlens_k = cu_k.as<int32_t>();
    p.max_seqlen_q = probe.max_q;
    p.max_seqlen_k = probe.max_k;
    runner.poison();
    const int32_t got = jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
      p.device_check = w;
      EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    });
    EXPECT_EQ(got, probe.expected) << jfa_device_check_message(got);
  }
  // No q rows: no list kernel runs, the check runs alone.
  Case empty;
  empty.lq = {0, 0};
  empty.lk = {3, 4};
  empty.head_dim = 64;
  AttentionRunner none(empty, fresh_seed("checked offsets, no rows"));
  none.upload();
  jfa_attention_params p = none.device_params();
  const std::vector<int32_t> bad_k = {1, 3, 7};
  JFA_CUDA_OK(cudaMemcpy(cu_k.ptr, bad_k.data(), 12, cudaMemcpyHostToDevice));
  p.cu_seqlens_k = cu_k.as<int32_t>();
  const int32_t got = jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
    p.device_check = w;
    EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
  });
  EXPECT_EQ(got, JFA_OFFSETS_K_FIRST_NOT_ZERO) << jfa_device_check_message(got);
}

// Scales far beyond any model's: the exponentials are taken from score differences, so out stays
// exact (and the LSE finite while it fits float32). Integer q and k make the scores exact, so the
// kernel and the float64 reference see the same maxima and ties.
TEST(AttentionGpu, HugeScalesMatchReference) {
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const int d : kHeadDims)
      for (const bool causal : {false, true})
        for (const float scale : {1e4f, 1e30f}) {
          Case c;
          c.lq = {1, 77, 0, 300, 129};
          c.lk = causal ? std::vector<int32_t>{5, 77, 3, 200, 129} : c.lq;
          c.head_dim = d;
          c.dtype = dtype;
          c.causal = causal;
          c.scale = scale;
          c.integer_qk = true;
          SCOPED_TRACE("scale " + std::to_string(scale));
          run_case(c, /*check_determinism=*/false);
        }
}

// The checked mode's JFA_CHECK_RESULT_NOT_FINITE: an LSE beyond float32 (out still exact), and
// scores q.k beyond float32 (bf16 inputs near its range: out NaN); never set for what is finite.
TEST(AttentionGpu, CheckedModeReportsResultsBeyondFloat32) {
  DeviceBuffer word(sizeof(int32_t));
  auto checked_run = [&](AttentionRunner& runner, DeviceRun* r) {
    return jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
      runner.set_device_check(w);
      EXPECT_EQ(runner.run(r), JFA_SUCCESS) << jfa_last_error_message();
    });
  };
  for (const bool with_lse : {true, false}) {
    // Integer scores of up to +-2 * head_dim times 2e38: most LSEs are +-inf in float32.
    Case c;
    c.lq = c.lk = {1, 77, 300, 129};
    c.head_dim = 64;
    c.scale = 2e38f;
    c.integer_qk = true;
    c.with_lse = with_lse;
    SCOPED_TRACE(with_lse ? "with lse" : "without lse");
    const uint64_t seed = fresh_seed("lse beyond float32");
    AttentionRunner runner(c, seed);
    runner.upload();
    DeviceRun r;
    const int32_t got = checked_run(runner, &r);
    EXPECT_EQ(got, with_lse ? JFA_CHECK_RESULT_NOT_FINITE : 0) << jfa_device_check_message(got);
    runner.check(r, seed);  // out exact; each LSE beyond float32 is the infinity of its sign
  }
  {
    // Finite results give 0, also for tiles shared by short sequences whose causal rows see no
    // key (len_q > len_k, or no keys at all).
    std::mt19937_64 rng(fresh_seed("checked mode, shared tiles"));
    Case c;
    c.lq = random_lengths(rng, 300, 1, 24);
    c.lk = random_lengths(rng, 300, 0, 24);
    c.causal = true;
    c.heads_q = 4;
    c.heads_kv = 2;
    const uint64_t seed = fresh_seed("checked mode, finite");
    AttentionRunner runner(c, seed);
    runner.upload();
    DeviceRun r;
    const int32_t got = checked_run(runner, &r);
    EXPECT_EQ(got, 0) << jfa_device_check_message(got);
    runner.check(r, seed);
  }
  {
    // bf16 q and k of about 1e19: q.k overflows float32 in the tensor cores.
    Case c;
    c.lq = c.lk = {1, 77, 300};
    c.head_dim = 128;
    c.dtype = DType::kBFloat16;
    c.qk_gain = 1e19f;
    AttentionRunner runner(c, fresh_seed("scores beyond float32"));
    runner.upload();
    DeviceRun r;
    const int32_t got = checked_run(runner, &r);
    EXPECT_EQ(got, JFA_CHECK_RESULT_NOT_FINITE) << jfa_device_check_message(got);
    int64_t nan = 0;
    const size_t guard_floats = kGuardBytes / 4;
    for (size_t i = guard_floats; i + guard_floats < r.lse.size(); ++i)
      nan += std::isnan(r.lse[i]) ? 1 : 0;
    EXPECT_GT(nan, 0) << "no row overflowed: the case does not test what it says";
    // Unchecked, the call still succeeds (the status is returned before the kernels run).
    runner.set_device_check(nullptr);
    EXPECT_EQ(runner.run(&r), JFA_SUCCESS) << jfa_last_error_message();
  }
}

TEST(AttentionGpu, GarbageDeviceOffsetsStayInBounds) {
  // Offsets are not validated on the device; the kernel clamps them. Results are unspecified but no
  // access may leave the buffers (run this under compute-sanitizer memcheck) and guards stay
  // intact.
  Case c;
  c.lq = c.lk = {100, 200, 50};
  c.head_dim = 64;
  AttentionRunner runner(c, fresh_seed("garbage offsets"));
  runner.upload();
  jfa_attention_params p = runner.device_params();
  const std::vector<std::vector<int32_t>> garbage = {
      {0, 1000000, -5, 350}, {-100, 50, 40, 2000000000}, {0, 350, 0, 350}, {7, 3, 500, -1}};
  DeviceBuffer cu(4 * 4);
  for (const auto& g : garbage) {
    JFA_CUDA_OK(cudaMemcpy(cu.ptr, g.data(), 16, cudaMemcpyHostToDevice));
    runner.poison();
    p.cu_seqlens_q = cu.as<int32_t>();
    p.cu_seqlens_k = cu.as<int32_t>();
    ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    DeviceRun r;
    runner.download(&r);
    for (size_t i = 0; i < kGuardBytes; ++i) {
      ASSERT_EQ(r.out_bytes[i], 0xFF);
      ASSERT_EQ(r.out_bytes[r.out_bytes.size() - kGuardBytes + i], 0xFF);
    }
  }
}

TEST(AttentionGpu, UnsupportedCombinationsAreReported) {
  Case c;
  c.lq = c.lk = {10};
  c.head_dim = 64;
  AttentionRunner runner(c, 1);
  runner.upload();
  jfa_attention_params p = runner.device_params();
  p.head_dim = 80;  // no kernel; two heads of 80 a token, 8 tokens inside the 10 of 2 x 64
  p.q_layout = p.k_layout = p.v_layout = p.out_layout = {2 * 80, 80};
  p.total_q = p.total_k = 8;
  EXPECT_EQ(jfa_attention_forward(&p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("head_dim"), std::string::npos);
  p = runner.device_params();
  p.dtype = JFA_DTYPE_FLOAT32;
  p.total_q = p.total_k = 5;  // fp32 is twice the bytes: stay inside the buffers
  EXPECT_EQ(jfa_attention_forward(&p), JFA_ERROR_UNSUPPORTED);
  p = runner.device_params();
  p.q_layout = {2 * 64 + 4, 64};  // token stride not a multiple of 8 elements
  p.total_q = 9;
  EXPECT_EQ(jfa_attention_forward(&p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("strides"), std::string::npos);
  p = runner.device_params();
  p.backend = JFA_BACKEND_CUDA;
  EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(jfa_cuda_available(), 1);
}

TEST(AttentionGpuApi, HostOrDeviceMismatchesAreErrors) {
  Case c;
  c.lq = c.lk = {10, 20};
  AttentionRunner runner(c, 2);
  runner.upload();
  JaggedBatch& b = runner.batch();
  HostBuffer host_out = b.make_output();
  jfa_attention_params hp = runner.params(b.q.data(), b.k.data(), b.v.data(), host_out.data(),
                                          nullptr, b.cu_q.data(), b.cu_k.data());
  hp.backend = JFA_BACKEND_CUDA;
  EXPECT_EQ(jfa_attention_forward(&hp), JFA_ERROR_INVALID_ARGUMENT)
      << "host buffers with backend=cuda";
  jfa_attention_params dp = runner.device_params();
  dp.backend = JFA_BACKEND_CPU;
  EXPECT_EQ(jfa_attention_forward(&dp), JFA_ERROR_INVALID_ARGUMENT)
      << "device buffers with backend=cpu";
  jfa_attention_params mixed = runner.device_params();
  mixed.out = host_out.data();
  EXPECT_EQ(jfa_attention_forward(&mixed), JFA_ERROR_INVALID_ARGUMENT) << "mixed host/device";
  mixed = runner.device_params();
  mixed.cu_seqlens_q = b.cu_q.data();
  EXPECT_EQ(jfa_attention_forward(&mixed), JFA_ERROR_INVALID_ARGUMENT)
      << "host offsets, device tensors";
}

// The backward on device buffers runs on the CUDA backend, chosen or automatic, and writes every
// gradient element (backward_gpu_test.cpp checks the values); backend=cpu or a gradient buffer on
// the wrong side is named.
TEST(AttentionGpuApi, BackwardOnDeviceBuffersRuns) {
  Case c;
  c.lq = c.lk = {10, 20};
  AttentionRunner runner(c, 3);
  runner.upload();
  DeviceRun forward;
  ASSERT_EQ(runner.run(&forward), JFA_SUCCESS) << jfa_last_error_message();
  JaggedBatch& b = runner.batch();
  DeviceBuffer dout(b.q.bytes.size()), dq(b.q.bytes.size()), dk(b.k.bytes.size()),
      dv(b.v.bytes.size());
  JFA_CUDA_OK(cudaMemcpy(dout.ptr, b.q.data(), dout.bytes, cudaMemcpyHostToDevice));  // any values
  jfa_attention_backward_params p;
  ASSERT_EQ(jfa_attention_backward_params_init(&p), JFA_SUCCESS);
  p.forward = runner.device_params();
  p.dout = dout.ptr;
  p.dq = dq.ptr;
  p.dk = dk.ptr;
  p.dv = dv.ptr;
  for (jfa_backend backend : {JFA_BACKEND_AUTO, JFA_BACKEND_CUDA}) {
    for (DeviceBuffer* g : {&dq, &dk, &dv}) JFA_CUDA_OK(cudaMemset(g->ptr, 0xFF, g->bytes));
    p.forward.backend = backend;
    ASSERT_EQ(jfa_attention_backward(&p), JFA_SUCCESS) << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    for (const DeviceBuffer* g : {&dq, &dk, &dv}) {
      HostBuffer back(c.dtype, static_cast<int64_t>(g->bytes / jfa::dtype_size(c.dtype)));
      JFA_CUDA_OK(cudaMemcpy(back.data(), g->ptr, g->bytes, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < back.count(); ++i)
        ASSERT_TRUE(std::isfinite(jfa::tools::element_as_double(back, i)))
            << "backend " << backend << ": gradient element " << i << " unwritten";
    }
  }
  p.forward.backend = JFA_BACKEND_CPU;
  EXPECT_EQ(jfa_attention_backward(&p), JFA_ERROR_INVALID_ARGUMENT) << "device buffers, cpu";
  p.forward.backend = JFA_BACKEND_AUTO;
  HostBuffer host_dq = b.make_output();
  p.dq = host_dq.data();
  EXPECT_EQ(jfa_attention_backward(&p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("dq is in host memory"), std::string::npos)
      << jfa_last_error_message();
}

}  // namespace

// Windows, softcap and sinks need no more workspace than the plain call: a caller's workspace of
// the plain call's size serves them, and the workspace query answers the same. The checked mode
// flags a sink that is not finite (with sinks no LSE is -inf, an empty row's included); causal
// with any window_right is the causal mask.
TEST(AttentionGpu, LocalAttentionCallerWorkspaceAndCheckedMode) {
  const int32_t total = 10, heads = 2, d = 64;
  const std::vector<int32_t> cu = {0, 4, 4, 10};
  const size_t elems = static_cast<size_t>(total) * heads * d;
  DeviceBuffer q(elems * 2), k(elems * 2), v(elems * 2), out(elems * 2), cu_dev(cu.size() * 4),
      sinks(heads * 4), lse(static_cast<size_t>(total) * heads * 4), word(sizeof(int32_t));
  std::vector<uint16_t> ones(elems, 0x3C00);  // fp16 1.0
  ASSERT_EQ(cudaMemcpy(q.ptr, ones.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.ptr, ones.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.ptr, ones.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const std::vector<float> eight = {8.f, 8.f};  // each score's own value: q.k = 64, scale 1/8
  ASSERT_EQ(cudaMemcpy(sinks.ptr, eight.data(), heads * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cu_dev.ptr, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  auto params = [&] {
    jfa_attention_params p = jfa::tools::call_params(
        {q.ptr, k.ptr, v.ptr, out.ptr, lse.as<float>(), cu_dev.as<int32_t>(), cu_dev.as<int32_t>()},
        {3, total, total, heads, heads, d, JFA_DTYPE_FLOAT16});
    p.backend = JFA_BACKEND_CUDA;
    return p;
  };
  size_t plain_bytes = 0;
  {
    const jfa_attention_params p = params();
    ASSERT_EQ(jfa_attention_workspace_size(&p, &plain_bytes), JFA_SUCCESS);
  }
  DeviceBuffer workspace(plain_bytes);
  struct Local {
    const char* what;
    void (*set)(jfa_attention_params&, const float*);
  };
  const Local locals[] = {
      {"window", [](jfa_attention_params& p, const float*) { p.window_left = 2; }},
      {"right window", [](jfa_attention_params& p, const float*) { p.window_right = 0; }},
      {"causal window",
       [](jfa_attention_params& p, const float*) {
         p.causal = 1;
         p.window_left = 0;
       }},
      {"softcap", [](jfa_attention_params& p, const float*) { p.softcap = 30.0f; }},
      {"sinks", [](jfa_attention_params& p, const float* s) { p.sinks = s; }},
      {"causal wins", [](jfa_attention_params& p, const float*) {
         p.causal = 1;
         p.window_right = 5;
       }}};
  for (const Local& l : locals) {
    SCOPED_TRACE(l.what);
    jfa_attention_params p = params();
    l.set(p, sinks.as<float>());
    size_t bytes = 1;
    EXPECT_EQ(jfa_attention_workspace_size(&p, &bytes), JFA_SUCCESS);
    EXPECT_EQ(bytes, plain_bytes);
    ASSERT_EQ(cudaMemset(out.ptr, 0x5A, elems * 2), cudaSuccess);
    p.workspace = workspace.ptr;
    p.workspace_bytes = plain_bytes;
    const int32_t got = jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
      p.device_check = w;
      EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    });
    EXPECT_EQ(got, 0) << jfa_device_check_message(got);
    // Every value is 1 and every row sees a key (window_left 0 keeps the diagonal): out is 1
    // everywhere; with the sink, whose logit equals every score, n / (n + 1) for the n = 4 or 6
    // keys a row sees (0.8 or 0.857: fp16 in [0.5, 0.875)).
    std::vector<uint16_t> back(elems);
    ASSERT_EQ(cudaMemcpy(back.data(), out.ptr, elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    const bool sunk = p.sinks != nullptr;
    EXPECT_TRUE(
        std::all_of(back.begin(), back.end(),
                    [&](uint16_t x) { return sunk ? (x >= 0x3800 && x < 0x3B00) : x == 0x3C00; }))
        << std::hex << back[0];
  }
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    const std::vector<float> host_sinks = {0.f, bad};
    ASSERT_EQ(cudaMemcpy(sinks.ptr, host_sinks.data(), heads * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    jfa_attention_params p = params();
    p.sinks = sinks.as<float>();
    const int32_t got = jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
      p.device_check = w;
      EXPECT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    });
    EXPECT_EQ(got, JFA_CHECK_RESULT_NOT_FINITE) << jfa_device_check_message(got);
  }
}
