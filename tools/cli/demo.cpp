// `jfa demo`: the two reference problems, jagged against padded, on the chosen backend.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/compare.hpp"
#include "cli/format.hpp"
#include "cli/runner.hpp"
#include "cli/workloads.hpp"
#include "common/jagged_batch.hpp"

namespace jfa::cli {
namespace {

constexpr int kFullHeads = 16;
constexpr int kHeadDim = 128;
constexpr DType kDType = DType::kFloat16;
// On the CPU (tens of GFLOP/s) the full problems take minutes; by default they are shrunk so the
// whole demo takes seconds: fewer heads for both, and W1's lengths divided by 4.
constexpr int kCpuHeads = 2;
constexpr int32_t kCpuW1LengthDivisor = 4;

struct DemoProblem {
  std::string title;
  std::string shape;  // what the lengths are, including any scaling
  std::vector<int32_t> lengths;
  int heads = kFullHeads;
  uint64_t data_seed = 0;
};

std::string length_summary(const std::vector<int32_t>& lengths) {
  if (lengths.empty()) return "no sequences";
  const auto [lo, hi] = std::minmax_element(lengths.begin(), lengths.end());
  const double mean = std::accumulate(lengths.begin(), lengths.end(), 0.0) / lengths.size();
  return strprintf("min %d, mean %.0f, max %d", *lo, mean, *hi);
}

void print_problem_result(const DemoProblem& problem, const Comparison& c) {
  const Measurement& j = c.jagged;
  const Measurement& p = *c.padded;
  std::printf("    tokens    %s real vs %s padded (%.0f%% of the padded batch is real)\n",
              with_commas(j.tokens_q).c_str(), with_commas(p.tokens_q).c_str(),
              100.0 * static_cast<double>(j.tokens_q) / static_cast<double>(p.tokens_q));
  std::printf("    work      %.4g useful GFLOP (forward, non-causal)\n", j.useful_flops * 1e-9);
  std::printf("    jagged    %10.3f ms   %s useful\n", j.median_ms(),
              format_flops_rate(j.useful_flops_per_second()).c_str());
  std::printf("    padded    %10.3f ms   %s useful\n", p.median_ms(),
              format_flops_rate(p.useful_flops_per_second()).c_str());
  std::printf("    speedup   %.2fx jagged over padded\n", c.speedup());
  const CheckReport& r = *c.check;
  std::printf("    check     %s: relative error %.2e %s %.0e (the %s tolerance)\n",
              r.passed ? "PASS" : "FAIL", r.rel_error, r.rel_error <= r.tolerance ? "<=" : ">",
              r.tolerance, tools::dtype_name(kDType));
  std::printf(
      "              jagged output vs the float64 reference on %lld sampled query tokens "
      "x %d heads\n",
      static_cast<long long>(r.rows), problem.heads);
  if (!r.passed) std::printf("              %s\n", r.failure.c_str());
}

}  // namespace

int demo_main(std::span<const std::string> args) {
  BackendChoice backend = BackendChoice::kAuto;
  int repeats = 0;
  bool full = false;
  ArgParser parser("jfa demo",
                   "Runs the two reference problems, the worked example [128, 4096, 512, 2048] and "
                   "the benchmark batch W1\n(B=32, lengths uniform in [1024, 3072]), with 16 "
                   "heads, head_dim 128, fp16: jagged attention\nagainst the same work padded "
                   "to the longest sequence, with the jagged output checked against the\nfloat64 "
                   "reference on sampled query tokens. On the CPU the problems are scaled down "
                   "unless --full.");
  parser.add_backend(&backend);
  parser.add_int(
      "--repeats", "N",
      "timed runs per measurement (default 10 on a GPU, 3 on the CPU, 1 with --full on the CPU)",
      &repeats, 1, 100000);
  parser.add_flag("--full", "run the full-size problems on the CPU too (minutes; no warm-up run)",
                  &full);
  parser.set_epilog(
      "exit status: 0 when every check passes, 1 when one fails or the library\n"
      "reports an error, 2 on a bad command line\n");
  if (!parser.parse(args)) return 0;

  const Stopwatch wall;
  std::unique_ptr<Runner> runner = make_runner(backend);
  const bool on_cpu = runner->backend() == Backend::kCpu;
  const bool scaled = on_cpu && !full;
  // Full size on the CPU takes minutes per run: one timed run, no warm-up, unless --repeats.
  if (repeats == 0) repeats = !on_cpu ? 10 : scaled ? 3 : 1;
  const int warmup = !on_cpu ? 3 : scaled ? 1 : 0;

  std::vector<DemoProblem> problems;
  {
    const Workload w2 = *preset_workload("W2");
    DemoProblem a;
    a.title = "(a) the worked example (W2)";
    a.lengths = w2.lengths_q;
    a.shape = strprintf("%zu sequences packed end to end, cu_seqlens %s", a.lengths.size(),
                        format_list(lengths_to_offsets(a.lengths)).c_str());
    a.data_seed = w2.data_seed;
    problems.push_back(a);

    const Workload w1 = *preset_workload("W1");
    DemoProblem b;
    b.title = "(b) the benchmark batch (W1)";
    b.lengths = w1.lengths_q;
    b.shape = strprintf("B=%zu, lengths uniform in [1024, 3072], seed 0x%llX", b.lengths.size(),
                        static_cast<unsigned long long>(kW1LengthSeed));
    b.data_seed = w1.data_seed;
    if (scaled) {
      b.lengths = scale_lengths(w1.lengths_q, kCpuW1LengthDivisor);
      b.shape += strprintf(", divided by %d", kCpuW1LengthDivisor);
    }
    problems.push_back(b);
  }
  if (scaled)
    for (DemoProblem& p : problems) p.heads = kCpuHeads;

  std::printf("jfa %s demo: jagged flash attention against padding\n", version().c_str());
  std::printf("backend   %s: %s\n", runner->backend_name(), runner->device().c_str());
  std::printf(
      "timing    median of %s after %s; useful FLOP/s count only the real tokens of "
      "each\n          problem, so the padded run earns nothing for its padding\n",
      count_of(repeats, "run").c_str(), count_of(warmup, "warm-up run").c_str());
  std::printf(
      "padded    every sequence padded with zeros to the longest and run as one batch of "
      "equal lengths;\n          padded keys are not masked, so the padded run is timed, "
      "not checked\n");
  if (scaled) {
    std::printf(
        "scaled    the CPU path runs at tens of GFLOP/s, so the problems are scaled "
        "down:\n          %d heads instead of %d, W1 lengths divided by %d; --full runs "
        "the full size (minutes)\n",
        kCpuHeads, kFullHeads, kCpuW1LengthDivisor);
  }
  std::fflush(stdout);

  bool all_passed = true;
  for (const DemoProblem& problem : problems) {
    std::printf("\n%s\n    shape     %s\n", problem.title.c_str(), problem.shape.c_str());
    std::printf("    lengths   %s (%s)\n", format_list(problem.lengths, 6).c_str(),
                length_summary(problem.lengths).c_str());
    std::printf("    heads     %d%s, head_dim %d, %s, non-causal\n", problem.heads,
                problem.heads != kFullHeads ? strprintf(" (full: %d)", kFullHeads).c_str() : "",
                kHeadDim, tools::dtype_name(kDType));
    std::fflush(stdout);
    const tools::JaggedBatch batch =
        tools::make_batch(problem.lengths, problem.lengths, problem.heads, problem.heads, kHeadDim,
                          kDType, problem.data_seed);
    CompareOptions options;
    options.warmup = warmup;
    options.repeats = repeats;
    options.padded = true;
    options.check = true;
    options.check_tokens_per_sequence = 8;
    const Comparison c = compare(*runner, batch, options);
    print_problem_result(problem, c);
    std::fflush(stdout);
    all_passed = all_passed && c.check->passed;
  }
  std::printf("\ndemo: %s (%.1f s)\n", all_passed ? "all checks passed" : "a check FAILED",
              wall.elapsed_ms() * 1e-3);
  return all_passed ? 0 : 1;
}

}  // namespace jfa::cli
