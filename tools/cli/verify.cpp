#include "cli/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cli/format.hpp"
#include "cli/runner.hpp"

namespace jfa::cli {

std::vector<int64_t> all_tokens(const tools::JaggedBatch& batch) {
  std::vector<int64_t> tokens(static_cast<size_t>(batch.total_q()));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i);
  return tokens;
}

std::vector<int64_t> sample_tokens(const tools::JaggedBatch& batch, int per_sequence,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> tokens;
  for (int64_t b = 0; b < batch.batch(); ++b) {
    const int64_t start = batch.cu_q[b], len = batch.cu_q[b + 1] - start;
    if (len <= per_sequence) {
      for (int64_t i = 0; i < len; ++i) tokens.push_back(start + i);
      continue;
    }
    std::vector<int64_t> picked = {0, len - 1};
    while (static_cast<int64_t>(picked.size()) < per_sequence) {
      const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(len));
      if (std::find(picked.begin(), picked.end(), i) == picked.end()) picked.push_back(i);
    }
    std::sort(picked.begin(), picked.end());
    for (const int64_t i : picked) tokens.push_back(start + i);
  }
  return tokens;
}

CheckReport check_against_reference(const tools::JaggedBatch& batch, bool causal,
                                    const tools::HostBuffer& out, const std::vector<float>* lse,
                                    const std::vector<int64_t>& tokens, const PagedCache* paged) {
  CheckReport report;
  report.rows = static_cast<int64_t>(tokens.size());
  report.tolerance = tools::tolerance(batch.dtype);
  for (int64_t i = 0, n = out.count(); i < n; ++i)
    if (!std::isfinite(tools::element_as_double(out, i))) ++report.non_finite;

  const AttentionCall call =
      make_host_call(batch, {.causal = causal, .paged = paged}, Backend::kCpu);
  std::vector<double> ref_lse;
  const std::vector<double> ref =
      tokens.empty() ? std::vector<double>()
                     : reference_of(call, tokens, lse != nullptr ? &ref_lse : nullptr);
  const int64_t row_elems = static_cast<int64_t>(batch.heads_q) * batch.value_dim();
  report.rel_error = tokens.empty() ? 0.0 : tools::relative_error(out, ref, tokens, row_elems);

  if (lse != nullptr && !tokens.empty()) {
    report.lse_checked = true;
    const int64_t n = report.rows, total = batch.total_q();
    for (int32_t h = 0; h < batch.heads_q; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const double r = ref_lse[static_cast<size_t>(h * n + i)];
        const double o = (*lse)[static_cast<size_t>(h * total + tokens[static_cast<size_t>(i)])];
        double err;
        if (std::isinf(r) && r < 0) {
          err = (std::isinf(o) && o < 0) ? 0.0 : std::numeric_limits<double>::infinity();
        } else {
          err = std::isfinite(o) ? std::abs(o - r) / (1.0 + std::abs(r))
                                 : std::numeric_limits<double>::infinity();
        }
        report.lse_error = std::max(report.lse_error, err);
      }
    }
  }

  if (report.non_finite > 0) {
    report.failure =
        strprintf("%lld non-finite output values", static_cast<long long>(report.non_finite));
  } else if (!(report.rel_error <= report.tolerance)) {
    report.failure = strprintf("relative error %.2e above the %s tolerance %.0e", report.rel_error,
                               tools::dtype_name(batch.dtype), report.tolerance);
  } else if (report.lse_checked && !(report.lse_error <= kLseTolerance)) {
    report.failure =
        strprintf("log-sum-exp error %.2e above %.0e", report.lse_error, kLseTolerance);
  }
  report.passed = report.failure.empty();
  return report;
}

BackwardReport check_backward_against_reference(const tools::JaggedBatch& batch, bool causal,
                                                const tools::HostBuffer& dout,
                                                const Gradients& grads) {
  // Columns: head_dim for q, k and their gradients, head_dim_v for v, dout and dv.
  auto view = [&](const tools::HostBuffer& b, bool keys, int32_t d) {
    return JaggedTensor{const_cast<void*>(b.data()),
                        batch.dtype,
                        keys ? batch.total_k() : batch.total_q(),
                        keys ? batch.heads_kv : batch.heads_q,
                        d,
                        0,
                        0};
  };
  const int32_t d = batch.head_dim, d_v = batch.value_dim();
  // The forward's options (window, softcap, sinks) as the runner's call has them.
  const AttentionOptions options = make_host_call(batch, {.causal = causal}, Backend::kCpu).options;
  const ReferenceGradients ref = attention_backward_reference(
      view(batch.q, false, d), view(batch.k, true, d), view(batch.v, true, d_v),
      view(dout, false, d_v), batch.cu_q.data(), batch.cu_k.data(), batch.batch(), options);
  BackwardReport r;
  r.dq_error = tools::relative_error(grads.dq, ref.dq, {}, int64_t{batch.heads_q} * d);
  r.dk_error = tools::relative_error(grads.dk, ref.dk, {}, int64_t{batch.heads_kv} * d);
  r.dv_error = tools::relative_error(grads.dv, ref.dv, {}, int64_t{batch.heads_kv} * d_v);
  if (!batch.sinks.empty()) {
    tools::HostBuffer dsinks(DType::kFloat32, batch.heads_q);
    if (grads.dsinks.size() == dsinks.bytes.size() / sizeof(float))
      std::memcpy(dsinks.data(), grads.dsinks.data(), dsinks.bytes.size());
    else
      tools::poison(dsinks);  // not written at all
    r.dsinks_error = tools::relative_error(dsinks, ref.dsinks, {}, batch.heads_q);
  }
  const double tol = tools::tolerance(batch.dtype);
  r.passed = r.dq_error <= tol && r.dk_error <= tol && r.dv_error <= tol && r.dsinks_error <= tol;
  if (!r.passed)
    r.failure = strprintf(
        "gradient error above %.0e (dq %.2e, dk %.2e, dv %.2e, dsinks %.2e; inf = NaN or "
        "an unwritten element)",
        tol, r.dq_error, r.dk_error, r.dv_error, r.dsinks_error);
  return r;
}

}  // namespace jfa::cli
