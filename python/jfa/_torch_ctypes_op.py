"""``jfa::jagged_attention_fwd`` defined in Python over libjfa's C ABI (ctypes): the fallback
where the native op library (libjfa_torch.so) is not available. Same schema and behaviour as the
native op; slower to call (the Python custom-op machinery runs on every call)."""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _checks
from ._library import (BACKEND_CPU, BACKEND_CUDA, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT32,
                       call, new_params)
from ._torch_checks import check_inputs

_DTYPES = {torch.float16: DTYPE_FLOAT16, torch.bfloat16: DTYPE_BFLOAT16,
           torch.float32: DTYPE_FLOAT32}


@torch.library.custom_op("jfa::jagged_attention_fwd", mutates_args=())
def jagged_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         causal: bool, softmax_scale: Optional[float],
                         return_lse: bool) -> Tuple[Tensor, Tensor]:
    """Jagged attention forward. Returns (out, lse); lse is empty unless return_lse."""
    layouts = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    hint_q = _checks.seqlen_hint("max_seqlen_q", max_seqlen_q)
    hint_k = _checks.seqlen_hint("max_seqlen_k", max_seqlen_k)
    scale = _checks.scale_value(softmax_scale)
    total_q, heads_q, d = q.shape
    out = torch.empty((total_q, heads_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32,
                      device=q.device)
    # Offsets are read through a plain pointer: make them dense (a device copy, no host sync).
    cu_q = cu_seqlens_q.contiguous()
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k.contiguous()

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
    if q.device.type != "cuda":
        p.backend = BACKEND_CPU
        call("jfa_attention_forward", ctypes.byref(p))
        return out, lse
    p.backend = BACKEND_CUDA
    with torch.cuda.device(q.device):
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
        # The workspace from torch's caching allocator: no device allocation on a warm path.
        size = ctypes.c_size_t(0)
        call("jfa_attention_workspace_size", ctypes.byref(p), ctypes.byref(size))
        workspace = torch.empty((size.value,), dtype=torch.uint8, device=q.device)
        p.workspace, p.workspace_bytes = workspace.data_ptr(), size.value
        call("jfa_attention_forward", ctypes.byref(p))
    return out, lse

