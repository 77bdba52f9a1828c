// What the torch ops share: argument checks whose errors carry a tag that the Python layer turns
// into the matching exception ("TypeError: ", "ValueError: ", or "jfa status N in FUNCTION: " for a
// status of the library), as C++ cannot raise a TypeError or a JfaError through the stable ABI;
// tensor metadata through the stable ABI's C shim, the forward's parameters from the op's
// arguments, and torch's current CUDA stream.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "jfa/jfa.h"

namespace jfa::torch_ops {

using torch::stable::Tensor;

[[noreturn]] void raise(const char* kind, const std::string& message);
void check_shim(AOTITorchError e, const char* what);
// `function`: the libjfa entry point, named in the message as the ctypes op's JfaError names it.
void check_status(const char* function, jfa_status status);

std::string shape_string(const Tensor& t);

struct DeviceId {
  int32_t type;
  int32_t index;
  bool operator==(const DeviceId&) const = default;
};
DeviceId device_of(const Tensor& t);
std::string device_string(DeviceId d);
int32_t dtype_of(const Tensor& t);
std::string dtype_string(int32_t dtype);
// `t` (named `name`) on `device`, the device of q.
void check_on_device(const char* name, const Tensor& t, DeviceId device);

// [total, heads, head_dim] strides in elements as the C ABI takes them (the rules of
// jfa._checks.layout): the last dimension contiguous, strides of size-1 and empty dimensions
// replaced by packed ones, positive strides.
jfa_tensor_layout layout_of(const char* name, const Tensor& t);

// A tensor of `sizes` (packed, row-major) on `device`.
Tensor empty(std::initializer_list<int64_t> sizes, int32_t dtype, DeviceId device);

// q's dtype as the C ABI names it (TypeError for the dtypes it does not take).
jfa_dtype jfa_dtype_of(int32_t dtype);

// Offsets as the kernels read them: int32, 1-D, on `device`, dense (a device copy when strided; no
// host synchronization).
Tensor dense_offsets(const char* name, const Tensor& t, DeviceId device);

// The fields of p that the packed and the paged forward take alike: the max_seqlen hints, the
// scale, the causal mask, the window, softcap and sinks (None or float32 [heads_q] on `device`).
void set_scores(jfa_attention_params& p, std::optional<int64_t> max_seqlen_q,
                std::optional<int64_t> max_seqlen_k, bool causal,
                std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                double softcap, const std::optional<Tensor>& sinks, int64_t heads_q,
                DeviceId device);

// The forward's parameters from the op's arguments, checked (every pointer but out and lse set),
// with the dense offsets they point into; `on_cuda` says which backend serves the tensors. The
// window and softcap are only converted to the C fields here (libjfa checks their values).
struct ForwardCall {
  jfa_attention_params params;
  Tensor cu_q, cu_k;  // keep the (possibly copied) offsets alive for the call
  DeviceId device;
  int32_t dtype;
  bool on_cuda;
};
ForwardCall prepare_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                            std::optional<int64_t> max_seqlen_q,
                            std::optional<int64_t> max_seqlen_k, bool causal,
                            std::optional<double> softmax_scale, int64_t window_left,
                            int64_t window_right, double softcap,
                            const std::optional<Tensor>& sinks);

// The word of the checked mode (jfa_attention_params::device_check): NULL
// without one, else the data of a 1-element int32 tensor on `device`, checked with the messages of
// jfa._torch_checks.check_device_check.
int32_t* device_check_word(const std::optional<Tensor>& device_check, DeviceId device);

// torch's current CUDA stream on the device, through the CUDA part of the shim found in the
// running process (so the ops have no link-time dependency on torch's CUDA libraries and load into
// CPU-only builds).
void* current_cuda_stream(int32_t device_index);

// Makes `index` the current CUDA device for the scope when it is not already.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int32_t index);
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  DeviceGuardHandle guard_ = nullptr;
};

}  // namespace jfa::torch_ops
