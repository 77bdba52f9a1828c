// A sequence's key count in the paged kernels: the cache's rows before the call (seqused_k) plus
// the rows the call appends (cu_seqlens_new), every offset clamped into its range so that invalid
// inputs never reach outside a buffer (the checked mode reports them, paged_check.cuh).
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"

namespace jfa::sm90 {

// The rows sequence `seq` appends (0 without an append), its offsets clamped into [0, total_new].
__device__ __forceinline__ int64_t paged_new_rows(const PagedArgs& a, int64_t seq) {
  if (a.cu_new == nullptr) return 0;
  const int64_t n0 = min(max(static_cast<int64_t>(__ldg(a.cu_new + seq)), int64_t{0}), a.total_new);
  const int64_t n1 = min(max(static_cast<int64_t>(__ldg(a.cu_new + seq + 1)), n0), a.total_new);
  return n1 - n0;
}

// The keys sequence `seq` attends over, clamped into [0, max_pages_per_seq * page_size].
__device__ __forceinline__ int32_t paged_len_k(const PagedArgs& a, int64_t seq) {
  const int64_t capacity = static_cast<int64_t>(a.max_pages_per_seq) * a.page_size;
  const int64_t used = max(static_cast<int64_t>(__ldg(a.seqused_k + seq)), int64_t{0});
  return static_cast<int32_t>(min(used + paged_new_rows(a, seq), capacity));
}

}  // namespace jfa::sm90
