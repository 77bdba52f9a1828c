// The C++ API over a paged KV cache (jfa.hpp: PagedKvCache, PagedAppend, paged_attention,
// paged_attention_reference, paged_workspace_size, Workspace::prepare with a cache) on the CPU
// backend: the same bits as jfa::attention over the keys gathered from the pages, the append
// written into the pages, the reference within float32 rounding, errors thrown as jfa::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "jfa/jfa.hpp"
#include "test_seed.hpp"

namespace {

using jfa::DType;
using jfa::JaggedTensor;

JaggedTensor view(std::vector<float>& data, int64_t total, int32_t heads, int32_t d) {
  JaggedTensor t;
  t.data = data.data();
  t.dtype = DType::kFloat32;
  t.total = total;
  t.heads = heads;
  t.head_dim = d;
  return t;
}

// Three sequences of cached keys on shuffled pages of 4 rows, their queries, and the same keys
// packed (after the rows each sequence appends).
struct Case {
  static constexpr int32_t kPage = 4, kHeadsQ = 4, kHeadsKv = 2, kD = 8;
  std::vector<int32_t> used = {5, 0, 9}, added = {1, 3, 2}, len_q = {1, 3, 2};
  std::vector<int32_t> cu_q, cu_k, cu_new, table;
  std::vector<float> q, k_cache, v_cache, k_new, v_new, k_packed, v_packed;
  int64_t num_pages = 0;
  int32_t max_pages = 0;

  explicit Case(std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    const int64_t batch = 3, row = kHeadsKv * kD;
    cu_q = {0};
    cu_k = {0};
    cu_new = {0};
    for (int64_t b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + len_q[b]);
      cu_k.push_back(cu_k.back() + used[b] + added[b]);
      cu_new.push_back(cu_new.back() + added[b]);
      const int32_t pages = (used[b] + added[b] + kPage - 1) / kPage;
      max_pages = std::max(max_pages, pages);
      num_pages += pages;
    }
    num_pages += 2;
    std::vector<int32_t> order(num_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    table.assign(batch * max_pages, -1);
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int32_t j = 0; j * kPage < used[b] + added[b]; ++j)
        table[b * max_pages + j] = order[next++];
    k_cache.resize(num_pages * kPage * row);
    v_cache.resize(k_cache.size());
    for (float& x : k_cache) x = normal(rng);
    for (float& x : v_cache) x = normal(rng);
    k_new.resize(cu_new.back() * row);
    v_new.resize(k_new.size());
    for (float& x : k_new) x = normal(rng);
    for (float& x : v_new) x = normal(rng);
    q.resize(cu_q.back() * kHeadsQ * kD);
    for (float& x : q) x = normal(rng);
    // Packed: each sequence's cached rows, then its new ones.
    for (int64_t b = 0; b < batch; ++b) {
      for (int32_t t = 0; t < used[b]; ++t) {
        const int64_t at = (table[b * max_pages + t / kPage] * kPage + t % kPage) * row;
        k_packed.insert(k_packed.end(), k_cache.begin() + at, k_cache.begin() + at + row);
        v_packed.insert(v_packed.end(), v_cache.begin() + at, v_cache.begin() + at + row);
      }
      const int64_t at = cu_new[b] * row, n = added[b] * row;
      k_packed.insert(k_packed.end(), k_new.begin() + at, k_new.begin() + at + n);
      v_packed.insert(v_packed.end(), v_new.begin() + at, v_new.begin() + at + n);
    }
  }

  jfa::PagedKvCache cache() {
    jfa::PagedKvCache c;
    c.k_cache = k_cache.data();
    c.v_cache = v_cache.data();
    c.num_pages = num_pages;
    c.page_size = kPage;
    c.heads_kv = kHeadsKv;
    c.head_dim = kD;
    c.block_table = table.data();
    c.max_pages_per_seq = max_pages;
    c.seqused_k = used.data();
    return c;
  }

  jfa::PagedAppend append() {
    jfa::PagedAppend a;
    a.k_new = k_new.data();
    a.v_new = v_new.data();
    a.cu_seqlens_new = cu_new.data();
    a.total_new = cu_new.back();
    return a;
  }
};

TEST(PagedCppApi, AppendsThenMatchesThePackedCallAndTheReference) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  Case c(rng);
  const int64_t total_q = c.cu_q.back();
  std::vector<float> out(total_q * Case::kHeadsQ * Case::kD, NAN), want(out.size(), NAN);
  std::vector<float> lse(total_q * Case::kHeadsQ, NAN), want_lse(lse.size(), NAN);
  jfa::AttentionOptions options;
  options.causal = true;
  options.backend = jfa::Backend::kCpu;
  const JaggedTensor q = view(c.q, total_q, Case::kHeadsQ, Case::kD);

  // The reference first: it reads the append and writes nothing.
  const std::vector<float> k_before = c.k_cache;
  std::vector<double> ref_lse;
  const std::vector<double> ref = jfa::paged_attention_reference(
      q, c.cache(), c.cu_q.data(), 3, options, c.append(), std::nullopt, &ref_lse);
  EXPECT_EQ(c.k_cache, k_before) << "the reference wrote the cache";

  jfa::Workspace workspace;
  options.workspace = &workspace;
  options.lse = lse.data();
  jfa::paged_attention(q, view(out, total_q, Case::kHeadsQ, Case::kD), c.cache(), c.cu_q.data(), 3,
                       options, c.append());
  options.lse = want_lse.data();
  options.workspace = nullptr;
  jfa::attention(q, view(c.k_packed, c.cu_k.back(), Case::kHeadsKv, Case::kD),
                 view(c.v_packed, c.cu_k.back(), Case::kHeadsKv, Case::kD),
                 view(want, total_q, Case::kHeadsQ, Case::kD), c.cu_q.data(), c.cu_k.data(), 3,
                 options);
  EXPECT_EQ(out, want) << "the paged call differs from the packed call on the same keys";
  EXPECT_EQ(lse, want_lse);
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    err += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  EXPECT_LE(std::sqrt(err / norm), 1e-5);
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], ref_lse[i], 1e-4) << i;

  // The new rows are in their pages now: the same call without an append, over the longer caches,
  // gives the same output.
  std::vector<int32_t> after(3);
  for (int b = 0; b < 3; ++b) after[b] = c.used[b] + c.added[b];
  jfa::PagedKvCache grown = c.cache();
  grown.seqused_k = after.data();
  std::vector<float> again(out.size(), NAN);
  options.lse = nullptr;
  jfa::paged_attention(q, view(again, total_q, Case::kHeadsQ, Case::kD), grown, c.cu_q.data(), 3,
                       options);
  EXPECT_EQ(again, out);
}

TEST(PagedCppApi, ErrorsThrowAndHostCallsNeedNoWorkspace) {
  std::mt19937_64 rng(jfa::testing::logged_seed());
  Case c(rng);
  const int64_t total_q = c.cu_q.back();
  std::vector<float> out(total_q * Case::kHeadsQ * Case::kD);
  const JaggedTensor q = view(c.q, total_q, Case::kHeadsQ, Case::kD);
  jfa::AttentionOptions options;
  options.backend = jfa::Backend::kCpu;
  EXPECT_EQ(jfa::paged_workspace_size(q, c.cache(), 3, options), 0u);
  // A table entry outside the cache among a sequence's pages.
  c.table[0] = static_cast<int32_t>(c.num_pages);
  try {
    jfa::paged_attention(q, view(out, total_q, Case::kHeadsQ, Case::kD), c.cache(), c.cu_q.data(),
                         3, options);
    ADD_FAILURE() << "no error for a page outside the cache";
  } catch (const jfa::Error& e) {
    EXPECT_EQ(e.status(), jfa::Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("block_table"), std::string::npos) << e.what();
  }
  // A cache whose head size is not q's.
  jfa::PagedKvCache wrong = c.cache();
  wrong.head_dim = Case::kD * 2;
  EXPECT_THROW(jfa::paged_attention(q, view(out, total_q, Case::kHeadsQ, Case::kD), wrong,
                                    c.cu_q.data(), 3, options),
               jfa::Error);
}

}  // namespace
