"""Loading libjfa, the ctypes declaration of the C ABI, version and capabilities."""

import ctypes
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jfa
from jfa import _library

ROOT = Path(__file__).resolve().parents[2]
HEADER_DIR = ROOT / "include"


def test_version_and_capabilities():
    assert jfa.version() == jfa.__version__
    assert isinstance(jfa.cuda_available(), bool)
    assert os.path.isfile(jfa.library_path())


def test_params_init_defaults():
    p = _library.new_params()
    assert math.isnan(p.softmax_scale)
    assert p.backend == _library.BACKEND_AUTO and p.dtype == _library.DTYPE_FLOAT16
    assert p.q is None and p.batch == 0 and p.causal == 0 and p.stream is None


def test_struct_layout_matches_header(tmp_path):
    """Offsets and size of jfa_attention_params as the C compiler sees them."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not (HEADER_DIR / "jfa" / "jfa.h").is_file():
        pytest.skip("needs a C compiler and include/jfa/jfa.h (a source checkout)")
    fields = [name for name, _ in _library.AttentionParams._fields_]
    src = tmp_path / "layout.c"
    src.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"jfa/jfa.h\"\nint main(void) {\n"
        '  printf("sizeof %zu\\n", sizeof(jfa_attention_params));\n'
        + "".join(f'  printf("{f} %zu\\n", offsetof(jfa_attention_params, {f}));\n' for f in fields)
        + '  printf("layout %zu\\n", sizeof(jfa_tensor_layout));\n  return 0;\n}\n')
    exe = tmp_path / "layout"
    subprocess.run([cc, f"-I{HEADER_DIR}", str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines())
    assert int(got["sizeof"]) == ctypes.sizeof(_library.AttentionParams)
    assert int(got["layout"]) == ctypes.sizeof(_library.TensorLayout)
    for f in fields:
        assert int(got[f]) == getattr(_library.AttentionParams, f).offset, f


def _run(code, **env):
    full_env = dict(os.environ, **env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(Path(jfa.__file__).parents[1]),
                                              full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=60)


def test_jfa_library_env_not_found(tmp_path):
    missing = tmp_path / "nowhere" / "libjfa.so"
    r = _run("import jfa\n"
             "try:\n    jfa.version()\n"
             "except jfa.LibraryNotFoundError as e:\n    print('ERR', e)\n",
             JFA_LIBRARY=str(missing), JFA_DISABLE_TORCH="1")
    assert r.returncode == 0, r.stderr
    assert "ERR cannot load libjfa.so" in r.stdout and str(missing) in r.stdout
    assert "JFA_LIBRARY" in r.stdout


def test_jfa_library_env_directory():
    lib_dir = str(Path(jfa.library_path()).parent)
    r = _run("import jfa; print(jfa.library_path())", JFA_LIBRARY=lib_dir, JFA_DISABLE_TORCH="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(lib_dir, "libjfa.so")


def test_numpy_only_import():
    """With torch disabled the package imports and runs on numpy alone."""
    r = _run("import sys, numpy as np, jfa\n"
             "assert 'torch' not in sys.modules and not jfa.torch_available()\n"
             "q = np.ones((3, 1, 4), np.float32)\n"
             "print(jfa.jagged_attention(q, q, q, [0, 3]).sum())\n",
             JFA_DISABLE_TORCH="1")
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == pytest.approx(12.0)
