"""bench/libjfa.py, the benchmarks' C entry over the package's binding, on the CPU backend (the
benchmarks call it on CUDA tensors on a GPU machine)."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import jfa
from jfa import _library

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import libjfa  # noqa: E402


def _inputs(rng, lengths, heads=2, head_dim=32):
    total = sum(lengths)
    q, k, v = (rng.standard_normal((total, heads, head_dim)).astype(np.float32) for _ in range(3))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return q, k, v, cu


def _params(lib, q, k, v, out, cu, causal):
    total, heads, d = q.shape
    return lib.params(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data, out=out.ctypes.data,
                      cu_seqlens_q=cu.ctypes.data, batch=cu.size - 1, total_q=total, heads_q=heads,
                      head_dim=d, dtype="fp32", causal=causal, backend="cpu")


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_the_package(rng, causal):
    lib = libjfa.Library(jfa.library_path())
    q, k, v, cu = _inputs(rng, [5, 17, 1, 9])
    out = np.full_like(q, np.nan)
    p = _params(lib, q, k, v, out, cu, causal)
    assert lib.workspace_size(p) >= 0
    lib.forward_fn(p)()
    want = jfa.jagged_attention(q, k, v, cu, causal=causal)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_params_carry_the_fields_added_since_0_1_0(rng):
    """A value head size of its own (192/128 in the benchmarks) reaches the library: params of the
    0.1.0 size would drop head_dim_v, and the call would read out as head_dim columns wide."""
    lib = libjfa.Library(jfa.library_path())
    q, k, _, cu = _inputs(rng, [5, 17, 1, 9], head_dim=24)
    v = rng.standard_normal((q.shape[0], q.shape[1], 16)).astype(np.float32)
    # out followed at once by the workspace, as a caching allocator lays them out.
    block = np.full(q.shape[0] * q.shape[1] * 16 + 64, np.nan, dtype=np.float32)
    out = block[:-64].reshape(q.shape[0], q.shape[1], 16)
    p = _params(lib, q, k, v, out, cu, True)
    p.head_dim_v = 16
    p.workspace, p.workspace_bytes = block[-64:].ctypes.data, 64 * 4
    lib.forward_fn(p)()
    np.testing.assert_allclose(out, jfa.jagged_attention(q, k, v, cu, causal=True), rtol=1e-6,
                               atol=1e-6)


def test_the_package_copy_and_errors_carry_the_library_message(rng):
    lib = libjfa.Library(jfa.library_path(), _library.lib())
    assert lib.lib is _library.lib()
    assert lib.version() == jfa.version() and lib.cuda_available() == jfa.cuda_available()
    q, k, v, cu = _inputs(rng, [4, 4])
    out = np.empty_like(q)
    p = _params(lib, q, k, v, out, cu, False)
    p.heads_q = 0
    with pytest.raises(jfa.JfaInvalidArgumentError, match="heads_q") as e:
        lib.forward_fn(p)()
    assert e.value.function == "jfa_attention_forward"


def test_find_library_and_the_cli_next_to_it(tmp_path):
    assert libjfa.find_library("given.so", str(tmp_path)) == "given.so"
    assert libjfa.find_library(None, str(tmp_path)) is None
    paths = []
    for i, build in enumerate(("a", "b/nested")):
        (tmp_path / "build" / build / "src").mkdir(parents=True)
        path = tmp_path / "build" / build / "src" / "libjfa.so"
        path.write_bytes(b"")
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(str(path))
    assert libjfa.find_library(None, str(tmp_path)) == paths[1]
    assert libjfa.cli_next_to(paths[0]) is None
    (tmp_path / "build" / "a" / "tools").mkdir()
    (tmp_path / "build" / "a" / "tools" / "jfa").write_bytes(b"")
    assert libjfa.cli_next_to(paths[0]) == str(tmp_path / "build" / "a" / "tools" / "jfa")
    assert libjfa.cli_next_to(None) is None


def test_a_library_without_the_entry_points_is_refused():
    with pytest.raises(jfa.LibraryNotFoundError, match="lacks jfa_"):
        libjfa.Library("libc.so.6")
