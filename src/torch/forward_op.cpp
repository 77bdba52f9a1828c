// torch.ops.jfa.jagged_attention_fwd: the forward over libjfa's C ABI, for CPU and CUDA tensors.
#include "torch/op_support.hpp"
#include "torch/ops.hpp"

namespace jfa::torch_ops {

std::tuple<Tensor, Tensor> jagged_attention_fwd(
    Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
    std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k, bool causal,
    std::optional<double> softmax_scale, bool return_lse, bool deterministic,
    std::optional<Tensor> device_check, int64_t window_left, int64_t window_right, double softcap,
    std::optional<Tensor> sinks) {
  ForwardCall call =
      prepare_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                      softmax_scale, window_left, window_right, softcap, sinks);
  jfa_attention_params& p = call.params;
  (void)deterministic;  // for the backward: the autograd formula reads it from the arguments
  p.device_check = device_check_word(device_check, call.device);
  const int64_t total_q = q.size(0), heads_q = q.size(1), d_v = v.size(2);  // out: v's head_dim
  Tensor out = empty({total_q, heads_q, d_v}, call.dtype, call.device);
  Tensor lse = return_lse ? empty({heads_q, total_q}, aoti_torch_dtype_float32(), call.device)
                          : empty({0}, aoti_torch_dtype_float32(), call.device);
  p.out = out.data_ptr();
  p.lse = return_lse ? static_cast<float*>(lse.data_ptr()) : nullptr;
  p.out_layout = {heads_q * d_v, d_v};
  if (!call.on_cuda) {
    check_status("jfa_attention_forward", jfa_attention_forward(&p));
    return {out, lse};
  }
  const CudaDeviceScope scope(call.device.index);
  p.stream = current_cuda_stream(call.device.index);
  size_t workspace_bytes = 0;
  check_status("jfa_attention_workspace_size", jfa_attention_workspace_size(&p, &workspace_bytes));
  // From torch's caching allocator: no device allocation on a warm path, and graph-safe.
  const Tensor workspace =
      empty({static_cast<int64_t>(workspace_bytes)}, aoti_torch_dtype_uint8(), call.device);
  p.workspace = workspace.data_ptr();
  p.workspace_bytes = workspace_bytes;
  check_status("jfa_attention_forward", jfa_attention_forward(&p));
  return {out, lse};
}

}  // namespace jfa::torch_ops
