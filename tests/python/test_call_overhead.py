"""bench/call_overhead.py without a GPU: FA3's call built from its schema, the spin's size, the
median round, the ratios and the tables, the options, and the small workload (the timing itself
runs on a GPU machine only)."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import call_overhead as co  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402

# The argument names of FA3's fwd (hopper/flash_api.cpp), every one with a default.
FA3_NAMES = ["q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k",
             "cu_seqlens_k_new", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
             "page_table", "kv_batch_idx", "leftpad_k", "rotary_cos", "rotary_sin",
             "seqlens_rotary", "q_descale", "k_descale", "v_descale", "softmax_scale", "is_causal",
             "window_size_left", "window_size_right", "attention_chunk", "softcap",
             "is_rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin"]


def fa3_values(causal=True):
    return {"q": "Q", "k": "K", "v": "V", "cu_seqlens_q": "CUQ", "cu_seqlens_k": "CUK",
            "max_seqlen_q": 333, "max_seqlen_k": 334, "softmax_scale": 0.125,
            "is_causal": causal}


def test_fa3_call_is_the_varlen_call_with_scale_and_mask_by_name():
    args, kwargs = co.fa3_call(FA3_NAMES, fa3_values())
    assert args == ["Q", "K", "V", None, None, None, None, "CUQ", "CUK", None, None, None, 333, 334]
    assert kwargs == {"softmax_scale": 0.125, "is_causal": True}


def test_fa3_call_takes_the_schema_defaults_and_names():
    # Another version: a non-None default in between, the mask named "causal", and an argument
    # without a default after the ones set (a call would fail: refused up front).
    schema = [("q", co.REQUIRED), ("k", co.REQUIRED), ("v", co.REQUIRED), ("out", None),
              ("cu_seqlens_q", None), ("cu_seqlens_k", None), ("pad", 7), ("max_seqlen_q", None),
              ("max_seqlen_k", None), ("softmax_scale", None), ("causal", False)]
    args, kwargs = co.fa3_call(schema, fa3_values(causal=False))
    assert args == ["Q", "K", "V", None, "CUQ", "CUK", 7, 333, 334]
    assert kwargs == {"softmax_scale": 0.125, "causal": False}
    with pytest.raises(ValueError, match="'window_size_left' has no default"):
        co.fa3_call(schema + [("window_size_left", co.REQUIRED)], fa3_values())
    with pytest.raises(ValueError, match="'pad' has no default"):
        co.fa3_call([(n, co.REQUIRED if n == "pad" else d) for n, d in schema], fa3_values())


def test_fa3_call_refuses_a_schema_without_an_argument_it_needs():
    with pytest.raises(ValueError, match="no max_seqlen_k"):
        co.fa3_call([n for n in FA3_NAMES if n != "max_seqlen_k"], fa3_values())
    with pytest.raises(ValueError, match="none of is_causal, causal"):
        co.fa3_call([n for n in FA3_NAMES if n != "is_causal"], fa3_values())


def test_spin_outlasts_the_host_loop_within_bounds():
    # 200 calls of 10 µs = 2 ms of host time; twice that at 2 GHz.
    assert co.spin_cycles(10e-6, 200) == 8_000_000
    assert co.spin_cycles(10e-6, 200, factor=3.0, clock_hz=1e9) == 6_000_000
    assert co.spin_cycles(1e-9, 1) == co.MIN_SPIN_CYCLES
    assert co.spin_cycles(10.0, 1000) == co.MAX_SPIN_CYCLES


def rec(status, eager, tag, method="jfa", **more):
    r = {"method": method, "workload": "W1", "dtype": "fp16", "causal": False, "status": status,
         "eager_ms": eager, "graph_ms": eager and eager * 0.9, "host_us": 20.0,
         "host_gpu_bound": False, "tag": tag}
    r.update(more)
    return r


def test_median_round_by_eager_time_keeps_every_round():
    records = [rec("ok", 1.2, "r0"), rec("ok", 1.0, "r1"), rec("ok", 1.1, "r2")]
    kept = co.median_round(records)
    assert kept["tag"] == "r2"
    assert [r["eager_ms"] for r in kept["rounds"]] == [1.2, 1.0, 1.1]
    assert set(kept["rounds"][0]) == set(co.ROUND_FIELDS)
    assert "rounds" not in records[0]
    # An even count keeps the slower of the two middle rounds.
    assert co.median_round([rec("ok", 1.0, "fast"), rec("ok", 2.0, "slow")])["tag"] == "slow"
    with pytest.raises(ValueError):
        co.median_round([])


def test_a_failed_round_is_the_result():
    kept = co.median_round([rec("ok", 1.0, "r0"), rec("wrong", None, "r1"), rec("ok", 1.1, "r2")])
    assert kept["status"] == "wrong" and kept["tag"] == "r1"
    assert [r["status"] for r in kept["rounds"]] == ["ok", "wrong", "ok"]


def test_ratios_fa3_over_jfa_and_jfa_graph_over_eager():
    cell = {"jfa": rec("ok", 0.5, "j", graph_ms=0.4),
            "fa3": rec("ok", 0.6, "f", method="fa3", graph_ms=0.5)}
    q = co.ratios(cell)
    assert q["jfa_vs_fa3_eager"] == pytest.approx(1.2)
    assert q["jfa_vs_fa3_graph"] == pytest.approx(1.25)
    assert q["jfa_graph_over_eager"] == pytest.approx(0.8)
    # No graph for FA3, a wrong jfa, or no jfa at all: nothing to compare.
    cell["fa3"]["graph_ms"] = None
    assert co.ratios(cell)["jfa_vs_fa3_graph"] is None
    assert co.ratios({"jfa": rec("wrong", 0.5, "j"), "fa3": cell["fa3"]}) == {
        "jfa_vs_fa3_eager": None, "jfa_vs_fa3_graph": None, "jfa_graph_over_eager": None}
    assert co.ratios({"fa3": cell["fa3"]})["jfa_vs_fa3_eager"] is None


def test_table_rows_cells_ratios_and_notes():
    records = [
        rec("ok", 0.5, "", graph_ms=0.4, host_us=12.34),
        rec("ok", 0.6, "", method="fa3", graph_ms=0.5, host_us=8.0, host_gpu_bound=True),
        rec("unavailable", None, "", method="triton_jfa", reason="cannot import triton"),
        rec("unchecked", 0.7, "", method="cudnn_padded", graph_ms=None, note="padding keys",
            graph_reason="capture failed: RuntimeError: boom"),
        rec("ok", 0.3, "", causal=True, graph_ms=0.2, host_us=11.0),
        rec("ok", 0.01, "", workload="S1", graph_ms=0.004, host_us=15.0),
    ]
    text = co.format_tables(records, ["S1", "W1"])
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("| workload"))
    assert head == ("| workload | mask | jfa host µs | jfa eager ms | jfa graph ms | FA3 host µs | "
                    "FA3 eager ms | FA3 graph ms | Triton host µs | Triton eager ms | "
                    "Triton graph ms | cuDNNpad host µs | cuDNNpad eager ms | cuDNNpad graph ms | "
                    "jfa/FA3 eager | jfa/FA3 graph | jfa graph/eager |")
    rows = [line for line in lines if line.startswith("| S1") or line.startswith("| W1")]
    assert rows == [
        "| S1 | non-causal | 15.0 | 0.0100 | 0.0040 | - | - | - | - | - | - | - | - | - | - | - "
        "| 0.40x |",
        "| W1 | non-causal | 12.3 | 0.5000 | 0.4000 | 8.0! | 0.6000 | 0.5000 | n/a | n/a | n/a | "
        "20.0 | 0.7000* | no graph | 1.20x | 1.25x | 0.80x |",
        "| W1 | causal | 11.0 | 0.3000 | 0.2000 | - | - | - | - | - | - | - | - | - | - | - "
        "| 0.67x |",
    ]
    assert lines[1] == "### fp16"
    assert any("plain Triton JFA [unavailable]" in line and "cannot import triton" in line
               for line in lines)
    assert any("[no graph]" in line and "boom" in line for line in lines)
    assert co.format_tables([]) == "no results"


def test_a_table_per_dtype_and_a_summary_per_cell():
    records = [rec("ok", 0.5, ""), rec("ok", 0.6, "", dtype="bf16"),
               rec("ok", 0.9, "", method="fa3", dtype="bf16")]
    text = co.format_tables(records)
    assert text.index("### fp16") < text.index("### bf16")
    summary = co.summarize(records)
    assert [(s["dtype"], s["jfa_vs_fa3_eager"]) for s in summary] == [
        ("fp16", None), ("bf16", pytest.approx(1.5))]


def test_options_defaults_quick_and_refusals():
    args = co.parse_args([])
    assert (args.host_calls, args.runs, args.rounds, args.warm_seconds) == (200, 30, 3, 5.0)
    assert args.workload_ids == ["W1", "W2", "W3", "W4", "S1"]
    assert args.dtype_names == ["fp16"] and args.masks == "both" and args.name == "call-overhead"
    assert args.method_names == co.METHOD_ORDER
    quick = co.parse_args(["--quick", "--runs", "7"])
    assert (quick.host_calls, quick.runs, quick.rounds, quick.warm_seconds) == (50, 7, 1, 1.0)
    assert args.host_batches == 3
    for bad in (["--rounds", "0"], ["--host-calls", "0"], ["--host-batches", "0"],
                ["--workloads", "W9"], ["--methods", "jfa,flex"], ["--dtypes", "fp8"]):
        with pytest.raises(SystemExit):
            co.parse_args(bad)


def test_the_small_workload_needs_no_cli():
    loaded = co.load_workloads(["S1", "W1"], None)
    (sid, small, err), (wid, missing, why) = loaded
    assert (sid, err, wid, missing) == ("S1", None, "W1", None)
    assert "CLI" in why
    assert small.lengths_q == small.lengths_k == [200, 333, 64]
    assert (small.spec.heads, small.spec.heads_kv, small.spec.head_dim) == (2, 2, 128)
    assert small.flops(False) == 4.0 * (200**2 + 333**2 + 64**2) * 2 * 128
    assert co.workload_summary(small)["cli"] == (
        "jfa bench --lengths 200,333,64 --heads 2 --head-dim 128")


def test_help_and_import_need_no_torch():
    text = help_without_torch("call_overhead")
    assert "--host-calls" in text and "graph_ms" in text
