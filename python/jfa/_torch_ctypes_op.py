"""``jfa::jagged_attention_fwd`` and ``jfa::jagged_attention_bwd`` defined in Python over libjfa's
C ABI (ctypes): the fallback where the native op library (libjfa_torch.so) is not available. Same
schemas (those of src/torch/registration.cpp) and behaviour as the native ops, and registered the
same way (a definition and CPU and CUDA kernels; jfa._torch_ops adds the rest to either); slower
to call. Importing this module registers nothing: register() does.

They are defined with torch.library.Library, not torch.library.custom_op, because both write
device_check: a custom_op that writes an argument cannot take the autograd formula
(register_autograd refuses it), and its version-bump kernel fails where the dispatcher leaves the
word out (as it does for an argument equal to its default).
"""

import ctypes
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _checks
from ._library import (BACKEND_CPU, BACKEND_CUDA, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT32,
                       call, new_backward_params, new_params)
from ._torch_checks import (check_backward_inputs, check_device_check, check_inputs, check_sinks,
                            window_bound)

_DTYPES = {torch.float16: DTYPE_FLOAT16, torch.bfloat16: DTYPE_BFLOAT16,
           torch.float32: DTYPE_FLOAT32}


SCHEMAS = {
    "jagged_attention_fwd":
        "jagged_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor "
        "cu_seqlens_k, SymInt? max_seqlen_q, SymInt? max_seqlen_k, bool causal, float? "
        "softmax_scale, bool return_lse, bool deterministic=False, Tensor(a!)? device_check=None, "
        "int window_left=-1, int window_right=-1, float softcap=0., Tensor? sinks=None) -> "
        "(Tensor, Tensor)",
    "jagged_attention_bwd":
        "jagged_attention_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor "
        "lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt? max_seqlen_q, SymInt? "
        "max_seqlen_k, bool causal, float? softmax_scale, Tensor? grad_lse, bool deterministic, "
        "Tensor(a!)? device_check=None, int window_left=-1, int window_right=-1, float "
        "softcap=0., Tensor? sinks=None) -> (Tensor, Tensor, Tensor, Tensor)",
}

_LIBS = []  # the registrations live as long as their Library


def register() -> None:
    """Defines both ops and registers their CPU and CUDA kernels."""
    lib = torch.library.Library("jfa", "DEF")  # noqa: TOR901
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        for key in ("CPU", "CUDA"):
            lib.impl(name, globals()[name], key)
    _LIBS.append(lib)


def jagged_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: Optional[int],
                         max_seqlen_k: Optional[int], causal: bool,
                         softmax_scale: Optional[float], return_lse: bool,
                         deterministic: bool = False, device_check: Optional[Tensor] = None,
                         window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                         sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Jagged attention forward. Returns (out, lse); lse is empty unless return_lse.
    deterministic is for the backward (the autograd formula passes it on). device_check: the word
    of the checked mode (jfa.h), written in stream order. window_left, window_right, softcap and
    sinks: the fields of jfa_attention_params of those names."""
    layouts = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_device_check(device_check, q.device)
    total_q, heads_q, d_v = q.shape[0], q.shape[1], v.shape[2]
    out = torch.empty((total_q, heads_q, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32,
                      device=q.device)
    p = new_params()
    offsets = _fill_forward(p, q, k, v, cu_seqlens_q, cu_seqlens_k, layouts, max_seqlen_q,
                            max_seqlen_k, causal, softmax_scale, device_check, window_left,
                            window_right, softcap, sinks)
    p.out = out.data_ptr()
    p.lse = lse.data_ptr() if return_lse else None
    p.out_layout.token_stride, p.out_layout.head_stride = heads_q * d_v, d_v
    if q.device.type != "cuda":
        call("jfa_attention_forward", ctypes.byref(p))
        return out, lse
    with torch.cuda.device(q.device):
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
        # The workspace from torch's caching allocator: no device allocation on a warm path.
        size = ctypes.c_size_t(0)
        call("jfa_attention_workspace_size", ctypes.byref(p), ctypes.byref(size))
        workspace = torch.empty((size.value,), dtype=torch.uint8, device=q.device)
        p.workspace, p.workspace_bytes = workspace.data_ptr(), size.value
        call("jfa_attention_forward", ctypes.byref(p))
    return out, lse


def _fill_forward(p, q, k, v, cu_seqlens_q, cu_seqlens_k, layouts, max_seqlen_q, max_seqlen_k,
                  causal, softmax_scale, device_check, window_left, window_right, softcap, sinks):
    """Fills the forward's fields of jfa_attention_params p but out and lse; returns the dense
    offsets it points into (keep them alive for the call). The window and softcap are only
    converted to the C fields (libjfa checks their values)."""
    hint_q = _checks.seqlen_hint("max_seqlen_q", max_seqlen_q)
    hint_k = _checks.seqlen_hint("max_seqlen_k", max_seqlen_k)
    scale = _checks.scale_value(softmax_scale)
    p.window_left = window_bound("window_left", window_left)
    p.window_right = window_bound("window_right", window_right)
    # Beyond float32: an infinity (as the native op converts it), which libjfa rejects.
    big = math.isfinite(softcap) and abs(softcap) > _checks.FLOAT32_MAX
    p.softcap = math.copysign(math.inf, softcap) if big else softcap
    check_sinks(sinks, q.shape[1], q.device)
    p.sinks = None if sinks is None else sinks.data_ptr()
    # Offsets are read through a plain pointer: make them dense (a device copy, no host sync).
    cu_q = cu_seqlens_q.contiguous()
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k.contiguous()
    total_q, heads_q, d = q.shape
    p.q, p.k, p.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    p.batch = cu_q.shape[0] - 1
    p.total_q, p.total_k = total_q, k.shape[0]
    p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = heads_q, k.shape[1], d, v.shape[2]
    p.dtype = _DTYPES[q.dtype]
    for field, (ts, hs) in zip(("q_layout", "k_layout", "v_layout"), layouts):
        lay = getattr(p, field)
        lay.token_stride, lay.head_stride = ts, hs
    p.softmax_scale = scale
    p.causal = 1 if causal else 0
    p.max_seqlen_q, p.max_seqlen_k = hint_q, hint_k
    p.backend = BACKEND_CUDA if q.device.type == "cuda" else BACKEND_CPU
    p.device_check = (None if device_check is None else
                       ctypes.cast(device_check.data_ptr(), ctypes.POINTER(ctypes.c_int32)))
    return cu_q, cu_k


def jagged_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                         lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], causal: bool,
                         softmax_scale: Optional[float], grad_lse: Optional[Tensor],
                         deterministic: bool, device_check: Optional[Tensor] = None,
                         window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                         sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of the forward with respect to q, k, v and sinks (dsinks: float32 [heads_q], empty
    without sinks); on CUDA tensors on the current stream, with a workspace from torch's caching
    allocator as the forward's. device_check as the forward's: the call checks the offsets again
    into it."""
    layouts = check_backward_inputs(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                    grad_lse)
    check_device_check(device_check, q.device)
    b = new_backward_params()
    offsets = _fill_forward(b.forward, q, k, v, cu_seqlens_q, cu_seqlens_k, layouts[:3],
                            max_seqlen_q, max_seqlen_k, causal, softmax_scale, device_check,
                            window_left, window_right, softcap, sinks)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsinks = torch.empty((0 if sinks is None else q.shape[1],), dtype=torch.float32,
                         device=q.device)
    b.dsinks = None if sinks is None else dsinks.data_ptr()
    b.forward.out, b.forward.lse = out.data_ptr(), lse.data_ptr()
    b.forward.out_layout.token_stride, b.forward.out_layout.head_stride = layouts[3]
    b.dout = grad_out.data_ptr()
    b.dout_layout.token_stride, b.dout_layout.head_stride = layouts[4]
    b.dq, b.dk, b.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    b.dlse = None if grad_lse is None else grad_lse.data_ptr()
    b.deterministic = 1 if deterministic else 0
    if q.device.type != "cuda":
        call("jfa_attention_backward", ctypes.byref(b))
        return dq, dk, dv, dsinks
    with torch.cuda.device(q.device):
        b.forward.stream = torch.cuda.current_stream(q.device).cuda_stream
        size = ctypes.c_size_t(0)
        call("jfa_attention_backward_workspace_size", ctypes.byref(b), ctypes.byref(size))
        workspace = torch.empty((size.value,), dtype=torch.uint8, device=q.device)
        b.forward.workspace, b.forward.workspace_bytes = workspace.data_ptr(), size.value
        call("jfa_attention_backward", ctypes.byref(b))
    del offsets
    return dq, dk, dv, dsinks
