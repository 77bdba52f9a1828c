// cp.async (sm_80 and later): 16-byte copies from global to shared memory that bypass the
// registers (and L1: .cg), so that a CTA computes on one stage of keys while the next stages are in
// flight. Visible to the other threads after a wait and a __syncthreads (committed groups), or
// through an mbarrier that the copies arrive on once they have landed.
#pragma once

#include <cstdint>

#include "cuda/tlx/mbarrier.hpp"

namespace jfa::sm90 {

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

// The same into the shared address smem_dst, or 16 zero bytes with nothing read where !valid
// (gmem_src must still be a global address).
__device__ __forceinline__ void cp_async_16_or_zero(uint32_t smem_dst, const void* gmem_src,
                                                    bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// One arrival on `bar` once all of this thread's earlier cp.async copies have landed; the arrival
// is one of those the barrier was initialised to expect (.noinc).
__device__ __forceinline__ void cp_async_arrive_on(tlx::MBarrier* bar) {
  asm volatile(
      "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(tlx::smem_addr(&bar->word))
      : "memory");
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
