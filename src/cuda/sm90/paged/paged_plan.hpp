// The launch of a paged call from plain shapes only (host code): CTAs per (sequence, KV head), the
// split of each sequence's keys and the workspace the splits need. Nothing here reads a buffer
// (seqused_k, cu_seqlens_q live on the device), so a call plans the same whatever the lengths are,
// and can be captured in a CUDA graph and replayed with new ones. plan_paged is the one place the
// plan and its bytes are computed: the launch (paged_dispatch.cu) and the size query
// (jfa_attention_paged_workspace_size) both call it, so they cannot drift.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/sm90/paged/paged_config.hpp"

namespace jfa::sm90 {

// Splits without a key-length hint or a window to bound them; with one, at most one split per
// kPagedMinSplitKeys keys, up to kPagedMaxSplits.
inline constexpr int kPagedNoHintSplits = 16;
inline constexpr int kPagedMaxSplits = 64;
// The most SMs a plan fills: the most a compute capability 9.0 device has (H100 SXM, H200). The
// splits grow with the SMs, so planning with at most this many lets the size query, which names no
// device, answer the most that any device's launch needs.
inline constexpr int kPagedPlanMaxSms = 132;

// Query rows a CTA holds at a head_dim the kernels take (PagedConfig::kRowsPerCta); 0 at others.
constexpr int paged_rows_per_cta(int32_t head_dim) {
  switch (head_dim) {
    case 64:
      return PagedConfig<64>::kRowsPerCta;
    case 128:
      return PagedConfig<128>::kRowsPerCta;
    case 256:
      return PagedConfig<256>::kRowsPerCta;
    default:
      return 0;
  }
}

// What the plan reads of a call: sizes and hints, no buffer.
struct PagedShape {
  int64_t batch, total_q;
  int32_t heads_q, heads_kv;
  int32_t head_dim;     // one the kernels take (paged_rows_per_cta is not 0)
  int32_t max_q;        // the max_seqlen_q hint, 1 .. kPagedMaxQueryTokens
  int32_t max_k;        // the max_seqlen_k hint, 0 when not given
  int32_t window_left;  // -1 unbounded
};

struct PagedPlan {
  int32_t row_blocks;  // CTAs that share a (sequence, KV head, split)'s rows
  int32_t splits;
  int64_t ctas;                // row_blocks * splits * heads_kv * batch
  size_t workspace_bytes;      // the splits' partials; 0 with one split
  size_t workspace_ml_offset;  // where the (max, sum) pairs start in it
};

// The splits of a launch of `base` CTAs a split, each sequence's `keys` keys cut in up to `cap`
// splits. Two CTAs fit an SM (96 KB of shared memory each); a split's CTAs take about the same time
// where the lengths are alike, so the launch takes its waves times a CTA's keys plus a fixed cost
// (the pipeline's first loads, the partials' writes): the splits with the least of that, the fewest
// of equal cost. A split that leaves a wave nearly empty costs a whole wave (5 splits of 64 CTAs on
// 264 slots take two waves of 6.6 K keys, where 4 take one of 8.2 K).
inline int32_t paged_splits(int64_t base, int64_t keys, int64_t cap, int sm_count) {
  if (base == 0) return 1;
  constexpr int64_t kFixedKeys = 64;  // a CTA's fixed cost, in keys streamed
  const int64_t slots = 2 * static_cast<int64_t>(std::clamp(sm_count, 1, kPagedPlanMaxSms));
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t waves = (base * s + slots - 1) / slots;
    const int64_t per = std::max((keys + s - 1) / s, int64_t{kPagedMinSplitKeys});
    const int64_t cost = waves * (per + kFixedKeys);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return static_cast<int32_t>(best);
}

// The plan on a device of sm_count SMs (counted up to kPagedPlanMaxSms).
inline PagedPlan plan_paged(const PagedShape& s, int sm_count) {
  PagedPlan plan{};
  const int rows_per_cta = paged_rows_per_cta(s.head_dim);
  const int64_t group = s.heads_q / s.heads_kv;
  plan.row_blocks = static_cast<int32_t>((group * s.max_q + rows_per_cta - 1) / rows_per_cta);
  const int64_t base = s.batch * s.heads_kv * plan.row_blocks;
  // The keys one CTA may see at most: the hint, and under a left window (bottom-right aligned) the
  // window's span, max_q + window_left, whatever the cache's length.
  int64_t keys = s.max_k > 0 ? s.max_k : -1;
  if (s.window_left >= 0) {
    const int64_t span = int64_t{s.max_q} + s.window_left;
    keys = keys < 0 ? span : std::min(keys, span);
  }
  const int64_t cap =
      keys < 0 ? kPagedNoHintSplits
               : std::clamp<int64_t>((keys + kPagedMinSplitKeys - 1) / kPagedMinSplitKeys, 1,
                                     kPagedMaxSplits);
  plan.splits =
      paged_splits(base, keys < 0 ? kPagedNoHintSplits * kPagedMinSplitKeys : keys, cap, sm_count);
  plan.ctas = base * plan.splits;
  if (plan.splits > 1) {
    const size_t rows = static_cast<size_t>(s.total_q) * static_cast<size_t>(s.heads_q) *
                        static_cast<size_t>(plan.splits);
    plan.workspace_ml_offset = rows * static_cast<size_t>(s.head_dim) * sizeof(float);
    plan.workspace_bytes = plan.workspace_ml_offset + rows * 2 * sizeof(float);
  }
  return plan;
}

// The workspace a call of this shape needs on any device the kernels serve: the most that its plan
// on any number of SMs up to kPagedPlanMaxSms asks (the splits need not grow with them).
inline size_t paged_workspace_bytes(const PagedShape& s) {
  size_t most = 0;
  for (int sms = 1; sms <= kPagedPlanMaxSms; ++sms)
    most = std::max(most, plan_paged(s, sms).workspace_bytes);
  return most;
}

}  // namespace jfa::sm90
