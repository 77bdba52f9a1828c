// Configuration of one backward kernel instantiation (dtype, head_dim): tile shape, ring depth,
// register split, and the shared-memory layout of a CTA.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/backward/bwd_work_list.cuh"
#include "cuda/sm90/shared/cta_shared_memory.cuh"
#include "cuda/sm90/shared/item_ring.cuh"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/smem_tile.hpp"
#include "cuda/tlx/tma_ring.hpp"

namespace jfa::sm90 {

// Where a group's staged dQ goes: its part of the accumulator tile (NULL: the group is done), the
// bytes of its rows that hold queries (rows past the sequence's end are not added: on batches of
// tiny sequences they would be most of the traffic), the q tile's semaphore with the count it
// must reach first (waited for in deterministic mode), and the part's head and first token. A
// shared tile's rows get dQ from that item alone: its parts carry no semaphore, in every mode,
// and that is what tells the writer to convert them straight into dq instead of adding them
// (bwd_dq_writer).
struct DqDestination {
  float* part;
  int32_t* sem;
  int32_t target;
  uint32_t bytes;
  int32_t head;
  int32_t first;
};

// The barriers and hand-over slots of both backward layouts: the ring of a step's Q, dO, LSE and D
// (q_ring), the item's K and V (kv_ring, one stage), each group's staged dQ part and where it goes
// (dq_full, dq_empty, dq_dest; the writer's side in bwd_dq_writer.cuh) and the item ring.
template <int kStages>
struct BwdSync {
  DqDestination dq_dest[2];
  tlx::MBarrier dq_full[2], dq_empty[2];
  tlx::TmaRing<1> kv_ring;
  tlx::TmaRing<kStages> q_ring;
  ItemRing<BwdItem> items;

  __device__ __forceinline__ void init(uint32_t consumer_warps, uint32_t dq_writer_threads) {
    kv_ring.init(consumer_warps);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      dq_full[g].init(consumer_warps / 2 * 32);  // a count per consumer thread
      dq_empty[g].init(dq_writer_threads);       // a count per writer thread
    }
    q_ring.init(consumer_warps);
    items.init(consumer_warps * 32);
  }

  // A consumer group's last hand-off to the dQ writer: no more steps, the writer stops.
  __device__ __forceinline__ void stop_dq_writer(int group, uint32_t dq_phase) {
    dq_empty[group].wait(dq_phase ^ 1u);
    if (threadIdx.x % 128 == 0) dq_dest[group] = DqDestination{};
    dq_full[group].arrive();
  }
};

// The item's K and V tiles, rings of Q and dO tiles (kBlockM rows) with their LSE and D rows, two
// buffers of dS^T (keys x queries: the A operand of dQ += dS K, read M-major), each group's dV and
// then dK rows staged for their TMA stores (during a shared tile's walk, its rows' key ranges),
// each group's dQ of a step staged for the dQ writer (one part: 64 rows x kDqCols, in the
// accumulator's layout), and the barriers.
template <typename T, int kD, int kStages, int kBlockM, int kDqCols>
struct BwdShared {
  using KTile = tlx::SwizzledTile<T, kBwdBlockN, kD>;
  using VTile = KTile;
  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using DoTile = QTile;
  using DsTile = tlx::SwizzledTile<T, kBwdBlockN, kBlockM>;
  using KeyRowsTile = tlx::SwizzledTile<T, 64, kD>;  // one group's rows of dK or dV
  using DkStageTile = KeyRowsTile;
  using DvStageTile = KeyRowsTile;
  KTile k;
  VTile v;
  QTile q[kStages];
  DoTile dout[kStages];
  DsTile ds[2];
  KeyRowsTile key_rows[2];
  alignas(128) float dq[2][kBwdTileRows * kDqCols];
  // A step's LSE and D rows: TMA reads a row's floats from a 16-byte boundary, so the load starts
  // at the boundary at or before the step's first token (in the shifted copy if that token is odd,
  // so that the step's rows start on 8 bytes) and takes kRowTermsBox floats; each stage starts on
  // 128 bytes.
  static constexpr int kRowTermsBox = kBlockM + 4;
  static constexpr int kRowTermsStride = (kRowTermsBox + 31) / 32 * 32;
  alignas(128) float lse2[kStages][kRowTermsStride];
  alignas(128) float dpsum[kStages][kRowTermsStride];
  BwdSync<kStages> sync;
};

// From head_dim 192 up (BwdConfig::kSplitRoles): one K tile of 64 keys that both groups share, V
// (head_dim_v columns), rings of Q and dO, P^T handed from group 0 to group 1 in the fragment's
// order (word i of every thread together), two buffers of dS^T, each group's dQ part staged for the
// writer, and a shared tile's key ranges. K's boxes start at each group's half of the columns (the
// 64-byte swizzle at 192); dK and dV are staged in the K and V tiles at the item's end.
template <typename T, int kD, int kDv, int kStages, int kBlockM, int kDqCols>
struct BwdSplitRolesShared {
  using KTile = tlx::SwizzledTile<T, kBwdMinBlockN, kD, tlx::swizzle_for_columns(kD / 2)>;
  using VTile = tlx::SwizzledTile<T, kBwdMinBlockN, kDv>;
  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using DoTile = tlx::SwizzledTile<T, kBlockM, kDv>;
  using DsTile = tlx::SwizzledTile<T, kBwdMinBlockN, kBlockM>;
  using DkStageTile = KTile;  // dK and dV are staged where K and V were
  using DvStageTile = VTile;
  static constexpr int kPWords = kBlockM / 16 * 4;  // an AFragment's registers
  KTile k;
  VTile v;
  QTile q[kStages];
  DoTile dout[kStages];
  DsTile ds[2];
  alignas(128) uint32_t p[kPWords][128];
  alignas(128) float dq[2][kBwdTileRows * kDqCols];
  static constexpr int kRowTermsBox = kBlockM + 4;
  static constexpr int kRowTermsStride = (kRowTermsBox + 31) / 32 * 32;
  alignas(128) float lse2[kStages][kRowTermsStride];
  alignas(128) float dpsum[kStages][kRowTermsStride];
  uint32_t key_ranges[kBwdPackRows];  // KeyRange as lo | hi << 16 per row of a shared tile
  BwdSync<kStages> sync;
};

// How the two consumer groups share a step's dQ = dS K, one part (64 rows x dq_part_cols) each.
enum class DqSplit {
  kColumns,  // a half of the columns each, over all keys of the tile (head_dim 128 and up)
  kKeys,     // all columns each, over the group's own 64 keys: two partial sums of one q tile
  kRows,     // one q tile each of a two-tile step, over all keys
};

// kRowsPerStep: query rows per step. At head_dim 32 and 64 a step of one q tile leaves the MMAs
// small against the step's fixed costs (barriers, the dQ hand-off), so a step takes two unless the
// sequences are at most one q tile long on average (bwd_choices.hpp). At 96 and 128 a step of two
// would need more registers than a consumer has (dK, dV, S^T and dP^T of 128 rows).
//
// Up to head_dim 128 each group takes 64 of the item's 128 keys and holds their dK and dV. From
// 192 up (kSplitRoles) dK and dV of 64 keys alone would fill a consumer's registers, so both groups
// take the same 64 keys and split the work by role: group 0 forms S^T, P^T and dV += P^T dO and
// hands P^T to group 1, which forms dP^T, dS^T and dK += dS^T Q; each computes half of dQ's
// columns. The ring has two stages where they fit, else one (head_dim 256).
//
// kLocalAttention: the kernels of calls with a window other than the causal mask or softcap
// (BwdLocalArgs); the other calls' kernels hold none of their code. kSoftcapScores: those of the
// calls with softcap (its tanh in P, its derivative in dS), whose step would otherwise hold both
// forms of P and dS. kHeadSplitItems: the kernels of calls whose items are slices of a group's
// query heads (bwd_head_splits.hpp; plain attention only), whose dK and dV go into float32
// accumulators.
template <typename T, int kHeadDim, int kHeadDimV, int kRowsPerStep, bool kLocalAttention = false,
          bool kSoftcapScores = false, bool kHeadSplitItems = false>
struct BwdConfig {
  static_assert(((kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128) &&
                 kHeadDimV == kHeadDim) ||
                    ((kHeadDim == 192 || kHeadDim == 256) && kHeadDimV % 64 == 0 &&
                     kHeadDimV <= kHeadDim),
                "head_dim 32, 64, 96 or 128, or 192 or 256 with value head size a multiple of 64");
  static_assert(kRowsPerStep == kBwdTileRows ||
                    (kRowsPerStep == 2 * kBwdTileRows && kHeadDim <= 64),
                "steps of one q tile, or of two at head_dim 32 and 64");
  using Element = T;
  static constexpr bool kLocal = kLocalAttention;
  static constexpr bool kSoftcap = kSoftcapScores;
  static_assert(kLocal || !kSoftcap, "softcap's kernels are local-attention kernels");
  static constexpr bool kHeadSplits = kHeadSplitItems;
  static_assert(!(kLocal && kHeadSplits), "head splits: plain attention only");
  using Args = std::conditional_t<kLocal, BwdLocalArgs, BwdArgs>;
  static constexpr int kD = kHeadDim;
  static constexpr int kDv = kHeadDimV;
  static constexpr bool kSplitRoles = kD >= 192;
  static constexpr int kBlockN = kSplitRoles ? kBwdMinBlockN : kBwdBlockN;
  static constexpr int kBlockM = kRowsPerStep;
  // Columns of a dQ part (bwd_workspace.hpp): all of them up to 96, half from 128 up.
  static constexpr int kDqPartCols = dq_part_cols(kD);
  template <int kRing>
  using SharedOf =
      std::conditional_t<kSplitRoles, BwdSplitRolesShared<T, kD, kDv, kRing, kBlockM, kDqPartCols>,
                         BwdShared<T, kD, kRing, kBlockM, kDqPartCols>>;
  static constexpr int kStages = kFitsInCta<SharedOf<2>> ? 2 : 1;
  using Shared = SharedOf<kStages>;
  using KTile = typename Shared::KTile;
  using VTile = typename Shared::VTile;
  using QTile = typename Shared::QTile;
  using DoTile = typename Shared::DoTile;
  using DsTile = typename Shared::DsTile;
  // Where a group stages its dK or dV rows for their stores.
  using DkStageTile = typename Shared::DkStageTile;
  using DvStageTile = typename Shared::DvStageTile;
  static constexpr int kSmemBytes = kCtaSmemBytes<Shared>;
  static_assert(kFitsInCta<Shared>, "over the shared memory a CTA may opt in to");

  // Warp group 0: one thread produces, warps 1 to 3 write dQ; groups 1 and 2 consume, each the K
  // tile's keys 64 g .. 64 g + 63 (with kSplitRoles both the same 64).
  static constexpr int kConsumerGroups = 2;
  static constexpr int kDqWriterFirstThread = 32;
  static constexpr int kDqWriterThreads = 96;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerWarps = 4 * kConsumerGroups;
  // Over all keys, both groups' dS must be in shared memory first; over its own keys a group
  // waits for nobody.
  static constexpr DqSplit kDqSplit = kSplitRoles || kD == 2 * kDqPartCols ? DqSplit::kColumns
                                      : kBlockM == kBwdTileRows            ? DqSplit::kKeys
                                                                           : DqSplit::kRows;
  static constexpr int kDqKeys = kDqSplit == DqSplit::kKeys ? 64 : kBlockN;
  // dS from bf16 pairs (step_gradients says why not in fp16).
  static constexpr bool kPackedDs = std::is_same_v<T, __nv_bfloat16>;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert((kProducerRegs + kConsumerGroups * kConsumerRegs) * 128 <=
                    65536 / kThreads / 8 * 8 * kThreads,
                "register split exceeds the CTA's allocation");
  // Named barrier of the dS exchange (one for both groups, or one per group with kKeys).
  static constexpr uint32_t kDsBarrier0 = 1;
  // Named barrier of a group's dK/dV staging (one per group, after the dS ones).
  static constexpr uint32_t kKeyRowsBarrier0 = 3;
  // kSplitRoles: P^T handed to group 1, both groups done with K and V at an item's end, and a
  // shared tile's key ranges written (by group 0).
  static constexpr uint32_t kPBarrier = 5;
  static constexpr uint32_t kItemEndBarrier = 6;
  static constexpr uint32_t kKeyRangesBarrier = 7;
};

}  // namespace jfa::sm90
