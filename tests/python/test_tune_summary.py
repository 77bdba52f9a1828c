"""The merged table of bench/tune_sm90.py (no GPU needed): medians over rounds, spreads, failed
measurements shown by status, workload order, settings parsing."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import tune_sm90  # noqa: E402


def record(workload, variant, tflops, causal=False, status="ok", round_index=0):
    return {"workload": workload, "dtype": "fp16", "causal": causal, "variant": variant,
            "status": status, "useful_tflops": tflops if status == "ok" else None,
            "round": round_index}


def test_median_and_spread_over_rounds():
    records = [record("W1", "base/s1", v, round_index=i) for i, v in enumerate([500, 560, 530])]
    records.append(record("W1", "base/s2", 480))
    table = tune_sm90.summarize(records, ["W1"]).splitlines()
    assert table[0] == "| workload | base/s1 | base/s2 |"
    assert table[2] == "| W1 fp16 full | 530 (500-560) | 480 |"


def test_a_failed_round_shows_its_status_not_a_number():
    records = [record("W2", "v", 500), record("W2", "v", None, status="wrong", round_index=1)]
    assert tune_sm90.summarize(records).splitlines()[2] == "| W2 fp16 full | wrong |"


def test_rows_follow_the_workload_order_then_mask():
    records = [record("W4", "v", 60), record("W1", "v", 500, causal=True),
               record("W1", "v", 520)]
    rows = [line.split("|")[1].strip() for line in tune_sm90.summarize(records, ["W1", "W4"])
            .splitlines()[2:]]
    assert rows == ["W1 fp16 full", "W1 fp16 causal", "W4 fp16 full"]


def test_missing_variant_is_a_dash():
    records = [record("W1", "a", 500), record("W3", "b", 400)]
    lines = tune_sm90.summarize(records, ["W1", "W3"]).splitlines()
    assert lines[2] == "| W1 fp16 full | 500 | - |"
    assert lines[3] == "| W3 fp16 full | - | 400 |"


def test_summarize_merges_runs_from_files(tmp_path, capsys):
    for i, value in enumerate([510, 530]):
        run = tmp_path / f"base-r{i}"
        run.mkdir()
        (run / "tune.json").write_text(json.dumps(
            {"records": [record("W1", "base/s1", value, round_index=0)]}))
    files = sorted(str(p) for p in tmp_path.glob("*/tune.json"))
    assert tune_sm90.main(["--summarize", *files, "--workloads", "W1"]) == 0
    assert "| W1 fp16 full | 520 (510-530) |" in capsys.readouterr().out


def test_settings_from_env_specs_or_schedules():
    assert tune_sm90.parse_settings(["lpt:JFA_SM90_LPT=1+JFA_SM90_SCHEDULE=2"], "0,1") == [
        ("lpt", {"JFA_SM90_LPT": "1", "JFA_SM90_SCHEDULE": "2"})]
    assert tune_sm90.parse_settings([], "0, 1") == [
        ("s0", {"JFA_SM90_SCHEDULE": "0"}), ("s1", {"JFA_SM90_SCHEDULE": "1"})]


def test_rounds_alternate_the_order_of_the_variants():
    variants = [("a", 1), ("b", 2), ("c", 3)]
    assert tune_sm90.in_turn(variants, 0) == variants
    assert tune_sm90.in_turn(variants, 1) == variants[::-1]
    assert tune_sm90.in_turn(variants, 2) == variants
