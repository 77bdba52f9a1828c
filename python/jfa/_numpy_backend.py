"""The numpy path: host arrays, the CPU backend of libjfa."""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from . import _checks
from ._library import (BACKEND_CPU, DTYPE_FLOAT16, DTYPE_FLOAT32, AttentionParams, call,
                       new_paged_kv, new_params)

_DTYPES = {np.dtype(np.float16): DTYPE_FLOAT16, np.dtype(np.float32): DTYPE_FLOAT32}
_FIX = "use numpy.ascontiguousarray"


def jfa_dtype(name: str, a: np.ndarray) -> int:
    """The jfa_dtype of a float16/float32 array, or a TypeError naming the argument."""
    dt = a.dtype
    if dt.kind == "f" and not dt.isnative:
        raise TypeError(f"{name} must be in native byte order, got dtype {dt.str}")
    if dt not in _DTYPES:
        raise TypeError(
            f"{name} must be float16 or float32 for numpy arrays, got {dt} (bfloat16 is supported "
            "through torch tensors)")
    return _DTYPES[dt]


def offsets(name: str, x) -> np.ndarray:
    """A contiguous int32 1-D offsets array from an int32 ndarray or a list/tuple of ints."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.dtype(np.int32):
            raise TypeError(f"{name} must be an int32 array (batch + 1 offsets), got dtype {x.dtype}")
        arr = x
    elif isinstance(x, (list, tuple)):
        arr = np.asarray(x)
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got {arr.dtype} values")
        if arr.size and (arr.min() < -2**31 or arr.max() > _checks.INT32_MAX):
            raise ValueError(f"{name} values must fit in int32")
        arr = arr.astype(np.int32)
    else:
        raise TypeError(
            f"{name} must be an int32 numpy array or a list of ints, got {type(x).__name__}")
    _checks.offsets_batch(name, _checks.offsets_1d(name, arr.shape))
    return np.ascontiguousarray(arr)


def _array(name: str, a) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")
    return a


def _layout(name: str, a: np.ndarray):
    """(token_stride, head_stride) of a [total, heads, head_dim] array (_checks.qkv_shapes)."""
    if not a.flags.aligned:
        raise ValueError(f"{name} is not aligned to its element size; {_FIX}")
    item = a.itemsize
    for s in a.strides:
        if s % item:
            raise ValueError(
                f"{name} strides {a.strides} (bytes) are not multiples of the element size {item}; {_FIX}")
    return _checks.layout(name, a.shape, [s // item for s in a.strides], _FIX)


def _ptr(a: Optional[np.ndarray]):
    return None if a is None else a.ctypes.data


def sinks_array(sinks, heads_q: int) -> Optional[np.ndarray]:
    """None, or the sinks as a contiguous float32 [heads_q] array (from an array or a list)."""
    if sinks is None:
        return None
    if _checks_is_torch(sinks):
        raise TypeError("sinks must be a numpy array (or a list of floats) for numpy inputs")
    arr = np.asarray(sinks)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"sinks must hold floats, got {arr.dtype}")
    if arr.shape != (heads_q,):
        raise ValueError(f"sinks must have shape [heads_q] = ({heads_q},), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _checks_is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _set_scores(p: AttentionParams, softmax_scale, causal, max_seqlen_q, max_seqlen_k,
                window_size, softcap, sinks) -> Optional[np.ndarray]:
    """The scale, mask, hints and score modifiers of p (p.heads_q set), on the CPU backend; returns
    the sinks array p points to (keep it alive through the call)."""
    p.softmax_scale = _checks.scale_value(softmax_scale)
    p.causal = 1 if _checks.flag("causal", causal) else 0
    p.max_seqlen_q = _checks.seqlen_hint("max_seqlen_q", max_seqlen_q)
    p.max_seqlen_k = _checks.seqlen_hint("max_seqlen_k", max_seqlen_k)
    p.window_left, p.window_right = _checks.window(window_size)
    p.softcap = _checks.softcap_value(softcap)
    sinks = sinks_array(sinks, p.heads_q)
    p.sinks = _ptr(sinks)
    p.backend = BACKEND_CPU
    return sinks


def build_params(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, window_size=(-1, -1), softcap=0.0, sinks=None):
    """Checks everything and fills a jfa_attention_params (out and lse left NULL).

    Returns (params, keep) where keep holds the arrays the pointers refer to."""
    q, k, v = _array("q", q), _array("k", k), _array("v", v)
    total_q, heads_q, total_k, heads_kv, d, d_v = _checks.qkv_shapes(q.shape, k.shape, v.shape)
    dtype = jfa_dtype("q", q)
    _checks.same_dtype(q.dtype, k.dtype, v.dtype)
    layouts = [_layout(name, a) for name, a in (("q", q), ("k", k), ("v", v))]
    cu_q = offsets("cu_seqlens_q", cu_seqlens_q)
    cu_k = cu_q if cu_seqlens_k is None else offsets("cu_seqlens_k", cu_seqlens_k)
    batch = _checks.offsets_count("cu_seqlens_q", cu_q.size, "cu_seqlens_k", cu_k.size)

    p: AttentionParams = new_params()
    p.q, p.k, p.v = _ptr(q), _ptr(k), _ptr(v)
    p.cu_seqlens_q, p.cu_seqlens_k = _ptr(cu_q), _ptr(cu_k)
    p.batch, p.total_q, p.total_k = batch, total_q, total_k
    p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = heads_q, heads_kv, d, d_v
    p.dtype = dtype
    for field, (ts, hs) in zip(("q_layout", "k_layout", "v_layout"), layouts):
        lay = getattr(p, field)
        lay.token_stride, lay.head_stride = ts, hs
    sinks = _set_scores(p, softmax_scale, causal, max_seqlen_q, max_seqlen_k, window_size,
                        softcap, sinks)
    return p, (q, k, v, cu_q, cu_k, sinks)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
              softmax_scale, return_lse, window_size=(-1, -1), softcap=0.0, sinks=None):
    p, keep = build_params(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal, softmax_scale, window_size, softcap, sinks)
    return_lse = _checks.flag("return_lse", return_lse)
    q = keep[0]
    out = np.empty((p.total_q, p.heads_q, p.head_dim_v), dtype=q.dtype)
    lse = np.empty((p.heads_q, p.total_q), dtype=np.float32) if return_lse else None
    p.out = _ptr(out)
    p.out_layout.token_stride = p.heads_q * p.head_dim_v
    p.out_layout.head_stride = p.head_dim_v
    p.lse = _ptr(lse)
    call("jfa_attention_forward", ctypes.byref(p))
    del keep
    return (out, lse) if return_lse else out


def attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k=None, *, causal=False,
                        softmax_scale=None, q_tokens=None, return_lse=False,
                        window_size=(-1, -1), softcap=0.0, sinks=None):
    """libjfa's float64 reference over numpy arrays (the oracle of the C++ tests).

    Returns out float64 [n, heads_q, head_dim_v] (v's head_dim) for the query tokens listed in ``q_tokens`` (all
    tokens when None), and lse float64 [heads_q, n] when ``return_lse``.
    """
    p, keep = build_params(q, k, v, cu_seqlens_q, cu_seqlens_k, None, None, causal, softmax_scale,
                           window_size, softcap, sinks)
    out, lse = _call_reference("jfa_attention_reference", (ctypes.byref(p),), p, q_tokens,
                               return_lse)
    del keep
    return (out, lse) if return_lse else out


def _call_reference(function, leading, p: AttentionParams, q_tokens, return_lse):
    """A float64 reference entry (`function`, called with the `leading` arguments, then the rows'
    tokens, their count, out and lse) on the rows ``q_tokens`` of p (every row when None):
    (out float64 [n, heads_q, head_dim_v], lse float64 [heads_q, n] or None)."""
    return_lse = _checks.flag("return_lse", return_lse)
    if q_tokens is None:
        tokens = None
        n = p.total_q
    else:
        given = np.asarray(q_tokens)
        if given.size and given.dtype.kind not in "iu":
            raise TypeError(f"q_tokens must hold integers (token indices), got {given.dtype}")
        tokens = np.ascontiguousarray(given.astype(np.int64).reshape(-1))
        n = tokens.size
        if n and (tokens.min() < 0 or tokens.max() >= p.total_q):
            raise ValueError(f"q_tokens must be in [0, total_q={p.total_q})")
    out = np.empty((n, p.heads_q, p.head_dim_v), dtype=np.float64)
    lse = np.empty((p.heads_q, n), dtype=np.float64) if return_lse else None
    tok_ptr = None if tokens is None else tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
    out_ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
    lse_ptr = None if lse is None else lse.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
    call(function, *leading, tok_ptr, n, out_ptr, lse_ptr)
    return out, lse


def _int32_array(name: str, a, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be an int32 numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(np.int32):
        raise TypeError(f"{name} must be an int32 array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    return np.ascontiguousarray(a)


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                    max_seqlen_k, causal, softmax_scale, return_lse, window_size=(-1, -1),
                    softcap=0.0, sinks=None, q_tokens=None, reference=False, k_new=None,
                    v_new=None, cu_seqlens_new=None):
    """The forward over a paged KV cache (jfa_attention_forward_paged), or its float64 reference
    (jfa_attention_reference_paged) with ``reference``, on numpy arrays."""
    q, kc, vc = _array("q", q), _array("k_cache", k_cache), _array("v_cache", v_cache)
    if q.ndim != 3:
        raise ValueError(f"q must have shape [total_q, heads_q, head_dim], got {q.shape}")
    for name, c in (("k_cache", kc), ("v_cache", vc)):
        if c.ndim != 4:
            raise ValueError(
                f"{name} must have shape [num_pages, page_size, heads_kv, head_dim], got {c.shape}")
        if not c.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (the caches are read packed)")
    if kc.shape[:3] != vc.shape[:3]:
        raise ValueError(f"k_cache and v_cache must agree in [num_pages, page_size, heads_kv], got "
                         f"{kc.shape} and {vc.shape}")
    if kc.shape[3] != q.shape[2]:
        raise ValueError(f"k_cache's head_dim ({kc.shape[3]}) must be q's ({q.shape[2]})")
    dtype = jfa_dtype("q", q)
    _checks.same_dtype(q.dtype, kc.dtype, vc.dtype)
    q_layout = _layout("q", q)
    table = _int32_array("block_table", block_table, 2)
    used = _int32_array("seqused_k", seqused_k, 1)
    cu_q = offsets("cu_seqlens_q", cu_seqlens_q)
    batch = cu_q.size - 1
    if table.shape[0] != batch or used.shape[0] != batch:
        raise ValueError(f"block_table has {table.shape[0]} rows and seqused_k {used.shape[0]} "
                         f"entries, but cu_seqlens_q describes {batch} sequences")
    num_pages, page_size, heads_kv, d = kc.shape
    total_q, heads_q = q.shape[0], q.shape[1]
    if heads_q % heads_kv:
        raise ValueError(f"the heads of q ({heads_q}) must be a multiple of the caches' "
                         f"({heads_kv})")
    p: AttentionParams = new_params()
    p.q, p.cu_seqlens_q = _ptr(q), _ptr(cu_q)
    p.batch, p.total_q = batch, total_q
    p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = heads_q, heads_kv, d, vc.shape[3]
    p.dtype = dtype
    p.q_layout.token_stride, p.q_layout.head_stride = q_layout
    sinks = _set_scores(p, softmax_scale, causal, max_seqlen_q, max_seqlen_k, window_size,
                        softcap, sinks)
    kv = new_paged_kv()
    kv.k_cache, kv.v_cache = _ptr(kc), _ptr(vc)
    kv.block_table, kv.seqused_k = _ptr(table), _ptr(used)
    kv.num_pages, kv.page_size, kv.max_pages_per_seq = num_pages, page_size, table.shape[1]
    if (k_new is None) != (v_new is None) or (k_new is None) != (cu_seqlens_new is None):
        raise ValueError("k_new, v_new and cu_seqlens_new go together (an append), or none")
    if k_new is not None:
        k_new, v_new = _array("k_new", k_new), _array("v_new", v_new)
        for name, a, cols in (("k_new", k_new, d), ("v_new", v_new, vc.shape[3])):
            if a.ndim != 3 or a.shape[1:] != (heads_kv, cols):
                raise ValueError(f"{name} must have shape [total_new, {heads_kv}, {cols}], got "
                                 f"{a.shape}")
            if a.dtype != q.dtype or not a.flags.c_contiguous:
                raise ValueError(f"{name} must be a C-contiguous {q.dtype} array")
        if k_new.shape[0] != v_new.shape[0]:
            raise ValueError("k_new and v_new must have the same number of rows")
        if not reference and not (kc.flags.writeable and vc.flags.writeable):
            raise ValueError("k_cache and v_cache must be writeable to append to them")
        cu_new = offsets("cu_seqlens_new", cu_seqlens_new)
        kv.k_new, kv.v_new, kv.cu_seqlens_new = _ptr(k_new), _ptr(v_new), _ptr(cu_new)
        kv.total_new = k_new.shape[0]
    if reference:
        out, lse = _call_reference("jfa_attention_reference_paged",
                                   (ctypes.byref(p), ctypes.byref(kv)), p, q_tokens, return_lse)
    else:
        return_lse = _checks.flag("return_lse", return_lse)
        out = np.empty((total_q, heads_q, p.head_dim_v), dtype=q.dtype)
        lse = np.empty((heads_q, total_q), dtype=np.float32) if return_lse else None
        p.out = _ptr(out)
        p.lse = _ptr(lse)
        call("jfa_attention_forward_paged", ctypes.byref(p), ctypes.byref(kv))
    del q, kc, vc, table, used, cu_q, sinks, k_new, v_new
    return (out, lse) if return_lse else out
