// The paged layout of `jfa bench --page-size`: a batch's keys and values moved into a paged KV
// cache as inference servers keep them, for jfa_attention_forward_paged.
#pragma once

#include <cstdint>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.h"

namespace jfa::cli {

// A paged KV cache in host memory holding the keys and values of a batch.
struct PagedCache {
  int32_t page_size = 0;
  int64_t num_pages = 0;
  int32_t max_pages_per_seq = 0;
  tools::HostBuffer k, v;            // [num_pages, page_size, heads_kv, head_dim(_v)], packed
  std::vector<int32_t> block_table;  // [batch, max_pages_per_seq]
  std::vector<int32_t> seqused_k;    // [batch]: the batch's key lengths

  // The C ABI's description of these host buffers (no append).
  jfa_paged_kv view() const;
};

// The keys and values of `batch` in pages of `page_size` rows: sequence b takes the next
// ceil(len_k / page_size) pages of one random permutation of the cache's pages (drawn from `seed`
// the same way on every platform), so its pages are scattered and out of order as in a server's
// cache. The rows of a last page past a sequence's keys hold random values, as stale keys would:
// a kernel that reads them changes the result. The paged call's result equals the packed one's.
PagedCache make_paged_cache(const tools::JaggedBatch& batch, int32_t page_size, uint64_t seed);

}  // namespace jfa::cli
