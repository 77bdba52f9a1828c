"""Argument checks shared by the numpy and the torch paths (metadata only, no data reads)."""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple

INT32_MAX = 2**31 - 1
INT32_MIN = -2**31
FLOAT32_MAX = 3.4028234663852886e38


def flag(name: str, value) -> bool:
    """A bool argument: True/False (or numpy's bool), nothing that merely converts to one."""
    if type(value) is bool:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def same_dtype(q_dtype, k_dtype, v_dtype) -> None:
    """q, k and v of one dtype (numpy's or torch's)."""
    for name, dtype in (("k", k_dtype), ("v", v_dtype)):
        if dtype != q_dtype:
            raise TypeError(
                f"q, k and v must have the same dtype, got q {q_dtype} and {name} {dtype}")


def qkv_shapes(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int]):
    """Checks [total, heads, head_dim] shapes (v may have a head_dim of its own, head_dim_v);
    returns (total_q, heads_q, total_k, heads_kv, d, d_v)."""
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != 3:
            raise ValueError(
                f"{name} must have 3 dimensions [total, heads, head_dim], got shape {tuple(shape)}")
    total_q, heads_q, d = q_shape
    total_k, heads_kv, d_k = k_shape
    d_v = v_shape[2]
    if tuple(v_shape[:2]) != tuple(k_shape[:2]):
        raise ValueError(
            "v must have the shape of k but for its last dimension [total_k, heads_kv, "
            f"head_dim_v], got k {tuple(k_shape)} and v {tuple(v_shape)}")
    if d_k != d:
        raise ValueError(
            f"q and k must have the same head_dim (last dimension), got q {d} and k {d_k}")
    if heads_q < 1 or heads_kv < 1:
        raise ValueError(f"heads must be >= 1, got heads_q={heads_q} (q) and heads_kv={heads_kv} (k, v)")
    if heads_q % heads_kv != 0:
        raise ValueError(
            f"the heads of q must be a multiple of the heads of k and v (GQA/MQA), got "
            f"heads_q={heads_q} and heads_kv={heads_kv}")
    if d < 1:
        raise ValueError(f"head_dim must be >= 1, got {d}")
    if d_v < 1:
        raise ValueError(f"the head_dim of v (head_dim_v) must be >= 1, got {d_v}")
    return total_q, heads_q, total_k, heads_kv, d, d_v


def layout(name: str, shape: Sequence[int], strides: Sequence[int], how_to_fix: str) -> Tuple[int, int]:
    """(token_stride, head_stride) in elements of a [total, heads, head_dim] tensor.

    ``strides`` are in elements. The last dimension must be contiguous; the strides of dimensions
    of size 1 (and of empty tensors) do not matter and are replaced by packed values.
    """
    total, heads, d = shape
    st, sh, sd = strides
    if total == 0:  # no element is addressed: strides are meaningless (numpy gives zeros)
        return int(heads * d), int(d)
    if d > 1 and sd != 1:
        raise ValueError(
            f"{name}: the last dimension (head_dim) must be contiguous (stride 1 element), got "
            f"stride {sd}; {how_to_fix}")
    if heads <= 1:
        sh = d
    if total <= 1:
        st = heads * sh
    if st <= 0 or sh <= 0:
        raise ValueError(
            f"{name}: token and head strides must be positive, got token_stride={st} "
            f"head_stride={sh} (broadcast or reversed views are not supported); {how_to_fix}")
    return int(st), int(sh)


def offsets_1d(name: str, shape: Sequence[int]) -> int:
    """The number of entries of 1-D offsets (batch + 1), as the shape holds it (not converted: a
    size that torch.compile traces symbolically stays symbolic, so a new batch size does not
    recompile)."""
    if len(shape) != 1:
        raise ValueError(f"{name} must be 1-D (batch + 1 offsets), got shape {tuple(shape)}")
    return shape[0]


def offsets_batch(name: str, n: int) -> int:
    """The batch size of offsets with n >= 1 entries."""
    if n < 1:
        raise ValueError(f"{name} must hold batch + 1 >= 1 offsets, got {n} entries")
    return n - 1


def offsets_count(name_q: str, n_q: int, name_k: str, n_k: int) -> int:
    """The batch size from the lengths of the two offsets arrays."""
    batch = offsets_batch(name_q, n_q)
    if n_k != n_q:
        raise ValueError(
            f"{name_q} and {name_k} must have the same length (batch + 1), got {n_q} and {n_k}")
    return batch


def seqlen_hint(name: str, value) -> int:
    """A max_seqlen hint: None means unknown (0); otherwise an int in [0, 2^31 - 1]."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    value = int(value)
    if value < 0 or value > INT32_MAX:
        raise ValueError(f"{name} must be in [0, 2^31 - 1] (0 or None = unknown), got {value}")
    return value


def scale_value(value: Optional[float]) -> float:
    """The softmax scale for the C struct: NaN selects the default 1/sqrt(head_dim)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(value).__name__}")
    value = float(value)
    # One comparison, false for NaN and the infinities too: it also holds for a value that
    # torch.compile traces symbolically (math.isfinite would break its graph).
    if not abs(value) <= FLOAT32_MAX:
        raise ValueError("softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), "
                         f"got {value}")
    return value


def window(window_size):
    """(left, right) of a window_size pair: ints >= 0, or -1 for unbounded."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    out = []
    for side, x in zip(("left", "right"), window_size):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"window_size {side} must be an int, got {type(x).__name__}")
        if x < -1 or x > INT32_MAX:
            raise ValueError(f"window_size {side} must be >= 0, or -1 for unbounded, got {x}")
        out.append(int(x))
    return tuple(out)


def softcap_value(softcap):
    """A softcap as a float: 0 (off) or a finite cap > 0."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    value = float(softcap)
    if not 0 <= value < math.inf:  # comparisons, not math.isfinite: traceable by torch.compile
        raise ValueError(f"softcap must be finite and >= 0 (0 = off), got {value}")
    return value
