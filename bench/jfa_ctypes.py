"""ctypes binding of libjfa's C ABI (include/jfa/jfa.h) for the benchmark scripts.

Besides the standard library only the jfa package's struct layouts are imported (the package loads
without torch), so the module loads on machines without torch or a GPU. Pointers are plain integers (e.g. torch's ``tensor.data_ptr()``), so the same binding serves
CUDA tensors and host buffers (numpy's ``array.ctypes.data``).

    lib = JfaLib("build/gpu/src/libjfa.so")
    p = lib.params(q=..., k=..., v=..., out=..., cu_seqlens_q=..., batch=..., total_q=...,
                   heads_q=16, head_dim=128, dtype="fp16", causal=True, backend="cuda", stream=s)
    lib.forward(p)          # raises JfaError with the library's message on failure
"""
import ctypes
import glob
import math
import os
import sys

# The struct layouts come from the jfa package, whose tests check them against jfa.h.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jfa._library import AttentionParams, TensorLayout  # noqa: E402,F401

# Enumerations of jfa.h.
JFA_SUCCESS = 0
DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
STATUS_NAMES = {
    0: "JFA_SUCCESS",
    1: "JFA_ERROR_INVALID_ARGUMENT",
    2: "JFA_ERROR_UNSUPPORTED",
    3: "JFA_ERROR_BACKEND_UNAVAILABLE",
    4: "JFA_ERROR_CUDA",
    5: "JFA_ERROR_OUT_OF_MEMORY",
    6: "JFA_ERROR_INTERNAL",
}


class JfaError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {message}")
        self.status = status


def find_library(path=None, search_root="."):
    """The given path, else the newest build*/**/src/libjfa.so under search_root; None if none."""
    if path:
        return path
    hits = glob.glob(os.path.join(search_root, "build", "**", "src", "libjfa.so"), recursive=True)
    hits = [h for h in hits if os.path.isfile(h)]
    if not hits:
        return None
    return max(hits, key=os.path.getmtime)


def cli_next_to(lib_path):
    """The jfa CLI of the build tree holding lib_path (<build>/src/libjfa.so -> <build>/tools/jfa)."""
    if not lib_path:
        return None
    build = os.path.dirname(os.path.dirname(os.path.abspath(lib_path)))
    cand = os.path.join(build, "tools", "jfa")
    return cand if os.path.isfile(cand) else None


class JfaLib:
    """A loaded libjfa with typed entry points."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        L = self.lib
        P = ctypes.POINTER(AttentionParams)
        L.jfa_attention_params_init.restype = ctypes.c_int
        L.jfa_attention_params_init.argtypes = [P]
        L.jfa_attention_forward.restype = ctypes.c_int
        L.jfa_attention_forward.argtypes = [P]
        L.jfa_attention_workspace_size.restype = ctypes.c_int
        L.jfa_attention_workspace_size.argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
        L.jfa_attention_flops.restype = ctypes.c_int
        L.jfa_attention_flops.argtypes = [
            ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.c_int64,
            ctypes.c_int32, ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        L.jfa_last_error_message.restype = ctypes.c_char_p
        L.jfa_last_error_message.argtypes = []
        L.jfa_version.restype = ctypes.c_char_p
        L.jfa_version.argtypes = []
        L.jfa_cuda_available.restype = ctypes.c_int
        L.jfa_cuda_available.argtypes = []

    # -- small queries --------------------------------------------------------------------------
    def version(self):
        return self.lib.jfa_version().decode()

    def cuda_available(self):
        return bool(self.lib.jfa_cuda_available())

    def last_error(self):
        msg = self.lib.jfa_last_error_message()
        return msg.decode(errors="replace") if msg else ""

    def check(self, status):
        if status != JFA_SUCCESS:
            raise JfaError(status, self.last_error())

    # -- attention ------------------------------------------------------------------------------
    def params(self, *, q, k, v, out, cu_seqlens_q, batch, total_q, heads_q, head_dim, dtype,
               cu_seqlens_k=None, total_k=None, heads_kv=None, causal=False, softmax_scale=None,
               max_seqlen_q=0, max_seqlen_k=0, backend="cuda", stream=None, lse=None):
        """A filled jfa_attention_params (packed layouts). Pointers are integers (or None)."""
        p = AttentionParams()
        self.check(self.lib.jfa_attention_params_init(ctypes.byref(p)))
        p.q, p.k, p.v, p.out = q, k, v, out
        p.lse = lse
        p.cu_seqlens_q = cu_seqlens_q
        p.cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
        p.batch = int(batch)
        p.total_q = int(total_q)
        p.total_k = int(total_q if total_k is None else total_k)
        p.heads_q = int(heads_q)
        p.heads_kv = int(heads_q if heads_kv is None else heads_kv)
        p.head_dim = int(head_dim)
        p.dtype = DTYPES[dtype] if isinstance(dtype, str) else int(dtype)
        if softmax_scale is not None:
            p.softmax_scale = float(softmax_scale)
        p.causal = 1 if causal else 0
        p.max_seqlen_q = int(max_seqlen_q)
        p.max_seqlen_k = int(max_seqlen_k)
        p.backend = BACKENDS[backend] if isinstance(backend, str) else int(backend)
        p.stream = stream
        return p

    def workspace_size(self, params):
        """Bytes of device workspace a forward with these params needs."""
        size = ctypes.c_size_t(0)
        self.check(self.lib.jfa_attention_workspace_size(ctypes.byref(params), ctypes.byref(size)))
        return size.value

    def forward(self, params):
        self.check(self.lib.jfa_attention_forward(ctypes.byref(params)))

    def forward_fn(self, params):
        """A zero-argument callable running the forward on fixed params (cheap to call in loops)."""
        fwd = self.lib.jfa_attention_forward
        ref = ctypes.byref(params)
        check = self.check

        def run():
            s = fwd(ref)
            if s != JFA_SUCCESS:
                check(s)

        run.params = params  # keeps params alive as long as the callable
        return run

    def flops(self, lengths_q, lengths_k, heads_q, head_dim, causal):
        """Useful forward FLOPs by the library's own count (jfa_attention_flops)."""
        lengths_k = lengths_q if lengths_k is None else lengths_k
        n = len(lengths_q)
        cu_q = (ctypes.c_int32 * (n + 1))()
        cu_k = (ctypes.c_int32 * (n + 1))()
        for i in range(n):
            cu_q[i + 1] = cu_q[i] + int(lengths_q[i])
            cu_k[i + 1] = cu_k[i] + int(lengths_k[i])
        out = ctypes.c_double(math.nan)
        self.check(self.lib.jfa_attention_flops(cu_q, cu_k, n, heads_q, head_dim,
                                                1 if causal else 0, ctypes.byref(out)))
        return out.value
