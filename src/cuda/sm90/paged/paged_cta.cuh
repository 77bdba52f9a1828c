// A paged decode CTA's share of the work (paged_decode.cuh): one CTA per (sequence, KV head, split
// of the sequence's keys, block of rows). Its rows are the query heads of the KV head (pack-GQA)
// times the sequence's query tokens, so that each key and value row is read from global memory
// once for all of them (once per row block where group * tokens passes kRowsPerCta).
//
// Every index read from the call is clamped: a length into [0, max_pages_per_seq * page_size], a
// query range into [0, total_q], and a key row on a page outside [0, num_pages) reads as zeros
// (paged_stream.cuh), so that invalid inputs never reach outside a buffer (the checked mode
// reports them, paged_check.cuh).
#pragma once

#include <cstdint>

#include "common/visibility.hpp"
#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_lengths.cuh"

namespace jfa::sm90 {

// A CTA's rows and keys. Row r of a sequence is token r / group, head r % group of the KV head's
// group; the CTA takes rows row0 .. row0 + rows - 1 and the split's keys [key_begin, key_end).
struct PagedCta {
  int64_t seq;
  int32_t kv_head, split;
  int32_t row0, rows;
  int32_t q_start, len_q, len_k;  // len_q: the sequence's own (its rows' diagonals)
  int32_t key_begin, key_end;
};

// The CTA of blockIdx.x (row block fastest: the row blocks of a split read the same keys at about
// the same time, the later ones from L2); false when it has no row.
template <int kRowsPerCta, int kChunkKeys>
__device__ __forceinline__ bool paged_cta(const PagedArgs& a, PagedCta* w) {
  int64_t id = blockIdx.x;
  const int32_t row_block = static_cast<int32_t>(id % a.row_blocks);
  id /= a.row_blocks;
  w->split = static_cast<int32_t>(id % a.splits);
  id /= a.splits;
  w->kv_head = static_cast<int32_t>(id % a.heads_kv);
  w->seq = id / a.heads_kv;
  const int64_t q0 = min(static_cast<int64_t>(max(__ldg(a.cu_q + w->seq), 0)), a.total_q);
  const int64_t q1 = min(max(static_cast<int64_t>(__ldg(a.cu_q + w->seq + 1)), q0), a.total_q);
  w->q_start = static_cast<int32_t>(q0);
  w->len_q = static_cast<int32_t>(q1 - q0);
  w->len_k = paged_len_k(a, w->seq);
  const int64_t rows_total = static_cast<int64_t>(min(w->len_q, a.max_q)) * a.group;
  const int64_t row0 = static_cast<int64_t>(row_block) * kRowsPerCta;
  if (row0 >= rows_total) return false;
  w->row0 = static_cast<int32_t>(row0);
  w->rows = static_cast<int32_t>(min(static_cast<int64_t>(kRowsPerCta), rows_total - row0));
  // The keys some row of the block sees: from its first token's first to its last token's last
  // (both move right with the token), split in chunk-aligned parts of at least min_split_keys.
  const int64_t first_token = row0 / a.group, last_token = (row0 + w->rows - 1) / a.group;
  const int64_t lo = jfa::detail::first_visible_key(a.window, first_token, w->len_q, w->len_k);
  const int64_t hi = max(lo, jfa::detail::key_end(a.window, last_token, w->len_q, w->len_k));
  int64_t per = (hi - lo + a.splits - 1) / a.splits;
  per =
      max((per + kChunkKeys - 1) / kChunkKeys * kChunkKeys, static_cast<int64_t>(a.min_split_keys));
  const int64_t begin = min(lo + w->split * per, hi);
  w->key_begin = static_cast<int32_t>(begin);
  w->key_end = static_cast<int32_t>(min(begin + per, hi));
  return true;
}

// Row r of a CTA (in its block of rows): its query head, its token and the keys of the split it
// sees, [lo, hi) (empty where it sees none).
struct PagedRow {
  int32_t head, lo, hi;
  int64_t token;
};

__device__ __forceinline__ PagedRow paged_row(const PagedArgs& a, const PagedCta& w, int32_t r) {
  const int32_t row = w.row0 + r;
  const int32_t i = row / a.group;
  PagedRow x;
  x.head = w.kv_head * a.group + row % a.group;
  x.token = static_cast<int64_t>(w.q_start) + i;
  x.lo = max(static_cast<int32_t>(jfa::detail::first_visible_key(a.window, i, w.len_q, w.len_k)),
             w.key_begin);
  x.hi = min(static_cast<int32_t>(jfa::detail::key_end(a.window, i, w.len_q, w.len_k)), w.key_end);
  return x;
}

// The bounds of a group of rows' keys: the sub-tiles before any_lo or from any_hi on hold no key
// any row sees, those in [all_lo, all_hi) only keys every row sees.
struct PagedBounds {
  int32_t any_lo = INT32_MAX, any_hi = INT32_MIN, all_lo = INT32_MIN, all_hi = INT32_MAX;

  __device__ __forceinline__ void add(int32_t lo, int32_t hi) {
    if (lo < hi) {
      any_lo = min(any_lo, lo);
      any_hi = max(any_hi, hi);
    }
    all_lo = max(all_lo, lo);
    all_hi = min(all_hi, hi);
  }
};

}  // namespace jfa::sm90
