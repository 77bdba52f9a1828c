// The ring of work items through which a kernel's producer hands the items it claims to the
// consumer warps (both kernels' schedulers): kItemSlots slots in shared memory, each with a full
// barrier (the producer's thread arrives) and an empty one (every consumer thread arrives, for its
// own reads of the slot: one lane's arrive would not cover the loads of the others, which may still
// be in flight).
#pragma once

#include <cstdint>

#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/warp_broadcast.hpp"

namespace jfa::sm90 {

inline constexpr int kItemSlots = 4;  // work items the producer has claimed ahead

template <typename Item>
struct ItemRing {
  tlx::MBarrier full[kItemSlots], empty[kItemSlots];
  Item item[kItemSlots];

  __device__ __forceinline__ void init(uint32_t consumer_threads) {
#pragma unroll
    for (int i = 0; i < kItemSlots; ++i) {
      full[i].init(1);
      empty[i].init(consumer_threads);
    }
  }

  // Producer: waits (suspended) until the slot's previous item has been read, then publishes w.
  __device__ __forceinline__ void put(tlx::PipelineState<kItemSlots>& slot, const Item& w) {
    empty[slot.stage].wait_suspended(slot.phase ^ 1u);
    item[slot.stage] = w;
    full[slot.stage].arrive();
    slot.advance();
  }

  // Consumer: the slot's item as lane 0 read it, so that it is provably warp-uniform.
  __device__ __forceinline__ Item take(tlx::PipelineState<kItemSlots>& slot) {
    full[slot.stage].wait(slot.phase);
    const Item w = tlx::warp_broadcast(item[slot.stage]);
    empty[slot.stage].arrive();
    slot.advance();
    return w;
  }
};

}  // namespace jfa::sm90
