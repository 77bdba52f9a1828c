#include "cli/paged.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

namespace jfa::cli {
namespace {

// Fisher-Yates with its own index mapping (std::shuffle's differs between standard libraries), so
// a seed gives the same block table everywhere.
std::vector<int32_t> shuffled_pages(int64_t num_pages, uint64_t seed) {
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = num_pages - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(pages[static_cast<size_t>(i)], pages[static_cast<size_t>(j)]);
  }
  return pages;
}

int64_t pages_for(int64_t rows, int32_t page_size) { return (rows + page_size - 1) / page_size; }

}  // namespace

jfa_paged_kv PagedCache::view() const {
  jfa_paged_kv kv;
  jfa_paged_kv_init(&kv);
  // The library only reads the cache when nothing is appended.
  kv.k_cache = const_cast<void*>(k.data());
  kv.v_cache = const_cast<void*>(v.data());
  kv.block_table = block_table.empty() ? nullptr : block_table.data();
  kv.seqused_k = seqused_k.empty() ? nullptr : seqused_k.data();
  kv.num_pages = num_pages;
  kv.page_size = page_size;
  kv.max_pages_per_seq = max_pages_per_seq;
  return kv;
}

PagedCache make_paged_cache(const tools::JaggedBatch& batch, int32_t page_size, uint64_t seed) {
  PagedCache cache;
  cache.page_size = page_size;
  cache.seqused_k = batch.lengths_k;
  int64_t max_pages = 0;
  for (const int32_t length : batch.lengths_k) {
    cache.num_pages += pages_for(length, page_size);
    max_pages = std::max(max_pages, pages_for(length, page_size));
  }
  // At least one column: the call wants a block table whenever the batch has sequences, even if
  // none of them has keys.
  cache.max_pages_per_seq = static_cast<int32_t>(std::max<int64_t>(max_pages, 1));
  cache.block_table.assign(static_cast<size_t>(batch.batch() * cache.max_pages_per_seq), 0);

  const int64_t k_row = static_cast<int64_t>(batch.heads_kv) * batch.head_dim;
  const int64_t v_row = static_cast<int64_t>(batch.heads_kv) * batch.value_dim();
  const int64_t cache_rows = cache.num_pages * page_size;
  cache.k = tools::HostBuffer(batch.dtype, cache_rows * k_row);
  cache.v = tools::HostBuffer(batch.dtype, cache_rows * v_row);

  const std::vector<int32_t> order = shuffled_pages(cache.num_pages, seed);
  std::mt19937_64 stale_rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t element = dtype_size(batch.dtype);
  const auto dtype = static_cast<jfa_dtype>(batch.dtype);
  size_t next_page = 0;
  for (int64_t b = 0; b < batch.batch(); ++b) {
    const int64_t length = batch.lengths_k[static_cast<size_t>(b)];
    for (int64_t j = 0; j < pages_for(length, page_size); ++j) {
      const int32_t page = order[next_page++];
      cache.block_table[static_cast<size_t>(b * cache.max_pages_per_seq + j)] = page;
      const int64_t rows = std::min<int64_t>(page_size, length - j * page_size);
      const int64_t src = batch.cu_k[static_cast<size_t>(b)] + j * page_size;
      const int64_t dst = static_cast<int64_t>(page) * page_size;
      std::memcpy(static_cast<unsigned char*>(cache.k.data()) + dst * k_row * element,
                  static_cast<const unsigned char*>(batch.k.data()) + src * k_row * element,
                  static_cast<size_t>(rows * k_row) * element);
      std::memcpy(static_cast<unsigned char*>(cache.v.data()) + dst * v_row * element,
                  static_cast<const unsigned char*>(batch.v.data()) + src * v_row * element,
                  static_cast<size_t>(rows * v_row) * element);
      // The rest of a last page: stale values rather than zeros.
      for (int64_t i = (dst + rows) * k_row; i < (dst + page_size) * k_row; ++i)
        detail::store_from_float(cache.k.data(), i, dtype, normal(stale_rng));
      for (int64_t i = (dst + rows) * v_row; i < (dst + page_size) * v_row; ++i)
        detail::store_from_float(cache.v.data(), i, dtype, normal(stale_rng));
    }
  }
  return cache;
}

}  // namespace jfa::cli
