// Layout of the forward's device workspace (see jfa_attention_params::workspace): a 16-byte header
// (the work list's entry count, then the 64-bit item counter) and two work lists (sorted and
// unsorted) with room for one entry per q tile. Sized for the smallest q tile height of any
// configuration, so one size serves every dispatch choice. Nothing in it is read before the
// work-list kernel writes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/fwd_params.hpp"

namespace jfa::sm90 {

inline constexpr size_t kWorkspaceHeaderBytes = 16;
inline constexpr size_t kWorkspaceAlignment = 16;
inline constexpr int kWorkLists = 2;
inline constexpr int kMinBlockM = 128;  // the smallest FwdConfig::kBlockM

// Entries a work list may need: sum over sequences of ceil(len / block_m) <= total_q / block_m +
// batch (a shared tile holds at least one sequence).
inline constexpr int64_t work_list_capacity(int64_t total_q, int64_t batch, int block_m) {
  return (total_q + block_m - 1) / block_m + batch;
}

// Bytes of the workspace for total_q query tokens in batch sequences.
inline constexpr size_t forward_workspace_bytes(int64_t total_q, int64_t batch) {
  return kWorkspaceHeaderBytes +
         kWorkLists * sizeof(WorkTile) *
             static_cast<size_t>(work_list_capacity(total_q, batch, kMinBlockM));
}

}  // namespace jfa::sm90
