// The CUDA backward through the public API against the float64 reference backward
// (jfa_attention_backward_reference) on host copies of the same inputs: q, k, v, dout (and dlse)
// random normal with fresh seeds, out and lse from the CUDA forward, the gradients poisoned,
// guarded and checked in full. Edge and cross lengths, empty sequences, both dtypes and head dims,
// causal, GQA/MQA, head splits (under their switch), the LSE's gradient, strided gradient
// layouts, determinism, the caller's workspace, graph capture with new lengths, and the
// combinations that are not built.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/call_params.hpp"
#include "common/jagged_batch.hpp"
#include "common/visibility.hpp"
#include "gpu_test_util.hpp"
#include "jfa/jfa.h"
#include "jfa/jfa.hpp"

using jfa::DType;
using jfa::gpu_test::default_pool_peak;
using jfa::gpu_test::DeviceBuffer;
using jfa::gpu_test::fresh_seed;
using jfa::gpu_test::quick_mode;
using jfa::tools::HostBuffer;
using jfa::tools::JaggedBatch;

namespace {

constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};
// Every (head_dim, value head size) pair the backward takes: the equal ones and 192/128.
constexpr std::pair<int, int> kSizes[] = {{32, 32},   {64, 64},   {96, 96},  {128, 128},
                                          {192, 192}, {192, 128}, {256, 256}};
constexpr DType kDtypes[] = {DType::kFloat16, DType::kBFloat16};
constexpr size_t kGuardBytes = 4096;  // poisoned bytes before and after every gradient

// Relative L2 error allowed per gradient: twice the forward's, as the backward rounds P and dS to
// the input type and accumulates over both sequence lengths (fp16 4e-3, bf16 2e-2).
double l2_tolerance(DType dtype) { return 2 * jfa::tools::tolerance(dtype); }
// Largest element error allowed, relative to the largest reference element.
double max_tolerance(DType dtype) { return dtype == DType::kBFloat16 ? 1e-1 : 5e-2; }
// A reference gradient whose elements all lie below this is zero up to rounding (every query with
// a single visible key has dq = 0 and gives dk = 0): errors are then measured against this scale.
constexpr double kZeroScale = 1e-3;

struct Case {
  std::vector<int32_t> lq, lk;
  int32_t heads_q = 2, heads_kv = 2, head_dim = 64;
  int32_t head_dim_v = 0;  // 0: head_dim
  DType dtype = DType::kFloat16;
  bool causal = false;
  bool with_dlse = false;  // a random gradient of the forward's LSE
  bool strided = false;    // dout with padded tokens, dq and dv head-major, dk with padded heads
  bool deterministic = false;  // ask for bit-identical gradients
  bool hints = false;          // pass max_seqlen hints
  float dout_stddev = 1.0f;    // of the random dout
  float scale = std::numeric_limits<float>::quiet_NaN();
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::vector<float> sinks;  // empty: none; else [heads_q], and dsinks is checked too
};

std::string describe(const Case& c) {
  int64_t total_q = 0, total_k = 0;
  for (int32_t l : c.lq) total_q += l;
  for (int32_t l : c.lk) total_k += l;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%s d=%d dv=%d hq=%d hkv=%d causal=%d batch=%zu tq=%lld tk=%lld dlse=%d strided=%d det=%d",
      jfa::tools::dtype_name(c.dtype), c.head_dim, c.head_dim_v == 0 ? c.head_dim : c.head_dim_v,
      c.heads_q, c.heads_kv, c.causal ? 1 : 0, c.lq.size(), static_cast<long long>(total_q),
      static_cast<long long>(total_k), c.with_dlse ? 1 : 0, c.strided ? 1 : 0,
      c.deterministic ? 1 : 0);
  std::string s = buf;
  if (c.window_left != -1 || c.window_right != -1 || c.softcap != 0.0f || !c.sinks.empty()) {
    std::snprintf(buf, sizeof buf, " window=(%d,%d) softcap=%g sinks=%zu", c.window_left,
                  c.window_right, static_cast<double>(c.softcap), c.sinks.size());
    s += buf;
  }
  return s;
}

std::vector<int32_t> random_lengths(std::mt19937_64& rng, int n, int lo, int hi) {
  std::uniform_int_distribution<int32_t> len(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = len(rng);
  return v;
}

// Where the elements of a [total, heads, head_dim] tensor lie (strides in elements).
struct Shape {
  int64_t total = 0;
  int32_t heads = 0, d = 0;
  jfa_tensor_layout layout{};  // zeros: packed

  int64_t token_stride() const {
    return layout.token_stride != 0 ? layout.token_stride : int64_t{heads} * d;
  }
  int64_t head_stride() const { return layout.head_stride != 0 ? layout.head_stride : d; }
  int64_t at(int64_t token, int32_t head) const {
    return token * token_stride() + head * head_stride();
  }
  // Elements from the first one to one past the last.
  int64_t span() const { return total == 0 ? 0 : at(total - 1, heads - 1) + d; }
};

// The bytes of a packed host tensor laid out as `shape` says; the gaps hold 0xFF (NaN).
std::vector<unsigned char> lay_out(const HostBuffer& packed, const Shape& shape) {
  const size_t es = jfa::dtype_size(packed.dtype), row = shape.d * es;
  std::vector<unsigned char> bytes(shape.span() * es, 0xFF);
  for (int64_t t = 0; t < shape.total; ++t)
    for (int32_t h = 0; h < shape.heads; ++h)
      std::memcpy(bytes.data() + shape.at(t, h) * es,
                  packed.bytes.data() + (t * shape.heads + h) * row, row);
  return bytes;
}

DeviceBuffer upload(const void* host, size_t bytes) {
  DeviceBuffer device(std::max<size_t>(bytes, 16));
  if (bytes > 0 && cudaMemcpy(device.ptr, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    ADD_FAILURE() << "upload of " << bytes << " bytes failed";
  return device;
}

std::vector<unsigned char> download(const DeviceBuffer& device) {
  std::vector<unsigned char> host(device.bytes);
  if (cudaMemcpy(host.data(), device.ptr, device.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    ADD_FAILURE() << "download of " << device.bytes << " bytes failed";
  return host;
}

// The gradients as downloaded: every byte of their buffers, guards included.
struct Gradients {
  std::vector<unsigned char> dq, dk, dv;
  std::vector<float> dsinks;  // with sinks
};

bool all_poison(const Gradients& g) {
  for (const auto* bytes : {&g.dq, &g.dk, &g.dv})
    if (std::any_of(bytes->begin(), bytes->end(), [](unsigned char x) { return x != 0xFF; }))
      return false;
  return true;
}

// Relative errors of a gradient against the reference.
struct Error {
  double l2 = 0;   // ||got - ref|| / ||ref||
  double max = 0;  // max |got - ref| / max |ref|
};

Error measure(const HostBuffer& got, const std::vector<double>& ref) {
  if (ref.empty()) return {};
  double diff2 = 0, norm2 = 0, max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double diff = jfa::tools::element_as_double(got, static_cast<int64_t>(i)) - ref[i];
    diff2 += diff * diff;
    norm2 += ref[i] * ref[i];
    max_diff = std::max(max_diff, std::abs(diff));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  const double floor_l2 = kZeroScale * std::sqrt(static_cast<double>(ref.size()));
  return {std::sqrt(diff2) / std::max(std::sqrt(norm2), floor_l2),
          max_diff / std::max(max_ref, kZeroScale)};
}

// One gradient as downloaded (guards included): nothing written outside its elements, every
// element finite, the rows of `zero_tokens` exactly zero; then its errors against `ref`.
void check_gradient(const char* name, const std::vector<unsigned char>& bytes, const Shape& shape,
                    DType dtype, const std::vector<double>& ref,
                    const std::vector<int64_t>& zero_tokens, Error* error) {
  const size_t es = jfa::dtype_size(dtype), row = shape.d * es;
  ASSERT_EQ(bytes.size(), shape.span() * es + 2 * kGuardBytes) << name;
  HostBuffer got(dtype, shape.total * shape.heads * shape.d);
  std::vector<unsigned char> rest = bytes;  // what the call must have left as it was
  for (int64_t t = 0; t < shape.total; ++t)
    for (int32_t h = 0; h < shape.heads; ++h) {
      const size_t at = kGuardBytes + shape.at(t, h) * es;
      std::memcpy(got.bytes.data() + (t * shape.heads + h) * row, bytes.data() + at, row);
      std::memset(rest.data() + at, 0xFF, row);
    }
  const auto stray =
      std::find_if(rest.begin(), rest.end(), [](unsigned char x) { return x != 0xFF; });
  ASSERT_TRUE(stray == rest.end())
      << name << ": a byte outside the tensor's elements was written, at byte offset "
      << (stray - rest.begin()) - static_cast<int64_t>(kGuardBytes) << " from its start";

  const int64_t row_elems = int64_t{shape.heads} * shape.d;
  int64_t non_finite = 0, first = -1;
  for (int64_t i = 0; i < got.count(); ++i)
    if (!std::isfinite(jfa::tools::element_as_double(got, i)) && non_finite++ == 0) first = i;
  ASSERT_EQ(non_finite, 0) << name << ": elements unwritten (poison) or not finite, the first at "
                           << "token " << first / row_elems << " head "
                           << (first % row_elems) / shape.d;
  int64_t non_zero = 0;
  for (int64_t t : zero_tokens)
    for (int64_t e = 0; e < row_elems; ++e)
      if (jfa::tools::element_as_double(got, t * row_elems + e) != 0.0 && non_zero++ == 0)
        ADD_FAILURE() << name << ": token " << t << " has no visible key or query but element " << e
                      << " is " << jfa::tools::element_as_double(got, t * row_elems + e);
  EXPECT_EQ(non_zero, 0) << name << ": elements of rows that must be zero";
  *error = measure(got, ref);
}

// One problem on the device: random inputs, the CUDA forward's out and lse, the backward into
// guarded gradient buffers, and the reference on host copies of the same inputs.
class BackwardRunner {
 public:
  BackwardRunner(const Case& c, uint64_t seed) : c_(c), seed_(seed) {
    b_ = jfa::tools::make_batch(c.lq, c.lk, c.heads_q, c.heads_kv, c.head_dim, c.dtype, seed,
                                c.head_dim_v);
    std::mt19937_64 rng(seed ^ 0xbac4a2dULL);
    dout_ = HostBuffer(c.dtype, b_.total_q() * c.heads_q * b_.value_dim());
    jfa::tools::fill_normal(dout_, rng, c.dout_stddev);
    if (c.with_dlse) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      dlse_.resize(b_.total_q() * c.heads_q);
      for (float& x : dlse_) x = normal(rng);
    }
    const int32_t d = c.head_dim, dv = b_.value_dim();
    dout_shape_ = {b_.total_q(), c.heads_q, dv, {}};
    dq_shape_ = {b_.total_q(), c.heads_q, d, {}};
    dk_shape_ = {b_.total_k(), c.heads_kv, d, {}};
    dv_shape_ = {b_.total_k(), c.heads_kv, dv, {}};
    if (c.strided) {  // strides stay multiples of 8 elements, as the CUDA backend needs
      dout_shape_.layout = {int64_t{c.heads_q} * dv + 24, dv};
      dq_shape_.layout = {d, std::max<int64_t>(b_.total_q(), 1) * d};
      dk_shape_.layout = {int64_t{c.heads_kv} * (d + 8), d + 8};
      // dV goes out by TMA stores clipped at each sequence's end: head-major, three tokens of gap
      // between heads, which must stay untouched.
      dv_shape_.layout = {dv, (std::max<int64_t>(b_.total_k(), 1) + 3) * dv};
    }
  }

  // Uploads the inputs, runs the forward (out and lse) and copies its results back.
  void upload_and_forward() {
    q_ = upload(b_.q.data(), b_.q.bytes.size());
    k_ = upload(b_.k.data(), b_.k.bytes.size());
    v_ = upload(b_.v.data(), b_.v.bytes.size());
    const std::vector<unsigned char> dout = lay_out(dout_, dout_shape_);
    dout_dev_ = upload(dout.data(), dout.size());
    dlse_dev_ = upload(dlse_.data(), dlse_.size() * sizeof(float));
    sinks_dev_ = upload(c_.sinks.data(), c_.sinks.size() * sizeof(float));
    dsinks_ = DeviceBuffer(std::max<size_t>(c_.sinks.size() * sizeof(float), 16));
    cu_q_ = upload(b_.cu_q.data(), b_.cu_q.size() * sizeof(int32_t));
    cu_k_ = upload(b_.cu_k.data(), b_.cu_k.size() * sizeof(int32_t));
    out_ = DeviceBuffer(std::max<size_t>(b_.make_output().bytes.size(), 16));
    lse_ = DeviceBuffer(std::max<size_t>(b_.total_q() * c_.heads_q * sizeof(float), 16));
    const size_t es = jfa::dtype_size(c_.dtype);
    dq_ = DeviceBuffer(dq_shape_.span() * es + 2 * kGuardBytes);
    dk_ = DeviceBuffer(dk_shape_.span() * es + 2 * kGuardBytes);
    dv_ = DeviceBuffer(dv_shape_.span() * es + 2 * kGuardBytes);
    const jfa_attention_params p = forward_params();
    ASSERT_EQ(jfa_attention_forward(&p), JFA_SUCCESS) << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    download_forward();
  }

  jfa_attention_params forward_params() const {
    jfa_attention_params p =
        jfa::tools::call_params({q_.ptr, k_.ptr, v_.ptr, out_.ptr, lse_.as<float>(),
                                 cu_q_.as<int32_t>(), cu_k_.as<int32_t>()},
                                call_shape());
    set_options(&p, c_.sinks.empty() ? nullptr : sinks_dev_.as<float>());
    return p;
  }

  jfa_attention_backward_params params() const {
    jfa_attention_backward_params p;
    jfa_attention_backward_params_init(&p);
    p.forward = forward_params();
    p.dout = dout_dev_.ptr;
    p.dq = static_cast<unsigned char*>(dq_.ptr) + kGuardBytes;
    p.dk = static_cast<unsigned char*>(dk_.ptr) + kGuardBytes;
    p.dv = static_cast<unsigned char*>(dv_.ptr) + kGuardBytes;
    p.dout_layout = dout_shape_.layout;
    p.dq_layout = dq_shape_.layout;
    p.dk_layout = dk_shape_.layout;
    p.dv_layout = dv_shape_.layout;
    p.dlse = c_.with_dlse ? dlse_dev_.as<float>() : nullptr;
    p.deterministic = c_.deterministic ? 1 : 0;
    p.dsinks = c_.sinks.empty() ? nullptr : dsinks_.as<float>();
    return p;
  }

  // Fills the gradient buffers (guards included) with 0xFF, a NaN in every dtype, and waits.
  void poison_gradients() const {
    for (const DeviceBuffer* g : {&dq_, &dk_, &dv_, &dsinks_})
      if (cudaMemset(g->ptr, 0xFF, g->bytes) != cudaSuccess) ADD_FAILURE() << "cudaMemset failed";
    if (cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "cudaDeviceSynchronize failed";
  }

  // The forward's out and lse too, so that a graph replay must write them again.
  void poison_forward() const {
    for (const DeviceBuffer* g : {&out_, &lse_})
      if (cudaMemset(g->ptr, 0xFF, g->bytes) != cudaSuccess) ADD_FAILURE() << "cudaMemset failed";
    if (cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "cudaDeviceSynchronize failed";
  }

  Gradients download_gradients() const {
    Gradients g{download(dq_), download(dk_), download(dv_), {}};
    if (!c_.sinks.empty()) {
      const std::vector<unsigned char> bytes = download(dsinks_);
      g.dsinks.resize(c_.sinks.size());
      std::memcpy(g.dsinks.data(), bytes.data(), g.dsinks.size() * sizeof(float));
    }
    return g;
  }

  void download_forward() {
    const std::vector<unsigned char> out = download(out_), lse = download(lse_);
    out_host_ = b_.make_output();
    std::memcpy(out_host_.data(), out.data(), out_host_.bytes.size());
    lse_host_.resize(b_.total_q() * c_.heads_q);
    std::memcpy(lse_host_.data(), lse.data(), lse_host_.size() * sizeof(float));
  }

  // Poisons the gradients, runs the backward with `p`, waits and downloads the gradients.
  jfa_status run(Gradients* g, const jfa_attention_backward_params& p) const {
    poison_gradients();
    const jfa_status s = jfa_attention_backward(&p);
    if (s != JFA_SUCCESS) return s;
    if (cudaDeviceSynchronize() != cudaSuccess) return JFA_ERROR_CUDA;
    *g = download_gradients();
    return s;
  }
  jfa_status run(Gradients* g) const { return run(g, params()); }

  // New lengths with the same totals, written into the device offsets in place (a captured graph
  // reads them at replay).
  void change_lengths(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk) {
    const std::vector<int32_t> cu_q = jfa::lengths_to_offsets(lq),
                               cu_k = jfa::lengths_to_offsets(lk);
    ASSERT_EQ(cu_q.size(), b_.cu_q.size());
    ASSERT_EQ(cu_k.size(), b_.cu_k.size());
    ASSERT_EQ(cu_q.back(), b_.total_q());
    ASSERT_EQ(cu_k.back(), b_.total_k());
    c_.lq = b_.lengths_q = lq;
    c_.lk = b_.lengths_k = lk;
    b_.cu_q = cu_q;
    b_.cu_k = cu_k;
    JFA_CUDA_OK(cudaMemcpy(cu_q_.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
    JFA_CUDA_OK(cudaMemcpy(cu_k_.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
    have_reference_ = false;
  }

  // Checks the gradients in full against the float64 reference; prints the errors.
  void check(const Gradients& g) {
    SCOPED_TRACE(describe(c_) + " seed=" + std::to_string(seed_));
    if (!have_reference_) {
      ASSERT_NO_FATAL_FAILURE(compute_reference());
    }
    std::vector<int64_t> zero_q, zero_k;
    zero_rows(&zero_q, &zero_k);
    Error eq, ek, ev;
    ASSERT_NO_FATAL_FAILURE(check_gradient("dq", g.dq, dq_shape_, c_.dtype, ref_dq_, zero_q, &eq));
    ASSERT_NO_FATAL_FAILURE(check_gradient("dk", g.dk, dk_shape_, c_.dtype, ref_dk_, zero_k, &ek));
    ASSERT_NO_FATAL_FAILURE(check_gradient("dv", g.dv, dv_shape_, c_.dtype, ref_dv_, zero_k, &ev));
    const double l2 = l2_tolerance(c_.dtype), max = max_tolerance(c_.dtype);
    std::printf("  %s: L2/max rel err dq %.2g/%.2g dk %.2g/%.2g dv %.2g/%.2g (tol %.g/%.g)\n",
                describe(c_).c_str(), eq.l2, eq.max, ek.l2, ek.max, ev.l2, ev.max, l2, max);
    for (const auto& [name, e] : {std::pair{"dq", eq}, std::pair{"dk", ek}, std::pair{"dv", ev}}) {
      EXPECT_LE(e.l2, l2) << name << ": relative L2 error";
      EXPECT_LE(e.max, max) << name << ": largest error relative to the largest element";
    }
    // dsinks: a sum over every row of a head, each term within the dtype's error of its row.
    for (size_t h = 0; h < g.dsinks.size(); ++h) {
      const double ref = ref_dsinks_[h], got = g.dsinks[h];
      EXPECT_TRUE(std::isfinite(got)) << "dsinks[" << h << "]";
      EXPECT_LE(std::abs(got - ref), l2 * std::max(std::abs(ref), ref_dsinks_scale_) + 1e-4)
          << "dsinks[" << h << "] = " << got << ", reference " << ref;
    }
  }

 private:
  jfa::tools::CallShape call_shape() const {
    const auto dtype = static_cast<jfa_dtype>(c_.dtype);
    return {b_.batch(),  b_.total_q(), b_.total_k(), c_.heads_q,
            c_.heads_kv, c_.head_dim,  dtype,        c_.head_dim_v};
  }

  // `sinks`: the sinks in the call's memory (NULL without them).
  void set_options(jfa_attention_params* p, const float* sinks) const {
    p->causal = c_.causal ? 1 : 0;
    p->softmax_scale = c_.scale;
    p->window_left = c_.window_left;
    p->window_right = c_.window_right;
    p->softcap = c_.softcap;
    p->sinks = sinks;
    if (c_.hints && !c_.lq.empty()) {
      p->max_seqlen_q = *std::max_element(c_.lq.begin(), c_.lq.end());
      p->max_seqlen_k = *std::max_element(c_.lk.begin(), c_.lk.end());
    }
  }

  // The reference reads q, k, v, dout and dlse (it recomputes the softmax: out and lse are passed
  // as the device call had them, and ignored).
  void compute_reference() {
    jfa_attention_backward_params p;
    ASSERT_EQ(jfa_attention_backward_params_init(&p), JFA_SUCCESS);
    p.forward = jfa::tools::call_params({b_.q.data(), b_.k.data(), b_.v.data(), out_host_.data(),
                                         lse_host_.data(), b_.cu_q.data(), b_.cu_k.data()},
                                        call_shape());
    set_options(&p.forward, c_.sinks.empty() ? nullptr : c_.sinks.data());
    p.dout = dout_.data();
    p.dlse = c_.with_dlse ? dlse_.data() : nullptr;
    ref_dq_.assign(b_.total_q() * c_.heads_q * c_.head_dim, 0.0);
    ref_dk_.assign(b_.total_k() * c_.heads_kv * c_.head_dim, 0.0);
    ref_dv_.assign(b_.total_k() * c_.heads_kv * b_.value_dim(), 0.0);
    ref_dsinks_.assign(c_.sinks.size(), 0.0);
    ASSERT_EQ(jfa_attention_backward_reference_sinks(&p, ref_dq_.data(), ref_dk_.data(),
                                                     ref_dv_.data(), ref_dsinks_.data()),
              JFA_SUCCESS)
        << jfa_last_error_message();
    // The size of one row's sink term, the scale of dsinks' rounding error: rows x max |term|
    // is too loose, so the largest |dsinks| over the heads, and at least 1 / rows.
    ref_dsinks_scale_ = 1e-3;
    for (double x : ref_dsinks_) ref_dsinks_scale_ = std::max(ref_dsinks_scale_, std::abs(x));
    have_reference_ = true;
  }

  // Query tokens that see no key (zero dq rows) and key tokens no query sees (zero dk, dv rows).
  void zero_rows(std::vector<int64_t>* queries, std::vector<int64_t>* keys) const {
    for (int64_t s = 0; s < b_.batch(); ++s) {
      const int64_t lq = b_.lengths_q[s], lk = b_.lengths_k[s];
      const jfa::detail::Window window =
          jfa::detail::resolve_window(c_.causal, c_.window_left, c_.window_right);
      std::vector<bool> seen(static_cast<size_t>(lk), false);
      for (int64_t i = 0; i < lq; ++i) {
        if (!jfa::detail::sees_any_key(window, i, lq, lk)) queries->push_back(b_.cu_q[s] + i);
        for (int64_t j = jfa::detail::first_visible_key(window, i, lq, lk);
             j < jfa::detail::key_end(window, i, lq, lk); ++j)
          seen[static_cast<size_t>(j)] = true;
      }
      for (int64_t j = 0; j < lk; ++j)
        if (!seen[static_cast<size_t>(j)]) keys->push_back(b_.cu_k[s] + j);
    }
  }

  Case c_;
  uint64_t seed_;
  JaggedBatch b_;
  HostBuffer dout_, out_host_;
  std::vector<float> dlse_, lse_host_;
  DeviceBuffer sinks_dev_, dsinks_;
  std::vector<double> ref_dsinks_;
  double ref_dsinks_scale_ = 1e-3;
  Shape dout_shape_, dq_shape_, dk_shape_, dv_shape_;
  DeviceBuffer q_, k_, v_, dout_dev_, dlse_dev_, cu_q_, cu_k_, out_, lse_, dq_, dk_, dv_;
  bool have_reference_ = false;
  std::vector<double> ref_dq_, ref_dk_, ref_dv_;
};

// Forward, backward (library workspace, default stream) and the check against the reference.
void run_and_check(BackwardRunner& runner, Gradients* g) {
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  ASSERT_EQ(runner.run(g), JFA_SUCCESS) << jfa_last_error_message();
  runner.check(*g);
}

void run_case(const Case& c) {
  BackwardRunner runner(c, fresh_seed(describe(c).c_str()));
  Gradients g;
  run_and_check(runner, &g);
}

// Every combination of dtype, head sizes and mask (index bit 0: bf16, bit 1: causal, index / 4:
// kSizes' index, 32 .. 256 with 192/128 sixth); in quick mode only those whose index is listed.
// f(dtype, head_dim, causal, value head size).
template <typename F>
void for_each_combination(std::initializer_list<int> quick_picks, F&& f) {
  for (int combo = 0; combo < 4 * static_cast<int>(std::size(kSizes)); ++combo) {
    if (quick_mode() &&
        std::find(quick_picks.begin(), quick_picks.end(), combo) == quick_picks.end())
      continue;
    const auto [d, dv] = kSizes[combo / 4];
    f(kDtypes[combo & 1], d, (combo & 2) != 0, dv);
  }
}

// ---- Values against the reference -------------------------------------------------------------

// One sequence of each length at the edges of the 64- and 128-row tiles, and the empty one.
TEST(BackwardGpu, EdgeLengthsOneSequence) {
  const int32_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 129};
  // Quick mode: each length in one combination, the sizes and both masks and dtypes among them.
  for (int i = 0; i < 8; ++i)
    for_each_combination({(i & 3) + 4 * (i % 7)}, [&](DType dtype, int d, bool causal, int dv) {
      Case c;
      c.lq = c.lk = {lengths[i]};
      c.heads_q = c.heads_kv = 2;
      c.head_dim = d;
      c.head_dim_v = dv;
      c.dtype = dtype;
      c.causal = causal;
      run_case(c);
    });
}

// The edge lengths side by side in one batch, sequences starting mid-tile.
TEST(BackwardGpu, EdgeLengthsMixedBatch) {
  for_each_combination({4, 15, 8, 3, 18, 21, 25}, [&](DType dtype, int d, bool causal, int dv) {
    Case c;
    c.lq = c.lk = {0, 1, 63, 64, 65, 127, 128, 129, 2, 200, 0};
    c.heads_q = c.heads_kv = 3;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.dtype = dtype;
    c.causal = causal;
    run_case(c);
  });
}

// 4096 tokens: many K and Q tiles per sequence (long dq accumulation across key tiles), alone and
// among short sequences. Four heads keep the reference (one thread per sequence and kv head) short.
TEST(BackwardGpu, LongSequences) {
  if (quick_mode()) GTEST_SKIP() << "quick mode";
  Case c;
  c.lq = c.lk = {4096};
  c.heads_q = c.heads_kv = 4;
  c.head_dim = 128;
  c.causal = true;
  run_case(c);
  c.lq = c.lk = {129, 4096, 0, 1, 64};
  c.head_dim = 64;
  c.dtype = DType::kBFloat16;
  c.causal = false;
  run_case(c);
  // The sizes whose K tiles take the 64-byte swizzle.
  c.lq = c.lk = {4096, 65};
  c.head_dim = 96;
  c.causal = true;
  run_case(c);
  c.lq = c.lk = {3, 4096};
  c.head_dim = 32;
  c.dtype = DType::kFloat16;
  c.causal = false;
  run_case(c);
  // The sizes whose groups split the work by role, one K tile of 64 keys an item.
  c.lq = c.lk = {2000, 65};
  c.head_dim = 256;
  c.dtype = DType::kBFloat16;
  c.causal = true;
  run_case(c);
  c.lq = c.lk = {129, 2500};
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.causal = false;
  run_case(c);
}

// Query and key lengths that differ both ways (under the causal mask the first len_q - len_k rows
// see no key), queries without keys and keys without queries, with GQA.
TEST(BackwardGpu, CrossLengthsGqa) {
  for_each_combination({6, 13, 10, 1, 19, 20, 26}, [&](DType dtype, int d, bool causal, int dv) {
    Case c;
    c.lq = {1, 100, 300, 0, 64, 129, 5, 250};
    c.lk = {200, 17, 300, 50, 0, 64, 260, 129};
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.dtype = dtype;
    c.causal = causal;
    c.hints = causal;
    run_case(c);
  });
}

// Empty sides: no keys anywhere (dq all zeros, no dk/dv), no queries anywhere (dk and dv all
// zeros, no dq), both empty, and empty sequences between others.
TEST(BackwardGpu, EmptySequences) {
  struct Lengths {
    std::vector<int32_t> lq, lk;
  };
  const Lengths cases[] = {{{5, 130, 0}, {0, 0, 0}},
                           {{0, 0}, {3, 70}},
                           {{0, 0}, {0, 0}},
                           {{0, 7, 0, 66}, {9, 0, 0, 66}}};
  for (int d : kHeadDims)
    for (const Lengths& l : cases) {
      Case c;
      c.lq = l.lq;
      c.lk = l.lk;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim = d;
      c.causal = d == 128;
      run_case(c);
    }
}

// Grouped heads 16:4 and one kv head for 8 query heads: dk and dv sum over the group.
TEST(BackwardGpu, GqaAndMqa) {
  for (int d : kHeadDims)
    for (bool mqa : {false, true}) {
      if (quick_mode() && mqa != (d == 64)) continue;
      Case c;
      c.lq = quick_mode() ? std::vector<int32_t>{130, 1, 64}
                          : std::vector<int32_t>{300, 513, 77, 700, 1};
      c.lk = c.lq;
      if (!mqa) std::reverse(c.lk.begin(), c.lk.end());  // cross lengths
      c.heads_q = mqa ? 8 : 16;
      c.heads_kv = mqa ? 1 : 4;
      c.head_dim = d;
      c.dtype = mqa ? DType::kBFloat16 : DType::kFloat16;
      c.causal = mqa;
      run_case(c);
    }
}

// ---- Head splits -------------------------------------------------------------------------------

size_t backward_workspace_bytes(const jfa_attention_backward_params& p) {
  size_t bytes = 0;
  EXPECT_EQ(jfa_attention_backward_workspace_size(&p, &bytes), JFA_SUCCESS)
      << jfa_last_error_message();
  return bytes;
}

// The workspace the same call would ask for in deterministic mode, which never splits: no
// accumulators.
size_t unsplit_workspace_bytes(jfa_attention_backward_params p) {
  p.deterministic = 1;
  return backward_workspace_bytes(p);
}

// Grouped heads in batches whose (K tile, kv head) items cannot fill the GPU: each item is a slice
// of its group's query heads, and the slices' dK and dV meet in float32
// accumulators. GQA 8:2 and 16:2 and MQA 8:1 at every head size, both dtypes and masks, cross
// lengths, empty and one-token sequences, shared tiles, dlse, strided gradients: the workspace
// asked for grows by the accumulators (the call splits), and the gradients match the reference.
TEST(BackwardGpu, HeadSplitsMatchReference) {
  std::mt19937_64 rng(fresh_seed("head-split lengths"));
  constexpr std::pair<int32_t, int32_t> kGroups[] = {{8, 2}, {16, 2}, {8, 1}};
  int k = 0;
  for_each_combination({1, 6, 11, 16, 21, 27}, [&](DType dtype, int d, bool causal, int dv) {
    ++k;
    Case c;
    c.lq = {300, 0, 513, 1, 77, 700};
    c.lk = c.lq;
    if (k % 3 == 0) std::reverse(c.lk.begin(), c.lk.end());  // cross lengths
    if (k % 4 == 1)  // runs of short sequences: shared tiles
      for (int32_t len : random_lengths(rng, 40, 0, 30)) {
        c.lq.push_back(len);
        c.lk.push_back(len);
      }
    c.heads_q = kGroups[k % 3].first;
    c.heads_kv = kGroups[k % 3].second;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.dtype = dtype;
    c.causal = causal;
    c.with_dlse = k % 5 == 0;
    c.strided = k % 4 == 2;
    SCOPED_TRACE(describe(c));
    BackwardRunner runner(c, fresh_seed(describe(c).c_str()));
    Gradients g;
    ASSERT_NO_FATAL_FAILURE(run_and_check(runner, &g));
    EXPECT_GT(backward_workspace_bytes(runner.params()), unsplit_workspace_bytes(runner.params()))
        << "no head splits: the case does not test them";
  });
}

// Thousands of sequences of 1 to 16 tokens: many sequences per tile, at every head size (each
// with one mask and one dtype, both masks and dtypes over the sizes).
TEST(BackwardGpu, ManyTinySequences) {
  std::mt19937_64 rng(fresh_seed("tiny backward lengths"));
  for (int i = 0; i < static_cast<int>(std::size(kHeadDims)); ++i) {
    const bool causal = (i & 1) != 0;
    Case c;
    c.lq = random_lengths(rng, quick_mode() ? 300 : 4096, 1, 16);
    c.lk = causal ? c.lq : random_lengths(rng, static_cast<int>(c.lq.size()), 1, 16);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = kHeadDims[i];
    c.dtype = (i & 2) != 0 ? DType::kFloat16 : DType::kBFloat16;
    c.causal = causal;
    run_case(c);
  }
}

// Runs of short sequences share a work item (at most 128 keys and 128 query rows): lengths 0 to 80,
// query and key lengths equal or drawn apart, a sequence whose K tiles are its own in the middle
// of a run, one with more query rows than a shared tile holds but few keys, and GQA; in every
// combination of dtype, head_dim and mask.
TEST(BackwardGpu, SharedTilesOfShortSequences) {
  std::mt19937_64 rng(fresh_seed("shared-tile backward lengths"));
  for_each_combination({5, 14, 0, 11, 17, 22, 24}, [&](DType dtype, int d, bool causal, int dv) {
    Case c;
    const int n = quick_mode() ? 60 : 400;
    c.lq = random_lengths(rng, n, 0, 80);
    c.lk = (rng() % 2) ? c.lq : random_lengths(rng, n, 0, 80);
    c.lq[n / 2] = c.lk[n / 2] = 300;
    c.lq[n / 3] = 129;
    c.lk[n / 3] = 20;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.dtype = dtype;
    c.causal = causal;
    run_case(c);
  });
}

// Shared tiles among long sequences (the mean length above one q tile, so head_dim 64 takes two q
// tiles per step): their rows' dQ is stored, the other rows' added, also into strided layouts.
TEST(BackwardGpu, SharedTilesAmongLongSequences) {
  std::mt19937_64 rng(fresh_seed("shared tiles among long sequences"));
  for_each_combination({4, 12, 9, 2, 16, 23, 27}, [&](DType dtype, int d, bool causal, int dv) {
    Case c;
    for (int run = 0; run < (quick_mode() ? 3 : 8); ++run) {
      for (int32_t len : random_lengths(rng, 6, 0, 40)) c.lq.push_back(len);
      c.lq.push_back(std::uniform_int_distribution<int32_t>(450, 600)(rng));  // mean above 64
    }
    c.lk = c.lq;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.dtype = dtype;
    c.causal = causal;
    c.strided = causal;
    run_case(c);
  });
}

// A loss that also uses the forward's LSE: dlse enters dq and dk (not dv); rows without keys
// (lse = -inf) ignore it.
TEST(BackwardGpu, LseGradient) {
  for (int d : kHeadDims) {
    Case c;
    c.lq = {90, 1, 200, 0, 65};
    c.lk = {40, 70, 200, 9, 129};
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = d;
    c.dtype = d == 64 ? DType::kFloat16 : DType::kBFloat16;
    c.causal = d == 64;
    c.with_dlse = true;
    run_case(c);
  }
}

// Large output gradients in fp16 (dout with standard deviation 3000): dP - D then exceeds fp16's
// range on some elements (up to ~1.6e5) while dS = P (dP - D) and every gradient stay inside it
// (|dS| up to ~4e4, on causal rows with few keys), so dS must be formed in float32 before it is
// rounded to fp16.
TEST(BackwardGpu, LargeOutputGradientsInFp16) {
  for (int d : kHeadDims)
    for (bool causal : {false, true}) {
      if (quick_mode() && causal != (d == 64)) continue;
      Case c;
      c.lq = c.lk = {300, 77, 129};
      c.head_dim = d;
      c.causal = causal;
      c.dout_stddev = 3000.0f;
      ASSERT_NO_FATAL_FAILURE(run_case(c));
    }
}

// dout with padded token rows, dq head-major, dk with padding after every head (dv packed), and a
// softmax scale of the caller's.
TEST(BackwardGpu, StridedGradientLayouts) {
  for (int d : kHeadDims) {
    Case c;
    c.lq = {77, 300, 1, 128};
    c.lk = {150, 300, 40, 1};
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = d;
    c.dtype = d == 64 ? DType::kBFloat16 : DType::kFloat16;
    c.causal = d == 128;
    c.strided = true;
    c.scale = 0.3f;
    run_case(c);
  }
}

TEST(BackwardGpu, RandomBatchesFreshSeeds) {
  std::mt19937_64 rng(fresh_seed("random backward shapes"));
  for (int i = 0, n = quick_mode() ? 2 : 8; i < n; ++i) {
    Case c;
    const int batch = std::uniform_int_distribution<int>(1, 10)(rng);
    c.lq = random_lengths(rng, batch, 0, 400);
    c.lk = (rng() % 2) ? c.lq : random_lengths(rng, batch, 0, 400);
    c.heads_kv = std::uniform_int_distribution<int>(1, 3)(rng);
    c.heads_q = c.heads_kv * std::uniform_int_distribution<int>(1, 4)(rng);
    c.head_dim = kHeadDims[rng() % std::size(kHeadDims)];
    c.dtype = kDtypes[rng() % 2];
    c.causal = rng() % 2;
    c.with_dlse = rng() % 2;
    c.hints = rng() % 2;
    if (rng() % 3 == 0) c.scale = 0.25f;
    run_case(c);
  }
}

// ---- Determinism, workspace, graphs -------------------------------------------------------------

// Three runs of a deterministic case give the same bits, and the first matches the reference.
void expect_bit_identical_runs(const Case& c) {
  BackwardRunner runner(c, fresh_seed(describe(c).c_str()));
  Gradients first;
  ASSERT_NO_FATAL_FAILURE(run_and_check(runner, &first));
  for (int run = 2; run <= 3; ++run) {
    Gradients again;
    ASSERT_EQ(runner.run(&again), JFA_SUCCESS) << jfa_last_error_message();
    EXPECT_TRUE(first.dq == again.dq) << "dq of run " << run << " differs from run 1";
    EXPECT_TRUE(first.dk == again.dk) << "dk of run " << run << " differs from run 1";
    EXPECT_TRUE(first.dv == again.dv) << "dv of run " << run << " differs from run 1";
    EXPECT_TRUE(first.dsinks == again.dsinks) << "dsinks of run " << run << " differs from run 1";
  }
}

// deterministic=1: three runs give the same bits (GQA and long sequences, where dk/dv sum over
// query heads and dq over key tiles), and the values match the reference.
TEST(BackwardGpu, DeterministicRunsAreBitIdentical) {
  for (int d : kHeadDims) {
    Case c;
    c.lq = quick_mode() ? std::vector<int32_t>{300, 37, 0, 200}
                        : std::vector<int32_t>{700, 37, 0, 900};
    c.lk = c.lq;
    if (d == 128) std::rotate(c.lk.begin(), c.lk.begin() + 1, c.lk.end());
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_dim = d;
    c.dtype = d == 64 ? DType::kFloat16 : DType::kBFloat16;
    c.causal = d == 64;
    c.with_dlse = d == 128;
    c.deterministic = true;
    expect_bit_identical_runs(c);
  }
}

// deterministic=1 gives the same bits whether or not the max_seqlen hints are passed: at head_dim
// 32 and 64 the step shape (one q tile or two, which sum in different orders) is chosen from the
// shapes, not from the hint. One long sequence among many short ones sets the hint and the mean
// length on different sides of one tile.
TEST(BackwardGpu, DeterministicBitsDoNotDependOnHints) {
  for (int d : {32, 64})
    for (bool causal : {false, true}) {
      Case c;
      c.lq = {200, 1, 3, 1, 2};
      c.lk = c.lq;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim = d;
      c.causal = causal;
      c.deterministic = true;
      const uint64_t seed = fresh_seed(describe(c).c_str());
      Gradients with_hints, without;
      c.hints = true;
      BackwardRunner hinted(c, seed);
      ASSERT_NO_FATAL_FAILURE(run_and_check(hinted, &with_hints));
      c.hints = false;
      BackwardRunner plain(c, seed);
      ASSERT_NO_FATAL_FAILURE(run_and_check(plain, &without));
      EXPECT_TRUE(with_hints.dq == without.dq) << "dq depends on the hints";
      EXPECT_TRUE(with_hints.dk == without.dk) << "dk depends on the hints";
      EXPECT_TRUE(with_hints.dv == without.dv) << "dv depends on the hints";
    }
}

// The shape of the workspace tests: GQA, causal, cross lengths, deterministic so that results can
// be compared bit for bit.
Case workspace_case() {
  Case c;
  c.lq = {70, 0, 300, 1, 129};
  c.lk = {70, 5, 257, 1, 129};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 128;
  c.causal = true;
  c.deterministic = true;
  return c;
}

// deterministic=1 under the causal mask, where the K tiles walk up from their diagonals and add in
// descending order, and without it: key prefixes longer than the queries (K tiles every row sees),
// queries longer than the keys (rows that see none), lengths that end in the first or second q
// tile of a step, GQA; three runs give the same bits and match the reference.
TEST(BackwardGpu, DeterministicCrossLengths) {
  for (const auto& [d, dv] : kSizes)
    for (bool causal : {true, false}) {
      Case c = workspace_case();
      c.lq = {100, 700, 5, 300, 64, 65};
      c.lk = {900, 200, 5, 310, 1, 191};
      c.head_dim = d;
      c.head_dim_v = dv;
      c.causal = causal;
      expect_bit_identical_runs(c);
    }
}

// deterministic=1 with shared tiles among sequences of their own K tiles: three runs give the same
// bits and match the reference.
TEST(BackwardGpu, DeterministicSharedTiles) {
  std::mt19937_64 rng(fresh_seed("deterministic shared-tile lengths"));
  for (int d : kHeadDims)
    for (bool causal : {false, true}) {
      Case c;
      c.lq = random_lengths(rng, 120, 0, 70);
      c.lk = causal ? c.lq : random_lengths(rng, 120, 0, 70);
      c.lq[40] = c.lk[40] = 500;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim = d;
      c.dtype = causal ? DType::kBFloat16 : DType::kFloat16;
      c.causal = causal;
      c.deterministic = true;
      expect_bit_identical_runs(c);
    }
}

// A caller's workspace of exactly the size asked for (with stale contents) gives the gradients of
// the library's own workspace, and the call then allocates nothing.
// The runner's backward into the poisoned gradients with a caller's workspace of `bytes` (stale
// contents), which must allocate nothing; the gradients as downloaded.
void run_with_callers_workspace(const BackwardRunner& runner, size_t bytes, Gradients* g) {
  jfa_attention_backward_params p = runner.params();
  DeviceBuffer workspace(bytes);
  JFA_CUDA_OK(cudaMemset(workspace.ptr, 0xA5, bytes));  // stale contents must not matter
  p.forward.workspace = workspace.ptr;
  p.forward.workspace_bytes = bytes;
  runner.poison_gradients();
  ASSERT_EQ(default_pool_peak(/*reset=*/true), 0u);
  ASSERT_EQ(jfa_attention_backward(&p), JFA_SUCCESS) << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(default_pool_peak(/*reset=*/false), 0u) << "a call with a workspace allocated memory";
  *g = runner.download_gradients();
}

TEST(BackwardGpuApi, CallerWorkspaceGivesTheSameGradients) {
  const Case c = workspace_case();
  BackwardRunner runner(c, fresh_seed("backward workspace"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  Gradients own;
  ASSERT_EQ(runner.run(&own), JFA_SUCCESS) << jfa_last_error_message();
  runner.check(own);

  const size_t bytes = backward_workspace_bytes(runner.params());
  ASSERT_GT(bytes, 0u) << "the CUDA backward reported no workspace";
  Gradients given;
  ASSERT_NO_FATAL_FAILURE(run_with_callers_workspace(runner, bytes, &given));
  EXPECT_TRUE(own.dq == given.dq && own.dk == given.dk && own.dv == given.dv)
      << "the caller's workspace changed the gradients";
}

// A caller's workspace sized without the accumulators (here: as for deterministic mode) runs the
// same call unsplit, matching the reference, and allocates nothing; one of the size asked for runs
// split and allocates nothing either.
TEST(BackwardGpuApi, HeadSplitsWithTheCallersWorkspace) {
  Case c = workspace_case();
  c.heads_q = 8;
  c.deterministic = false;
  BackwardRunner runner(c, fresh_seed("head-split workspace"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  const size_t unsplit = unsplit_workspace_bytes(runner.params());
  const size_t split = backward_workspace_bytes(runner.params());
  ASSERT_GT(split, unsplit);
  for (size_t bytes : {unsplit, split}) {
    SCOPED_TRACE(bytes == split ? "sized for head splits" : "sized without them");
    Gradients given;
    ASSERT_NO_FATAL_FAILURE(run_with_callers_workspace(runner, bytes, &given));
    runner.check(given);
  }
}

// A stale workspace (every byte 0x7F: 3.4e38 as a float32 of the dQ accumulator) must not reach
// the gradients where shared tiles copy their rows' dQ into the accumulator, whose rows the
// preprocess then leaves uncleared: head_dim 64 with one-tile steps (the two groups' parts of one
// q tile, copied then added) and with two-tile steps (one q tile per group), both without the
// deterministic order.
TEST(BackwardGpuApi, StaleWorkspaceDoesNotReachSharedTiles) {
  std::mt19937_64 rng(fresh_seed("stale workspace, shared tiles"));
  for (const bool two_tile_steps : {false, true}) {
    SCOPED_TRACE(two_tile_steps ? "two-tile steps" : "one-tile steps");
    Case c;
    c.lq = random_lengths(rng, 40, 0, 40);
    if (two_tile_steps) c.lq.push_back(3000);  // the mean length above one q tile
    c.lk = c.lq;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 64;
    c.causal = two_tile_steps;
    BackwardRunner runner(c, fresh_seed(describe(c).c_str()));
    ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
    jfa_attention_backward_params p = runner.params();
    size_t bytes = 0;
    ASSERT_EQ(jfa_attention_backward_workspace_size(&p, &bytes), JFA_SUCCESS)
        << jfa_last_error_message();
    DeviceBuffer workspace(bytes);
    JFA_CUDA_OK(cudaMemset(workspace.ptr, 0x7F, bytes));
    p.forward.workspace = workspace.ptr;
    p.forward.workspace_bytes = bytes;
    Gradients g;
    ASSERT_EQ(runner.run(&g, p), JFA_SUCCESS) << jfa_last_error_message();
    runner.check(g);
  }
}

// A kept jfa_workspace prepared for the forward is grown for the backward (which needs more) and
// then serves both; a too-small caller workspace is rejected naming the backward's size query.
TEST(BackwardGpuApi, KeptWorkspaceServesForwardAndBackward) {
  const Case c = workspace_case();
  BackwardRunner runner(c, fresh_seed("kept backward workspace"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  Gradients own;
  ASSERT_EQ(runner.run(&own), JFA_SUCCESS) << jfa_last_error_message();
  jfa_attention_backward_params p = runner.params();
  jfa_workspace* ws = nullptr;
  ASSERT_EQ(jfa_workspace_create(&ws), JFA_SUCCESS);
  ASSERT_EQ(jfa_workspace_prepare(ws, &p.forward), JFA_SUCCESS) << jfa_last_error_message();
  const size_t forward_bytes = p.forward.workspace_bytes;
  EXPECT_EQ(jfa_attention_backward(&p), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("jfa_attention_backward_workspace_size"),
            std::string::npos)
      << jfa_last_error_message();
  ASSERT_EQ(jfa_workspace_prepare_backward(ws, &p), JFA_SUCCESS) << jfa_last_error_message();
  size_t needed = 0;
  ASSERT_EQ(jfa_attention_backward_workspace_size(&p, &needed), JFA_SUCCESS);
  EXPECT_GE(p.forward.workspace_bytes, needed);
  EXPECT_GT(p.forward.workspace_bytes, forward_bytes);
  runner.poison_gradients();
  ASSERT_EQ(jfa_attention_backward(&p), JFA_SUCCESS) << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  runner.check(runner.download_gradients());
  EXPECT_EQ(jfa_workspace_destroy(ws), JFA_SUCCESS);
}

// The checked mode on the backward: valid offsets give 0, broken ones their bits, also when no
// list kernel runs (no keys anywhere).
// The backward with `p` in the checked mode (the word `word`): its word, the gradients in *g.
int32_t run_checked(const BackwardRunner& runner, jfa_attention_backward_params p, Gradients* g,
                    const DeviceBuffer& word) {
  return jfa::gpu_test::device_check_after(word, [&](int32_t* w) {
    p.forward.device_check = w;
    EXPECT_EQ(runner.run(g, p), JFA_SUCCESS) << jfa_last_error_message();
  });
}

TEST(BackwardGpuApi, CheckedModeReportsInvalidDeviceOffsets) {
  Case c = workspace_case();
  BackwardRunner runner(c, fresh_seed("backward checked offsets"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  DeviceBuffer word(sizeof(int32_t));
  Gradients g;
  const jfa_attention_backward_params valid = runner.params();
  EXPECT_EQ(run_checked(runner, valid, &g, word), 0);
  // q offsets that decrease and end past total_q.
  std::vector<int32_t> bad(static_cast<size_t>(valid.forward.batch) + 1, 0);
  for (size_t i = 1; i < bad.size(); ++i) bad[i] = static_cast<int32_t>(bad.size() - i) * 3;
  DeviceBuffer bad_q = upload(bad.data(), bad.size() * sizeof(int32_t));
  jfa_attention_backward_params broken = valid;
  broken.forward.cu_seqlens_q = bad_q.as<int32_t>();
  const int32_t got = run_checked(runner, broken, &g, word);
  EXPECT_NE(got & JFA_OFFSETS_Q_DECREASING, 0) << jfa_device_check_message(got);
  EXPECT_EQ(got & 0xF0, 0) << "the k offsets are valid: " << jfa_device_check_message(got);
}

// The gradient elements of fp16 buffers (guards left out) that are NaN or infinite.
int64_t non_finite_fp16(const Gradients& g) {
  int64_t n = 0;
  for (const auto* bytes : {&g.dq, &g.dk, &g.dv})
    for (size_t i = kGuardBytes; i + kGuardBytes < bytes->size(); i += 2) {
      const uint16_t bits = static_cast<uint16_t>((*bytes)[i] | ((*bytes)[i + 1] << 8));
      n += (bits & 0x7C00u) == 0x7C00u ? 1 : 0;
    }
  return n;
}

// The checked mode's JFA_CHECK_RESULT_NOT_FINITE in the backward: gradients beyond fp16 (dO of
// 60000 everywhere sums to more than 65504 in dV), and an lse that is not finite in a row that
// sees keys; never for finite gradients.
TEST(BackwardGpuApi, CheckedModeReportsGradientsThatAreNotFinite) {
  const Case c = workspace_case();
  ASSERT_EQ(c.dtype, DType::kFloat16);
  ASSERT_FALSE(c.strided);
  BackwardRunner runner(c, fresh_seed("backward results not finite"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  DeviceBuffer word(sizeof(int32_t));
  const jfa_attention_backward_params valid = runner.params();
  Gradients g;
  EXPECT_EQ(run_checked(runner, valid, &g, word), 0);
  EXPECT_EQ(non_finite_fp16(g), 0);

  const int64_t n = valid.forward.total_q * c.heads_q * c.head_dim;
  HostBuffer big(DType::kFloat16, n);
  for (int64_t i = 0; i < n; ++i)
    jfa::detail::store_from_float(big.data(), i, JFA_DTYPE_FLOAT16, 60000.f);
  DeviceBuffer big_dout = upload(big.data(), big.bytes.size());
  jfa_attention_backward_params overflow = valid;
  overflow.dout = big_dout.ptr;
  int32_t got = run_checked(runner, overflow, &g, word);
  EXPECT_GT(non_finite_fp16(g), 0) << "no gradient overflowed: the case does not test what it says";
  EXPECT_EQ(got, JFA_CHECK_RESULT_NOT_FINITE) << jfa_device_check_message(got);

  // Rows that see keys with an lse that is NaN, or -inf (what a forward writes when every scaled
  // score is below float32's range); the valid run above had rows without keys at -inf (causal,
  // len_q > len_k), which must not count.
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -INFINITY}) {
    SCOPED_TRACE("lse " + std::to_string(bad));
    JFA_CUDA_OK(cudaMemcpy(valid.forward.lse, &bad, sizeof bad, cudaMemcpyHostToDevice));
    got = run_checked(runner, valid, &g, word);
    EXPECT_EQ(got, JFA_CHECK_RESULT_NOT_FINITE) << jfa_device_check_message(got);
    EXPECT_EQ(non_finite_fp16(g), 0) << "a row whose lse is not finite adds nothing";
  }
}

// A workspace one byte short of the size asked for, or not 16-byte aligned, is rejected before
// anything is written.
TEST(BackwardGpuApi, TooSmallOrMisalignedWorkspaceIsRejected) {
  const Case c = workspace_case();
  BackwardRunner runner(c, fresh_seed("backward workspace rejected"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  jfa_attention_backward_params p = runner.params();
  size_t bytes = 0;
  ASSERT_EQ(jfa_attention_backward_workspace_size(&p, &bytes), JFA_SUCCESS)
      << jfa_last_error_message();
  ASSERT_GT(bytes, 0u) << "the CUDA backward reported no workspace";
  DeviceBuffer exact(bytes), roomy(bytes + 16);
  struct Bad {
    void* ptr;
    size_t bytes;
    const char* what;
  };
  const Bad bad[] = {{exact.ptr, bytes - 1, "one byte too small"},
                     {static_cast<char*>(roomy.ptr) + 8, bytes, "8-byte aligned"}};
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    p.forward.workspace = b.ptr;
    p.forward.workspace_bytes = b.bytes;
    Gradients g;
    EXPECT_EQ(runner.run(&g, p), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find("workspace"), std::string::npos)
        << jfa_last_error_message();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(all_poison(runner.download_gradients())) << "a rejected call wrote a gradient";
  }
}

// A stream, a graph captured on it and its executable, released however the test ends.
struct CapturedGraph {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~CapturedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
  }
};

// Forward and backward captured once, with caller workspaces; replays follow the device offsets:
// new lengths (same totals) written in place give the gradients of the new lengths.
class BackwardGraph : public ::testing::TestWithParam<int> {};

TEST_P(BackwardGraph, ReplaysWithNewLengths) {
  Case c;
  c.lq = {100, 200, 50};
  c.lk = {80, 230, 64};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = GetParam();
  c.dtype = DType::kBFloat16;
  c.causal = true;
  c.with_dlse = true;
  BackwardRunner runner(c, fresh_seed("backward graph"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());

  CapturedGraph g;
  JFA_CUDA_OK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  jfa_attention_params fp = runner.forward_params();
  jfa_attention_backward_params bp = runner.params();
  size_t forward_bytes = 0, backward_bytes = 0;
  ASSERT_EQ(jfa_attention_workspace_size(&fp, &forward_bytes), JFA_SUCCESS);
  ASSERT_EQ(jfa_attention_backward_workspace_size(&bp, &backward_bytes), JFA_SUCCESS);
  DeviceBuffer forward_workspace(forward_bytes), backward_workspace(backward_bytes);
  fp.stream = bp.forward.stream = g.stream;
  fp.workspace = forward_workspace.ptr;
  fp.workspace_bytes = forward_bytes;
  bp.forward.workspace = backward_workspace.ptr;
  bp.forward.workspace_bytes = backward_bytes;
  JFA_CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
  jfa_status s = jfa_attention_forward(&fp);
  if (s == JFA_SUCCESS) s = jfa_attention_backward(&bp);
  const std::string message = jfa_last_error_message();
  JFA_CUDA_OK(cudaStreamEndCapture(g.stream, &g.graph));
  ASSERT_EQ(s, JFA_SUCCESS) << message;
  JFA_CUDA_OK(cudaGraphInstantiate(&g.exec, g.graph, 0));

  auto replay_and_check = [&] {
    runner.poison_forward();
    runner.poison_gradients();
    JFA_CUDA_OK(cudaGraphLaunch(g.exec, g.stream));
    JFA_CUDA_OK(cudaStreamSynchronize(g.stream));
    runner.download_forward();
    runner.check(runner.download_gradients());
  };
  ASSERT_NO_FATAL_FAILURE(replay_and_check());
  // A sequence with keys and no query (zero dk/dv rows), one with more queries than keys.
  ASSERT_NO_FATAL_FAILURE(runner.change_lengths({0, 250, 100}, {230, 64, 80}));
  ASSERT_NO_FATAL_FAILURE(replay_and_check());
}

INSTANTIATE_TEST_SUITE_P(BackwardGpu, BackwardGraph, ::testing::ValuesIn(kHeadDims));

// ---- Rejections ---------------------------------------------------------------------------------

// Valid calls the CUDA backward does not take: JFA_ERROR_UNSUPPORTED with a message, nothing
// written.
TEST(BackwardGpuApi, UnsupportedCombinationsAreReported) {
  Case c;
  c.lq = c.lk = {10};
  c.heads_q = c.heads_kv = 3;  // 384 elements a token: room for two heads of 160
  c.head_dim = 128;
  BackwardRunner runner(c, fresh_seed("backward unsupported"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  Gradients g;

  // head_dim 80 (the CPU backend's) over the strides of the 128-wide buffers, so every view stays
  // inside them.
  jfa_attention_backward_params p = runner.params();
  p.forward.head_dim = 80;
  const jfa_tensor_layout wide = {3 * 128, 128};
  p.forward.q_layout = p.forward.k_layout = p.forward.v_layout = p.forward.out_layout = wide;
  p.dout_layout = p.dq_layout = p.dk_layout = p.dv_layout = wide;
  EXPECT_EQ(runner.run(&g, p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("head_dim"), std::string::npos)
      << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poison(runner.download_gradients())) << "head_dim 80 wrote a gradient";

  // head_dim 160 (the CPU backend's) in two heads over the three of 128 of each token.
  p = runner.params();
  p.forward.head_dim = 160;
  p.forward.heads_q = p.forward.heads_kv = 2;
  const jfa_tensor_layout wide160 = {3 * 128, 160};
  p.forward.q_layout = p.forward.k_layout = p.forward.v_layout = p.forward.out_layout = wide160;
  p.dout_layout = p.dq_layout = p.dk_layout = p.dv_layout = wide160;
  EXPECT_EQ(runner.run(&g, p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message())
                .find("the CUDA backward takes head_dim 32, 64, 96, 128, 192, 192/128 and 256"),
            std::string::npos)
      << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poison(runner.download_gradients())) << "head_dim 160 wrote a gradient";

  // float32 (a CPU dtype): twice the bytes of an element, so half the tokens.
  for (jfa_backend backend : {JFA_BACKEND_AUTO, JFA_BACKEND_CUDA}) {
    p = runner.params();
    p.forward.backend = backend;
    p.forward.dtype = JFA_DTYPE_FLOAT32;
    p.forward.total_q = p.forward.total_k = 5;
    EXPECT_EQ(runner.run(&g, p), JFA_ERROR_UNSUPPORTED) << "backend " << backend;
    EXPECT_STRNE(jfa_last_error_message(), "");
    JFA_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(all_poison(runner.download_gradients())) << "float32 wrote a gradient";
  }
}

// A value head size the CUDA backward has no kernel for (256 with 128; the CPU backend takes it):
// the sizes arrive in the backward's Params and are reported, nothing written. The buffers are
// those of a 256/256 forward, so the 128 columns of v, out, dout and dv stay inside them.
TEST(BackwardGpuApi, UnbuiltValueHeadSizeIsUnsupported) {
  Case c;
  c.lq = c.lk = {10, 0, 3};
  c.head_dim = 256;
  BackwardRunner runner(c, fresh_seed("backward 256/128 unsupported"));
  ASSERT_NO_FATAL_FAILURE(runner.upload_and_forward());
  Gradients g;
  jfa_attention_backward_params p = runner.params();
  p.forward.head_dim_v = 128;
  const jfa_tensor_layout wide = {2 * 256, 256};  // packed 256-column rows of 2 heads
  p.forward.q_layout = p.forward.k_layout = p.forward.v_layout = p.forward.out_layout = wide;
  p.dout_layout = p.dq_layout = p.dk_layout = p.dv_layout = wide;
  EXPECT_EQ(runner.run(&g, p), JFA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(jfa_last_error_message()).find("head_dim 256 with value head size 128"),
            std::string::npos)
      << jfa_last_error_message();
  JFA_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poison(runner.download_gradients())) << "256/128 wrote a gradient";
}

// The local-attention cases (kLocalKinds: windows at their edges, softcap, sinks with dsinks, all
// together), every head size and both dtypes, on edge lengths, cross lengths with long sequences
// (whole K tiles outside every window), GQA, and tiles shared by short sequences, in both the
// default and the deterministic mode, against the float64 reference.
TEST(BackwardGpu, LocalAttentionMatchesReference) {
  std::mt19937_64 rng(fresh_seed("local attention backward"));
  std::normal_distribution<float> logit(0.f, 1.f);
  int combo = 0;
  for (const auto& [d, dv] : kSizes)
    for (DType dt : kDtypes)
      for (size_t k = 0; k < std::size(jfa::gpu_test::kLocalKinds); ++k, ++combo) {
        if (quick_mode() && combo % 5 != 0) continue;
        const jfa::gpu_test::LocalKind& l = jfa::gpu_test::kLocalKinds[k];
        Case c;
        c.head_dim = d;
        c.head_dim_v = dv == d ? 0 : dv;
        c.dtype = dt;
        c.causal = l.causal;
        c.window_left = l.left;
        c.window_right = l.right;
        c.softcap = l.softcap;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.deterministic = combo % 2 == 0;
        for (int h = 0; l.sink_sd > 0.f && h < c.heads_q; ++h)
          c.sinks.push_back(l.sink_sd * logit(rng));
        c.with_dlse = !c.sinks.empty();
        c.lq = c.lk = {0, 1, 63, 64, 65, 127, 129, 300};
        ASSERT_NO_FATAL_FAILURE(run_case(c));
        c.lq = {1, 700, 300, 0, 64, 129};
        c.lk = {200, 517, 300, 50, 0, 64};
        ASSERT_NO_FATAL_FAILURE(run_case(c));
        c.lq = c.lk = random_lengths(rng, 150, 0, 40);
        ASSERT_NO_FATAL_FAILURE(run_case(c));
      }
}

// Deterministic mode under windows: bit-identical gradients run after run, also where the adds
// to a q tile go in descending order (a right bound) and where they ascend (none).
TEST(BackwardGpu, LocalAttentionDeterministicRunsAreBitIdentical) {
  std::mt19937_64 rng(fresh_seed("local attention deterministic"));
  for (const auto& [left, right, causal] :
       {std::tuple{200, -1, false}, std::tuple{130, 0, true}, std::tuple{100, 300, false}}) {
    Case c;
    c.lq = c.lk = random_lengths(rng, 6, 100, 900);
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = 128;
    c.causal = causal;
    c.window_left = left;
    c.window_right = right;
    c.softcap = 1.f;
    c.sinks = {0.5f, -1.f, 2.f, 0.f};
    c.deterministic = true;
    ASSERT_NO_FATAL_FAILURE(expect_bit_identical_runs(c));
  }
}

}  // namespace
