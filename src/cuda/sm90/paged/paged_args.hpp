// What the paged kernels read (paged_check.cuh, paged_decode.cuh, paged_combine.cuh): the call's
// buffers and sizes, the launch's plan and the score constants, filled once on the host
// (paged_dispatch.cu).
#pragma once

#include <vector_types.h>

#include <cstdint>

#include "common/visibility.hpp"

namespace jfa::sm90 {

// log2(page_size) where the page size is a power of two (the kernels then shift instead of
// dividing), else -1.
constexpr int32_t page_shift_of(int32_t page_size) {
  for (int32_t shift = 0; shift < 31; ++shift)
    if (page_size == int32_t{1} << shift) return shift;
  return -1;
}

// The index, in a sequence's block-table row, of the page that holds its key `key`.
JFA_HOST_DEVICE inline int32_t page_index_of(int32_t key, int32_t page_shift, int32_t page_size) {
  return page_shift >= 0 ? key >> page_shift : key / page_size;
}

struct PagedArgs {
  const void* q;
  void* out;
  float* lse;                  // nullable, [heads_q, total_q]
  const void* k_cache;         // [num_pages, page_size, heads_kv, head_dim], packed
  const void* v_cache;         // the same shape
  const int32_t* block_table;  // [batch, max_pages_per_seq]
  const int32_t* seqused_k;    // [batch]
  const int32_t* cu_q;         // [batch + 1]
  // The append (nullable, all three): the new rows, packed by cu_new, written into the pages
  // before the decode kernel runs (paged_append.cuh); the key counts include them.
  const void* k_new;           // [total_new, heads_kv, head_dim]
  const void* v_new;           // the same shape
  const int32_t* cu_new;       // [batch + 1]
  const float* sinks;          // nullable, [heads_q]
  int32_t* device_check;       // nullable: the checked mode's word
  // The partial results of the splits (the workspace), with more than one split: per split and row
  // (token * heads_q + head), O as the sum of p * v relative to the split's maximum, and (maximum
  // in score units, sum of p), (-inf, 0) where the split held no key the row sees.
  float* part_o;    // [splits, total_q * heads_q, head_dim]
  float2* part_ml;  // [splits, total_q * heads_q]
  int64_t q_token_stride, q_head_stride, out_token_stride, out_head_stride;
  int64_t batch, total_q, num_pages, total_new;
  int32_t heads_q, heads_kv, group;
  int32_t page_size, max_pages_per_seq;
  int32_t page_shift;  // log2(page_size) when it is a power of two (shifts, not divisions), else -1
  int32_t max_q;       // the max_seqlen_q hint: rows of tokens past it are not computed
  int32_t max_k;       // the max_seqlen_k hint, 0 when not given (the checked mode reads it)
  int32_t k_row_vecs, v_row_vecs;  // 16-byte vectors of a token's keys (values) over its heads
  int32_t row_blocks, splits;
  int32_t min_split_keys;
  jfa::detail::Window window;  // causal folded in
  // Scores in score units u: q.k, or with softcap c * tanh(q.k * softcap_in); the softmax takes
  // exp2((u - max) * score_scale_log2) and the LSE is max * score_scale + log(sum), as in the
  // packed kernels (fwd_args.hpp), so that a huge scale leaves O accurate.
  float softcap, softcap_in, score_scale, score_scale_log2;
};

}  // namespace jfa::sm90
