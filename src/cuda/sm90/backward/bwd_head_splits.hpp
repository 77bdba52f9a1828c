// Head splits of the backward: when a call's (K tile, kv head) items are too few to fill the GPU
// (few kv heads, few or short sequences), or (where asked) would each walk more query heads than
// L2 serves, each item's walk over the query heads of its group is cut into `splits` slices
// of group / splits heads, each slice an item of its own. The slices of
// one K tile then add their dK and dV into a float32 accumulator (atomics, so the sum's order
// varies: never in deterministic mode), which a conversion kernel writes out after the main one.
// The rule reads host shapes only, so the workspace size query and the call agree.
#pragma once

#include <cstdint>

#include "cuda/sm90/host/env_switch.hpp"

namespace jfa::sm90 {

// No GPU the backward runs on has more SMs than this: the size query, which has no device to ask,
// reserves the accumulator wherever a call on any of them could split.
inline constexpr int kHeadSplitsMaxSms = 256;

// The items per SM a split aims at: 1 (fill the SMs), unless JFA_CUDA_BWD_HEAD_SPLIT_ITEMS_PER_SM
// (read per call, 1 to 16) asks for more, to cut long items for balance: a knob to measure that
// with (batches of long sequences on one or two kv heads), not a default until it has been.
inline int head_split_items_per_sm() {
  const int n = env_int("JFA_CUDA_BWD_HEAD_SPLIT_ITEMS_PER_SM");
  return n < 1 ? 1 : n > 16 ? 16 : n;
}

// JFA_CUDA_BWD_HEAD_SPLIT_MAX_HEADS (read per call, 1 to 64): the most query heads an item may
// walk, splitting also where the items fill the SMs; unset or anything else: no such bound. With
// more heads an item, the items at work stream the Q and dO of too many heads through L2 (W1 at
// 16:1 heads, causal, bf16, head_dim 128, H100, by JFA_CUDA_BWD_HEAD_SPLITS: 16 heads an item 6.44
// ms, L2 hit rate 48% against FlashAttention-3's 89%; 8 heads 4.91, 4 heads 4.44, 2 heads 4.54, 1
// head 4.86; FlashAttention-3 3.95). 4 is to become the default once the rule has run on a GPU.
inline int32_t head_split_max_item_heads() {
  const int n = env_int("JFA_CUDA_BWD_HEAD_SPLIT_MAX_HEADS");
  return n >= 1 && n <= 64 ? n : 0;
}

// Slices per kv head for a call with `total_k` keys in K tiles of `block_n`, aiming at
// `target_items` items (SMs times head_split_items_per_sm): 1 (no split) in deterministic mode or
// without grouped heads; else the least divisor s of the group whose slices hold at most
// `max_item_heads` query heads (0: any number) and whose items (at least one per K tile of the
// keys and kv head, times s) reach the target, or the whole group (one query head per item).
inline int32_t head_splits_for(int64_t total_k, int32_t heads_kv, int32_t group, bool deterministic,
                               int block_n, int64_t target_items, int32_t max_item_heads = 0) {
  if (deterministic || group < 2 || heads_kv < 1 || total_k <= 0 || block_n <= 0) return 1;
  const int64_t items = (total_k + block_n - 1) / block_n * heads_kv;
  for (int32_t s = 1; s < group; ++s)
    if (group % s == 0 && (max_item_heads <= 0 || group / s <= max_item_heads) &&
        items * s >= target_items)
      return s;
  return group;
}

// JFA_CUDA_BWD_HEAD_SPLITS (read per call): the slices per kv head to take instead of the rule's,
// where it names a divisor of the group (1: no split; to measure the rule against others); 0
// otherwise.
inline int32_t head_splits_asked(int32_t group) {
  const int n = env_int("JFA_CUDA_BWD_HEAD_SPLITS");
  return n >= 1 && n <= group && group % n == 0 ? n : 0;
}

// head_splits_for with the items aimed at `sms` SMs times head_split_items_per_sm and at most
// head_split_max_item_heads heads an item, or the slices JFA_CUDA_BWD_HEAD_SPLITS asks for (never
// in deterministic mode).
inline int32_t chosen_head_splits(int64_t total_k, int32_t heads_kv, int32_t group,
                                  bool deterministic, int block_n, int sms) {
  if (const int32_t asked = head_splits_asked(group); asked > 0 && !deterministic) return asked;
  return head_splits_for(total_k, heads_kv, group, deterministic, block_n,
                         int64_t{sms} * head_split_items_per_sm(), head_split_max_item_heads());
}

// Floats of the dK and dV accumulators with `splits` slices: [total_k, heads_kv, head_dim] and
// [total_k, heads_kv, head_dim_v], none without a split.
inline int64_t head_split_accumulator_floats(int32_t splits, int64_t total_k, int32_t heads_kv,
                                             int32_t head_dim, int32_t head_dim_v) {
  return splits > 1 ? total_k * heads_kv * (int64_t{head_dim} + head_dim_v) : 0;
}

}  // namespace jfa::sm90
