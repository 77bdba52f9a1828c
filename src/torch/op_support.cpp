#include "torch/op_support.hpp"

#include <dlfcn.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace jfa::torch_ops {
namespace {

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* names[] = {"q", "k", "v"};
  const Tensor* ts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (ts[i]->dim() != 3)
      raise("ValueError", std::string(names[i]) +
                              " must have 3 dimensions [total, heads, head_dim], got shape " +
                              shape_string(*ts[i]));
  // v may have a head_dim of its own (head_dim_v): the shape of k but for its last dimension.
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1))
    raise("ValueError",
          "v must have the shape of k but for its last dimension [total_k, heads_kv, head_dim_v], "
          "got k " +
              shape_string(k) + " and v " + shape_string(v));
  if (k.size(2) != q.size(2))
    raise("ValueError", "q and k must have the same head_dim (last dimension), got q " +
                            std::to_string(q.size(2)) + " and k " + std::to_string(k.size(2)));
  if (q.size(1) < 1 || k.size(1) < 1)
    raise("ValueError", "heads must be >= 1, got heads_q=" + std::to_string(q.size(1)) +
                            " (q) and heads_kv=" + std::to_string(k.size(1)) + " (k, v)");
  if (q.size(1) % k.size(1) != 0)
    raise("ValueError",
          "the heads of q must be a multiple of the heads of k and v (GQA/MQA), got heads_q=" +
              std::to_string(q.size(1)) + " and heads_kv=" + std::to_string(k.size(1)));
  if (q.size(2) < 1) raise("ValueError", "head_dim must be >= 1, got " + std::to_string(q.size(2)));
  if (v.size(2) < 1)
    raise("ValueError",
          "the head_dim of v (head_dim_v) must be >= 1, got " + std::to_string(v.size(2)));
}

// None (the hint left out) means unknown, as 0 does.
int32_t seqlen_hint(const char* name, std::optional<int64_t> hint) {
  const int64_t value = hint.value_or(0);
  if (value < 0 || value > std::numeric_limits<int32_t>::max())
    raise("ValueError", std::string(name) +
                            " must be in [0, 2^31 - 1] (0 or None = unknown), got " +
                            std::to_string(value));
  return static_cast<int32_t>(value);
}

// A window bound as the C field takes it: any int32 (libjfa checks the value), so no silent
// truncation of an int64.
int32_t window_bound(const char* name, int64_t value) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    raise("ValueError", std::string(name) + " must fit in int32 (>= 0, or -1 for unbounded), got " +
                            std::to_string(value));
  return static_cast<int32_t>(value);
}

// A double as float32 with out-of-range values saturated to an infinity (a defined conversion),
// which libjfa then rejects with the value in its message.
float saturated_float(double value) {
  if (std::fabs(value) > std::numeric_limits<float>::max() && std::isfinite(value))
    return static_cast<float>(std::copysign(HUGE_VAL, value));
  return static_cast<float>(value);
}

// None, or float32 [heads_q], contiguous, on q's device.
const float* sinks_pointer(const std::optional<Tensor>& sinks, int64_t heads_q, DeviceId device) {
  if (!sinks.has_value()) return nullptr;
  const Tensor& t = *sinks;
  if (dtype_of(t) != aoti_torch_dtype_float32())
    raise("TypeError", "sinks must be float32, got " + dtype_string(dtype_of(t)));
  if (t.dim() != 1 || t.size(0) != heads_q)
    raise("ValueError", "sinks must have shape (" + std::to_string(heads_q) + ",) [heads_q], got " +
                            shape_string(t));
  if (heads_q > 1 && t.stride(0) != 1)
    raise("ValueError", "sinks must be contiguous; call .contiguous() on it");
  check_on_device("sinks", t, device);
  return static_cast<const float*>(t.data_ptr());
}

// A double as Python's repr writes it (the shortest string that reads back), so the messages match
// those of jfa._checks.
std::string float_string(double value) {
  if (std::isnan(value)) return "nan";
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

}  // namespace

jfa_dtype jfa_dtype_of(int32_t dtype) {
  if (dtype == aoti_torch_dtype_float16()) return JFA_DTYPE_FLOAT16;
  if (dtype == aoti_torch_dtype_bfloat16()) return JFA_DTYPE_BFLOAT16;
  if (dtype == aoti_torch_dtype_float32()) return JFA_DTYPE_FLOAT32;
  raise("TypeError", "q must be float16, bfloat16 or float32, got " + dtype_string(dtype));
}

Tensor dense_offsets(const char* name, const Tensor& t, DeviceId device) {
  if (dtype_of(t) != aoti_torch_dtype_int32())
    raise("TypeError", std::string(name) + " must be an int32 tensor (batch + 1 offsets), got " +
                           dtype_string(dtype_of(t)));
  if (t.dim() != 1)
    raise("ValueError",
          std::string(name) + " must be 1-D (batch + 1 offsets), got shape " + shape_string(t));
  check_on_device(name, t, device);
  if (t.size(0) <= 1 || t.stride(0) == 1) return t;
  AtenTensorHandle copy = nullptr;
  check_shim(aoti_torch_clone(t.get(), &copy), "clone of the offsets");
  return Tensor(copy);
}

[[noreturn]] void raise(const char* kind, const std::string& message) {
  throw std::runtime_error(std::string(kind) + ": " + message);
}

void check_shim(AOTITorchError e, const char* what) {
  if (e != AOTI_TORCH_SUCCESS)
    throw std::runtime_error(std::string("torch shim call failed: ") + what);
}

std::string shape_string(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

DeviceId device_of(const Tensor& t) {
  DeviceId d{};
  check_shim(aoti_torch_get_device_type(t.get(), &d.type), "device type");
  check_shim(aoti_torch_get_device_index(t.get(), &d.index), "device index");
  return d;
}

std::string device_string(DeviceId d) {
  if (d.type == aoti_torch_device_type_cpu()) return "cpu";
  const std::string type =
      d.type == aoti_torch_device_type_cuda() ? "cuda" : "device type " + std::to_string(d.type);
  return d.index >= 0 ? type + ":" + std::to_string(d.index) : type;
}

int32_t dtype_of(const Tensor& t) {
  int32_t dtype = 0;
  check_shim(aoti_torch_get_dtype(t.get(), &dtype), "dtype");
  return dtype;
}

std::string dtype_string(int32_t dtype) {
  if (dtype == aoti_torch_dtype_float16()) return "torch.float16";
  if (dtype == aoti_torch_dtype_bfloat16()) return "torch.bfloat16";
  if (dtype == aoti_torch_dtype_float32()) return "torch.float32";
  if (dtype == aoti_torch_dtype_float64()) return "torch.float64";
  if (dtype == aoti_torch_dtype_int32()) return "torch.int32";
  if (dtype == aoti_torch_dtype_int64()) return "torch.int64";
  if (dtype == aoti_torch_dtype_int16()) return "torch.int16";
  if (dtype == aoti_torch_dtype_int8()) return "torch.int8";
  if (dtype == aoti_torch_dtype_uint8()) return "torch.uint8";
  if (dtype == aoti_torch_dtype_bool()) return "torch.bool";
  return "dtype code " + std::to_string(dtype);
}

void check_on_device(const char* name, const Tensor& t, DeviceId device) {
  const DeviceId d = device_of(t);
  if (!(d == device))
    raise("ValueError", std::string(name) + " must be on the device of q (" +
                            device_string(device) + "), got " + device_string(d));
}

jfa_tensor_layout layout_of(const char* name, const Tensor& t) {
  const int64_t total = t.size(0), heads = t.size(1), d = t.size(2);
  if (total == 0) return {heads * d, d};
  if (d > 1 && t.stride(2) != 1)
    raise("ValueError",
          std::string(name) +
              ": the last dimension (head_dim) must be contiguous (stride 1 element), "
              "got stride " +
              std::to_string(t.stride(2)) + "; call .contiguous() on it");
  int64_t st = t.stride(0), sh = t.stride(1);
  if (heads <= 1) sh = d;
  if (total <= 1) st = heads * sh;
  if (st <= 0 || sh <= 0)
    raise("ValueError", std::string(name) +
                            ": token and head strides must be positive, got "
                            "token_stride=" +
                            std::to_string(st) + " head_stride=" + std::to_string(sh) +
                            " (broadcast or reversed views are not supported); call .contiguous() "
                            "on it");
  return {st, sh};
}

Tensor empty(std::initializer_list<int64_t> sizes, int32_t dtype, DeviceId device) {
  int64_t shape[3] = {}, strides[3] = {};
  int64_t n = 0;
  for (int64_t s : sizes) shape[n++] = s;
  int64_t stride = 1;
  for (int64_t i = n - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch_empty_strided(n, shape, strides, dtype, device.type, device.index, &h),
             "empty_strided");
  return Tensor(h);
}

int32_t* device_check_word(const std::optional<Tensor>& device_check, DeviceId device) {
  if (!device_check.has_value()) return nullptr;
  const Tensor& t = *device_check;
  if (dtype_of(t) != aoti_torch_dtype_int32())
    raise("TypeError",
          "device_check must be an int32 tensor (one element), got " + dtype_string(dtype_of(t)));
  if (t.numel() != 1)
    raise("ValueError", "device_check must have exactly one element, got shape " + shape_string(t));
  if (!t.is_contiguous())
    raise("ValueError", "device_check must be contiguous; call .contiguous() on it");
  check_on_device("device_check", t, device);
  return static_cast<int32_t*>(t.data_ptr());
}

using CurrentCudaStreamFn = AOTITorchError (*)(int32_t, void**);

void* current_cuda_stream(int32_t device_index) {
  static const CurrentCudaStreamFn fn = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    void* sym = lib != nullptr ? dlsym(lib, "aoti_torch_get_current_cuda_stream") : nullptr;
    return reinterpret_cast<CurrentCudaStreamFn>(sym);
  }();
  if (fn == nullptr)
    throw std::runtime_error(
        "torch's CUDA library (libtorch_cuda.so) is not loaded in this process");
  void* stream = nullptr;
  check_shim(fn(device_index, &stream), "current CUDA stream");
  return stream;
}

void check_status(const char* function, jfa_status status) {
  if (status != JFA_SUCCESS)
    throw std::runtime_error("jfa status " + std::to_string(static_cast<int>(status)) + " in " +
                             function + ": " + jfa_last_error_message());
}

CudaDeviceScope::CudaDeviceScope(int32_t index) {
  int32_t current = -1;
  check_shim(aoti_torch_get_current_device_index(&current), "current device");
  if (current != index) check_shim(aoti_torch_create_device_guard(index, &guard_), "device guard");
}

CudaDeviceScope::~CudaDeviceScope() {
  if (guard_ != nullptr) aoti_torch_delete_device_guard(guard_);
}

void set_scores(jfa_attention_params& p, std::optional<int64_t> max_seqlen_q,
                std::optional<int64_t> max_seqlen_k, bool causal,
                std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                double softcap, const std::optional<Tensor>& sinks, int64_t heads_q,
                DeviceId device) {
  p.max_seqlen_q = seqlen_hint("max_seqlen_q", max_seqlen_q);
  p.max_seqlen_k = seqlen_hint("max_seqlen_k", max_seqlen_k);
  if (softmax_scale.has_value()) {
    const double s = *softmax_scale;
    if (!std::isfinite(s) || std::fabs(s) > std::numeric_limits<float>::max())
      raise("ValueError",
            "softmax_scale must be finite in float32 (or None for "
            "1/sqrt(head_dim)), got " +
                float_string(s));
    p.softmax_scale = static_cast<float>(s);
  }
  p.window_left = window_bound("window_left", window_left);
  p.window_right = window_bound("window_right", window_right);
  p.softcap = saturated_float(softcap);
  p.sinks = sinks_pointer(sinks, heads_q, device);
  p.causal = causal ? 1 : 0;
}

ForwardCall prepare_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                            std::optional<int64_t> max_seqlen_q,
                            std::optional<int64_t> max_seqlen_k, bool causal,
                            std::optional<double> softmax_scale, int64_t window_left,
                            int64_t window_right, double softcap,
                            const std::optional<Tensor>& sinks) {
  check_qkv(q, k, v);
  const int32_t dtype = dtype_of(q);
  const jfa_dtype jdtype = jfa_dtype_of(dtype);
  const char* kv_names[] = {"k", "v"};
  const Tensor* kv[] = {&k, &v};
  for (int i = 0; i < 2; ++i)
    if (dtype_of(*kv[i]) != dtype)
      raise("TypeError", std::string("q, k and v must have the same dtype, got q ") +
                             dtype_string(dtype) + " and " + kv_names[i] + " " +
                             dtype_string(dtype_of(*kv[i])));
  const DeviceId device = device_of(q);
  const DeviceId dk = device_of(k), dv = device_of(v);
  if (!(dk == device) || !(dv == device))
    raise("ValueError", "q, k and v must be on the same device, got q on " + device_string(device) +
                            ", k on " + device_string(dk) + ", v on " + device_string(dv));
  const bool on_cuda = device.type == aoti_torch_device_type_cuda();
  if (!on_cuda && device.type != aoti_torch_device_type_cpu())
    raise("ValueError",
          "q, k and v must be CPU or CUDA tensors, got device " + device_string(device));
  const Tensor cu_q = dense_offsets("cu_seqlens_q", cu_seqlens_q, device);
  const Tensor cu_k = dense_offsets("cu_seqlens_k", cu_seqlens_k, device);
  if (cu_q.size(0) < 1)
    raise("ValueError", "cu_seqlens_q must hold batch + 1 >= 1 offsets, got " +
                            std::to_string(cu_q.size(0)) + " entries");
  if (cu_k.size(0) != cu_q.size(0))
    raise("ValueError",
          "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got " +
              std::to_string(cu_q.size(0)) + " and " + std::to_string(cu_k.size(0)));
  jfa_attention_params p;
  jfa_attention_params_init(&p);
  p.q_layout = layout_of("q", q);
  p.k_layout = layout_of("k", k);
  p.v_layout = layout_of("v", v);
  set_scores(p, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left, window_right,
             softcap, sinks, q.size(1), device);

  const int64_t heads_q = q.size(1), d = q.size(2);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data_ptr());
  p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data_ptr());
  p.batch = cu_q.size(0) - 1;
  p.total_q = q.size(0);
  p.total_k = k.size(0);
  p.heads_q = static_cast<int32_t>(heads_q);
  p.heads_kv = static_cast<int32_t>(k.size(1));
  p.head_dim = static_cast<int32_t>(d);
  p.head_dim_v = static_cast<int32_t>(v.size(2));
  p.dtype = jdtype;
  p.backend = on_cuda ? JFA_BACKEND_CUDA : JFA_BACKEND_CPU;
  return ForwardCall{p, cu_q, cu_k, device, dtype, on_cuda};
}

}  // namespace jfa::torch_ops
