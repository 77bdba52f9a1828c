"""bench/local_peers.py without a GPU: the window-aware count of visible pairs against a brute
force, the backward's count, the kinds and the options (--pass), the tables of both passes on fake
records; with torch (on the CPU), the float64 reference against libjfa's reference and CPU
backend, its gradients against finite differences, libjfa's float64 backward reference and CPU
backward, jfa's params through bench/libjfa.py with the local-attention fields, jfa's backward
method on the CPU backend, FA3's forward and backward calls with the window and softcap (fake
ops), and a backward cell's plumbing."""

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
import local_peers as lp  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from bench_scripts import help_without_torch  # noqa: E402


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
                   "--dtypes", "--pass"):
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


def test_a_cell_checks_each_method_on_its_own_reference_and_counts_the_window(monkeypatch):
    """measure_cell with peers_gpu.measure replaced by check-only: jfa gets the kind's fields
    (sinks for jfa, none for jfa_nosinks) and the reference of what it runs; a peer that ignores
    the window fails the check and keeps no time; the rates use the window-aware count."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import ctypes
    import peers_gpu as G
    from test_peers import cpu_case

    case = cpu_case(G, "W2-d64", [9, 300, 4], dtype="fp16")
    ctx = {"jfa_lib": lp.LocalLibrary(None)}
    fields_seen = []

    def rows_of(causal, window, softcap, sinks):
        return torch.cat([lp.local_reference(
            case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
            case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, causal, window, softcap,
            sinks) for i in range(case.B)]).to(case.dtype)

    def fake_jfa(case_, causal):
        f = dict(ctx["jfa_lib"].fields)
        fields_seen.append(f)
        sinks = None if f["sinks"] is None else torch.from_numpy(np.ctypeslib.as_array(
            (ctypes.c_float * case.H).from_address(f["sinks"])).copy())
        out = rows_of(causal, (f["window_left"], f["window_right"]), f["softcap"], sinks)
        return G.Prepared(lambda: out, lambda o, i: case.q_rows(o, i), dense=lambda o: o)

    def fake_fa3(case_, causal):  # ignores the window
        out = rows_of(causal, (-1, -1), ctx["kind"].softcap, None)
        return G.Prepared(lambda: out, lambda o, i: case.q_rows(o, i), dense=lambda o: o)

    def check_only(method, case_, causal, timing, opts):
        prep = method.prepare(case_, causal)
        status, err, why = G.check_output(case_, causal, prep, prep.run(), G.TOLERANCE["fp16"])
        return {"method": method.name, "label": method.current_label(), "workload": case_.w.id,
                "dtype": "fp16", "causal": causal, "head_dim": 64, "head_dim_v": 64,
                "status": status, "reason": why, "rel_error": err, "median_ms": 1.0,
                "min_ms": 1.0, "eager_ms": 2.0, "graph_ms": 1.0, "useful_tflops": 9.0,
                "eff_tbps": 1.0, "useful_gflop": 123.0, "min_bytes": 0.0}

    monkeypatch.setattr(G, "measure", check_only)
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

    def check_only(G_, bc_, prepare, kind, sinks, rec, opts):
        ctx["jfa_lib"].fields = {}
        prep = prepare(bc_, kind, sinks)
        seen.append((rec["method"], sinks is not None, dict(ctx["jfa_lib"].fields)))
        status, errors, worst, why = lp.check_backward(bc_, kind, prep.run(), rec["tolerance"])
        rec.update(status=status, rel_errors=errors, rel_error=worst, reason=why)
        if status == "ok":
            rec.update(eager_ms=2.0, graph_ms=1.0)
        return rec

    monkeypatch.setattr(lp, "measure_backward", check_only)
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


def test_the_gpu_check_stage_passes_the_pass_through(tmp_path):
    """scripts/gpu-check.sh's bench-local stage, its helpers stubbed: LOCAL_PASS becomes --pass,
    and the JSON and log names say the pass (local for the forward, as before)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"
    stubs = ("runtime_env() { JFA_LIBRARY=/c/lib/libjfa.so FA3_FULL_LIB=/p/fa3.so; }; "
             "left() { echo 400; }; gpu_name() { echo GPU; }; summary() { echo \"$*\"; }; "
             "timeout() { shift; echo \"$*\"; }; ")
    for value, name in ((None, "local"), ("forward", "local"), ("backward", "local-backward"),
                        ("both", "local-both")):
        out = tmp_path / (value or "default")
        out.mkdir()
        code = (f"source <(sed -n '/^stage_bench_local()/,/^}}/p' {script}); {stubs}"
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
