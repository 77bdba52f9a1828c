// torch.ops.jfa.jagged_attention_bwd: the gradients of the forward over libjfa's C ABI, for CPU and
// CUDA tensors.
#include <cstdint>
#include <string>

#include "torch/op_support.hpp"
#include "torch/ops.hpp"

namespace jfa::torch_ops {
namespace {

// `t` must have the shape of out (q's tokens and heads, v's head_dim) and q's dtype and device.
void check_like_out(const char* name, const Tensor& t, const Tensor& q, const Tensor& v) {
  if (t.dim() != 3 || t.size(0) != q.size(0) || t.size(1) != q.size(1) || t.size(2) != v.size(2))
    raise("ValueError", std::string(name) +
                            " must have the shape of out [total_q, heads_q, head_dim_v] (" +
                            std::to_string(q.size(0)) + ", " + std::to_string(q.size(1)) + ", " +
                            std::to_string(v.size(2)) + "), got " + shape_string(t));
  if (dtype_of(t) != dtype_of(q))
    raise("TypeError", std::string(name) + " must have the dtype of q (" +
                           dtype_string(dtype_of(q)) + "), got " + dtype_string(dtype_of(t)));
  check_on_device(name, t, device_of(q));
}

// A float32 [heads_q, total_q] contiguous tensor on `device` (the LSE or its gradient).
void check_lse_like(const char* name, const Tensor& t, int64_t heads_q, int64_t total_q,
                    DeviceId device) {
  if (dtype_of(t) != aoti_torch_dtype_float32())
    raise("TypeError", std::string(name) + " must be float32, got " + dtype_string(dtype_of(t)));
  if (t.dim() != 2 || t.size(0) != heads_q || t.size(1) != total_q)
    raise("ValueError", std::string(name) + " must have shape (" + std::to_string(heads_q) + ", " +
                            std::to_string(total_q) +
                            ") [heads_q, total_q] (the forward's with "
                            "return_lse=True), got " +
                            shape_string(t));
  if (total_q > 0 && ((heads_q > 1 && t.stride(0) != total_q) || (total_q > 1 && t.stride(1) != 1)))
    raise("ValueError", std::string(name) + " must be contiguous; call .contiguous() on it");
  check_on_device(name, t, device);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> jagged_attention_bwd(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q,
    Tensor cu_seqlens_k, std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,
    bool causal, std::optional<double> softmax_scale, std::optional<Tensor> grad_lse,
    bool deterministic, std::optional<Tensor> device_check, int64_t window_left,
    int64_t window_right, double softcap, std::optional<Tensor> sinks) {
  ForwardCall call =
      prepare_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                      softmax_scale, window_left, window_right, softcap, sinks);
  check_like_out("out", out, q, v);
  check_like_out("grad_out", grad_out, q, v);
  const int64_t total_q = q.size(0), heads_q = q.size(1), d = q.size(2);
  check_lse_like("lse", lse, heads_q, total_q, call.device);
  if (grad_lse.has_value()) check_lse_like("grad_lse", *grad_lse, heads_q, total_q, call.device);

  jfa_attention_backward_params p;
  jfa_attention_backward_params_init(&p);
  p.forward = call.params;
  p.forward.out = out.data_ptr();
  p.forward.out_layout = layout_of("out", out);
  p.forward.lse = static_cast<float*>(lse.data_ptr());
  p.forward.device_check = device_check_word(device_check, call.device);
  p.dout = grad_out.data_ptr();
  p.dout_layout = layout_of("grad_out", grad_out);
  p.dlse = grad_lse.has_value() ? static_cast<const float*>(grad_lse->data_ptr()) : nullptr;
  p.deterministic = deterministic ? 1 : 0;
  Tensor dq = empty({total_q, heads_q, d}, call.dtype, call.device);
  Tensor dk = empty({k.size(0), k.size(1), d}, call.dtype, call.device);
  Tensor dv = empty({v.size(0), v.size(1), v.size(2)}, call.dtype, call.device);
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  Tensor dsinks = empty({sinks.has_value() ? heads_q : 0}, aoti_torch_dtype_float32(), call.device);
  p.dsinks = sinks.has_value() ? static_cast<float*>(dsinks.data_ptr()) : nullptr;
  if (!call.on_cuda) {
    check_status("jfa_attention_backward", jfa_attention_backward(&p));
    return {dq, dk, dv, dsinks};
  }
  const CudaDeviceScope scope(call.device.index);
  p.forward.stream = current_cuda_stream(call.device.index);
  size_t workspace_bytes = 0;
  check_status("jfa_attention_backward_workspace_size",
               jfa_attention_backward_workspace_size(&p, &workspace_bytes));
  // From torch's caching allocator, as the forward's: no device allocation on a warm path, and
  // graph-safe.
  const Tensor workspace =
      empty({static_cast<int64_t>(workspace_bytes)}, aoti_torch_dtype_uint8(), call.device);
  p.forward.workspace = workspace.data_ptr();
  p.forward.workspace_bytes = workspace_bytes;
  check_status("jfa_attention_backward", jfa_attention_backward(&p));
  return {dq, dk, dv, dsinks};
}

}  // namespace jfa::torch_ops
