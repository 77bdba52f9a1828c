"""bench/backward_speed.py: its FLOP count is the library's, and a CPU run completes."""

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

import jfa
from jfa import _library

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}", allow_module_level=True)

import backward_speed  # noqa: E402


@pytest.mark.parametrize("causal", [False, True])
def test_flops_match_the_library(causal):
    lengths = [5, 0, 17, 64]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    flops = ctypes.c_double(0)
    _library.call("jfa_attention_flops", cu.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                  cu.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), len(lengths), 4, 32,
                  1 if causal else 0, ctypes.byref(flops))
    assert backward_speed.useful_flops(lengths, 4, 32, causal) == flops.value


def test_cpu_run(capsys):
    assert backward_speed.main(["--lengths", "40,7", "--heads", "2", "--head-dim", "16",
                                "--runs", "2", "--causal"]) == 0
    line = capsys.readouterr().out
    assert "backward" in line and "GFLOP/s" in line
