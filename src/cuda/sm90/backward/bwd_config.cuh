// Configuration of one backward kernel instantiation (dtype, head_dim): tile shape, ring depth,
// register split, and the shared-memory layout of a CTA.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/backward/bwd_work_list.cuh"
#include "cuda/sm90/shared/cta_shared_memory.cuh"
#include "cuda/tlx/mbarrier.hpp"
#include "cuda/tlx/smem_tile.hpp"

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

// The item's K and V tiles, rings of Q and dO tiles (kBlockM rows) with their LSE and D rows, two
// buffers of dS^T (keys x queries: the A operand of dQ += dS K, read M-major), each group's dV and
// then dK rows staged for their TMA stores (during a shared tile's walk, its rows' key ranges),
// each group's dQ of a step staged for the dQ writer (one part: 64 rows x kDqCols, in the
// accumulator's layout), and the barriers.
template <typename T, int kD, int kStages, int kBlockM, int kDqCols>
struct BwdShared {
  using KVTile = tlx::SwizzledTile<T, kBwdBlockN, kD>;
  using QTile = tlx::SwizzledTile<T, kBlockM, kD>;
  using DsTile = tlx::SwizzledTile<T, kBwdBlockN, kBlockM>;
  using KeyRowsTile = tlx::SwizzledTile<T, 64, kD>;  // one group's rows of dK or dV
  KVTile k;
  KVTile v;
  QTile q[kStages];
  QTile dout[kStages];
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
  DqDestination dq_dest[2];
  tlx::MBarrier dq_full[2], dq_empty[2];
  tlx::MBarrier kv_full, kv_empty;
  tlx::MBarrier full[kStages], empty[kStages];
  tlx::MBarrier item_full[kItemSlots], item_empty[kItemSlots];
  BwdItem item[kItemSlots];
};

// How the two consumer groups share a step's dQ = dS K, one part (64 rows x dq_part_cols) each.
enum class DqSplit {
  kColumns,  // a half of the columns each, over all keys of the tile (head_dim 128)
  kKeys,     // all columns each, over the group's own 64 keys: two partial sums of one q tile
  kRows,     // one q tile each of a two-tile step, over all keys
};

// kRowsPerStep: query rows per step. At head_dim 32 and 64 a step of one q tile leaves the MMAs
// small against the step's fixed costs (barriers, the dQ hand-off), so a step takes two unless the
// sequences are at most one q tile long on average (bwd_dispatch.cu). At 96 and 128 a step of two
// would need more registers than a consumer has (dK, dV, S^T and dP^T of 128 rows).
template <typename T, int kHeadDim,
          int kRowsPerStep = kHeadDim <= 64 ? 2 * kBwdTileRows : kBwdTileRows>
struct BwdConfig {
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128,
                "head_dim 32, 64, 96 or 128");
  static_assert(kRowsPerStep == kBwdTileRows ||
                    (kRowsPerStep == 2 * kBwdTileRows && kHeadDim <= 64),
                "steps of one q tile, or of two at head_dim 32 and 64");
  using Element = T;
  static constexpr int kD = kHeadDim;
  static constexpr int kStages = 2;
  static constexpr int kBlockM = kRowsPerStep;
  // Columns of a dQ part (bwd_workspace.hpp): 64, or all of them at 32 and 96.
  static constexpr int kDqPartCols = dq_part_cols(kD);
  using Shared = BwdShared<T, kD, kStages, kBlockM, kDqPartCols>;
  using KVTile = typename Shared::KVTile;
  using QTile = typename Shared::QTile;
  using DsTile = typename Shared::DsTile;
  using KeyRowsTile = typename Shared::KeyRowsTile;
  static constexpr int kSmemBytes = kCtaSmemBytes<Shared>;
  static_assert(kFitsInCta<Shared>, "over the shared memory a CTA may opt in to");

  // Warp group 0: one thread produces, warps 1 to 3 write dQ; groups 1 and 2 consume, each the K
  // tile's keys 64 g .. 64 g + 63.
  static constexpr int kConsumerGroups = 2;
  static constexpr int kDqWriterFirstThread = 32;
  static constexpr int kDqWriterThreads = 96;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerWarps = 4 * kConsumerGroups;
  // Over all keys, both groups' dS must be in shared memory first; over its own keys a group
  // waits for nobody.
  static constexpr DqSplit kDqSplit = kD == 2 * kDqPartCols     ? DqSplit::kColumns
                                      : kBlockM == kBwdTileRows ? DqSplit::kKeys
                                                                : DqSplit::kRows;
  static constexpr int kDqKeys = kDqSplit == DqSplit::kKeys ? 64 : kBwdBlockN;
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
};

}  // namespace jfa::sm90
