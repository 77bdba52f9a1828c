// How much faster the fast CPU path is than the float64 reference, on the worked example
// (W2: lengths [128, 4096, 512, 2048], 16 heads, head_dim 128, fp16, non-causal).
// Usage: jfa_bench_cpu_vs_reference [heads] [fast_repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"

namespace {

template <typename Fn>
double seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int heads = argc > 1 ? std::atoi(argv[1]) : 16;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::vector<int32_t> lengths = {128, 4096, 512, 2048};
  jfa::tools::JaggedBatch b =
      jfa::tools::make_batch(lengths, lengths, heads, heads, 128, jfa::DType::kFloat16, 2026);
  jfa::tools::HostBuffer out = b.make_output();
  jfa::JaggedTensor o{out.data(), b.dtype, b.total_q(), heads, 128, 0, 0};
  const double flops = jfa::attention_flops(b.cu_q, b.cu_k, heads, 128, false);

  jfa::AttentionOptions options;
  options.backend = jfa::Backend::kCpu;
  auto fast = [&] {
    jfa::attention(b.q_view(), b.k_view(), b.v_view(), o, b.cu_q.data(), b.cu_k.data(), b.batch(),
                   options);
  };
  fast();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(seconds(fast));
  std::sort(times.begin(), times.end());
  const double fast_s = times[times.size() / 2];

  std::vector<double> ref;
  const double ref_s = seconds([&] {
    ref = jfa::attention_reference(b.q_view(), b.k_view(), b.v_view(), b.cu_q.data(), b.cu_k.data(),
                                   b.batch());
  });
  const double err = jfa::tools::relative_error(out, ref, {}, int64_t{heads} * 128);

  std::printf("W2 [128, 4096, 512, 2048], heads %d, head_dim 128, fp16, non-causal, %s threads\n",
              heads, std::getenv("JFA_NUM_THREADS") ? std::getenv("JFA_NUM_THREADS") : "all");
  std::printf("fast float32 path : %8.3f s (median of %d)  %7.2f GFLOP/s\n", fast_s, repeats,
              flops / fast_s * 1e-9);
  std::printf("float64 reference : %8.3f s (one run)       %7.2f GFLOP/s\n", ref_s,
              flops / ref_s * 1e-9);
  std::printf("speedup           : %8.1fx   (relative error of the fast path %.2e)\n",
              ref_s / fast_s, err);
  return err <= jfa::tools::tolerance(b.dtype) ? 0 : 1;
}
