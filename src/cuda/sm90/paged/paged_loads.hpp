// Which loads the chunked prefill's producer uses (PagedLoads, forward/choices.hpp) for a call, and
// the TMA boxes of kPagesByTma. Host and device code alike: constexpr, no library calls.
#pragma once

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/forward/choices.hpp"

namespace jfa::sm90 {

// The rows of a TMA box of a K/V tile of `block_n` keys (a power of two) over pages of `page_size`
// rows: the largest power of two that divides both, so that every box lies in one page and one
// tile. Boxes of fewer than kPagedTmaMinBoxRows rows are not loaded by TMA.
JFA_HOST_DEVICE constexpr int32_t paged_tma_box_rows(int32_t page_size, int32_t block_n) {
  const int32_t lowest_bit = page_size & -page_size;
  return lowest_bit < block_n ? lowest_bit : block_n;
}

// A box keeps the 128-byte swizzle's phase (8 rows of 128 bytes, 1024-byte aligned) this way.
inline constexpr int32_t kPagedTmaMinBoxRows = 8;

// The rows of a K/V tile of block_n keys from first_key (a multiple of block_n) that lie in boxes
// of box_rows rows (paged_tma_box_rows) wholly inside a sequence's len_k keys: all of them where
// the tile's keys all lie inside, else the whole boxes before the first that reaches past the keys
// (its rows, and those after, are the tail: one page's rows, then none).
JFA_HOST_DEVICE constexpr int32_t paged_tma_rows(int32_t first_key, int32_t len_k, int32_t box_rows,
                                                 int32_t block_n) {
  const int32_t keys = len_k - first_key;
  return keys >= block_n ? block_n : keys <= 0 ? 0 : (keys & -box_rows);
}

// The loads a call takes: kPagesByTma where the pages come in boxes of kPagedTmaMinBoxRows rows or
// more and the map has a page and every page index and its out-of-bounds stand-in (num_pages) are
// int32 coordinates of it, unless `rows_asked`; kRowsByCpAsync otherwise. Measured on an H100
// (chunks of 256 tokens over 4k keys, 32:8 heads, pages of 16, bf16): 1.9-2.7x the row copies.
constexpr PagedLoads paged_loads_for(bool rows_asked, int32_t page_size, int64_t num_pages,
                                     int32_t block_n) {
  if (rows_asked || page_size < 1 || paged_tma_box_rows(page_size, block_n) < kPagedTmaMinBoxRows ||
      num_pages < 1 || num_pages >= INT32_MAX)
    return PagedLoads::kRowsByCpAsync;
  return PagedLoads::kPagesByTma;
}

}  // namespace jfa::sm90
