// The checked mode of a paged call (device_check): the rules cu_seqlens_q, seqused_k and the block
// table break, as jfa_device_check bits. The lengths kernel (one block) stores the word afresh; the
// table kernel, launched after it on the same stream, ORs into it. jfa.h has no bits of the cache
// yet, so its rules take the closest k bits (paged_sm90.hpp lists them).
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"
#include "jfa/jfa.h"

namespace jfa::sm90 {

inline constexpr int kPagedCheckThreads = 1024;

// cu_seqlens_q by the packed call's rules (max_q is always given here) and each seqused_k.
__global__ void __launch_bounds__(kPagedCheckThreads)
    paged_check_lengths_kernel(const PagedArgs a) {
  __shared__ int32_t broken;
  if (threadIdx.x == 0) broken = 0;
  __syncthreads();
  int32_t bits = 0;
  if (threadIdx.x == 0) {
    if (__ldg(a.cu_q) != 0) bits |= JFA_OFFSETS_Q_FIRST_NOT_ZERO;
    if (a.batch == 0 && __ldg(a.cu_q) != a.total_q) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
  }
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  for (int64_t b = threadIdx.x; b < a.batch; b += kPagedCheckThreads) {
    const int64_t q0 = __ldg(a.cu_q + b), q1 = __ldg(a.cu_q + b + 1);
    if (q1 < q0)
      bits |= JFA_OFFSETS_Q_DECREASING;
    else if (q1 - q0 > a.max_q)
      bits |= JFA_OFFSETS_Q_ABOVE_MAX;
    if (b == a.batch - 1 && q1 != a.total_q) bits |= JFA_OFFSETS_Q_LAST_NOT_TOTAL;
    const int32_t used = __ldg(a.seqused_k + b);
    if (used < 0)
      bits |= JFA_OFFSETS_K_DECREASING;
    else if (used > capacity || (a.max_k > 0 && used > a.max_k))
      bits |= JFA_OFFSETS_K_ABOVE_MAX;
  }
  if (bits != 0) atomicOr(&broken, bits);
  __syncthreads();
  if (threadIdx.x == 0) *a.device_check = broken;
}

inline constexpr int kPagedTableCheckThreads = 256;

// The block table's entries of the pages that hold a sequence's keys (its first
// ceil(seqused_k / page_size), the length clamped into its range), a grid over all entries.
__global__ void __launch_bounds__(kPagedTableCheckThreads)
    paged_check_table_kernel(const PagedArgs a) {
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  const int64_t entries = a.batch * a.max_pages_per_seq;
  bool outside = false;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kPagedTableCheckThreads + threadIdx.x;
       e < entries; e += static_cast<int64_t>(gridDim.x) * kPagedTableCheckThreads) {
    const int64_t b = e / a.max_pages_per_seq, j = e % a.max_pages_per_seq;
    const int64_t used = min(static_cast<int64_t>(max(__ldg(a.seqused_k + b), 0)), capacity);
    if (j * a.page_size >= used) continue;
    const int32_t page = __ldg(a.block_table + e);
    outside |= page < 0 || page >= a.num_pages;
  }
  if (outside) atomicOr(a.device_check, JFA_OFFSETS_K_LAST_NOT_TOTAL);
}

}  // namespace jfa::sm90
