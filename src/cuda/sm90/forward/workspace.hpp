// Layout of the forward's device workspace (see jfa_attention_params::workspace): a 16-byte header
// (the work list's entry count, then the 64-bit item counter) and the work list, with room for one
// entry per q tile (a second, unsorted list in front of the sorted one when the list is sorted).
// Sized for the smallest q tile height of any configuration, so one size serves every dispatch
// choice. Nothing in it is read before the work-list kernel writes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/forward/choices.hpp"

namespace jfa::sm90 {

// One entry of the work list built on the device: q tile m_block of sequence `seq`, or (n_seqs > 1)
// one tile shared by the short sequences seq .. seq + n_seqs - 1. Each entry expands to heads_q
// work items; the q tiles of one sequence are consecutive entries, m_block descending (see
// decode_item for the order of their items).
struct WorkListEntry {
  int32_t seq;
  int32_t m_block;
  int32_t n_seqs;
};

inline constexpr size_t kWorkspaceHeaderBytes = 16;
inline constexpr int kMinBlockM = 128;  // the smallest FwdConfig::kBlockM

// Work lists a call needs: two when it sorts (tuning builds may sort, so they always reserve two).
constexpr int work_lists(bool sort) { return sort ? 2 : 1; }
#ifdef JFA_SM90_TUNING
inline constexpr int kReservedWorkLists = 2;
#else
inline constexpr int kReservedWorkLists = work_lists(kShippedLaunch.sort_work_list);
#endif

// Entries a work list may need: sum over sequences of ceil(len / block_m) <= total_q / block_m +
// batch (a shared tile holds at least one sequence).
constexpr int64_t work_list_capacity(int64_t total_q, int64_t batch, int block_m) {
  return (total_q + block_m - 1) / block_m + batch;
}

// Bytes of the workspace for total_q query tokens in batch sequences with `lists` work lists.
constexpr size_t forward_workspace_bytes(int64_t total_q, int64_t batch,
                                         int lists = kReservedWorkLists) {
  return kWorkspaceHeaderBytes +
         static_cast<size_t>(lists) * sizeof(WorkListEntry) *
             static_cast<size_t>(work_list_capacity(total_q, batch, kMinBlockM));
}

}  // namespace jfa::sm90
