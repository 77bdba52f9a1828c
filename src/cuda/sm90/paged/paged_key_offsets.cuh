// The paged prefill's key offsets: the packed forward's work list and items read a sequence's keys
// as cu_k[b + 1] - cu_k[b], so the sequences' key counts (paged_len_k: seqused_k plus the appended
// rows, clamped into the table's capacity) become offsets in the workspace, on the device and in
// stream order (no host read: graph capture keeps working with new lengths).
#pragma once

#include <cstdint>

#include "cuda/sm90/paged/paged_args.hpp"
#include "cuda/sm90/paged/paged_lengths.cuh"
#include "cuda/sm90/shared/work_list.cuh"

namespace jfa::sm90 {

// One block of kListThreads threads: cu_k[0 .. batch]. The caller bounds the sum (batch times the
// table's capacity) to int32.
__global__ void __launch_bounds__(kListThreads)
    paged_key_offsets_kernel(const PagedArgs a, int32_t* cu_k) {
  __shared__ int64_t scratch[32];
  int64_t running = 0;
  if (threadIdx.x == 0) cu_k[0] = 0;
  for (int64_t base = 0; base < a.batch; base += kListThreads) {
    const int64_t b = base + threadIdx.x;
    const int64_t keys = b < a.batch ? paged_len_k(a, b) : 0;
    int64_t total = 0;
    const int64_t before = block_exclusive_scan(keys, scratch, &total);
    if (b < a.batch) cu_k[b + 1] = static_cast<int32_t>(running + before + keys);
    running += total;
  }
}

}  // namespace jfa::sm90
