// cp.async (sm_80 and later): 16-byte copies from global to shared memory that bypass the
// registers (and L1: .cg), committed in groups and waited on per thread, so that a CTA computes on
// one stage of keys while the next stages are in flight. Visible to the other threads after the
// wait and a __syncthreads.
#pragma once

#include <cstdint>

namespace jfa::sm90 {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace jfa::sm90
