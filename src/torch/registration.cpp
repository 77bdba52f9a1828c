// torch.ops.jfa.*: the op library over libjfa's C ABI, built against PyTorch's stable ABI (the C
// shim and the header-only stable API), so one build loads into every torch release from the
// targeted one on. The fake (meta) kernels and the autograd formula are registered from Python
// (jfa._torch_ops); the kernels are in forward_op.cpp and backward_op.cpp. device_check, the
// word of the checked mode that both calls write, is marked (a!): torch must know of the write to
// keep it through functionalization (torch.compile) and to order it with other uses of the word.
// The max_seqlen hints are SymInt, so torch.compile(dynamic=True) keeps them symbolic instead of
// compiling a graph per value; a kernel gets them as plain ints (None: unknown). The local
// attention, softcap and sinks arguments come last, with defaults, so earlier positional calls
// keep working; the backward's fourth result is dsinks (empty without sinks).
// paged_attention, the forward over a paged KV cache (paged_op.cpp; serving, no backward), takes
// the forward's arguments in the same order, the packed keys replaced by the caches, block table
// and seqused_k, and the append (k_new, v_new, cu_seqlens_new) last: it writes the new rows into
// k_cache and v_cache, which are therefore marked (a!) and (b!) whether a call appends or not (a
// schema cannot make a write depend on an argument).
#include <torch/csrc/stable/library.h>

#include "torch/ops.hpp"

STABLE_TORCH_LIBRARY(jfa, m) {
  m.def(
      "jagged_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor "
      "cu_seqlens_k, SymInt? max_seqlen_q, SymInt? max_seqlen_k, bool causal, float? "
      "softmax_scale, bool return_lse, bool deterministic=False, Tensor(a!)? device_check=None, "
      "int window_left=-1, int window_right=-1, float softcap=0., Tensor? sinks=None) -> (Tensor, "
      "Tensor)");
  m.def(
      "jagged_attention_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor "
      "lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt? max_seqlen_q, SymInt? "
      "max_seqlen_k, bool causal, float? softmax_scale, Tensor? grad_lse, bool deterministic, "
      "Tensor(a!)? device_check=None, int window_left=-1, int window_right=-1, float "
      "softcap=0., Tensor? sinks=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "paged_attention(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor block_table, "
      "Tensor seqused_k, Tensor cu_seqlens_q, SymInt? max_seqlen_q, SymInt? max_seqlen_k, bool "
      "causal, float? softmax_scale, bool return_lse, Tensor(c!)? device_check=None, int "
      "window_left=-1, int window_right=-1, float softcap=0., Tensor? sinks=None, Tensor? "
      "k_new=None, Tensor? v_new=None, Tensor? cu_seqlens_new=None) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(jfa, CPU, m) {
  m.impl("jagged_attention_fwd", TORCH_BOX(&jfa::torch_ops::jagged_attention_fwd));
  m.impl("jagged_attention_bwd", TORCH_BOX(&jfa::torch_ops::jagged_attention_bwd));
  m.impl("paged_attention", TORCH_BOX(&jfa::torch_ops::paged_attention));
}

STABLE_TORCH_LIBRARY_IMPL(jfa, CUDA, m) {
  m.impl("jagged_attention_fwd", TORCH_BOX(&jfa::torch_ops::jagged_attention_fwd));
  m.impl("jagged_attention_bwd", TORCH_BOX(&jfa::torch_ops::jagged_attention_bwd));
  m.impl("paged_attention", TORCH_BOX(&jfa::torch_ops::paged_attention));
}
