"""bench/transformers_step.py: its arguments, why flash_attention_3 is skipped where it cannot run,
which FA3 op library and which dense attention (sdpa, or eager where the model cannot use sdpa) a
model gets, and smoke runs of tiny models on the CPU (every method checked against the model run
on each sequence alone, sdpa or eager, before it is timed)."""
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
    args = ts.parse_args(["--model", "gpt_oss", "--methods", "jfa,eager_padded,eager_per_sequence"])
    assert args.model == "gpt_oss" and args.methods == ["jfa", *ts.EAGER_METHODS]
    with pytest.raises(SystemExit):
        ts.parse_args(["--model", "mistral"])


def test_fa3_options_default_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FA3_LIB", raising=False)
    monkeypatch.delenv("FA3_FULL_LIB", raising=False)
    monkeypatch.setattr(ts, "FA3_FULL_LIB_IN_CHECKOUT", str(tmp_path / "fa3_full_bf16.so"))
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


def test_fa3_lib_defaults_to_the_build_with_windows_and_softcap_where_the_model_needs_it(
        monkeypatch, tmp_path):
    for name in ("FA3_LIB", "FA3_FULL_LIB"):
        monkeypatch.delenv(name, raising=False)
    varlen, full = tmp_path / "fa3_varlen.so", tmp_path / "fa3_full_bf16.so"
    monkeypatch.setattr(ts, "FA3_LIB_IN_CHECKOUT", str(varlen))
    monkeypatch.setattr(ts, "FA3_FULL_LIB_IN_CHECKOUT", str(full))
    varlen.write_text("")

    def lib(*argv):
        return ts.parse_args(list(argv)).fa3_lib

    # No full build in the checkout: the varlen one, whose forward has no windows or softcap.
    assert lib("--model", "gemma2") == lib("--model", "llama") == str(varlen)
    full.write_text("")
    for model in ("gemma2", "gpt_oss"):  # windows (and softcap): the full build
        assert lib("--model", model) == str(full)
    for model in ("llama", "qwen2"):
        assert lib("--model", model) == str(varlen)
    # $FA3_LIB names the default build; the full one still goes first for Gemma 2, and
    # $FA3_FULL_LIB (as scripts/gpu-check.sh exports it) before the checkout's.
    monkeypatch.setenv("FA3_LIB", "/opt/varlen.so")
    assert (lib("--model", "gemma2"), lib("--model", "llama")) == (str(full), "/opt/varlen.so")
    monkeypatch.setenv("FA3_FULL_LIB", "/opt/full.so")
    assert lib("--model", "gemma2") == "/opt/full.so"
    assert lib("--model", "gemma2", "--fa3-lib", "mine.so") == "mine.so"


def test_fa3_failure_on_windows_or_softcap_names_the_build_to_pass():
    hint = ts.fa3_lib_hint("gemma2", "/x/fa3_varlen.so")
    assert "gemma2 needs FA3 built with sliding windows and softcap" in hint
    assert "fa3_varlen.so may lack" in hint and "--fa3-lib .peers/fa3_full_bf16.so" in hint
    assert "the wrapper's own may lack" in ts.fa3_lib_hint("gemma2", None)
    assert ts.fa3_lib_hint("gemma2", "/x/fa3_full_bf16.so") == ""
    assert ts.fa3_lib_hint("llama", "/x/fa3_varlen.so") == ""


def test_flash_attention_is_skipped_for_sinks():
    for method in ts.FLASH:
        reason = ts.sinks_skip_reason(method, "gpt_oss")
        assert f"FlashAttention-{method[-1]} takes no attention sinks" in reason
        assert f"transformers' {method} would swap in" in reason
        for model in ("llama", "qwen2", "gemma2"):
            assert ts.sinks_skip_reason(method, model) == ""
    for method in ("jfa", "sdpa_padded", "eager_per_sequence"):
        assert ts.sinks_skip_reason(method, "gpt_oss") == ""


def test_sdpa_methods_turn_eager_where_the_model_cannot_use_sdpa():
    methods = ["jfa", "sdpa_padded", "sdpa_per_sequence", "eager_padded"]
    assert ts.resolve_methods(methods, "sdpa") == [(m, None) for m in methods]
    assert ts.resolve_methods(methods, "eager") == [
        ("jfa", None), ("eager_padded", "sdpa_padded"),
        ("eager_per_sequence", "sdpa_per_sequence")]  # eager_padded once
    assert [ts.method_attention(m) for m in ts.METHODS + ts.EAGER_METHODS] == [
        "jfa", "flash_attention_2", "flash_attention_3", "sdpa", "sdpa", "eager", "eager"]
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    for tiny in (True, False):
        got = {m: ts.dense_attention(transformers, ts.model_config(transformers, m, 2, tiny))
               for m in ts.MODELS}
        assert got == {"llama": "sdpa", "qwen2": "sdpa", "gemma2": "eager", "gpt_oss": "eager"}


def test_model_shapes():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    gemma2 = ts.model_config(transformers, "gemma2", 4, False)
    assert (gemma2.sliding_window, gemma2.attn_logit_softcapping, gemma2.head_dim) == \
        (4096, 50.0, 128)
    oss = ts.model_config(transformers, "gpt_oss", 4, False)
    assert (oss.hidden_size, oss.num_attention_heads, oss.num_key_value_heads, oss.head_dim) == \
        (2048, 32, 8, 64)
    assert oss.sliding_window == 128 and oss.layer_types[:2] == ["sliding_attention",
                                                                 "full_attention"]
    assert oss.num_local_experts == oss.num_experts_per_tok == 2  # every token to every expert
    assert oss.intermediate_size * 2 == ts.model_config(transformers, "llama", 4,
                                                        False).intermediate_size
    for model in ("gemma2", "gpt_oss"):
        assert ts.model_config(transformers, model, 2, True).sliding_window == 16


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
    for r in doc["results"]:  # llama's records keep their fields (the README cites them)
        assert not {"reference", "replaces", "fa3_lib"} & set(r), r


def _smoke(tmp_path, capsys, model):
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import jfa
    if not jfa.torch_available():
        pytest.skip(f"jfa's torch path is unavailable: {jfa.torch_unavailable_reason()}")
    out = tmp_path / "step.json"
    # Sequences longer than the tiny models' window of 16 keys, and one of 7 inside it.
    assert ts.main(["--tiny", "--model", model, "--lengths", "30,7,50", "--layers", "2",
                    "--steps", "2", "--warmup", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    by = {r["method"]: r for r in doc["results"]}
    assert list(by) == ["jfa", "flash_attention_2", "flash_attention_3", *ts.EAGER_METHODS]
    for method in ("jfa", *ts.EAGER_METHODS):
        r = by[method]
        assert r["status"] == "timed", r
        assert r["tokens_per_s"] > 0 and r["max_rel_error"] < 1e-4 and r["tokens"] == 87
    for r in doc["results"]:
        assert r["reference"] == "eager_per_sequence" and r["model"] == model
    assert by["eager_padded"]["replaces"] == "sdpa_padded"
    assert by["eager_per_sequence"]["replaces"] == "sdpa_per_sequence"
    assert "replaces" not in by["jfa"]
    printed = capsys.readouterr().out
    assert "| eager_padded | timed |" in printed and "| sdpa_" not in printed
    assert "- every method checked against eager_per_sequence: the model cannot use sdpa" in printed
    assert "- eager_padded in place of sdpa_padded" in printed
    return by


def test_tiny_gemma2_smoke_run_times_jfa_and_eager(tmp_path, capsys):
    by = _smoke(tmp_path, capsys, "gemma2")
    fa3 = by["flash_attention_3"]
    assert fa3["status"] == "unavailable" and "needs a CUDA GPU" in fa3["reason"]
    assert "fa3_lib" in fa3  # which build Gemma 2's windows and softcap went to
    assert by["flash_attention_2"]["status"] in ("timed", "unavailable")


def test_tiny_gpt_oss_smoke_run_times_jfa_and_eager_and_skips_flash_for_sinks(tmp_path, capsys):
    by = _smoke(tmp_path, capsys, "gpt_oss")
    for method in ts.FLASH:
        r = by[method]
        assert r["status"] == "unavailable" and "takes no attention sinks" in r["reason"], r
