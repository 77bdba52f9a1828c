// Float32 CPU backward, tiled like the forward. Each unit (sequence, kv head) holds its keys and
// values (and their transposes) as float32 tiles and accumulates dK and dV for them over the query
// heads of its group, one 64-row query tile at a time against 64-key tiles: S = (Q scale log2(e))
// K^T and dP = dO V^T, P = exp2(S - LSE log2(e)) from the forward's LSE, D = rowsum(dO o O)
// from the forward's out (less the gradient of the LSE, where given), dS = P (dP - D), then
// dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K with the forward's register-blocked kernels.
// Units own disjoint rows of dq, dk and dv, so no two threads write the same element and the sums
// run in a fixed order. When there are fewer units than workers (one long sequence with few kv
// heads, as under MQA), each unit's keys are split into blocks that run in parallel: a block owns
// its rows of dk and dv and writes its part of dq to scratch, which a second pass sums in block
// order, so the result is still the same from run to run.
#include "cpu/backward_cpu.hpp"

#include <algorithm>
#include <cmath>
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

constexpr float kLog2e = std::numbers::log2e_v<float>;

inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float s = 0;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// b[kCols][kRows] = a[kRows][kCols] transposed.
inline void transpose_tile(const float* __restrict a, float* __restrict b) {
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kCols; ++j) b[j * kRows + i] = a[i * kCols + j];
}

// Scratch of one worker. Rows of q, k and their gradients are `width` floats (head_dim rounded up
// to kBlockCols), rows of v, dout and dv `v_width` (head_dim_v rounded up), the extra columns
// zero. Keys are padded to whole tiles with zero rows.
struct UnitScratch {
  UnitScratch(int d, int dv)
      : width(round_up_to_block(d)),
        v_width(round_up_to_block(dv)),
        q(kRows * width),
        q_scaled(kRows * width),
        dout(kRows * v_width),
        dq(kRows * width),
        s(kRows * kCols),
        dp(kRows * kCols),
        t(kRows * kCols),
        lse_log2(kRows),
        delta(kRows),
        start(kRows),
        limit(kRows),
        row(dv) {}
  int width, v_width;
  // The unit's keys: k, dk [tiles * kCols][width], v, dv [tiles * kCols][v_width]; per tile kt
  // [head_dim][kCols] and vt [head_dim_v][kCols].
  std::vector<float> k, v, kt, vt, dk, dv;
  std::vector<float> q, q_scaled, dout, dq, s, dp, t, lse_log2, delta;
  std::vector<int> start, limit;  // each row's visible keys of the unit: [start, limit)
  std::vector<float> row;
};

// One unit of work: the keys [key_lo, key_hi) of sequence b and kv head g. `partial`: where its
// part of dq goes in the partials scratch, [group][len_q][head_dim] floats, when the sequence's
// keys are split into blocks; -1: straight into dq.
struct Unit {
  int64_t b;
  int32_t g;
  int64_t key_lo, key_hi;
  int64_t partial;
};

// Sizes and zeroes the key buffers of `w` for `unit`. Outside run_unit, whose calls GCC treats as
// not throwing (see there): an allocation that fails throws from here.
void prepare_unit(const Params& p, const Unit& unit, UnitScratch& w) {
  const int64_t len_k = unit.key_hi - unit.key_lo;
  const size_t key_tiles = static_cast<size_t>((len_k + kCols - 1) / kCols);
  const size_t key_rows = key_tiles * kCols;
  for (std::vector<float>* buffer : {&w.k, &w.dk}) buffer->assign(key_rows * w.width, 0.0f);
  for (std::vector<float>* buffer : {&w.v, &w.dv}) buffer->assign(key_rows * w.v_width, 0.0f);
  w.kt.assign(key_tiles * p.head_dim * kCols, 0.0f);
  w.vt.assign(key_tiles * p.head_dim_v * kCols, 0.0f);
}

// Built for AVX2+FMA as well as the baseline; the loader picks the best the CPU has. Returns false
// when a score is +inf or NaN in float32 (the caller throws: GCC treats calls through the clones'
// dispatcher as not throwing, so nothing in here may throw).
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool run_unit(const BackwardParams& bp,
                                                                          const Unit& unit,
                                                                          float* partials,
                                                                          UnitScratch& w) {
  const Params& p = bp.fwd;
  const int d = p.head_dim, width = w.width;
  const int d_v = p.head_dim_v, v_width = w.v_width;
  const int32_t group = p.group_size();
  const int64_t b = unit.b;
  const int32_t g = unit.g;
  const int64_t q0 = p.cu_seqlens_q[b];
  const int64_t len_q = p.cu_seqlens_q[b + 1] - q0;
  const int64_t seq_len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  // The unit's keys: positions [key_lo, key_hi) of the sequence, rows 0 .. len_k - 1 of w.k.
  const int64_t key_lo = unit.key_lo;
  const int64_t k0 = p.cu_seqlens_k[b] + key_lo, len_k = unit.key_hi - key_lo;
  const float scale = p.softmax_scale, scale_log2 = scale * kLog2e;
  // Under softcap the scores are cap tanh(scale q.k / cap): q takes the scale alone, and the
  // chain rule's 1 - tanh^2 joins dS.
  const float cap = p.softcap;
  const float q_factor = cap > 0 ? scale : scale_log2;
  for (int64_t j = 0; j < len_k; ++j) {
    float* kj = &w.k[j * width];
    float* vj = &w.v[j * v_width];
    load_row_as_float(p.k, (k0 + j) * p.k_layout.token_stride + g * p.k_layout.head_stride, d,
                      p.dtype, kj);
    load_row_as_float(p.v, (k0 + j) * p.v_layout.token_stride + g * p.v_layout.head_stride, d_v,
                      p.dtype, vj);
    float* kt = &w.kt[(j / kCols) * d * kCols];
    float* vt = &w.vt[(j / kCols) * d_v * kCols];
    for (int c = 0; c < d; ++c) kt[c * kCols + j % kCols] = kj[c];
    for (int c = 0; c < d_v; ++c) vt[c * kCols + j % kCols] = vj[c];
  }
  // dq rows row0 .. row0 + rows - 1 of head h: the part in `src` (rows width apart) or zeros, into
  // the unit's partials or straight into dq.
  auto store_dq_rows = [&](int32_t h, int64_t row0, int64_t rows, const float* src) {
    if (unit.partial >= 0) {
      float* part = partials + unit.partial + ((h - g * group) * len_q + row0) * d;
      for (int64_t i = 0; i < rows; ++i) {
        if (src != nullptr)
          std::copy_n(&src[i * width], d, part + i * d);
        else
          std::fill_n(part + i * d, d, 0.0f);
      }
      return;
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t token = q0 + row0 + i;
      const int64_t at = token * bp.dq_layout.token_stride + h * bp.dq_layout.head_stride;
      for (int c = 0; c < d; ++c)
        store_from_float(bp.dq, at + c, p.dtype, src != nullptr ? src[i * width + c] : 0.0f);
    }
  };
  // Only the q tiles holding a row that sees one of the unit's keys are walked (under a window a
  // few of them); the other rows' dq parts are zero.
  const Span seeing = rows_seeing_keys(p.window, key_lo, unit.key_hi, len_q, seq_len_k);
  const int64_t walk_begin = seeing.empty() ? 0 : seeing.begin / kRows * kRows;
  const int64_t walk_end =
      seeing.empty() ? 0 : std::min<int64_t>(len_q, (seeing.end + kRows - 1) / kRows * kRows);
  for (int32_t h = g * group; h < (g + 1) * group; ++h) {
    store_dq_rows(h, 0, walk_begin, nullptr);
    store_dq_rows(h, walk_end, len_q - walk_end, nullptr);
    for (int64_t row0 = walk_begin; row0 < walk_end; row0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, len_q - row0));
      std::fill(w.q.begin(), w.q.end(), 0.0f);
      std::fill(w.q_scaled.begin(), w.q_scaled.end(), 0.0f);
      std::fill(w.dout.begin(), w.dout.end(), 0.0f);
      std::fill(w.dq.begin(), w.dq.end(), 0.0f);
      int64_t k_begin = len_k, k_end = 0;  // keys any row of the tile sees
      for (int i = 0; i < kRows; ++i) {
        w.start[i] = w.limit[i] = 0;
        if (i >= rows) continue;
        const int64_t token = q0 + row0 + i;
        const float lse = p.lse[h * p.total_q + token];
        // The row's visible keys of the sequence, then of this unit's block.
        const int64_t first = std::clamp<int64_t>(
            first_visible_key(p.window, row0 + i, len_q, seq_len_k) - key_lo, 0, len_k);
        const int64_t end =
            std::clamp<int64_t>(key_end(p.window, row0 + i, len_q, seq_len_k) - key_lo, 0, len_k);
        if (end <= first || !std::isfinite(lse)) continue;  // a row with no keys adds nothing
        w.start[i] = static_cast<int>(first);
        w.limit[i] = static_cast<int>(end);
        k_begin = std::min(k_begin, first);
        k_end = std::max(k_end, end);
        float* qi = &w.q[i * width];
        float* di = &w.dout[i * v_width];
        load_row_as_float(p.q, token * p.q_layout.token_stride + h * p.q_layout.head_stride, d,
                          p.dtype, qi);
        // The scores from q scaled first, as the forward computes them (q.k alone may overflow
        // where the scaled score does not); dK takes q as it is.
        float* qsi = &w.q_scaled[i * width];
        for (int c = 0; c < d; ++c) qsi[c] = qi[c] * q_factor;
        load_row_as_float(bp.dout,
                          token * bp.dout_layout.token_stride + h * bp.dout_layout.head_stride, d_v,
                          p.dtype, di);
        load_row_as_float(p.out, token * p.out_layout.token_stride + h * p.out_layout.head_stride,
                          d_v, p.dtype, w.row.data());
        // rowsum(dO o O), less the gradient of the LSE where given (d lse_i / d s_ij = P_ij).
        w.delta[i] = dot(di, w.row.data(), d_v) - (bp.dlse ? bp.dlse[h * p.total_q + token] : 0.f);
        w.lse_log2[i] = lse * kLog2e;
      }
      for (int64_t key0 = k_begin / kCols * kCols; key0 < k_end; key0 += kCols) {
        const int64_t tile = key0 / kCols;
        // P = exp2(S * scale * log2(e) - LSE * log2(e)) on the visible keys, 0 elsewhere.
        scores_tile(w.q_scaled.data(), &w.kt[tile * d * kCols], w.s.data(), d, width);
        scores_tile(w.dout.data(), &w.vt[tile * d_v * kCols], w.dp.data(), d_v, v_width);
        for (int i = 0; i < kRows; ++i) {
          float* si = &w.s[i * kCols];
          float* dpi = &w.dp[i * kCols];
          const int start = static_cast<int>(std::clamp<int64_t>(w.start[i] - key0, 0, kCols));
          const int limit =
              std::max(start, static_cast<int>(std::clamp<int64_t>(w.limit[i] - key0, 0, kCols)));
          for (int j = start; j < limit; ++j) {
            float slope = 1.0f;  // d score / d (scale q.k)
            if (cap > 0) {
              const float t = std::tanh(si[j] / cap);
              si[j] = cap * t * kLog2e;
              slope = 1.0f - t * t;
            }
            // +inf or NaN cannot be represented; -inf is a weight of 0.
            if (!(si[j] < std::numeric_limits<float>::infinity())) return false;
            si[j] = std::exp2(si[j] - w.lse_log2[i]);
            dpi[j] = si[j] * (dpi[j] - w.delta[i]) * slope * scale;  // scale * dS
          }
          std::fill(si, si + start, 0.0f);
          std::fill(dpi, dpi + start, 0.0f);
          std::fill(si + limit, si + kCols, 0.0f);
          std::fill(dpi + limit, dpi + kCols, 0.0f);
        }
        float* dk = &w.dk[key0 * width];
        float* dv = &w.dv[key0 * v_width];
        transpose_tile(w.s.data(), w.t.data());
        accumulate_pv(w.t.data(), w.dout.data(), dv, v_width);  // dV += P^T dO
        transpose_tile(w.dp.data(), w.t.data());
        accumulate_pv(w.t.data(), w.q.data(), dk, width);                    // dK += scale dS^T Q
        accumulate_pv(w.dp.data(), &w.k[key0 * width], w.dq.data(), width);  // dQ += scale dS K
      }
      store_dq_rows(h, row0, rows, w.dq.data());
    }
  }
  for (int64_t j = 0; j < len_k; ++j) {
    const int64_t at_k = (k0 + j) * bp.dk_layout.token_stride + g * bp.dk_layout.head_stride;
    const int64_t at_v = (k0 + j) * bp.dv_layout.token_stride + g * bp.dv_layout.head_stride;
    for (int c = 0; c < d; ++c) store_from_float(bp.dk, at_k + c, p.dtype, w.dk[j * width + c]);
    for (int c = 0; c < d_v; ++c) store_from_float(bp.dv, at_v + c, p.dtype, w.dv[j * v_width + c]);
  }
  return true;
}

// The units of a call: one per (sequence, kv head), or with fewer of those than workers, each
// sequence's keys in up to `splits` blocks of whole key tiles. *partial_floats gets the scratch the
// blocks' parts of dq need.
std::vector<Unit> plan_units(const Params& p, int workers, size_t* partial_floats) {
  const int64_t pairs = p.batch * p.heads_kv;
  const int64_t splits = pairs == 0 || pairs >= workers ? 1 : (2 * workers + pairs - 1) / pairs;
  std::vector<Unit> units;
  *partial_floats = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int64_t len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const int64_t tiles = (len_k + kCols - 1) / kCols;
    const int64_t blocks =
        len_q == 0 ? 1 : std::clamp<int64_t>(splits, 1, std::max<int64_t>(tiles, 1));
    const int64_t tiles_per_block = (tiles + blocks - 1) / std::max<int64_t>(blocks, 1);
    for (int32_t g = 0; g < p.heads_kv; ++g)
      for (int64_t k = 0; k < blocks; ++k) {
        Unit u{b, g, std::min(len_k, k * tiles_per_block * kCols),
               std::min(len_k, (k + 1) * tiles_per_block * kCols), -1};
        if (blocks > 1) {
          u.partial = static_cast<int64_t>(*partial_floats);
          *partial_floats += static_cast<size_t>(p.group_size() * len_q * p.head_dim);
        }
        units.push_back(u);
      }
  }
  return units;
}

// dq of the split sequences: the blocks' parts summed in block order (units of one sequence and kv
// head are consecutive), one (sequence, kv head) per task.
void sum_partial_dq(const BackwardParams& bp, const std::vector<Unit>& units, const float* partials,
                    int workers) {
  const Params& p = bp.fwd;
  std::vector<size_t> firsts;  // the first unit of each split (sequence, kv head)
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].partial >= 0 &&
        (i == 0 || units[i - 1].b != units[i].b || units[i - 1].g != units[i].g))
      firsts.push_back(i);
  const int d = p.head_dim;
  const int32_t group = p.group_size();
  parallel_for(static_cast<int64_t>(firsts.size()), workers, [&](int64_t task, int) {
    const Unit& first = units[firsts[task]];
    size_t end = firsts[task];
    while (end < units.size() && units[end].b == first.b && units[end].g == first.g) ++end;
    const int64_t q0 = p.cu_seqlens_q[first.b];
    const int64_t len_q = p.cu_seqlens_q[first.b + 1] - q0;
    std::vector<float> sum(static_cast<size_t>(d));
    for (int32_t hl = 0; hl < group; ++hl)
      for (int64_t r = 0; r < len_q; ++r) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (size_t u = firsts[task]; u < end; ++u) {
          const float* part = partials + units[u].partial + (hl * len_q + r) * d;
          for (int c = 0; c < d; ++c) sum[c] += part[c];
        }
        const int64_t h = first.g * group + hl;
        const int64_t at = (q0 + r) * bp.dq_layout.token_stride + h * bp.dq_layout.head_stride;
        for (int c = 0; c < d; ++c) store_from_float(bp.dq, at + c, p.dtype, sum[c]);
      }
  });
}

// dsinks[h] = -sum over the rows of head h of p_sink (rowsum(dO o O) - dLSE), p_sink =
// exp(sink - lse): rows that see no key count too (p_sink = 1, O = 0). The sum runs in float64, in
// row order, one head per task.
void sink_gradients(const BackwardParams& bp) {
  const Params& p = bp.fwd;
  const int d_v = p.head_dim_v;
  parallel_for(
      p.heads_q, workers_for_flops(4.0 * p.total_q * p.heads_q * d_v), [&](int64_t task, int) {
        const int32_t h = static_cast<int32_t>(task);
        std::vector<float> o(d_v), dout(d_v);
        double sum = 0;
        for (int64_t token = 0; token < p.total_q; ++token) {
          const double lse = p.lse[h * p.total_q + token];
          load_row_as_float(p.out, token * p.out_layout.token_stride + h * p.out_layout.head_stride,
                            d_v, p.dtype, o.data());
          load_row_as_float(bp.dout,
                            token * bp.dout_layout.token_stride + h * bp.dout_layout.head_stride,
                            d_v, p.dtype, dout.data());
          double delta = 0;
          for (int c = 0; c < d_v; ++c) delta += double{dout[c]} * o[c];
          if (bp.dlse != nullptr) delta -= bp.dlse[h * p.total_q + token];
          sum -= std::exp(double{p.sinks[h]} - lse) * delta;
        }
        bp.dsinks[h] = static_cast<float>(sum);
      });
}

}  // namespace

jfa_status attention_backward_cpu(const BackwardParams& bp) {
  const Params& p = bp.fwd;
  // 2 FLOPs per (query, key) pair and column of S and dQ, dK (head_dim) and of dP, dV (head_dim_v):
  // 10 * head_dim with equal sizes (an upper bound under the causal mask).
  const double flops_per_pair = 2.0 * (3.0 * p.head_dim + 2.0 * p.head_dim_v);
  double flops = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    flops += flops_per_pair * p.heads_q *
             static_cast<double>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]) *
             static_cast<double>(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);
  const int workers = workers_for_flops(flops);
  size_t partial_floats = 0;
  const std::vector<Unit> units = plan_units(p, workers, &partial_floats);
  std::vector<float> partials(partial_floats);
  std::vector<UnitScratch> scratch;
  scratch.reserve(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) scratch.emplace_back(p.head_dim, p.head_dim_v);
  try {
    parallel_for(static_cast<int64_t>(units.size()), workers, [&](int64_t i, int worker) {
      prepare_unit(p, units[i], scratch[worker]);
      if (!run_unit(bp, units[i], partials.data(), scratch[worker])) throw ScoreOverflow();
    });
  } catch (const ScoreOverflow&) {
    return score_overflow_status();
  }
  if (partial_floats > 0) sum_partial_dq(bp, units, partials.data(), workers);
  if (bp.dsinks != nullptr) sink_gradients(bp);
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
