// A row's end in the forward kernels (packed and paged): the normaliser of O and the LSE over
// scores in raw units scaled by score_scale, with its head's sink in the denominator where there
// are sinks. The LSE includes the sink, lse =
// log(exp(sink) + sum exp(s)); a row that sees no key has out 0 and LSE the sink, -inf without. A
// sink far above the scores makes the normaliser infinite and O zero, its limit.
#pragma once

#include <cstdint>

namespace jfa::sm90 {

struct RowEnd {
  float inv;  // the factor of O
  float lse;
};

// sinks: nullable, [heads_q].
__device__ __forceinline__ RowEnd row_end(const float* sinks, float score_scale, int32_t head,
                                          float row_max, float l, bool empty) {
  const float base = row_max * score_scale;
  RowEnd e{empty ? 0.f : 1.f / l, empty ? -INFINITY : base + logf(l)};
  if (sinks != nullptr) {
    const float sink = __ldg(sinks + head);
    if (empty) {
      e.lse = sink;
    } else {
      e.inv = 1.f / (l + __expf(sink - base));
      const float hi = fmaxf(e.lse, sink), lo = fminf(e.lse, sink);
      e.lse = hi + log1pf(__expf(lo - hi));
    }
    // fmaxf would pass over a NaN sink: a sink that is not finite is the LSE, which the checked
    // mode reports.
    if (!(fabsf(sink) < INFINITY)) e.lse = sink;
  }
  return e;
}

}  // namespace jfa::sm90
