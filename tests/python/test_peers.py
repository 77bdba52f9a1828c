"""bench/peers.py without a GPU: the options (--fa3-lib, --head-dims, the eager and graph counts),
the workloads with a value head size of their own (bench/workloads.py), FlashAttention-3's head
sizes and the line a run without it prints and keeps in its JSON, the rounds, the tables and
--readme-tables on a results file; call_overhead's search for the CUDA runtime that FA3's op
library needs; with torch (on the CPU), the GPU module's FA3 call and checks (the measurements run
on a GPU machine only)."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import call_overhead as co  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402


# ---- options -----------------------------------------------------------------------------------

def test_fa3_lib_comes_from_the_option_or_fa3_lib(monkeypatch):
    monkeypatch.delenv("FA3_LIB", raising=False)
    assert peers.parse_args([]).fa3_lib is None
    assert peers.parse_args(["--fa3-lib", "x/fa3_varlen.so"]).fa3_lib == "x/fa3_varlen.so"
    monkeypatch.setenv("FA3_LIB", "/opt/fa3.so")
    assert peers.parse_args([]).fa3_lib == "/opt/fa3.so"
    assert peers.parse_args(["--fa3-lib", "mine.so"]).fa3_lib == "mine.so"


def test_defaults_quick_and_counts(monkeypatch):
    args = peers.parse_args([])
    assert args.workload_ids == W.DEFAULT_IDS and args.dtype_names == list(W.DTYPES)
    assert (args.runs, args.warmup, args.rounds) == (peers.RUNS, peers.WARMUP, 1)
    assert args.method_names == peers.METHOD_ORDER and args.mask_values == (False, True)
    quick = peers.parse_args(["--quick"])
    assert quick.workload_ids == list(W.QUICK_IDS) and quick.dtype_names == ["fp16"]
    assert (quick.runs, quick.warmup) == (peers.QUICK_RUNS, peers.QUICK_WARMUP)
    assert peers.parse_args(["--quick", "--runs", "4", "--warmup", "0"]).runs == 4
    for bad in (["--runs", "0"], ["--warmup", "-1"], ["--rounds", "0"],
                ["--head-dims", "48"], ["--methods", "fa5"], ["--workloads", "W9"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)


def test_head_dims_pick_w1_to_w4_at_each_size():
    args = peers.parse_args(["--head-dims", "32,128,192/128"])
    assert args.workload_ids == ["W1-d32", "W2-d32", "W3-d32", "W4-d32", "W1", "W2", "W3", "W4",
                                 "W1-d192v128", "W2-d192v128", "W3-d192v128", "W4-d192v128"]
    args = peers.parse_args(["--head-dims", "64,256", "--workloads", "W1,W4"])
    assert args.workload_ids == ["W1-d64", "W4-d64", "W1-d256", "W4-d256"]
    every = peers.head_dim_ids(list(peers.HEAD_DIM_SUFFIX))
    assert len(every) == 4 * len(peers.HEAD_DIM_SUFFIX)
    assert all(wid in W.SPEC_BY_ID for wid in every)
    with pytest.raises(ValueError, match="no workload X1-d64"):
        peers.head_dim_ids(["64"], ["X1"])


def test_help_and_import_need_no_torch():
    text = help_without_torch("peers")
    for option in ("--fa3-lib", "--readme-tables", "--head-dims", "--runs", "--warmup",
                   "--quick"):
        assert option in text


# ---- workloads ---------------------------------------------------------------------------------

def test_value_head_workloads_count_both_head_sizes():
    spec = W.SPEC_BY_ID["W2-d192v128"]
    assert (spec.base, spec.head_dim, spec.head_dim_v, spec.value_dim) == ("W2", 192, 128, 128)
    assert W.SPEC_BY_ID["W2"].value_dim == 128 and W.SPEC_BY_ID["W2-d192"].value_dim == 192
    lengths = [128, 4096, 512, 2048]
    w = W.make_workload(spec, lengths)
    pairs = sum(L * L for L in lengths)
    assert w.flops(False) == 2.0 * pairs * 16 * (192 + 128)  # Q K^T and P V
    assert w.flops(True) == w.flops(False) / 2
    tokens = sum(lengths)
    assert w.bytes("fp16") == 2.0 * 16 * tokens * (192 + 128) * 2  # Q, K: 192; V, O: 128
    s = w.summary()
    assert s["head_dim_v"] == 128
    assert s["cli"] == "jfa bench --workload W2 --head-dim 192 --head-dim-v 128"
    # Equal head sizes count as before: 4 * pairs * heads * head_dim.
    same = W.make_workload(W.SPEC_BY_ID["W2-d192"], lengths)
    assert same.flops(False) == 4.0 * pairs * 16 * 192
    assert same.summary()["head_dim_v"] == 192
    assert "| W2-d192v128 | 4 | 6,784 | 6,784 | 192/128 |" in W.floors_markdown([w])
    # Every workload id is known once, the value-head ones before the cross-attention ones.
    assert len(set(W.DEFAULT_IDS)) == len(W.DEFAULT_IDS)
    assert W.DEFAULT_IDS.index("W4-d256") < W.DEFAULT_IDS.index("W1-d192v128")
    assert W.DEFAULT_IDS.index("W4-d192v128") < W.DEFAULT_IDS.index("X1")


# ---- FlashAttention-3 --------------------------------------------------------------------------

def test_fa3_has_no_kernel_at_head_dim_32():
    reason = peers.fa3_head_dim_reason(32)
    assert reason.startswith("unavailable at head_dim 32")
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128)):
        assert peers.fa3_head_dim_reason(d, dv) == ""
    assert peers.fa3_head_dim_reason(128, 64).startswith("unavailable at head_dim 128/64")


def test_a_run_without_fa3_says_so():
    assert peers.peers_missing(["jfa", "fa3"], False) == [
        "FlashAttention-3: not available (pass --fa3-lib or set FA3_LIB)"]
    assert peers.peers_missing(["jfa", "fa3"], True) == []
    assert peers.peers_missing(["jfa", "flex"], False) == []  # not asked for
    line, = peers.peers_missing(["fa3"], False, "torch.ops.load_library(x.so): OSError: gone")
    assert line == "FlashAttention-3: not available: torch.ops.load_library(x.so): OSError: gone"
    # The table ends with it, and says it with no results too.
    table = peers.format_table([rec("jfa", 0.5)], missing=[peers.FA3_NOT_AVAILABLE])
    assert table.splitlines()[-2:] == ["missing peers:", "  " + peers.FA3_NOT_AVAILABLE]
    assert peers.FA3_NOT_AVAILABLE in peers.format_table([], missing=[peers.FA3_NOT_AVAILABLE])


def test_the_missing_shared_object_is_named_and_found_in_torchs_wheels(tmp_path):
    message = ("OSError: libcudart.so.13: cannot open shared object file: No such file or "
               "directory")
    assert co.missing_shared_object(message) == "libcudart.so.13"
    assert co.missing_shared_object("undefined symbol: foo") is None
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_text("")
    roots = [str(tmp_path / "elsewhere"), str(tmp_path / "site")]
    assert co.find_shared_object("libcudart.so.13", roots) == str(lib / "libcudart.so.13")
    assert co.find_shared_object("libcublas.so.13", roots) is None


# ---- records, rounds and tables ----------------------------------------------------------------

def rec(method, eager_ms, graph_ms=None, workload="W1", dtype="fp16", causal=False, status="ok",
        label=None, kernel_ms=None, gflop=100.0, **more):
    """A record as bench/peers_gpu.py's measure makes it, 100 useful GFLOP by default."""
    r = {"method": method, "workload": workload, "dtype": dtype, "causal": causal,
         "status": status, "useful_gflop": gflop, "min_bytes": 1e9, "eager_ms": eager_ms,
         "graph_ms": graph_ms, "graph_reason": "", "reason": "", "note": ""}
    kernel_ms = kernel_ms or eager_ms
    if status in peers.RANKED and kernel_ms:
        r.update(median_ms=kernel_ms, useful_tflops=gflop / kernel_ms, eff_tbps=1.0 / kernel_ms)
    if label:
        r["label"] = label
    r.update(more)
    return peers.add_rates(r)


def test_rates_of_the_eager_call_and_the_replay():
    r = rec("jfa", 0.5, 0.4)
    assert r["eager_tflops"] == pytest.approx(200.0) and r["graph_tflops"] == pytest.approx(250.0)
    assert r["eager_tbps"] == pytest.approx(2.0)
    r = rec("fa3", 0.5, None, status="wrong")
    assert r["eager_tflops"] is None and r["graph_tflops"] is None


def test_rounds_keep_the_median_kernel_round_and_the_median_eager_and_replay():
    rounds = [rec("jfa", 0.50, 0.40, kernel_ms=0.45), rec("jfa", 0.70, 0.42, kernel_ms=0.40),
              rec("jfa", 0.60, 0.41, kernel_ms=0.50)]
    kept = peers.combine_rounds(rounds)
    assert kept["median_ms"] == 0.45  # the median round by kernel TFLOP/s
    assert kept["eager_ms"] == 0.60 and kept["graph_ms"] == 0.41
    assert kept["eager_rounds_ms"] == [0.50, 0.70, 0.60]
    assert kept["graph_tflops"] == pytest.approx(100 / 0.41)
    rounds[1].update(graph_ms=None, graph_reason="capture or replay failed: x")
    kept = peers.combine_rounds([peers.add_rates(r) for r in rounds])
    assert kept["graph_ms"] is None and kept["graph_tflops"] is None
    assert kept["graph_reason"] == "capture or replay failed: x"
    # A failed round is the result.
    bad = peers.combine_rounds([rec("jfa", 0.5, 0.4), rec("jfa", None, status="wrong",
                                                          reason="relative error 1 > 0.002")])
    assert bad["status"] == "wrong" and bad["reason"].startswith("relative error")


def test_the_summary_has_jfa_over_fa3_only_where_fa3_itself_ran():
    records = [rec("jfa", 0.5, 0.4), rec("fa3", 0.6, 0.5, label=peers.FA3_LABEL),
               rec("jfa", 0.5, 0.4, workload="W2"),
               rec("fa3", 0.4, 0.4, workload="W2", label=peers.FA3_CLASS_LABEL)]
    by = {s["workload"]: s for s in peers.summarize(records)}
    assert by["W1"]["jfa_over_fa3_eager"] == pytest.approx(1.2)
    assert by["W1"]["jfa_over_fa3_graph"] == pytest.approx(1.25)
    assert by["W2"]["jfa_over_fa3_eager"] is None and by["W2"]["best_peer"] == "fa3"


def test_the_text_table_names_fa3_by_what_ran_and_says_why_a_cell_is_missing():
    records = [rec("jfa", 0.5, 0.4), rec("fa3", 0.6, 0.5, label=peers.FA3_LABEL),
               rec("jfa", 2.0, None, workload="W1-d32",
                   graph_reason="capture or replay failed: boom"),
               rec("fa3", None, workload="W1-d32", status="unavailable", label=peers.FA3_LABEL,
                   reason=peers.fa3_head_dim_reason(32))]
    text = peers.format_table(records, ["W1", "W1-d32"])
    head = next(line for line in text.splitlines() if line.startswith("workload"))
    assert "FA3" in head and "FA3cls" not in head
    assert "FlashAttention-3 (varlen) [unavailable] (first: W1-d32 fp16 non-causal): " \
           "unavailable at head_dim 32" in text
    assert "jfa [no graph] (first: W1-d32 fp16 non-causal): capture or replay failed: boom" in text
    line = peers.progress_line(records[0])
    assert "eager 0.500 ms (200.0)" in line and "graph 0.400 ms (250.0)" in line
    assert "graph: capture or replay failed: boom" in peers.progress_line(records[2])


def synthetic_results():
    """A results document of two workloads, two dtypes, jfa, FlashAttention-3 (no kernel at 32),
    varlen FA2 (fp16 only) and padded cuDNN (unchecked without the mask, skipped with it)."""
    fa3 = peers.FA3_LABEL
    records = []
    for dtype, scale in (("fp16", 1.0), ("bf16", 2.0)):
        records += [
            rec("jfa", 0.5 * scale, 0.4 * scale, dtype=dtype),
            rec("jfa", 0.3 * scale, 0.25 * scale, dtype=dtype, causal=True),
            rec("fa3", 0.5 * scale, 0.5 * scale, dtype=dtype, label=fa3),
            rec("fa3", 0.4 * scale, None, dtype=dtype, causal=True, label=fa3,
                graph_reason="capture or replay failed: x"),
            rec("jfa", 2.0, 2.0, dtype=dtype, workload="W4-d32"),
            rec("jfa", 2.0, 2.0, dtype=dtype, workload="W4-d32", causal=True),
            rec("fa3", None, dtype=dtype, workload="W4-d32", status="unavailable", label=fa3,
                reason=peers.fa3_head_dim_reason(32)),
            rec("fa3", None, dtype=dtype, workload="W4-d32", causal=True, status="unavailable",
                label=fa3, reason=peers.fa3_head_dim_reason(32)),
        ]
    records += [rec("fa2_varlen", 1.0, 1.0), rec("fa2_varlen", 1.0, 1.0, causal=True),
                rec("cudnn_padded", 1.0, 1.0, workload="W4-d32", status="unchecked"),
                rec("cudnn_padded", None, workload="W4-d32", causal=True, status="skipped")]
    return {"title": "jfa peers benchmark (forward)", "results": records,
            "peers_missing": []}


def test_readme_tables_put_both_masks_and_the_replay_in_one_cell(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(synthetic_results()))
    assert peers.main(["--readme-tables", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fp16 = [
        "| fp16, non-causal / causal | W1 | W4-d32 |",
        "| --- | --- | --- |",
        # 100 GFLOP in 0.5 ms = 200 TFLOP/s; under 100 one decimal; "graph" in the first column.
        "| jfa | 200 / 333 (graph 250 / 400) | 50.0 / 50.0 (50.0 / 50.0) |",
        "| FlashAttention-3 (varlen) | 200 / 250 (graph 200 / -) | n/a / n/a |",
        "| varlen FA2 | 100 / 100 (graph 100 / 100) | - |",
        "| padded cuDNN | - | 100* / skip (100* / skip) |",
        "| jfa ÷ FA3 | 1.00 / 1.33 (graph 1.25 / -) | - |",
    ]
    assert lines[:7] == fp16
    assert lines[7] == ""
    assert lines[8] == "| bf16, non-causal / causal | W1 | W4-d32 |"
    assert lines[10] == "| jfa | 100 / 167 (graph 125 / 200) | 50.0 / 50.0 (50.0 / 50.0) |"
    assert lines[-1] == "| jfa ÷ FA3 | 1.00 / 1.33 (graph 1.25 / -) | - |"
    assert len(lines) == 13


def test_readme_tables_pick_dtypes_and_workloads_and_join_files(tmp_path, capsys):
    doc = synthetic_results()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"results": [r for r in doc["results"] if r["workload"] == "W1"]}))
    b.write_text(json.dumps({"results": [r for r in doc["results"] if r["workload"] != "W1"]}))
    assert peers.main(["--readme-tables", f"{a},{b}", "--dtypes", "bf16",
                       "--workloads", "W4-d32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["| bf16, non-causal / causal | W4-d32 |", "| --- | --- |",
                     "| jfa | 50.0 / 50.0 (graph 50.0 / 50.0) |",
                     "| FlashAttention-3 (varlen) | n/a / n/a |"]
    assert peers.main(["--readme-tables", f"{a},{b}", "--head-dims", "32",
                       "--workloads", "W4"]) == 0
    assert "| fp16, non-causal / causal | W4-d32 |" in capsys.readouterr().out


def test_an_fa3_class_fallback_has_a_row_of_its_own_and_no_ratio_row():
    records = [rec("jfa", 0.5, 0.4), rec("jfa", 0.3, 0.25, causal=True),
               rec("fa3", 0.5, 0.5, label=peers.FA3_CLASS_LABEL),
               rec("fa3", 0.3, 0.3, causal=True, label=peers.FA3_CLASS_LABEL)]
    text = peers.readme_tables(records)
    assert "| FA3-class | 200 / 333 (graph 200 / 333) |" in text and "÷" not in text
    # Records of before the eager and graph times: no figures to show.
    old = [{"method": "jfa", "workload": "W1", "dtype": "fp16", "causal": c, "status": "ok",
            "useful_tflops": 500.0} for c in (False, True)]
    assert peers.readme_tables(old).splitlines()[-1] == "| jfa | - / - |"
    assert peers.readme_tables([]) == "no results"


def test_readme_rate_and_cell():
    assert [peers.readme_rate(v) for v in (None, 99.94, 100.4, 12.345)] == [
        "-", "99.9", "100", "12.3"]
    assert peers.readme_cell(None, None) == "-"
    assert peers.readme_cell(rec("jfa", 0.5), None) == "200 / -"
    assert peers.readme_cell(rec("jfa", 0.5, 0.5), None, first=True) == "200 / - (graph 200 / -)"


def test_json_results_of_a_run_are_read_back_in_order(tmp_path):
    paths = []
    for i in range(2):
        p = tmp_path / f"{i}.json"
        p.write_text(json.dumps({"results": [rec("jfa", 0.5, workload=f"W{i + 1}")]}))
        paths.append(str(p))
    assert [r["workload"] for r in peers.read_results(paths)] == ["W1", "W2"]


# ---- the GPU module's methods, on the CPU (torch needed) ---------------------------------------

# FlashAttention-3's varlen forward schema (the arguments up to the mask; the rest have defaults).
FA3_FWD = ["q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k",
           "cu_seqlens_k_new", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
           "page_table", "kv_batch_idx", "leftpad_k", "rotary_cos", "rotary_sin",
           "seqlens_rotary", "q_descale", "k_descale", "v_descale", ("softmax_scale", None),
           ("is_causal", False), ("window_size_left", -1), ("window_size_right", -1),
           ("softcap", 0.0)]


def cpu_case(G, wid, lengths, dtype="bf16"):
    return G.Case(W.make_workload(W.SPEC_BY_ID[wid], lengths), dtype, device="cpu")


def fake_fa3_op(G, case, calls):
    """An op taking FA3's fwd call that computes the float reference of every sequence."""
    import torch

    def op(q, k, v, *rest, softmax_scale=None, is_causal=False):
        calls.append((len(rest), softmax_scale, is_causal, tuple(v.shape)))
        out = torch.cat([G.reference_rows(case, i, is_causal) for i in range(case.B)])
        return out.to(q.dtype), None
    return op


def test_fa3_runs_from_its_library_at_192_128_and_says_it_has_no_kernel_at_32():
    pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    case = cpu_case(G, "W1-d192v128", [3, 5, 1])
    assert (case.D, case.Dv, tuple(case.v.shape)) == (192, 128, (9, 16, 128))
    assert tuple(case.reference(True)[1].shape) == (5, 16, 128)
    calls = []
    ctx = {"fa3_lib": "fa3_varlen.so", "fa3_op": fake_fa3_op(G, case, calls),
           "fa3_arguments": FA3_FWD, "fa3_provider": "torch.ops.flash_attn_3.fwd from x.so"}
    method = G.Fa3(ctx)
    assert method.current_label() == peers.FA3_LABEL
    prep = method.prepare(case, True)
    assert prep.label == peers.FA3_LABEL and prep.provider.endswith("x.so")
    out = prep.run()
    # By position up to max_seqlen_k (those between take their defaults), the rest by keyword.
    assert calls == [(11, case.scale, True, (9, 16, 128))]
    status, err, why = G.check_output(case, True, prep, out, 1e-2)
    assert (status, why) == ("ok", "") and err < 1e-2
    # No kernel at head_dim 32: unavailable, in FlashAttention-3's row.
    small = cpu_case(G, "W1-d32", [3, 5])
    with pytest.raises(G.Unavailable, match="^unavailable at head_dim 32"):
        method.prepare(small, False)
    # A library that did not load: unavailable with the loader's words, still FA3's row.
    failed = G.Fa3({"fa3_lib": "x.so", "fa3_error": "torch.ops.load_library(x.so): OSError"})
    assert failed.current_label() == peers.FA3_LABEL
    with pytest.raises(G.Unavailable, match="load_library"):
        failed.prepare(case, False)
    # No library and no wrapper: the FA3-class fallbacks, or why none runs.
    fallback = G.Fa3({"fa3_lib": None, "fa3_interface_error": "ModuleNotFoundError: no"})
    assert fallback.current_label() == peers.FA3_CLASS_LABEL
    assert not G.fa3_available(fallback.ctx) and G.fa3_available(ctx)


def test_a_wrong_output_fails_the_check_and_value_head_peers_say_why_they_are_left_out():
    pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G

    case = cpu_case(G, "W2-d192v128", [4, 2])
    prep = G.Prepared(lambda: None, lambda out, i: case.q_rows(out, i), dense=lambda o: o)
    import torch
    good = torch.cat([case.reference(False)[i] for i in range(2)])
    assert G.check_output(case, False, prep, good, 2e-3)[0] == "ok"
    status, err, why = G.check_output(case, False, prep, good * 1.1, 2e-3)
    assert status == "wrong" and why.startswith("relative error")
    for cls in (G.Fa2Varlen, G.Fa2Padded):
        with pytest.raises(G.Unavailable, match="one head size"):
            cls({}).prepare(case, False)


def test_the_readme_forward_tables_are_those_of_the_results_files_they_cite():
    """The README's forward section: a bf16 table per head size (FlashAttention-3 beside jfa
    wherever it has a kernel), each that of the results file of its head size."""
    import json
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme[readme.index("### Forward against FlashAttention-3"):]
    section = section[:section.index("\n### ", 1)]
    for size in ("32", "64", "96", "128", "192", "192v128", "256"):
        doc = json.loads((root / f"bench/results/2026-12-06-h100-forward-d{size}.json").read_text())
        table = peers.readme_tables(doc["results"], dtypes=["bf16"])
        assert table in section, size
        if size != "32":
            assert "| FlashAttention-3 (varlen) |" in table and "| jfa ÷ FA3 |" in table, size
