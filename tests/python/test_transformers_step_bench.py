"""bench/transformers_step.py: its arguments, and a smoke run of a tiny model on the CPU (every
method checked against per-sequence sdpa before it is timed)."""
import importlib.util
import json
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
