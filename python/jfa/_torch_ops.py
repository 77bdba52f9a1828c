"""The torch path: the custom ops ``torch.ops.jfa.*`` over libjfa.

``jfa::jagged_attention_fwd`` is implemented in C++ (libjfa_torch.so, PyTorch's stable ABI) and
registered with the dispatcher for CPU and CUDA tensors; where that library is missing, the same op
is defined in Python over ctypes (jfa._torch_ctypes_op). Either way this module registers its fake
(meta) kernel, so ``torch.compile(fullgraph=True)`` keeps it in the graph, and its autograd
formula. The CUDA kernel launches on the current CUDA stream, takes its workspace from torch's
caching allocator and never reads the offsets on the host, so a call can be captured in a CUDA
graph and replayed after new lengths are written into the same offsets buffer.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _checks, _torch_native
from ._torch_checks import check_inputs

KIND, KIND_DETAIL = _torch_native.load(torch)
if KIND == "ctypes":
    from . import _torch_ctypes_op  # noqa: F401  (defines jfa::jagged_attention_fwd)


@torch.library.register_fake("jfa::jagged_attention_fwd")
def _jagged_attention_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, return_lse):
    check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    total_q, heads_q, d = q.shape
    out = q.new_empty((total_q, heads_q, d))
    lse = q.new_empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


BACKWARD_MESSAGE = (
    "jfa.jagged_attention: the backward pass is not implemented yet (jfa provides the forward "
    "only); run it under torch.no_grad() or detach q, k and v")


@torch.library.custom_op("jfa::jagged_attention_bwd", mutates_args=())
def jagged_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                         cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool,
                         softmax_scale: Optional[float]) -> Tuple[Tensor, Tensor, Tensor]:
    """Placeholder of the backward: raises NotImplementedError when it runs.

    It is an op (rather than a Python error in the autograd formula) so that tracing a training
    graph with torch.compile succeeds, and the error comes only if the backward actually runs."""
    raise NotImplementedError(BACKWARD_MESSAGE)


@jagged_attention_bwd.register_fake
def _jagged_attention_bwd_fake(grad_out, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, causal, softmax_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, _return_lse = inputs
    out, _lse = output
    ctx.save_for_backward(q, k, v, out, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, scale)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = jagged_attention_bwd(grad_out, q, k, v, out, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


torch.library.register_autograd("jfa::jagged_attention_fwd", _backward,
                                setup_context=_setup_context)

_FWD = torch.ops.jfa.jagged_attention_fwd.default
_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _offsets_tensor(name: str, x, device) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)):
        return torch.tensor(x, dtype=torch.int32, device=device)
    raise TypeError(f"{name} must be an int32 torch.Tensor (or a list of ints), got {type(x).__name__}")


def _hint(name: str, value) -> int:
    return value if type(value) is int else _checks.seqlen_hint(name, value)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
              softmax_scale, return_lse):
    """The torch face of jfa.jagged_attention (traceable by torch.compile).

    When no input needs a gradient the op is called below the autograd layer, which skips the
    Python autograd kernel (the costliest part of a call's host time otherwise)."""
    cu_q = _offsets_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
    cu_k = cu_q if cu_seqlens_k is None else _offsets_tensor("cu_seqlens_k", cu_seqlens_k, q.device)
    scale = None if softmax_scale is None else _checks.scale_value(softmax_scale)
    args = (q, k, v, cu_q, cu_k, _hint("max_seqlen_q", max_seqlen_q),
            _hint("max_seqlen_k", max_seqlen_k), _checks.flag("causal", causal), scale,
            _checks.flag("return_lse", return_lse))
    try:
        if _is_compiling() or (_grad_enabled() and (q.requires_grad or k.requires_grad
                                                    or v.requires_grad)):
            out, lse = _FWD(*args)
        else:
            with _below_autograd():
                out, lse = _FWD(*args)
    except RuntimeError as e:
        translated = _torch_native.translate(e, "jfa_attention_forward")
        if translated is e:
            raise
        raise translated from None
    return (out, lse) if return_lse else out
