"""bench/local_peers.py without a GPU: the window-aware count of visible pairs against a brute
force, the backward's count, the kinds, jfa's baselines (jfa without sinks, without softcap) and
the options (--pass, --peers), the tables of both passes on fake records (with FlexAttention's and
jfa without softcap's columns); with torch (on the CPU), the float64 reference against libjfa's
reference and CPU backend, its gradients against finite differences, libjfa's float64 backward
reference and CPU backward, jfa's params through bench/libjfa.py with the local-attention fields,
jfa's backward method on the CPU backend, FA3's forward and backward calls with the window and
softcap (fake ops), a cell's and a backward cell's plumbing (each method against the reference of
what it runs, jfa_nosoftcap's without softcap), and FlexAttention's: its mask_mod and score_mod on
index tensors against the reference's rule, the sink correction's algebra and autograd in float64,
its forward (torch's eager flex_attention on the CPU) and its backward plumbing (a dense stand-in:
FlexAttention has no CPU backward) through the checks."""

import contextlib
import ctypes
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import backward_peers as bp  # noqa: E402
import local_backward as lb  # noqa: E402
import local_peers as lp  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402
from gpu_check_functions import functions  # noqa: E402


def brute_pairs(lq, lk, causal, left, right):
    if causal:
        right = 0
    count = 0
    for i in range(lq):
        d = i + lk - lq
        for j in range(lk):
            if (left < 0 or j >= d - left) and (right < 0 or j <= d + right):
                count += 1
    return count


# ---- counting ----------------------------------------------------------------------------------

def test_visible_pairs_match_a_brute_force_count(rng):
    windows = [(-1, -1), (0, 0), (1, 0), (0, 1), (1, 1), (3, -1), (-1, 2), (2, 5), (200, 200),
               (200, 0), (0, 200)]
    for _ in range(60):
        lq, lk = (int(x) for x in rng.integers(0, 40, size=2))
        if rng.random() < 0.3:
            lk = lq
        for causal in (False, True):
            for left, right in windows:
                want = brute_pairs(lq, lk, causal, left, right)
                assert lp.visible_pairs(lq, lk, causal, left, right) == want, (
                    lq, lk, causal, left, right)
    # Without a window: the full count, and workloads.py's exact causal count at unequal lengths.
    assert lp.visible_pairs(7, 5) == 35 and lp.visible_pairs(6, 6, True) == 21
    assert lp.visible_pairs(3, 9, True) == W.visible_pairs(3, 9, True)
    assert lp.visible_pairs(9, 3, True) == W.visible_pairs(9, 3, True)


def test_local_flops_count_each_kind_per_sequence():
    lengths_q, lengths_k = [100, 3000, 5000], [100, 3000, 6000]
    for name, kind in lp.KINDS.items():
        pairs = sum(brute_pairs(a, b, kind.causal, kind.left, kind.right)
                    for a, b in zip(lengths_q[:2], lengths_k[:2]))
        pairs += lp.visible_pairs(5000, 6000, kind.causal, kind.left, kind.right)
        assert lp.local_flops(lengths_q, lengths_k, kind, 16, 192, 128) == (
            2.0 * pairs * 16 * (192 + 128)), name
    # A window wider than every sequence is the plain mask.
    wide = lp.Kind(False, 9000, 9000, 0.0, False)
    assert lp.local_flops(lengths_q, lengths_q, wide, 2, 64) == W.useful_flops(
        lengths_q, None, 2, 64, False)
    # Causal, window (128, 0): a row sees at most 129 keys (its own and 128 before it).
    swa = lp.KINDS["swa128"]
    assert lp.visible_pairs(3000, 3000, swa.causal, swa.left, swa.right) == (
        129 * 130 // 2 + (3000 - 129) * 129)


def test_the_backward_counts_two_and_a_half_forwards_over_the_visible_pairs():
    lengths_q, lengths_k = [100, 3000, 5000], [100, 3000, 6000]
    for name, kind in lp.KINDS.items():
        fwd = lp.local_flops(lengths_q, lengths_k, kind, 16, 128)
        assert lp.pass_flops(lengths_q, lengths_k, kind, 16, 128) == fwd, name
        assert lp.pass_flops(lengths_q, lengths_k, kind, 16, 128, 0, "backward") == 2.5 * fwd
        assert lp.pass_flops(lengths_q, lengths_k, kind, 16, 192, 128, "backward") == (
            2.5 * lp.local_flops(lengths_q, lengths_k, kind, 16, 192, 128)), name
    # Without a window or mask: backward_peers' count of the plain backward, the same factor.
    full = lp.Kind(False, -1, -1, 0.0, False)
    assert lp.FLOP_FACTOR["backward"] == bp.FLOP_FACTOR["backward"] == 2.5
    assert lp.pass_flops(lengths_q, lengths_k, full, 16, 64, 0, "backward") == (
        bp.backward_flops(lengths_q, lengths_k, 16, 64, False))
    # swa128 at 3000 tokens: 2.5 x (2 * 129-key rows * heads * 2 * head_dim).
    swa = lp.KINDS["swa128"]
    pairs = 129 * 130 // 2 + (3000 - 129) * 129
    assert lp.pass_flops([3000], [3000], swa, 2, 64, 0, "backward") == 2.5 * 2 * pairs * 2 * 128


# ---- kinds and options ------------------------------------------------------------------------

def test_the_kinds():
    K = lp.KINDS
    assert list(K) == ["swa128", "swa4096", "swa128nc", "softcap50", "swa_softcap", "sinks",
                       "swa_sinks"]
    assert K["swa128"] == (True, 128, 0, 0.0, False)
    assert K["swa4096"] == (True, 4096, 0, 0.0, False)
    assert K["swa128nc"] == (False, 128, 128, 0.0, False)
    assert K["softcap50"] == (True, -1, 0, 50.0, False)
    assert K["swa_softcap"] == (True, 4096, 0, 50.0, False)
    assert K["sinks"] == (True, -1, 0, 0.0, True)
    assert K["swa_sinks"] == (True, 128, 0, 0.0, True)
    assert [lp.peer_of(k) for k in K] == ["fa3"] * 5 + ["jfa_nosinks"] * 2
    assert [lp.baselines_of(k) for k in K] == [[]] * 3 + [["jfa_nosoftcap"]] * 2 + [
        ["jfa_nosinks"]] * 2


def test_a_baseline_runs_the_kind_without_its_modifier_the_rest_as_the_kind_has_it():
    """method_run: jfa_nosinks drops the sinks, jfa_nosoftcap the softcap (window, mask and sinks
    kept), FA3 gets no sinks, jfa and FlexAttention the kind as it is."""
    both = lp.Kind(True, 128, 0, 30.0, True)
    sinks = object()
    assert lp.method_run(both, sinks, "jfa") == (both, sinks)
    assert lp.method_run(both, sinks, "flex") == (both, sinks)
    assert lp.method_run(both, sinks, "fa3") == (both, None)  # FA3 says it has none
    assert lp.method_run(both, sinks, "jfa_nosinks") == (both._replace(sinks=False), None)
    assert lp.method_run(both, sinks, "jfa_nosoftcap") == (both._replace(softcap=0.0), sinks)
    cap = lp.KINDS["swa_softcap"]
    assert lp.method_run(cap, None, "jfa_nosoftcap") == (lp.Kind(True, 4096, 0, 0.0, False),
                                                         None)
    assert lp.local_fields(lp.method_run(cap, None, "jfa_nosoftcap")[0]) == {
        "window_left": 4096, "window_right": 0, "softcap": 0.0, "sinks": None}
    assert lp.METHODS["jfa_nosoftcap"] == "jfa without softcap"
    assert set(lp.BASELINES) == {"jfa_nosinks", "jfa_nosoftcap"} <= set(lp.METHODS)


def test_options(monkeypatch):
    monkeypatch.delenv("FA3_LIB", raising=False)
    args = lp.parse_args([])
    assert args.workload_ids == ["W1-d64", "W2-d64", "W3-d64", "W1", "W2", "W3",
                                 "W1-d256", "W2-d256", "W3-d256"]
    assert args.kind_names == list(lp.KINDS) and args.dtype_names == ["bf16"]
    assert (args.rounds, args.runs, args.time_limit_s, args.fa3_lib) == (1, peers.RUNS, None,
                                                                         None)
    args = lp.parse_args(["--kinds", "sinks,swa128", "--head-dims", "128", "--workloads",
                          "W4,W1", "--fa3-lib", ".peers/fa3_full_bf16.so", "--time-limit-s",
                          "90", "--rounds", "3", "--name", "local"])
    assert args.kind_names == ["sinks", "swa128"] and args.workload_ids == ["W4", "W1"]
    assert args.name == "local" and lp.parse_args([]).name is None
    assert (args.fa3_lib, args.time_limit_s, args.rounds) == (".peers/fa3_full_bf16.so", 90.0, 3)
    assert lp.parse_args(["--head-dims", "192/128", "--workloads", "W2"]).workload_ids == [
        "W2-d192v128"]
    for bad in (["--kinds", "swa2048"], ["--head-dims", "48"], ["--workloads", "X1"],
                ["--rounds", "0"], ["--runs", "0"], ["--kinds", ","], ["--dtypes", "fp8"],
                ["--pass", "step"], ["--pass"]):
        with pytest.raises(SystemExit):
            lp.parse_args(bad)


def test_the_pass_option_and_the_json_name_it_gives():
    assert (lp.parse_args([]).pass_option, lp.parse_args([]).passes) == ("forward", ("forward",))
    assert lp.parse_args(["--pass", "backward"]).passes == ("backward",)
    assert lp.parse_args(["--pass", "both"]).passes == ("forward", "backward")
    assert lp.parse_args(["--pass", "forward"]).passes == ("forward",)
    assert lp.default_stem("2026-12-07", "NVIDIA H100 80GB HBM3", "forward") == (
        "2026-12-07-h100-local")
    assert lp.default_stem("2026-12-07", "NVIDIA H100 80GB HBM3", "backward") == (
        "2026-12-07-h100-local-backward")
    assert lp.default_stem("2026-12-07", "NVIDIA H200", "both") == "2026-12-07-h200-local-both"


def test_help_and_import_need_no_torch():
    text = help_without_torch("local_peers")
    for option in ("--fa3-lib", "--lib", "--kinds", "--head-dims", "--rounds", "--time-limit-s",
                   "--dtypes", "--pass", "--peers"):
        assert option in text


# ---- the table --------------------------------------------------------------------------------

def rec(method, kind, workload="W1", head_dim=128, eager=None, graph=None, status="ok", **more):
    r = {"method": method, "label": lp.METHODS[method], "workload": workload,
         "base": workload.split("-")[0], "dtype": "bf16", "kind": kind, "head_dim": head_dim,
         "head_dim_v": head_dim, "causal": lp.KINDS[kind].causal, "status": status,
         "eager_tflops": eager, "graph_tflops": graph}
    r.update(more)
    return r


def test_the_table_rows_columns_ratios_and_notes():
    records = [
        rec("jfa", "swa4096", "W1-d64", 64, 300.0, 330.0), rec("fa3", "swa4096", "W1-d64", 64,
                                                               400.0, 440.0),
        rec("jfa", "swa128", "W1", 128, 500.0, 520.0), rec("fa3", "swa128", "W1", 128, 250.0,
                                                            260.0),
        rec("jfa", "swa128", "W1-d64", 64, status="wrong", reason="relative error 0.3 > 0.01"),
        rec("fa3", "swa128", "W1-d64", 64, 200.0, 210.0),
        rec("jfa", "sinks", "W1", 128, 450.0, 470.0),
        rec("jfa_nosinks", "sinks", "W1", 128, 500.0, 500.0),
        rec("jfa", "swa128nc", "W2", 128, 100.0, None, graph_reason="capture failed"),
        rec("fa3", "swa128nc", "W2", 128, status="unavailable",
            reason="FlashAttention-3: not available"),
    ]
    text = lp.format_table(records, "stopped: --time-limit-s 60 reached")
    lines = text.splitlines()
    rows = [ln.split() for ln in lines if ln.startswith(("W1 ", "W2 "))]
    # Workload base, then kind (KINDS' order), then head size.
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("W1", "swa128", "64"), ("W1", "swa128", "128"), ("W1", "swa4096", "64"),
        ("W1", "sinks", "128"), ("W2", "swa128nc", "128")]
    assert rows[0][4:] == ["wrong", "wrong", "200.0", "210.0", "-", "-", "FA3"]
    assert rows[1][4:] == ["500.0", "520.0", "250.0", "260.0", "2.00", "2.00", "FA3"]
    assert rows[2][4:] == ["300.0", "330.0", "400.0", "440.0", "0.75", "0.75", "FA3"]
    assert rows[3][4:] == ["450.0", "470.0", "500.0", "500.0", "0.90", "0.94", "jfa-nosink"]
    assert rows[4][4:] == ["100.0", "-", "n/a", "n/a", "-", "-", "FA3"]
    assert any("[wrong]" in ln and "relative error 0.3" in ln for ln in lines)
    assert any("[no graph]" in ln and "capture failed" in ln for ln in lines)
    assert any("[unavailable]" in ln for ln in lines)
    assert lines[-1] == "stopped: --time-limit-s 60 reached"
    assert lp.format_table([], "stopped: x") == "no results\nstopped: x"


def test_a_table_per_pass_the_backwards_title_and_notes():
    bwd = {"pass": "backward"}
    records = [
        rec("jfa", "swa128", "W1", 128, 500.0, 520.0), rec("fa3", "swa128", "W1", 128, 250.0,
                                                            260.0),
        rec("jfa", "swa128", "W1", 128, 200.0, 240.0, **bwd),
        rec("fa3", "swa128", "W1", 128, 100.0, 120.0, **bwd),
        rec("jfa", "sinks", "W1", 128, status="wrong", reason="relative error dsinks 0.5 > 0.02",
            **bwd),
        rec("jfa_nosinks", "sinks", "W1", 128, 150.0, 150.0, **bwd),
        rec("jfa", "swa128nc", "W2", 128, 90.0, 99.0, **bwd),
        rec("fa3", "swa128nc", "W2", 128, status="unavailable",
            reason="torch.ops.flash_attn_3.bwd: the schema has none of window_size_left", **bwd),
    ]
    text = lp.format_table(records)
    lines = text.splitlines()
    titles = [i for i, ln in enumerate(lines) if "useful TFLOP/s" in ln]
    assert len(titles) == 2 and lines[titles[0]].startswith("forward: ")
    assert lines[titles[1]].startswith("backward (the backward op alone, after one untimed "
                                       "forward): useful TFLOP/s (2.5 x the forward's, visible")
    rows = [ln.split() for ln in lines if ln.startswith(("W1 ", "W2 "))]
    assert rows[0] == ["W1", "bf16", "swa128", "128", "500.0", "520.0", "250.0", "260.0", "2.00",
                       "2.00", "FA3"]
    assert rows[1:] == [
        ["W1", "bf16", "swa128", "128", "200.0", "240.0", "100.0", "120.0", "2.00", "2.00", "FA3"],
        ["W1", "bf16", "sinks", "128", "wrong", "wrong", "150.0", "150.0", "-", "-",
         "jfa-nosink"],
        ["W2", "bf16", "swa128nc", "128", "90.0", "99.0", "n/a", "n/a", "-", "-", "FA3"]]
    assert lines.index(next(ln for ln in lines if ln.startswith("W1 ") and "200.0" in ln)) > (
        titles[1])
    assert any("[wrong] (first: W1 sinks backward): relative error dsinks 0.5" in ln
               for ln in lines)
    assert any("[unavailable] (first: W2 swa128nc backward)" in ln and "window_size_left" in ln
               for ln in lines)
    # Backward records alone: one table, the backward's; records without "pass" are forward ones.
    only = lp.format_table(records[2:]).splitlines()
    assert only[0].startswith("backward (") and sum("useful TFLOP/s" in ln for ln in only) == 1
    assert lp.pass_of({"method": "jfa"}) == "forward"
    progress = lp.backward_progress_line(dict(records[2], causal=True, rel_errors={
        "dq": 1e-3, "dk": 2e-3, "dv": 3e-3, "dsinks": 4e-3}), " swa128 r0")
    assert progress.startswith("[W1 bf16 causal backward swa128 r0] jfa ")
    assert "err 1.0e-03/2.0e-03/3.0e-03" in progress and progress.endswith(" dsinks err 4.0e-03")


# ---- with torch, on the CPU -------------------------------------------------------------------

LOCAL_CASES = [  # (causal, window, softcap, sinks): the kinds in small
    (True, (3, 0), 0.0, False), (False, (2, 2), 0.0, False), (True, (-1, 0), 2.0, False),
    (True, (4, 0), 1.5, False), (True, (-1, 0), 0.0, True), (True, (1, 0), 0.0, True),
    (False, (0, 0), 0.0, False), (False, (-1, 3), 0.0, True), (False, (-1, -1), 0.0, False)]
LENGTHS_Q, LENGTHS_K = [5, 6, 1, 9, 3], [7, 3, 1, 9, 0]


def small_inputs(rng, hq=4, hkv=2, d=8, dv=6):
    q = rng.standard_normal((sum(LENGTHS_Q), hq, d)).astype(np.float32)
    k = rng.standard_normal((sum(LENGTHS_K), hkv, d)).astype(np.float32)
    v = rng.standard_normal((sum(LENGTHS_K), hkv, dv)).astype(np.float32)
    cu_q = np.concatenate([[0], np.cumsum(LENGTHS_Q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(LENGTHS_K)]).astype(np.int32)
    sinks = (2.0 * rng.standard_normal(hq)).astype(np.float32)
    return q, k, v, cu_q, cu_k, sinks


def reference_of(torch, q, k, v, cu_q, cu_k, scale, causal, window, softcap, sinks):
    return torch.cat([lp.local_reference(
        torch.from_numpy(q[cu_q[b]:cu_q[b + 1]]), torch.from_numpy(k[cu_k[b]:cu_k[b + 1]]),
        torch.from_numpy(v[cu_k[b]:cu_k[b + 1]]), scale, causal, window, softcap,
        None if sinks is None else torch.from_numpy(sinks)) for b in range(len(cu_q) - 1)])


@pytest.mark.parametrize("causal,window,softcap,with_sinks", LOCAL_CASES)
def test_the_reference_is_libjfas_and_the_cpu_backends(rng, causal, window, softcap, with_sinks):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    q, k, v, cu_q, cu_k, sinks = small_inputs(rng)
    sinks = sinks if with_sinks else None
    scale = float(np.float32(0.9 / math.sqrt(q.shape[2])))  # libjfa's params hold a float32
    ours = reference_of(torch, q, k, v, cu_q, cu_k, scale, causal, window, softcap, sinks).numpy()
    kw = dict(causal=causal, softmax_scale=scale, window_size=window, softcap=softcap,
              sinks=sinks)
    theirs = jfa.attention_reference(q, k, v, cu_q, cu_k, **kw)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    cpu = jfa.jagged_attention(q, k, v, cu_q, cu_k, **kw)
    np.testing.assert_allclose(ours, cpu, rtol=0, atol=2e-5)


def test_jfas_params_carry_the_local_fields_through_bench_libjfa(rng):
    """The fields LocalLibrary sets are the C struct's: jfa's CPU backend through libjfa.py with
    them gives the reference (a misspelt field would be a Python attribute, ignored by libjfa)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    import libjfa
    q, k, v, cu_q, cu_k, sinks = small_inputs(rng, hq=4, hkv=4, d=8, dv=8)
    path = jfa.library_path()
    lib = lp.LocalLibrary(libjfa.Library(path))
    assert lib.path == path and lib.version() == libjfa.Library(path).version()  # delegated
    for causal, window, softcap, with_sinks in LOCAL_CASES:
        s = sinks if with_sinks else None
        out = np.full((q.shape[0], q.shape[1], v.shape[2]), np.nan, dtype=np.float32)
        lib.fields = {"window_left": window[0], "window_right": window[1], "softcap": softcap,
                      "sinks": None if s is None else s.ctypes.data}
        p = lib.params(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data, out=out.ctypes.data,
                       cu_seqlens_q=cu_q.ctypes.data, cu_seqlens_k=cu_k.ctypes.data,
                       batch=len(LENGTHS_Q), total_q=q.shape[0], total_k=k.shape[0],
                       heads_q=4, head_dim=8, dtype="fp32", causal=causal, backend="cpu")
        lib.forward_fn(p)()
        ref = reference_of(torch, q, k, v, cu_q, cu_k, 1 / math.sqrt(8), causal, window,
                           softcap, s).numpy()
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5,
                                   err_msg=str((causal, window, softcap, with_sinks)))


def test_fa3_gets_the_window_and_softcap_and_no_sinks_kind():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import call_overhead as co
    import peers_gpu as G
    from test_peers import FA3_FWD, cpu_case

    case = cpu_case(G, "W2-d64", [9, 30, 4])
    calls = []

    def op(q, k, v, *rest, **kw):
        calls.append((len(rest), kw))
        kind = lp.Kind(kw["is_causal"], kw["window_size_left"], kw["window_size_right"],
                       kw["softcap"], False)
        out = torch.cat([lp.local_reference(
            case.q_rows(q, i), k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
            v[case.cu_k_host[i]:case.cu_k_host[i + 1]], kw["softmax_scale"], kind.causal,
            (kind.left, kind.right), kind.softcap) for i in range(case.B)])
        return out.to(q.dtype), None

    ctx = {"fa3_op": op, "fa3_arguments": FA3_FWD, "fa3_provider": "x.so",
           "kind": lp.Kind(True, 3, 0, 50.0, False)}
    method = lp.Variant("fa3", lp.fa3_prepare(G, co, ctx))
    kind = ctx["kind"]
    ref = {i: lp.local_reference(case.q_rows(case.q, i),
                                 case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
                                 case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale,
                                 True, (3, 0), 50.0) for i in range(case.B)}
    case._refs = {True: ref}
    prep = method.prepare(case, True)
    out = prep.run()
    assert calls == [(11, {"softmax_scale": case.scale, "is_causal": True,
                           "window_size_left": kind.left, "window_size_right": kind.right,
                           "softcap": 50.0})]
    assert prep.label == peers.FA3_LABEL
    status, err, why = G.check_output(case, True, prep, out, 1e-2)
    assert (status, why) == ("ok", "") and 0 < method.max_abs_error < 0.1
    # A wrong window fails the check, the max error growing with it.
    ctx["kind"] = lp.Kind(True, 20, 0, 50.0, False)
    prep = method.prepare(case, True)
    assert G.check_output(case, True, prep, prep.run(), 1e-2)[0] == "wrong"
    assert method.max_abs_error > 0.1
    ctx["kind"] = lp.KINDS["swa_sinks"]
    with pytest.raises(G.Unavailable, match="no attention sinks"):
        method.prepare(case, True)
    with pytest.raises(G.Unavailable, match="load_library"):
        lp.fa3_prepare(G, co, {"fa3_error": "torch.ops.load_library(x.so): OSError",
                               "kind": lp.KINDS["swa128"]})(case, True)


def forward_rows(torch, case, causal, window, softcap, sinks):
    """local_reference of every sequence of a case, packed, in its dtype: a method's output."""
    return torch.cat([lp.local_reference(
        case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
        case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, causal, window, softcap,
        sinks) for i in range(case.B)]).to(case.dtype)


def fake_jfa_forward(torch, G, case, ctx, fields_seen, softcap=None):
    """A stand-in for jfa's forward: the exact attention of the fields ctx["jfa_lib"] holds
    (recorded in fields_seen), the sinks read from their pointer; softcap: this one instead of
    the fields' (a jfa that ignores what it is asked)."""
    def prepare(case_, causal):
        f = dict(ctx["jfa_lib"].fields)
        fields_seen.append(f)
        sinks = None if f["sinks"] is None else torch.from_numpy(np.ctypeslib.as_array(
            (ctypes.c_float * case.H).from_address(f["sinks"])).copy())
        out = forward_rows(torch, case, causal, (f["window_left"], f["window_right"]),
                           f["softcap"] if softcap is None else softcap, sinks)
        return G.Prepared(lambda: out, lambda o, i: case.q_rows(o, i), dense=lambda o: o)
    return prepare


def check_only_forward(G, dtype):
    """peers_gpu.measure's stand-in: the method's output checked, fixed times."""
    def measure(method, case_, causal, timing, opts):
        prep = method.prepare(case_, causal)
        status, err, why = G.check_output(case_, causal, prep, prep.run(), G.TOLERANCE[dtype])
        return {"method": method.name, "label": method.current_label(), "workload": case_.w.id,
                "dtype": dtype, "causal": causal, "head_dim": 64, "head_dim_v": 64,
                "status": status, "reason": why, "rel_error": err, "median_ms": 1.0,
                "min_ms": 1.0, "eager_ms": 2.0, "graph_ms": 1.0, "useful_tflops": 9.0,
                "eff_tbps": 1.0, "useful_gflop": 123.0, "min_bytes": 0.0}
    return measure


def test_a_cell_checks_each_method_on_its_own_reference_and_counts_the_window(monkeypatch):
    """measure_cell with peers_gpu.measure replaced by check-only: jfa gets the kind's fields
    (sinks for jfa, none for jfa_nosinks) and the reference of what it runs; a peer that ignores
    the window fails the check and keeps no time; the rates use the window-aware count."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case

    case = cpu_case(G, "W2-d64", [9, 300, 4], dtype="fp16")
    ctx = {"jfa_lib": lp.LocalLibrary(None)}
    fields_seen = []
    fake_jfa = fake_jfa_forward(torch, G, case, ctx, fields_seen)

    def fake_fa3(case_, causal):  # ignores the window
        out = forward_rows(torch, case, causal, (-1, -1), ctx["kind"].softcap, None)
        return G.Prepared(lambda: out, lambda o, i: case.q_rows(o, i), dense=lambda o: o)

    monkeypatch.setattr(G, "measure", check_only_forward(G, "fp16"))
    impls = {"jfa": lp.Variant("jfa", fake_jfa), "jfa_nosinks": lp.Variant("jfa_nosinks", fake_jfa),
             "fa3": lp.Variant("fa3", fake_fa3)}
    jfa, fa3 = lp.measure_cell(torch, G, ctx, impls, case, "swa128nc", None, {}, 1, None)
    flops = lp.local_flops([9, 300, 4], [9, 300, 4], lp.KINDS["swa128nc"], 16, 64)
    assert flops < W.useful_flops([9, 300, 4], None, 16, 64, False)
    assert (jfa["method"], jfa["status"], jfa["kind"], jfa["base"]) == ("jfa", "ok", "swa128nc",
                                                                        "W2")
    assert jfa["useful_gflop"] == flops / 1e9 and jfa["useful_tflops"] == flops / 1e-3 / 1e12
    assert (jfa["eager_tflops"], jfa["graph_tflops"]) == (flops / 2e-3 / 1e12, flops / 1e-3 / 1e12)
    assert jfa["max_abs_error"] < 1e-2 and fields_seen[-1] == {
        "window_left": 128, "window_right": 128, "softcap": 0.0, "sinks": None}
    assert (fa3["method"], fa3["status"]) == ("fa3", "wrong") and fa3["max_abs_error"] > 0.05
    assert fa3["median_ms"] is None and fa3["eager_tflops"] is None and fa3["useful_tflops"] is None

    fields_seen.clear()
    jfa, nosinks = lp.measure_cell(torch, G, ctx, impls, case, "swa_sinks", None, {}, 2, None)
    assert [r["status"] for r in (jfa, nosinks)] == ["ok", "ok"]
    assert nosinks["method"] == "jfa_nosinks" and (jfa["sinks"], nosinks["sinks"]) == (True, False)
    assert len(jfa["rounds"]) == 2 and jfa["max_abs_error"] < 1e-2
    assert nosinks["max_abs_error"] < 1e-2
    assert sorted(f["sinks"] is None for f in fields_seen) == [False, False, True, True]
    assert all(f["window_left"] == 128 and f["window_right"] == 0 for f in fields_seen)


# A kind with both modifiers, its softcap strong enough that the check tells it from none.
CAP_SINKS = lp.Kind(True, 128, 0, 1.0, True)


def test_a_cell_times_jfa_without_softcap_against_the_reference_without_it(monkeypatch):
    """measure_cell on softcap kinds: jfa_nosoftcap (jfa's own prepare) runs beside jfa and the
    peer with softcap 0, window, mask and sinks as the kind has them, checked against the
    reference without softcap (jfa's with it: the references do not mix); a jfa that keeps the
    softcap fails it. Its record says softcap 0."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case

    monkeypatch.setitem(lp.KINDS, "cap_sinks", CAP_SINKS)
    case = cpu_case(G, "W2-d64", [9, 300, 4], dtype="fp16")
    ctx = {"jfa_lib": lp.LocalLibrary(None)}
    fields_seen = []
    monkeypatch.setattr(G, "measure", check_only_forward(G, "fp16"))
    honest = fake_jfa_forward(torch, G, case, ctx, fields_seen)
    impls = {m: lp.Variant(m, honest) for m in ("jfa", *lp.BASELINES)}

    jfa, nosoftcap = lp.measure_cell(torch, G, ctx, impls, case, "swa_softcap", None, {}, 1, None)
    assert [(r["method"], r["status"], r["softcap"], r["sinks"]) for r in (jfa, nosoftcap)] == [
        ("jfa", "ok", 50.0, False), ("jfa_nosoftcap", "ok", 0.0, False)]
    assert nosoftcap["label"] == "jfa without softcap" and nosoftcap["window"] == [4096, 0]
    assert nosoftcap["useful_gflop"] == jfa["useful_gflop"]  # the same pairs
    assert fields_seen == [lp.local_fields(lp.KINDS["swa_softcap"]),
                           {"window_left": 4096, "window_right": 0, "softcap": 0.0,
                            "sinks": None}]

    fields_seen.clear()
    recs = lp.measure_cell(torch, G, ctx, impls, case, "cap_sinks", None, {}, 1, None)
    assert [(r["method"], r["status"], r["softcap"], r["sinks"]) for r in recs] == [
        ("jfa", "ok", 1.0, True), ("jfa_nosinks", "ok", 1.0, False),
        ("jfa_nosoftcap", "ok", 0.0, True)]
    assert [(f["softcap"], f["sinks"] is not None) for f in fields_seen] == [
        (1.0, True), (1.0, False), (0.0, True)]
    assert all(r["max_abs_error"] < 1e-2 for r in recs)

    # A jfa that keeps the softcap when asked for none: jfa_nosoftcap fails, jfa does not.
    keeps = fake_jfa_forward(torch, G, case, ctx, fields_seen, softcap=CAP_SINKS.softcap)
    impls = {m: lp.Variant(m, keeps) for m in ("jfa", *lp.BASELINES)}
    recs = lp.measure_cell(torch, G, ctx, impls, case, "cap_sinks", None, {}, 1, None)
    assert [r["status"] for r in recs] == ["ok", "ok", "wrong"]
    assert recs[2]["eager_tflops"] is None and recs[2]["max_abs_error"] > 0.05


def test_the_cli_of_a_carried_library_is_found(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "bin").mkdir()
    lib = tmp_path / "lib" / "libjfa.so"
    assert lp.carried_cli(str(lib)) is None and lp.carried_cli(None) is None
    (tmp_path / "bin" / "jfa").write_text("")
    assert lp.carried_cli(str(lib)) == str(tmp_path / "bin" / "jfa")


# ---- the backward, with torch on the CPU ------------------------------------------------------

GRAD_CASES = [  # (lq, lk, causal, window, softcap, sinks); rows without keys where lq > lk, causal
    (4, 5, True, (1, 0), 0.0, False), (5, 3, True, (-1, 0), 0.0, True),
    (4, 6, False, (1, 2), 2.0, True), (3, 3, False, (-1, -1), 1.5, False),
    (5, 4, True, (0, 0), 0.7, True), (3, 5, False, (-1, 1), 0.0, True)]


@pytest.mark.parametrize("lq,lk,causal,window,softcap,with_sinks", GRAD_CASES)
def test_the_reference_gradients_are_the_forwards_finite_differences(rng, lq, lk, causal, window,
                                                                     softcap, with_sinks):
    """local_reference_grads against central differences of local_reference (float64, GQA: two
    query heads on one K/V head), the sinks' gradient included; rows that see no key pass
    nothing back."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    q, k, v, dout = (torch.from_numpy(rng.standard_normal(shape)) for shape in
                     ((lq, 2, 3), (lk, 1, 3), (lk, 1, 2), (lq, 2, 2)))
    sinks = torch.from_numpy(rng.standard_normal(2)) if with_sinks else None
    inputs = [q, k, v] + ([sinks] if with_sinks else [])

    def loss():
        out = lp.local_reference(q, k, v, 0.7, causal, window, softcap, sinks)
        return float((out * dout).sum())

    grads = lp.local_reference_grads(q, k, v, dout, 0.7, causal, window, softcap, sinks)
    assert (grads[3] is None) == (not with_sinks)
    eps = 1e-6
    for x, g in zip(inputs, grads):
        fd = torch.zeros_like(x)
        flat, out = x.view(-1), fd.view(-1)
        for i in range(flat.numel()):
            old = float(flat[i])
            flat[i] = old + eps
            up = loss()
            flat[i] = old - eps
            down = loss()
            flat[i] = old
            out[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g.numpy(), fd.numpy(), rtol=0, atol=1e-7)
    dead = ~lp.visible(lq, lk, causal, window).any(dim=1)
    assert bool((grads[0][dead] == 0).all())
    assert dead.any() == (lq > lk and causal)  # the cases cover rows without keys


def reference_grads_of(torch, q, k, v, dout, cu_q, cu_k, scale, causal, window, softcap, sinks):
    """local_reference_grads of every sequence: dq, dk, dv packed, dsinks summed (numpy)."""
    per = [lp.local_reference_grads(
        *(torch.from_numpy(x) for x in (q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]],
                                        v[cu_k[b]:cu_k[b + 1]], dout[cu_q[b]:cu_q[b + 1]])),
        scale, causal, window, softcap, None if sinks is None else torch.from_numpy(sinks))
        for b in range(len(cu_q) - 1)]
    packed = [torch.cat([g[j] for g in per]).numpy() for j in range(3)]
    return packed + [None if sinks is None else sum(g[3] for g in per).numpy()]


@pytest.mark.parametrize("causal,window,softcap,with_sinks", LOCAL_CASES)
def test_the_reference_gradients_are_libjfas_and_its_cpu_backwards(rng, causal, window, softcap,
                                                                   with_sinks):
    """local_reference_grads against libjfa's float64 backward reference and its CPU backward
    (float32), both through LocalLibrary's backward params (the forward's copied, dsinks set
    where there are sinks): dq, dk, dv, and dsinks summed over the batch."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    import libjfa
    q, k, v, cu_q, cu_k, sinks = small_inputs(rng)
    dout = rng.standard_normal((q.shape[0], 4, 6)).astype(np.float32)
    s = sinks if with_sinks else None
    scale = float(np.float32(0.9 / math.sqrt(8)))  # libjfa's params hold a float32
    lib = lp.LocalLibrary(libjfa.Library(jfa.library_path()))
    lib.fields = {"window_left": window[0], "window_right": window[1], "softcap": softcap,
                  "sinks": None if s is None else s.ctypes.data}
    out = np.full((q.shape[0], 4, 6), np.nan, dtype=np.float32)
    lse = np.full((4, q.shape[0]), np.nan, dtype=np.float32)
    p = lib.params(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data, out=out.ctypes.data,
                   lse=lse.ctypes.data, cu_seqlens_q=cu_q.ctypes.data,
                   cu_seqlens_k=cu_k.ctypes.data, batch=len(LENGTHS_Q), total_q=q.shape[0],
                   total_k=k.shape[0], heads_q=4, heads_kv=2, head_dim=8, dtype="fp32",
                   causal=causal, softmax_scale=scale, backend="cpu")
    p.head_dim_v = 6
    lib.forward_fn(p)()
    cpu = [np.full_like(x, np.nan) for x in (q, k, v)] + [np.full(4, np.nan, dtype=np.float32)]
    b = lib.backward_params(p, dout=dout.ctypes.data, dq=cpu[0].ctypes.data,
                            dk=cpu[1].ctypes.data, dv=cpu[2].ctypes.data,
                            dsinks=cpu[3].ctypes.data if with_sinks else None)
    assert (b.forward.window_left, b.forward.window_right) == window
    assert lib.backward_workspace_size(b) >= 0
    lib.backward_fn(b)()
    oracle = [np.zeros(x.shape) for x in (q, k, v)] + [np.zeros(4)]
    lib.check(lib.lib.lib.jfa_attention_backward_reference_sinks(
        ctypes.byref(b), *(a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in oracle)),
        "jfa_attention_backward_reference_sinks")
    ours = reference_grads_of(torch, q, k, v, dout, cu_q, cu_k, scale, causal, window, softcap,
                              s)
    for name, mine, theirs, fast in zip(("dq", "dk", "dv", "dsinks"), ours, oracle, cpu):
        if name == "dsinks" and not with_sinks:
            assert mine is None and np.isnan(fast).all()  # NULL dsinks: nothing written
            continue
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(mine, fast, rtol=0, atol=2e-5, err_msg=name)


def test_the_backward_case_draws_do_as_backward_peers_and_keeps_a_reference_per_kind():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    case = cpu_case(G, "W2-d192v128", [5, 9, 3])
    bc = lp.LocalBwdCase(case, G.DATA_SEED + bp.GRAD_SEED_OFFSET)
    assert tuple(bc.dout.shape) == (17, 16, 128) and bc.dout.dtype == case.dtype  # Dv columns
    gen = torch.Generator(device="cpu").manual_seed(G.DATA_SEED + bp.GRAD_SEED_OFFSET)
    assert torch.equal(bc.dout, torch.randn(17, 16, 128, dtype=case.dtype, generator=gen))
    kind = lp.Kind(True, 2, 0, 0.0, True)
    sinks = lp.cell_sinks(torch, kind, case.H, case.device)
    assert sinks.dtype == torch.float32 and tuple(sinks.shape) == (16,)
    assert lp.cell_sinks(torch, lp.KINDS["swa128"], case.H, case.device) is None
    bc.use(kind, sinks)
    with_sinks, dsinks = bc.reference(), bc.dsinks()
    assert sorted(with_sinks) == case.sample and tuple(dsinks.shape) == (16,)
    assert tuple(with_sinks[1][2].shape) == (9, 16, 128)
    bc.use(kind)
    assert bc.dsinks() is None and not torch.equal(bc.reference()[1][0], with_sinks[1][0])
    bc.use(kind, sinks)
    assert bc.reference() is with_sinks  # computed once
    bc.release()
    assert bc.dout is None


def check_cell_case(G, cpu_case, lengths):
    return lp.LocalBwdCase(cpu_case(G, "W2-d64", lengths), G.DATA_SEED + bp.GRAD_SEED_OFFSET)


def test_jfas_backward_on_the_cpu_backend_passes_the_check_and_wrong_gradients_fail():
    """jfa_backward_prepare on a bf16 case on the CPU (libjfa's CPU backend, through the same
    params as on the GPU): its dq, dk, dv and dsinks pass check_backward; a wrong window, missing
    sinks, a wrong or non-finite dsinks fail it. The batch has sequences outside the sample, which
    dsinks sums over too."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    import libjfa
    import peers_gpu as G
    from test_peers import cpu_case
    bc = check_cell_case(G, cpu_case, [9, 300, 280, 270, 1, 12])
    case = bc.case
    assert case.sample == [0, 1, 4, 5]  # not 2 and 3
    ctx = {"jfa_lib": lp.LocalLibrary(libjfa.Library(jfa.library_path()))}
    prepare, tol = lp.jfa_backward_prepare(G, ctx), bp.TOLERANCE["bf16"]
    kind = lp.Kind(True, 5, 0, 3.0, True)
    sinks = lp.cell_sinks(torch, kind, case.H, case.device)

    def gradients(run_kind, run_sinks):
        prep = prepare(bc, run_kind, run_sinks)
        assert ctx["jfa_lib"].fields == lp.local_fields(run_kind, run_sinks)
        assert "jfa_attention_backward" in prep.provider
        bp._poison(bc, prep, False)
        return prep.run()

    bc.use(kind, sinks)
    grads = gradients(kind, sinks)
    status, errors, worst, why = lp.check_backward(bc, kind, grads, tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv", "dsinks"}
    assert worst == max(errors.values()) < tol
    # The sample's share of dsinks alone is not the batch's: the check would tell.
    part = sum(lp.local_reference_grads(
        case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
        case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.q_rows(bc.dout, i), case.scale,
        True, (5, 0), 3.0, sinks)[3] for i in case.sample)
    assert float((part - bc.dsinks()).norm() / bc.dsinks().norm()) > 10 * tol
    for bad, reason in ((-grads[3], "relative error dsinks"),
                        (torch.full_like(grads[3], float("nan")), "non-finite values in dsinks")):
        status, errors, _, why = lp.check_backward(bc, kind, grads[:3] + (bad,), tol)
        assert status == "wrong" and why.startswith(reason) and "dsinks" in errors
    assert lp.check_backward(bc, kind, gradients(kind._replace(left=20), sinks), tol)[0] == "wrong"
    assert lp.check_backward(bc, kind, gradients(kind, None), tol)[0] == "wrong"
    bc.use(kind)  # without sinks: its own reference
    status, errors, _, why = lp.check_backward(bc, kind, gradients(kind, None), tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv"}
    with pytest.raises(G.Unavailable, match="not loaded"):
        lp.jfa_backward_prepare(G, {"jfa_error": "not loaded"})(bc, kind, None)


def fa3_bwd_schema(co):
    """torch.ops.flash_attn_3.bwd's arguments as FlashAttention-3's hopper/flash_api.cpp
    registers them (window and softcap after the mask, with defaults)."""
    return ([(n, co.REQUIRED) for n in ("dout", "q", "k", "v", "out", "softmax_lse")]
            + [(n, None) for n in ("dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k",
                                   "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
                                   "softmax_scale")]
            + [("is_causal", False), ("window_size_left", -1), ("window_size_right", -1),
               ("softcap", 0.0), ("deterministic", False), ("sm_margin", 0)])


def test_fa3s_backward_gets_the_window_and_softcap_and_is_checked():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import call_overhead as co
    import peers_gpu as G
    from test_peers import FA3_FWD, cpu_case
    bc = check_cell_case(G, cpu_case, [9, 30, 4])
    case, calls = bc.case, []

    def kind_of(kw):
        return lp.Kind(kw["is_causal"], kw["window_size_left"], kw["window_size_right"],
                       kw["softcap"], False)

    def fwd(q, k, v, *rest, **kw):
        calls.append(("fwd", len(rest), kw))
        return "OUT", "LSE"

    def bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, seqused_q, seqused_k, mq, mk, **kw):
        calls.append(("bwd", (out, lse, seqused_q, seqused_k, mq, mk), kw))
        kind = kind_of(kw) if honest else kind_of(kw)._replace(left=-1)
        for i in range(case.B):
            a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
            c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
            g = lp.local_reference_grads(q[a:b], k[c:d], v[c:d], dout[a:b], kw["softmax_scale"],
                                         kind.causal, (kind.left, kind.right), kind.softcap)
            dq[a:b], dk[c:d], dv[c:d] = (x.to(q.dtype) for x in g[:3])
        return dq, dk, dv, None

    ctx = {"fa3_fwd": fwd, "fa3_bwd": bwd, "fa3_fwd_arguments": FA3_FWD,
           "fa3_bwd_arguments": fa3_bwd_schema(co), "fa3_bwd_provider": "bwd from x.so"}
    prepare, tol = lp.fa3_backward_prepare(G, co, ctx), bp.TOLERANCE["bf16"]
    kind = lp.Kind(True, 3, 0, 50.0, False)
    bc.use(kind)
    honest = True
    prep = prepare(bc, kind, None)
    window = {"window_size_left": 3, "window_size_right": 0, "softcap": 50.0}
    assert calls == [("fwd", 11, dict(softmax_scale=case.scale, is_causal=True, **window))]
    assert prep.provider == "bwd from x.so" and len(prep.outputs) == 3
    bp._poison(bc, prep, False)
    status, errors, _, why = lp.check_backward(bc, kind, prep.run(), tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv"}
    assert calls[1] == ("bwd", ("OUT", "LSE", None, None, case.max_q, case.max_k),
                        dict(softmax_scale=case.scale, is_causal=True, **window))
    honest = False  # a backward that drops the window fails the check
    assert lp.check_backward(bc, kind, prep.run(), tol)[0] == "wrong"
    assert lp.fa3_failure(G, RuntimeError("This flash attention build does not support local "
                                          "attention."))[0] == "unavailable"
    assert lp.fa3_failure(G, RuntimeError("CUDA error: an illegal memory access"))[0] == "error"
    with pytest.raises(G.Unavailable, match="no attention sinks"):
        prepare(bc, lp.KINDS["swa_sinks"], None)
    older = [a for a in fa3_bwd_schema(co) if a[0] != "window_size_left"]
    with pytest.raises(G.Unavailable, match="flash_attn_3.bwd: .*window_size_left"):
        lp.fa3_backward_prepare(G, co, dict(ctx, fa3_bwd_arguments=older))(bc, kind, None)
    with pytest.raises(G.Unavailable, match="load_library"):
        lp.fa3_backward_prepare(G, co, {"fa3_bwd_error": "torch.ops.load_library(x.so): "
                                                          "OSError"})(bc, kind, None)

def test_varlen_fa2_gets_the_window_forward_and_backward_and_is_checked():
    """aten's varlen FA2 (fa2): the forward and the backward called with the kind's window by
    keyword on torch's own schemas (fake ops computing the reference of the window they get),
    both checked against float64; a window it drops fails; unavailable on softcap and sinks."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    bc = check_cell_case(G, cpu_case, [9, 30, 4])
    case, calls = bc.case, []
    ctx = {}
    lp.load_fa2(ctx)
    assert "fa2_error" not in ctx and ctx["fa2_schemas"], ctx.get("fa2_error")

    def window_of(kw):
        return (kw["window_size_left"], kw["window_size_right"]) if honest else (-1, -1)

    def fwd(q, k, v, cu_q, cu_k, mq, mk, dropout, causal, debug, **kw):
        calls.append(("fwd", causal, kw))
        out = torch.cat([lp.local_reference(
            q[case.cu_q_host[i]:case.cu_q_host[i + 1]],
            k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
            v[case.cu_k_host[i]:case.cu_k_host[i + 1]], kw["scale"], causal, window_of(kw), 0.0)
            for i in range(case.B)]).to(q.dtype)
        return out, "LSE", "SEED", "OFFSET", None

    def bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, dropout, causal, seed, offset, **kw):
        calls.append(("bwd", (lse, seed, offset), causal, kw))
        grads = [torch.empty_like(x) for x in (q, k, v)]
        for i in range(case.B):
            a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
            c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
            g = lp.local_reference_grads(q[a:b], k[c:d], v[c:d], dout[a:b], kw["scale"], causal,
                                         window_of(kw), 0.0)
            for x, y, (lo, hi) in zip(grads, g[:3], ((a, b), (c, d), (c, d))):
                x[lo:hi] = y.to(q.dtype)
        return tuple(grads)

    ctx.update(fa2_fwd=fwd, fa2_bwd=bwd)
    honest, kind = True, lp.Kind(True, 3, 0, 0.0, False)
    window = {"scale": case.scale, "window_size_left": 3, "window_size_right": 0}
    # The forward.
    ctx["kind"], ctx["sinks"] = kind, None
    method = lp.Variant("fa2", lp.fa2_prepare(G, ctx))
    case._refs = {True: {i: lp.local_reference(
        case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
        case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, True, (3, 0), 0.0)
        for i in range(case.B)}}
    prep = method.prepare(case, True)
    assert prep.label == "varlen FA2 (aten)"
    assert G.check_output(case, True, prep, prep.run(), 1e-2)[:3:2] == ("ok", "")
    assert calls == [("fwd", True, window)]
    honest = False
    assert G.check_output(case, True, prep, prep.run(), 1e-2)[0] == "wrong"
    # The backward.
    honest, calls[:] = True, []
    bc.use(kind)
    prepare, tol = lp.fa2_backward_prepare(G, ctx), bp.TOLERANCE["bf16"]
    prep = prepare(bc, kind, None)
    assert calls == [("fwd", True, window)]
    status, errors, _, why = lp.check_backward(bc, kind, prep.run(), tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv"}
    assert calls[1] == ("bwd", ("LSE", "SEED", "OFFSET"), True, window)
    honest = False
    assert lp.check_backward(bc, kind, prep.run(), tol)[0] == "wrong"
    for name, why in (("softcap50", "no softcap"), ("swa_sinks", "no attention sinks")):
        with pytest.raises(G.Unavailable, match=why):
            prepare(bc, lp.KINDS[name], None)
        ctx["kind"] = lp.KINDS[name]
        with pytest.raises(G.Unavailable, match=why):
            method.prepare(case, True)
    with pytest.raises(G.Unavailable, match="missing"):
        lp.fa2_prepare(G, {"fa2_error": "aten._flash_attention_* is missing",
                           "kind": kind})(case, True)


def check_only_backward(ctx, on_prepared):
    """A stand-in for local_backward.measure_backward that checks and does not time: each
    method's gradients against the reference of the kind it runs (on_prepared(rec, kind, sinks,
    fields, run) first, fields the library's once prepared, run the method's call, which it returns
    the gradients of), 2 ms eager and 1 ms graph where they pass."""
    def check_only(G_, bc_, prepare, kind, sinks, rec, opts):
        ctx["jfa_lib"].fields = {}
        prep = prepare(bc_, kind, sinks)
        grads = on_prepared(rec, kind, sinks, dict(ctx["jfa_lib"].fields), prep.run)
        status, errors, worst, why = lp.check_backward(bc_, kind, grads, rec["tolerance"])
        rec.update(status=status, rel_errors=errors, rel_error=worst, reason=why)
        if status == "ok":
            rec.update(eager_ms=2.0, graph_ms=1.0)
        return rec
    return check_only


def test_a_backward_cell_checks_each_method_on_its_own_reference_and_counts_the_window(
        monkeypatch):
    """measure_backward_cell with measure_backward replaced by check-only: jfa's backward (the
    CPU backend) gets the kind's fields and sinks, jfa_nosinks none, each its own reference; a
    peer that drops the window fails and keeps no time; the rates use the backward's count."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    import libjfa
    import peers_gpu as G
    from test_peers import cpu_case
    bc = check_cell_case(G, cpu_case, [9, 300, 4])
    case = bc.case
    ctx = {"jfa_lib": lp.LocalLibrary(libjfa.Library(jfa.library_path()))}
    seen = []

    def no_window_peer(bc_, kind, sinks):  # FA3 stand-in that ignores the window
        g = lp.local_case_grads(case, bc_.dout, kind._replace(left=-1, right=-1))[0]
        grads = tuple(torch.cat([g[i][j] for i in range(case.B)]).to(case.dtype)
                      for j in range(3))
        return bp.Prepared(lambda: grads, provider="fake")

    def record(rec, kind, sinks, fields, run):
        seen.append((rec["method"], sinks is not None, fields))
        return run()

    monkeypatch.setattr(lb, "measure_backward", check_only_backward(ctx, record))
    jfa_bwd = lp.jfa_backward_prepare(G, ctx)
    impls = {"jfa": jfa_bwd, "jfa_nosinks": jfa_bwd, "fa3": no_window_peer}
    mine, peer = lp.measure_backward_cell(torch, G, ctx, impls, bc, "swa128nc", {}, 1, None)
    flops = 2.5 * lp.local_flops([9, 300, 4], [9, 300, 4], lp.KINDS["swa128nc"], 16, 64)
    assert (mine["method"], mine["pass"], mine["status"], mine["kind"], mine["base"]) == (
        "jfa", "backward", "ok", "swa128nc", "W2")
    assert mine["useful_gflop"] == flops / 1e9 and mine["tolerance"] == bp.TOLERANCE["bf16"]
    assert (mine["eager_tflops"], mine["graph_tflops"]) == (flops / 2e-3 / 1e12,
                                                            flops / 1e-3 / 1e12)
    assert seen[0][2] == {"window_left": 128, "window_right": 128, "softcap": 0.0, "sinks": None}
    assert (peer["method"], peer["status"]) == ("fa3", "wrong") and "dq" in peer["reason"]
    assert peer["eager_tflops"] is None and peer["graph_tflops"] is None

    seen.clear()
    reports = []
    mine, nosinks = lp.measure_backward_cell(torch, G, ctx, impls, bc, "swa_sinks", {}, 2,
                                             reports.append)
    assert [r["status"] for r in (mine, nosinks)] == ["ok", "ok"] and len(reports) == 4
    assert (mine["sinks"], nosinks["sinks"], nosinks["method"]) == (True, False, "jfa_nosinks")
    assert "dsinks" in mine["rel_errors"] and "dsinks" not in nosinks["rel_errors"]
    assert len(mine["rounds"]) == 2 and mine["graph_ms"] == 1.0
    assert sorted(s for _, s, _ in seen) == [False, False, True, True]
    assert all((f["sinks"] is None) == (not s) for _, s, f in seen)
    assert all(f["window_left"] == 128 and f["window_right"] == 0 for _, _, f in seen)


def test_a_backward_cell_times_jfa_without_softcap_against_the_reference_without_it(
        monkeypatch):
    """measure_backward_cell on a kind with softcap and sinks, jfa's backward on the CPU backend
    for jfa and both its baselines (measure_backward replaced by check-only): jfa_nosoftcap runs
    softcap 0 with the kind's window and sinks (dsinks checked), each method against the
    reference of what it runs, which its gradients pass and the reference with softcap fails.
    Its record says softcap 0."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jfa
    import libjfa
    import peers_gpu as G
    from test_peers import cpu_case
    monkeypatch.setitem(lp.KINDS, "cap_sinks", CAP_SINKS)
    bc = check_cell_case(G, cpu_case, [9, 300, 4])
    ctx = {"jfa_lib": lp.LocalLibrary(libjfa.Library(jfa.library_path()))}
    seen = {}

    def record(rec, kind, sinks, fields, run):
        grads = run()
        seen[rec["method"]] = (kind, sinks, fields, grads)
        return grads

    monkeypatch.setattr(lb, "measure_backward", check_only_backward(ctx, record))
    jfa_bwd = lp.jfa_backward_prepare(G, ctx)
    impls = {m: jfa_bwd for m in ("jfa", *lp.BASELINES)}
    recs = lp.measure_backward_cell(torch, G, ctx, impls, bc, "cap_sinks", {}, 1, None)
    assert [(r["method"], r["status"], r["softcap"], r["sinks"]) for r in recs] == [
        ("jfa", "ok", 1.0, True), ("jfa_nosinks", "ok", 1.0, False),
        ("jfa_nosoftcap", "ok", 0.0, True)]
    assert recs[2]["label"] == "jfa without softcap" and recs[2]["window"] == [128, 0]
    assert "dsinks" in recs[2]["rel_errors"] and recs[2]["eager_tflops"] is not None
    assert recs[2]["useful_gflop"] == recs[0]["useful_gflop"]
    kind, sinks, fields, grads = seen["jfa_nosoftcap"]
    assert kind == CAP_SINKS._replace(softcap=0.0) and sinks is not None
    assert fields == lp.local_fields(kind, sinks) and fields["softcap"] == 0.0
    assert seen["jfa"][2]["softcap"] == 1.0 and seen["jfa"][2]["sinks"] == fields["sinks"]
    bc.use(CAP_SINKS, sinks)  # jfa's reference, with the softcap: not jfa_nosoftcap's
    status, _, _, why = lp.check_backward(bc, CAP_SINKS, grads, bp.TOLERANCE["bf16"])
    assert status == "wrong", why


def test_the_gpu_check_stage_passes_the_pass_through(tmp_path):
    """scripts/gpu-check.sh's bench-local stage, its helpers stubbed: LOCAL_PASS becomes --pass,
    and the JSON and log names say the pass (local for the forward, as before)."""
    stubs = ("runtime_env() { JFA_LIBRARY=/c/lib/libjfa.so FA3_FULL_LIB=/p/fa3.so; }; "
             "left() { echo 400; }; gpu_name() { echo GPU; }; summary() { echo \"$*\"; }; "
             "timeout() { shift; echo \"$*\"; }; ")
    for value, name in ((None, "local"), ("forward", "local"), ("backward", "local-backward"),
                        ("both", "local-both")):
        out = tmp_path / (value or "default")
        out.mkdir()
        code = (f"source <({functions('stage_bench_local')}); {stubs}"
                f"OUT={out}; stage_bench_local")
        env = {k: v for k, v in os.environ.items()
               if k not in ("LOCAL_PASS", "LOCAL_WORKLOADS", "LOCAL_KINDS")}
        if value:
            env["LOCAL_PASS"] = value
        r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        args = (out / f"{name}.log").read_text().split()
        assert args[:2] == ["python3", "bench/local_peers.py"]
        assert args[args.index("--pass") + 1] == (value or "forward")
        assert args[args.index("--name") + 1] == name
        assert r.stdout.strip() == (f"bench-local GPU: {value or 'forward'}, rc 0 ({name}.json, "
                                    f"table in {name}.log)")


# ---- FlexAttention: options, table ------------------------------------------------------------

def test_the_peers_option_and_the_methods_of_a_cell():
    assert lp.parse_args([]).peer_names == ["fa3", "fa2", "flex"]
    assert lp.parse_args(["--peers", "fa3"]).peer_names == ["fa3"]
    assert lp.parse_args(["--peers", "flex"]).peer_names == ["flex"]
    assert lp.parse_args(["--peers", "flex,fa3"]).peer_names == ["fa3", "flex"]  # one order
    assert lp.parse_args(["--peers", "flex,fa2"]).peer_names == ["fa2", "flex"]
    assert lp.parse_args(["--peers", ""]).peer_names == []  # jfa (and its baselines) alone
    for bad in (["--peers", "fa4"], ["--peers", "flex,cudnn"], ["--peers"]):
        with pytest.raises(SystemExit):
            lp.parse_args(bad)
    # Every kind has jfa, its peer, varlen FA2 and FlexAttention; a run's methods filter them.
    assert lp.cell_methods("swa128") == ["jfa", "fa3", "fa2", "flex"]
    assert lp.cell_methods("swa_sinks") == ["jfa", "jfa_nosinks", "fa2", "flex"]
    assert lp.cell_methods("softcap50") == ["jfa", "fa3", "jfa_nosoftcap", "fa2", "flex"]
    assert lp.cell_methods("swa_softcap") == ["jfa", "fa3", "jfa_nosoftcap", "fa2", "flex"]
    assert lp.cell_methods("swa128", {"jfa": 1, "jfa_nosinks": 1, "flex": 1}) == ["jfa", "flex"]
    assert lp.cell_methods("sinks", {"jfa": 1, "jfa_nosinks": 1, "fa3": 1}) == [
        "jfa", "jfa_nosinks"]
    # jfa's baselines are the run's methods whatever --peers says (main's impls).
    baselines_only = dict.fromkeys(("jfa",) + tuple(lp.BASELINES))
    assert lp.cell_methods("softcap50", baselines_only) == ["jfa", "jfa_nosoftcap"]
    assert lp.cell_methods("swa_softcap", {"jfa": 1, "fa3": 1}) == ["jfa", "fa3"]
    assert lp.METHODS["flex"] == "FlexAttention"
    assert lp.SINK_METHODS == ("jfa", "jfa_nosoftcap", "flex")
    assert lp.method_label("flex") == "FlexAttention"
    assert lp.method_label("flex", object()) == lp.FLEX_SINKS_LABEL
    assert lp.method_label("jfa", object()) == "jfa"
    w = W.make_workload(W.SPEC_BY_ID["W2-d64"], [3, 4])
    recs = lp.error_records(w, "bf16", "sinks", "backward", "x", {"jfa": 1, "jfa_nosinks": 1,
                                                                   "flex": 1})
    assert [r["method"] for r in recs] == ["jfa", "jfa_nosinks", "flex"]
    assert [r["method"] for r in lp.error_records(w, "bf16", "swa128", "forward", "x")] == [
        "jfa", "fa3", "fa2", "flex"]
    recs = lp.error_records(w, "bf16", "swa_softcap", "backward", "x")
    assert [(r["method"], r["label"]) for r in recs] == [
        ("jfa", "jfa"), ("fa3", peers.FA3_LABEL), ("jfa_nosoftcap", "jfa without softcap"),
        ("fa2", "varlen FA2 (aten)"), ("flex", "FlexAttention")]


def test_the_table_gets_flexattentions_columns_and_ratios():
    bwd = {"pass": "backward"}
    records = [
        rec("jfa", "swa128", "W1", 128, 500.0, 520.0), rec("fa3", "swa128", "W1", 128, 250.0,
                                                            260.0),
        rec("flex", "swa128", "W1", 128, 125.0, 200.0),
        rec("jfa", "sinks", "W1", 128, 450.0, 470.0),
        rec("jfa_nosinks", "sinks", "W1", 128, 500.0, 500.0),
        rec("flex", "sinks", "W1", 128, 150.0, 235.0, label=lp.FLEX_SINKS_LABEL),
        rec("jfa", "swa128nc", "W2", 128, 100.0, 110.0),
        rec("fa3", "swa128nc", "W2", 128, 50.0, 55.0),
        rec("flex", "swa128nc", "W2", 128, status="error",
            reason="prepare: InductorError: out of resource: shared memory"),
        rec("jfa", "swa128", "W1", 128, 200.0, 240.0, **bwd),
        rec("flex", "swa128", "W1", 128, 100.0, 80.0, **bwd),
        rec("jfa", "softcap50", "W1", 128, 300.0, 300.0, **bwd),
        rec("fa3", "softcap50", "W1", 128, 150.0, 150.0, **bwd),
    ]
    lines = lp.format_table(records).splitlines()
    heads = [ln for ln in lines if ln.startswith("workload")]
    assert len(heads) == 2 and all(h.split()[-9:] == [
        "flex", "eager", "flex", "graph", "÷F", "eager", "÷F", "graph", "peer"] for h in heads)
    rows = [ln.split() for ln in lines if ln.startswith(("W1 ", "W2 "))]
    assert rows[0][2:] == ["swa128", "128", "500.0", "520.0", "250.0", "260.0", "2.00", "2.00",
                           "125.0", "200.0", "4.00", "2.60", "FA3"]
    assert rows[1][2:] == ["sinks", "128", "450.0", "470.0", "500.0", "500.0", "0.90", "0.94",
                           "150.0", "235.0", "3.00", "2.00", "jfa-nosink"]
    assert rows[2][2:] == ["swa128nc", "128", "100.0", "110.0", "50.0", "55.0", "2.00", "2.00",
                           "err", "err", "-", "-", "FA3"]
    # The backward: FlexAttention without FA3 (--peers flex), and FA3 without FlexAttention.
    assert rows[3][2:] == ["swa128", "128", "200.0", "240.0", "-", "-", "-", "-", "100.0",
                           "80.0", "2.00", "3.00", "FA3"]
    assert rows[4][2:] == ["softcap50", "128", "300.0", "300.0", "150.0", "150.0", "2.00", "2.00",
                           "-", "-", "-", "-", "FA3"]
    assert any(ln.startswith("flex: FlexAttention") and "sigmoid(lse - sink)" in ln
               for ln in lines)
    assert any("FlexAttention [error] (first: W2 swa128nc)" in ln and "shared memory" in ln
               for ln in lines)
    # Without FlexAttention's records: the table as before, no flex columns nor note.
    plain = lp.format_table([r for r in records if r["method"] != "flex"]).splitlines()
    assert not any("flex" in ln for ln in plain)
    assert [ln.split() for ln in plain if ln.startswith("W1 ")][0][4:] == [
        "500.0", "520.0", "250.0", "260.0", "2.00", "2.00", "FA3"]


def test_the_table_gets_jfa_without_softcaps_columns_and_ratios():
    """jfa_nosoftcap's records give a column group after FlexAttention's (its TFLOP/s, nocap, and
    jfa ÷ it, ÷C), "-" on the kinds without softcap, and a line saying what it is; the peer's and
    FlexAttention's columns as before."""
    bwd = {"pass": "backward"}
    records = [
        rec("jfa", "swa128", "W1", 128, 500.0, 520.0),
        rec("fa3", "swa128", "W1", 128, 250.0, 260.0),
        rec("flex", "swa128", "W1", 128, 125.0, 130.0),
        rec("jfa", "softcap50", "W1", 128, 400.0, 440.0),
        rec("fa3", "softcap50", "W1", 128, 200.0, 220.0),
        rec("jfa_nosoftcap", "softcap50", "W1", 128, 500.0, 550.0, softcap=0.0),
        rec("flex", "softcap50", "W1", 128, 100.0, 110.0),
        rec("jfa", "swa_softcap", "W1", 128, 300.0, 330.0),
        rec("fa3", "swa_softcap", "W1", 128, status="unavailable", reason="no softcap here"),
        rec("jfa_nosoftcap", "swa_softcap", "W1", 128, status="wrong",
            reason="relative error 0.3 > 0.01"),
        rec("jfa", "sinks", "W1", 128, 450.0, 470.0),
        rec("jfa_nosinks", "sinks", "W1", 128, 500.0, 500.0),
        rec("jfa", "softcap50", "W1", 128, 200.0, 200.0, **bwd),
        rec("fa3", "softcap50", "W1", 128, 100.0, 100.0, **bwd),
        rec("jfa_nosoftcap", "softcap50", "W1", 128, 250.0, 400.0, **bwd),
    ]
    lines = lp.format_table(records).splitlines()
    heads = [ln.split() for ln in lines if ln.startswith("workload")]
    assert heads[0][-17:] == ["flex", "eager", "flex", "graph", "÷F", "eager", "÷F", "graph",
                              "nocap", "eager", "nocap", "graph", "÷C", "eager", "÷C", "graph",
                              "peer"]
    assert heads[1][-9:] == ["nocap", "eager", "nocap", "graph", "÷C", "eager", "÷C", "graph",
                             "peer"] and "flex" not in heads[1]  # the backward has no flex
    rows = [ln.split() for ln in lines if ln.startswith("W1 ")]
    assert rows[0][2:] == ["swa128", "128", "500.0", "520.0", "250.0", "260.0", "2.00", "2.00",
                           "125.0", "130.0", "4.00", "4.00", "-", "-", "-", "-", "FA3"]
    assert rows[1][2:] == ["softcap50", "128", "400.0", "440.0", "200.0", "220.0", "2.00",
                           "2.00", "100.0", "110.0", "4.00", "4.00", "500.0", "550.0", "0.80",
                           "0.80", "FA3"]
    assert rows[2][2:] == ["swa_softcap", "128", "300.0", "330.0", "n/a", "n/a", "-", "-", "-",
                           "-", "-", "-", "wrong", "wrong", "-", "-", "FA3"]
    assert rows[3][2:] == ["sinks", "128", "450.0", "470.0", "500.0", "500.0", "0.90", "0.94",
                           "-", "-", "-", "-", "-", "-", "-", "-", "jfa-nosink"]
    assert rows[4][2:] == ["softcap50", "128", "200.0", "200.0", "100.0", "100.0", "2.00", "2.00",
                           "250.0", "400.0", "0.80", "0.50", "FA3"]
    assert any(ln.startswith("nocap: jfa without softcap (softcap 0") for ln in lines)
    assert any("jfa without softcap [wrong] (first: W1 swa_softcap)" in ln for ln in lines)
    # The columns line up: every row of a table as wide as its header, the peer's name aside.
    tables = "\n".join(lines).split("\n\n")
    assert len(tables) == 2
    for table in tables:
        widths = {len(ln.rsplit("  ", 1)[0]) for ln in table.splitlines()
                  if ln.startswith(("workload", "W1 "))}
        assert len(widths) == 1, widths
    # Without its records: no nocap columns nor line.
    plain = lp.format_table([r for r in records if r["method"] != "jfa_nosoftcap"])
    assert "nocap" not in plain and "÷C" not in plain


# ---- FlexAttention: mask_mod, score_mod, the sink correction (torch, CPU) ----------------------

def packed_lengths_case(torch, lengths_q, lengths_k):
    """What flex_documents reads of a case: lengths, offsets and totals, on the CPU."""
    from types import SimpleNamespace
    cu_q = [0] + list(np.cumsum(lengths_q))
    cu_k = [0] + list(np.cumsum(lengths_k))
    return SimpleNamespace(
        B=len(lengths_q), lq=list(lengths_q), lk=list(lengths_k), total_q=int(cu_q[-1]),
        total_k=int(cu_k[-1]), cross=list(lengths_q) != list(lengths_k),
        cu_q=torch.tensor(cu_q, dtype=torch.int32), cu_k=torch.tensor(cu_k, dtype=torch.int32),
        cu_q_host=[int(x) for x in cu_q], cu_k_host=[int(x) for x in cu_k],
        device=torch.device("cpu"))


def block_visible(torch, case, causal, window):
    """[total_q, total_k] bool: the reference's rule (visible) in each sequence's block."""
    seen = torch.zeros(case.total_q, case.total_k, dtype=torch.bool)
    for b in range(case.B):
        a, e = case.cu_q_host[b], case.cu_q_host[b + 1]
        c, d = case.cu_k_host[b], case.cu_k_host[b + 1]
        seen[a:e, c:d] = lp.visible(e - a, d - c, causal, window)
    return seen


FLEX_WINDOWS = [(-1, -1), (0, 0), (1, 0), (0, 1), (2, 3), (3, -1), (-1, 2), (128, 0), (128, 128),
                (4096, 0)]


@pytest.mark.parametrize("lengths_q,lengths_k", [
    (LENGTHS_Q, LENGTHS_Q), (LENGTHS_Q, LENGTHS_K), ([5, 9, 3], [3, 9, 5]), ([2, 6], [8, 1])])
def test_flexattentions_mask_mod_is_the_references_rule_over_packed_sequences(lengths_q,
                                                                               lengths_k):
    """flex_local_mask_mod on index tensors (as create_block_mask and the kernels call it, no
    compile): the block-diagonal of the reference's visibility per sequence, bottom-right aligned
    where q and k lengths differ (rows without keys, empty sequences), for every kind's window,
    causal or not, int32 indices as FlexAttention's and int64."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    case = packed_lengths_case(torch, lengths_q, lengths_k)
    doc_q, doc_k, shift = lp.flex_documents(case)
    assert doc_q.dtype == torch.int32 and doc_q.tolist() == sum(
        ([b] * n for b, n in enumerate(lengths_q)), [])
    assert doc_k.tolist() == sum(([b] * n for b, n in enumerate(lengths_k)), [])
    assert (shift is None) == (lengths_q == lengths_k)
    kinds = [lp.Kind(c, left, right, 0.0, False) for c in (False, True)
             for left, right in FLEX_WINDOWS] + list(lp.KINDS.values())
    for kind in kinds:
        mask_mod = lp.flex_local_mask_mod(doc_q, doc_k, shift, kind)
        want = block_visible(torch, case, kind.causal, (kind.left, kind.right))
        for dtype in (torch.int32, torch.int64):
            q_idx = torch.arange(case.total_q, dtype=dtype)[:, None]
            kv_idx = torch.arange(case.total_k, dtype=dtype)[None, :]
            got = mask_mod(torch.tensor(0), torch.tensor(0), q_idx, kv_idx)
            assert torch.equal(got, want), (kind, dtype)
        # The block mask depends on the mask alone: causal ignores right.
        assert lp.flex_mask_key(kind) == (kind.causal, kind.left,
                                          0 if kind.causal else kind.right)
    assert lp.flex_mask_key(lp.KINDS["swa128"]) == lp.flex_mask_key(lp.KINDS["swa_sinks"])
    assert lp.flex_mask_key(lp.KINDS["softcap50"]) == lp.flex_mask_key(lp.KINDS["sinks"])


def test_flexattentions_score_mod_is_the_softcap_and_is_kept_per_cap():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    score = torch.linspace(-400.0, 400.0, 101, dtype=torch.float64).view(1, 1, 101, 1)
    mod = lp.flex_softcap_score_mod(50.0)
    assert mod is lp.flex_softcap_score_mod(50) and mod is not lp.flex_softcap_score_mod(30.0)
    idx = torch.arange(101)
    got = mod(score, torch.tensor(0), torch.tensor(0), idx[:, None], idx[None, :])
    torch.testing.assert_close(got, 50.0 * torch.tanh(score / 50.0), rtol=0, atol=0)
    assert float(got.max()) < 50.0 and float(got.min()) > -50.0
    # The reference's softcap is the same function of the scaled scores: its weights are the
    # softmax of the score_mod's.
    s = 80.0 * torch.randn(2, 5, 7, dtype=torch.float64)
    seen = torch.ones(5, 7, dtype=torch.bool)
    modded = mod(s, torch.tensor(0), torch.arange(2)[:, None, None], torch.arange(5)[:, None],
                 torch.arange(7)[None, :])
    torch.testing.assert_close(lp.local_probs(s, seen, 50.0), torch.softmax(modded, -1),
                               rtol=0, atol=1e-15)


def dense_flex(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
               return_aux=None, return_lse=False):
    """A dense stand-in for flex_attention (torch autograd, any device; FlexAttention has no CPU
    backward): [1, H, T, D] inputs, block_mask.mask_mod and score_mod evaluated on every
    (query, key) index, rows that see no key zeros with lse -inf (FlexAttention's convention);
    the output in q's dtype, the LSE (natural log) in float32, float64 for float64 inputs."""
    import torch
    from types import SimpleNamespace
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    H, T, S = q.shape[1], q.shape[2], k.shape[2]
    if enable_gqa and k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], 1)
        v = v.repeat_interleave(H // v.shape[1], 1)
    s = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale
    qi, ki = torch.arange(T)[:, None], torch.arange(S)[None, :]
    if score_mod is not None:
        s = score_mod(s, torch.tensor(0), torch.arange(H)[:, None, None], qi, ki)
    seen = (block_mask.mask_mod(torch.tensor(0), torch.tensor(0), qi, ki) if block_mask
            is not None else torch.ones(T, S, dtype=torch.bool))
    live = seen.any(-1)
    s = torch.where(live[:, None], s.masked_fill(~seen, float("-inf")), torch.zeros_like(s))
    out = (torch.matmul(torch.softmax(s, -1) * live[:, None], v.to(work))).to(q.dtype)
    lse = torch.where(live, torch.logsumexp(s, -1), torch.full_like(s[..., 0], float("-inf")))
    if return_aux is not None:
        return out, SimpleNamespace(lse=lse)
    return (out, lse) if return_lse else out


@pytest.mark.parametrize("lq,lk,causal,window,softcap,with_sinks", GRAD_CASES)
def test_the_sink_correction_is_exact_forward_and_backward(rng, lq, lk, causal, window, softcap,
                                                           with_sinks):
    """flex_sink_correction in float64: attention without sinks (its out and LSE, differentiable)
    corrected by sigmoid(lse - sink) is local_reference with the sinks, and its autograd (dq, dk,
    dv through out and lse, dsinks) is local_reference_grads' with them, rows without keys zeros
    and passing nothing back, through flex_attend (GQA: two query heads on one K/V head)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from types import SimpleNamespace
    q, k, v, dout = (torch.from_numpy(rng.standard_normal(shape)) for shape in
                     ((lq, 2, 3), (lk, 1, 3), (lk, 1, 2), (lq, 2, 2)))
    sinks = torch.from_numpy(2.0 * rng.standard_normal(2))
    kind = lp.Kind(causal, window[0], window[1], softcap, True)
    case = packed_lengths_case(torch, [lq], [lk])
    case.H, case.Hkv, case.scale = 2, 1, 0.7
    bm = SimpleNamespace(mask_mod=lp.flex_local_mask_mod(*lp.flex_documents(case), kind))
    import peers_gpu as G
    fns = (dense_flex, None, None, lp.flex_sink_correction)
    attend = lp.flex_attend(G, fns, case, kind, bm, with_sinks=True)
    leaves = [G.flex_layout(x).clone().requires_grad_(True) for x in (q, k, v)]
    leaves.append(sinks.clone().requires_grad_(True))
    out = attend(*leaves)
    want = lp.local_reference(q, k, v, 0.7, causal, window, softcap, sinks)
    np.testing.assert_allclose(G.flex_packed(out).detach().numpy(), want.numpy(), rtol=0,
                               atol=1e-13)
    grads = torch.autograd.grad(out, leaves, grad_outputs=G.flex_layout(dout))
    ref = lp.local_reference_grads(q, k, v, dout, 0.7, causal, window, softcap, sinks)
    for name, g, r in zip(("dq", "dk", "dv", "dsinks"), grads, ref):
        g = g if name == "dsinks" else G.flex_packed(g)
        assert bool(torch.isfinite(g).all()), name
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=0, atol=1e-12, err_msg=name)
    # Without the correction: the attention without sinks, which the reference with them is not.
    plain = lp.flex_attend(G, fns, case, kind, bm)(*(x.detach() for x in leaves[:3]))
    np.testing.assert_allclose(G.flex_packed(plain).numpy(), lp.local_reference(
        q, k, v, 0.7, causal, window, softcap).numpy(), rtol=0, atol=1e-13)
    assert float((G.flex_packed(plain) - want).abs().max()) > 1e-3
    # The algebra itself: out * S / (S + exp(sink)) with S = exp(lse).
    lse = torch.from_numpy(rng.standard_normal((1, 2, 3)))
    o = torch.from_numpy(rng.standard_normal((1, 2, 3, 4)))
    S = lse.exp()
    torch.testing.assert_close(lp.flex_sink_correction(o, lse, sinks),
                               o * (S / (S + sinks.exp().view(1, 2, 1)))[..., None],
                               rtol=1e-14, atol=0)


def eager_flex_functions():
    """torch's eager flex_attention and create_block_mask (no inductor: the CPU forward), with
    the eager sink correction, as flex_fns gives them."""
    flex_mod = pytest.importorskip("torch.nn.attention.flex_attention",
                                   reason="this torch has no FlexAttention")
    return (flex_mod.flex_attention, flex_mod.create_block_mask, flex_mod.create_block_mask,
            lp.flex_sink_correction)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flexattentions_forward_on_the_cpu_passes_the_check_per_kind(monkeypatch):
    """measure_cell with FlexAttention (torch's eager flex_attention on a bf16 CPU case, the block
    mask of each kind built by create_block_mask) and peers_gpu.measure replaced by check-only:
    the window, softcap and sinks kinds pass the check, the sinks ones as the LSE-corrected
    variant against the reference with sinks; the block masks are built once per mask; without
    the correction the sinks kinds fail, and so does a window that is not the kind's."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    case = cpu_case(G, "W2-d64", [9, 300, 4])
    ctx = {"flex_functions": eager_flex_functions()}
    impls = {"flex": lp.Variant("flex", lp.flex_prepare(G, ctx))}

    def check_only(method, case_, causal, timing, opts):
        prep = method.prepare(case_, causal)
        status, err, why = G.check_output(case_, causal, prep, prep.run(), G.TOLERANCE["bf16"])
        return {"method": method.name, "label": prep.label or method.current_label(),
                "workload": case_.w.id, "dtype": "bf16", "causal": causal, "head_dim": 64,
                "head_dim_v": 64, "status": status, "reason": why, "rel_error": err,
                "median_ms": 1.0, "min_ms": 1.0, "eager_ms": 2.0, "graph_ms": 1.0,
                "provider": prep.provider, "note": prep.note, "useful_gflop": 1.0,
                "min_bytes": 0.0}

    monkeypatch.setattr(G, "measure", check_only)
    for name in ("swa128nc", "swa_softcap", "swa_sinks"):
        (r,) = lp.measure_cell(torch, G, ctx, impls, case, name, None, {}, 1, None)
        assert (r["method"], r["status"], r["kind"], r["pass"]) == ("flex", "ok", name,
                                                                    "forward"), r
        assert r["sinks"] == lp.KINDS[name].sinks and r["max_abs_error"] < 0.05
        assert r["label"] == (lp.FLEX_SINKS_LABEL if r["sinks"] else "FlexAttention")
        assert "block mask of the window" in r["note"] and "torch.compile(flex_attention)" in (
            r["provider"])
        assert ("softcap 50 as a score_mod" in r["note"]) == (name == "swa_softcap")
        assert ("sigmoid(lse - sink)" in r["note"]) == r["sinks"]
    # One block mask per (causal, left, right): swa_sinks' is swa128's.
    assert sorted(case._flex_local_masks) == [(False, 128, 128), (True, 128, 0), (True, 4096, 0)]
    (r,) = lp.measure_cell(torch, G, ctx, impls, case, "swa128", None, {}, 1, None)
    assert r["status"] == "ok" and len(case._flex_local_masks) == 3
    lp.release_flex_masks(case)
    assert not hasattr(case, "_flex_local_masks")

    ctx["flex_functions"] = ctx["flex_functions"][:3] + (lambda out, lse, sinks: out,)
    (r,) = lp.measure_cell(torch, G, ctx, impls, case, "swa_sinks", None, {}, 1, None)
    assert r["status"] == "wrong" and r["eager_tflops"] is None
    # A mask whose window is not the kind's: a kind of swa128's mask checked on swa4096's.
    ctx["flex_functions"] = eager_flex_functions()
    case._flex_local_masks = {lp.flex_mask_key(lp.KINDS["swa4096"]): lp.flex_local_block_mask(
        G, ctx["flex_functions"], case, lp.KINDS["swa128"])}
    (r,) = lp.measure_cell(torch, G, ctx, impls, case, "swa4096", None, {}, 1, None)
    assert r["status"] == "wrong"


def test_flexattention_is_unavailable_without_it_and_a_failed_mask_is_kept(monkeypatch):
    pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    case = cpu_case(G, "W2-d64", [9, 30, 4])
    calls = []

    def failing(*a, **k):
        calls.append(a)
        raise RuntimeError("no mask today")

    fns = (None, failing, failing, None)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no mask today"):
            lp.flex_local_block_mask(G, fns, case, lp.KINDS["swa128"])
    assert len(calls) == 2  # the compiled one and the eager one, once: the failure is kept

    def unavailable(ctx):
        raise G.Unavailable("torch.nn.attention.flex_attention: ImportError: x")

    monkeypatch.setattr(G, "flex_functions", unavailable)
    with pytest.raises(G.Unavailable, match="flex_attention"):
        lp.flex_fns(G, {})


def cpu_streams(torch, monkeypatch):
    """backward_peers._autograd_peer's CUDA streams as no-ops for the rest of the test, so that it
    runs on the CPU."""
    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


def test_flexattentions_backward_gradients_pass_the_check_and_wrong_ones_fail(monkeypatch):
    """flex_backward_prepare through backward_peers._autograd_peer on a bf16 CPU case, a dense
    stand-in for flex_attention (FlexAttention has no CPU backward) with the kind's real block
    mask's mask_mod: dq, dk, dv (unpacked from [1, H, tokens, D]) and, with sinks, dsinks from
    autograd pass check_backward; without the sink correction, or with a window that is not the
    kind's, they fail. Cross lengths with rows that see no key."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    flex_mod = pytest.importorskip("torch.nn.attention.flex_attention",
                                   reason="this torch has no FlexAttention")
    bc = lp.LocalBwdCase(cpu_case(G, "X1", [9, 30, 4]), G.DATA_SEED + bp.GRAD_SEED_OFFSET)
    case, tol = bc.case, bp.TOLERANCE["bf16"]
    assert case.cross and case.lq[0] > case.lk[0]  # causal rows without keys
    cbm = flex_mod.create_block_mask
    ctx = {"flex_functions": (dense_flex, cbm, cbm, lp.flex_sink_correction)}
    prepare = lp.flex_backward_prepare(G, ctx)

    cpu_streams(torch, monkeypatch)

    def gradients(kind, sinks):
        prep = prepare(bc, kind, sinks)
        assert "autograd" in prep.provider and prep.stream is not None
        assert len(prep.poison_like) == (4 if sinks is not None else 3)
        bp._poison(bc, prep, False)
        return prep.unpack(prep.run())

    kind = lp.Kind(True, 5, 0, 3.0, True)
    sinks = lp.cell_sinks(torch, kind, case.H, case.device)
    bc.use(kind, sinks)
    grads = gradients(kind, sinks)
    assert [tuple(g.shape) for g in grads] == [tuple(case.q.shape), tuple(case.k.shape),
                                               tuple(case.v.shape), (case.H,)]
    status, errors, worst, why = lp.check_backward(bc, kind, grads, tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv", "dsinks"}
    ctx["flex_functions"] = ctx["flex_functions"][:3] + (lambda out, lse, s: out * s.sum(),)
    assert lp.check_backward(bc, kind, gradients(kind, sinks), tol)[0] == "wrong"
    ctx["flex_functions"] = (dense_flex, cbm, cbm, lp.flex_sink_correction)
    bc.use(kind)  # without sinks
    status, errors, _, why = lp.check_backward(bc, kind, gradients(kind, None), tol)
    assert (status, why) == ("ok", "") and set(errors) == {"dq", "dk", "dv"}
    wide = kind._replace(left=20)  # a mask of another window, kept under this kind's key
    case._flex_local_masks[lp.flex_mask_key(kind)] = lp.flex_local_block_mask(
        G, ctx["flex_functions"], case, wide)
    assert lp.check_backward(bc, kind, gradients(kind, None), tol)[0] == "wrong"


def test_a_backward_cell_gives_flexattention_the_sinks(monkeypatch):
    """measure_backward_cell with FlexAttention among the methods (measure_backward replaced by
    check-only, a dense stand-in for flex_attention): it gets the kind's sinks as jfa does, its
    record is labelled the LSE-corrected variant and checked against the reference with sinks;
    FA3's and jfa_nosinks' without."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import peers_gpu as G
    from test_peers import cpu_case
    flex_mod = pytest.importorskip("torch.nn.attention.flex_attention",
                                   reason="this torch has no FlexAttention")
    bc = check_cell_case(G, cpu_case, [9, 300, 4])
    cbm = flex_mod.create_block_mask
    ctx = {"flex_functions": (dense_flex, cbm, cbm, lp.flex_sink_correction)}
    flex = lp.flex_backward_prepare(G, ctx)
    seen = []

    def reference_peer(bc_, kind, sinks):  # jfa_nosinks / fa3 stand-in: the exact gradients
        g = lp.local_case_grads(bc_.case, bc_.dout, kind)[0]
        grads = tuple(torch.cat([g[i][j] for i in range(bc_.case.B)]).to(bc_.case.dtype)
                      for j in range(3))
        return bp.Prepared(lambda: grads, provider="fake")

    cpu_streams(torch, monkeypatch)

    def check_only(G_, bc_, prepare, kind, sinks, rec, opts):
        prep = prepare(bc_, kind, sinks)
        seen.append((rec["method"], sinks is not None))
        status, errors, worst, why = lp.check_backward(bc_, kind, prep.unpack(prep.run()),
                                                       rec["tolerance"])
        rec.update(status=status, rel_errors=errors, rel_error=worst, reason=why)
        if status == "ok":
            rec.update(eager_ms=2.0, graph_ms=1.0)
        return rec

    monkeypatch.setattr(lb, "measure_backward", check_only)
    impls = {"jfa_nosinks": reference_peer, "fa3": reference_peer, "flex": flex}
    nosinks, fx = lp.measure_backward_cell(torch, G, ctx, impls, bc, "swa_sinks", {}, 1, None)
    assert seen == [("jfa_nosinks", False), ("flex", True)]
    assert (fx["method"], fx["status"], fx["sinks"], fx["label"]) == (
        "flex", "ok", True, lp.FLEX_SINKS_LABEL)
    assert "dsinks" in fx["rel_errors"] and fx["eager_tflops"] is not None
    assert nosinks["status"] == "ok" and not nosinks["sinks"]
    seen.clear()
    fa3, fx = lp.measure_backward_cell(torch, G, ctx, impls, bc, "swa128nc", {}, 1, None)
    assert seen == [("fa3", False), ("flex", False)]
    assert (fx["status"], fx["label"], fx["sinks"]) == ("ok", "FlexAttention", False)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_every_window_shares_flexattentions_compiled_graph():
    """torch.compile(flex_attention) (a backend that counts the graphs dynamo hands it: its guards
    are the same as inductor's) on the forward of each kind of a CPU case: the windows' masks
    capture left and right as tensors, so every window and the plain causal mask take one graph;
    the softcap's score_mod and the sinks' LSE one more each; a prepare again (another round)
    none, its block mask kept."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    flex_mod = pytest.importorskip("torch.nn.attention.flex_attention",
                                   reason="this torch has no FlexAttention")
    import torch._dynamo
    import peers_gpu as G
    from test_peers import cpu_case
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    flex = torch.compile(flex_mod.flex_attention, backend=counting)
    fns = (flex, flex_mod.create_block_mask, flex_mod.create_block_mask, lp.flex_sink_correction)
    case = cpu_case(G, "W2-d64", [9, 30, 4])
    counts = []
    for name in ("swa128", "swa4096", "swa128nc", "softcap50", "swa_softcap", "swa128", "sinks",
                 "swa_sinks"):
        kind = lp.KINDS[name]
        ctx = {"flex_functions": fns, "kind": kind,
               "sinks": lp.cell_sinks(torch, kind, case.H, case.device)}
        lp.flex_prepare(G, ctx)(case, kind.causal).run()
        counts.append(len(graphs))
    torch._dynamo.reset()
    assert counts == [1, 1, 1, 2, 2, 2, 3, 3]
