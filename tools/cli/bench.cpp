// `jfa bench`: times jagged attention (and its padded baseline) on a chosen batch.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/compare.hpp"
#include "cli/format.hpp"
#include "cli/paged.hpp"
#include "cli/runner.hpp"
#include "cli/workloads.hpp"
#include "common/jagged_batch.hpp"

namespace jfa::cli {
namespace {

struct BenchOptions {
  std::optional<Workload> preset;
  std::vector<int32_t> lengths, lengths_k;
  std::optional<UniformDist> dist;
  int batch = 32;
  uint64_t seed = 0;
  int heads = 16;
  int heads_kv = 0;  // 0: same as heads
  int head_dim = 128;
  int head_dim_v = 0;  // 0: same as head_dim
  int page_size = 0;   // 0: packed keys and values, else rows of a page of a paged cache
  int progress_s = 5;
  DType dtype = DType::kFloat16;
  bool causal = false;
  std::pair<int32_t, int32_t> window{-1, -1};
  double softcap = 0;
  bool sinks = false;
  BackendChoice backend = BackendChoice::kAuto;
  int repeats = 10;
  int warmup = -1;  // -1: 3 on a GPU, 1 on the CPU
  bool no_padded = false;
  bool json = false;
  bool check = false;
  bool print_lengths = false;
};

constexpr int32_t kMaxLength = INT32_MAX;
constexpr int kMaxPageSize = 1 << 20;
// The block table's permutation is drawn from the data seed plus this (the sinks take plus one).
constexpr uint64_t kPageSeedOffset = 2;

// The lengths to run, from exactly one of --workload, --lengths and --dist.
Workload resolve_workload(const ArgParser& parser, const BenchOptions& o) {
  const int sources =
      parser.given("--workload") + parser.given("--lengths") + parser.given("--dist");
  if (sources == 0) throw UsageError("give the lengths: --workload, --lengths or --dist");
  if (sources > 1)
    throw UsageError("--workload, --lengths and --dist are alternatives; give only one");
  if (parser.given("--batch") && !o.dist) throw UsageError("--batch goes with --dist");

  Workload w;
  if (o.preset) {
    w = *o.preset;
  } else if (o.dist) {
    const uint64_t seed = parser.given("--seed") ? o.seed : kDefaultDistSeed;
    w.name = strprintf("uniform:%d:%d", o.dist->lo, o.dist->hi);
    w.description = strprintf("B=%d, lengths uniform in [%d, %d], seed %llu", o.batch, o.dist->lo,
                              o.dist->hi, static_cast<unsigned long long>(seed));
    w.lengths_q = uniform_lengths(o.batch, *o.dist, seed);
    w.lengths_k = w.lengths_q;
    w.data_seed = kDataSeed;
  } else {
    w.name = "custom";
    w.description = "lengths " + format_list(o.lengths);
    w.lengths_q = o.lengths;
    w.lengths_k = o.lengths;
    w.data_seed = kDataSeed;
  }
  if (parser.given("--seed")) w.data_seed = o.seed;
  if (parser.given("--lengths-k")) {
    if (o.lengths_k.size() != w.lengths_q.size()) {
      throw UsageError(strprintf("--lengths-k: %zu lengths given, but the batch has %zu sequences",
                                 o.lengths_k.size(), w.lengths_q.size()));
    }
    w.lengths_k = o.lengths_k;
    w.description += ", key lengths " + format_list(o.lengths_k);
  }
  return w;
}

void print_json(const Workload& w, const tools::JaggedBatch& batch, const BenchOptions& o,
                const Runner& runner, const Comparison& c, const PagedCache* cache) {
  std::vector<const Measurement*> measured = {&c.jagged};
  if (c.padded) measured.push_back(&*c.padded);
  for (const Measurement* m : measured) {
    JsonLine line;
    line.add("method", "jfa")
        .add("backend", runner.backend_name())
        .add("device", runner.device())
        .add("layout", m->layout);
    if (cache != nullptr)
      line.add("page_size", int64_t{cache->page_size}).add("num_pages", cache->num_pages);
    line.add("workload", w.name)
        .add("dtype", tools::dtype_name(batch.dtype))
        .add("causal", o.causal)
        .add("window_left", int64_t{batch.window_left})
        .add("window_right", int64_t{batch.window_right})
        .add("softcap", static_cast<double>(batch.softcap))
        .add("sinks", !batch.sinks.empty())
        .add("batch", batch.batch())
        .add("heads", batch.heads_q)
        .add("heads_kv", batch.heads_kv)
        .add("head_dim", batch.head_dim)
        .add("head_dim_v", batch.value_dim())
        .add("total_q", batch.total_q())
        .add("total_k", batch.total_k())
        .add("max_seqlen_q", int64_t{max_length(batch.cu_q)})
        .add("max_seqlen_k", int64_t{max_length(batch.cu_k)})
        .add("processed_q", m->tokens_q)
        .add("processed_k", m->tokens_k)
        .add("useful_gflop", m->useful_flops * 1e-9)
        .add("median_ms", m->median_ms())
        .add("min_ms", m->timing.min())
        .add("max_ms", m->timing.max())
        .add("useful_tflops", m->useful_flops_per_second() * 1e-12)
        .add("repeats", static_cast<int64_t>(m->timing.ms.size()))
        .add("warmup", int64_t{o.warmup})
        .add("version", version());
    if (m == &c.jagged && c.padded && c.timed()) line.add("speedup_vs_padded", c.speedup());
    if (m == &c.jagged && c.check) {
      line.add("check_rows", c.check->rows)
          .add("check_rel_error", c.check->rel_error)
          .add("check_tolerance", c.check->tolerance)
          .add("check_passed", c.check->passed);
    }
    std::printf("%s\n", line.str().c_str());
  }
}

void print_table(const Runner& runner, const Comparison& c) {
  if (!c.timed()) {
    std::printf("\nnothing to time: the batch has no query tokens\n");
    return;
  }
  std::printf("\n%-14s %-8s %12s %12s %16s %12s %12s\n", "method", "layout", "median ms", "min ms",
              "useful TFLOP/s", "q tokens", "k tokens");
  std::vector<const Measurement*> measured = {&c.jagged};
  if (c.padded) measured.push_back(&*c.padded);
  const std::string method = strprintf("jfa (%s)", runner.backend_name());
  for (const Measurement* m : measured) {
    std::printf("%-14s %-8s %12.3f %12.3f %16.4g %12s %12s\n", method.c_str(), m->layout.c_str(),
                m->median_ms(), m->timing.min(), m->useful_flops_per_second() * 1e-12,
                with_commas(m->tokens_q).c_str(), with_commas(m->tokens_k).c_str());
  }
  if (c.padded) std::printf("\nspeedup: %.2fx jagged over padded\n", c.speedup());
}

}  // namespace

int bench_main(std::span<const std::string> args) {
  BenchOptions o;
  ArgParser parser("jfa bench",
                   "Times jagged attention on a batch, and the same batch padded to its longest "
                   "sequence, on one\nbackend; with --page-size, over a paged KV cache instead "
                   "(no padded run). Give the lengths with\n--workload, --lengths or --dist. "
                   "Useful TFLOP/s count the real tokens only.");
  parser.add_option("--workload", "W1|W2|W3|W4", "a benchmark workload (list below)",
                    [&o](std::string_view v) {
                      o.preset = preset_workload(v);
                      if (!o.preset) {
                        throw BadValue(strprintf("expected W1, W2, W3 or W4, got '%.*s'",
                                                 static_cast<int>(v.size()), v.data()));
                      }
                    });
  parser.add_option("--lengths", "L1,L2,...", "sequence lengths (>= 0), e.g. 128,4096,512,2048",
                    [&o](std::string_view v) { o.lengths = parse_int_list(v, 0, kMaxLength); });
  parser.add_option("--dist", "uniform:LO:HI", "random lengths, uniform integers in [LO, HI]",
                    [&o](std::string_view v) { o.dist = parse_dist(v); });
  parser.add_int("--batch", "B", "number of sequences of --dist (default 32)", &o.batch, 0,
                 1 << 24);
  parser.add_uint64("--seed", "S",
                    "seed of the --dist lengths and of the Q/K/V values (default: fixed seeds)",
                    &o.seed);
  parser.add_option("--lengths-k", "L1,L2,...",
                    "key/value lengths for cross attention, one per sequence (default: the query "
                    "lengths)",
                    [&o](std::string_view v) { o.lengths_k = parse_int_list(v, 0, kMaxLength); });
  parser.add_int("--heads", "H", "query heads (default 16)", &o.heads, 1, 65536);
  parser.add_int("--heads-kv", "H", "key/value heads, dividing --heads (default: --heads)",
                 &o.heads_kv, 1, 65536);
  parser.add_int("--head-dim", "D", "head dimension of q and k (default 128)", &o.head_dim, 1,
                 JFA_MAX_HEAD_DIM);
  parser.add_int("--head-dim-v", "D", "head dimension of v and the output (default: --head-dim)",
                 &o.head_dim_v, 1, JFA_MAX_HEAD_DIM);
  parser.add_int("--page-size", "P",
                 "keys and values in a paged KV cache of P rows a page, each sequence's pages in a "
                 "random order, run by the paged forward (no padded baseline; default: packed)",
                 &o.page_size, 1, kMaxPageSize);
  parser.add_dtype("element type (default fp16; fp32 on the CPU only)", &o.dtype);
  parser.add_flag("--causal", "causal mask (bottom-right aligned when q/k lengths differ)",
                  &o.causal);
  parser.add_option("--window", "L,R",
                    "local attention: query i sees keys i-L..i+R (bottom-right aligned; -1 = "
                    "unbounded; default -1,-1)",
                    [&o](std::string_view v) { o.window = parse_window(v); });
  parser.add_option("--softcap", "C",
                    "soft-cap the scaled scores to C tanh(s / C) (default 0: off)",
                    [&o](std::string_view v) { o.softcap = parse_double(v, 0, 3.4e38); });
  parser.add_flag("--sinks", "attention sinks: one random logit per query head, normal(0, 2)",
                  &o.sinks);
  parser.add_backend(&o.backend);
  parser.add_int("--repeats", "N", "timed runs, the median is reported (default 10)", &o.repeats, 1,
                 1000000);
  parser.add_int("--warmup", "N", "untimed runs first (default 3 on a GPU, 1 on the CPU)",
                 &o.warmup, 0, 1000000);
  parser.add_flag("--no-padded", "skip the padded baseline (implied by --page-size)", &o.no_padded);
  parser.add_flag("--check",
                  "check the jagged output against the float64 reference (the paged one with "
                  "--page-size) on sampled query tokens (exit 1 on failure)",
                  &o.check);
  parser.add_flag("--print-lengths",
                  "print the query lengths (comma-separated) and exit, so other tools can run the "
                  "same batch",
                  &o.print_lengths);
  parser.add_flag("--json", "print one JSON object per measured layout per line, nothing else",
                  &o.json);
  parser.add_int("--progress", "S",
                 "a progress line on stderr at most every S seconds (default 5; 0, and the "
                 "default under --json: none)",
                 &o.progress_s, 0, 86400);
  parser.set_epilog("workloads:\n" + preset_help() +
                    "\nexamples: jfa bench --workload W2 --heads 2 --repeats 5\n"
                    "          jfa bench --lengths 1,1,1,1 --lengths-k 4096,4096,300,17 "
                    "--page-size 16 --heads 32\n"
                    "            --heads-kv 8 --causal   (decode steps over a paged KV cache)\n");
  if (!parser.parse(args)) return 0;

  if (o.heads_kv == 0) o.heads_kv = o.heads;
  if (o.head_dim_v == 0) o.head_dim_v = o.head_dim;
  if (o.heads % o.heads_kv != 0) {
    throw UsageError(strprintf("--heads-kv: %d does not divide --heads %d (GQA needs a multiple)",
                               o.heads_kv, o.heads));
  }
  const Workload w = resolve_workload(parser, o);
  if (o.print_lengths) {
    for (size_t i = 0; i < w.lengths_q.size(); ++i)
      std::printf("%s%d", i ? "," : "", w.lengths_q[i]);
    std::printf("\n");
    return 0;
  }

  std::unique_ptr<Runner> runner = make_runner(o.backend);
  if (!runner->supports(o.dtype)) {
    throw UsageError(strprintf("--dtype: %s is not supported by the %s backend",
                               tools::dtype_name(o.dtype), runner->backend_name()));
  }
  // Before any buffer is allocated.
  if (std::string supported; !runner->supports_head_dims(o.head_dim, o.head_dim_v, &supported)) {
    throw UsageError(
        strprintf("--head-dim %d --head-dim-v %d: not supported by the %s backend (it takes %s)",
                  o.head_dim, o.head_dim_v, runner->backend_name(), supported.c_str()));
  }
  if (o.warmup < 0) o.warmup = runner->backend() == Backend::kCpu ? 1 : 3;

  tools::JaggedBatch batch = tools::make_batch(w.lengths_q, w.lengths_k, o.heads, o.heads_kv,
                                               o.head_dim, o.dtype, w.data_seed, o.head_dim_v);
  batch.window_left = o.window.first;
  batch.window_right = o.window.second;
  batch.softcap = static_cast<float>(o.softcap);
  if (o.sinks) tools::draw_sinks(batch, w.data_seed + 1);
  std::optional<PagedCache> cache;
  if (o.page_size > 0) cache = make_paged_cache(batch, o.page_size, w.data_seed + kPageSeedOffset);
  CompareOptions options;
  options.config.causal = o.causal;
  options.config.paged = cache ? &*cache : nullptr;
  options.warmup = o.warmup;
  options.repeats = o.repeats;
  options.padded = !o.no_padded && !cache;
  options.check = o.check;
  options.check_tokens_per_sequence = 8;
  options.progress_interval_s = parser.given("--progress") ? o.progress_s : (o.json ? 0 : 5);

  if (!o.json) {
    std::printf("jfa %s bench: %s (%s)\n", version().c_str(), w.name.c_str(),
                w.description.c_str());
    std::printf(
        "problem  B=%lld, %s query tokens, %s key tokens, heads %d/%d (q/kv), head_dim "
        "%s, %s, %s\n",
        static_cast<long long>(batch.batch()), with_commas(batch.total_q()).c_str(),
        with_commas(batch.total_k()).c_str(), o.heads, o.heads_kv,
        head_dims_string(o.head_dim, o.head_dim_v).c_str(), tools::dtype_name(o.dtype),
        o.causal ? "causal" : "non-causal");
    if (o.window != std::pair{-1, -1} || o.softcap != 0 || o.sinks)
      std::printf("local    window %d,%d, softcap %g, %s (useful FLOPs ignore the window)\n",
                  o.window.first, o.window.second, o.softcap,
                  o.sinks ? "sinks normal(0, 2)" : "no sinks");
    std::printf("backend  %s: %s; median of %s after %s\n", runner->backend_name(),
                runner->device().c_str(), count_of(o.repeats, "run").c_str(),
                count_of(o.warmup, "warm-up run").c_str());
    if (cache) {
      std::printf(
          "paged    KV cache of %s pages x %d rows, each sequence's pages in a random order "
          "(block table %lld x %d)\n",
          with_commas(cache->num_pages).c_str(), cache->page_size,
          static_cast<long long>(batch.batch()), cache->max_pages_per_seq);
      std::printf("padded   not run: the padded baseline does not apply to a paged cache\n");
    } else if (!o.no_padded) {
      std::printf(
          "padded   every sequence padded with zeros to the longest; padded keys are not "
          "masked (timed, not checked)\n");
    }
    std::fflush(stdout);
  }

  const Comparison c = compare(*runner, batch, options);

  if (o.json) {
    print_json(w, batch, o, *runner, c, cache ? &*cache : nullptr);
  } else {
    std::printf("work     %.4g useful GFLOP per forward\n", c.jagged.useful_flops * 1e-9);
    print_table(*runner, c);
    if (c.check && c.check->rows == 0) {
      std::printf("check: nothing to check (the batch has no query tokens)\n");
    } else if (c.check) {
      std::printf(
          "check: %s, relative error %.2e (%s tolerance %.0e) on %s sampled query "
          "tokens%s%s\n",
          c.check->passed ? "PASS" : "FAIL", c.check->rel_error, tools::dtype_name(o.dtype),
          c.check->tolerance, with_commas(c.check->rows).c_str(), c.check->passed ? "" : ": ",
          c.check->failure.c_str());
    }
  }
  if (c.check && !c.check->passed) {
    if (o.json) std::fprintf(stderr, "jfa bench: check FAILED: %s\n", c.check->failure.c_str());
    return 1;
  }
  return 0;
}

}  // namespace jfa::cli
