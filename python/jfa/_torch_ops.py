"""The torch path: the custom ops ``torch.ops.jfa.*`` over libjfa.

``jfa::jagged_attention_fwd`` is an opaque custom op with a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` keeps it in the graph. The CUDA implementation launches on the
current CUDA stream and never reads the offsets on the host, so it can be captured in a CUDA graph
and replayed after new lengths are written into the same offsets buffer.
"""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _checks
from ._library import (BACKEND_CPU, BACKEND_CUDA, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT32,
                       call, new_params)

_DTYPES = {torch.float16: DTYPE_FLOAT16, torch.bfloat16: DTYPE_BFLOAT16,
           torch.float32: DTYPE_FLOAT32}
_FIX = "call .contiguous() on it"


def check_inputs(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor):
    """Checks that need only metadata (they also run on fake tensors while tracing)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _checks.qkv_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if q.dtype not in _DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"q, k and v must have the same dtype, got q {q.dtype} and {name} {t.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"q, k and v must be on the same device, got q on {q.device}, k on {k.device}, "
            f"v on {v.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q, k and v must be CPU or CUDA tensors, got device {q.device}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor (batch + 1 offsets), got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D (batch + 1 offsets), got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {t.device}")
    _checks.offsets_count("cu_seqlens_q", cu_seqlens_q.shape[0], "cu_seqlens_k",
                          cu_seqlens_k.shape[0])
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(
                f"{name}: the last dimension (head_dim) must be contiguous (stride 1), got "
                f"strides {tuple(t.stride())}; {_FIX}")


def _layout(name: str, t: Tensor):
    return _checks.layout(name, tuple(t.shape), tuple(t.stride()), _FIX)


def _empty_outputs(q: Tensor, return_lse: bool):
    total_q, heads_q, d = q.shape
    out = torch.empty((total_q, heads_q, d), dtype=q.dtype, device=q.device)
    lse_shape = (heads_q, total_q) if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.custom_op("jfa::jagged_attention_fwd", mutates_args=())
def jagged_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         causal: bool, softmax_scale: Optional[float],
                         return_lse: bool) -> Tuple[Tensor, Tensor]:
    """Jagged attention forward. Returns (out, lse); lse is empty unless return_lse."""
    check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    layouts = [_layout(name, t) for name, t in (("q", q), ("k", k), ("v", v))]
    hint_q = _checks.seqlen_hint("max_seqlen_q", max_seqlen_q)
    hint_k = _checks.seqlen_hint("max_seqlen_k", max_seqlen_k)
    scale = _checks.scale_value(softmax_scale)
    out, lse = _empty_outputs(q, return_lse)
    # Offsets are read through a plain pointer: make them dense (a device copy, no host sync).
    cu_q = cu_seqlens_q.contiguous()
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k.contiguous()

    total_q, heads_q, d = q.shape
    p = new_params()
    p.q, p.k, p.v, p.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    p.lse = lse.data_ptr() if return_lse else None
    p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    p.batch = cu_q.shape[0] - 1
    p.total_q, p.total_k = total_q, k.shape[0]
    p.heads_q, p.heads_kv, p.head_dim = heads_q, k.shape[1], d
    p.dtype = _DTYPES[q.dtype]
    for field, (ts, hs) in zip(("q_layout", "k_layout", "v_layout"), layouts):
        lay = getattr(p, field)
        lay.token_stride, lay.head_stride = ts, hs
    p.out_layout.token_stride, p.out_layout.head_stride = heads_q * d, d
    p.softmax_scale = scale
    p.causal = 1 if causal else 0
    p.max_seqlen_q, p.max_seqlen_k = hint_q, hint_k
    if q.device.type == "cuda":
        p.backend = BACKEND_CUDA
        with torch.cuda.device(q.device):
            p.stream = torch.cuda.current_stream(q.device).cuda_stream
            call("jfa_attention_forward", ctypes.byref(p))
    else:
        p.backend = BACKEND_CPU
        call("jfa_attention_forward", ctypes.byref(p))
    return out, lse


@jagged_attention_fwd.register_fake
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


jagged_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _offsets_tensor(name: str, x, device) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)):
        return torch.tensor(x, dtype=torch.int32, device=device)
    raise TypeError(f"{name} must be an int32 torch.Tensor (or a list of ints), got {type(x).__name__}")


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
              softmax_scale, return_lse):
    """The torch face of jfa.jagged_attention (traceable by torch.compile)."""
    cu_q = _offsets_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
    cu_k = cu_q if cu_seqlens_k is None else _offsets_tensor("cu_seqlens_k", cu_seqlens_k, q.device)
    out, lse = torch.ops.jfa.jagged_attention_fwd(
        q, k, v, cu_q, cu_k,
        0 if max_seqlen_q is None else max_seqlen_q,
        0 if max_seqlen_k is None else max_seqlen_k,
        bool(causal),
        None if softmax_scale is None else float(softmax_scale),
        bool(return_lse))
    return (out, lse) if return_lse else out
