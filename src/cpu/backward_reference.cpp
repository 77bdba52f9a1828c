// Float64 reference backward: the softmax of each row recomputed in float64 from q and k, then
// dP = dO V^T, dS = P (dP - rowsum(dO O) + dLSE), dQ = scale dS' K, dK = scale dS'^T Q, dV = P^T
// dO, written out term by term, with dS' = dS (1 - tanh^2(s / cap)) under softcap (d/ds of cap
// tanh(s / cap)) and dS' = dS without. A sink adds a logit with no value: its probability p_sink =
// exp(sink - lse) gives dsink = sum over rows of -p_sink (rowsum(dO O) - dLSE). It ignores the
// forward's out and LSE, so it checks them too.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/float_convert.hpp"
#include "common/visibility.hpp"
#include "cpu/backward_cpu.hpp"
#include "cpu/parallel.hpp"

namespace jfa::detail {

void attention_backward_reference_cpu(const BackwardParams& bp, double* dq, double* dk, double* dv,
                                      double* dsinks) {
  const Params& p = bp.fwd;
  const int32_t d = p.head_dim, d_v = p.head_dim_v;  // columns of q, k and of v, out, dout
  const int32_t group = p.group_size();
  const double scale = p.softmax_scale, cap = p.softcap;
  std::fill(dq, dq + p.total_q * p.heads_q * d, 0.0);
  std::fill(dk, dk + p.total_k * p.heads_kv * d, 0.0);
  std::fill(dv, dv + p.total_k * p.heads_kv * d_v, 0.0);
  // Each unit's share of dsinks, summed in unit order afterwards (deterministic).
  std::vector<double> dsink_parts(static_cast<size_t>(p.batch * p.heads_q), 0.0);
  auto load = [&](const void* base, const Layout& l, int64_t token, int32_t head, int32_t columns,
                  double* row) {
    const int64_t at = token * l.token_stride + head * l.head_stride;
    for (int32_t c = 0; c < columns; ++c) row[c] = load_as_float(base, at + c, p.dtype);
  };
  // One unit per (sequence, kv head): it alone writes the dK/dV rows of that head and the dQ rows
  // of the query heads of its group.
  parallel_for(p.batch * p.heads_kv, cpu_thread_count(), [&](int64_t unit, int) {
    const int64_t b = unit / p.heads_kv;
    const int32_t g = static_cast<int32_t>(unit % p.heads_kv);
    const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    const int64_t len_q = p.cu_seqlens_q[b + 1] - q0, len_k = p.cu_seqlens_k[b + 1] - k0;
    std::vector<double> k(len_k * d), v(len_k * d_v), q(d), dout(d_v), o(d_v), prob(len_k),
        slope(len_k);
    for (int64_t j = 0; j < len_k; ++j) {
      load(p.k, p.k_layout, k0 + j, g, d, &k[j * d]);
      load(p.v, p.v_layout, k0 + j, g, d_v, &v[j * d_v]);
    }
    for (int32_t h = g * group; h < (g + 1) * group; ++h) {
      const double sink = p.sinks ? p.sinks[h] : -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < len_q; ++i) {
        const int64_t first = first_visible_key(p.window, i, len_q, len_k);
        const int64_t end = std::max(first, key_end(p.window, i, len_q, len_k));
        const double dlse = bp.dlse != nullptr ? bp.dlse[h * p.total_q + q0 + i] : 0.0;
        if (end == first) {  // a row with no keys: no gradient but the sink's (p_sink = 1, O = 0)
          if (p.sinks) dsink_parts[b * p.heads_q + h] += dlse;
          continue;
        }
        load(p.q, p.q_layout, q0 + i, h, d, q.data());
        load(bp.dout, bp.dout_layout, q0 + i, h, d_v, dout.data());
        double m = sink;
        for (int64_t j = first; j < end; ++j) {
          double s = 0;
          for (int32_t c = 0; c < d; ++c) s += q[c] * k[j * d + c];
          s *= scale;
          slope[j] = 1.0;
          if (cap > 0) {
            const double t = std::tanh(s / cap);
            s = cap * t;
            slope[j] = 1.0 - t * t;
          }
          prob[j] = s;
          m = std::max(m, s);
        }
        double sum = p.sinks ? std::exp(sink - m) : 0.0;
        for (int64_t j = first; j < end; ++j) sum += (prob[j] = std::exp(prob[j] - m));
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = first; j < end; ++j) {
          prob[j] /= sum;
          for (int32_t c = 0; c < d_v; ++c) o[c] += prob[j] * v[j * d_v + c];
        }
        // rowsum(dO o O), less the gradient of the LSE (d lse_i / d s_ij = P_ij).
        double delta = 0;
        for (int32_t c = 0; c < d_v; ++c) delta += dout[c] * o[c];
        delta -= dlse;
        if (p.sinks) dsink_parts[b * p.heads_q + h] -= std::exp(sink - m) / sum * delta;
        double* dq_row = dq + ((q0 + i) * p.heads_q + h) * d;
        for (int64_t j = first; j < end; ++j) {
          double dp = 0;
          for (int32_t c = 0; c < d_v; ++c) dp += dout[c] * v[j * d_v + c];
          const double ds = prob[j] * (dp - delta) * slope[j];
          double* dk_row = dk + ((k0 + j) * p.heads_kv + g) * d;
          double* dv_row = dv + ((k0 + j) * p.heads_kv + g) * d_v;
          for (int32_t c = 0; c < d; ++c) {
            dq_row[c] += scale * ds * k[j * d + c];
            dk_row[c] += scale * ds * q[c];
          }
          for (int32_t c = 0; c < d_v; ++c) dv_row[c] += prob[j] * dout[c];
        }
      }
    }
  });
  if (dsinks != nullptr) {
    std::fill(dsinks, dsinks + p.heads_q, 0.0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int32_t h = 0; h < p.heads_q; ++h) dsinks[h] += dsink_parts[b * p.heads_q + h];
  }
}

}  // namespace jfa::detail
