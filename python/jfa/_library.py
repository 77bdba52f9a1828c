"""Locating and loading libjfa.so, and its C ABI declared through ctypes."""

from __future__ import annotations

import ctypes
import operator
import os
import threading
from pathlib import Path
from typing import List, Optional

from ._errors import SUCCESS, LibraryNotFoundError, error_from_status

LIBRARY_NAME = "libjfa.so"

# enum jfa_dtype
DTYPE_FLOAT16 = 0
DTYPE_BFLOAT16 = 1
DTYPE_FLOAT32 = 2

# enum jfa_backend
BACKEND_AUTO = 0
BACKEND_CPU = 1
BACKEND_CUDA = 2

_c_int64_p = ctypes.POINTER(ctypes.c_int64)
_c_int32_p = ctypes.POINTER(ctypes.c_int32)
_c_double_p = ctypes.POINTER(ctypes.c_double)


class TensorLayout(ctypes.Structure):
    """struct jfa_tensor_layout: strides in elements."""

    _fields_ = [("token_stride", ctypes.c_int64), ("head_stride", ctypes.c_int64)]


class AttentionParams(ctypes.Structure):
    """struct jfa_attention_params, field for field (enums are 32-bit ints)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int32),
        ("heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("q_layout", TensorLayout),
        ("k_layout", TensorLayout),
        ("v_layout", TensorLayout),
        ("out_layout", TensorLayout),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("backend", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("device_check", ctypes.POINTER(ctypes.c_int32)),
        ("head_dim_v", ctypes.c_int32),  # after 0.1.0: columns of v and out, 0 = head_dim
        # after head_dim_v: local attention (-1 unbounded), softcap (0 off), sinks (NULL or [heads_q])
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
    ]


class BackwardParams(ctypes.Structure):
    """struct jfa_attention_backward_params, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("forward", AttentionParams),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("dout_layout", TensorLayout),
        ("dq_layout", TensorLayout),
        ("dk_layout", TensorLayout),
        ("dv_layout", TensorLayout),
        ("dlse", ctypes.c_void_p),
        ("deterministic", ctypes.c_int),
        ("dsinks", ctypes.c_void_p),  # after head_dim_v: NULL or float32 [heads_q]
    ]


class PagedKv(ctypes.Structure):
    """struct jfa_paged_kv, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("num_pages", ctypes.c_int64),
        ("page_size", ctypes.c_int32),
        ("max_pages_per_seq", ctypes.c_int32),
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("cu_seqlens_new", ctypes.c_void_p),
        ("total_new", ctypes.c_int64),
    ]


_P = ctypes.POINTER(AttentionParams)
_B = ctypes.POINTER(BackwardParams)
_c_status = ctypes.c_int32

# name: (restype, argtypes)
_PROTOTYPES = {
    "jfa_attention_params_init_sized": (_c_status, [_P, ctypes.c_size_t]),
    "jfa_attention_forward": (_c_status, [_P]),
    "jfa_attention_workspace_size": (_c_status, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "jfa_attention_reference": (_c_status, [_P, _c_int64_p, ctypes.c_int64, _c_double_p, _c_double_p]),
    "jfa_paged_kv_init_sized": (_c_status, [ctypes.POINTER(PagedKv), ctypes.c_size_t]),
    "jfa_attention_forward_paged": (_c_status, [_P, ctypes.POINTER(PagedKv)]),
    "jfa_attention_paged_workspace_size": (
        _c_status, [_P, ctypes.POINTER(PagedKv), ctypes.POINTER(ctypes.c_size_t)]),
    "jfa_attention_reference_paged": (
        _c_status,
        [_P, ctypes.POINTER(PagedKv), _c_int64_p, ctypes.c_int64, _c_double_p, _c_double_p]),
    "jfa_attention_backward_params_init_sized": (_c_status, [_B, ctypes.c_size_t]),
    "jfa_attention_backward": (_c_status, [_B]),
    "jfa_attention_backward_workspace_size": (_c_status, [_B, ctypes.POINTER(ctypes.c_size_t)]),
    "jfa_attention_backward_reference": (_c_status, [_B, _c_double_p, _c_double_p, _c_double_p]),
    "jfa_attention_backward_reference_sinks": (
        _c_status, [_B, _c_double_p, _c_double_p, _c_double_p, _c_double_p]),
    "jfa_attention_flops": (
        _c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
         ctypes.c_int, _c_double_p],
    ),
    "jfa_attention_flops_v": (
        _c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
         ctypes.c_int32, ctypes.c_int, _c_double_p],
    ),
    "jfa_lengths_to_offsets": (_c_status, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]),
    "jfa_validate_offsets": (_c_status, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]),
    "jfa_max_length": (_c_status, [ctypes.c_void_p, ctypes.c_int64, _c_int32_p]),
    "jfa_jagged_to_padded": (
        _c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
         ctypes.c_int32, ctypes.c_double, ctypes.c_void_p],
    ),
    "jfa_padded_to_jagged": (
        _c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32,
         ctypes.c_int32, ctypes.c_void_p],
    ),
    "jfa_last_error_message": (ctypes.c_char_p, []),
    "jfa_device_check_message": (ctypes.c_char_p, [ctypes.c_int32]),
    "jfa_status_string": (ctypes.c_char_p, [ctypes.c_int32]),
    "jfa_version": (ctypes.c_char_p, []),
    "jfa_dtype_size": (ctypes.c_size_t, [ctypes.c_int32]),
    "jfa_cuda_available": (ctypes.c_int, []),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def candidate_paths() -> List[str]:
    """Where libjfa.so is looked for, in order.

    1. ``$JFA_LIBRARY`` (a file, or a directory holding libjfa.so); when set, nothing else is
       tried.
    2. The copy inside the installed package (next to this file).
    3. When running from a source checkout: build/release/src, build/cpu/src and
       build/python/src under the repository root.
    """
    env = os.environ.get("JFA_LIBRARY")
    if env:
        p = Path(env)
        return [str(p / LIBRARY_NAME) if p.is_dir() else str(p)]
    here = Path(__file__).resolve().parent
    paths = [here / LIBRARY_NAME]
    root = here.parent.parent  # python/jfa -> repository root
    if (root / "include" / "jfa" / "jfa.h").is_file():
        for build in ("release", "cpu", "python"):
            paths.append(root / "build" / build / "src" / LIBRARY_NAME)
    return [str(p) for p in paths]


def open_library(path: str) -> ctypes.CDLL:
    """The libjfa.so at path with its C ABI declared, apart from the package's own copy (lib()):
    for callers that time a given build, or several at once (bench/). OSError when it does not
    load; LibraryNotFoundError (an OSError) when it lacks entry points."""
    lib = ctypes.CDLL(path)
    missing = [name for name in _PROTOTYPES if not hasattr(lib, name)]
    if missing:
        raise LibraryNotFoundError(f"lacks {', '.join(missing)}: an older libjfa?")
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _load() -> ctypes.CDLL:
    tried = []
    for path in candidate_paths():
        if not os.path.isfile(path):
            tried.append(f"{path} (not found)")
            continue
        try:
            lib = open_library(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        global _lib_path
        _lib_path = path
        return lib
    hint = ("set JFA_LIBRARY to the path of libjfa.so, install the package with "
            "`pip install .`, or build the library with "
            "`cmake --preset release && cmake --build --preset release`")
    raise LibraryNotFoundError("cannot load libjfa.so; tried: " + "; ".join(tried) + ". " + hint)


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib


def library_path() -> str:
    """The path libjfa.so was loaded from (loads it if needed)."""
    lib()
    assert _lib_path is not None
    return _lib_path


def check(status: int, function: str, library: Optional[ctypes.CDLL] = None) -> None:
    """Raises the JfaError of a failed status, with the library's message of this thread.

    library: the libjfa that returned status, when not lib() (one from open_library)."""
    if status != SUCCESS:
        raw = (lib() if library is None else library).jfa_last_error_message()
        message = raw.decode("utf-8", "replace") if raw else ""
        raise error_from_status(status, message, function)


def call(name: str, *args) -> None:
    """Calls a status-returning entry point and raises on failure."""
    check(getattr(lib(), name)(*args), name)


def new_params() -> AttentionParams:
    """A jfa_attention_params of this layout filled by jfa_attention_params_init_sized()."""
    p = AttentionParams()
    call("jfa_attention_params_init_sized", ctypes.byref(p), ctypes.sizeof(p))
    return p


def new_paged_kv() -> PagedKv:
    """A jfa_paged_kv filled by jfa_paged_kv_init_sized()."""
    kv = PagedKv()
    call("jfa_paged_kv_init_sized", ctypes.byref(kv), ctypes.sizeof(kv))
    return kv


def new_backward_params() -> BackwardParams:
    """A jfa_attention_backward_params filled by jfa_attention_backward_params_init_sized()."""
    p = BackwardParams()
    call("jfa_attention_backward_params_init_sized", ctypes.byref(p), ctypes.sizeof(p))
    return p


def version() -> str:
    """The version string of the loaded libjfa."""
    return lib().jfa_version().decode()


def device_check_message(word: int) -> str:
    """What a word of the checked mode says (``device_check`` of
    jfa.jagged_attention): "valid" for 0, else the rules the offsets broke, joined by "; "."""
    if isinstance(word, bool):
        raise TypeError("word must be an int, got bool")
    try:
        word = operator.index(word)
    except TypeError:
        raise TypeError(f"word must be an int, got {type(word).__name__}") from None
    if not -2**31 <= word < 2**31:
        raise ValueError(f"word must fit in int32, got {word}")
    return lib().jfa_device_check_message(word).decode()


def cuda_available() -> bool:
    """Whether the loaded libjfa has the CUDA backend and sees a supported (Hopper) GPU."""
    return bool(lib().jfa_cuda_available())
