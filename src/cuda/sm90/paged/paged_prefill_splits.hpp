// Splits of the chunked prefill's keys (JFA_CUDA_PAGED_SPLITS=0 turns them off): where a batch's
// (q tile, query head) items cannot fill the SMs (one chunk of 256 tokens on 32 heads: 64 items on
// 132 SMs), each item's K tiles are cut in parts that run as items of their own and end in
// partials, which the paged combine kernel merges (paged_combine.cuh). Planned from plain shapes
// and hints only, as the decode kernel's splits are (paged_plan.hpp), so that a captured graph
// replays with new lengths. Host code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/sm90/paged/paged_plan.hpp"

namespace jfa::sm90 {

inline constexpr int kPrefillMaxKeySplits = 8;
// A split keeps at least this many K tiles, against the partials' writes and the pipeline's fill.
inline constexpr int64_t kPrefillMinSplitTiles = 4;
// K tiles a sequence is planned with where max_seqlen_k is not given.
inline constexpr int64_t kPrefillNoHintTiles = 32;

// The splits for `items` items of at most `tiles` K tiles each on sm_count SMs (one CTA an SM,
// counted up to kPagedPlanMaxSms): the fewest with the least waves times a split's tiles plus one
// (its fixed cost), no split under kPrefillMinSplitTiles tiles. One chunk of 256 tokens on 32
// heads over 4k keys (64 items of 32 tiles) on 132 SMs: 2.
inline int32_t prefill_key_splits(int64_t items, int64_t tiles, int sm_count) {
  if (items <= 0 || tiles <= 0) return 1;
  const int64_t sms = std::clamp(sm_count, 1, kPagedPlanMaxSms);
  const int64_t cap = std::clamp<int64_t>(tiles / kPrefillMinSplitTiles, 1, kPrefillMaxKeySplits);
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t waves = (items * s + sms - 1) / sms;
    const int64_t cost = waves * ((tiles + s - 1) / s + 1);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return static_cast<int32_t>(best);
}

// Where the partials of `splits` splits lie in their workspace: O ([splits, rows, head_dim_v]
// floats, rows = total_q * heads_q), then the (maximum, sum) pairs.
struct PrefillPartials {
  size_t ml_offset = 0;
  size_t bytes = 0;
};

inline PrefillPartials prefill_partials(int64_t total_q, int32_t heads_q, int32_t head_dim_v,
                                        int32_t splits) {
  PrefillPartials r;
  if (splits <= 1) return r;
  const size_t rows =
      static_cast<size_t>(total_q) * static_cast<size_t>(heads_q) * static_cast<size_t>(splits);
  r.ml_offset = (rows * static_cast<size_t>(head_dim_v) * sizeof(float) + 255) / 256 * 256;
  r.bytes = r.ml_offset + rows * 2 * sizeof(float);
  return r;
}

// The most partials' bytes any device up to kPagedPlanMaxSms SMs plans for these shapes.
inline size_t prefill_partials_bytes(int64_t items, int64_t tiles, int64_t total_q, int32_t heads_q,
                                     int32_t head_dim_v) {
  size_t most = 0;
  for (int sms = 1; sms <= kPagedPlanMaxSms; ++sms)
    most = std::max(
        most, prefill_partials(total_q, heads_q, head_dim_v, prefill_key_splits(items, tiles, sms))
                  .bytes);
  return most;
}

}  // namespace jfa::sm90
