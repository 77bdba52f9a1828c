// Float64 reference attention: explicit scores, max, exp and sum per row, written to be obviously
// right rather than fast. It is the oracle of every test.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/float_convert.hpp"
#include "common/visibility.hpp"
#include "cpu/attention_cpu.hpp"
#include "cpu/parallel.hpp"

namespace jfa::detail {

void attention_reference_cpu(const Params& p, const int64_t* q_tokens, int64_t n_tokens,
                             double* out, double* lse) {
  const int32_t d = p.head_dim, dv = p.head_dim_v;
  const int32_t group = p.group_size();
  const int32_t* cu_q = p.cu_seqlens_q;
  const int32_t* cu_k = p.cu_seqlens_k;
  const double cap = p.softcap;
  parallel_for(n_tokens, cpu_thread_count(), [&](int64_t row, int) {
    const int64_t t = q_tokens ? q_tokens[row] : row;
    // Sequence b holds t when cu_q[b] <= t < cu_q[b + 1]; the last such b skips empty sequences.
    const int64_t b =
        std::upper_bound(cu_q, cu_q + p.batch + 1, static_cast<int32_t>(t)) - cu_q - 1;
    const int64_t i = t - cu_q[b];
    const int64_t len_q = cu_q[b + 1] - cu_q[b];
    const int64_t len_k = cu_k[b + 1] - cu_k[b];
    // The row sees keys [first, end) of its sequence.
    const int64_t first = first_visible_key(p.window, i, len_q, len_k);
    const int64_t end = std::max(first, key_end(p.window, i, len_q, len_k));
    std::vector<double> q(d), scores(static_cast<size_t>(end - first));
    for (int32_t h = 0; h < p.heads_q; ++h) {
      const int32_t hk = h / group;
      double* o = out + (row * p.heads_q + h) * dv;
      const int64_t q_base = t * p.q_layout.token_stride + h * p.q_layout.head_stride;
      for (int32_t c = 0; c < d; ++c) q[c] = load_as_float(p.q, q_base + c, p.dtype);
      // The sink is one more logit of the softmax, with no value.
      const double sink = p.sinks ? p.sinks[h] : -std::numeric_limits<double>::infinity();
      double m = sink;
      for (int64_t j = first; j < end; ++j) {
        const int64_t k_base =
            (cu_k[b] + j) * p.k_layout.token_stride + hk * p.k_layout.head_stride;
        double s = 0;
        for (int32_t c = 0; c < d; ++c) s += q[c] * load_as_float(p.k, k_base + c, p.dtype);
        s *= static_cast<double>(p.softmax_scale);
        if (cap > 0) s = cap * std::tanh(s / cap);
        scores[j - first] = s;
        m = std::max(m, s);
      }
      std::fill(o, o + dv, 0.0);
      if (end == first && p.sinks == nullptr) {  // no key and no sink
        if (lse) lse[h * n_tokens + row] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double sum = p.sinks ? std::exp(sink - m) : 0.0;
      for (int64_t j = first; j < end; ++j) {
        const double w = std::exp(scores[j - first] - m);
        sum += w;
        const int64_t v_base =
            (cu_k[b] + j) * p.v_layout.token_stride + hk * p.v_layout.head_stride;
        for (int32_t c = 0; c < dv; ++c) o[c] += w * load_as_float(p.v, v_base + c, p.dtype);
      }
      for (int32_t c = 0; c < dv; ++c) o[c] /= sum;
      if (lse) lse[h * n_tokens + row] = m + std::log(sum);
    }
  });
}

}  // namespace jfa::detail
