"""libjfa's C entry for the benchmark scripts, through the jfa package of this checkout.

The scripts time the C entry of a build they are given (several at once in tune_sm90.py), which
the package's API does not expose: a Library is such a build loaded with the package's prototypes
and structs (python/jfa/_library.py), raising the package's JfaError with that build's message.
Pointers are plain integers (``tensor.data_ptr()``, ``array.ctypes.data``), so the same calls
serve CUDA tensors and host buffers.

    lib = Library("build/gpu/src/libjfa.so")
    p = lib.params(q=..., k=..., v=..., out=..., cu_seqlens_q=..., batch=..., total_q=...,
                   heads_q=16, head_dim=128, dtype="fp16", causal=True, backend="cuda", stream=s)
    run = lib.forward_fn(p)

This is the one place the scripts put python/ on sys.path, first: a source checkout needs no pip
install, and an installed jfa of another version is not the one measured. Importing this module
imports jfa, hence torch when installed, which loads the package's own libjfa: a script that sets
JFA_LIBRARY or must start without torch imports it late.
"""
import ctypes
import glob
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

from jfa import _library  # noqa: E402
from jfa._errors import SUCCESS  # noqa: E402

DTYPES = {"fp16": _library.DTYPE_FLOAT16, "bf16": _library.DTYPE_BFLOAT16,
          "fp32": _library.DTYPE_FLOAT32}
BACKENDS = {"auto": _library.BACKEND_AUTO, "cpu": _library.BACKEND_CPU,
            "cuda": _library.BACKEND_CUDA}


def find_library(path=None, search_root="."):
    """The given path, else the newest build*/**/src/libjfa.so under search_root; None if none.
    Not jfa's own search: benchmark builds live in any build directory (build/gpu, build/tune-*)."""
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


class Library:
    """A libjfa build with the calls the benchmarks make."""

    def __init__(self, path, lib=None):
        """lib: path already loaded by the package (jfa._library.lib()); else it is loaded here."""
        self.path = path
        self.lib = _library.open_library(path) if lib is None else lib

    def version(self):
        return self.lib.jfa_version().decode()

    def cuda_available(self):
        return bool(self.lib.jfa_cuda_available())

    def reload_tuning_switches(self):
        """Makes a tuning build read its JFA_SM90_* variables again (they are read once per
        process); a no-op for a shipped build, which reads none."""
        reload = getattr(self.lib, "jfa_sm90_reload_tuning_switches", None)
        if reload is not None:
            reload.restype = None
            reload()

    def check(self, status, function):
        _library.check(status, function, self.lib)

    def params(self, *, q, k, v, out, cu_seqlens_q, batch, total_q, heads_q, head_dim, dtype,
               cu_seqlens_k=None, total_k=None, heads_kv=None, causal=False, softmax_scale=None,
               max_seqlen_q=0, max_seqlen_k=0, backend="cuda", stream=None, lse=None):
        """A filled jfa_attention_params (packed layouts). Pointers are integers (or None)."""
        # The sized init: the plain one writes the 0.1.0 struct size, whose calls ignore the
        # fields added since (head_dim_v among them).
        p = _library.AttentionParams()
        self.check(self.lib.jfa_attention_params_init_sized(ctypes.byref(p), ctypes.sizeof(p)),
                   "jfa_attention_params_init_sized")
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
        self.check(self.lib.jfa_attention_workspace_size(ctypes.byref(params), ctypes.byref(size)),
                   "jfa_attention_workspace_size")
        return size.value

    def forward_fn(self, params):
        """A zero-argument callable running the forward on fixed params (cheap to call in loops)."""
        fwd = self.lib.jfa_attention_forward
        ref = ctypes.byref(params)
        check = self.check

        def run():
            s = fwd(ref)
            if s != SUCCESS:
                check(s, "jfa_attention_forward")

        run.params = params  # keeps params alive as long as the callable
        return run
