"""bench/local_peers.py without a GPU: the window-aware count of visible pairs against a brute
force, the kinds and the options, the table on fake records; with torch (on the CPU), the float64
reference against libjfa's reference and CPU backend, jfa's params through bench/libjfa.py with
the local-attention fields, and FA3's call with the window and softcap (a fake op)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

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
                ["--rounds", "0"], ["--runs", "0"], ["--kinds", ","], ["--dtypes", "fp8"]):
        with pytest.raises(SystemExit):
            lp.parse_args(bad)


def test_help_and_import_need_no_torch():
    text = help_without_torch("local_peers")
    for option in ("--fa3-lib", "--lib", "--kinds", "--head-dims", "--rounds", "--time-limit-s",
                   "--dtypes"):
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
