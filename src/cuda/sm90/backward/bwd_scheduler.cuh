// The backward's item scheduler: the producer claims items from the global counter and hands
// them to the consumers through the item ring (item_ring.cuh).
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/bwd_config.cuh"

namespace jfa::sm90 {

// The items of one CTA: the producer claims each from the global counter and hands it to the
// consumers through a ring in shared memory; an invalid item ends the walk.
template <typename Cfg, bool kProducer>
struct BwdItemScheduler {
  tlx::PipelineState<kItemSlots> slot;

  __device__ __forceinline__ bool next(typename Cfg::Shared& s, const BwdArgs& a, int64_t n_items,
                                       BwdItem& w) {
    if constexpr (kProducer) {
      const int64_t claimed = static_cast<int64_t>(atomicAdd(a.next_item, 1ull));
      w = claimed < n_items
              ? decode_bwd_item<Cfg::kBlockM, Cfg::kBlockN, Cfg::kLocal, Cfg::kHeadSplits>(a,
                                                                                           claimed)
              : BwdItem{};
      s.sync.items.put(slot, w);
    } else {
      w = s.sync.items.take(slot);
    }
    return w.valid != 0;
  }
};

}  // namespace jfa::sm90
