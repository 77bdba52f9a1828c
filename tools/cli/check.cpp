// `jfa check`: random and edge-case problems against the float64 reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/runner.hpp"
#include "cli/verify.hpp"
#include "common/jagged_batch.hpp"

namespace jfa::cli {
namespace {

constexpr uint64_t kDefaultSeed = 20261129;
// Problems whose full reference costs more multiply-adds than this are checked on sampled rows.
constexpr double kFullReferenceBudget = 6e7;
constexpr int kSampledTokensPerSequence = 16;

struct Case {
  std::vector<int32_t> lengths_q, lengths_k;
  int32_t heads_q = 1, heads_kv = 1, head_dim = 64;
  int32_t head_dim_v = 0;  // 0: head_dim
  DType dtype = DType::kFloat16;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sinks = false;  // random sinks, normal(0, 2) per query head
  std::string note;    // what an edge case is about
};

// Edge cases first: every run of `jfa check` covers them, whatever the seed.
std::vector<Case> edge_cases() {
  std::vector<Case> cases;
  auto add = [&](std::vector<int32_t> q, std::vector<int32_t> k, int32_t hq, int32_t hkv, int32_t d,
                 bool causal, const char* note) {
    Case c;
    c.lengths_q = std::move(q);
    c.lengths_k = k.empty() && !c.lengths_q.empty() ? c.lengths_q : std::move(k);
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.head_dim = d;
    c.causal = causal;
    c.note = note;
    cases.push_back(std::move(c));
  };
  add({}, {}, 4, 2, 64, false, "empty batch");
  add({1}, {}, 1, 1, 32, true, "one token");
  add({0, 37, 0, 1, 100, 0}, {}, 2, 2, 128, false, "zero-length sequences");
  add({5, 0, 70, 33}, {0, 33, 129, 7}, 4, 2, 64, true, "cross, causal, rows without keys");
  add({63, 65, 129}, {}, 8, 1, 96, true, "MQA, lengths around tile edges");
  add({0, 0, 0}, {0, 0, 0}, 2, 1, 32, false, "all sequences empty");
  add({1000, 37}, {}, 2, 1, 128, true, "long sequence");
  add({31, 33, 95, 97}, {200, 1, 64, 0}, 6, 3, 64, false, "cross, q/k lengths differ");
  add({5, 0, 70, 33}, {0, 33, 129, 7}, 4, 2, 64, false, "cross, window 0,0, sinks");
  cases.back().window_left = cases.back().window_right = 0;
  cases.back().sinks = true;
  add({63, 130}, {}, 4, 4, 32, true, "causal, window 16 left, softcap 5");
  cases.back().window_left = 16;
  cases.back().softcap = 5.0f;
  return cases;
}

int32_t random_length(std::mt19937_64& rng) {
  const int kind = static_cast<int>(rng() % 20);
  if (kind < 3) return 0;
  if (kind < 5) return 1;
  if (kind < 10) {  // near a multiple of 32 or 64
    const int32_t base = static_cast<int32_t>(32 * (1 + rng() % 8));
    return base + static_cast<int32_t>(rng() % 3) - 1;
  }
  return static_cast<int32_t>(1 + rng() % 300);
}

// takes_any_head_dim_v: the backend takes any head_dim_v (the CPU), so random cases draw some.
Case random_case(std::mt19937_64& rng, bool takes_any_head_dim_v) {
  Case c;
  const int64_t batch = rng() % 20 == 0 ? 0 : static_cast<int64_t>(1 + rng() % 8);
  const bool cross = rng() % 10 < 3;
  for (int64_t b = 0; b < batch; ++b) {
    c.lengths_q.push_back(random_length(rng));
    c.lengths_k.push_back(cross ? random_length(rng) : c.lengths_q.back());
  }
  if (batch > 0 && rng() % 10 == 0) {  // now and then a long sequence (checked on sampled rows)
    const size_t b = rng() % static_cast<size_t>(batch);
    c.lengths_q[b] = static_cast<int32_t>(500 + rng() % 1500);
    if (!cross) c.lengths_k[b] = c.lengths_q[b];
  }
  static constexpr int32_t kKvHeads[] = {1, 2, 3, 4};
  static constexpr int32_t kGroups[] = {1, 1, 2, 4};
  c.heads_kv = kKvHeads[rng() % 4];
  c.heads_q = c.heads_kv * kGroups[rng() % 4];
  static constexpr int32_t kHeadDims[] = {32, 64, 96, 128, 192, 256};
  c.head_dim = kHeadDims[rng() % std::size(kHeadDims)];
  c.causal = rng() % 2 == 0;
  // Now and then a value head size of its own: 192/128 (a pair the CUDA forward has too) or a
  // random one; backends that do not take the pair report it as unsupported.
  if (takes_any_head_dim_v && rng() % 4 == 0)
    c.head_dim_v = c.head_dim == 192 && rng() % 2 ? 128 : static_cast<int32_t>(1 + rng() % 256);
  // A window about a third of the time: each side unbounded or up to 100 keys (longer than
  // many sequences). The left side is never 0: with right 0 (or causal) every row would see one
  // key, whose dq and dk are 0 exactly, and a relative error of rounding noise means nothing
  // (the edge cases cover window 0,0, with sinks).
  auto side = [&rng](int32_t lo) {
    return rng() % 4 == 0 ? -1 : lo + static_cast<int32_t>(rng() % (101 - lo));
  };
  if (rng() % 3 == 0) {
    c.window_left = side(1);
    c.window_right = side(0);
  }
  if (rng() % 4 == 0) c.softcap = 0.5f + static_cast<float>(rng() % 100) / 10.0f;
  c.sinks = rng() % 4 == 0;
  return c;
}

double reference_cost(const Case& c) {
  double pairs = 0;
  for (size_t b = 0; b < c.lengths_q.size(); ++b)
    pairs += static_cast<double>(c.lengths_q[b]) * c.lengths_k[b];
  return pairs * c.heads_q * (c.head_dim + (c.head_dim_v == 0 ? c.head_dim : c.head_dim_v)) / 2;
}

std::string describe_lengths(const Case& c) {
  std::string out = "q=" + format_list(c.lengths_q, 6);
  out += c.lengths_k == c.lengths_q ? " k=q" : " k=" + format_list(c.lengths_k, 6);
  return out;
}

// " window=L,R softcap=C sinks" for what a case has of them.
std::string describe_local(const Case& c) {
  std::string out;
  if (c.window_left != -1 || c.window_right != -1)
    out += strprintf(" window=%d,%d", c.window_left, c.window_right);
  if (c.softcap != 0.0f) out += strprintf(" softcap=%g", static_cast<double>(c.softcap));
  if (c.sinks) out += " sinks";
  return out;
}

struct Worst {
  double error = -1;
  int case_index = -1;
};

}  // namespace

int check_main(std::span<const std::string> args) {
  int cases = 60;
  uint64_t seed = kDefaultSeed;
  BackendChoice backend = BackendChoice::kAuto;
  std::optional<DType> only_dtype;
  bool no_backward = false;
  ArgParser parser("jfa check",
                   "Runs edge cases and random problems (empty batches, zero-length and "
                   "length-1 sequences, lengths\noff tile multiples, cross attention, GQA/MQA, "
                   "causal or not, head_dim 32 to 256, on the CPU also v with a head_dim of its "
                   "own,\nsliding windows, softcap and attention sinks, every dtype of the "
                   "backend) and "
                   "compares the output and the log-sum-exp with the float64 reference, then the "
                   "gradients of\nthe backward (where the reference is affordable). Outputs are "
                   "poisoned with NaN before each\nrun, so anything left unwritten fails.");
  parser.add_int("--cases", "N", "number of problems, the edge cases first (default 60)", &cases, 1,
                 1000000);
  parser.add_uint64("--seed", "S",
                    strprintf("seed of the random problems (default %llu)",
                              static_cast<unsigned long long>(kDefaultSeed)),
                    &seed);
  parser.add_backend(&backend);
  parser.add_option("--dtype", "fp16|bf16|fp32",
                    "check only this dtype (default: every dtype the backend supports, in turn)",
                    [&only_dtype](std::string_view v) { only_dtype = parse_dtype(v); });
  parser.add_flag("--no-backward", "check the forward only", &no_backward);
  parser.set_epilog(
      "exit status: 0 when every case passes, 1 when one fails (error above the "
      "dtype's tolerance, a\nnon-finite output, or a library error), 2 on a bad "
      "command line\n");
  if (!parser.parse(args)) return 0;

  std::unique_ptr<Runner> runner = make_runner(backend);
  std::vector<DType> dtypes;
  if (only_dtype) {
    if (!runner->supports(*only_dtype)) {
      throw UsageError(strprintf("--dtype: %s is not supported by the %s backend",
                                 tools::dtype_name(*only_dtype), runner->backend_name()));
    }
    dtypes = {*only_dtype};
  } else {
    for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32})
      if (runner->supports(t)) dtypes.push_back(t);
  }

  std::printf("jfa %s check: %d cases, seed %llu, backend %s: %s\n", version().c_str(), cases,
              static_cast<unsigned long long>(seed), runner->backend_name(),
              runner->device().c_str());
  std::printf("tolerances: relative error fp16 %.0e, bf16 %.0e, fp32 %.0e; log-sum-exp %.0e\n",
              tools::tolerance(DType::kFloat16), tools::tolerance(DType::kBFloat16),
              tools::tolerance(DType::kFloat32), kLseTolerance);
  std::fflush(stdout);

  std::string unused;
  const bool takes_any_head_dim_v = runner->supports_head_dims(64, 5, &unused);
  const std::vector<Case> edges = edge_cases();
  std::map<DType, Worst> worst;
  double worst_lse = 0;
  int failed = 0, unsupported = 0;
  int backward_checked = 0, backward_unsupported = 0;
  double worst_backward = 0;
  std::vector<std::string> unsupported_reasons;
  const Stopwatch wall;
  for (int i = 0; i < cases; ++i) {
    std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1)));
    Case c = i < static_cast<int>(edges.size()) ? edges[static_cast<size_t>(i)]
                                                : random_case(rng, takes_any_head_dim_v);
    c.dtype = dtypes[static_cast<size_t>(i) % dtypes.size()];

    tools::JaggedBatch batch = tools::make_batch(c.lengths_q, c.lengths_k, c.heads_q, c.heads_kv,
                                                 c.head_dim, c.dtype, rng(), c.head_dim_v);
    batch.window_left = c.window_left;
    batch.window_right = c.window_right;
    batch.softcap = c.softcap;
    if (c.sinks) tools::draw_sinks(batch, rng());
    const bool full = reference_cost(c) <= kFullReferenceBudget;
    const std::vector<int64_t> tokens =
        full ? all_tokens(batch) : sample_tokens(batch, kSampledTokensPerSequence, rng());
    const std::string head =
        strprintf("case %3d  %s %-10s h=%d/%d d=%-7s B=%-2lld", i, tools::dtype_name(c.dtype),
                  c.causal ? "causal" : "non-causal", c.heads_q, c.heads_kv,
                  head_dims_string(c.head_dim, batch.value_dim()).c_str(),
                  static_cast<long long>(batch.batch()));
    const std::string tail = "  " + describe_lengths(c) + describe_local(c) +
                             (c.note.empty() ? "" : "  (" + c.note + ")");
    try {
      runner->upload(batch, {.causal = c.causal, .with_lse = true});
      runner->poison_output();
      runner->run();
      tools::HostBuffer out;
      std::vector<float> lse;
      runner->download(&out, &lse);
      CheckReport r = check_against_reference(batch, c.causal, out, &lse, tokens);
      // The backward of the same problem, where its reference (about three forwards) fits.
      // "bwd -": not checked (forward failed, or the reference would cost too much).
      std::string backward = no_backward ? "" : "  bwd -       ";
      if (!no_backward && r.passed && 3 * reference_cost(c) <= kFullReferenceBudget) {
        tools::HostBuffer dout = batch.make_output();
        std::mt19937_64 dout_rng(rng());
        tools::fill_normal(dout, dout_rng);
        try {
          Gradients grads;
          runner->backward(dout, &grads);
          const BackwardReport br = check_backward_against_reference(batch, c.causal, dout, grads);
          ++backward_checked;
          const double e = std::max({br.dq_error, br.dk_error, br.dv_error, br.dsinks_error});
          worst_backward = std::max(worst_backward, e);
          backward = strprintf("  bwd %.2e", e);
          if (!br.passed) {
            r.passed = false;
            r.failure = br.failure;
          }
        } catch (const Error& e) {
          if (e.status() != Status::kUnsupported) throw;
          ++backward_unsupported;
          backward = "  bwd unsupported";
        }
      }
      runner->release();
      std::printf("%s  %s %5lld rows  err %.2e  lse %.1e%s  %s%s\n", head.c_str(),
                  full ? "all    " : "sampled", static_cast<long long>(r.rows), r.rel_error,
                  r.lse_error, backward.c_str(), r.passed ? "ok  " : "FAIL", tail.c_str());
      if (!r.passed) std::printf("          %s\n", r.failure.c_str());
      Worst& w = worst[c.dtype];
      if (r.rel_error > w.error) w = {r.rel_error, i};
      if (r.lse_checked) worst_lse = std::max(worst_lse, r.lse_error);
      if (!r.passed) ++failed;
    } catch (const Error& e) {
      runner->release();
      if (e.status() == Status::kUnsupported) {
        ++unsupported;
        // The backend's message is long and repeats; it is listed once after the cases.
        auto it = std::find(unsupported_reasons.begin(), unsupported_reasons.end(), e.what());
        if (it == unsupported_reasons.end())
          it = unsupported_reasons.insert(unsupported_reasons.end(), e.what());
        std::printf("%s  unsupported [%td]%s\n", head.c_str(), it - unsupported_reasons.begin() + 1,
                    tail.c_str());
      } else {
        ++failed;
        std::printf("%s  FAIL library error: %s%s\n", head.c_str(), e.what(), tail.c_str());
      }
    }
    std::fflush(stdout);
  }

  std::printf("\nworst relative error:");
  for (DType t : dtypes) {
    const auto it = worst.find(t);
    if (it == worst.end()) continue;
    std::printf("  %s %.2e (case %d, tolerance %.0e)", tools::dtype_name(t), it->second.error,
                it->second.case_index, tools::tolerance(t));
  }
  std::printf("\nworst log-sum-exp error: %.2e (tolerance %.0e)\n", worst_lse, kLseTolerance);
  if (!no_backward) {
    std::printf("backward: %d case%s checked, worst gradient error %.2e", backward_checked,
                backward_checked == 1 ? "" : "s", worst_backward);
    if (backward_unsupported > 0)
      std::printf(", %d unsupported by the backend", backward_unsupported);
    std::printf("\n");
  }
  for (size_t i = 0; i < unsupported_reasons.size(); ++i)
    std::printf("unsupported [%zu]: %s\n", i + 1, unsupported_reasons[i].c_str());
  const int passed = cases - failed - unsupported;
  std::printf("check: %d/%d passed", passed, cases);
  if (unsupported > 0) std::printf(", %d unsupported by the backend (skipped)", unsupported);
  if (failed > 0) std::printf(", %d FAILED", failed);
  std::printf(" (%.1f s)\n", wall.elapsed_ms() * 1e-3);
  // A backend that supports none of the cases has not been checked at all: that is a failure too.
  return failed > 0 || passed == 0 ? 1 : 0;
}

}  // namespace jfa::cli
