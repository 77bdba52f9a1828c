// Configuration of one forward kernel instantiation: tile shape, pipeline depths, register split,
// warp-group roles, and the shared-memory layout they share.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/forward/choices.hpp"
#include "cuda/sm90/forward/local_mask.cuh"
#include "cuda/sm90/forward/mask.cuh"
#include "cuda/sm90/forward/work_items.cuh"
#include "cuda/sm90/shared/cta_shared_memory.cuh"
#include "cuda/sm90/shared/item_ring.cuh"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/smem_tile.hpp"
#include "cuda/tlx/tma_ring.hpp"

namespace jfa::sm90 {

// Shared memory of a CTA: Q tiles (kQStages), K and V rings (kStages), one staging tile of O per
// consumer group (kOCols of its columns at a time), and the barriers of the rings and of the item
// hand-over (of Item: WorkItem, or SplitWorkItem where items hold splits of their keys). Q and K
// have kD columns, V and O kDv.
template <typename T, int kBlockM, int kBlockN, int kD, int kDv, int kGroups, int kStages,
          int kQStages, int kOCols, typename Item = WorkItem>
struct FwdShared {
  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using KTile = tlx::SwizzledTile<T, kBlockN, kD>;
  using VTile = tlx::SwizzledTile<T, kBlockN, kDv>;
  // One group's rows of O, staged for the TMA store; the swizzle of V's columns, so that the
  // output map's boxes are those of a whole row of O.
  using OTile = tlx::SwizzledTile<T, 64, kOCols, VTile::kSwizzleRowBytes>;
  QTile q[kQStages];
  KTile k[kStages];
  VTile v[kStages];
  OTile o[kGroups];
  // The small members last, so that no 1024-byte-aligned tile follows them.
  tlx::TmaRing<kQStages> q_ring;
  ItemRing<Item> items;  // decoded by the producer, read by the consumers
  // K's and V's barriers lie by kind, full ones then empty ones (TmaRings of their own would move
  // them, and with them the kernels' machine code); k_ring() and v_ring() walk them as rings.
  tlx::MBarrier k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];

  __device__ __forceinline__ tlx::TmaRingRef<kStages> k_ring() { return {{k_full, k_empty}}; }
  __device__ __forceinline__ tlx::TmaRingRef<kStages> v_ring() { return {{v_full, v_empty}}; }
};

// kGroups consumer warp groups of 64 rows each, K tiles of kKeys keys (choices.hpp says which
// shape serves which batch), compile-time choices `Choices` (a KernelChoices), q.k over kHeadDim
// columns and v, out over kHeadDimV.
template <typename T, int kHeadDim, int kGroups, int kKeys, typename Choices = ShippedKernel,
          int kHeadDimV = kHeadDim>
struct FwdConfig {
  static_assert(kGroups == 2 || kGroups == 3, "two or three consumer warp groups");
  // Sizes with wgmma wrappers (tools/gen_wgmma_ops.py) and a power-of-two number of partial row
  // maxima and sums in the softmax (8 from 64 keys up).
  static_assert(kKeys == 64 || kKeys == 128 || kKeys == 160, "K tiles of 64, 128 or 160 keys");
  static_assert(tlx::swizzle_for_columns(kHeadDim) != 0 && tlx::swizzle_for_columns(kHeadDimV) != 0,
                "head sizes in 64- or 128-byte boxes");
  using Element = T;
  using Kernel = Choices;
  // Local attention (WithLocalAttention): its kernel argument and mask.
  static constexpr bool kLocal = LocalAttentionOf<Choices>::value;
  static constexpr bool kSoftcap = SoftcapOf<Choices>::value;  // the local kernels' with softcap
  // A paged KV cache (WithPagedKV): its kernel argument; the producer copies K/V by cp.async.
  static constexpr bool kPaged = PagedKVOf<Choices>::value;
  static constexpr PagedLoads kPagedLoads = paged_loads_of<Choices>();
  static constexpr bool kPagedTma = kPaged && kPagedLoads == PagedLoads::kPagesByTma;
  // Items that hold splits of their keys (WithPagedKV's kKeySplits): their item type and arguments.
  static constexpr bool kKeySplits = key_splits_of<Choices>();
  using Item = std::conditional_t<kKeySplits, SplitWorkItem, WorkItem>;
  static_assert(!(kLocal && kPaged), "local attention over a paged cache has no kernel");
  using PagedArgsType = std::conditional_t<kKeySplits, FwdPagedSplitArgs, FwdPagedArgs>;
  using Args =
      std::conditional_t<kLocal, FwdLocalArgs, std::conditional_t<kPaged, PagedArgsType, FwdArgs>>;
  using Mask = std::conditional_t<kLocal, LocalItemMask, ItemMask>;
  static constexpr int kD = kHeadDim;
  static constexpr int kDv = kHeadDimV;
  static constexpr int kConsumerGroups = kGroups;
  static constexpr int kBlockM = 64 * kConsumerGroups;
  static constexpr int kBlockN = kKeys;
  static constexpr int kStages = kv_stages(kHeadDim);

  template <int kQ, int kOCols>
  using SharedWith = FwdShared<T, kBlockM, kBlockN, kD, kDv, kGroups, kStages, kQ, kOCols, Item>;
  // O is staged whole where it fits beside one Q tile, else half of its columns at a time (head_dim
  // 256: Q, the two-stage K/V ring and whole staging tiles would need 256 KB).
  static constexpr int kOStageCols = kFitsInCta<SharedWith<1, kDv>> ? kDv : kDv / 2;
  static constexpr int kQStagesThatFit = kFitsInCta<SharedWith<2, kOStageCols>> ? 2 : 1;
  static constexpr int kQStages = kQStagesCap < kQStagesThatFit ? kQStagesCap : kQStagesThatFit;
  using Shared = SharedWith<kQStages, kOStageCols>;
  using QTile = typename Shared::QTile;
  using KTile = typename Shared::KTile;
  using VTile = typename Shared::VTile;
  using OTile = typename Shared::OTile;
  static constexpr int kSmemBytes = kCtaSmemBytes<Shared>;
  static_assert(kFitsInCta<Shared>, "over the shared memory a CTA may opt in to");

  // Warp group 0 produces, groups 1 .. kConsumerGroups consume.
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerWarps = 4 * kConsumerGroups;
  static constexpr bool kDynamicItems = kConsumerGroups == 2;
  // The paged producer's threads take each item from the item ring, as the consumers do.
  static_assert(!kPaged || kDynamicItems, "paged kernels have two consumer groups");
  static constexpr bool kSkipUnseenKTiles = kConsumerGroups == 3;
  static constexpr int kProducerRegs = producer_registers(kConsumerGroups);
  static constexpr int kConsumerRegs = consumer_registers(kConsumerGroups);
  // setmaxnreg only moves registers between the warp groups of the CTA: the split must fit in what
  // the CTA holds at launch (the per-thread count of __launch_bounds__(kThreads, 1), a multiple of
  // 8), or the consumers' increase waits forever.
  static_assert((kProducerRegs + kConsumerGroups * kConsumerRegs) * 128 <=
                    65536 / kThreads / 8 * 8 * kThreads,
                "register split exceeds the CTA's allocation");

  // Named barriers: 1 .. kConsumerGroups are the turn ring, then one per group for its epilogue.
  static constexpr uint32_t kEpilogueBarrier0 = 1 + kConsumerGroups;
};

}  // namespace jfa::sm90
