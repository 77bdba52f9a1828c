"""Metadata checks of torch inputs (no data reads): run by the fake kernel while tracing and by
the ctypes op; the native op makes the same checks in C++ with the same messages."""

import torch
from torch import Tensor

from . import _checks

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FIX = "call .contiguous() on it"


def _tensor(name: str, t) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _on_device(name: str, t: Tensor, device) -> None:
    """t on the device of q."""
    if t.device != device:
        raise ValueError(f"{name} must be on the device of q ({device}), got {t.device}")


def _contiguous(name: str, t: Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous; {_FIX}")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor):
    """Raises for what the library would refuse; returns the (token, head) strides of q, k, v."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        _tensor(name, t)
    _checks.qkv_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    _checks.same_dtype(q.dtype, k.dtype, v.dtype)
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"q, k and v must be on the same device, got q on {q.device}, k on {k.device}, "
            f"v on {v.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q, k and v must be CPU or CUDA tensors, got device {q.device}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor (batch + 1 offsets), got {t.dtype}")
        _checks.offsets_1d(name, tuple(t.shape))
        _on_device(name, t, q.device)
    _checks.offsets_count("cu_seqlens_q", cu_seqlens_q.shape[0], "cu_seqlens_k",
                          cu_seqlens_k.shape[0])
    return [layout(name, t) for name, t in (("q", q), ("k", k), ("v", v))]


def check_device_check(device_check, device) -> None:
    """The word of the checked mode: None, or a 1-element int32 tensor on the
    device of q (the messages of the native op)."""
    if device_check is None:
        return
    if not isinstance(device_check, Tensor):
        raise TypeError("device_check must be a torch.Tensor (one int32 element) or None, got "
                        f"{type(device_check).__name__}")
    if device_check.dtype != torch.int32:
        raise TypeError(f"device_check must be an int32 tensor (one element), got "
                        f"{device_check.dtype}")
    if device_check.numel() != 1:
        raise ValueError(f"device_check must have exactly one element, got shape "
                         f"{tuple(device_check.shape)}")
    _contiguous("device_check", device_check)
    _on_device("device_check", device_check, device)


def window_bound(name: str, value: int) -> int:
    """A window bound as the C field takes it: any int32 (libjfa checks the value)."""
    if not _checks.INT32_MIN <= value <= _checks.INT32_MAX:
        raise ValueError(f"{name} must fit in int32 (>= 0, or -1 for unbounded), got {value}")
    return value


def check_sinks(sinks, heads_q: int, device) -> None:
    """None, or float32 [heads_q], contiguous, on the device of q."""
    if sinks is None:
        return
    _tensor("sinks", sinks)
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks must be float32, got {sinks.dtype}")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"sinks must have shape ({heads_q},) [heads_q], got {tuple(sinks.shape)}")
    if heads_q > 1:
        _contiguous("sinks", sinks)
    _on_device("sinks", sinks, device)


def layout(name: str, t: Tensor):
    """(token_stride, head_stride) in elements, checked as the library takes them."""
    return _checks.layout(name, tuple(t.shape), tuple(t.stride()), _FIX)


def check_backward_inputs(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                          lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                          grad_lse=None):
    """The backward op's checks (those of the forward, then out, grad_out, lse and grad_lse);
    returns the (token, head) strides of q, k, v, out and grad_out."""
    layouts = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    # out's shape: q's tokens and heads, v's head_dim (head_dim_v).
    out_shape = (q.shape[0], q.shape[1], v.shape[2])
    for name, t in (("out", out), ("grad_out", grad_out)):
        _tensor(name, t)
        if tuple(t.shape) != out_shape:
            raise ValueError(f"{name} must have the shape of out [total_q, heads_q, head_dim_v] "
                             f"{out_shape}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        _on_device(name, t, q.device)
        layouts.append(layout(name, t))
    heads_q, total_q = q.shape[1], q.shape[0]
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is None and name == "grad_lse":
            continue
        _tensor(name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (heads_q, total_q):
            raise ValueError(f"{name} must have shape ({heads_q}, {total_q}) [heads_q, total_q] "
                             f"(the forward's with return_lse=True), got {tuple(t.shape)}")
        if total_q > 0:  # an empty one has no element to address
            _contiguous(name, t)
        _on_device(name, t, q.device)
    return layouts


def _int32_tensor(name: str, t: Tensor, dims: int, shape: str, device) -> None:
    """An int32 tensor of `dims` dimensions on the device of q (the block table, seqused_k)."""
    _tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor {shape}, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D {shape}, got shape {tuple(t.shape)}")
    _on_device(name, t, device)


def _offsets(name: str, t: Tensor, device) -> int:
    """int32 1-D offsets on the device of q; returns their count (batch + 1)."""
    _tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor (batch + 1 offsets), got {t.dtype}")
    n = _checks.offsets_1d(name, tuple(t.shape))
    _on_device(name, t, device)
    return n


def check_paged_inputs(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                       seqused_k: Tensor, cu_seqlens_q: Tensor, k_new=None, v_new=None,
                       cu_seqlens_new=None):
    """The paged op's checks of its tensors, metadata only (libjfa checks the values: page
    indices, cache lengths, offsets), in the order and with the messages of src/torch/paged_op.cpp.
    Returns q's (token, head) strides."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _tensor(name, t)
    if q.dim() != 3:
        raise ValueError("q must have 3 dimensions [total_q, heads_q, head_dim], got shape "
                         f"{tuple(q.shape)}")
    for name, t, cols in (("k_cache", k_cache, "head_dim"), ("v_cache", v_cache, "head_dim_v")):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [num_pages, page_size, heads_kv, "
                             f"{cols}], got shape {tuple(t.shape)}")
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError("v_cache must have the shape of k_cache but for its last dimension "
                         "[num_pages, page_size, heads_kv, head_dim_v], got k_cache "
                         f"{tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}")
    heads_q, d, page_size = q.shape[1], q.shape[2], k_cache.shape[1]
    heads_kv, d_v = k_cache.shape[2], v_cache.shape[3]
    if k_cache.shape[3] != d:
        raise ValueError("q and k_cache must have the same head_dim (last dimension), got q "
                         f"{d} and k_cache {k_cache.shape[3]}")
    if heads_q < 1 or heads_kv < 1:
        raise ValueError(f"heads must be >= 1, got heads_q={heads_q} (q) and heads_kv={heads_kv} "
                         "(k_cache, v_cache)")
    if heads_q % heads_kv != 0:
        raise ValueError("the heads of q must be a multiple of the heads of the caches (GQA/MQA), "
                         f"got heads_q={heads_q} and heads_kv={heads_kv}")
    if d < 1:
        raise ValueError(f"head_dim must be >= 1, got {d}")
    if d_v < 1:
        raise ValueError(f"the head_dim of v_cache (head_dim_v) must be >= 1, got {d_v}")
    if page_size < 1 or page_size > _checks.INT32_MAX:
        raise ValueError(f"page_size (dimension 1 of the caches) must be in [1, 2^31 - 1], got "
                         f"{page_size}")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"q, k_cache and v_cache must have the same dtype, got q {q.dtype} and "
                            f"{name} {t.dtype}")
    if k_cache.device != q.device or v_cache.device != q.device:
        raise ValueError(f"q, k_cache and v_cache must be on the same device, got q on {q.device}, "
                         f"k_cache on {k_cache.device}, v_cache on {v_cache.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError("q, k_cache and v_cache must be CPU or CUDA tensors, got device "
                         f"{q.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():  # no copy: an append must land in the caller's cache
            raise ValueError(f"{name} must be contiguous (its pages are addressed packed, and "
                             "appended to in place: pass the cache itself, not a copy)")
    q_layout = layout("q", q)
    _int32_tensor("block_table", block_table, 2, "[batch, max_pages_per_seq]", q.device)
    if block_table.shape[1] > _checks.INT32_MAX:
        raise ValueError("block_table must have at most 2^31 - 1 columns (max_pages_per_seq), "
                         f"got {block_table.shape[1]}")
    _int32_tensor("seqused_k", seqused_k, 1, "[batch]", q.device)
    batch = _checks.offsets_batch("cu_seqlens_q", _offsets("cu_seqlens_q", cu_seqlens_q, q.device))
    if block_table.shape[0] != batch or seqused_k.shape[0] != batch:
        raise ValueError(f"block_table has {block_table.shape[0]} rows and seqused_k "
                         f"{seqused_k.shape[0]} entries, but cu_seqlens_q describes {batch} "
                         "sequences")
    appending = k_new is not None
    if appending != (v_new is not None) or appending != (cu_seqlens_new is not None):
        raise ValueError("k_new, v_new and cu_seqlens_new go together (an append), or none")
    if appending:
        for name, t, cols in (("k_new", k_new, d), ("v_new", v_new, d_v)):
            _tensor(name, t)
            if t.dim() != 3 or t.shape[1] != heads_kv or t.shape[2] != cols:
                raise ValueError(f"{name} must have shape [total_new, {heads_kv}, {cols}], got "
                                 f"{tuple(t.shape)}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
            _on_device(name, t, q.device)
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous (the new rows are read packed); "
                                 f"{_FIX}")
        if k_new.shape[0] != v_new.shape[0]:
            raise ValueError("k_new and v_new must have the same number of rows (total_new), got "
                             f"{k_new.shape[0]} and {v_new.shape[0]}")
        _checks.offsets_count("cu_seqlens_q", batch + 1, "cu_seqlens_new",
                              _offsets("cu_seqlens_new", cu_seqlens_new, q.device))
    return q_layout
