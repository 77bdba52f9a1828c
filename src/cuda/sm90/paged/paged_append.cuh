// The append of a paged call (kv->k_new): each new key and value row copied into its page, before
// the decode kernel reads the cache on the same stream. One CTA a new token at a time (a grid
// stride over total_new), its rows copied 16 bytes a thread.
//
// Every index read from the call is clamped or skipped, as the decode kernel's: a token whose
// sequence cu_seqlens_new does not place, a row past its table or on a page outside [0, num_pages)
// is not written (the checked mode reports such inputs, paged_check.cuh).
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_lengths.cuh"

namespace jfa::sm90 {

inline constexpr int kPagedAppendThreads = 128;

__global__ void __launch_bounds__(kPagedAppendThreads) paged_append_kernel(const PagedArgs a) {
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  const uint4* k_new = static_cast<const uint4*>(a.k_new);
  const uint4* v_new = static_cast<const uint4*>(a.v_new);
  uint4* k_cache = static_cast<uint4*>(const_cast<void*>(a.k_cache));
  uint4* v_cache = static_cast<uint4*>(const_cast<void*>(a.v_cache));
  for (int64_t t = blockIdx.x; t < a.total_new; t += gridDim.x) {
    // The last sequence whose new rows start at or before t (binary search over the offsets).
    int64_t lo = 0, hi = a.batch - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (__ldg(a.cu_new + mid) <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t first = __ldg(a.cu_new + lo), end = __ldg(a.cu_new + lo + 1);
    if (t < first || t >= end) continue;
    const int64_t pos = max(__ldg(a.seqused_k + lo), 0) + (t - first);
    if (pos >= capacity) continue;
    const int64_t slot = pos / a.page_size;
    const int32_t page = __ldg(a.block_table + lo * a.max_pages_per_seq + slot);
    if (page < 0 || page >= a.num_pages) continue;
    const int64_t row = static_cast<int64_t>(page) * a.page_size + (pos - slot * a.page_size);
    for (int32_t i = threadIdx.x; i < a.k_row_vecs; i += kPagedAppendThreads)
      k_cache[row * a.k_row_vecs + i] = __ldg(k_new + t * a.k_row_vecs + i);
    for (int32_t i = threadIdx.x; i < a.v_row_vecs; i += kPagedAppendThreads)
      v_cache[row * a.v_row_vecs + i] = __ldg(v_new + t * a.v_row_vecs + i);
  }
}

}  // namespace jfa::sm90
