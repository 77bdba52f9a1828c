"""``jfa::jagged_attention_fwd``, ``jfa::jagged_attention_bwd`` and ``jfa::paged_attention``
defined in Python over libjfa's C ABI (ctypes): the fallback where the native op library
(libjfa_torch.so) is not available. Same schemas (those of src/torch/registration.cpp) and
behaviour as the native ops, and registered the same way (a definition and CPU and CUDA kernels;
jfa._torch_ops adds the rest to either); slower to call. Importing this module registers nothing:
register() does.

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
                       call, new_backward_params, new_paged_kv, new_params)
from ._torch_checks import (check_backward_inputs, check_device_check, check_inputs,
                            check_paged_inputs, check_sinks, window_bound)

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

# The forward over a paged KV cache (serving: no backward). The caches are written by an append
# (k_new, v_new, cu_seqlens_new), so the schema marks them (a!) and (b!) for every call.
PAGED_SCHEMAS = {
    "paged_attention":
        "paged_attention(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor block_table, "
        "Tensor seqused_k, Tensor cu_seqlens_q, SymInt? max_seqlen_q, SymInt? max_seqlen_k, bool "
        "causal, float? softmax_scale, bool return_lse, Tensor(c!)? device_check=None, int "
        "window_left=-1, int window_right=-1, float softcap=0., Tensor? sinks=None, Tensor? "
        "k_new=None, Tensor? v_new=None, Tensor? cu_seqlens_new=None) -> (Tensor, Tensor)",
}

_LIBS = []  # the registrations live as long as their Library


def register() -> None:
    """Defines the ops and registers their CPU and CUDA kernels."""
    lib = torch.library.Library("jfa", "DEF")  # noqa: TOR901
    for name, schema in {**SCHEMAS, **PAGED_SCHEMAS}.items():
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
    _fill_scores(p, q, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left,
                 window_right, softcap, sinks)
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
    p.backend = BACKEND_CUDA if q.device.type == "cuda" else BACKEND_CPU
    p.device_check = (None if device_check is None else
                       ctypes.cast(device_check.data_ptr(), ctypes.POINTER(ctypes.c_int32)))
    return cu_q, cu_k


def _fill_scores(p, q, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left,
                 window_right, softcap, sinks):
    """The fields of p that the packed and the paged forward take alike: the hints, the scale,
    the causal mask, the window, softcap and sinks (checked in the native ops' order)."""
    p.max_seqlen_q = _checks.seqlen_hint("max_seqlen_q", max_seqlen_q)
    p.max_seqlen_k = _checks.seqlen_hint("max_seqlen_k", max_seqlen_k)
    p.softmax_scale = _checks.scale_value(softmax_scale)
    p.window_left = window_bound("window_left", window_left)
    p.window_right = window_bound("window_right", window_right)
    # Beyond float32: an infinity (as the native op converts it), which libjfa rejects.
    big = math.isfinite(softcap) and abs(softcap) > _checks.FLOAT32_MAX
    p.softcap = math.copysign(math.inf, softcap) if big else softcap
    check_sinks(sinks, q.shape[1], q.device)
    p.sinks = None if sinks is None else sinks.data_ptr()
    p.causal = 1 if causal else 0


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


def _data_or_stand_in(t: Tensor, keep: list) -> int:
    """The address of t's data, or for an empty t (whose data_ptr() is 0, which the C ABI takes for
    "absent": no append, no block table) that of a one-element stand-in, kept alive in keep."""
    if t.numel() > 0:
        return t.data_ptr()
    keep.append(torch.empty((1,), dtype=t.dtype, device=t.device))
    return keep[-1].data_ptr()


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                    seqused_k: Tensor, cu_seqlens_q: Tensor, max_seqlen_q: Optional[int],
                    max_seqlen_k: Optional[int], causal: bool, softmax_scale: Optional[float],
                    return_lse: bool, device_check: Optional[Tensor] = None,
                    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                    sinks: Optional[Tensor] = None, k_new: Optional[Tensor] = None,
                    v_new: Optional[Tensor] = None,
                    cu_seqlens_new: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The forward over a paged KV cache (jfa_attention_forward_paged). Returns (out, lse); lse is
    empty unless return_lse. With k_new, v_new and cu_seqlens_new the call first writes each
    sequence's new rows into its pages (in place). On CUDA tensors it runs on the current stream
    and reads nothing on the host, with a workspace of jfa_attention_paged_workspace_size bytes
    from torch's caching allocator, as the native op's."""
    q_layout = check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q,
                                  k_new, v_new, cu_seqlens_new)
    check_device_check(device_check, q.device)
    p = new_params()
    p.device_check = (None if device_check is None else
                      ctypes.cast(device_check.data_ptr(), ctypes.POINTER(ctypes.c_int32)))
    _fill_scores(p, q, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left,
                 window_right, softcap, sinks)
    total_q, heads_q, d = q.shape
    heads_kv, d_v = k_cache.shape[2], v_cache.shape[3]
    # Dense copies of strided index tensors (on the device, in stream order; no host sync).
    cu_q, table, used = (t.contiguous() for t in (cu_seqlens_q, block_table, seqused_k))
    p.q, p.cu_seqlens_q = q.data_ptr(), cu_q.data_ptr()
    p.q_layout.token_stride, p.q_layout.head_stride = q_layout
    p.batch, p.total_q = cu_q.shape[0] - 1, total_q
    p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = heads_q, heads_kv, d, d_v
    p.dtype = _DTYPES[q.dtype]
    p.backend = BACKEND_CUDA if q.device.type == "cuda" else BACKEND_CPU
    kv = new_paged_kv()
    keep = [cu_q, table, used]
    kv.k_cache, kv.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
    kv.num_pages, kv.page_size = k_cache.shape[0], k_cache.shape[1]
    kv.max_pages_per_seq = table.shape[1]
    kv.block_table = _data_or_stand_in(table, keep)  # no columns: valid, but its data is NULL
    kv.seqused_k = used.data_ptr()
    if k_new is not None:
        # An append of no rows still has its offsets checked: NULL k_new would mean no append.
        cu_new = cu_seqlens_new.contiguous()
        keep.append(cu_new)
        kv.k_new, kv.v_new = _data_or_stand_in(k_new, keep), _data_or_stand_in(v_new, keep)
        kv.cu_seqlens_new, kv.total_new = cu_new.data_ptr(), k_new.shape[0]
    out = torch.empty((total_q, heads_q, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32,
                      device=q.device)
    p.out = out.data_ptr()
    p.lse = lse.data_ptr() if return_lse else None
    p.out_layout.token_stride, p.out_layout.head_stride = heads_q * d_v, d_v
    if q.device.type != "cuda":
        call("jfa_attention_forward_paged", ctypes.byref(p), ctypes.byref(kv))
        return out, lse
    with torch.cuda.device(q.device):
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
        # The splits' partials from torch's caching allocator: no device allocation on a warm
        # path, and inside a captured graph the graph's pool holds them.
        size = ctypes.c_size_t(0)
        call("jfa_attention_paged_workspace_size", ctypes.byref(p), ctypes.byref(kv),
             ctypes.byref(size))
        workspace = torch.empty((size.value,), dtype=torch.uint8, device=q.device)
        p.workspace = workspace.data_ptr() if size.value else None
        p.workspace_bytes = size.value
        call("jfa_attention_forward_paged", ctypes.byref(p), ctypes.byref(kv))
    return out, lse
