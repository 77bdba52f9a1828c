// Fast CPU attention: float32 tiles of kRows queries against kCols keys, online softmax in base 2
// with the scale folded into Q, fp16/bf16 converted while the tiles are loaded. Work items
// (sequence, head, q tile) are balanced across threads, longest first.
#include "cpu/attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "common/float_convert.hpp"
#include "common/tile_visibility.hpp"
#include "common/visibility.hpp"
#include "cpu/parallel.hpp"
#include "cpu/score_overflow.hpp"
#include "cpu/tile_kernels.hpp"

namespace jfa::detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct WorkItem {
  int64_t batch_index;
  int32_t head;
  int32_t q_tile;
  double cost;
};

// Scratch tiles owned by one worker thread. Rows of q are `q_width` floats (head_dim rounded up
// to kBlockCols), rows of v and o `v_width` (head_dim_v rounded up), the extra columns zero.
struct Scratch {
  Scratch(int d, int dv)
      : q_width(round_up_to_block(d)),
        v_width(round_up_to_block(dv)),
        q(kRows * q_width),
        kt(static_cast<size_t>(d) * kCols),
        v(static_cast<size_t>(kCols) * v_width),
        s(kRows * kCols),
        o(kRows * v_width),
        m(kRows),
        l(kRows),
        row(d) {}
  int q_width, v_width;
  std::vector<float> q, kt, v, s, o, m, l, row;
};

std::vector<WorkItem> make_work_items(const Params& p) {
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int64_t len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const int64_t tiles = (len_q + kRows - 1) / kRows;
    for (int64_t t = 0; t < tiles; ++t) {
      const Span seen =
          keys_seen_by_rows(p.window, t * kRows, std::min(len_q, (t + 1) * kRows), len_q, len_k);
      const double cost = static_cast<double>(kRows) * static_cast<double>(seen.size() + kCols);
      for (int32_t h = 0; h < p.heads_q; ++h)
        items.push_back({b, h, static_cast<int32_t>(t), cost});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return items;
}

// Built for AVX2+FMA as well as the baseline; the loader picks the best the CPU has. Returns false
// when a score is not finite in float32 (the caller throws: GCC treats calls through the clones'
// dispatcher as not throwing).
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool run_tile(const Params& p,
                                                                          const WorkItem& item,
                                                                          Scratch& w) {
  const int d = p.head_dim, dv = p.head_dim_v;
  const int64_t b = item.batch_index;
  const int32_t hq = item.head;
  const int32_t hk = hq / p.group_size();
  const int64_t q_start = p.cu_seqlens_q[b], k_start = p.cu_seqlens_k[b];
  const int64_t len_q = p.cu_seqlens_q[b + 1] - q_start;
  const int64_t len_k = p.cu_seqlens_k[b + 1] - k_start;
  const int64_t row0 = static_cast<int64_t>(item.q_tile) * kRows;
  const int rows = static_cast<int>(std::min<int64_t>(kRows, len_q - row0));
  // Scores in base 2: the scale and log2(e) folded into q, or under softcap the scale alone, with
  // cap tanh(s / cap) log2(e) applied to each score.
  const float cap = p.softcap;
  const float q_scale = cap > 0 ? p.softmax_scale : p.softmax_scale * std::numbers::log2e_v<float>;

  const int q_width = w.q_width, v_width = w.v_width;
  for (int i = 0; i < kRows; ++i) {
    float* qi = &w.q[static_cast<size_t>(i) * q_width];
    if (i >= rows) {  // rows past the sequence end: zeros, so their scores stay finite
      std::fill(qi, qi + d, 0.0f);
      continue;
    }
    load_row_as_float(p.q,
                      (q_start + row0 + i) * p.q_layout.token_stride + hq * p.q_layout.head_stride,
                      d, p.dtype, qi);
    for (int c = 0; c < d; ++c) qi[c] *= q_scale;
  }
  std::fill(w.o.begin(), w.o.end(), 0.0f);
  std::fill(w.m.begin(), w.m.end(), kNegInf);
  std::fill(w.l.begin(), w.l.end(), 0.0f);

  // The keys any row of the tile sees.
  const Span seen = keys_seen_by_rows(p.window, row0, row0 + rows, len_q, len_k);
  for (int64_t k0 = seen.begin; k0 < seen.end; k0 += kCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kCols, seen.end - k0));
    // K transposed to [d][kCols] so the score loop runs along keys.
    for (int j = 0; j < cols; ++j) {
      const int64_t token = k_start + k0 + j;
      load_row_as_float(p.k, token * p.k_layout.token_stride + hk * p.k_layout.head_stride, d,
                        p.dtype, w.row.data());
      for (int c = 0; c < d; ++c) w.kt[static_cast<size_t>(c) * kCols + j] = w.row[c];
      load_row_as_float(p.v, token * p.v_layout.token_stride + hk * p.v_layout.head_stride, dv,
                        p.dtype, &w.v[static_cast<size_t>(j) * v_width]);
    }
    if (cols < kCols) {  // a partial last tile: no stale keys or values from the previous tile
      for (int c = 0; c < d; ++c)
        std::fill(&w.kt[static_cast<size_t>(c) * kCols + cols], &w.kt[(c + 1) * size_t{kCols}],
                  0.0f);
      std::fill(w.v.begin() + static_cast<size_t>(cols) * v_width, w.v.end(), 0.0f);
    }
    scores_tile(w.q.data(), w.kt.data(), w.s.data(), d, q_width);
    for (int i = 0; i < kRows; ++i) {
      float* si = &w.s[static_cast<size_t>(i) * kCols];
      // The row's visible keys of this tile: [start, limit).
      int start = 0, limit = 0;
      if (i < rows) {
        start = static_cast<int>(
            std::clamp<int64_t>(first_visible_key(p.window, row0 + i, len_q, len_k) - k0, 0, cols));
        limit = static_cast<int>(
            std::clamp<int64_t>(key_end(p.window, row0 + i, len_q, len_k) - k0, 0, cols));
        limit = std::max(start, limit);
      }
      std::fill(si, si + start, 0.0f);  // hidden keys weigh nothing in P V
      std::fill(si + limit, si + kCols, 0.0f);
      if (limit == start) continue;
      if (cap > 0)
        for (int j = start; j < limit; ++j)
          si[j] = cap * std::tanh(si[j] / cap) * std::numbers::log2e_v<float>;
      float tile_max = kNegInf;
      bool unrepresentable = false;  // +inf or NaN (std::max would pass over a NaN)
      for (int j = start; j < limit; ++j) {
        tile_max = std::max(tile_max, si[j]);
        unrepresentable |= !(si[j] < std::numeric_limits<float>::infinity());
      }
      if (unrepresentable) return false;
      if (tile_max == kNegInf) {  // every visible score of the tile -inf: weights of 0
        std::fill(si + start, si + limit, 0.0f);
        continue;
      }
      const float m_new = std::max(w.m[i], tile_max);
      const float alpha = std::exp2(w.m[i] - m_new);  // 0 on the first visible tile
      float sum = 0;
      for (int j = start; j < limit; ++j) {
        si[j] = std::exp2(si[j] - m_new);
        sum += si[j];
      }
      w.m[i] = m_new;
      w.l[i] = w.l[i] * alpha + sum;
      float* oi = &w.o[static_cast<size_t>(i) * v_width];
      for (int c = 0; c < dv; ++c) oi[c] *= alpha;
    }
    accumulate_pv(w.s.data(), w.v.data(), w.o.data(), v_width);
  }

  // The sink joins each row's sum (in base 2), as one more logit with no value.
  const float sink_log2 = p.sinks ? p.sinks[hq] * std::numbers::log2e_v<float> : kNegInf;
  for (int i = 0; i < rows; ++i) {
    const int64_t token = q_start + row0 + i;
    float l = w.l[i], m = w.m[i], o_scale = 1.0f;
    // A row that sees keys but whose scores were all -inf (beyond float32): not representable.
    if (!(l > 0) && sees_any_key(p.window, row0 + i, len_q, len_k)) return false;
    if (p.sinks) {
      const float m_new = std::max(m, sink_log2);
      o_scale = l > 0 ? std::exp2(m - m_new) : 0.0f;
      l = l * o_scale + std::exp2(sink_log2 - m_new);
      m = m_new;
    }
    const float inv = l > 0 ? o_scale / l : 0.0f;  // a row with no keys gives zeros
    const int64_t base = token * p.out_layout.token_stride + hq * p.out_layout.head_stride;
    const float* oi = &w.o[static_cast<size_t>(i) * v_width];
    for (int c = 0; c < dv; ++c) store_from_float(p.out, base + c, p.dtype, oi[c] * inv);
    if (p.lse) {
      p.lse[hq * p.total_q + token] =
          l > 0 ? (m + std::log2(l)) * std::numbers::ln2_v<float> : kNegInf;
    }
  }
  return true;
}

// Threads worth using for `items` (see workers_for_flops): 2 FLOPs per pair and column of Q K^T
// and of P V.
int workers_for(const std::vector<WorkItem>& items, const Params& p) {
  double flops = 0;
  for (const WorkItem& item : items) flops += 2.0 * item.cost * (p.head_dim + p.head_dim_v);
  return workers_for_flops(flops);
}

}  // namespace

jfa_status attention_forward_cpu(const Params& p) {
  const std::vector<WorkItem> items = make_work_items(p);
  const int workers = workers_for(items, p);
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) scratch.emplace_back(p.head_dim, p.head_dim_v);
  try {
    parallel_for(static_cast<int64_t>(items.size()), workers, [&](int64_t i, int worker) {
      if (!run_tile(p, items[i], scratch[worker])) throw ScoreOverflow();
    });
  } catch (const ScoreOverflow&) {
    return score_overflow_status();
  }
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
