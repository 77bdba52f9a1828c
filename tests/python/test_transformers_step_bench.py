"""bench/transformers_step.py: its arguments, why flash_attention_3 is skipped where it cannot run,
and a smoke run of a tiny model on the CPU (every method checked against per-sequence sdpa before
it is timed)."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("transformers_step", BENCH / "transformers_step.py")
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)


def test_arguments_are_checked(capsys):
    args = ts.parse_args(["--lengths", "3,5", "--methods", "jfa,sdpa_padded"])
    assert args.lengths == [3, 5] and args.methods == ["jfa", "sdpa_padded"]
    assert ts.parse_args([]).methods == list(ts.METHODS)
    for bad in (["--methods", "flash"], ["--lengths", "3,0"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            ts.parse_args(bad)
    assert "unknown method 'flash'" in capsys.readouterr().err


def test_fa3_options_default_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FA3_LIB", raising=False)
    monkeypatch.setenv("FA3_PYTHON", str(tmp_path))
    monkeypatch.setattr(ts, "FA3_LIB_IN_CHECKOUT", str(tmp_path / "fa3_varlen.so"))
    args = ts.parse_args(["--methods", "flash_attention_3"])
    assert args.methods == ["flash_attention_3"] and args.fa3_python == str(tmp_path)
    assert args.fa3_lib is None
    (tmp_path / "fa3_varlen.so").write_text("")  # the checkout's, where there is one
    assert ts.parse_args([]).fa3_lib == str(tmp_path / "fa3_varlen.so")
    monkeypatch.delenv("FA3_PYTHON")
    monkeypatch.setattr(ts, "FA3_PYTHON_IN_CHECKOUT", str(tmp_path))
    assert ts.parse_args([]).fa3_python == str(tmp_path)
    monkeypatch.setattr(ts, "FA3_PYTHON_IN_CHECKOUT", str(tmp_path / "none"))
    assert ts.parse_args([]).fa3_python is None
    monkeypatch.setenv("FA3_LIB", "/opt/fa3.so")
    args = ts.parse_args(["--fa3-python", "elsewhere", "--fa3-lib", "mine.so"])
    assert (args.fa3_python, args.fa3_lib) == ("elsewhere", "mine.so")
    assert ts.parse_args([]).fa3_lib == "/opt/fa3.so"
    assert "flash_attention_3" in ts.METHODS and "flash_attention_3" in ts.PACKED


def test_flash_attention_3_says_why_it_is_skipped(tmp_path, monkeypatch):
    # Where FlashAttention-3's wrapper is installed (or on PYTHONPATH), the test does not see it.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.exists(
        os.path.join(p or ".", "flash_attn_interface.py"))])
    # No wrapper imported before, and none left behind: what the test imports goes at its end.
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.delitem(sys.modules, "flash_attn_interface")
    assert ts.fa3_skip_reason("cpu", "bf16") == \
        "flash_attention_3 needs a CUDA GPU (this run is on the CPU)"
    assert ts.fa3_skip_reason("cuda", "fp32") == \
        "FlashAttention-3 takes fp16 and bf16 only (--dtype fp32)"
    missing = tmp_path / "no-such-dir"
    reason = ts.fa3_skip_reason("cuda", "bf16", str(missing))
    assert reason.startswith("FlashAttention-3's Python wrapper flash_attn_interface does not "
                             "import (ModuleNotFoundError")
    assert f"--fa3-python {missing} is not a directory" in reason
    assert "pass --fa3-python DIR" in reason
    # A wrapper that imports, and a transformers that does or does not see FlashAttention-3.
    wrapper = tmp_path / "fa3"
    wrapper.mkdir()
    (wrapper / "flash_attn_interface.py").write_text("def flash_attn_varlen_func(): pass\n")
    assert ts.fa3_import_reason(str(wrapper)) == ""
    assert sys.path[0] == str(wrapper)

    class Transformers:
        class utils:
            @staticmethod
            def is_flash_attn_3_available():
                return False

    assert "is_flash_attn_3_available() is False" in ts.fa3_skip_reason(
        "cuda", "fp16", str(wrapper), Transformers)
    Transformers.utils.is_flash_attn_3_available = staticmethod(lambda: True)
    assert ts.fa3_skip_reason("cuda", "fp16", str(wrapper), Transformers) == ""
    # A wrapper that fails on import (its op library missing) says how.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "flash_attn_interface.py").write_text("raise ImportError('no fa3_varlen.so')\n")
    del sys.modules["flash_attn_interface"]
    assert "(ImportError: no fa3_varlen.so)" in ts.fa3_import_reason(str(broken))


def test_tiny_smoke_run_times_every_available_method(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import jfa
    if not jfa.torch_available():
        pytest.skip(f"jfa's torch path is unavailable: {jfa.torch_unavailable_reason()}")
    out = tmp_path / "step.json"
    assert ts.main(["--tiny", "--lengths", "1,7,16,17,5", "--layers", "2", "--steps", "2",
                    "--warmup", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    by = {r["method"]: r for r in doc["results"]}
    assert set(by) == set(ts.METHODS) and doc["lengths"] == [1, 7, 16, 17, 5]
    for method in ("jfa", "sdpa_padded", "sdpa_per_sequence"):
        r = by[method]
        assert r["status"] == "timed", r
        assert r["tokens_per_s"] > 0 and r["max_rel_error"] < 1e-4 and r["tokens"] == 46
    assert by["flash_attention_2"]["status"] in ("timed", "unavailable")
    fa3 = by["flash_attention_3"]
    assert fa3["status"] == "unavailable" and "needs a CUDA GPU" in fa3["reason"]
