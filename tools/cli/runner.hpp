// Runners execute one jagged attention problem on a backend: upload the inputs, run, time repeated
// runs, download the output. The CPU runner works in place on host memory; the device runner
// copies to GPU memory and times with CUDA events. Commands only talk to this interface.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/paged.hpp"
#include "cli/progress.hpp"
#include "cli/timing.hpp"
#include "common/jagged_batch.hpp"
#include "jfa/jfa.hpp"

namespace jfa::cli {

struct RunConfig {
  bool causal = false;
  bool with_lse = false;  // also produce the float32 log-sum-exp [heads_q, total_q]
  // Not null: the keys and values come from this cache (holding the batch's), and the call is the
  // paged forward. The runner may keep pointers into it, as into the batch.
  const PagedCache* paged = nullptr;
};

// One call of the library on buffers that live wherever the runner keeps them.
struct AttentionCall {
  JaggedTensor q, k, v, out;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t batch = 0;
  AttentionOptions options;
  // Set: a call of jfa_attention_forward_paged over this cache. k and v then give only the heads
  // and columns (no data, no tokens), cu_seqlens_k is null and options.workspace unused.
  std::optional<jfa_paged_kv> paged;
  // The paged call's device scratch (jfa_attention_paged_workspace_size bytes), or null.
  void* paged_workspace = nullptr;
  size_t paged_workspace_bytes = 0;

  void operator()() const;
  // The C ABI's params of the paged call: no packed keys, as it requires.
  jfa_attention_params paged_params() const;
};

// Gradients with respect to q, k, v and the sinks (empty without them), in host memory.
struct Gradients {
  tools::HostBuffer dq, dk, dv;
  std::vector<float> dsinks;
};

// The call for `batch` on its host buffers (out left null), with the max-length hints set; over
// config.paged's host buffers where it is set.
AttentionCall make_host_call(const tools::JaggedBatch& batch, const RunConfig& config,
                             Backend backend);

// The float64 reference of a call on host buffers (packed or paged): rows of `tokens`,
// [tokens, heads_q, head_dim_v]; lse (when not null) gets [heads_q, tokens].
std::vector<double> reference_of(const AttentionCall& call, std::span<const int64_t> tokens,
                                 std::vector<double>* lse);

// Host gradient buffers shaped for `call`'s q, k, v (and sinks), poisoned with NaN.
Gradients poisoned_gradients(const AttentionCall& call);

class Runner {
 public:
  virtual ~Runner() = default;

  virtual Backend backend() const = 0;
  const char* backend_name() const { return backend() == Backend::kCuda ? "cuda" : "cpu"; }
  // What runs the work, for humans: "CPU (2 threads)", "NVIDIA H200 (sm_90, 132 SMs, ...)".
  virtual std::string device() const = 0;
  virtual bool supports(DType dtype) const = 0;
  // Whether the backend takes these head sizes (q and k, v and out); `supported` gets the values
  // it takes, for messages.
  virtual bool supports_head_dims(int head_dim, int head_dim_v, std::string* supported) const = 0;

  // Makes `batch` the current problem and allocates its output. The runner may keep pointers into
  // `batch`, which must outlive the runner or the next upload().
  virtual void upload(const tools::JaggedBatch& batch, const RunConfig& config) = 0;
  // Fills the output (and LSE) with NaN so that anything left unwritten is caught.
  virtual void poison_output() = 0;
  // One forward pass, complete when it returns.
  virtual void run() = 0;
  // `warmup` untimed runs, then `repeats` timed ones, each reported to `progress` when done.
  virtual Timing time(int warmup, int repeats, Progress& progress) = 0;
  // The output of the last run into host memory; lse (when not null) gets [heads_q, total_q].
  virtual void download(tools::HostBuffer* out, std::vector<float>* lse) = 0;
  // The backward of the last run (uploaded with with_lse) for the output gradient `dout` (host,
  // [total_q, heads_q, head_dim_v]); the gradients are poisoned before the call, so anything left
  // unwritten is caught, and copied to host memory after it.
  virtual void backward(const tools::HostBuffer& dout, Gradients* grads) = 0;
  // Forgets the current problem and frees its buffers.
  virtual void release() = 0;
};

std::unique_ptr<Runner> make_cpu_runner();
// Throws jfa::Error (backend unavailable) when the tool was built without CUDA.
std::unique_ptr<Runner> make_device_runner();

// Whether `auto` would pick the GPU: the tool is built with CUDA and the library sees a GPU.
bool device_runner_available();

// auto: the device runner when available, else the CPU runner; cpu and cuda as asked (cuda
// throws UsageError when it is not available: the command line asked for what is not there).
std::unique_ptr<Runner> make_runner(BackendChoice choice);

// The CPU path's thread count: the hardware threads, capped by JFA_NUM_THREADS.
int cpu_threads();

}  // namespace jfa::cli
