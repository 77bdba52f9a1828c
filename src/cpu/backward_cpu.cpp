// Float32 CPU backward. Each unit (sequence, kv head) holds its keys and values as float32 rows and
// accumulates dK and dV for them over the query heads of its group, one query row at a time:
// P from the forward's LSE (exp2 with the scale and log2(e) folded in), D = rowsum(dO o O) from the
// forward's out (less the gradient of the LSE, where given), dS = P (dO V^T - D), dQ = scale dS K,
// dK += scale dS^T Q, dV += P^T dO. Units own disjoint rows of dq, dk and dv, so no two threads
// write the same element and the sums run in a fixed order.
#include "cpu/backward_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "common/float_convert.hpp"
#include "cpu/parallel.hpp"
#include "cpu/score_overflow.hpp"

namespace jfa::detail {
namespace {

inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float s = 0;
  for (int c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

inline void axpy(float alpha, const float* __restrict x, float* __restrict y, int n) {
  for (int c = 0; c < n; ++c) y[c] += alpha * x[c];
}

struct UnitScratch {
  std::vector<float> k, v, dk, dv, q, dout, out, dq, prob;
};

// Built for AVX2+FMA as well as the baseline; the loader picks the best the CPU has. Returns false
// when a score is not finite in float32 (the caller throws: GCC treats calls through the clones'
// dispatcher as not throwing).
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool run_unit(const BackwardParams& bp,
                                                                          int64_t unit,
                                                                          UnitScratch& w) {
  const Params& p = bp.fwd;
  const int d = p.head_dim;
  const int32_t group = p.group_size();
  const int64_t b = unit / p.heads_kv;
  const int32_t g = static_cast<int32_t>(unit % p.heads_kv);
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  const int64_t len_q = p.cu_seqlens_q[b + 1] - q0, len_k = p.cu_seqlens_k[b + 1] - k0;
  const float scale = p.softmax_scale;
  const float scale_log2 = scale * std::numbers::log2e_v<float>;
  const size_t keys = static_cast<size_t>(len_k) * d;
  w.k.resize(keys);
  w.v.resize(keys);
  w.dk.assign(keys, 0.0f);
  w.dv.assign(keys, 0.0f);
  w.q.resize(d);
  w.dout.resize(d);
  w.out.resize(d);
  w.dq.resize(d);
  w.prob.resize(static_cast<size_t>(len_k));
  for (int64_t j = 0; j < len_k; ++j) {
    load_row_as_float(p.k, (k0 + j) * p.k_layout.token_stride + g * p.k_layout.head_stride, d,
                      p.dtype, &w.k[j * d]);
    load_row_as_float(p.v, (k0 + j) * p.v_layout.token_stride + g * p.v_layout.head_stride, d,
                      p.dtype, &w.v[j * d]);
  }
  for (int32_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i = 0; i < len_q; ++i) {
      const int64_t token = q0 + i;
      std::fill(w.dq.begin(), w.dq.end(), 0.0f);
      int64_t visible = len_k;
      if (p.causal) visible = std::clamp<int64_t>(i + (len_k - len_q) + 1, 0, len_k);
      const float lse = p.lse[h * p.total_q + token];
      if (visible > 0 && std::isfinite(lse)) {  // a row with no keys (LSE -inf) adds nothing
        load_row_as_float(p.q, token * p.q_layout.token_stride + h * p.q_layout.head_stride, d,
                          p.dtype, w.q.data());
        load_row_as_float(bp.dout,
                          token * bp.dout_layout.token_stride + h * bp.dout_layout.head_stride, d,
                          p.dtype, w.dout.data());
        load_row_as_float(p.out, token * p.out_layout.token_stride + h * p.out_layout.head_stride,
                          d, p.dtype, w.out.data());
        float delta = dot(w.dout.data(), w.out.data(), d);
        if (bp.dlse != nullptr) delta -= bp.dlse[h * p.total_q + token];
        const float lse_log2 = lse * std::numbers::log2e_v<float>;
        for (int64_t j = 0; j < visible; ++j) {
          const float score = dot(w.q.data(), &w.k[j * d], d) * scale_log2;
          if (!std::isfinite(score)) return false;
          w.prob[j] = std::exp2(score - lse_log2);
        }
        for (int64_t j = 0; j < visible; ++j) {
          const float ds = w.prob[j] * (dot(w.dout.data(), &w.v[j * d], d) - delta);
          axpy(scale * ds, &w.k[j * d], w.dq.data(), d);
          axpy(scale * ds, w.q.data(), &w.dk[j * d], d);
          axpy(w.prob[j], w.dout.data(), &w.dv[j * d], d);
        }
      }
      const int64_t at = token * bp.dq_layout.token_stride + h * bp.dq_layout.head_stride;
      for (int c = 0; c < d; ++c) store_from_float(bp.dq, at + c, p.dtype, w.dq[c]);
    }
  }
  for (int64_t j = 0; j < len_k; ++j) {
    const int64_t at_k = (k0 + j) * bp.dk_layout.token_stride + g * bp.dk_layout.head_stride;
    const int64_t at_v = (k0 + j) * bp.dv_layout.token_stride + g * bp.dv_layout.head_stride;
    for (int c = 0; c < d; ++c) {
      store_from_float(bp.dk, at_k + c, p.dtype, w.dk[j * d + c]);
      store_from_float(bp.dv, at_v + c, p.dtype, w.dv[j * d + c]);
    }
  }
  return true;
}

}  // namespace

jfa_status attention_backward_cpu(const BackwardParams& bp) {
  const Params& p = bp.fwd;
  // About one thread per 4 MFLOP of work (10 * head_dim FLOPs per visible (query, key) pair, an
  // upper bound under the causal mask), as the forward.
  double flops = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    flops += 10.0 * p.head_dim * p.heads_q *
             static_cast<double>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]) *
             static_cast<double>(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);
  const int workers =
      static_cast<int>(std::min<double>(cpu_thread_count(), std::max(1.0, flops / 4e6)));
  std::vector<UnitScratch> scratch(static_cast<size_t>(std::max(workers, 1)));
  try {
    parallel_for(p.batch * p.heads_kv, workers, [&](int64_t unit, int worker) {
      if (!run_unit(bp, unit, scratch[worker])) throw ScoreOverflow();
    });
  } catch (const ScoreOverflow&) {
    return score_overflow_status();
  }
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
