#include "cli/compare.hpp"

#include "cli/padded.hpp"

namespace jfa::cli {

Comparison compare(Runner& runner, const tools::JaggedBatch& batch, const CompareOptions& options) {
  Comparison result;
  const double flops = attention_flops(batch.cu_q, batch.cu_k, batch.heads_q, batch.head_dim,
                                       options.config.causal, batch.value_dim());

  Progress progress(options.progress_interval_s);
  runner.upload(batch, options.config);
  if (options.check) {
    progress.phase("check against the float64 reference", 1);
    runner.poison_output();
    runner.run();
    tools::HostBuffer out;
    runner.download(&out, nullptr);
    result.check = check_against_reference(
        batch, options.config.causal, out, nullptr,
        sample_tokens(batch, options.check_tokens_per_sequence, options.check_seed),
        options.config.paged);
  }
  // Without query tokens a call does no work: its time would be the call's overhead alone, and a
  // ratio of two such times says nothing of the layouts.
  const bool work = batch.total_q() > 0;
  const bool paged = options.config.paged != nullptr;
  result.jagged.layout = paged ? "paged" : "jagged";
  if (work) {
    progress.phase(paged ? "paged layout" : "jagged layout", options.warmup + options.repeats);
    result.jagged.timing = runner.time(options.warmup, options.repeats, progress);
  }
  result.jagged.useful_flops = flops;
  result.jagged.tokens_q = batch.total_q();
  result.jagged.tokens_k = batch.total_k();

  // Padding a paged cache would compare nothing a server does: no baseline for paged runs.
  if (options.padded && !paged) {
    const tools::JaggedBatch padded = make_padded(batch);
    runner.upload(padded, options.config);
    Measurement m;
    m.layout = "padded";
    if (work) {
      progress.phase("padded layout", options.warmup + options.repeats);
      m.timing = runner.time(options.warmup, options.repeats, progress);
    }
    m.useful_flops = flops;
    m.tokens_q = padded.total_q();
    m.tokens_k = padded.total_k();
    result.padded = std::move(m);
  }
  runner.release();
  return result;
}

}  // namespace jfa::cli
