// The CPU runner: the library's multithreaded float32 path on host memory, timed on the wall clock.
#include <algorithm>
#include <limits>
#include <memory>

#include "cli/format.hpp"
#include "cli/runner.hpp"

namespace jfa::cli {
namespace {

class CpuRunner final : public Runner {
 public:
  Backend backend() const override { return Backend::kCpu; }

  std::string device() const override {
    const int n = cpu_threads();
    return strprintf("CPU (%d thread%s)", n, n == 1 ? "" : "s");
  }

  bool supports(DType) const override { return true; }

  bool supports_head_dims(int head_dim, int head_dim_v, std::string* supported) const override {
    *supported = strprintf("1 to %d each", JFA_MAX_HEAD_DIM);
    return head_dim >= 1 && head_dim <= JFA_MAX_HEAD_DIM && head_dim_v >= 1 &&
           head_dim_v <= JFA_MAX_HEAD_DIM;
  }

  void upload(const tools::JaggedBatch& batch, const RunConfig& config) override {
    call_ = make_host_call(batch, config, Backend::kCpu);
    out_ = batch.make_output();
    call_.out.data = out_.data();
    lse_.clear();
    call_.options.lse = nullptr;
    if (config.with_lse) {
      lse_.resize(static_cast<size_t>(batch.total_q()) * batch.heads_q);
      call_.options.lse = lse_.data();
    }
  }

  void poison_output() override {
    tools::poison(out_);
    std::fill(lse_.begin(), lse_.end(), std::numeric_limits<float>::quiet_NaN());
  }

  void run() override { call_(); }

  Timing time(int warmup, int repeats, Progress& progress) override {
    for (int i = 0; i < warmup; ++i) {
      call_();
      progress.step();
    }
    Timing timing;
    for (int i = 0; i < repeats; ++i) {
      Stopwatch watch;
      call_();
      timing.ms.push_back(watch.elapsed_ms());
      progress.step();
    }
    return timing;
  }

  void download(tools::HostBuffer* out, std::vector<float>* lse) override {
    if (out != nullptr) *out = out_;
    if (lse != nullptr) *lse = lse_;
  }

  void backward(const tools::HostBuffer& dout, Gradients* grads) override {
    if (call_.paged) throw Error(Status::kUnsupported, "the backward takes no paged KV cache");
    *grads = poisoned_gradients(call_);
    auto like = [](JaggedTensor view, const tools::HostBuffer& data) {
      view.data = const_cast<void*>(data.data());
      view.token_stride = view.head_stride = 0;  // the buffers are packed
      return view;
    };
    BackwardViews views{like(call_.out, dout), like(call_.q, grads->dq), like(call_.k, grads->dk),
                        like(call_.v, grads->dv)};
    views.dsinks = grads->dsinks.empty() ? nullptr : grads->dsinks.data();
    attention_backward(call_.q, call_.k, call_.v, call_.out, views, call_.cu_seqlens_q,
                       call_.cu_seqlens_k, call_.batch, call_.options);
  }

  void release() override {
    call_ = AttentionCall();
    out_ = tools::HostBuffer();
    lse_ = std::vector<float>();
  }

 private:
  AttentionCall call_;
  tools::HostBuffer out_;
  std::vector<float> lse_;
};

}  // namespace

std::unique_ptr<Runner> make_cpu_runner() { return std::make_unique<CpuRunner>(); }

}  // namespace jfa::cli
