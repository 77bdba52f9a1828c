// The work items of one CTA, handed to its roles in the same order. Round-robin (three consumer
// groups): CTA b takes items b, b + grid, ... and every role decodes them itself. Dynamic
// (Cfg::kDynamicItems): the producer claims the next item from a global counter whenever it has
// room and hands the decoded item to the consumer warps through a ring in shared memory; a
// negative n_blocks ends the walk.
#pragma once

#include <cstdint>

#include "cuda/sm90/forward/work_items.cuh"
#include "cuda/sm90/shared/item_ring.cuh"
#include "cuda/tlx/mbarrier.hpp"

namespace jfa::sm90 {

template <typename Cfg, bool kProducer>
struct ItemScheduler {
  int64_t item = blockIdx.x;
  tlx::PipelineState<kItemSlots> slot;

  // The next item; false when there is none left.
  __device__ __forceinline__ bool next(typename Cfg::Shared& s, const FwdArgs& a, int64_t n_items,
                                       typename Cfg::Item& w) {
    if constexpr (!Cfg::kDynamicItems) {
      if (item >= n_items) return false;
      w = decode_item<Cfg::kBlockM, Cfg::kBlockN, false, Cfg::kLocal>(a, item);
      item += gridDim.x;
      return true;
    } else if constexpr (kProducer) {
      const int64_t claimed = static_cast<int64_t>(atomicAdd(a.next_item, 1ull));
      w = typename Cfg::Item{};
      if (claimed < n_items) {
        if constexpr (Cfg::kKeySplits)
          w = decode_split_item<Cfg::kBlockM, Cfg::kBlockN>(
              static_cast<const FwdPagedSplitArgs&>(a), claimed);
        else
          w = decode_item<Cfg::kBlockM, Cfg::kBlockN, Cfg::Kernel::kHeadMajorRuns, Cfg::kLocal>(
              a, claimed);
      } else {
        w.n_blocks = -1;
      }
      s.items.put(slot, w);
      return w.n_blocks >= 0;
    } else {
      w = s.items.take(slot);
      return w.n_blocks >= 0;
    }
  }
};

}  // namespace jfa::sm90
