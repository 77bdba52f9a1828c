// The forward and the float64 reference over a paged KV cache (jfa_attention_forward_paged,
// jfa_attention_reference_paged) on the CPU backend: random block tables (pages shuffled, pages
// shared by sequences, partial last pages, entries past the used pages left as garbage), cache
// lengths 0, 1 and page multiples +- 1, page sizes 1 to 64, GQA, decode, speculative and chunked
// query lengths, the causal mask, windows, softcap and sinks. Each call must give exactly what the
// packed call gives on the keys gathered here, and the forward must match the float64 reference;
// invalid tables, lengths and fields are errors that name them, and backend=cuda on host buffers is
// refused as the packed forward refuses it. The workspace size query of the CUDA paged forward: 0
// for host calls, its arguments checked, and (in a CUDA build, with or without a GPU) the bytes of
// the split plan, which is host code tested here by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/paged/paged_plan.hpp"
#include "jfa/jfa.h"
#include "test_seed.hpp"

namespace {

struct PagedCase {
  std::vector<int32_t> len_q, seqused;
  int32_t page_size = 16;
  int32_t heads_q = 4, heads_kv = 2, head_dim = 8, head_dim_v = 8;
  bool causal = true;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sinks = false;
  bool share_pages = true;  // later sequences sometimes read sequence 0's first page
};

// A cache, its block table and the same keys packed per sequence, built from one seed.
struct PagedData {
  PagedCase c;
  int64_t num_pages = 0;
  int32_t max_pages = 0;
  std::vector<float> q, k_cache, v_cache, k_packed, v_packed, sinks, out, lse;
  std::vector<int32_t> block_table, cu_q, cu_k;

  PagedData(const PagedCase& pc, std::mt19937_64& rng) : c(pc) {
    std::normal_distribution<float> normal(0.f, 1.f);
    const int64_t batch = static_cast<int64_t>(c.len_q.size());
    cu_q.assign(batch + 1, 0);
    cu_k.assign(batch + 1, 0);
    for (int64_t b = 0; b < batch; ++b) {
      cu_q[b + 1] = cu_q[b] + c.len_q[b];
      cu_k[b + 1] = cu_k[b] + c.seqused[b];
      max_pages = std::max(max_pages, (c.seqused[b] + c.page_size - 1) / c.page_size);
    }
    max_pages += 1;  // a column past every sequence's pages, left as garbage
    int64_t needed = 0;
    for (int32_t n : c.seqused) needed += (n + c.page_size - 1) / c.page_size;
    num_pages = needed + 3;  // pages no sequence uses
    const int64_t rk = static_cast<int64_t>(c.heads_kv) * c.head_dim;
    const int64_t rv = static_cast<int64_t>(c.heads_kv) * c.head_dim_v;
    k_cache.resize(num_pages * c.page_size * rk);
    v_cache.resize(num_pages * c.page_size * rv);
    for (float& x : k_cache) x = normal(rng);
    for (float& x : v_cache) x = normal(rng);
    // Pages shuffled over the sequences; a later sequence sometimes reads a page of an earlier one.
    std::vector<int32_t> pages(num_pages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    block_table.assign(batch * max_pages, -7);
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t used = (c.seqused[b] + c.page_size - 1) / c.page_size;
      for (int32_t j = 0; j < used; ++j) {
        const bool share =
            c.share_pages && b > 0 && j == 0 && rng() % 3 == 0 && block_table[0] >= 0;
        block_table[b * max_pages + j] = share ? block_table[0] : pages[next++];
      }
    }
    // The same keys and values, packed as the packed call takes them.
    k_packed.resize(std::max<int64_t>(cu_k.back(), 1) * rk);
    v_packed.resize(std::max<int64_t>(cu_k.back(), 1) * rv);
    for (int64_t b = 0; b < batch; ++b)
      for (int32_t t = 0; t < c.seqused[b]; ++t) {
        const int64_t page = block_table[b * max_pages + t / c.page_size];
        const int64_t row = page * c.page_size + t % c.page_size;
        std::copy_n(&k_cache[row * rk], rk, &k_packed[(cu_k[b] + t) * rk]);
        std::copy_n(&v_cache[row * rv], rv, &v_packed[(cu_k[b] + t) * rv]);
      }
    q.resize(std::max<int64_t>(cu_q.back(), 1) * c.heads_q * c.head_dim);
    for (float& x : q) x = normal(rng);
    std::normal_distribution<float> sink(0.f, 2.f);
    for (int32_t h = 0; c.sinks && h < c.heads_q; ++h) sinks.push_back(sink(rng));
    out.assign(static_cast<size_t>(cu_q.back()) * c.heads_q * c.head_dim_v, NAN);
    lse.assign(static_cast<size_t>(cu_q.back()) * c.heads_q, NAN);
  }

  jfa_attention_params params(bool paged) {
    jfa_attention_params p;
    jfa_attention_params_init(&p);
    p.q = q.data();
    p.out = out.data();
    p.lse = lse.data();
    p.cu_seqlens_q = cu_q.data();
    p.batch = static_cast<int64_t>(c.len_q.size());
    p.total_q = cu_q.back();
    if (!paged) {
      p.k = k_packed.data();
      p.v = v_packed.data();
      p.cu_seqlens_k = cu_k.data();
      p.total_k = cu_k.back();
    }
    p.heads_q = c.heads_q;
    p.heads_kv = c.heads_kv;
    p.head_dim = c.head_dim;
    p.head_dim_v = c.head_dim_v;
    p.dtype = JFA_DTYPE_FLOAT32;
    p.causal = c.causal ? 1 : 0;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    p.sinks = c.sinks ? sinks.data() : nullptr;
    p.backend = JFA_BACKEND_CPU;
    return p;
  }

  jfa_paged_kv kv() {
    jfa_paged_kv kv;
    EXPECT_EQ(jfa_paged_kv_init(&kv), JFA_SUCCESS);
    kv.k_cache = k_cache.data();
    kv.v_cache = v_cache.data();
    kv.block_table = block_table.data();
    kv.seqused_k = c.seqused.data();
    kv.num_pages = num_pages;
    kv.page_size = c.page_size;
    kv.max_pages_per_seq = max_pages;
    return kv;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void check_case(const PagedCase& pc, std::mt19937_64& rng) {
  PagedData d(pc, rng);
  SCOPED_TRACE(testing::Message() << "page_size " << pc.page_size << " batch " << pc.len_q.size()
                                  << " causal " << pc.causal << " window " << pc.window_left << ","
                                  << pc.window_right << " softcap " << pc.softcap << " sinks "
                                  << pc.sinks);
  jfa_paged_kv kv = d.kv();
  jfa_attention_params paged = d.params(true);
  ASSERT_EQ(jfa_attention_forward_paged(&paged, &kv), JFA_SUCCESS) << jfa_last_error_message();
  const std::vector<float> out_paged = d.out, lse_paged = d.lse;
  std::fill(d.out.begin(), d.out.end(), NAN);
  std::fill(d.lse.begin(), d.lse.end(), NAN);
  jfa_attention_params packed = d.params(false);
  ASSERT_EQ(jfa_attention_forward(&packed), JFA_SUCCESS) << jfa_last_error_message();
  EXPECT_TRUE(same_bits(out_paged, d.out)) << "out differs from the packed call's";
  EXPECT_TRUE(same_bits(lse_paged, d.lse)) << "lse differs from the packed call's";

  // The references: paged equals packed exactly, and the forward is within float32 rounding.
  const int64_t total_q = d.cu_q.back();
  const size_t n_out = static_cast<size_t>(total_q) * pc.heads_q * pc.head_dim_v;
  std::vector<double> ref_paged(n_out), lse_ref_paged(total_q * pc.heads_q);
  std::vector<double> ref_packed(n_out), lse_ref_packed(total_q * pc.heads_q);
  ASSERT_EQ(jfa_attention_reference_paged(&paged, &kv, nullptr, total_q, ref_paged.data(),
                                          lse_ref_paged.data()),
            JFA_SUCCESS)
      << jfa_last_error_message();
  ASSERT_EQ(
      jfa_attention_reference(&packed, nullptr, total_q, ref_packed.data(), lse_ref_packed.data()),
      JFA_SUCCESS);
  EXPECT_TRUE(ref_paged == ref_packed && lse_ref_paged == lse_ref_packed);
  double worst = 0;
  for (size_t i = 0; i < n_out; ++i) worst = std::max(worst, std::abs(out_paged[i] - ref_paged[i]));
  EXPECT_LE(worst, 1e-4);
  for (size_t i = 0; i < lse_ref_paged.size(); ++i) {
    if (std::isinf(lse_ref_paged[i]))
      EXPECT_EQ(lse_paged[i], static_cast<float>(lse_ref_paged[i])) << "lse " << i;
    else
      EXPECT_NEAR(lse_paged[i], lse_ref_paged[i], 1e-4 * (1 + std::abs(lse_ref_paged[i])));
  }
}

TEST(PagedKv, MatchesThePackedCallAndTheReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int32_t page : {1, 3, 16, 64}) {
    // Cache lengths 0, 1, page multiples +- 1 and longer; decode (1 query), speculative (4) and
    // chunked (40) steps.
    const std::vector<int32_t> used = {
        0, 1, page - 1 > 0 ? page - 1 : 2, page, page + 1, 2 * page + 1, 150};
    std::vector<int32_t> len_q;
    for (size_t i = 0; i < used.size(); ++i) len_q.push_back(i % 3 == 0 ? 1 : i % 3 == 1 ? 4 : 40);
    PagedCase c;
    c.page_size = page;
    c.seqused = used;
    c.len_q = len_q;
    check_case(c, rng);  // causal, GQA 4:2
    c.causal = false;
    c.heads_kv = 1;  // MQA
    c.head_dim_v = 12;
    check_case(c, rng);
    c.causal = true;
    c.window_left = 9;
    c.softcap = 2.f;
    c.sinks = true;
    c.heads_kv = 4;
    check_case(c, rng);
  }
  PagedCase none;  // no sequence at all, and sequences without keys
  none.len_q = {};
  none.seqused = {};
  check_case(none, rng);
  none.len_q = {3, 1};
  none.seqused = {0, 0};
  check_case(none, rng);
}

// An append (kv->k_new): the step's new rows are written into their pages and attended over with
// the rows before them; the reference computes the same without writing; calls rejected for their
// arguments write nothing.
TEST(PagedKv, AppendWritesTheNewRowsAndAttendsOverThem) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  for (int32_t page : {1, 4, 16}) {
    PagedCase c;
    c.page_size = page;
    c.seqused = {1, 5, 40, 17, 0};  // keys after the append
    c.len_q = {1, 4, 9, 1, 2};
    c.share_pages = false;
    PagedData d(c, rng);
    const std::vector<int32_t> added = {1, 4, 9, 0, 0};  // new rows, the last ones of each sequence
    std::vector<int32_t> before(c.seqused.size()), cu_new(c.seqused.size() + 1, 0);
    const int64_t rk = int64_t{c.heads_kv} * c.head_dim, rv = int64_t{c.heads_kv} * c.head_dim_v;
    std::vector<float> k_new, v_new;
    const std::vector<float> k_cache = d.k_cache, v_cache = d.v_cache;  // with the new rows in
    for (size_t b = 0; b < c.seqused.size(); ++b) {
      before[b] = c.seqused[b] - added[b];
      cu_new[b + 1] = cu_new[b] + added[b];
      for (int32_t t = before[b]; t < c.seqused[b]; ++t) {
        const int64_t row = int64_t{d.block_table[b * d.max_pages + t / page]} * page + t % page;
        k_new.insert(k_new.end(), &d.k_cache[row * rk], &d.k_cache[row * rk] + rk);
        v_new.insert(v_new.end(), &d.v_cache[row * rv], &d.v_cache[row * rv] + rv);
        std::fill_n(&d.k_cache[row * rk], rk, 1e6f);  // stale rows the append must overwrite
        std::fill_n(&d.v_cache[row * rv], rv, -1e6f);
      }
    }
    const std::vector<float> stale_k = d.k_cache, stale_v = d.v_cache;
    jfa_paged_kv kv = d.kv();
    kv.seqused_k = before.data();
    kv.k_new = k_new.data();
    kv.v_new = v_new.data();
    kv.cu_seqlens_new = cu_new.data();
    kv.total_new = cu_new.back();
    jfa_attention_params paged = d.params(true);

    // Rejected calls write nothing: a page of the append that another sequence reads, a cache
    // length past the table, out on top of q.
    std::vector<int32_t> shared_table = d.block_table;
    const int32_t last_page_of_2 = shared_table[2 * d.max_pages + (c.seqused[2] - 1) / page];
    shared_table[4 * d.max_pages] = last_page_of_2;  // sequence 4 (no keys) ... gets none to read
    std::vector<int32_t> used4 = before;
    used4[4] = 1;  // now sequence 4 reads that page too
    jfa_paged_kv bad = kv;
    bad.block_table = shared_table.data();
    bad.seqused_k = used4.data();
    EXPECT_EQ(jfa_attention_forward_paged(&paged, &bad), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(jfa_last_error_message()).find("receives appended rows of sequence 2"),
              std::string::npos)
        << jfa_last_error_message();
    std::vector<int32_t> too_many = cu_new;
    for (size_t b = 1; b < too_many.size(); ++b) too_many[b] += d.max_pages * page;
    bad = kv;
    bad.cu_seqlens_new = too_many.data();
    std::vector<float> big_k(too_many.back() * rk), big_v(too_many.back() * rv);
    bad.k_new = big_k.data();
    bad.v_new = big_v.data();
    bad.total_new = too_many.back();
    EXPECT_EQ(jfa_attention_forward_paged(&paged, &bad), JFA_ERROR_INVALID_ARGUMENT);
    jfa_attention_params overlapping = paged;
    overlapping.out = d.q.data();
    EXPECT_EQ(jfa_attention_forward_paged(&overlapping, &kv), JFA_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(same_bits(d.k_cache, stale_k) && same_bits(d.v_cache, stale_v))
        << "a rejected call wrote the cache";

    // The reference does not write, and equals the packed reference over the full keys.
    const int64_t total_q = d.cu_q.back();
    std::vector<double> ref(total_q * c.heads_q * c.head_dim_v), ref_packed(ref.size());
    ASSERT_EQ(jfa_attention_reference_paged(&paged, &kv, nullptr, total_q, ref.data(), nullptr),
              JFA_SUCCESS)
        << jfa_last_error_message();
    EXPECT_TRUE(same_bits(d.k_cache, stale_k)) << "the reference wrote the cache";
    jfa_attention_params packed = d.params(false);
    ASSERT_EQ(jfa_attention_reference(&packed, nullptr, total_q, ref_packed.data(), nullptr),
              JFA_SUCCESS);
    EXPECT_TRUE(ref == ref_packed);

    // The forward writes exactly the new rows, and equals the packed call.
    ASSERT_EQ(jfa_attention_forward_paged(&paged, &kv), JFA_SUCCESS) << jfa_last_error_message();
    EXPECT_TRUE(same_bits(d.k_cache, k_cache) && same_bits(d.v_cache, v_cache))
        << "the cache after the append is not the cache with the new rows";
    const std::vector<float> out_paged = d.out;
    ASSERT_EQ(jfa_attention_forward(&packed), JFA_SUCCESS);
    EXPECT_TRUE(same_bits(out_paged, d.out));
  }
}

class PagedKvErrors : public ::testing::Test {
 protected:
  PagedKvErrors() : rng_(7), d_(make_case(), rng_) {}
  static PagedCase make_case() {
    PagedCase c;
    c.len_q = {2, 3};
    c.seqused = {20, 5};
    c.page_size = 16;
    return c;
  }
  jfa_status call() {
    jfa_attention_params p = d_.params(true);
    jfa_paged_kv kv = d_.kv();
    mutate_(p, kv);
    return jfa_attention_forward_paged(&p, &kv);
  }
  std::mt19937_64 rng_;
  PagedData d_;
  std::function<void(jfa_attention_params&, jfa_paged_kv&)> mutate_ = [](jfa_attention_params&,
                                                                         jfa_paged_kv&) {};
};

TEST_F(PagedKvErrors, NameWhatIsWrong) {
  struct Bad {
    const char* message;
    jfa_status status;
    std::function<void(jfa_attention_params&, jfa_paged_kv&)> mutate;
  };
  const int32_t max_pages = d_.max_pages;
  std::vector<int32_t> table = d_.block_table;
  const std::vector<Bad> cases = {
      {"kv->block_table[1][0]=", JFA_ERROR_INVALID_ARGUMENT,
       [&](auto&, jfa_paged_kv& kv) {
         table[max_pages] = static_cast<int32_t>(kv.num_pages);
         kv.block_table = table.data();
       }},
      {"kv->block_table[0][1]=-1", JFA_ERROR_INVALID_ARGUMENT,
       [&](auto&, jfa_paged_kv& kv) {
         table = d_.block_table;
         table[1] = -1;
         kv.block_table = table.data();
       }},
      {"kv->seqused_k[1]=", JFA_ERROR_INVALID_ARGUMENT,
       [&](auto&, jfa_paged_kv& kv) {
         static std::vector<int32_t> used;
         used = {20, max_pages * 16 + 1};
         kv.seqused_k = used.data();
       }},
      {"kv->seqused_k[0]=-1", JFA_ERROR_INVALID_ARGUMENT,
       [&](auto&, jfa_paged_kv& kv) {
         static std::vector<int32_t> used;
         used = {-1, 5};
         kv.seqused_k = used.data();
       }},
      {"kv->page_size must be >= 1", JFA_ERROR_INVALID_ARGUMENT,
       [](auto&, jfa_paged_kv& kv) { kv.page_size = 0; }},
      {"kv->struct_size is 0", JFA_ERROR_INVALID_ARGUMENT,
       [](auto&, jfa_paged_kv& kv) { kv.struct_size = 0; }},
      {"params->k, v, cu_seqlens_k and total_k are unused", JFA_ERROR_INVALID_ARGUMENT,
       [&](jfa_attention_params& p, auto&) { p.k = d_.k_packed.data(); }},
      {"out and kv->k_cache share memory", JFA_ERROR_INVALID_ARGUMENT,
       [&](jfa_attention_params& p, auto&) { p.out = d_.k_cache.data(); }},
  };
  for (const Bad& bad : cases) {
    mutate_ = bad.mutate;
    EXPECT_EQ(call(), bad.status) << bad.message;
    EXPECT_NE(std::string(jfa_last_error_message()).find(bad.message), std::string::npos)
        << "message: " << jfa_last_error_message() << "\nwanted: " << bad.message;
  }
  mutate_ = [](auto&, auto&) {};
  EXPECT_EQ(call(), JFA_SUCCESS) << jfa_last_error_message();  // garbage past the used pages
  EXPECT_EQ(jfa_attention_forward_paged(nullptr, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  jfa_attention_params p = d_.params(true);
  EXPECT_EQ(jfa_attention_forward_paged(&p, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("kv must not be NULL"), std::string::npos);
  jfa_paged_kv kv;
  EXPECT_EQ(jfa_paged_kv_init_sized(&kv, sizeof kv - 8), JFA_ERROR_INVALID_ARGUMENT);
}

// backend=cuda on host buffers, as the packed forward answers it (no CUDA in this build, or host
// buffers for the CUDA backend), before anything is written, an append included; the CPU and auto
// backends give the packed call's bits, and the reference, a host computation, ignores the backend
// as jfa_attention_reference does. No GPU is needed: the CUDA route refuses host buffers first.
TEST(PagedKv, CudaBackendOnHostBuffersIsRefusedAsThePackedForward) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  PagedCase c;
  c.len_q = {1, 4, 0};
  c.seqused = {20, 5, 3};
  c.window_left = 7;
  c.softcap = 3.f;
  c.sinks = true;
  c.share_pages = false;  // the append below writes sequence 0's last page
  PagedData d(c, rng);
  auto poison = [&] {
    std::fill(d.out.begin(), d.out.end(), NAN);
    std::fill(d.lse.begin(), d.lse.end(), NAN);
  };
  auto all_nan = [&] {
    return std::all_of(d.out.begin(), d.out.end(), [](float x) { return std::isnan(x); }) &&
           std::all_of(d.lse.begin(), d.lse.end(), [](float x) { return std::isnan(x); });
  };
  jfa_attention_params packed = d.params(false);
  ASSERT_EQ(jfa_attention_forward(&packed), JFA_SUCCESS) << jfa_last_error_message();
  const std::vector<float> out_packed = d.out, lse_packed = d.lse;
  poison();
  packed.backend = JFA_BACKEND_CUDA;
  const jfa_status refused = jfa_attention_forward(&packed);
  const std::string packed_message = jfa_last_error_message();
  ASSERT_TRUE(refused == JFA_ERROR_BACKEND_UNAVAILABLE || refused == JFA_ERROR_INVALID_ARGUMENT)
      << jfa_status_string(refused) << ": " << packed_message;

  const std::vector<float> k_cache = d.k_cache, v_cache = d.v_cache;
  jfa_paged_kv kv = d.kv();
  jfa_attention_params p = d.params(true);
  p.backend = JFA_BACKEND_CUDA;
  EXPECT_EQ(jfa_attention_forward_paged(&p, &kv), refused);
  EXPECT_EQ(jfa_last_error_message(), packed_message);
  EXPECT_TRUE(all_nan()) << "a refused call wrote out or lse";
  // An append for the CUDA backend on host buffers: refused as the packed call is, the cache
  // untouched.
  const std::vector<float> k_new(static_cast<size_t>(c.heads_kv) * c.head_dim, 1.f);
  const std::vector<float> v_new(static_cast<size_t>(c.heads_kv) * c.head_dim_v, 1.f);
  const std::vector<int32_t> cu_new = {0, 1, 1, 1}, before = {19, 5, 3};
  jfa_paged_kv appending = kv;
  appending.seqused_k = before.data();
  appending.k_new = k_new.data();
  appending.v_new = v_new.data();
  appending.cu_seqlens_new = cu_new.data();
  appending.total_new = 1;
  const jfa_status s = jfa_attention_forward_paged(&p, &appending);
  EXPECT_EQ(s, refused) << jfa_status_string(s);
  EXPECT_EQ(jfa_last_error_message(), packed_message);
  EXPECT_TRUE(all_nan() && same_bits(d.k_cache, k_cache) && same_bits(d.v_cache, v_cache))
      << "a refused append wrote out, lse or the cache";

  for (jfa_backend backend : {JFA_BACKEND_CPU, JFA_BACKEND_AUTO}) {
    poison();
    p.backend = backend;
    ASSERT_EQ(jfa_attention_forward_paged(&p, &kv), JFA_SUCCESS) << jfa_last_error_message();
    EXPECT_TRUE(same_bits(d.out, out_packed) && same_bits(d.lse, lse_packed))
        << "backend " << backend << " differs from the packed call";
  }
  const int64_t total_q = d.cu_q.back();
  std::vector<double> ref(static_cast<size_t>(total_q) * c.heads_q * c.head_dim_v);
  std::vector<double> ref_cuda(ref.size());
  p.backend = JFA_BACKEND_CPU;
  ASSERT_EQ(jfa_attention_reference_paged(&p, &kv, nullptr, total_q, ref.data(), nullptr),
            JFA_SUCCESS)
      << jfa_last_error_message();
  p.backend = JFA_BACKEND_CUDA;
  ASSERT_EQ(jfa_attention_reference_paged(&p, &kv, nullptr, total_q, ref_cuda.data(), nullptr),
            JFA_SUCCESS)
      << jfa_last_error_message();
  EXPECT_TRUE(ref == ref_cuda);
}

// ---- The workspace size query (jfa_attention_paged_workspace_size) ----------------------------

// A decode-like call of these sizes with no buffer (the query reads none), for the CUDA backend.
jfa_attention_params shape_params(int64_t batch, int32_t tokens, int32_t heads_q, int32_t heads_kv,
                                  int32_t head_dim, int32_t max_k, int32_t window_left = -1) {
  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.batch = batch;
  p.total_q = batch * tokens;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.dtype = JFA_DTYPE_BFLOAT16;
  p.causal = 1;
  p.max_seqlen_q = tokens;
  p.max_seqlen_k = max_k;
  p.window_left = window_left;
  p.backend = JFA_BACKEND_CUDA;
  return p;
}

jfa::sm90::PagedShape shape_of(const jfa_attention_params& p) {
  return {p.batch,    p.total_q,      p.heads_q,      p.heads_kv,
          p.head_dim, p.max_seqlen_q, p.max_seqlen_k, p.window_left};
}

// Partials of `rows` (token, head, split) rows: fp32 O and a (max, sum) pair each.
size_t partials(size_t rows, size_t head_dim) { return rows * head_dim * 4 + rows * 8; }

// The plan by hand, on 132 SMs (264 CTA slots): the splits (up to one per 256 keys, 16 without a
// hint) with the least waves times (keys a CTA + 64), then the partials of total_q * heads_q rows
// per split. The size query answers the most a plan on up to 132 SMs needs.
TEST(PagedWorkspace, ThePlanByHand) {
  using jfa::sm90::paged_workspace_bytes;
  const auto splits = [](const jfa_attention_params& p) {
    return jfa::sm90::plan_paged(shape_of(p), 132).splits;
  };
  // B1 decode 32:8 d128 (32 rows a CTA): 1 row block, 8 CTAs: one wave of 16 splits, the cap of
  // 4096 / 256, on any number of SMs.
  EXPECT_EQ(splits(shape_params(1, 1, 32, 8, 128, 4096)), 16);
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(1, 1, 32, 8, 128, 4096))),
            partials(32 * 16, 128));
  // spec4 64:8 d64 (64 rows a CTA): 32 rows a KV head, 1 row block, 8 CTAs: 33 splits fill the
  // slots once (under the cap 64).
  EXPECT_EQ(splits(shape_params(1, 4, 64, 8, 64, 32768)), 33);
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(1, 4, 64, 8, 64, 32768))),
            partials(4 * 64 * 33, 64));
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(1, 1, 32, 8, 128, 300))),
            partials(32 * 2, 128));
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(1, 1, 32, 8, 128, 0))),
            partials(32 * 16, 128));  // no hint: 16 splits
  // A left window of 600 bounds a row's keys to 601 (3 splits), whatever the hint says.
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(1, 1, 32, 8, 128, 0, 600))),
            partials(32 * 3, 128));
  // B8 32:8 d128: 64 CTAs a split: 4 splits take one wave of 8 K keys; 5 would take two of 6.6 K.
  EXPECT_EQ(splits(shape_params(8, 1, 32, 8, 128, 32768)), 4);
  // B64: 512 CTAs, two waves of 32 K keys with one split on 132 SMs; on 125 (250 slots) one split
  // takes three waves, 16 splits 33 waves of 2 K keys (69.7 K against 98.5 K): the query's answer.
  EXPECT_EQ(splits(shape_params(64, 1, 32, 8, 128, 32768)), 1);
  EXPECT_EQ(jfa::sm90::plan_paged(shape_of(shape_params(64, 1, 32, 8, 128, 32768)), 125).splits,
            16);
  EXPECT_EQ(paged_workspace_bytes(shape_of(shape_params(64, 1, 32, 8, 128, 32768))),
            partials(64 * 32 * 16, 128));
  // d256 (16 rows a CTA): 4 x 4 rows, 1 row block, 64 CTAs at B8: 4 splits, one wave.
  EXPECT_EQ(splits(shape_params(8, 4, 32, 8, 256, 4096)), 4);
  // The launch's bytes on any device are at most the query's, and one device's reach it.
  std::mt19937_64 rng(jfa::testing::logged_seed());
  const int32_t dims[] = {64, 128, 256};
  for (int round = 0; round < 2000; ++round) {
    const int32_t heads_kv = 1 + static_cast<int32_t>(rng() % 16);
    const jfa_attention_params p =
        shape_params(static_cast<int64_t>(rng() % 300), 1 + static_cast<int32_t>(rng() % 16),
                     heads_kv * (1 + static_cast<int32_t>(rng() % 16)), heads_kv, dims[rng() % 3],
                     static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 70000),
                     rng() % 4 == 0 ? static_cast<int32_t>(rng() % 5000) : -1);
    const jfa::sm90::PagedShape s = shape_of(p);
    const size_t most = paged_workspace_bytes(s);
    size_t reached = 0;
    for (int sms = 1; sms <= 140; ++sms) {
      const jfa::sm90::PagedPlan plan = jfa::sm90::plan_paged(s, sms);
      EXPECT_LE(plan.workspace_bytes, most) << "round " << round << " sms " << sms;
      reached = std::max(reached, plan.workspace_bytes);
      EXPECT_EQ(plan.workspace_bytes == 0, plan.splits == 1 || p.total_q == 0);
    }
    EXPECT_EQ(reached, most) << "round " << round;
  }
}

// Whether libjfa has the CUDA backend (with or without a GPU): its packed query answers 0 only
// without it.
bool cuda_build() {
  jfa_attention_params p = shape_params(1, 1, 1, 1, 64, 0);
  size_t bytes = 0;
  EXPECT_EQ(jfa_attention_workspace_size(&p, &bytes), JFA_SUCCESS) << jfa_last_error_message();
  return bytes > 0;
}

size_t query(const jfa_attention_params& p, const jfa_paged_kv& kv) {
  size_t bytes = 12345;
  EXPECT_EQ(jfa_attention_paged_workspace_size(&p, &kv, &bytes), JFA_SUCCESS)
      << jfa_last_error_message();
  return bytes;
}

// The query answers the plan's bytes for the CUDA backend (no pointer read, no GPU needed), and 0
// where the CUDA paged kernels take no such call; 0 for everything without the CUDA backend.
TEST(PagedWorkspace, QueryAnswersThePlan) {
  const bool cuda = cuda_build();
  jfa_paged_kv kv;
  ASSERT_EQ(jfa_paged_kv_init(&kv), JFA_SUCCESS);
  const jfa_attention_params shapes[] = {
      shape_params(1, 1, 32, 8, 128, 4096),   shape_params(1, 4, 64, 8, 64, 32768),
      shape_params(1, 1, 32, 8, 128, 0),      shape_params(1, 1, 32, 8, 128, 0, 600),
      shape_params(64, 1, 32, 8, 128, 32768), shape_params(8, 4, 32, 8, 256, 4096),
      shape_params(3, 16, 8, 1, 64, 100000),  shape_params(0, 1, 32, 8, 128, 4096)};
  for (const jfa_attention_params& p : shapes) {
    const size_t want = cuda ? jfa::sm90::paged_workspace_bytes(shape_of(p)) : 0;
    EXPECT_EQ(query(p, kv), want) << "batch " << p.batch << " tokens " << p.max_seqlen_q
                                  << " head_dim " << p.head_dim;
  }
  EXPECT_EQ(query(shapes[0], kv) > 0, cuda);
  // Calls the CUDA paged kernels reject before they allocate: float32, head sizes they lack or
  // that differ, no max_seqlen_q hint or one above 4096 query tokens.
  const std::function<void(jfa_attention_params&)> rejected[] = {
      [](jfa_attention_params& p) { p.dtype = JFA_DTYPE_FLOAT32; },
      [](jfa_attention_params& p) { p.head_dim = 96; },
      [](jfa_attention_params& p) { p.head_dim_v = 64; },
      [](jfa_attention_params& p) { p.max_seqlen_q = 0; },
      [](jfa_attention_params& p) { p.max_seqlen_q = p.total_q = 4097; }};
  for (const auto& change : rejected) {
    jfa_attention_params p = shapes[0];
    change(p);
    EXPECT_EQ(query(p, kv), 0u);
  }
  // head_dim_v 0 means head_dim, as in the forward.
  jfa_attention_params same_v = shapes[0];
  same_v.head_dim_v = same_v.head_dim;
  EXPECT_EQ(query(same_v, kv), query(shapes[0], kv));
  // Host calls: the CPU backend, or auto with no buffer in device memory (none given, here).
  for (jfa_backend backend : {JFA_BACKEND_CPU, JFA_BACKEND_AUTO}) {
    jfa_attention_params p = shapes[0];
    p.backend = backend;
    EXPECT_EQ(query(p, kv), 0u);
  }
}

// Host buffers: the CPU backend's call needs no workspace, whichever backend field picks it; the
// query writes nothing but *bytes, and the call runs as it did.
TEST(PagedWorkspace, HostCallsNeedNone) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  PagedCase c;
  c.len_q = {1, 4, 2};
  c.seqused = {20, 5, 300};
  PagedData d(c, rng);
  const jfa_paged_kv kv = d.kv();
  for (jfa_backend backend : {JFA_BACKEND_CPU, JFA_BACKEND_AUTO}) {
    std::fill(d.out.begin(), d.out.end(), NAN);
    jfa_attention_params p = d.params(true);
    p.backend = backend;
    p.max_seqlen_q = 4;
    EXPECT_EQ(query(p, kv), 0u);
    EXPECT_TRUE(std::all_of(d.out.begin(), d.out.end(), [](float x) { return std::isnan(x); }));
    EXPECT_EQ(jfa_attention_forward_paged(&p, &kv), JFA_SUCCESS) << jfa_last_error_message();
  }
}

// Its arguments are checked as the forward checks them: NULL pointers, struct sizes, and the
// fields it reads; each error names what is wrong.
TEST(PagedWorkspace, QueryChecksItsArguments) {
  jfa_paged_kv kv;
  ASSERT_EQ(jfa_paged_kv_init(&kv), JFA_SUCCESS);
  const jfa_attention_params good = shape_params(2, 1, 8, 2, 128, 1000);
  size_t bytes = 0;
  EXPECT_EQ(jfa_attention_paged_workspace_size(nullptr, &kv, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("params must not be NULL"),
            std::string::npos);
  EXPECT_EQ(jfa_attention_paged_workspace_size(&good, nullptr, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("kv must not be NULL"), std::string::npos);
  EXPECT_EQ(jfa_attention_paged_workspace_size(&good, &kv, nullptr), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("bytes must not be NULL"),
            std::string::npos);
  jfa_paged_kv bad_kv = kv;
  bad_kv.struct_size = 0;
  EXPECT_EQ(jfa_attention_paged_workspace_size(&good, &bad_kv, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(jfa_last_error_message()).find("kv->struct_size is 0"), std::string::npos);
  bad_kv.struct_size = sizeof(jfa_paged_kv) + 8;
  EXPECT_EQ(jfa_attention_paged_workspace_size(&good, &bad_kv, &bytes), JFA_ERROR_INVALID_ARGUMENT);
  struct Bad {
    const char* message;
    std::function<void(jfa_attention_params&)> mutate;
  };
  static const float k_stand_in[1] = {0.f};
  const std::vector<Bad> cases = {
      {"struct_size", [](jfa_attention_params& p) { p.struct_size = 0; }},
      {"struct_size", [](jfa_attention_params& p) { p.struct_size = 12345; }},
      {"params->k, v, cu_seqlens_k and total_k are unused",
       [](jfa_attention_params& p) { p.k = k_stand_in; }},
      {"batch", [](jfa_attention_params& p) { p.batch = -1; }},
      {"total_q", [](jfa_attention_params& p) { p.total_q = int64_t{1} << 40; }},
      {"heads_q=8 heads_kv=0", [](jfa_attention_params& p) { p.heads_kv = 0; }},
      {"heads_q=8 heads_kv=3", [](jfa_attention_params& p) { p.heads_kv = 3; }},
      {"head_dim must be > 0", [](jfa_attention_params& p) { p.head_dim = 0; }},
      {"head_dim_v >= 0", [](jfa_attention_params& p) { p.head_dim_v = -4; }},
      {"dtype 7",
       [](jfa_attention_params& p) {
         const int32_t bits = 7;  // not a jfa_dtype, as a C caller may pass it
         std::memcpy(&p.dtype, &bits, sizeof bits);
       }},
      {"backend 9",
       [](jfa_attention_params& p) {
         const int32_t bits = 9;
         std::memcpy(&p.backend, &bits, sizeof bits);
       }},
      {"max_seqlen_q and max_seqlen_k must be >= 0",
       [](jfa_attention_params& p) { p.max_seqlen_k = -1; }},
      {"window_left=-2", [](jfa_attention_params& p) { p.window_left = -2; }},
  };
  for (const Bad& bad : cases) {
    jfa_attention_params p = good;
    bad.mutate(p);
    bytes = 777;
    EXPECT_EQ(jfa_attention_paged_workspace_size(&p, &kv, &bytes), JFA_ERROR_INVALID_ARGUMENT)
        << bad.message;
    EXPECT_NE(std::string(jfa_last_error_message()).find(bad.message), std::string::npos)
        << "message: " << jfa_last_error_message() << "\nwanted: " << bad.message;
  }
  EXPECT_EQ(jfa_attention_paged_workspace_size(&good, &kv, &bytes), JFA_SUCCESS)
      << jfa_last_error_message();
}

}  // namespace
