// The kernels of torch.ops.jfa.* (registered in registration.cpp).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace jfa::torch_ops {

using torch::stable::Tensor;

// `deterministic` is for the backward (the autograd formula passes it on); the forward is
// deterministic anyway. `device_check`: the word of the checked mode (jfa.h), written by the call
// in stream order. window_left/window_right, softcap and sinks: the fields of
// jfa_attention_params of those names (sinks: None or float32 [heads_q]).
std::tuple<Tensor, Tensor> jagged_attention_fwd(
    Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
    std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k, bool causal,
    std::optional<double> softmax_scale, bool return_lse, bool deterministic,
    std::optional<Tensor> device_check, int64_t window_left, int64_t window_right, double softcap,
    std::optional<Tensor> sinks);

// Returns (dq, dk, dv, dsinks): dsinks float32 [heads_q] with sinks, else empty.
std::tuple<Tensor, Tensor, Tensor, Tensor> jagged_attention_bwd(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q,
    Tensor cu_seqlens_k, std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,
    bool causal, std::optional<double> softmax_scale, std::optional<Tensor> grad_lse,
    bool deterministic, std::optional<Tensor> device_check, int64_t window_left,
    int64_t window_right, double softcap, std::optional<Tensor> sinks);

// The forward over a paged KV cache (jfa_attention_forward_paged); no backward (serving). Returns
// (out, lse) as jagged_attention_fwd. With k_new, v_new and cu_seqlens_new (an append) the call
// writes the step's new rows into k_cache and v_cache in place before attending over them.
std::tuple<Tensor, Tensor> paged_attention(
    Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seqused_k,
    Tensor cu_seqlens_q, std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,
    bool causal, std::optional<double> softmax_scale, bool return_lse,
    std::optional<Tensor> device_check, int64_t window_left, int64_t window_right, double softcap,
    std::optional<Tensor> sinks, std::optional<Tensor> k_new, std::optional<Tensor> v_new,
    std::optional<Tensor> cu_seqlens_new);

}  // namespace jfa::torch_ops
