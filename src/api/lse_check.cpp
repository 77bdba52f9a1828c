#include "api/lse_check.hpp"

#include <cmath>
#include <limits>

#include "common/status.hpp"
#include "common/visibility.hpp"

namespace jfa::detail {

jfa_status check_host_lse(const Params& p) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b];
    const int64_t len_q = p.cu_seqlens_q[b + 1] - q0;
    const int64_t len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    for (int32_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < len_q; ++i) {
        const float lse = p.lse[h * p.total_q + q0 + i];
        if (std::isfinite(lse)) continue;
        // A sink joins every row's sum, so with sinks no LSE is -inf.
        const bool sees_key = sees_any_key(p.window, i, len_q, len_k) || p.sinks != nullptr;
        if (lse == -kInf && !sees_key) continue;
        return fail(
            JFA_ERROR_INVALID_ARGUMENT,
            "lse of head %d, token %lld is %g: the backward needs the forward's LSE, "
            "finite in every row that sees a key or has a sink (-inf only in rows that see none)",
            h, static_cast<long long>(q0 + i), static_cast<double>(lse));
      }
  }
  return JFA_SUCCESS;
}

}  // namespace jfa::detail
