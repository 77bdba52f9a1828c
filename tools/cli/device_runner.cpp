// The device runner: inputs copied into GPU memory (cudaMalloc), the library's CUDA backend run on
// a stream of its own, repeats timed with CUDA events, outputs copied back for the checks.
#include "cli/runner.hpp"

#ifdef JFA_WITH_CUDA

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <memory>
#include <utility>

#include "cli/format.hpp"

namespace jfa::cli {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // reset the error state so later calls report their own errors
    throw Error(status == cudaErrorMemoryAllocation ? Status::kOutOfMemory : Status::kCuda,
                strprintf("%s failed: %s (%s)", what, cudaGetErrorString(status),
                          cudaGetErrorName(status)));
  }
}

// GPU memory owned by RAII; zero bytes hold no allocation (a null pointer).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) check_cuda(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // A buffer holding a copy of `bytes` bytes of host memory.
  static DeviceBuffer copy_of(const void* host, size_t bytes) {
    DeviceBuffer buffer(bytes);
    if (bytes > 0)
      check_cuda(cudaMemcpy(buffer.get(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return buffer;
  }

 private:
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaEvent {
 public:
  CudaEvent() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class DeviceRunner final : public Runner {
 public:
  DeviceRunner() {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&properties_, device_), "cudaGetDeviceProperties");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~DeviceRunner() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Backend backend() const override { return Backend::kCuda; }

  std::string device() const override {
    return strprintf("%s (GPU %d, sm_%d%d, %d SMs, %.0f GiB)", properties_.name, device_,
                     properties_.major, properties_.minor, properties_.multiProcessorCount,
                     static_cast<double>(properties_.totalGlobalMem) / (1024.0 * 1024 * 1024));
  }

  // float32 is a CPU-only dtype of the library.
  bool supports(DType dtype) const override { return dtype != DType::kFloat32; }

  // The head dims the Hopper kernels are built for (the library's message names the sizes a
  // build left out, and those of the backward).

  bool supports_head_dims(int head_dim, int head_dim_v, std::string* supported) const override {
    *supported = "32, 64, 96, 128, 192 or 256 with head_dim_v equal, or 192 with head_dim_v 128";
    if (head_dim_v == head_dim)
      return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 ||
             head_dim == 192 || head_dim == 256;
    return head_dim == 192 && head_dim_v == 128;
  }

  void upload(const tools::JaggedBatch& batch, const RunConfig& config) override {
    release();  // first, so two large problems never sit on the GPU together
    call_ = make_host_call(batch, config, Backend::kCuda);
    q_ = DeviceBuffer::copy_of(batch.q.data(), batch.q.bytes.size());
    cu_q_ = DeviceBuffer::copy_of(batch.cu_q.data(), batch.cu_q.size() * sizeof(int32_t));
    if (config.paged == nullptr) {
      k_ = DeviceBuffer::copy_of(batch.k.data(), batch.k.bytes.size());
      v_ = DeviceBuffer::copy_of(batch.v.data(), batch.v.bytes.size());
      cu_k_ = DeviceBuffer::copy_of(batch.cu_k.data(), batch.cu_k.size() * sizeof(int32_t));
    } else {
      // The cache and its tables in device memory: k_ and v_ hold the pages.
      const PagedCache& cache = *config.paged;
      k_ = DeviceBuffer::copy_of(cache.k.data(), cache.k.bytes.size());
      v_ = DeviceBuffer::copy_of(cache.v.data(), cache.v.bytes.size());
      block_table_ = DeviceBuffer::copy_of(cache.block_table.data(),
                                           cache.block_table.size() * sizeof(int32_t));
      seqused_k_ =
          DeviceBuffer::copy_of(cache.seqused_k.data(), cache.seqused_k.size() * sizeof(int32_t));
    }
    sinks_ = DeviceBuffer::copy_of(batch.sinks.data(), batch.sinks.size() * sizeof(float));
    out_ = DeviceBuffer(static_cast<size_t>(batch.total_q()) * batch.heads_q * batch.value_dim() *
                        dtype_size(batch.dtype));
    lse_ = DeviceBuffer(
        config.with_lse ? static_cast<size_t>(batch.total_q()) * batch.heads_q * sizeof(float) : 0);
    call_.q.data = q_.get();
    call_.out.data = out_.get();
    call_.cu_seqlens_q = static_cast<const int32_t*>(cu_q_.get());
    call_.options.lse = static_cast<float*>(lse_.get());
    call_.options.sinks = static_cast<const float*>(sinks_.get());  // null without sinks
    call_.options.stream = stream_;
    if (!call_.paged) {
      call_.k.data = k_.get();
      call_.v.data = v_.get();
      call_.cu_seqlens_k = static_cast<const int32_t*>(cu_k_.get());
      call_.options.workspace = &workspace_;
    } else {
      call_.paged->k_cache = k_.get();
      call_.paged->v_cache = v_.get();
      call_.paged->block_table = static_cast<const int32_t*>(block_table_.get());
      call_.paged->seqused_k = static_cast<const int32_t*>(seqused_k_.get());
      // Allocated here, so that the timed calls allocate nothing.
      const jfa_attention_params params = call_.paged_params();
      size_t bytes = 0;
      check(jfa_attention_paged_workspace_size(&params, &*call_.paged, &bytes));
      paged_workspace_ = DeviceBuffer(bytes);
      call_.paged_workspace = paged_workspace_.get();
      call_.paged_workspace_bytes = paged_workspace_.bytes();
    }
    with_lse_ = config.with_lse;
    out_dtype_ = batch.dtype;
  }

  void poison_output() override {
    if (out_.bytes() > 0)
      check_cuda(cudaMemsetAsync(out_.get(), 0xFF, out_.bytes(), stream_), "cudaMemsetAsync");
    if (lse_.bytes() > 0)
      check_cuda(cudaMemsetAsync(lse_.get(), 0xFF, lse_.bytes(), stream_), "cudaMemsetAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void run() override {
    call_();
    check_cuda(cudaStreamSynchronize(stream_), "attention on the GPU");
  }

  // GPU runs are queued and short: progress is not reported run by run.
  Timing time(int warmup, int repeats, Progress& /*progress*/) override {
    for (int i = 0; i < warmup; ++i) call_();
    check_cuda(cudaStreamSynchronize(stream_), "warm-up runs on the GPU");
    // One event pair per run, recorded back to back; a single synchronisation at the end keeps
    // the GPU busy between runs.
    std::vector<CudaEvent> start(static_cast<size_t>(repeats)), stop(static_cast<size_t>(repeats));
    for (int i = 0; i < repeats; ++i) {
      check_cuda(cudaEventRecord(start[i].get(), stream_), "cudaEventRecord");
      call_();
      check_cuda(cudaEventRecord(stop[i].get(), stream_), "cudaEventRecord");
    }
    check_cuda(cudaStreamSynchronize(stream_), "timed runs on the GPU");
    Timing timing;
    for (int i = 0; i < repeats; ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()), "cudaEventElapsedTime");
      timing.ms.push_back(ms);
    }
    return timing;
  }

  void download(tools::HostBuffer* out, std::vector<float>* lse) override {
    if (out != nullptr) {
      *out = tools::HostBuffer(out_dtype_,
                               static_cast<int64_t>(out_.bytes() / dtype_size(out_dtype_)));
      if (out_.bytes() > 0)
        check_cuda(cudaMemcpy(out->data(), out_.get(), out_.bytes(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy D2H");
    }
    if (lse != nullptr) {
      lse->assign(with_lse_ ? lse_.bytes() / sizeof(float) : 0, 0.0f);
      if (lse_.bytes() > 0)
        check_cuda(cudaMemcpy(lse->data(), lse_.get(), lse_.bytes(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy D2H");
    }
  }

  void backward(const tools::HostBuffer& dout, Gradients* grads) override {
    if (call_.paged) throw Error(Status::kUnsupported, "the backward takes no paged KV cache");
    *grads = poisoned_gradients(call_);
    const DeviceBuffer d_dout = DeviceBuffer::copy_of(dout.data(), dout.bytes.size());
    DeviceBuffer dq = DeviceBuffer::copy_of(grads->dq.data(), grads->dq.bytes.size());
    DeviceBuffer dk = DeviceBuffer::copy_of(grads->dk.data(), grads->dk.bytes.size());
    DeviceBuffer dv = DeviceBuffer::copy_of(grads->dv.data(), grads->dv.bytes.size());
    auto on = [](JaggedTensor view, const DeviceBuffer& data) {
      view.data = data.get();
      return view;
    };
    const BackwardViews views{on(call_.out, d_dout), on(call_.q, dq), on(call_.k, dk),
                              on(call_.v, dv)};
    attention_backward(call_.q, call_.k, call_.v, call_.out, views, call_.cu_seqlens_q,
                       call_.cu_seqlens_k, call_.batch, call_.options);
    check_cuda(cudaStreamSynchronize(stream_), "backward on the GPU");
    for (auto [host, device] :
         {std::pair{&grads->dq, &dq}, std::pair{&grads->dk, &dk}, std::pair{&grads->dv, &dv}})
      if (device->bytes() > 0)
        check_cuda(cudaMemcpy(host->data(), device->get(), device->bytes(), cudaMemcpyDeviceToHost),
                   "cudaMemcpy D2H");
  }

  void release() override {
    for (DeviceBuffer* b : {&q_, &k_, &v_, &out_, &lse_, &cu_q_, &cu_k_, &sinks_, &block_table_,
                            &seqused_k_, &paged_workspace_})
      *b = DeviceBuffer();
    call_ = AttentionCall();
  }

 private:
  int device_ = 0;
  cudaDeviceProp properties_{};
  cudaStream_t stream_ = nullptr;
  AttentionCall call_;
  jfa::Workspace workspace_;  // kept across calls: a timed call allocates nothing
  DeviceBuffer q_, k_, v_, out_, lse_, cu_q_, cu_k_, sinks_;
  // A paged run's tables and scratch (k_ and v_ then hold the caches).
  DeviceBuffer block_table_, seqused_k_, paged_workspace_;
  bool with_lse_ = false;
  DType out_dtype_ = DType::kFloat16;
};

}  // namespace

std::unique_ptr<Runner> make_device_runner() {
  if (!cuda_available()) {
    throw Error(Status::kBackendUnavailable,
                "backend cuda: the library reports no usable GPU (jfa_cuda_available() = 0)");
  }
  return std::make_unique<DeviceRunner>();
}

}  // namespace jfa::cli

#else  // !JFA_WITH_CUDA

namespace jfa::cli {

std::unique_ptr<Runner> make_device_runner() {
  throw Error(Status::kBackendUnavailable,
              "backend cuda: this jfa was built without CUDA (configure with JFA_ENABLE_CUDA=ON "
              "on a machine with the CUDA toolkit)");
}

}  // namespace jfa::cli

#endif  // JFA_WITH_CUDA
