// TMA (cp.async.bulk.tensor): tile copies between global memory, described by a CUtensorMap, and
// shared memory. Loads complete on an mbarrier (transaction bytes); stores complete in bulk groups.
// Maps are passed as `const __grid_constant__ CUtensorMap` kernel parameters. Out-of-bounds parts
// of a load box are zero-filled (and still count towards the transaction bytes); stores clip at the
// map's bounds.
#pragma once

#include <cuda.h>

#include "cuda/tlx/arch.hpp"
#include "cuda/tlx/mbarrier.hpp"

namespace jfa::tlx {

JFA_DEVICE uint64_t tensor_map_addr(const CUtensorMap* map) {
  return reinterpret_cast<uint64_t>(map);
}

// Pulls the descriptor into the cache ahead of first use.
JFA_DEVICE void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map_addr(map)) : "memory");
}

// Every map of a kernel, from its first thread, before the roles start.
template <typename... Maps>
JFA_DEVICE void tma_prefetch_descriptors(const Maps*... maps) {
  (tma_prefetch_descriptor(maps), ...);
}

JFA_DEVICE void tma_load_2d(const CUtensorMap* map, MBarrier* bar, void* smem_dst, int32_t c0,
                            int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map_addr(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

JFA_DEVICE void tma_load_3d(const CUtensorMap* map, MBarrier* bar, void* smem_dst, int32_t c0,
                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

JFA_DEVICE void tma_load_4d(const CUtensorMap* map, MBarrier* bar, void* smem_dst, int32_t c0,
                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of float32 values from shared
// memory to global memory element by element (a reduction in L2), in the issuing thread's bulk
// group: commit and wait as for stores (wait_read before the shared memory is reused).
JFA_DEVICE void bulk_reduce_add_f32(float* gmem_dst, const void* smem_src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem_dst),
      "r"(smem_addr(smem_src)), "r"(bytes)
      : "memory");
}

// Stores: the shared memory must have been written before with a fence_proxy_async_smem() in each
// writing thread and a barrier; one thread issues, commits, and waits before the buffer is reused.
JFA_DEVICE void tma_store_2d(const CUtensorMap* map, const void* smem_src, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
          tensor_map_addr(map)),
      "r"(c0), "r"(c1), "r"(smem_addr(smem_src))
      : "memory");
}

JFA_DEVICE void tma_store_4d(const CUtensorMap* map, const void* smem_src, int32_t c0, int32_t c1,
                             int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::
          "l"(tensor_map_addr(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(smem_src))
      : "memory");
}

JFA_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most kPending committed store groups are still reading shared memory.
template <int kPending>
JFA_DEVICE void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Waits until at most kPending committed store groups are incomplete (writes visible).
template <int kPending>
JFA_DEVICE void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace jfa::tlx
