// Head splits of the backward: when a call's (K tile, kv head) items are too few to fill the GPU
// (few kv heads, few or short sequences), each item's walk over the query heads of its group is
// cut into `splits` slices of group / splits heads, each slice an item of its own. The slices of
// one K tile then add their dK and dV into a float32 accumulator (atomics, so the sum's order
// varies: never in deterministic mode), which a conversion kernel writes out after the main one.
// The rule reads host shapes only, so the workspace size query and the call agree.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace jfa::sm90 {

// No GPU the backward runs on has more SMs than this: the size query, which has no device to ask,
// reserves the accumulator wherever a call on any of them could split.
inline constexpr int kHeadSplitsMaxSms = 256;

// The items per SM a split aims at: 1 (fill the SMs), unless JFA_CUDA_BWD_HEAD_SPLIT_ITEMS_PER_SM
// (read per call, 1 to 16) asks for more, to cut long items for balance: a knob to measure that
// with (batches of long sequences on one or two kv heads), not a default until it has been.
inline int head_split_items_per_sm() {
  const char* env = std::getenv("JFA_CUDA_BWD_HEAD_SPLIT_ITEMS_PER_SM");
  const int n = env != nullptr ? std::atoi(env) : 1;
  return n < 1 ? 1 : n > 16 ? 16 : n;
}

// Slices per kv head for a call with `total_k` keys in K tiles of `block_n`, aiming at
// `target_items` items (SMs times head_split_items_per_sm): 1 (no split) in deterministic mode,
// without grouped heads, or when the items (at least one per K tile of the keys and kv head)
// reach the target already; else the least divisor of the group that reaches it, or the whole
// group (one query head per item).
inline int32_t head_splits_for(int64_t total_k, int32_t heads_kv, int32_t group, bool deterministic,
                               int block_n, int64_t target_items) {
  if (deterministic || group < 2 || heads_kv < 1 || total_k <= 0 || block_n <= 0) return 1;
  const int64_t items = (total_k + block_n - 1) / block_n * heads_kv;
  if (items >= target_items) return 1;
  for (int32_t s = 2; s < group; ++s)
    if (group % s == 0 && items * s >= target_items) return s;
  return group;
}

// Floats of the dK and dV accumulators with `splits` slices: [total_k, heads_kv, head_dim] and
// [total_k, heads_kv, head_dim_v], none without a split.
inline int64_t head_split_accumulator_floats(int32_t splits, int64_t total_k, int32_t heads_kv,
                                             int32_t head_dim, int32_t head_dim_v) {
  return splits > 1 ? total_k * heads_kv * (int64_t{head_dim} + head_dim_v) : 0;
}

}  // namespace jfa::sm90
