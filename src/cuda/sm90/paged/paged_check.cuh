// The checked mode of a paged call (device_check): the rules cu_seqlens_q, seqused_k, the block
// table and the append break, as jfa_device_check bits. The lengths kernel (one block) stores the
// word afresh; the table kernels, launched after it on the same stream, OR into it. jfa.h has no
// bits of the cache yet but the append's, so its rules take the closest k bits (paged_sm90.hpp
// lists them).
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_lengths.cuh"
#include "jfa/jfa.h"

namespace jfa::sm90 {

inline constexpr int kPagedCheckThreads = 1024;

// cu_seqlens_q by the packed call's rules (max_q is always given here), cu_seqlens_new by the
// same rules, and each sequence's keys after the append.
__global__ void __launch_bounds__(kPagedCheckThreads)
    paged_check_lengths_kernel(const PagedArgs a) {
  __shared__ int32_t broken;
  if (threadIdx.x == 0) broken = 0;
  __syncthreads();
  int32_t bits = 0;
  if (threadIdx.x == 0) {
    if (__ldg(a.cu_q) != 0) bits |= JFA_OFFSETS_Q_FIRST_NOT_ZERO;
    if (a.batch == 0 && __ldg(a.cu_q) != a.total_q) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    if (a.cu_new != nullptr && (__ldg(a.cu_new) != 0 || (a.batch == 0 && a.total_new != 0)))
      bits |= JFA_PAGED_APPEND_INVALID;
  }
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  for (int64_t b = threadIdx.x; b < a.batch; b += kPagedCheckThreads) {
    const int64_t q0 = __ldg(a.cu_q + b), q1 = __ldg(a.cu_q + b + 1);
    if (q1 < q0)
      bits |= JFA_OFFSETS_Q_DECREASING;
    else if (q1 - q0 > a.max_q)
      bits |= JFA_OFFSETS_Q_ABOVE_MAX;
    if (b == a.batch - 1 && q1 != a.total_q) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    int64_t added = 0;
    if (a.cu_new != nullptr) {
      const int64_t n0 = __ldg(a.cu_new + b), n1 = __ldg(a.cu_new + b + 1);
      if (n1 < n0 || (b == a.batch - 1 && n1 != a.total_new))
        bits |= JFA_PAGED_APPEND_INVALID;
      else
        added = n1 - n0;
    }
    const int64_t used = __ldg(a.seqused_k + b);
    if (used < 0)
      bits |= JFA_OFFSETS_K_DECREASING;
    else if (used + added > capacity || (a.max_k > 0 && used + added > a.max_k))
      bits |= JFA_OFFSETS_K_ABOVE_MAX;
  }
  if (bits != 0) atomicOr(&broken, bits);
  __syncthreads();
  if (threadIdx.x == 0) *a.device_check = broken;
}

inline constexpr int kPagedTableCheckThreads = 256;

// The block table's entries of the pages that hold a sequence's keys, the appended rows included
// (its first ceil(len_k / page_size), paged_lengths.cuh), a grid over all entries.
__global__ void __launch_bounds__(kPagedTableCheckThreads)
    paged_check_table_kernel(const PagedArgs a) {
  const int64_t entries = a.batch * a.max_pages_per_seq;
  bool outside = false;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kPagedTableCheckThreads + threadIdx.x;
       e < entries; e += static_cast<int64_t>(gridDim.x) * kPagedTableCheckThreads) {
    const int64_t b = e / a.max_pages_per_seq, j = e % a.max_pages_per_seq;
    if (j * a.page_size >= paged_len_k(a, b)) continue;
    const int32_t page = __ldg(a.block_table + e);
    outside |= page < 0 || page >= a.num_pages;
  }
  if (outside) atomicOr(a.device_check, JFA_OFFSETS_K_LAST_NOT_TOTAL);
}

// With an append: a page that receives new rows of one sequence must hold no other sequence's
// keys (JFA_PAGED_APPEND_INVALID). A grid over the entries of the pages that hold keys, each
// compared with the pages every other sequence appends to (a checked mode's cost, not a serving
// one: entries times the appending sequences' pages).
__global__ void __launch_bounds__(kPagedTableCheckThreads)
    paged_check_append_pages_kernel(const PagedArgs a) {
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  const int64_t entries = a.batch * a.max_pages_per_seq;
  bool shared = false;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kPagedTableCheckThreads + threadIdx.x;
       e < entries && !shared; e += static_cast<int64_t>(gridDim.x) * kPagedTableCheckThreads) {
    const int64_t b = e / a.max_pages_per_seq, j = e % a.max_pages_per_seq;
    if (j * a.page_size >= paged_len_k(a, b)) continue;
    const int32_t page = __ldg(a.block_table + e);
    for (int64_t other = 0; other < a.batch && !shared; ++other) {
      const int64_t added = paged_new_rows(a, other);
      if (other == b || added == 0) continue;
      const int64_t used =
          min(max(static_cast<int64_t>(__ldg(a.seqused_k + other)), int64_t{0}), capacity);
      const int64_t end = min(used + added, capacity);
      for (int64_t slot = used / a.page_size; slot * a.page_size < end; ++slot)
        shared |= __ldg(a.block_table + other * a.max_pages_per_seq + slot) == page;
    }
  }
  if (shared) atomicOr(a.device_check, JFA_PAGED_APPEND_INVALID);
}

}  // namespace jfa::sm90
