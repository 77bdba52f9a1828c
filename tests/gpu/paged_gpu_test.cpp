// The CUDA forward over a paged KV cache (jfa_attention_forward_paged with device buffers: the
// kernels of src/cuda/sm90/paged) against the float64 reference of the same call on host copies
// (jfa_attention_reference_paged): random block tables (shuffled pages, pages shared between
// sequences, partial last pages, garbage past the used pages), page sizes 1, 16, 64, 256 (and 48,
// 3), cache lengths 0, 1, page multiples +- 1 and long ones, GQA 8:1, 4:1 and 1:1, head_dim 64,
// 128, 256, fp16 and bf16, 1, 4, 16 and up to 256 query tokens per sequence (chunked prefill) with
// and without the causal mask, windows, softcap, sinks, LSE on and off, one split and several (with
// and without the max_seqlen_k hint; a caller's workspace of jfa_attention_paged_workspace_size
// bytes, another size or none), outputs poisoned and guarded; graph capture replayed on new lengths
// and a new table; the checked mode on invalid tables and lengths (no fault, its bits set); the
// calls the kernels do not take; the append (new rows written into their pages, every other byte of
// the caches kept) and its checked mode.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/jagged_batch.hpp"
#include "gpu_test_util.hpp"
#include "jfa/jfa.h"
#include "jfa/jfa.hpp"

using jfa::DType;
using jfa::gpu_test::default_pool_peak;
using jfa::gpu_test::device_check_after;
using jfa::gpu_test::DeviceBuffer;
using jfa::gpu_test::fresh_seed;
using jfa::gpu_test::quick_mode;
using jfa::gpu_test::ScopedEnv;
using jfa::tools::HostBuffer;

namespace {

constexpr size_t kGuardBytes = 4096;  // poisoned bytes before and after out and lse

struct PagedCase {
  std::vector<int32_t> len_q, seqused;
  int32_t page_size = 16;
  int32_t heads_q = 8, heads_kv = 1, head_dim = 128;
  DType dtype = DType::kFloat16;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  float sink_sd = 0.f;  // > 0: sinks ~ N(0, sink_sd)
  bool with_lse = true;
  bool hint_k = true;         // pass max_seqlen_k (the longest cache)
  int32_t max_q = 0;          // the max_seqlen_q hint; 0: the longest query sequence
  bool share_pages = true;    // later sequences sometimes read sequence 0's first page
  int32_t spare_pages = 3;    // pages no sequence uses
  int32_t spare_columns = 1;  // block-table columns past every sequence's pages (garbage)
  std::vector<int32_t> len_new;  // rows each sequence appends (empty: no append)
  bool nan_past_keys = false;    // NaN in every cache row that holds no key (needs !share_pages)
};

std::string describe(const PagedCase& c) {
  char buf[400];
  int32_t longest = 0;
  for (int32_t n : c.seqused) longest = std::max(longest, n);
  std::snprintf(buf, sizeof buf,
                "%s d=%d hq=%d hkv=%d page=%d batch=%zu longest=%d causal=%d window=(%d,%d) "
                "softcap=%g sinks=%d lse=%d hint_k=%d max_q=%d append=%d",
                jfa::tools::dtype_name(c.dtype), c.head_dim, c.heads_q, c.heads_kv, c.page_size,
                c.len_q.size(), longest, c.causal ? 1 : 0, c.window_left, c.window_right,
                static_cast<double>(c.softcap), c.sink_sd > 0.f ? 1 : 0, c.with_lse ? 1 : 0,
                c.hint_k ? 1 : 0, c.max_q, c.len_new.empty() ? 0 : 1);
  return buf;
}

// Pages that n keys fill.
int32_t pages_of(int32_t n, int32_t page_size) { return (n + page_size - 1) / page_size; }

// The host side of a case: q, the caches, the block table and the lengths, sinks, the append.
struct PagedHost {
  PagedCase c;
  int64_t batch = 0, total_q = 0, num_pages = 0, total_new = 0;
  int32_t max_pages = 0;
  std::vector<int32_t> cu_q, seqused, table, cu_new;
  HostBuffer q, k_cache, v_cache, k_new, v_new;
  std::vector<float> sinks;

  PagedHost(const PagedCase& pc, std::mt19937_64& rng) : c(pc), seqused(pc.seqused) {
    batch = static_cast<int64_t>(c.len_q.size());
    cu_q.assign(batch + 1, 0);
    cu_new.assign(appending() ? batch + 1 : 0, 0);
    int64_t needed = 0;
    for (int64_t b = 0; b < batch; ++b) {
      cu_q[b + 1] = cu_q[b] + c.len_q[b];
      if (appending()) cu_new[b + 1] = cu_new[b] + c.len_new[b];
      max_pages = std::max(max_pages, pages_of(keys(b), c.page_size));
      needed += pages_of(keys(b), c.page_size);
    }
    total_new = appending() ? cu_new.back() : 0;
    max_pages += c.spare_columns;
    total_q = cu_q.back();
    num_pages = needed + c.spare_pages;
    q = HostBuffer(c.dtype, std::max<int64_t>(total_q, 1) * c.heads_q * c.head_dim);
    const int64_t cache_elems =
        std::max<int64_t>(num_pages, 1) * c.page_size * c.heads_kv * c.head_dim;
    k_cache = HostBuffer(c.dtype, cache_elems);
    v_cache = HostBuffer(c.dtype, cache_elems);
    jfa::tools::fill_normal(q, rng);
    jfa::tools::fill_normal(k_cache, rng);
    jfa::tools::fill_normal(v_cache, rng);
    if (appending()) {
      k_new = HostBuffer(c.dtype, std::max<int64_t>(total_new, 1) * c.heads_kv * c.head_dim);
      v_new = HostBuffer(c.dtype, std::max<int64_t>(total_new, 1) * c.heads_kv * c.head_dim);
      jfa::tools::fill_normal(k_new, rng);
      jfa::tools::fill_normal(v_new, rng);
    }
    std::normal_distribution<float> sink(0.f, c.sink_sd > 0.f ? c.sink_sd : 1.f);
    for (int32_t h = 0; c.sink_sd > 0.f && h < c.heads_q; ++h) sinks.push_back(sink(rng));
    make_table(rng);
    if (c.nan_past_keys) poison_rows_past_keys();
  }

  bool appending() const { return !c.len_new.empty(); }
  // Keys of sequence b the call attends over: the cache's and the appended rows.
  int32_t keys(int64_t b) const { return seqused[b] + (appending() ? c.len_new[b] : 0); }

  // A table for the current lengths: the pages shuffled over the sequences, a later sequence
  // sometimes reading sequence 0's first page, and garbage (no valid page) past the pages that
  // hold keys.
  void make_table(std::mt19937_64& rng) {
    std::vector<int32_t> pages(num_pages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    const int32_t garbage[] = {-7, static_cast<int32_t>(num_pages), INT32_MAX, INT32_MIN};
    table.assign(batch * max_pages, 0);
    for (size_t i = 0; i < table.size(); ++i) table[i] = garbage[i % 4];
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t used = pages_of(keys(b), c.page_size);
      for (int32_t j = 0; j < used; ++j) {
        const bool share = c.share_pages && b > 0 && j == 0 && rng() % 3 == 0 && seqused[0] > 0;
        table[b * max_pages + j] = share ? table[0] : pages[next++];
      }
    }
  }

  // NaN (all ones) in the rows of each sequence's last page past its keys and in the pages no
  // sequence uses: a kernel must read no row past a sequence's keys into its output.
  void poison_rows_past_keys() {
    EXPECT_FALSE(c.share_pages) << "a shared page's rows past one sequence's keys are another's";
    const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim * jfa::dtype_size(c.dtype);
    std::vector<int32_t> rows_used(num_pages, 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int32_t j = 0; j < pages_of(keys(b), c.page_size); ++j) {
        const int32_t page = table[b * max_pages + j];
        rows_used[page] =
            std::max(rows_used[page], std::min(c.page_size, keys(b) - j * c.page_size));
      }
    }
    for (int64_t page = 0; page < num_pages; ++page) {
      const size_t from = (page * c.page_size + rows_used[page]) * row;
      const size_t to = (page + 1) * c.page_size * row;
      std::fill(k_cache.bytes.begin() + from, k_cache.bytes.begin() + to, 0xFF);
      std::fill(v_cache.bytes.begin() + from, v_cache.bytes.begin() + to, 0xFF);
    }
  }

  int32_t max_seqlen_q() const {
    if (c.max_q > 0) return c.max_q;
    int32_t longest = 1;
    for (int32_t n : c.len_q) longest = std::max(longest, n);
    return longest;
  }

  // The call's parameters on these buffers (hints as the case asks).
  jfa_attention_params params(const void* q_ptr, void* out, float* lse, const int32_t* cu,
                              const float* sinks_ptr) const {
    jfa_attention_params p;
    jfa_attention_params_init(&p);
    p.q = q_ptr;
    p.out = out;
    p.lse = lse;
    p.cu_seqlens_q = cu;
    p.batch = batch;
    p.total_q = total_q;
    p.heads_q = c.heads_q;
    p.heads_kv = c.heads_kv;
    p.head_dim = c.head_dim;
    p.dtype = static_cast<jfa_dtype>(c.dtype);
    p.causal = c.causal ? 1 : 0;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.sinks = sinks.empty() ? nullptr : sinks_ptr;
    p.max_seqlen_q = max_seqlen_q();
    if (c.hint_k) {
      for (int64_t b = 0; b < batch; ++b) p.max_seqlen_k = std::max(p.max_seqlen_k, keys(b));
    }
    return p;
  }

  // new_k, new_v and new_cu: the append's buffers in the same memory (ignored without one).
  jfa_paged_kv kv(const void* k, const void* v, const int32_t* table_ptr, const int32_t* used,
                  const void* new_k = nullptr, const void* new_v = nullptr,
                  const int32_t* new_cu = nullptr) const {
    jfa_paged_kv kv;
    EXPECT_EQ(jfa_paged_kv_init(&kv), JFA_SUCCESS);
    // Without an append the cache is only read (the struct's pointers are writable for appends).
    kv.k_cache = num_pages > 0 ? const_cast<void*>(k) : nullptr;
    kv.v_cache = num_pages > 0 ? const_cast<void*>(v) : nullptr;
    kv.block_table = table_ptr;
    kv.seqused_k = used;
    kv.num_pages = num_pages;
    kv.page_size = c.page_size;
    kv.max_pages_per_seq = max_pages;
    if (appending()) {
      kv.k_new = new_k;
      kv.v_new = new_v;
      kv.cu_seqlens_new = new_cu;
      kv.total_new = total_new;
    }
    return kv;
  }

  // The caches as the append leaves them: each new row on its page.
  void append_into(HostBuffer* k, HostBuffer* v) const {
    const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim * jfa::dtype_size(c.dtype);
    for (int64_t b = 0; b < batch && appending(); ++b) {
      for (int32_t i = 0; i < c.len_new[b]; ++i) {
        const int64_t pos = seqused[b] + i;
        const int64_t page = table[b * max_pages + pos / c.page_size];
        const int64_t at = page * c.page_size + pos % c.page_size;
        std::memcpy(k->bytes.data() + at * row, k_new.bytes.data() + (cu_new[b] + i) * row, row);
        std::memcpy(v->bytes.data() + at * row, v_new.bytes.data() + (cu_new[b] + i) * row, row);
      }
    }
  }
};

struct Outputs {
  std::vector<unsigned char> out;  // with guards
  std::vector<float> lse;          // with guards
};

// The device copies of a case and its guarded outputs.
struct PagedDevice {
  DeviceBuffer q, k, v, table, seqused, cu_q, sinks, out, lse, k_new, v_new, cu_new;
  int32_t* device_check = nullptr;

  explicit PagedDevice(const PagedHost& h) {
    q = copy(h.q.bytes.data(), h.q.bytes.size());
    k = copy(h.k_cache.bytes.data(), h.k_cache.bytes.size());
    v = copy(h.v_cache.bytes.data(), h.v_cache.bytes.size());
    table = DeviceBuffer(std::max<size_t>(h.table.size(), 1) * 4);
    seqused = DeviceBuffer(std::max<size_t>(h.seqused.size(), 1) * 4);
    upload_table_and_lengths(h);
    cu_q = copy(h.cu_q.data(), h.cu_q.size() * 4);
    sinks = copy(h.sinks.data(), h.sinks.size() * 4);
    k_new = copy(h.k_new.bytes.data(), h.k_new.bytes.size());
    v_new = copy(h.v_new.bytes.data(), h.v_new.bytes.size());
    cu_new = copy(h.cu_new.data(), h.cu_new.size() * 4);
    const size_t es = jfa::dtype_size(h.c.dtype);
    out = DeviceBuffer(h.total_q * h.c.heads_q * h.c.head_dim * es + 2 * kGuardBytes);
    lse = DeviceBuffer(h.total_q * h.c.heads_q * 4 + 2 * kGuardBytes);
  }

  static DeviceBuffer copy(const void* src, size_t bytes) {
    DeviceBuffer d(std::max<size_t>(bytes, 16));
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(d.ptr, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }

  void upload_table_and_lengths(const PagedHost& h) {
    if (!h.table.empty()) {
      EXPECT_EQ(cudaMemcpy(table.ptr, h.table.data(), h.table.size() * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    if (!h.seqused.empty()) {
      EXPECT_EQ(
          cudaMemcpy(seqused.ptr, h.seqused.data(), h.seqused.size() * 4, cudaMemcpyHostToDevice),
          cudaSuccess);
    }
  }

  jfa_attention_params params(const PagedHost& h) const {
    jfa_attention_params p = h.params(
        q.ptr, static_cast<unsigned char*>(out.ptr) + kGuardBytes,
        h.c.with_lse ? reinterpret_cast<float*>(static_cast<unsigned char*>(lse.ptr) + kGuardBytes)
                     : nullptr,
        cu_q.as<int32_t>(), sinks.as<float>());
    p.device_check = device_check;
    return p;
  }

  jfa_paged_kv kv(const PagedHost& h) const {
    return h.kv(k.ptr, v.ptr, table.as<int32_t>(), seqused.as<int32_t>(), k_new.ptr, v_new.ptr,
                cu_new.as<int32_t>());
  }

  void poison() {
    EXPECT_EQ(cudaMemset(out.ptr, 0xFF, out.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse.ptr, 0xFF, lse.bytes), cudaSuccess);
  }

  Outputs download() const {
    Outputs r;
    r.out.resize(out.bytes);
    r.lse.resize(lse.bytes / 4);
    EXPECT_EQ(cudaMemcpy(r.out.data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.lse.data(), lse.ptr, lse.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  }

  // Poisons the outputs, calls (params adjusted by `adjust`), waits, downloads.
  jfa_status run(const PagedHost& h, Outputs* r, cudaStream_t stream = nullptr,
                 const std::function<void(jfa_attention_params&)>& adjust = {}) {
    poison();
    jfa_attention_params p = params(h);
    p.stream = stream;
    if (adjust) adjust(p);
    const jfa_paged_kv kv_dev = kv(h);
    const jfa_status s = jfa_attention_forward_paged(&p, &kv_dev);
    if (s != JFA_SUCCESS) return s;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return JFA_ERROR_CUDA;
    *r = download();
    return s;
  }
};

bool all_bytes(const unsigned char* p, size_t n, unsigned char value) {
  return std::all_of(p, p + n, [value](unsigned char x) { return x == value; });
}

// The guards, then out and lse against the float64 reference of the same call on the host copies
// (the table and lengths h holds now).
void check_outputs(const PagedHost& h, const Outputs& r) {
  SCOPED_TRACE(describe(h.c));
  const PagedCase& c = h.c;
  ASSERT_TRUE(all_bytes(r.out.data(), kGuardBytes, 0xFF)) << "write before out";
  ASSERT_TRUE(all_bytes(r.out.data() + r.out.size() - kGuardBytes, kGuardBytes, 0xFF))
      << "write after out";
  const auto* lse_bytes = reinterpret_cast<const unsigned char*>(r.lse.data());
  const size_t lse_size = r.lse.size() * 4;
  ASSERT_TRUE(all_bytes(lse_bytes, kGuardBytes, 0xFF)) << "write before lse";
  ASSERT_TRUE(all_bytes(lse_bytes + lse_size - kGuardBytes, kGuardBytes, 0xFF))
      << "write after lse";
  if (!c.with_lse) {
    ASSERT_TRUE(all_bytes(lse_bytes, lse_size, 0xFF)) << "lse written while NULL";
  }

  const int64_t row_elems = static_cast<int64_t>(c.heads_q) * c.head_dim;
  HostBuffer out(c.dtype, h.total_q * row_elems);
  std::memcpy(out.bytes.data(), r.out.data() + kGuardBytes, out.bytes.size());
  for (int64_t i = 0; i < out.count(); ++i)
    ASSERT_TRUE(std::isfinite(jfa::tools::element_as_double(out, i)))
        << "unwritten (poisoned) or non-finite out element " << i;

  jfa_attention_params hp = h.params(h.q.data(), nullptr, nullptr, h.cu_q.data(), h.sinks.data());
  hp.max_seqlen_q = hp.max_seqlen_k = 0;
  hp.backend = JFA_BACKEND_CPU;
  const jfa_paged_kv hkv = h.kv(h.k_cache.data(), h.v_cache.data(), h.table.data(),
                                h.seqused.data(), h.k_new.data(), h.v_new.data(), h.cu_new.data());
  std::vector<double> ref(h.total_q * row_elems), ref_lse(h.total_q * c.heads_q);
  ASSERT_EQ(
      jfa_attention_reference_paged(&hp, &hkv, nullptr, h.total_q, ref.data(), ref_lse.data()),
      JFA_SUCCESS)
      << jfa_last_error_message();
  const double tol = jfa::tools::tolerance(c.dtype);
  // fp16 rounds values below its normal range to steps of 2^-24: rows that a large sink scales
  // down that far (sinks ~ N(0, 30)) keep that absolute error, whatever their norm. Half a step
  // per element of a row or of the whole output; bf16 has float32's range.
  const double abs_floor = c.dtype == DType::kFloat16 ? std::ldexp(1.0, -25) : 0.0;
  const double err = jfa::tools::relative_error(out, ref, {}, row_elems);
  double ref_norm = 0;
  for (double x : ref) ref_norm += x * x;
  ref_norm = std::sqrt(ref_norm);
  std::printf("  %s: rel err %.3g over %lld tokens (tol %.g)\n", describe(c).c_str(), err,
              static_cast<long long>(h.total_q), tol);
  EXPECT_LE(err * ref_norm, tol * ref_norm + abs_floor * std::sqrt(static_cast<double>(ref.size())))
      << "relative error " << err;
  // Row by row too, so that one wrong (token, head) cannot hide in a large batch: within a few
  // times the tolerance, and exactly zero where the reference row is (no key seen).
  const double row_floor = abs_floor * std::sqrt(static_cast<double>(c.head_dim));
  int64_t bad_rows = 0;
  for (int64_t t = 0; t < h.total_q; ++t) {
    for (int32_t head = 0; head < c.heads_q; ++head) {
      double diff = 0, norm = 0;
      for (int32_t e = 0; e < c.head_dim; ++e) {
        const int64_t i = (t * c.heads_q + head) * c.head_dim + e;
        const double x = ref[i], o = jfa::tools::element_as_double(out, i);
        diff += (o - x) * (o - x);
        norm += x * x;
      }
      const bool ok =
          norm == 0 ? diff == 0 : std::sqrt(diff) <= 4 * tol * std::sqrt(norm) + row_floor;
      if (!ok && bad_rows++ < 5)
        ADD_FAILURE() << "token " << t << " head " << head << ": relative error "
                      << std::sqrt(diff / std::max(norm, 1e-300));
    }
  }
  EXPECT_EQ(bad_rows, 0);
  if (!c.with_lse) return;
  int64_t bad = 0;
  const size_t guard = kGuardBytes / 4;
  for (int32_t head = 0; head < c.heads_q; ++head) {
    for (int64_t t = 0; t < h.total_q; ++t) {
      const float got = r.lse[guard + head * h.total_q + t];
      const double want = ref_lse[head * h.total_q + t];
      const bool ok = std::isinf(want) ? got == static_cast<float>(want)
                                       : std::abs(got - want) <= 2e-3 * (1 + std::abs(want));
      if (!ok && bad++ < 5)
        ADD_FAILURE() << "lse token " << t << " head " << head << ": got " << got << " want "
                      << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

// The caches on the device.
std::vector<unsigned char> download_bytes(const DeviceBuffer& d, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), d.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// Runs a case twice (the runs must agree bit for bit; an appending case writes the same rows
// again) and checks it: with an append, the caches as it leaves them, exactly; out and lse against
// the reference.
void run_case(const PagedCase& c) {
  const uint64_t seed = fresh_seed(describe(c).c_str());
  std::mt19937_64 rng(seed);
  PagedHost h(c, rng);
  PagedDevice d(h);
  Outputs first, second;
  ASSERT_EQ(d.run(h, &first), JFA_SUCCESS) << jfa_last_error_message();
  if (h.appending()) {
    SCOPED_TRACE(describe(c));
    HostBuffer k_want = h.k_cache, v_want = h.v_cache;
    h.append_into(&k_want, &v_want);
    EXPECT_TRUE(download_bytes(d.k, k_want.bytes.size()) == k_want.bytes) << "k_cache after append";
    EXPECT_TRUE(download_bytes(d.v, v_want.bytes.size()) == v_want.bytes) << "v_cache after append";
  }
  check_outputs(h, first);
  ASSERT_EQ(d.run(h, &second), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_TRUE(first.out == second.out) << "two runs differ (out)";
  EXPECT_EQ(std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * 4), 0)
      << "two runs differ (lse)";
}

// Cache lengths at the page edges: none, one key, a page less one, a page, a page and one, two
// pages and one, and a few hundred.
std::vector<int32_t> edge_lengths(int32_t page) {
  return {0, 1, page > 1 ? page - 1 : 2, page, page + 1, 2 * page + 1, 300};
}

struct Gqa {
  int32_t heads_q, heads_kv;
};
constexpr Gqa kGqas[] = {{8, 1}, {8, 2}, {4, 4}};

TEST(PagedGpu, MatchesReferenceOverPageSizesLengthsAndShapes) {
  int k = 0;
  for (int32_t page : {1, 16, 64, 256}) {
    for (int32_t d : {64, 128, 256}) {
      for (int32_t tokens : {1, 4}) {
        ++k;
        if (quick_mode() && k % 4 != 0) continue;
        PagedCase c;
        c.page_size = page;
        c.head_dim = d;
        c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
        c.heads_q = kGqas[k % 3].heads_q;
        c.heads_kv = kGqas[k % 3].heads_kv;
        c.causal = (k / 2) % 2 == 1;
        c.hint_k = k % 3 != 1;
        c.seqused = edge_lengths(page);
        if (k % 3 == 0) c.seqused.push_back(5000);  // long: several splits, many pages
        // Speculative steps of different lengths (one sequence with none) under a hint of 4.
        for (size_t b = 0; b < c.seqused.size(); ++b)
          c.len_q.push_back(tokens == 1 ? 1 : static_cast<int32_t>((b * 3 + 4) % 5));
        c.max_q = tokens;
        run_case(c);
      }
    }
  }
}

// Windows at their edges, softcap and sinks (gpu_test_util's kinds), over every head size, both
// dtypes, decode and speculative steps, LSE on and off, and the page sizes (with two that are not
// powers of two, whose rows the kernel finds by division).
TEST(PagedGpu, WindowSoftcapSinksAndLse) {
  int k = 0;
  for (const jfa::gpu_test::LocalKind& kind : jfa::gpu_test::kLocalKinds) {
    for (int32_t d : {64, 128, 256}) {
      ++k;
      if (quick_mode() && k % 5 != 0) continue;
      PagedCase c;
      c.head_dim = d;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.heads_q = kGqas[k % 3].heads_q;
      c.heads_kv = kGqas[k % 3].heads_kv;
      c.page_size = std::array<int32_t, 6>{16, 64, 1, 256, 48, 3}[k % 6];  // 48, 3: no shift
      c.window_left = kind.left;
      c.window_right = kind.right;
      c.causal = kind.causal;
      c.softcap = kind.softcap;
      c.sink_sd = kind.sink_sd;
      c.with_lse = k % 4 != 3;
      c.seqused = {0, 3, 100, 700, 17, 2000};
      const int32_t tokens = k % 2 ? 4 : 1;
      c.len_q = {tokens, tokens, 1, tokens, tokens > 1 ? 2 : 1, tokens};
      c.max_q = tokens;
      run_case(c);
    }
  }
}

// 16 query tokens (speculative decode) with groups of 8 and 16 query heads: the rows of a
// (sequence, KV head) span several CTAs; with a window and without.
TEST(PagedGpu, SixteenTokensAndLargeGroups) {
  int k = 0;
  for (int32_t d : {64, 128, 256}) {
    for (const Gqa g : {Gqa{8, 1}, Gqa{32, 2}}) {
      ++k;
      if (quick_mode() && k % 2 != 0) continue;
      PagedCase c;
      c.head_dim = d;
      c.heads_q = g.heads_q;
      c.heads_kv = g.heads_kv;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.causal = true;
      c.window_left = k % 3 == 0 ? 40 : -1;
      c.page_size = 64;
      c.seqused = {16, 5, 400, 1000};
      c.len_q = {16, 5, 16, 9};
      c.max_q = 16;
      run_case(c);
    }
  }
}

// The decode kernel at one head size (64, 128, and 256 with q in shared memory), over page sizes
// (two not powers of two), edge lengths, GQA 8:1, 8:2, 4:4 and 32:2 (rows over several row blocks
// and warps), 1, 4 and 16 tokens, causal, the local kinds (windows, softcap, sinks), LSE on and
// off, one split and many, the append, and chunked prefill (up to 256 query tokens a sequence).
// One test per head size, so that the sanitizers can run them side by side.
class PagedGpuHeadDim : public ::testing::TestWithParam<int32_t> {};

TEST_P(PagedGpuHeadDim, KernelMatchesReference) {
  const int32_t d = GetParam();
  constexpr Gqa kGqas[] = {{8, 1}, {8, 2}, {4, 4}, {32, 2}};
  // The case counter starts where the earlier head sizes' 12 cases end, so that each size meets
  // other combinations.
  int k = d == 64 ? 0 : d == 128 ? 12 : 24;
  for (int32_t page : {1, 16, 48, 256}) {
    for (int32_t tokens : {1, 4, 16}) {
      ++k;
      if (quick_mode() && k % 4 != 0) continue;
      PagedCase c;
      c.head_dim = d;
      c.page_size = page;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.heads_q = kGqas[k % 4].heads_q;
      c.heads_kv = kGqas[k % 4].heads_kv;
      c.causal = k % 3 != 0;
      c.hint_k = k % 5 != 1;
      c.with_lse = k % 4 != 2;
      const jfa::gpu_test::LocalKind& kind =
          jfa::gpu_test::kLocalKinds[k % std::size(jfa::gpu_test::kLocalKinds)];
      if (k % 2 == 0) {
        c.window_left = kind.left;
        c.window_right = kind.right;
        c.causal = kind.causal;
        c.softcap = kind.softcap;
        c.sink_sd = kind.sink_sd;
      }
      c.seqused = edge_lengths(page);
      if (k % 3 == 0) c.seqused.push_back(5000);
      for (size_t b = 0; b < c.seqused.size(); ++b)
        c.len_q.push_back(tokens == 1 ? 1 : static_cast<int32_t>((b * 7 + tokens) % (tokens + 1)));
      c.max_q = tokens;
      run_case(c);
    }
  }
  // One sequence on one KV head: many splits and their combine.
  {
    PagedCase c;
    c.head_dim = d;
    c.heads_q = 4;
    c.heads_kv = 1;
    c.seqused = {7000};
    c.len_q = {2};
    c.max_q = 2;
    c.causal = true;
    run_case(c);
  }
  // The append before it.
  if (d == 128) {
    PagedCase c;
    c.share_pages = false;
    c.head_dim = 128;
    c.heads_q = 16;
    c.heads_kv = 2;
    c.causal = true;
    c.seqused = {0, 15, 16, 300};
    c.len_new = {1, 1, 4, 16};
    c.len_q = {1, 1, 4, 16};
    c.max_q = 16;
    run_case(c);
  }
  // Chunked prefill: each sequence's chunk appended, then attending over its cache and itself,
  // causal; with a window at 64, GQA 4:1, 8:1 and 8:2, a chunk into an empty cache (at 128 alone in
  // quick mode: the sanitizers).
  if (quick_mode() && d != 128) return;
  PagedCase p;
  p.share_pages = false;
  p.head_dim = d;
  p.heads_q = d == 64 ? 16 : d == 128 ? 32 : 16;
  p.heads_kv = d == 64 ? 2 : d == 128 ? 8 : 2;
  p.dtype = d == 128 ? DType::kBFloat16 : DType::kFloat16;
  p.causal = true;
  p.window_left = d == 64 ? 300 : -1;
  p.seqused = {0, 1000, 4000, 37};
  p.len_new = {64, 200, 256, 17};
  p.len_q = p.len_new;
  p.max_q = 256;
  run_case(p);
}

INSTANTIATE_TEST_SUITE_P(PagedGpu, PagedGpuHeadDim, ::testing::Values(64, 128, 256),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return "d" + std::to_string(info.param);
                         });

// h's call on `dev` by default and under the switch `name`=`value`: the same out and LSE, bit for
// bit (`other` names the switched path in the failure).
void expect_the_same_bits_under(PagedDevice& dev, const PagedHost& h, const char* name,
                                const char* value, const char* other) {
  Outputs by_default, switched;
  ASSERT_EQ(dev.run(h, &by_default), JFA_SUCCESS) << jfa_last_error_message();
  {
    const ScopedEnv on(name, value);
    ASSERT_EQ(dev.run(h, &switched), JFA_SUCCESS) << jfa_last_error_message();
  }
  EXPECT_TRUE(by_default.out == switched.out) << "out differs from " << other;
  EXPECT_EQ(std::memcmp(by_default.lse.data(), switched.lse.data(), switched.lse.size() * 4), 0)
      << "lse differs from " << other;
}

// A chunked prefill over the sequences of edge_lengths(page) and one of `longest` keys, chunks of 0
// to 300 tokens (decode steps among them), dtype, GQA, mask, LSE and sinks varied by k, NaN in
// every cache row past the keys.
PagedCase prefill_case(int k, int32_t d, int32_t page, int32_t longest) {
  PagedCase c;
  c.head_dim = d;
  c.page_size = page;
  c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
  c.heads_q = kGqas[k % 3].heads_q;
  c.heads_kv = kGqas[k % 3].heads_kv;
  c.causal = k % 4 != 1;
  c.with_lse = k % 5 != 2;
  c.sink_sd = k % 4 == 3 ? 2.f : 0.f;
  c.share_pages = false;
  c.nan_past_keys = true;
  c.seqused = edge_lengths(page);
  c.seqused.push_back(longest);
  for (size_t b = 0; b < c.seqused.size(); ++b) {
    const int32_t chunk[] = {64, 1, 0, 300, 129, 17, 256, 200};
    c.len_q.push_back(chunk[(b + k) % std::size(chunk)]);
  }
  c.max_q = 300;
  return c;
}

// Chunked prefill on the packed forward's tiles (forced by JFA_CUDA_PAGED_PREFILL=1, for calls
// whose max_seqlen_q is at least 64): chunks of 0 to 300 tokens (decode steps among them) over
// caches at the page edges and longer, appended or not, causal and not, GQA, sinks, LSE on and off,
// page sizes 1, 16, 48 (rows found by division) and 256, every paged head size and both dtypes;
// every row that holds no key is NaN. The prefill kernels did run: their bits differ from the
// decode kernel's on the same case.
TEST(PagedGpu, PrefillTilesMatchReference) {
  int k = 0, differs = 0, compared = 0;
  for (int32_t d : {64, 128, 256}) {
    for (int32_t page : {1, 16, 48, 256}) {
      for (bool append : {false, true}) {
        ++k;
        if (quick_mode() && k % 3 != 0) continue;
        PagedCase c = prefill_case(k, d, page,
                                   quick_mode() ? 700
                                   : k % 2      ? 4000
                                                : 1500);  // shorter for the sanitizers
        c.hint_k = k % 3 != 2;
        if (append) c.len_new = c.len_q;
        {
          const ScopedEnv on("JFA_CUDA_PAGED_PREFILL", "1");
          run_case(c);
        }
        // The same case on the decode kernel: the prefill kernels' bits differ somewhere.
        if (append) continue;  // the append has moved the cache on
        std::mt19937_64 rng(fresh_seed(describe(c).c_str()));
        PagedHost h(c, rng);
        PagedDevice d(h);  // read only: the case appends nothing
        Outputs prefill, decode;
        {
          const ScopedEnv on("JFA_CUDA_PAGED_PREFILL", "1");
          ASSERT_EQ(d.run(h, &prefill), JFA_SUCCESS) << jfa_last_error_message();
        }
        {
          const ScopedEnv off("JFA_CUDA_PAGED_PREFILL", "0");
          ASSERT_EQ(d.run(h, &decode), JFA_SUCCESS) << jfa_last_error_message();
        }
        ++compared;
        differs += prefill.out != decode.out ? 1 : 0;
      }
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differs, compared) << "a case gave the decode kernel's bits with the prefill switch on";
}

// The prefill tiles' loads (paged_loads.hpp): by default pages by TMA where they come in boxes of
// 8 rows or more, else the row copies; against the reference, then bit for bit the row copies'
// output (JFA_CUDA_PAGED_LOADS=rows) on the same case with an invalid entry among the longest
// sequence's pages, since both bring the same tiles (rows past the keys and the rows of an invalid
// page zero-filled). Page sizes 1 (no TMA boxes: the row copies both times), 8, 16, 24 and 48
// (boxes of 8 and 16 rows, rows found by division) and 256 (one box a tile); every paged head size
// and both dtypes; NaN in every cache row past the keys; GQA, causal or not, sinks, LSE on and off.
// Which loads a call takes is paged_loads_for's (tests/cuda_host/paged_loads_test.cu).
TEST(PagedGpu, PrefillPagesByTmaMatchReferenceAndTheRowCopiesBits) {
  int k = 0;
  for (int32_t d : {64, 128, 256}) {
    for (int32_t page : {1, 8, 16, 24, 48, 256}) {
      ++k;
      if (quick_mode() && k % 3 != 0) continue;
      const PagedCase c = prefill_case(k, d, page, quick_mode() ? 700 : 3000);
      SCOPED_TRACE(describe(c));
      const ScopedEnv prefill("JFA_CUDA_PAGED_PREFILL", "1");
      run_case(c);
      std::mt19937_64 rng(fresh_seed(describe(c).c_str()));
      PagedHost h(c, rng);
      const int64_t longest = static_cast<int64_t>(c.seqused.size()) - 1;
      h.table[longest * h.max_pages + 1] = -1;  // its second page: zeros, whichever the loads
      PagedDevice dev(h);
      expect_the_same_bits_under(dev, h, "JFA_CUDA_PAGED_LOADS", "rows", "the row copies'");
    }
  }
}

// The splits of the chunked prefill's keys (paged_prefill_splits.hpp), with the row copies and
// with pages by TMA, every paged head size and both dtypes: few chunks, whose items leave the SMs
// idle so that the call splits (2 to 5 splits by the heads), against the reference: caches of
// 4000, 300 and no keys (a short item's later splits hold no tile and end empty), chunks of 256,
// 64 and 200 tokens, causal or not, GQA 8:2, 4:1 and 16:4, sinks, LSE on and off, the key-length
// hint given or not, an append, pages of 16 and 48 keys, NaN past the keys. The splits did run:
// their bits differ from those of the same case with JFA_CUDA_PAGED_SPLITS=0.
TEST(PagedGpu, PrefillKeySplitsMatchReference) {
  constexpr Gqa kHeads[] = {{8, 2}, {4, 1}, {16, 4}};
  int k = 0, differs = 0, compared = 0;
  for (const char* loads : {"rows", "default"}) {
    for (int32_t d : {64, 128, 256}) {
      for (int variant = 0; variant < 3; ++variant) {
        ++k;
        if (quick_mode() && k % 4 != 0) continue;  // each variant once, both loads
        PagedCase c;
        c.head_dim = d;
        c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
        c.page_size = variant == 1 ? 48 : 16;
        c.heads_q = kHeads[variant].heads_q;
        c.heads_kv = kHeads[variant].heads_kv;
        c.causal = variant != 2;
        c.with_lse = k % 2 == 0;
        c.sink_sd = variant == 1 ? 2.f : 0.f;
        c.hint_k = variant != 0;
        c.share_pages = false;
        c.nan_past_keys = variant != 2;  // the append writes rows there
        c.seqused = {quick_mode() ? 1500 : 4000, 0, 300};
        c.len_q = {256, 64, 200};
        if (variant == 2) c.len_new = c.len_q;
        c.max_q = 256;
        SCOPED_TRACE(std::string("loads ") + loads + ": " + describe(c));
        const ScopedEnv prefill("JFA_CUDA_PAGED_PREFILL", "1");
        const ScopedEnv on_loads("JFA_CUDA_PAGED_LOADS", loads);
        run_case(c);
        if (variant == 2) continue;  // the append has moved the cache on
        std::mt19937_64 rng(fresh_seed(describe(c).c_str()));
        PagedHost h(c, rng);
        PagedDevice dev(h);
        Outputs split, whole;
        ASSERT_EQ(dev.run(h, &split), JFA_SUCCESS) << jfa_last_error_message();
        {
          const ScopedEnv off("JFA_CUDA_PAGED_SPLITS", "0");
          ASSERT_EQ(dev.run(h, &whole), JFA_SUCCESS) << jfa_last_error_message();
        }
        ++compared;
        differs += split.out != whole.out ? 1 : 0;
      }
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differs, compared) << "a case gave the unsplit kernel's bits";
}

// By default the prefill tiles take every chunked prefill whose pages come by TMA (pages of 16:
// one chunk of 256 tokens on 32 query heads, 64 items, as 8 chunks, 512 items), and with the row
// copies (pages of 4) only one whose (q tile, query head) items fill the SMs (8 chunks), the decode
// kernel the other (one chunk): the default call's bits are those of the path forced the same way.
TEST(PagedGpu, PrefillTilesTakenWherePagesComeByTmaOrTheirItemsFillTheGpu) {
  for (int32_t page : {16, 4}) {
    for (int32_t batch : {8, 1}) {
      PagedCase c;
      c.heads_q = 32;
      c.heads_kv = 8;
      c.page_size = page;
      c.dtype = DType::kBFloat16;
      c.causal = true;
      c.share_pages = false;
      c.seqused.assign(static_cast<size_t>(batch), quick_mode() ? 700 : 2000);
      c.len_q.assign(static_cast<size_t>(batch), 256);
      std::mt19937_64 rng(fresh_seed(describe(c).c_str()));
      PagedHost h(c, rng);
      PagedDevice d(h);
      Outputs by_default, forced;
      ASSERT_EQ(d.run(h, &by_default), JFA_SUCCESS) << jfa_last_error_message();
      const bool prefill = page == 16 || batch == 8;
      {
        const ScopedEnv force("JFA_CUDA_PAGED_PREFILL", prefill ? "1" : "0");
        ASSERT_EQ(d.run(h, &forced), JFA_SUCCESS) << jfa_last_error_message();
      }
      EXPECT_TRUE(by_default.out == forced.out)
          << "pages of " << page << ", batch " << batch << ": the default call did not take the "
          << (prefill ? "prefill tiles" : "decode kernel");
    }
  }
}

// Long caches on few CTAs (one sequence, one KV head): many splits and their combine, with and
// without the max_seqlen_k hint and under a window that bounds them; a caller's workspace, too
// small, of exactly jfa_attention_paged_workspace_size bytes or larger, gives the same bits as the
// library's own, and one large enough is the only one (the call allocates nothing).
TEST(PagedGpu, SplitsOfLongCachesAndWorkspaces) {
  int k = 0;
  for (int32_t d : {64, 128, 256}) {
    for (int variant = 0; variant < 3; ++variant) {
      ++k;
      if (quick_mode() && k % 3 != 0) continue;
      PagedCase c;
      c.head_dim = d;
      c.heads_q = 4;
      c.heads_kv = 1;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.page_size = 16;
      c.seqused = {variant == 2 ? 4097 : 5000};
      c.len_q = {variant == 0 ? 1 : 3};
      c.max_q = c.len_q[0];
      c.hint_k = variant != 1;
      c.causal = variant == 2;
      c.window_left = variant == 2 ? 600 : -1;
      c.sink_sd = variant == 1 ? 2.f : 0.f;
      const uint64_t seed = fresh_seed(describe(c).c_str());
      std::mt19937_64 rng(seed);
      PagedHost h(c, rng);
      PagedDevice dev(h);
      Outputs own;
      ASSERT_EQ(dev.run(h, &own), JFA_SUCCESS) << jfa_last_error_message();
      check_outputs(h, own);
      size_t queried = 0;
      {
        const jfa_attention_params p = dev.params(h);
        const jfa_paged_kv kv = dev.kv(h);
        ASSERT_EQ(jfa_attention_paged_workspace_size(&p, &kv, &queried), JFA_SUCCESS)
            << jfa_last_error_message();
      }
      EXPECT_GT(queried, size_t{16}) << "one sequence on one KV head splits its keys";
      for (size_t bytes : {size_t{16}, queried, size_t{64} << 20}) {
        DeviceBuffer ws(bytes);
        Outputs given;
        JFA_CUDA_OK(cudaDeviceSynchronize());
        (void)default_pool_peak(/*reset=*/true);
        ASSERT_EQ(dev.run(h, &given, nullptr,
                          [&](jfa_attention_params& p) {
                            p.workspace = ws.ptr;
                            p.workspace_bytes = bytes;
                          }),
                  JFA_SUCCESS)
            << jfa_last_error_message();
        EXPECT_TRUE(given.out == own.out &&
                    std::memcmp(given.lse.data(), own.lse.data(), own.lse.size() * 4) == 0)
            << "a caller's workspace of " << bytes << " bytes changed the result";
        // Large enough, it is the only one: the call allocates nothing.
        if (bytes > 16) {
          EXPECT_EQ(default_pool_peak(/*reset=*/false), 0u);
        }
      }
      // A jfa_workspace prepared for the paged call: the same bits, nothing allocated in the call.
      jfa_workspace* kept = nullptr;
      ASSERT_EQ(jfa_workspace_create(&kept), JFA_SUCCESS);
      Outputs prepared;
      JFA_CUDA_OK(cudaDeviceSynchronize());
      jfa_status prepare_status = JFA_SUCCESS;
      ASSERT_EQ(dev.run(h, &prepared, nullptr,
                        [&](jfa_attention_params& p) {
                          const jfa_paged_kv kv = dev.kv(h);
                          prepare_status = jfa_workspace_prepare_paged(kept, &p, &kv);
                          (void)default_pool_peak(/*reset=*/true);
                        }),
                JFA_SUCCESS)
          << jfa_last_error_message();
      EXPECT_EQ(prepare_status, JFA_SUCCESS) << jfa_last_error_message();
      EXPECT_EQ(default_pool_peak(/*reset=*/false), 0u);
      EXPECT_TRUE(prepared.out == own.out) << "a prepared jfa_workspace changed the result";
      EXPECT_EQ(jfa_workspace_destroy(kept), JFA_SUCCESS);
    }
  }
}

// Sequences without query tokens, and no sequence at all: nothing to compute, the checked mode's
// word still stored (0), out untouched.
TEST(PagedGpu, NoQueryTokens) {
  PagedCase c;
  c.len_q = {0, 0};
  c.seqused = {5, 0};
  std::mt19937_64 rng(fresh_seed("no query tokens"));
  PagedHost h(c, rng);
  PagedDevice d(h);
  const DeviceBuffer word(4);
  d.device_check = word.as<int32_t>();
  Outputs r;
  EXPECT_EQ(device_check_after(word,
                               [&](int32_t*) {
                                 EXPECT_EQ(d.run(h, &r), JFA_SUCCESS) << jfa_last_error_message();
                               }),
            0);
  EXPECT_TRUE(all_bytes(r.out.data(), r.out.size(), 0xFF));
  jfa_attention_params p = d.params(h);
  p.batch = 0;
  jfa_paged_kv kv = d.kv(h);
  EXPECT_EQ(jfa_attention_forward_paged(&p, &kv), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Capture once (on a stream, the launch planned from the hints), then write new lengths and a new
// block table in place and replay: each replay must give the reference of the new cache, with
// several splits (their workspace allocated inside the graph) and with one.
void check_graph_replays() {
  for (int32_t sequences : {2, 200}) {  // several splits (a workspace in the graph), and one
    PagedCase c;
    c.head_dim = 128;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.page_size = 16;
    c.causal = true;
    c.seqused.assign(sequences, 0);
    for (int32_t b = 0; b < sequences; ++b) c.seqused[b] = b % 2 ? 1500 : 30 + b;
    c.len_q.assign(sequences, 2);
    c.max_q = 2;
    c.spare_pages = 200;
    c.spare_columns = 40;
    c.share_pages = false;
    const uint64_t seed = fresh_seed(describe(c).c_str());
    std::mt19937_64 rng(seed);
    PagedHost h(c, rng);
    PagedDevice d(h);
    cudaStream_t stream;
    JFA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    jfa_attention_params p = d.params(h);
    p.stream = stream;
    p.max_seqlen_k = h.max_pages * c.page_size;  // any length the table can hold
    const jfa_paged_kv kv = d.kv(h);
    d.poison();
    JFA_CUDA_OK(cudaDeviceSynchronize());
    cudaGraph_t graph;
    JFA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const jfa_status s = jfa_attention_forward_paged(&p, &kv);
    JFA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(s, JFA_SUCCESS) << jfa_last_error_message();
    cudaGraphExec_t exec;
    JFA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      if (replay > 0) {
        // New lengths (a step or two further, some sequences restarted) and a new table.
        std::uniform_int_distribution<int32_t> len(0, 40 * c.page_size);
        for (int32_t& n : h.seqused) n = len(rng);
        h.make_table(rng);
        d.upload_table_and_lengths(h);
      }
      d.poison();
      JFA_CUDA_OK(cudaDeviceSynchronize());  // the uploads and the poison (legacy stream) first
      JFA_CUDA_OK(cudaGraphLaunch(exec, stream));
      JFA_CUDA_OK(cudaStreamSynchronize(stream));
      SCOPED_TRACE("replay " + std::to_string(replay));
      check_outputs(h, d.download());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(PagedGpu, GraphCaptureReplaysOnNewLengthsAndTable) { check_graph_replays(); }

// Kernels built for measurement that have not run yet are tested only where asked
// (JFA_GPU_TESTS_UNVERIFIED=1, under a short time limit): a barrier or dependency mistake in them
// could hang the whole suite. Elsewhere their tests say they were skipped.
bool unverified_kernels_asked() {
  const char* env = std::getenv("JFA_GPU_TESTS_UNVERIFIED");
  return env != nullptr && std::string(env) == "1";
}
constexpr const char* kUnverifiedSkip =
    "kernels not yet verified on a GPU: JFA_GPU_TESTS_UNVERIFIED=1 runs this test";

// The combine as the decode kernel's programmatic dependent (JFA_CUDA_UNVERIFIED_PAGED_PDL=1):
// decode and speculative decode of few sequences over long caches (many splits) at every paged head
// size and both dtypes, sinks, LSE on and off: against the reference, bit for bit the separate
// launch's output (the same kernels' arithmetic), and under graph capture and replay.
TEST(PagedGpu, UnverifiedDependentCombineMatchesTheSeparateOne) {
  if (!unverified_kernels_asked()) GTEST_SKIP() << kUnverifiedSkip;
  int k = 0;
  for (int32_t d : {64, 128, 256}) {
    for (int32_t tokens : {1, 4}) {
      ++k;
      PagedCase c;
      c.head_dim = d;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.heads_q = 32;
      c.heads_kv = 8;
      c.causal = true;
      c.with_lse = k % 3 != 0;
      c.sink_sd = k % 2 == 0 ? 2.f : 0.f;
      c.share_pages = false;
      c.seqused = {quick_mode() ? 1500 : 4000, 300};
      c.len_q = {tokens, tokens};
      c.max_q = tokens;
      SCOPED_TRACE(describe(c));
      {
        const ScopedEnv on("JFA_CUDA_UNVERIFIED_PAGED_PDL", "1");
        run_case(c);
      }
      std::mt19937_64 rng(fresh_seed(describe(c).c_str()));
      PagedHost h(c, rng);
      PagedDevice dev(h);
      expect_the_same_bits_under(dev, h, "JFA_CUDA_UNVERIFIED_PAGED_PDL", "1",
                                 "the dependent combine's");
    }
  }
  const ScopedEnv on("JFA_CUDA_UNVERIFIED_PAGED_PDL", "1");
  check_graph_replays();
}

// The checked mode's word after one call on a spoiled copy of h's table, lengths and offsets
// (cu_seqlens_q, and cu_seqlens_new where h appends) with params adjusted, checking that nothing
// faulted or was written outside out; h's own are uploaded again after.
struct CheckedCalls {
  const PagedHost& h;
  PagedDevice& d;
  const DeviceBuffer& word;

  void upload(const PagedHost& x) {
    d.upload_table_and_lengths(x);
    EXPECT_EQ(cudaMemcpy(d.cu_q.ptr, x.cu_q.data(), x.cu_q.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    if (!x.cu_new.empty()) {
      EXPECT_EQ(
          cudaMemcpy(d.cu_new.ptr, x.cu_new.data(), x.cu_new.size() * 4, cudaMemcpyHostToDevice),
          cudaSuccess);
    }
  }

  int32_t word_after(const std::function<void(PagedHost&)>& spoil,
                     const std::function<void(jfa_attention_params&)>& adjust = {}) {
    PagedHost bad = h;
    spoil(bad);
    upload(bad);
    Outputs r;
    const int32_t got = device_check_after(word, [&](int32_t*) {
      EXPECT_EQ(d.run(h, &r, nullptr, adjust), JFA_SUCCESS) << jfa_last_error_message();
    });
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_TRUE(all_bytes(r.out.data(), kGuardBytes, 0xFF) &&
                all_bytes(r.out.data() + r.out.size() - kGuardBytes, kGuardBytes, 0xFF))
        << "write outside out";
    upload(h);
    return got;
  }
};

// The checked mode: block-table entries outside [0, num_pages) among the pages that hold keys,
// lengths outside their range, cu_seqlens_q that break its rules, and a NaN in q each set their
// bits (paged_sm90.hpp) without a fault or a write outside out and lse; a valid call stores 0 (the
// garbage past the used pages is not read). Run it under compute-sanitizer memcheck.
TEST(PagedGpu, CheckedModeOnInvalidTablesAndLengths) {
  PagedCase c;
  c.head_dim = 64;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.page_size = 16;
  c.seqused = {40, 17, 300};
  c.len_q = {1, 2, 1};
  c.max_q = 2;
  std::mt19937_64 rng(fresh_seed("checked mode"));
  PagedHost h(c, rng);
  PagedDevice d(h);
  const DeviceBuffer word(4);
  d.device_check = word.as<int32_t>();
  const int32_t capacity = h.max_pages * c.page_size;
  CheckedCalls calls{h, d, word};
  EXPECT_EQ(calls.word_after([](PagedHost&) {}), 0);
  for (int32_t entry : {-1, static_cast<int32_t>(h.num_pages), INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE("block table entry " + std::to_string(entry));
    const int32_t w = calls.word_after([&](PagedHost& b) { b.table[2 * b.max_pages + 3] = entry; });
    EXPECT_EQ(w, JFA_OFFSETS_K_LAST_NOT_TOTAL) << jfa_device_check_message(w);
  }
  const int32_t negative = calls.word_after([](PagedHost& b) { b.seqused[1] = -3; });
  EXPECT_EQ(negative, JFA_OFFSETS_K_DECREASING) << jfa_device_check_message(negative);
  for (int32_t used : {capacity + 1, INT32_MAX}) {
    const int32_t w = calls.word_after([&](PagedHost& b) { b.seqused[0] = used; });
    // Past the table: its garbage columns are then pages that hold keys, outside the cache.
    EXPECT_EQ(w & JFA_OFFSETS_K_ABOVE_MAX, JFA_OFFSETS_K_ABOVE_MAX) << jfa_device_check_message(w);
  }
  const int32_t above_hint =
      calls.word_after([](PagedHost&) {}, [](jfa_attention_params& p) { p.max_seqlen_k = 100; });
  EXPECT_EQ(above_hint, JFA_OFFSETS_K_ABOVE_MAX) << jfa_device_check_message(above_hint);
  const int32_t decreasing = calls.word_after([](PagedHost& b) { b.cu_q = {0, 3, 1, 4}; });
  EXPECT_EQ(decreasing & JFA_OFFSETS_Q_DECREASING, JFA_OFFSETS_Q_DECREASING)
      << jfa_device_check_message(decreasing);
  // With invalid offsets, whether JFA_CHECK_RESULT_NOT_FINITE comes too is unspecified (jfa.h):
  // rows of tokens past max_seqlen_q are not computed.
  const int32_t q_above = calls.word_after([](PagedHost& b) { b.cu_q = {0, 3, 3, 4}; });
  EXPECT_EQ(q_above & ~JFA_CHECK_RESULT_NOT_FINITE, JFA_OFFSETS_Q_ABOVE_MAX)
      << jfa_device_check_message(q_above);
  const int32_t first = calls.word_after([](PagedHost& b) { b.cu_q = {1, 2, 3, 4}; });
  EXPECT_EQ(first & ~JFA_CHECK_RESULT_NOT_FINITE, JFA_OFFSETS_Q_FIRST_NOT_ZERO)
      << jfa_device_check_message(first);
  // A NaN in q: its rows' sums are NaN.
  HostBuffer nan_q = h.q;
  std::fill(nan_q.bytes.begin(), nan_q.bytes.begin() + 2 * c.head_dim, 0xFF);
  JFA_CUDA_OK(cudaMemcpy(d.q.ptr, nan_q.data(), nan_q.bytes.size(), cudaMemcpyHostToDevice));
  const int32_t nan = calls.word_after([](PagedHost&) {});
  EXPECT_EQ(nan, JFA_CHECK_RESULT_NOT_FINITE) << jfa_device_check_message(nan);
  JFA_CUDA_OK(cudaDeviceSynchronize());
}

// The append: each sequence's new rows land on their pages at rows seqused .. seqused + len_new - 1
// and every other byte of the caches stays as it was; the call attends over the cache with them,
// as the reference that reads them from k_new does; twice, bit for bit (the second call writes the
// same rows again). Decode, speculative and prefill-sized appends, sequences appending nothing or
// starting empty, appends across page edges; page sizes 1, 16, 48 (no shift) and 64, every head
// size, GQA, causal, a window and softcap; one call with several splits; queries fewer than the
// new rows, and none.
TEST(PagedGpu, AppendWritesNewRowsThenAttends) {
  int k = 0;
  for (int32_t page : {1, 16, 48, 64}) {
    for (int32_t d : {64, 128, 256}) {
      ++k;
      if (quick_mode() && k % 3 != 0) continue;
      PagedCase c;
      c.page_size = page;
      c.head_dim = d;
      c.dtype = k % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.heads_q = kGqas[k % 3].heads_q;
      c.heads_kv = kGqas[k % 3].heads_kv;
      c.causal = k % 4 != 1;
      c.window_left = k % 5 == 2 ? 70 : -1;
      c.softcap = k % 5 == 3 ? 30.f : 0.f;
      c.share_pages = false;  // a page receiving new rows holds no other sequence's keys
      c.seqused = {0, page - 1, page, 17, 300, 5, k % 3 == 0 ? 5000 : 40};
      c.len_new = {1, 2, 4, 0, 16, 100, 1};
      c.len_q = {1, 2, 4, 1, 16, 4, 1};
      c.max_q = 16;
      run_case(c);
    }
  }
  // No query token: the call only writes.
  PagedCase c;
  c.share_pages = false;
  c.seqused = {3, 20};
  c.len_new = {5, 1};
  c.len_q = {0, 0};
  run_case(c);
}

// The append's checked mode: cu_seqlens_new that breaks the rules of offsets and a page receiving
// new rows that holds another sequence's keys set JFA_PAGED_APPEND_INVALID; new rows past the table
// or past the max_seqlen_k hint set JFA_OFFSETS_K_ABOVE_MAX; no fault, no write outside out, lse or
// the caches (run it under compute-sanitizer memcheck); a valid append stores 0.
TEST(PagedGpu, CheckedModeOnInvalidAppends) {
  PagedCase c;
  c.head_dim = 64;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.page_size = 16;
  c.share_pages = false;
  c.seqused = {40, 17, 300};
  c.len_new = {1, 3, 2};
  c.len_q = {1, 2, 1};
  c.max_q = 2;
  std::mt19937_64 rng(fresh_seed("checked append"));
  PagedHost h(c, rng);
  PagedDevice d(h);
  const DeviceBuffer word(4);
  d.device_check = word.as<int32_t>();
  const int32_t capacity = h.max_pages * c.page_size;
  CheckedCalls calls{h, d, word};
  EXPECT_EQ(calls.word_after([](PagedHost&) {}), 0);
  const int32_t decreasing = calls.word_after([](PagedHost& b) { b.cu_new = {0, 3, 1, 6}; });
  EXPECT_EQ(decreasing & JFA_PAGED_APPEND_INVALID, JFA_PAGED_APPEND_INVALID)
      << jfa_device_check_message(decreasing);
  const int32_t first = calls.word_after([](PagedHost& b) { b.cu_new = {1, 2, 4, 6}; });
  EXPECT_EQ(first & JFA_PAGED_APPEND_INVALID, JFA_PAGED_APPEND_INVALID)
      << jfa_device_check_message(first);
  const int32_t last = calls.word_after([](PagedHost& b) { b.cu_new = {0, 1, 4, 5}; });
  EXPECT_EQ(last & JFA_PAGED_APPEND_INVALID, JFA_PAGED_APPEND_INVALID)
      << jfa_device_check_message(last);
  // Sequence 1 appends at rows 17..19: its second page. Give it sequence 0's first page.
  const int32_t shared =
      calls.word_after([](PagedHost& b) { b.table[1 * b.max_pages + 1] = b.table[0]; });
  EXPECT_EQ(shared, JFA_PAGED_APPEND_INVALID) << jfa_device_check_message(shared);
  const int32_t past_table = calls.word_after([&](PagedHost& b) { b.seqused[2] = capacity - 1; });
  EXPECT_EQ(past_table & JFA_OFFSETS_K_ABOVE_MAX, JFA_OFFSETS_K_ABOVE_MAX)
      << jfa_device_check_message(past_table);
  const int32_t above_hint =
      calls.word_after([](PagedHost&) {}, [](jfa_attention_params& p) { p.max_seqlen_k = 301; });
  EXPECT_EQ(above_hint, JFA_OFFSETS_K_ABOVE_MAX) << jfa_device_check_message(above_hint);
  JFA_CUDA_OK(cudaDeviceSynchronize());
}

// What the CUDA paged forward does not take is JFA_ERROR_UNSUPPORTED naming it (an argument that
// breaks a rule: JFA_ERROR_INVALID_ARGUMENT), before anything is written; the reference, a host
// computation, refuses a cache in device memory.
TEST(PagedGpu, RejectsWhatTheKernelsDoNotTake) {
  PagedCase c;
  c.head_dim = 128;
  c.seqused = {20, 5};
  c.len_q = {1, 1};
  std::mt19937_64 rng(fresh_seed("rejects"));
  PagedHost h(c, rng);
  PagedDevice d(h);
  // Room for the other shapes' (head_dim 256, float32) q, out and caches.
  DeviceBuffer big_q(1 << 20), big_out(1 << 20), big_k(4 << 20), big_v(4 << 20);
  struct Bad {
    const char* message;
    jfa_status status;
    std::function<void(jfa_attention_params&, jfa_paged_kv&)> mutate;
  };
  DeviceBuffer k_new(4096), v_new(4096), cu_new(16);
  const std::vector<Bad> cases = {
      {"must be 16-byte aligned for the CUDA paged forward's append", JFA_ERROR_UNSUPPORTED,
       [&](jfa_attention_params&, jfa_paged_kv& kv) {
         kv.k_new = static_cast<unsigned char*>(k_new.ptr) + 2;
         kv.v_new = v_new.ptr;
         kv.cu_seqlens_new = cu_new.as<int32_t>();
         kv.total_new = 0;
       }},
      {"needs max_seqlen_q", JFA_ERROR_UNSUPPORTED,
       [](jfa_attention_params& p, jfa_paged_kv&) { p.max_seqlen_q = 0; }},
      {"takes at most 4096 query tokens per sequence", JFA_ERROR_UNSUPPORTED,
       [](jfa_attention_params& p, jfa_paged_kv&) { p.max_seqlen_q = 4097; }},
      {"head_dim 96", JFA_ERROR_UNSUPPORTED,
       [&](jfa_attention_params& p, jfa_paged_kv& kv) {
         p.head_dim = 96;
         p.q = big_q.ptr;
         p.out = big_out.ptr;
         kv.k_cache = big_k.ptr;
         kv.v_cache = big_v.ptr;
       }},
      {"head_dim_v 64", JFA_ERROR_UNSUPPORTED,
       [&](jfa_attention_params& p, jfa_paged_kv& kv) {
         p.head_dim_v = 64;
         kv.v_cache = big_v.ptr;
       }},
      {"dtype float32", JFA_ERROR_UNSUPPORTED,
       [&](jfa_attention_params& p, jfa_paged_kv& kv) {
         p.dtype = JFA_DTYPE_FLOAT32;
         p.q = big_q.ptr;
         p.out = big_out.ptr;
         kv.k_cache = big_k.ptr;
         kv.v_cache = big_v.ptr;
       }},
      {"max_seqlen_q=1 is smaller than the longest q sequence", JFA_ERROR_INVALID_ARGUMENT,
       [&](jfa_attention_params& p, jfa_paged_kv&) {
         p.total_q = 3;
         p.q = big_q.ptr;
         p.out = big_out.ptr;
         p.lse = nullptr;
       }},
      {"share memory", JFA_ERROR_INVALID_ARGUMENT,
       [](jfa_attention_params& p, jfa_paged_kv& kv) { p.out = kv.k_cache; }},
      {"host", JFA_ERROR_INVALID_ARGUMENT,
       [&](jfa_attention_params& p, jfa_paged_kv&) { p.q = h.q.data(); }},
  };
  auto out_untouched = [&] {
    const Outputs r = d.download();
    return all_bytes(r.out.data(), r.out.size(), 0xFF);
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.message);
    d.poison();
    jfa_attention_params p = d.params(h);
    jfa_paged_kv kv = d.kv(h);
    bad.mutate(p, kv);
    EXPECT_EQ(jfa_attention_forward_paged(&p, &kv), bad.status);
    EXPECT_NE(std::string(jfa_last_error_message()).find(bad.message), std::string::npos)
        << jfa_last_error_message();
    EXPECT_TRUE(out_untouched()) << "a rejected call wrote out";
  }
  const jfa_attention_params p = d.params(h);
  const jfa_paged_kv kv = d.kv(h);
  std::vector<double> ref(static_cast<size_t>(h.total_q) * c.heads_q * c.head_dim);
  EXPECT_EQ(jfa_attention_reference_paged(&p, &kv, nullptr, h.total_q, ref.data(), nullptr),
            JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("the reference needs host buffers"),
            std::string::npos)
      << jfa_last_error_message();
}

}  // namespace
