"""Jagged-tensor utilities: offsets, jagged <-> padded, and torch.nested interop.

A jagged tensor is a ``values`` tensor ``[total, ...]`` with sequences packed end to end, plus
``cu_seqlens`` (batch + 1 offsets: 0, non-decreasing, last = total). numpy arrays go through the
C API of libjfa; torch tensors use torch ops on the tensor's device.
"""

from __future__ import annotations

import ctypes
import math
import numbers

from . import _checks
from ._library import DTYPE_FLOAT16, DTYPE_FLOAT32, call

try:
    import numpy as np
except ImportError:  # torch-only installs
    np = None

from ._torch_support import torch  # None when torch is not available

__all__ = ["lengths_to_offsets", "offsets_to_lengths", "max_length", "validate_offsets", "pad",
           "unpad", "from_nested", "to_nested"]


def _is_tensor(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _max_len_arg(max_len, name="max_len"):
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(max_len).__name__}")
    max_len = int(max_len)
    if max_len < 0 or max_len > _checks.INT32_MAX:
        raise ValueError(f"{name} must be in [0, 2^31 - 1], got {max_len}")
    return max_len


# ---- numpy helpers -------------------------------------------------------------------------------

def _need_numpy():
    if np is None:
        raise ImportError("numpy is required for non-tensor inputs")


def _np_offsets(name, x):
    from . import _numpy_backend

    return _numpy_backend.offsets(name, x)


def _np_validate(cu, total):
    call("jfa_validate_offsets", cu.ctypes.data, cu.size - 1, -1 if total is None else int(total))


def _np_max_length(cu) -> int:
    m = ctypes.c_int32(0)
    call("jfa_max_length", cu.ctypes.data, cu.size - 1, ctypes.byref(m))
    return m.value


_NP_C_DTYPES = None


def _np_c_dtype(dtype):
    global _NP_C_DTYPES
    if _NP_C_DTYPES is None:
        _NP_C_DTYPES = {np.dtype(np.float16): DTYPE_FLOAT16, np.dtype(np.float32): DTYPE_FLOAT32}
    return _NP_C_DTYPES.get(dtype)


def _np_positions(cu):
    """(sequence index, position in the sequence) of every token of valid offsets."""
    lengths = np.diff(cu).astype(np.int64)
    seq = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    pos = np.arange(seq.size, dtype=np.int64) - cu[:-1].astype(np.int64)[seq]
    return seq, pos


# ---- torch helpers -------------------------------------------------------------------------------

def _t_offsets(name, cu, device):
    if not _is_tensor(cu):
        if isinstance(cu, (list, tuple)):
            return torch.tensor(cu, dtype=torch.int32, device=device)
        raise TypeError(f"{name} must be a torch.Tensor (or a list of ints), got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 1 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device} with the values, got {cu.device}")
    return cu


def _t_check_offsets(name, cu, total=None, max_len=None):
    """Host-side checks of CPU offsets (CUDA offsets are not read, to avoid a sync)."""
    if cu.device.type != "cpu":
        return
    c = cu.to(torch.int64)
    if int(c[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(c[0])}")
    d = c[1:] - c[:-1]
    if d.numel() and int(d.min()) < 0:
        i = int(torch.nonzero(d < 0)[0, 0]) + 1
        raise ValueError(f"{name} must be non-decreasing; {name}[{i}]={int(c[i])} < "
                         f"{name}[{i - 1}]={int(c[i - 1])}")
    if total is not None and int(c[-1]) != total:
        raise ValueError(f"{name}[-1]={int(c[-1])} must equal the total {total}")
    if max_len is not None and d.numel() and int(d.max()) > max_len:
        b = int(torch.argmax(d))
        raise ValueError(f"sequence {b} has length {int(d[b])} > max_len {max_len}")


def _t_check_integer(name, t):
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")


def _t_positions(cu64, total, device):
    """(sequence index, position) of tokens 0..total-1; no host sync."""
    batch = cu64.shape[0] - 1
    tok = torch.arange(total, device=device, dtype=torch.int64)
    seq = torch.searchsorted(cu64[1:].contiguous(), tok, right=True).clamp_(max=max(batch - 1, 0))
    pos = tok - cu64[seq]
    return seq, pos


# ---- public API ----------------------------------------------------------------------------------

def lengths_to_offsets(lengths, *, device=None):
    """Offsets (int32, batch + 1 entries) from sequence lengths.

    numpy arrays and lists give a numpy array (through jfa_lengths_to_offsets); a torch tensor
    gives a tensor on its device (no host sync for CUDA tensors; CPU lengths are checked).
    ``device``: with a list input, build a torch tensor on this device instead.
    """
    if device is not None and not _is_tensor(lengths):
        if torch is None:
            raise ImportError("device= needs torch")
        lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
    if _is_tensor(lengths):
        _t_check_integer("lengths", lengths)
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D, got shape {tuple(lengths.shape)}")
        csum = torch.cumsum(lengths.to(torch.int64), 0)
        if lengths.device.type == "cpu" and lengths.numel():
            if int(lengths.min()) < 0:
                i = int(torch.nonzero(lengths < 0)[0, 0])
                raise ValueError(f"lengths[{i}]={int(lengths[i])} must be >= 0")
            if int(csum[-1]) > _checks.INT32_MAX:
                raise ValueError("the sum of lengths overflows int32")
        out = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
        out[1:] = csum
        return out
    _need_numpy()
    if isinstance(lengths, np.ndarray):
        if lengths.dtype.kind not in "iu":
            raise TypeError(f"lengths must be an integer array, got {lengths.dtype}")
        arr = lengths
    elif isinstance(lengths, (list, tuple)):
        arr = np.asarray(lengths)
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"lengths must hold integers, got {arr.dtype} values")
    else:
        raise TypeError(f"lengths must be a list, a numpy array or a torch tensor, got {type(lengths).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > _checks.INT32_MAX):
        bad = int(np.argmax((arr < 0) | (arr > _checks.INT32_MAX)))
        raise ValueError(f"lengths[{bad}]={arr[bad]} must be in [0, 2^31 - 1]")
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    out = np.empty(arr.size + 1, dtype=np.int32)
    call("jfa_lengths_to_offsets", arr.ctypes.data, arr.size, out.ctypes.data)
    return out


def offsets_from_position_ids(position_ids):
    """Offsets of the sequences packed in ``position_ids`` (a torch integer tensor, ``[tokens]`` or
    ``[rows, tokens]``, read row after row), where a sequence starts at every token whose position
    is not the previous token's plus one (position 0 after a sequence, as packing collators write).

    Returns int32 offsets of a fixed size, ``tokens + 1`` (all of position_ids' tokens counted):
    the sequences found, then empty ones up to that size. The size depends on the shape only and
    nothing is read on the host, so the call does not synchronize and, under torch.compile, new
    lengths do not recompile. A row of ``position_ids`` always starts a sequence.
    """
    if torch is None:
        raise ImportError("offsets_from_position_ids needs torch")
    if not _is_tensor(position_ids):
        raise TypeError(f"position_ids must be a torch.Tensor, got {type(position_ids).__name__}")
    _t_check_integer("position_ids", position_ids)
    if position_ids.dim() not in (1, 2):
        raise ValueError(f"position_ids must be [tokens] or [rows, tokens], got shape "
                         f"{tuple(position_ids.shape)}")
    pos = position_ids.to(torch.int64)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    rows, width = pos.shape
    starts = torch.ones_like(pos, dtype=torch.bool)
    if width > 1:
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    starts = starts.reshape(-1)
    total = rows * width
    # Token t belongs to sequence cumsum(starts)[t] - 1; the lengths are counted into a vector of
    # one slot per token (at most that many sequences), so the shapes never depend on the values.
    seq = torch.cumsum(starts.to(torch.int64), 0) - 1
    lengths = torch.zeros(total, dtype=torch.int64, device=pos.device)
    lengths.scatter_add_(0, seq, torch.ones_like(seq))
    out = torch.zeros(total + 1, dtype=torch.int32, device=pos.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def offsets_to_lengths(cu_seqlens):
    """Sequence lengths (cu_seqlens[i + 1] - cu_seqlens[i])."""
    if _is_tensor(cu_seqlens):
        return cu_seqlens[1:] - cu_seqlens[:-1]
    _need_numpy()
    return np.diff(_np_offsets("cu_seqlens", cu_seqlens))


def max_length(cu_seqlens) -> int:
    """The longest sequence (0 for an empty batch). Reads the offsets (a host sync for CUDA)."""
    if _is_tensor(cu_seqlens):
        if cu_seqlens.shape[0] <= 1:
            return 0
        return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    _need_numpy()
    cu = _np_offsets("cu_seqlens", cu_seqlens)
    return _np_max_length(cu)


def validate_offsets(cu_seqlens, total=None, *, name="cu_seqlens") -> None:
    """Checks cu_seqlens[0] == 0, non-decreasing, and cu_seqlens[-1] == total (when given).

    Raises ValueError (JfaInvalidArgumentError for numpy) naming the first broken rule. Reads the
    offsets: a host sync for CUDA tensors."""
    if _is_tensor(cu_seqlens):
        _t_check_offsets(name, _t_offsets(name, cu_seqlens, cu_seqlens.device).cpu(), total)
        return
    _need_numpy()
    _np_validate(_np_offsets(name, cu_seqlens), total)


def pad(values, cu_seqlens, max_len=None, padding_value=0.0):
    """Jagged ``[total, ...]`` -> padded ``[batch, max_len, ...]``.

    Positions past a sequence's end hold ``padding_value``. ``max_len`` defaults to the longest
    sequence (computing it reads the offsets: a host sync for CUDA tensors; pass it to avoid
    that). A sequence longer than ``max_len`` is an error for numpy arrays and CPU tensors; on
    CUDA, where the offsets are not read, its extra tokens are dropped.
    """
    if _is_tensor(values):
        return _torch_pad(values, cu_seqlens, max_len, padding_value)
    _need_numpy()
    if not isinstance(values, np.ndarray):
        raise TypeError(f"values must be a numpy array or a torch tensor, got {type(values).__name__}")
    if values.ndim < 1:
        raise ValueError("values must have a leading token dimension [total, ...]")
    cu = _np_offsets("cu_seqlens", cu_seqlens)
    batch = cu.size - 1
    total = values.shape[0]
    _np_validate(cu, total)
    max_len = _np_max_length(cu) if max_len is None else _max_len_arg(max_len)
    row_shape = values.shape[1:]
    row_elems = math.prod(row_shape)
    c_dtype = _np_c_dtype(values.dtype)
    padded_shape = (batch, max_len) + row_shape
    if c_dtype is not None:
        src = np.ascontiguousarray(values)
        padded = np.empty(padded_shape, dtype=values.dtype)
        call("jfa_jagged_to_padded", src.ctypes.data, cu.ctypes.data, batch, row_elems, c_dtype,
             max_len, float(padding_value), padded.ctypes.data)
        return padded
    lengths = np.diff(cu)
    if batch and lengths.max() > max_len:
        b = int(np.argmax(lengths))
        raise ValueError(f"sequence {b} has length {lengths[b]} > max_len {max_len}")
    padded = np.full(padded_shape, padding_value, dtype=values.dtype)
    seq, pos = _np_positions(cu)
    padded[seq, pos] = values
    return padded


def unpad(padded, cu_seqlens, total=None):
    """Padded ``[batch, max_len, ...]`` -> jagged ``[total, ...]`` (the inverse of :func:`pad`).

    ``total`` (= cu_seqlens[-1]) is read from the offsets when not given: a host sync for CUDA
    tensors; pass it to avoid that. On CUDA, tokens past max_len come back as zeros.
    """
    if _is_tensor(padded):
        return _torch_unpad(padded, cu_seqlens, total)
    _need_numpy()
    if not isinstance(padded, np.ndarray):
        raise TypeError(f"padded must be a numpy array or a torch tensor, got {type(padded).__name__}")
    if padded.ndim < 2:
        raise ValueError(f"padded must have shape [batch, max_len, ...], got {padded.shape}")
    cu = _np_offsets("cu_seqlens", cu_seqlens)
    batch = cu.size - 1
    if padded.shape[0] != batch:
        raise ValueError(f"padded has {padded.shape[0]} sequences but cu_seqlens describes {batch}")
    _np_validate(cu, total)
    max_len = padded.shape[1]
    if max_len > _checks.INT32_MAX:
        raise ValueError("padded.shape[1] (max_len) must fit in int32")
    n = int(cu[-1])
    row_shape = padded.shape[2:]
    row_elems = math.prod(row_shape)
    c_dtype = _np_c_dtype(padded.dtype)
    if c_dtype is not None:
        src = np.ascontiguousarray(padded)
        out = np.empty((n,) + row_shape, dtype=padded.dtype)
        call("jfa_padded_to_jagged", src.ctypes.data, cu.ctypes.data, batch, row_elems, c_dtype,
             max_len, out.ctypes.data)
        return out
    lengths = np.diff(cu)
    if batch and lengths.max() > max_len:
        b = int(np.argmax(lengths))
        raise ValueError(f"sequence {b} has length {lengths[b]} > max_len {max_len}")
    seq, pos = _np_positions(cu)
    return np.ascontiguousarray(padded[seq, pos])


def _torch_pad(values, cu_seqlens, max_len, padding_value):
    if values.dim() < 1:
        raise ValueError("values must have a leading token dimension [total, ...]")
    device = values.device
    cu = _t_offsets("cu_seqlens", cu_seqlens, device)
    batch = cu.shape[0] - 1
    total = values.shape[0]
    max_len = max_length(cu) if max_len is None else _max_len_arg(max_len)
    _t_check_offsets("cu_seqlens", cu, total, max_len)
    row_shape = tuple(values.shape[1:])
    if batch == 0 or max_len == 0:
        return values.new_full((batch, max_len) + row_shape, padding_value)
    seq, pos = _t_positions(cu.to(torch.int64), total, device)
    dummy = batch * max_len  # tokens that do not fit (CUDA only) land in an extra row
    dest = torch.where(pos < max_len, seq * max_len + pos, torch.full_like(pos, dummy))
    flat = values.new_full((dummy + 1,) + row_shape, padding_value)
    flat.index_copy_(0, dest, values)
    return flat[:dummy].view((batch, max_len) + row_shape)


def _torch_unpad(padded, cu_seqlens, total):
    if padded.dim() < 2:
        raise ValueError(f"padded must have shape [batch, max_len, ...], got {tuple(padded.shape)}")
    device = padded.device
    cu = _t_offsets("cu_seqlens", cu_seqlens, device)
    batch, max_len = padded.shape[0], padded.shape[1]
    if padded.shape[0] != cu.shape[0] - 1:
        raise ValueError(f"padded has {padded.shape[0]} sequences but cu_seqlens describes "
                         f"{cu.shape[0] - 1}")
    if total is None:
        total = int(cu[-1])
    elif isinstance(total, bool) or not isinstance(total, numbers.Integral) or total < 0:
        raise ValueError(f"total must be a non-negative int, got {total!r}")
    total = int(total)
    _t_check_offsets("cu_seqlens", cu, total, max_len)
    row_shape = tuple(padded.shape[2:])
    if batch == 0 or max_len == 0 or total == 0:
        return padded.new_zeros((total,) + row_shape)
    seq, pos = _t_positions(cu.to(torch.int64), total, device)
    valid = pos < max_len
    src = seq * max_len + pos.clamp(max=max_len - 1)
    out = padded.reshape((batch * max_len,) + row_shape).index_select(0, src)
    mask = valid.view((total,) + (1,) * len(row_shape))
    return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=device))


def from_nested(nt):
    """A ``torch.nested`` jagged-layout tensor ``[B, j, ...]`` -> ``(values, cu_seqlens)``.

    values is ``nt.values()`` (``[total, ...]``, no copy) and cu_seqlens its offsets as int32 on
    the same device (no host sync)."""
    if torch is None:
        raise ImportError("from_nested needs torch")
    if not isinstance(nt, torch.Tensor) or not nt.is_nested:
        raise TypeError(f"nt must be a nested tensor, got {type(nt).__name__}")
    if nt.layout != torch.jagged:
        raise ValueError("nt must have layout=torch.jagged (create it with "
                         "torch.nested.nested_tensor(..., layout=torch.jagged)), got "
                         f"{nt.layout}")
    if getattr(nt, "_ragged_idx", 1) != 1:
        raise ValueError("nt must be ragged in dimension 1 ([B, j, ...]); transpose it back first")
    if nt.lengths() is not None:
        raise ValueError("nt has holes (lengths() is set): its values are not packed end to end; "
                         "call .contiguous() on it first")
    values, offsets = nt.values(), nt.offsets()
    # torch builds such tensors from any offsets: hand back only ones that address the values.
    _t_check_offsets("nt.offsets()", offsets, values.shape[0])
    return values, offsets.to(torch.int32)


def to_nested(values, cu_seqlens, max_seqlen=None):
    """``(values [total, ...], cu_seqlens)`` -> a ``torch.nested`` jagged-layout tensor
    ``[B, j, ...]`` that views ``values``.

    CPU offsets are checked as :func:`pad` checks them (0 first, non-decreasing, last equal to
    ``values.shape[0]``, no sequence longer than ``max_seqlen`` when given); CUDA offsets are not
    read, to avoid a host sync."""
    if torch is None:
        raise ImportError("to_nested needs torch")
    if not _is_tensor(values):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if values.dim() < 1:
        raise ValueError("values must have a leading token dimension [total, ...]")
    cu = _t_offsets("cu_seqlens", cu_seqlens, values.device)
    kwargs = {}
    if max_seqlen is not None:
        kwargs["max_seqlen"] = _max_len_arg(max_seqlen, "max_seqlen")
    _t_check_offsets("cu_seqlens", cu, values.shape[0], kwargs.get("max_seqlen"))
    return torch.nested.nested_tensor_from_jagged(values, offsets=cu.to(torch.int64), **kwargs)
