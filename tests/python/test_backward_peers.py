"""bench/backward_peers.py without a GPU: the FLOP count of the backward and of a step (causal,
cross lengths), the workload variants and their lengths, the options, the calls built from the
ops' schemas (with a step's forward outputs filled in per call), which cells the padded peer
skips or checks in part, the rounds, the tables, the JSON summary and the chart (the measurements
run on a GPU machine only)."""

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import backward_peers as bp  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402
import call_overhead as co  # noqa: E402


def brute_pairs(lq, lk, causal):
    """Visible (query, key) pairs, one by one: query row i sees keys j <= i + lk - lq."""
    return sum(1 for i in range(lq) for j in range(lk) if not causal or j <= i + lk - lq)


def test_backward_flops_are_two_and_a_half_forwards():
    lengths = [5, 17, 64]
    full = 4.0 * (5 * 5 + 17 * 17 + 64 * 64) * 16 * 128
    assert bp.backward_flops(lengths, lengths, 16, 128, False) == 2.5 * full
    # Equal lengths under the causal mask count half of each square (the usual convention).
    assert bp.backward_flops(lengths, lengths, 16, 128, True) == 2.5 * full / 2


@pytest.mark.parametrize("lq,lk", [(2, 5), (5, 2), (1, 9), (9, 1), (7, 7), (0, 4), (4, 0)])
def test_cross_causal_pairs_are_counted_exactly_bottom_right(lq, lk):
    heads, d = 3, 64
    want_cross = 4.0 * brute_pairs(lq, lk, True) * heads * d
    if lq == lk:
        want_cross = 4.0 * lq * lk / 2 * heads * d  # the equal-length convention
    assert bp.backward_flops([lq], [lk], heads, d, True) == 2.5 * want_cross
    assert bp.backward_flops([lq], [lk], heads, d, False) == 2.5 * 4.0 * lq * lk * heads * d


def test_batch_of_cross_lengths_sums_per_sequence():
    lq, lk = [2, 5, 3, 8], [5, 2, 3, 1]
    pairs = brute_pairs(2, 5, True) + brute_pairs(5, 2, True) + 3 * 3 / 2 + brute_pairs(8, 1, True)
    assert pairs == 9 + 3 + 4.5 + 1
    assert bp.backward_flops(lq, lk, 16, 128, True) == 2.5 * 4.0 * pairs * 16 * 128


def test_a_step_counts_the_forward_and_the_backward():
    lq, lk = [2, 5, 3, 8], [5, 2, 3, 1]
    for causal in (False, True):
        forward = 4.0 * sum(bp.W.visible_pairs(a, b, causal) for a, b in zip(lq, lk)) * 16 * 64
        assert bp.pass_flops(lq, lk, 16, 64, causal, "backward") == 2.5 * forward
        assert bp.pass_flops(lq, lk, 16, 64, causal, "step") == 3.5 * forward
        assert bp.pass_flops(lq, lk, 16, 64, causal) == bp.backward_flops(lq, lk, 16, 64, causal)
    assert bp.FLOP_FACTOR == {"backward": 2.5, "step": 3.5}
    assert bp.FLOP_FACTOR["step"] == 1 + bp.FLOP_FACTOR["backward"]


def test_workload_spec_variants_are_named_for_what_changes():
    s = bp.workload_spec("W1")
    assert (s.id, s.base, s.head_dim, s.heads, s.heads_kv) == ("W1", "W1", 128, 16, 16)
    s = bp.workload_spec("W3", head_dim=64, heads_kv=4)
    assert (s.id, s.base, s.head_dim, s.heads, s.heads_kv) == ("W3-d64-kv4", "W3", 64, 16, 4)
    assert bp.workload_spec("X2").cross == "chunk"


def test_workloads_take_their_lengths_from_the_cli(tmp_path):
    cli = tmp_path / "jfa"
    cli.write_text("#!/bin/sh\necho 4,10,1\n")
    cli.chmod(0o755)
    (wid, w, err), (xid, x, _) = bp.load_workloads(["W2", "X2"], str(cli), 64, 8)
    assert (wid, err, xid) == ("W2-d64-kv8", None, "X2-d64-kv8")
    assert w.lengths_q == w.lengths_k == [4, 10, 1]
    assert (w.spec.head_dim, w.spec.heads_kv) == (64, 8)
    assert x.lengths_q == [1, 2, 1] and x.lengths_k == [4, 10, 1]  # the last quarter of each
    (mid, missing, why), = bp.load_workloads(["W1"], None)
    assert (mid, missing) == ("W1", None) and "CLI" in why


def test_options_defaults_quick_and_refusals(monkeypatch):
    monkeypatch.delenv("FA3_LIB", raising=False)
    args = bp.parse_args([])
    assert args.workload_ids == ["W1", "W2", "W3", "W4"]
    assert args.dtype_names == ["fp16"] and args.masks == (False, True)
    assert args.method_names == ["jfa", "fa3", "cudnn_ragged", "fa4", "fa2_varlen", "flex",
                                 "cudnn_padded"]
    assert (args.head_dim, args.heads_kv, args.rounds, args.runs, args.warmup) == (
        128, 16, 3, 30, 5)
    assert args.fa3_lib is None and args.json is None and args.chart is None
    assert args.passes == ("backward",)
    quick = bp.parse_args(["--quick", "--json", "out.json"])
    assert quick.workload_ids == ["W1", "W4"] and quick.dtype_names == ["fp16"]
    assert quick.masks == (False, True) and (quick.rounds, quick.runs) == (3, 10)
    assert quick.json == "out.json"
    assert bp.parse_args(["--quick", "--workloads", "W3"]).workload_ids == ["W3"]
    assert bp.parse_args(["--causal", "on"]).masks == (True,)
    assert bp.parse_args(["--causal", "off"]).masks == (False,)
    both = bp.parse_args(["--dtypes", "fp16,bf16", "--head-dim", "64", "--heads-kv", "4"])
    assert both.dtype_names == ["fp16", "bf16"] and (both.head_dim, both.heads_kv) == (64, 4)
    assert bp.parse_args(["--deterministic"]).method_names == [
        "jfa", "jfa_det", "fa3", "cudnn_ragged", "fa4", "fa2_varlen", "flex", "cudnn_padded"]
    assert bp.parse_args(["--methods", "fa2_varlen,jfa", "--deterministic"]).method_names == [
        "fa2_varlen", "jfa", "jfa_det"]
    assert bp.parse_args(["--methods", "cudnn_padded,flex"]).method_names == [
        "cudnn_padded", "flex"]
    assert bp.parse_args(["--methods", "jfa,jfa_autograd"]).method_names == ["jfa", "jfa_autograd"]
    assert bp.parse_args(["--pass", "step"]).passes == ("step",)
    assert bp.parse_args(["--pass", "both"]).passes == ("backward", "step")
    assert bp.parse_args(["--pass", "backward"]).passes == ("backward",)
    full = bp.parse_args(["--pass", "both", "--chart", "out/bwd.png"])
    assert full.chart == "out/bwd.png" and full.passes == ("backward", "step")
    monkeypatch.setenv("FA3_LIB", "/x/flash_attn_3.so")
    assert bp.parse_args([]).fa3_lib == "/x/flash_attn_3.so"
    for bad in (["--heads-kv", "3"], ["--heads-kv", "0"], ["--head-dim", "48"],
                ["--rounds", "0"], ["--runs", "0"], ["--warmup", "-1"], ["--causal", "yes"],
                ["--workloads", "W9"], ["--workloads", "W1-d64"], ["--dtypes", "fp8"],
                ["--methods", "flash"], ["--tolerance-scale", "0"], ["--pass", "forward"],
                ["--pass"], ["--chart"]):
        with pytest.raises(SystemExit):
            bp.parse_args(bad)


# aten's schemas as torch 2.11 prints them (the names of two arguments changed in its history).
FA2_BWD = [("grad_out", co.REQUIRED), ("query", co.REQUIRED), ("key", co.REQUIRED),
           ("value", co.REQUIRED), ("out", co.REQUIRED), ("logsumexp", co.REQUIRED),
           ("cum_seq_q", co.REQUIRED), ("cum_seq_k", co.REQUIRED), ("max_q", co.REQUIRED),
           ("max_k", co.REQUIRED), ("dropout_p", co.REQUIRED), ("is_causal", co.REQUIRED),
           ("rng_state", co.REQUIRED), ("unused", co.REQUIRED), ("scale", None),
           ("window_size_left", None), ("window_size_right", None)]
FA2_VALUES = {"grad_out": "G", "query": "Q", "key": "K", "value": "V", "out": "O",
              "logsumexp": "L", "cum_seq_q": "CQ", "cum_seq_k": "CK", "max_q": 7, "max_k": 9,
              "dropout_p": 0.0, "is_causal": True, "philox_seed": "S", "philox_offset": "U",
              "scale": 0.125}


def test_fa2_backward_call_from_either_schema():
    want = (["G", "Q", "K", "V", "O", "L", "CQ", "CK", 7, 9, 0.0, True, "S", "U"],
            {"scale": 0.125})
    assert bp.schema_call(FA2_BWD, FA2_VALUES, bp.FA2_ALIASES, bp.FA2_KEYWORDS) == want
    older = [("philox_seed", a[1]) if a[0] == "rng_state" else
             ("philox_offset", a[1]) if a[0] == "unused" else a for a in FA2_BWD]
    assert bp.schema_call(older, FA2_VALUES, bp.FA2_ALIASES, bp.FA2_KEYWORDS) == want


def test_a_schema_mismatch_is_an_error_not_a_wrong_call():
    with pytest.raises(ValueError, match="no philox_seed or rng_state"):
        bp.schema_call([a for a in FA2_BWD if a[0] != "rng_state"], FA2_VALUES, bp.FA2_ALIASES,
                       bp.FA2_KEYWORDS)
    # A new required argument before the last one this script sets.
    extra = FA2_BWD[:3] + [("bias", co.REQUIRED)] + FA2_BWD[3:]
    with pytest.raises(ValueError, match="'bias' has no default"):
        bp.schema_call(extra, FA2_VALUES, bp.FA2_ALIASES, bp.FA2_KEYWORDS)
    with pytest.raises(ValueError, match="none of scale"):
        bp.schema_call([a for a in FA2_BWD if a[0] != "scale"], FA2_VALUES, bp.FA2_ALIASES,
                       bp.FA2_KEYWORDS)


def test_fa3_backward_call_passes_the_gradients_to_write():
    names = ["dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "cu_seqlens_q",
             "cu_seqlens_k", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
             "softmax_scale", "is_causal", "window_size_left", "window_size_right", "softcap",
             "deterministic", "sm_margin"]
    values = {"dout": "G", "q": "Q", "k": "K", "v": "V", "out": "O", "softmax_lse": "L",
              "dq": "DQ", "dk": "DK", "dv": "DV", "cu_seqlens_q": "CQ", "cu_seqlens_k": "CK",
              "max_seqlen_q": 7, "max_seqlen_k": 9, "softmax_scale": 0.125, "is_causal": False}
    args, kwargs = bp.schema_call(names, values, keywords=bp.FA3_BWD_KEYWORDS)
    assert args == ["G", "Q", "K", "V", "O", "L", "DQ", "DK", "DV", "CQ", "CK", None, None, 7, 9]
    assert kwargs == {"softmax_scale": 0.125, "is_causal": False}


def test_a_steps_backward_call_takes_each_forwards_outputs():
    """A step's backward call is built once from the schema with slots for the forward's
    outputs, and every call fills them in (two copies, no schema work)."""
    values = dict(FA2_VALUES, out=bp.Slot("out"), logsumexp=bp.Slot("lse"),
                  philox_seed=bp.Slot("seed"), philox_offset=bp.Slot("offset"))
    fill = bp.late_call(*bp.schema_call(FA2_BWD, values, bp.FA2_ALIASES, bp.FA2_KEYWORDS))
    args, kwargs = fill({"out": "O", "lse": "L", "seed": "S", "offset": "U"})
    assert (args, kwargs) == bp.schema_call(FA2_BWD, FA2_VALUES, bp.FA2_ALIASES, bp.FA2_KEYWORDS)
    again, _ = fill({"out": "O2", "lse": "L2", "seed": "S2", "offset": "U2"})
    assert again[4:6] == ["O2", "L2"] and again[12:14] == ["S2", "U2"]
    assert args[4] == "O"  # each call gets its own list
    # Slots among the keyword arguments too.
    fill = bp.late_call(["a", bp.Slot("x")], {"scale": 0.5, "out": bp.Slot("y")})
    assert fill({"x": 1, "y": 2}) == (["a", 1], {"scale": 0.5, "out": 2})
    assert fill({"x": 3, "y": 4}) == (["a", 3], {"scale": 0.5, "out": 4})
    with pytest.raises(KeyError):
        fill({"x": 1})
    assert repr(bp.Slot("out")) == "Slot('out')"


def test_padded_peers_skip_causal_cells_whose_q_and_k_lengths_differ():
    why = bp.skip_reason("cudnn_padded", cross=True, causal=True)
    assert "q/k lengths differ" in why and "top-left" in why
    assert why == bp.peers.padded_skip_reason(True, True)  # the forward benchmark's rule
    assert bp.skip_reason("cudnn_padded", cross=True, causal=False) == ""
    assert bp.skip_reason("cudnn_padded", cross=False, causal=True) == ""
    for method in ("jfa", "jfa_det", "jfa_autograd", "fa3", "cudnn_ragged", "fa4", "fa2_varlen",
                   "flex"):
        assert bp.skip_reason(method, cross=True, causal=True) == ""
    assert bp.PADDED == ("cudnn_padded",)
    assert set(bp.AUTOGRAD) == {"jfa_autograd", "fa4", "flex", "cudnn_padded"}


def test_padded_peers_are_checked_where_they_compute_the_same_attention():
    sample, lengths_k = [0, 1, 3, 5], [64, 17, 64, 5, 40, 64]
    # Causal, padded at the end: real rows see real keys only, whatever the padding.
    assert bp.padded_check_sequences(sample, lengths_k, True) == [0, 1, 3, 5]
    # Without the mask only sequences without padding keys (the longest k) are exact.
    assert bp.padded_check_sequences(sample, lengths_k, False) == [0, 5]
    assert bp.padded_check_sequences([1, 3], lengths_k, False) == []
    assert bp.padded_check_sequences([], [], False) == []
    why = bp.partly_checked_reason(2, 4)
    assert "padding keys are not masked" in why and "2 of the 4 sampled" in why
    assert "only the gradients' shapes and finiteness" in bp.partly_checked_reason(0, 4)


def rec(method, eager, graph=None, status="ok", **more):
    r = {"method": method, "workload": "W1", "dtype": "fp16", "causal": False, "status": status,
         "eager_ms": eager, "graph_ms": graph, "rel_error": 1e-3, "bwd_gflop": 100.0,
         "useful_gflop": 100.0, "heads": 16, "heads_kv": 16, "head_dim": 128,
         "graph_reason": ""}
    r.update(more)
    return r


def step(method, eager, graph=None, status="ok", **more):
    """A step record of the same cell: 3.5 / 2.5 of the backward's FLOPs."""
    return rec(method, eager, graph, status, **{"pass": "step", "useful_gflop": 140.0, **more})


def test_rounds_keep_the_median_eager_round_and_the_median_replay():
    kept = bp.combine_rounds([rec("jfa", 1.2, 1.0, tag="r0"), rec("jfa", 1.0, 0.7, tag="r1"),
                              rec("jfa", 1.1, 0.9, tag="r2")])
    assert kept["tag"] == "r2" and kept["eager_ms"] == 1.1 and kept["graph_ms"] == 0.9
    assert [r["eager_ms"] for r in kept["rounds"]] == [1.2, 1.0, 1.1]
    assert set(kept["rounds"][0]) == set(bp.ROUND_FIELDS)
    # Two rounds: the slower of the middle ones, for both figures.
    kept = bp.combine_rounds([rec("jfa", 1.0, 0.5), rec("jfa", 2.0, 0.4)])
    assert (kept["eager_ms"], kept["graph_ms"]) == (2.0, 0.5)
    # A round without a replay: no graph figure, with that round's reason.
    kept = bp.combine_rounds([rec("jfa", 1.0, 0.5), rec("jfa", 1.1, None, graph_reason="boom")])
    assert kept["graph_ms"] is None and kept["graph_reason"] == "boom"
    # A failed round is the result.
    kept = bp.combine_rounds([rec("jfa", 1.0, 0.5), rec("jfa", None, status="wrong", tag="bad")])
    assert kept["status"] == "wrong" and kept["tag"] == "bad"


def test_rates_and_ratios_to_varlen_fa2():
    records = [bp.add_rates(rec("jfa", 0.5, 0.4)), bp.add_rates(rec("fa2_varlen", 1.0, 0.6)),
               bp.add_rates(rec("fa3", None, status="unavailable")),
               bp.add_rates(rec("jfa", 0.5, 0.4, causal=True))]
    bp.add_ratios(records)
    jfa, fa2, fa3, alone = records
    assert jfa["eager_tflops"] == pytest.approx(200.0)
    assert jfa["graph_tflops"] == pytest.approx(250.0)
    assert jfa["vs_fa2_eager"] == pytest.approx(2.0) and jfa["vs_fa2_graph"] == pytest.approx(1.5)
    assert fa2["vs_fa2_eager"] == pytest.approx(1.0)
    assert fa3["eager_tflops"] is None and fa3["vs_fa2_eager"] is None
    assert alone["vs_fa2_eager"] is None  # no FA2 in that cell
    summary = bp.summarize(records)
    assert [(s["workload"], s["causal"]) for s in summary] == [("W1", False), ("W1", True)]
    assert summary[0]["jfa"]["vs_fa2_graph"] == pytest.approx(1.5)


def test_a_table_per_cell_with_rows_per_method_and_notes():
    records = [rec("fa2_varlen", 1.0, 0.6), rec("jfa", 0.5, 0.4),
               rec("fa3", None, status="unavailable", reason="no backward in this build",
                   rel_error=None),
               rec("jfa", 0.25, None, causal=True, graph_reason="capture failed: boom"),
               rec("jfa", 0.7, 0.6, dtype="bf16")]
    for r in records:
        bp.add_rates(r)
    bp.add_ratios(records)
    text = bp.format_tables(records, ["W1"])
    lines = text.splitlines()
    heads = [line for line in lines if line.startswith("### ")]
    assert heads == [
        "### W1, fp16, non-causal, backward (heads 16, K/V heads 16, head_dim 128; 100.0 useful "
        "GFLOP = 2.5 x the forward's)",
        "### W1, fp16, causal, backward (heads 16, K/V heads 16, head_dim 128; 100.0 useful "
        "GFLOP = 2.5 x the forward's)",
        "### W1, bf16, non-causal, backward (heads 16, K/V heads 16, head_dim 128; 100.0 useful "
        "GFLOP = 2.5 x the forward's)"]
    first = lines.index(heads[0])
    assert lines[first + 2] == ("| method | eager ms | graph ms | TFLOP/s eager | TFLOP/s graph | "
                                "÷ FA2 eager | ÷ FA2 graph | max rel. error |")
    assert lines[first + 4:first + 7] == [
        "| jfa | 0.5000 | 0.4000 | 200.0 | 250.0 | 2.00x | 1.50x | 1.0e-03 |",
        "| FA3 varlen | n/a | n/a | n/a | n/a | n/a | n/a | - |",
        "| varlen FA2 (aten) | 1.0000 | 0.6000 | 100.0 | 166.7 | 1.00x | 1.00x | 1.0e-03 |"]
    assert "| jfa | 0.2500 | no graph | 400.0 | - | - | - | 1.0e-03 |" in lines
    assert any("FA3 varlen [unavailable]" in line and "no backward" in line for line in lines)
    assert any("jfa [no graph]" in line and "boom" in line for line in lines)
    # No partly checked, padded or autograd records: no notes about them.
    assert not any(line.startswith("* ") or "padded" in line or "by torch autograd" in line
                   for line in lines)
    assert bp.format_tables([]) == "no results"


def step_records():
    records = [rec("fa2_varlen", 1.0, 0.6), rec("jfa", 0.5, 0.4),
               step("fa2_varlen", 2.0, 1.4), step("jfa", 1.0, 0.7),
               step("flex", 4.0, 2.8, provider="torch.compile(flex_attention)"),
               step("cudnn_padded", 1.6, 1.4, status="unchecked", reason="padding keys are not "
                    "masked: gradients checked on 1 of the 4 sampled sequences"),
               step("cudnn_padded", None, status="skipped", causal=True, rel_error=None,
                    reason=bp.skip_reason("cudnn_padded", True, True)),
               step("jfa", 0.5, 0.35, causal=True)]
    for r in records:
        bp.add_rates(r)
    return bp.add_ratios(records)


def test_step_records_have_tables_of_their_own_next_to_the_backward():
    records = step_records()
    by = {(r["method"], r["pass"] if "pass" in r else "-", r["causal"]): r for r in records}
    # TFLOP/s of a step from its own FLOPs; ratios against FA2's step, not its backward.
    assert by[("jfa", "step", False)]["eager_tflops"] == pytest.approx(140.0)
    assert by[("jfa", "step", False)]["graph_tflops"] == pytest.approx(200.0)
    assert by[("jfa", "step", False)]["vs_fa2_eager"] == pytest.approx(2.0)
    assert by[("jfa", "-", False)]["vs_fa2_eager"] == pytest.approx(2.0)
    assert by[("flex", "step", False)]["vs_fa2_graph"] == pytest.approx(0.5)
    assert by[("jfa", "step", True)]["vs_fa2_eager"] is None  # no FA2 step in that cell
    lines = bp.format_tables(records, ["W1"]).splitlines()
    heads = [line for line in lines if line.startswith("### ")]
    assert heads == [
        "### W1, fp16, non-causal, backward (heads 16, K/V heads 16, head_dim 128; 100.0 useful "
        "GFLOP = 2.5 x the forward's)",
        "### W1, fp16, non-causal, step: forward + backward (heads 16, K/V heads 16, head_dim "
        "128; 140.0 useful GFLOP = 3.5 x the forward's)",
        "### W1, fp16, causal, step: forward + backward (heads 16, K/V heads 16, head_dim 128; "
        "140.0 useful GFLOP = 3.5 x the forward's)"]
    first = lines.index(heads[1])
    assert lines[first + 4:first + 8] == [
        "| jfa | 1.0000 | 0.7000 | 140.0 | 200.0 | 2.00x | 2.00x | 1.0e-03 |",
        "| varlen FA2 (aten) | 2.0000 | 1.4000 | 70.0 | 100.0 | 1.00x | 1.00x | 1.0e-03 |",
        "| FlexAttention | 4.0000 | 2.8000 | 35.0 | 50.0 | 0.50x | 0.50x | 1.0e-03 |",
        "| padded cuDNN | 1.6000* | 1.4000* | 87.5 | 100.0 | 1.25x | 1.00x | 1.0e-03 |"]
    causal = lines.index(heads[2])
    assert lines[causal + 4:causal + 6] == [
        "| jfa | 0.5000 | 0.3500 | 280.0 | 400.0 | - | - | 1.0e-03 |",
        "| padded cuDNN | skip | skip | skip | skip | skip | skip | - |"]
    text = "\n".join(lines)
    assert "3.5 x for a step" in text
    assert "* timed, its gradients checked on part of the sample only" in text
    assert "padded cuDNN: computes on [B, H, Lmax, D] inputs padded with zeros" in text
    assert "FlexAttention, padded cuDNN: differentiated by torch autograd" in text
    assert any(line.startswith("- padded cuDNN [unchecked]") and "1 of the 4" in line
               for line in lines)
    assert any(line.startswith("- padded cuDNN [skipped] (first: W1 fp16 causal)")
               and "q/k lengths differ" in line for line in lines)


def test_the_json_summary_says_which_pass_each_cell_is():
    summary = bp.summarize(step_records())
    assert [(s["causal"], s["pass"]) for s in summary] == [
        (False, "backward"), (False, "step"), (True, "step")]
    assert set(summary[1]) == {"workload", "dtype", "causal", "pass", "fa2_varlen", "jfa", "flex",
                               "cudnn_padded"}
    assert summary[1]["jfa"]["graph_tflops"] == pytest.approx(200.0)
    assert summary[1]["cudnn_padded"]["status"] == "unchecked"
    # Records of a run from before there were passes read as backward ones.
    old = rec("jfa", 0.5, 0.4)
    del old["useful_gflop"]
    assert bp.pass_of(old) == "backward"
    assert bp.add_rates(old)["eager_tflops"] == pytest.approx(200.0)  # from bwd_gflop
    assert bp.summarize([old])[0]["pass"] == "backward"


def test_chart_panels_go_by_pass_then_dtype_then_mask():
    keys = [bp.pass_panel(rec("jfa", 1.0, **kw)) for kw in (
        {"pass": "step", "dtype": "fp16", "causal": False},
        {"dtype": "bf16", "causal": True},
        {"dtype": "fp16", "causal": True},
        {"pass": "step", "dtype": "bf16", "causal": False})]
    assert [title for _, title in sorted(keys)] == [
        "backward, fp16, causal", "backward, bf16, causal",
        "step: forward + backward, fp16, non-causal", "step: forward + backward, bf16, non-causal"]


def test_the_chart_is_skipped_with_a_note_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    out = bp.save_chart(step_records(), str(tmp_path / "charts" / "bwd.png"), ["W1"])
    assert out.startswith("chart not written: matplotlib")
    assert not (tmp_path / "charts" / "bwd.png").exists()


def test_the_chart_draws_the_replays_rates(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "charts" / "bwd.png"
    assert bp.save_chart(step_records(), str(path), ["W1"]) == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    untimed = [step("jfa", None, status="wrong"), step("jfa", 1.0, None)]  # no replay: no bar
    assert bp.write_chart(untimed, str(tmp_path / "x.png")) == "chart not written: no timed results"


def test_help_and_import_need_no_torch():
    text = help_without_torch("backward_peers", env=dict(os.environ, FA3_LIB=""))
    assert "--heads-kv" in text and "float64" in text
    assert "--pass" in text and "--chart" in text and "3.5" in text


def test_merge_joins_earlier_runs_into_one_table_and_document(tmp_path, capsys):
    import json
    runs = []
    for i, records in enumerate([[rec("jfa", 0.5, 0.4), rec("fa2_varlen", 1.0, 0.6)],
                                 [rec("jfa", 0.7, 0.6, dtype="bf16")]]):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"title": "t", "started_utc": f"s{i}", "elapsed_s": i + 1.0,
                                    "chart": f"run{i}.png", "environment": {},
                                    "gpu_clocks": {"gpus": {"0": {"samples": i}}},
                                    "settings": {"dtypes": [["fp16"], ["bf16"]][i]},
                                    "workloads": {"W1": "w"},
                                    "results": [bp.add_rates(r) for r in records]}))
        runs.append(str(path))
    out = tmp_path / "merged" / "all.json"
    assert bp.main(["--merge", ",".join(runs), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["method"], r["dtype"]) for r in doc["results"]] == [
        ("jfa", "fp16"), ("fa2_varlen", "fp16"), ("jfa", "bf16")]
    assert doc["results"][0]["vs_fa2_eager"] == pytest.approx(2.0)
    assert [m["settings"]["dtypes"] for m in doc["merged_from"]] == [["fp16"], ["bf16"]]
    assert [(m["started_utc"], m["elapsed_s"]) for m in doc["merged_from"]] == [("s0", 1.0),
                                                                                ("s1", 2.0)]
    assert [m["gpu_clocks"]["gpus"]["0"]["samples"] for m in doc["merged_from"]] == [0, 1]
    assert not {"settings", "started_utc", "elapsed_s", "chart", "gpu_clocks"} & set(doc)
    assert "bf16" in doc["table"] and "fp16" in doc["table"]
    assert "bf16" in capsys.readouterr().out
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"results": []}))
    assert bp.main(["--merge", str(empty)]) == 1


def test_readme_tables_put_both_masks_and_the_replay_in_one_cell():
    records = [bp.add_rates(r) for r in (
        rec("jfa", 0.5, 0.4), rec("jfa", 0.3, 0.25, causal=True),
        rec("fa3", 0.5, 0.5), rec("fa3", 0.3, None, causal=True),
        rec("jfa", 2.0, 2.0, workload="W4"), rec("jfa", 2.0, 2.0, workload="W4", causal=True),
        rec("jfa", 0.1, 0.1, dtype="bf16"),
        step("jfa", 0.7, 0.7), step("jfa", 0.5, 0.5, causal=True))]
    text = bp.readme_tables(records)
    lines = text.splitlines()
    assert lines[0] == "| backward, non-causal / causal | W1 | W4 |"
    # 100 GFLOP in 0.5 ms = 200 TFLOP/s; under 100 one decimal.
    assert lines[2] == "| jfa | 200 / 333 (graph 250 / 400) | 50.0 / 50.0 (50.0 / 50.0) |"
    # A cell without a replay on one mask is "-", as is a workload the method did not run.
    assert lines[3] == "| FlashAttention-3 (varlen) | - | - |"
    assert "| step (forward + backward), non-causal / causal | W1 | W4 |" in lines
    assert lines[-1] == "| jfa | 200 / 280 (graph 200 / 280) | - |"
    assert "bf16" not in text and "143" not in text


def test_the_readme_backward_tables_are_those_of_the_results_files_they_cite():
    """The README's backward section: a bf16 table per head size, each that of the results file
    of its head size, and a file cited for every head size the backward serves."""
    import json
    readme = (BENCH.parent / "README.md").read_text()
    section = readme[readme.index("### Backward against FlashAttention-3"):]
    section = section[:section.index("\n### ", 1)]
    for head_dim in (32, 64, 96, 128, 192, 256):
        path = f"bench/results/2026-12-06-h100-backward-d{head_dim}.json"
        assert f"-d{head_dim}" in section
        doc = json.loads((BENCH.parent / path).read_text())
        table = bp.readme_tables(doc["results"], dtype="bf16", head_dim=head_dim)
        assert table.count("\n") >= 3 and table in section, head_dim


def test_clock_lines_say_the_clock_and_how_often_the_power_limit_held_it():
    summary = {"gpus": {"0": {"samples": 4, "busy_samples": 3, "power_limit_w": 700.0,
                              "sm_clock_mhz": {"median": 1830.0, "p10": 1560.0, "min": 1290.0,
                                               "max": 1980.0},
                              "power_w": {"median": 689.0, "max": 699.0},
                              "power_capped_share": 2 / 3},
                        "1": {"samples": 2, "busy_samples": 0, "power_limit_w": 700.0}}}
    (line,) = bp.clock_lines(summary)
    assert line.startswith("GPU 0: SM clock 1830 MHz median, 1560 10th percentile, 1290 lowest")
    assert "689 W median of 700 W" in line and "67% of 3 busy samples" in line
    assert bp.clock_lines(None) == []


def test_cudnn_ragged_layout_describes_the_packed_tensors():
    """cuDNN's view of a packed [tokens, heads, d] tensor: [B, H, S_max, D] with token-major
    strides, and each sequence placed by its ragged offset (first token x H x D elements)."""
    import cudnn_ragged

    dims, strides = cudnn_ragged.ragged_layout(4, 64, 7)
    assert dims[1:] == [4, 7, 64] and strides == [7 * 4 * 64, 64, 4 * 64, 1]
    # element (token t of the sequence, head h, column c) at offset + t * H D + h D + c
    assert strides[2] * 3 + strides[1] * 2 + 5 == 3 * 4 * 64 + 2 * 64 + 5
    torch = pytest.importorskip("torch")
    cu = torch.tensor([0, 5, 8, 15], dtype=torch.int32)
    off = cudnn_ragged.ragged_offsets(cu, 4, 64)
    assert off.dtype == torch.int32 and off.shape == (4, 1, 1, 1)
    assert off.flatten().tolist() == [0, 5 * 256, 8 * 256, 15 * 256]


def test_cudnn_ragged_is_unavailable_without_the_package(monkeypatch):
    """Without an importable cudnn package the peer says so (an Unsupported with the reason),
    which both benchmarks record as the method being unavailable."""
    import builtins

    import cudnn_ragged

    real_import = builtins.__import__

    def no_cudnn(name, *args, **kwargs):
        if name == "cudnn":
            raise ImportError("No module named 'cudnn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cudnn)
    with pytest.raises(cudnn_ragged.Unsupported, match="import cudnn"):
        cudnn_ragged.prepared(None, True)
