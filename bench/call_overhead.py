#!/usr/bin/env python3
"""What one call costs as a PyTorch user times it, for jfa's public entry and its peers, on the
same tensors in one process. The peers' tables (bench/peers.py) hide the host path on purpose; a
user's timing does not, and on short batches the host path can be most of the call.

Three figures per method, workload, dtype and mask:
- host_us: host time per call. N calls are issued back to back with no synchronize in between and
  timed with time.perf_counter, while a torch.cuda._sleep kernel queued first keeps the GPU busy,
  so the host never waits for the GPU; the median of a few such batches (the host's pace varies
  more than the GPU's). If the spin had already ended when the host loop finished (the host may
  have waited: an op that synchronizes, a full launch queue), the spin is resized from the
  measured host time and the batch run again; still so, the figure is flagged gpu_bound.
- eager_ms: CUDA events around one call, torch.cuda.synchronize() after each, nothing queued
  before it: the host path up to the first launch is inside the interval, as in a user's timing.
- graph_ms: the call captured once in a CUDA graph (warmed up on a side stream first) and
  replayed; events around each replay, synchronized after each. What is left of a call without
  its host path. A method that cannot be captured gets the reason instead.
Times are medians over --runs after warm-up; useful TFLOP/s and TB/s count as bench/workloads.py does.

Every method is checked against a float32 reference on a sample of sequences before it is timed
(bench/peers_gpu.py's check); a method that fails is recorded and not timed for that cell. The
graph's replay is checked too. With --rounds R every cell is measured R times, the methods in
alternating order (bench/rounds.py), and each method keeps its median round by eager_ms (every
round's figures in the record's "rounds").

Methods: jfa (jfa.jagged_attention, the package in python/, library from --lib), fa3
(torch.ops.flash_attn_3.fwd, varlen; --fa3-lib loads it), fa2_varlen (aten's varlen FA2),
triton_jfa (bench/triton_jfa.py, output preallocated), cudnn_padded (SDPA on padded inputs built
once). Workloads: W1..W4 (lengths from the CLI) and S1, three short sequences with two heads.

usage: python3 bench/call_overhead.py --lib build/gpu/src/libjfa.so --cli build/gpu/tools/jfa
           [--fa3-lib .fa3/flash_attn_3.so] [--workloads W1,W2,W3,W4,S1] [--dtypes fp16]
           [--masks both] [--rounds 3] [--quick] [--out bench/results] [--name call-overhead]
"""
import argparse
import datetime
import glob
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import workloads as W  # noqa: E402
import rounds  # noqa: E402
from peers import parse_list, table_order, torch_with_cuda  # noqa: E402
from workloads import mask_name  # noqa: E402

METHOD_ORDER = ["jfa", "jfa_c", "fa3", "fa2_varlen", "triton_jfa", "cudnn_padded"]
LABELS = {"jfa": "jfa.jagged_attention", "jfa_c": "libjfa's C entry (ctypes, kept workspace)",
          "fa3": "FA3 varlen (torch.ops.flash_attn_3.fwd)",
          "fa2_varlen": "varlen FA2 (aten)", "triton_jfa": "plain Triton JFA",
          "cudnn_padded": "padded cuDNN SDPA"}
SHORT = {"jfa": "jfa", "jfa_c": "jfa C", "fa3": "FA3", "fa2_varlen": "FA2var", "triton_jfa": "Triton",
         "cudnn_padded": "cuDNNpad"}
TIMED = ("ok", "unchecked")  # statuses that carry times
CELL = {"wrong": "wrong", "unavailable": "n/a", "error": "err", "skipped": "skip"}

# A short call: little GPU work, so the host path is most of what a user's timing shows.
SMALL = W.WorkloadSpec("S1", "S1", 128, "lengths [200, 333, 64], 2 heads: a short call",
                       heads=2, heads_kv=2)
SMALL_LENGTHS = (200, 333, 64)
DEFAULT_WORKLOADS = ["W1", "W2", "W3", "W4", "S1"]

CLOCK_HZ = 2.0e9            # cycles per second the spin is sized with (H200: up to 1.98 GHz)
MIN_SPIN_CYCLES = 1_000_000  # 0.5 ms
MAX_SPIN_CYCLES = 8_000_000_000

# The per-round figures a kept record carries in "rounds".
ROUND_FIELDS = ("status", "host_us", "host_gpu_bound", "eager_ms", "graph_ms")

# FA3's varlen forward: these go by position (what lies between them takes its schema default),
# the softmax scale and the mask by keyword under whichever name the installed schema uses.
FA3_POSITIONAL = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
FA3_KEYWORDS = {"softmax_scale": ("softmax_scale", "scale"), "is_causal": ("is_causal", "causal")}
REQUIRED = object()  # a schema argument without a default


# ---- pure parts (no torch) ---------------------------------------------------------------------

def fa3_call(arguments, values, keywords=FA3_KEYWORDS):
    """(args, kwargs) for FA3's fwd from its schema's arguments, given as names (default None) or
    (name, default) pairs (REQUIRED: none). The argument list differs by FA3 version, so the call
    is built from the schema rather than written out."""
    spec = [(a, None) if isinstance(a, str) else (a[0], a[1]) for a in arguments]
    index = {name: i for i, (name, _) in enumerate(spec)}
    positional = [n for n in values if n not in keywords]
    absent = [n for n in positional if n not in index]
    if absent:
        raise ValueError(f"the schema has no {', '.join(absent)} (it has "
                         f"{', '.join(n for n, _ in spec)})")
    kwargs = {}
    for canonical, aliases in keywords.items():
        if canonical not in values:
            continue
        name = next((a for a in aliases if a in index), None)
        if name is None:
            raise ValueError(f"the schema has none of {', '.join(aliases)}")
        kwargs[name] = values[canonical]
    last = max(index[n] for n in positional) if positional else -1
    args = []
    for i, (name, default) in enumerate(spec):
        if i <= last:
            value = values[name] if name in values else default
            if value is REQUIRED:
                raise ValueError(f"argument '{name}' has no default")
            args.append(value)
        elif default is REQUIRED and name not in kwargs:
            raise ValueError(f"argument '{name}' has no default")
    return args, kwargs


def spin_cycles(host_s_per_call, calls, factor=2.0, clock_hz=CLOCK_HZ):
    """Cycles of the spin kernel that outlasts `calls` host calls by `factor`, within bounds."""
    cycles = int(factor * host_s_per_call * calls * clock_hz)
    return max(MIN_SPIN_CYCLES, min(MAX_SPIN_CYCLES, cycles))


def median_round(records, key="eager_ms"):
    """The median round of a method's rounds of one cell by a time (rounds.median_round), with
    every round's figures kept."""
    return rounds.median_round(records, key, higher_is_better=False, fields=ROUND_FIELDS)


def _timed(rec, key):
    if rec is None or rec.get("status") not in TIMED:
        return None
    v = rec.get(key)
    return v if v is not None and v > 0 else None


def ratios(cell):
    """From {method: record} of one cell: FA3's time over jfa's, eager and graph (> 1: jfa is
    faster), and jfa's graph_ms / eager_ms (1: the host path costs nothing; 0.5: half the call)."""
    jfa, fa3 = cell.get("jfa"), cell.get("fa3")
    out = {"jfa_vs_fa3_eager": None, "jfa_vs_fa3_graph": None, "jfa_graph_over_eager": None}
    for mode in ("eager", "graph"):
        a, b = _timed(jfa, f"{mode}_ms"), _timed(fa3, f"{mode}_ms")
        if a and b:
            out[f"jfa_vs_fa3_{mode}"] = b / a
    eager, graph = _timed(jfa, "eager_ms"), _timed(jfa, "graph_ms")
    if eager and graph:
        out["jfa_graph_over_eager"] = graph / eager
    return out


def fmt_ms(v):
    return f"{v:.4f}" if v < 10 else f"{v:.2f}"


def fmt_us(v):
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _cells(rec):
    """The host µs, eager ms and graph ms cells of one record."""
    if rec is None:
        return ["-"] * 3
    st = rec.get("status")
    if st not in TIMED:
        return [CELL.get(st, st or "-")] * 3
    star = "*" if st == "unchecked" else ""
    host = rec.get("host_us")
    host = "-" if host is None else fmt_us(host) + ("!" if rec.get("host_gpu_bound") else "")
    eager = rec.get("eager_ms")
    eager = "-" if eager is None else fmt_ms(eager) + star
    graph = rec.get("graph_ms")
    if graph is None:
        graph = "no graph" if rec.get("graph_reason") else "-"
    else:
        graph = fmt_ms(graph) + star
    return [host, eager, graph]


def _ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def table_axes(records, method_order, workload_order=None):
    """The methods, workloads and dtypes the records hold, in table order (peers.table_order;
    the dtypes of workloads.DTYPES first, then the others sorted)."""
    methods, wids = table_order(records, method_order, workload_order)
    dtypes = [d for d in W.DTYPES if any(r["dtype"] == d for r in records)]
    dtypes += sorted({r["dtype"] for r in records} - set(dtypes))
    return methods, wids, dtypes


def note_lines(records, labels, reason_fields):
    """The "notes:" lines under a table: each reason behind a cell that is not a plain number,
    once per (method, kind, text), with the first cell it appears in. A record's status gives
    the kind of its reason (or note); reason_fields adds (kind, field) pairs of other reasons."""
    notes, seen = [], set()
    for r in records:
        where = f"{r['workload']} {r['dtype']} {mask_name(r['causal'])}"
        reasons = [(r.get("status"), r.get("reason") or r.get("note") or "")]
        reasons += [(kind, r.get(field) or "") for kind, field in reason_fields]
        for kind, text in reasons:
            if not text or kind == "ok":
                continue
            key = (r["method"], kind, text)
            if key not in seen:
                seen.add(key)
                notes.append(f"- {labels.get(r['method'], r['method'])} [{kind}] (first: "
                             f"{where}): {text}")
    if not notes:
        return []
    lines = ["", "notes:"] + notes[:60]
    if len(notes) > 60:
        lines.append(f"- ... {len(notes) - 60} more in the JSON")
    return lines


def summarize(records, workload_order=None):
    """The ratios of every cell, in table order."""
    methods, wids, dtypes = table_axes(records, METHOD_ORDER, workload_order)
    by = {(r["workload"], r["dtype"], bool(r["causal"]), r["method"]): r for r in records}
    out = []
    for dtype in dtypes:
        for wid in wids:
            for causal in (False, True):
                cell = {m: by[(wid, dtype, causal, m)] for m in methods
                        if (wid, dtype, causal, m) in by}
                if cell:
                    out.append({"workload": wid, "dtype": dtype, "causal": causal, **ratios(cell)})
    return out


def format_tables(records, workload_order=None):
    """Markdown, one table per dtype: rows = workload x mask; per method host µs, eager ms, graph
    ms; then FA3 time / jfa time (eager, graph) and jfa's graph_ms / eager_ms. Notes follow."""
    if not records:
        return "no results"
    methods, wids, dtypes = table_axes(records, METHOD_ORDER, workload_order)
    by = {(r["workload"], r["dtype"], bool(r["causal"]), r["method"]): r for r in records}
    head = ["workload", "mask"]
    for m in methods:
        s = SHORT.get(m, m)
        head += [f"{s} host µs", f"{s} eager ms", f"{s} graph ms"]
    head += ["jfa/FA3 eager", "jfa/FA3 graph", "jfa graph/eager"]
    lines = []
    for dtype in dtypes:
        lines += ["", f"### {dtype}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for wid in wids:
            for causal in (False, True):
                row = [by.get((wid, dtype, causal, m)) for m in methods]
                if all(r is None for r in row):
                    continue
                cells = [wid, mask_name(causal)]
                for r in row:
                    cells += _cells(r)
                q = ratios({m: r for m, r in zip(methods, row) if r is not None})
                cells += [_ratio(q["jfa_vs_fa3_eager"]), _ratio(q["jfa_vs_fa3_graph"]),
                          _ratio(q["jfa_graph_over_eager"])]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "host µs: per call, issued back to back behind a spin kernel; ! = gpu_bound "
              "(the spin ended before the host loop: the host may have waited). eager ms: one "
              "call between CUDA events, synchronized. graph ms: one CUDA-graph replay. "
              "* timed, not checked. jfa/FA3: FA3 time / jfa time (> 1: jfa is faster). "
              "jfa graph/eager: the part of jfa's eager time left without the host path."]
    lines += note_lines(records, LABELS, (("no graph", "graph_reason"), ("host", "host_reason")))
    return "\n".join(lines)


def small_workload():
    return W.Workload(SMALL, list(SMALL_LENGTHS), list(SMALL_LENGTHS))


def small_cli_command():
    q = ",".join(str(x) for x in SMALL_LENGTHS)
    return f"jfa bench --lengths {q} --heads {SMALL.heads} --head-dim {SMALL.head_dim}"


def load_workloads(ids, cli):
    """[(id, Workload or None, error or None)]: S1 built here, the others from the CLI's lengths."""
    out = []
    for wid in ids:
        if wid == SMALL.id:
            out.append((wid, small_workload(), None))
        else:
            out.extend(W.load([wid], cli))
    return out


def workload_summary(w):
    s = w.summary()
    if w.id == SMALL.id:
        s["cli"] = small_cli_command()
    return s


def bench_parser(doc, lengths="the workload lengths"):
    """An argument parser with doc's first paragraph as description and the rest as epilog, and
    the options every torch benchmark here takes: --lib, and --cli, the source of `lengths`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(doc.split("\n\n")[1:]))
    ap.add_argument("--lib", default=None,
                    help="libjfa.so for jfa (sets JFA_LIBRARY; default: jfa's own search)")
    ap.add_argument("--cli", default=None,
                    help=f"the jfa CLI, source of {lengths} (default: tools/jfa of the "
                         "--lib build tree, else the newest build/**/tools/jfa)")
    return ap


def settle_counts(ap, args, defaults, at_least_one):
    """Fills in the counts left unset, from (name, default, --quick's default) triples, and
    refuses those of at_least_one below 1 and --warmup below 0 (ap.error)."""
    for name, full, short in defaults:
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    for name in at_least_one:
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")


def parse_args(argv=None):
    """The options, with --quick's defaults filled in and the lists parsed."""
    ap = bench_parser(__doc__, "the W1..W4 lengths")
    ap.add_argument("--fa3-lib", default=None,
                    help="FlashAttention-3's op library, loaded with torch.ops.load_library "
                         "(default: fa3 runs only if torch.ops.flash_attn_3.fwd already exists)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--dtypes", default="fp16", help="fp16,bf16")
    ap.add_argument("--masks", default="both", choices=list(W.MASKS))
    ap.add_argument("--methods", default=",".join(METHOD_ORDER))
    ap.add_argument("--host-calls", type=int, default=None,
                    help="calls issued back to back for host_us (default 200; --quick: 50)")
    ap.add_argument("--host-batches", type=int, default=3,
                    help="batches of --host-calls calls; host_us is their median (default 3)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed calls for eager_ms and replays for graph_ms (default 30; "
                         "--quick: 10)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before each figure")
    ap.add_argument("--rounds", type=int, default=None,
                    help="measure every cell this many times, the methods in alternating order, "
                         "and keep each method's median round by eager_ms (default 3; --quick: 1)")
    ap.add_argument("--warm-seconds", type=float, default=None,
                    help="seconds of matmuls before the first timing (default 5; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="one round, fewer runs and calls")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--name", default="call-overhead", help="file stem of the JSON")
    args = ap.parse_args(argv)
    settle_counts(ap, args, (("host_calls", 200, 50), ("runs", 30, 10), ("rounds", 3, 1),
                             ("warm_seconds", 5.0, 1.0)),
                  ("host_calls", "host_batches", "runs", "rounds"))
    known = [s.id for s in W.SPECS] + [SMALL.id]
    args.workload_ids = parse_list(args.workloads, known, "workload")
    args.dtype_names = parse_list(args.dtypes, list(W.DTYPES), "dtype")
    args.method_names = parse_list(args.methods, METHOD_ORDER, "method")
    return args


# ---- timing (torch, GPU) -----------------------------------------------------------------------

def host_batch(run, calls, est, attempts=2):
    """One batch of `calls` calls behind a spin sized from `est` (host seconds per call), run
    again with a spin sized from the measured host time while the spin ends before the host loop
    (at most `attempts` times: a host that waits for the GPU makes every spin too short).
    Returns (host seconds per call, spin ended first, calls done first, cycles, attempts)."""
    import torch
    for attempt in range(1, attempts + 1):
        cycles = spin_cycles(est, calls)
        spun, done = torch.cuda.Event(), torch.cuda.Event()
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        spun.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        host = (time.perf_counter() - t0) / calls
        spin_ended = spun.query()
        done.record()
        calls_done = done.query()
        torch.cuda.synchronize()
        if not spin_ended:
            break
        est = max(est, host)
    return host, spin_ended, calls_done, cycles, attempt


def host_time(run, calls, batches, warmup):
    """Host µs per call: the median over `batches` batches of `calls` calls (host_batch), and how
    the batches went. gpu_bound: in some batch the spin still ended before the host loop."""
    import torch
    if getattr(torch.cuda, "_sleep", None) is None:
        raise RuntimeError("torch.cuda._sleep is missing: the GPU cannot be kept busy")
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    probe = min(calls, 20)
    torch.cuda._sleep(spin_cycles(0.02, 1, factor=1.0))  # 20 ms: the GPU stays busy meanwhile
    t0 = time.perf_counter()
    for _ in range(probe):
        run()
    est = (time.perf_counter() - t0) / probe
    torch.cuda.synchronize()
    got = []
    for _ in range(batches):
        got.append(host_batch(run, calls, est))
        if got[-1][1]:
            break  # the host waited for the GPU: more batches would only wait longer
        est = max(est, got[-1][0])
    per_call = [g[0] * 1e6 for g in got]
    return {"host_us": statistics.median(per_call), "host_us_batches": per_call,
            "host_gpu_bound": any(g[1] for g in got),
            "host_calls_done_first": any(g[2] for g in got),
            "host_spin_cycles": max(g[3] for g in got),
            "host_attempts": [g[4] for g in got], "host_calls": calls}


def event_times(fn, runs):
    """Per-run CUDA-event times (ms) of fn, synchronized after each run."""
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


def eager_time(run, runs, warmup):
    import torch
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = event_times(run, runs)
    return {"eager_ms": statistics.median(times), "eager_min_ms": min(times), "eager_runs": runs}


def capture(run, warmup, stream=None):
    """(graph, its output): warm-up on a side stream, then one capture (the torch docs' way).
    With `stream`, both on that stream: autograd runs a backward on its forward's stream, so a
    backward alone is captured on the stream its forward ran on."""
    import torch
    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = run()
    return graph, out


def graph_time(graph, runs, warmup):
    import torch
    for _ in range(max(1, warmup)):
        graph.replay()
    torch.cuda.synchronize()
    times = event_times(graph.replay, runs)
    return {"graph_ms": statistics.median(times), "graph_min_ms": min(times), "graph_runs": runs}


def synchronize_quietly():
    """torch.cuda.synchronize() after a call that failed: an error it raises too is the same
    failure, already reported."""
    import torch
    try:
        torch.cuda.synchronize()
    except Exception:
        pass


def time_replays(G, run, rec, opts, check_replay, nan_outputs=False, stream=None):
    """Captures run in a CUDA graph (on `stream`, see capture), replays it once for
    check_replay(its outputs), which returns why they are wrong ("" if right), then puts
    graph_time's figures in rec; where that fails, rec's graph_reason says why. nan_outputs: NaN
    into the captured outputs before the replay, so that the check sees only what the replay
    wrote."""
    import torch
    try:
        graph, out = capture(run, opts["warmup"], stream)
        if nan_outputs:
            for t in out:
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        wrong = check_replay(out)
        if wrong:
            rec["graph_reason"] = wrong
            return
        rec.update(graph_time(graph, opts["runs"], opts["warmup"]))
    except Exception as e:
        rec["graph_reason"] = "capture or replay failed: " + G.short(e)
        synchronize_quietly()


# ---- methods -----------------------------------------------------------------------------------

def _packed(case):
    return lambda out, i: case.q_rows(out, i)


def prepare_jfa(G, ctx, case, causal):
    jfa = ctx.get("jfa")
    if jfa is None:
        raise G.Unavailable(ctx.get("jfa_error") or "jfa is not loaded")
    q, k, v, cu_q, cu_k = case.q, case.k, case.v, case.cu_q, case.cu_k
    mq, mk = case.max_q, case.max_k

    def run():
        return jfa.jagged_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal)

    return G.Prepared(run, _packed(case), dense=lambda o: o,
                      provider=f"jfa.jagged_attention (torch ops: {ctx.get('jfa_ops_kind')}, "
                               f"libjfa {ctx.get('jfa_version')})")


def prepare_fa3(G, ctx, case, causal):
    op = ctx.get("fa3_op")
    if op is None:
        raise G.Unavailable(ctx.get("fa3_error") or "torch.ops.flash_attn_3.fwd is missing")
    values = {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_q,
              "cu_seqlens_k": case.cu_k, "max_seqlen_q": case.max_q, "max_seqlen_k": case.max_k,
              "softmax_scale": case.scale, "is_causal": bool(causal)}
    try:
        args, kwargs = fa3_call(ctx["fa3_arguments"], values)
    except ValueError as e:
        raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")

    def run():
        return op(*args, **kwargs)[0]

    return G.Prepared(run, _packed(case), dense=lambda o: o, provider=ctx.get("fa3_provider", ""))


def _peer(cls_name):
    def prepare(G, ctx, case, causal):
        return getattr(G, cls_name)(ctx).prepare(case, causal)
    return prepare


def prepare_jfa_c(G, ctx, case, causal):
    prep = G.Jfa(ctx).prepare(case, causal)
    # Its params hold the stream they were made on, so a capture on another stream records
    # nothing; the graph figure of the same kernels is jfa's.
    prep.no_graph = "bound to the stream it was prepared on (graph: see jfa)"
    return prep


PREPARE = {"jfa": prepare_jfa, "jfa_c": prepare_jfa_c, "fa3": prepare_fa3, "fa2_varlen": _peer("Fa2Varlen"),
           "triton_jfa": _peer("TritonJfa"), "cudnn_padded": _peer("CudnnPadded")}


def schema_arguments(schema):
    """(name, default or REQUIRED) of every argument of a torch FunctionSchema."""
    import torch
    out = []
    for a in schema.arguments:
        has = (a.has_default_value() if hasattr(a, "has_default_value")
               else a.default_value is not None)
        optional = isinstance(a.type, torch.OptionalType) or str(a.type).endswith("?")
        out.append((a.name, a.default_value if has else (None if optional else REQUIRED)))
    return out


def missing_shared_object(message):
    """The file name of the library a failed dlopen could not find ("libcudart.so.13: cannot
    open shared object file ..." -> "libcudart.so.13"), or None."""
    m = re.search(r"([\w.+-]+\.so(?:\.[\w.]+)?): cannot open shared object file", str(message))
    return m.group(1) if m else None


def find_shared_object(name, roots):
    """<root>/nvidia/**/lib/<name> of the first root that has it (the CUDA libraries torch's
    wheels ship, e.g. nvidia/cu13/lib/libcudart.so.13), or None."""
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "**", "lib", name), recursive=True))
        if hits:
            return hits[0]
    return None


def wheel_library_roots():
    """The folders that may hold torch's nvidia/ wheels: torch's own site-packages first, then
    the interpreter's."""
    roots = []
    try:
        import torch
        roots.append(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))
    except Exception:
        pass
    try:
        import site
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:
        pass
    roots += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return list(dict.fromkeys(r for r in roots if r and os.path.isdir(r)))


def load_fa3_library(ctx, lib_path, tries=4):
    """torch.ops.load_library(lib_path), FA3's op library; False, with ctx's fa3_error, if it
    fails. A library it needs that the loader does not find (the CUDA runtime torch's wheels ship,
    outside LD_LIBRARY_PATH) is loaded from torch's nvidia/ folders first, its path kept in
    ctx["fa3_preloaded"]."""
    import ctypes
    import torch
    for _ in range(tries):
        try:
            torch.ops.load_library(lib_path)
            return True
        except Exception as e:
            error = f"torch.ops.load_library({lib_path}): {type(e).__name__}: {e}"
            name = missing_shared_object(e)
            found = find_shared_object(name, wheel_library_roots()) if name else None
            if found is None or found in ctx.get("fa3_preloaded", []):
                ctx["fa3_error"] = error
                return False
            try:
                ctypes.CDLL(found, mode=ctypes.RTLD_GLOBAL)
            except OSError as e2:
                ctx["fa3_error"] = f"{error} (loading {found} first: {e2})"
                return False
            ctx.setdefault("fa3_preloaded", []).append(found)
    ctx["fa3_error"] = error
    return False


def fa3_provider(op_name, lib_path):
    """Where the timed FA3 op comes from, for the records."""
    return (f"torch.ops.flash_attn_3.{op_name} from "
            + (os.path.basename(lib_path) if lib_path else "the installed FA3"))


def load_fa3(ctx, lib_path):
    import torch
    if lib_path and not load_fa3_library(ctx, lib_path):
        return
    try:
        op = torch.ops.flash_attn_3.fwd
        schema = op.default._schema
    except Exception as e:
        ctx["fa3_error"] = ("torch.ops.flash_attn_3.fwd is missing (pass --fa3-lib): "
                            f"{type(e).__name__}: {str(e)[:150]}")
        return
    ctx["fa3_op"] = op
    ctx["fa3_arguments"] = schema_arguments(schema)
    ctx["fa3_provider"] = fa3_provider("fwd", lib_path)


def import_gpu_modules(tool, lib_path):
    """(torch, bench/peers_gpu.py) for a run on the GPU, or (None, None) without one (said on
    stderr). JFA_LIBRARY is set from lib_path before anything imports jfa (libjfa.py does): the
    library is loaded then."""
    torch = torch_with_cuda(tool)
    if torch is None:
        return None, None
    if lib_path:
        os.environ["JFA_LIBRARY"] = os.path.abspath(lib_path)
    import peers_gpu
    return torch, peers_gpu


def run_environment(G, ctx, lib_path, cli, **more):
    """The run's environment (peers_gpu's) with what jfa and FA3 were loaded as (load_jfa,
    load_fa3), then `more`, and jfa_cli: the CLI the lengths come from (cli, else the one next to
    the library, else the newest build's)."""
    from libjfa import cli_next_to
    env = G.environment()
    env.update({"jfa_library": ctx.get("jfa_path"), "jfa_version": ctx.get("jfa_version"),
                "jfa_torch_ops_kind": ctx.get("jfa_ops_kind"),
                "jfa_torch_ops_detail": ctx.get("jfa_ops_detail"),
                "fa3": ctx.get("fa3_provider") or ctx.get("fa3_error")}, **more)
    env["jfa_cli"] = (cli or cli_next_to(lib_path or ctx.get("jfa_path"))
                      or W.find_cli(None, REPO))
    return env


def result_document(title, env, settings, loaded, records, describe=None, **about):
    """The JSON document of a run, filled in as it goes: title, start date and time, environment
    and settings, `about` (how the figures are taken), the workloads loaded (describe(w), else
    w.summary()) and why the others are not, and `records` as the results."""
    describe = describe or (lambda w: w.summary())
    return {"title": title, "date": datetime.date.today().isoformat(),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "environment": env, "settings": settings, **about,
            "workloads": {w.id: describe(w) for _, w, _ in loaded if w is not None},
            "workload_errors": {wid: err for wid, w, err in loaded if w is None},
            "results": records, "summary": []}


def warm_up_gpu(G, seconds):
    """G.warm_gpu; a failure is said and the run goes on without the warm-up."""
    try:
        G.warm_gpu(seconds)
    except Exception as e:
        print(f"GPU warm-up failed (continuing): {G.short(e)}", flush=True)


def load_jfa(ctx, lib_path):
    if lib_path:
        os.environ["JFA_LIBRARY"] = os.path.abspath(lib_path)
    try:
        import libjfa  # puts this checkout's python/ first on sys.path
        import jfa
    except Exception as e:
        ctx["jfa_error"] = f"import jfa: {type(e).__name__}: {e}"
        return
    kind = getattr(jfa, "torch_ops_kind", None)
    ctx["jfa_ops_kind"] = (kind() or "none") if callable(kind) else "unknown"
    ops = getattr(jfa._torch_support, "ops", None)
    ctx["jfa_ops_detail"] = getattr(ops, "KIND_DETAIL", "")
    try:
        ctx["jfa_path"] = jfa.library_path()
        ctx["jfa_version"] = jfa.version()
        if not jfa.torch_available():
            ctx["jfa_error"] = f"jfa's torch path: {jfa.torch_unavailable_reason()}"
        elif not jfa.cuda_available():
            ctx["jfa_error"] = (f"{ctx['jfa_path']}: no CUDA backend (built without CUDA, "
                                "or no sm90 GPU)")
        else:
            ctx["jfa"] = jfa
            # The C entry alone (method jfa_c), on the library the package loaded.
            ctx["jfa_lib"] = libjfa.Library(ctx["jfa_path"], jfa._library.lib())
    except Exception as e:
        ctx["jfa_error"] = f"loading libjfa: {type(e).__name__}: {e}"


# ---- one measurement ---------------------------------------------------------------------------

def check(G, case, causal, prep, out, tolerance):
    """(status, relative error, reason) of an output against the reference."""
    import torch
    if prep.rows is None:
        return "unchecked", None, ""
    err = G.rel_error(case, causal, prep.rows, out)
    if prep.dense is not None and not bool(torch.isfinite(prep.dense(out)).all().item()):
        return "wrong", err, "non-finite values in the output"
    if not (err <= tolerance):
        return "wrong", err, f"relative error {err:.3g} > {tolerance:g}"
    return "ok", err, ""


def measure(G, ctx, name, case, causal, opts):
    """A record of one method on one case and mask: checked, then its three figures."""
    import warnings
    import torch
    w = case.w
    flops, nbytes = w.flops(causal), w.bytes(case.dtype_name)
    rec = {"method": name, "label": LABELS.get(name, name), "workload": w.id,
           "dtype": case.dtype_name, "causal": bool(causal), "heads": case.H, "head_dim": case.D,
           "batch": case.B, "status": None, "reason": "", "note": "", "provider": "",
           "rel_error": None, "tolerance": G.TOLERANCE[case.dtype_name],
           "checked_sequences": len(case.sample), "useful_gflop": flops / 1e9,
           "min_bytes": nbytes, "host_us": None, "host_reason": "", "eager_ms": None,
           "graph_ms": None, "graph_reason": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prep = PREPARE[name](G, ctx, case, causal)
        except G.Unavailable as e:
            rec.update(status="unavailable", reason=str(e))
            return rec
        except G.Skipped as e:
            rec.update(status="skipped", reason=str(e))
            return rec
        except Exception as e:
            rec.update(status="error", reason="prepare: " + G.short(e))
            torch.cuda.empty_cache()
            return rec
        rec["note"], rec["provider"] = prep.note, prep.provider
        try:
            with prep.context():
                _measure(G, case, causal, prep, rec, opts)
        except Exception as e:
            rec.update(status="error", reason=G.short(e))
        finally:
            prep = None
            torch.cuda.empty_cache()
    for mode in ("eager", "graph"):
        t = rec.get(f"{mode}_ms")
        rec[f"{mode}_tflops"] = flops / (t * 1e-3) / 1e12 if t else None
        rec[f"{mode}_tbps"] = nbytes / (t * 1e-3) / 1e12 if t else None
    return rec


def _measure(G, case, causal, prep, rec, opts):
    import torch
    poison = torch.empty_like(case.q).fill_(float("nan"))  # its block likely backs the output
    del poison
    out = prep.run()
    torch.cuda.synchronize()
    status, err, reason = check(G, case, causal, prep, out, rec["tolerance"])
    del out
    rec.update(status=status, rel_error=err, reason=reason)
    if status not in TIMED:
        return
    try:
        rec.update(host_time(prep.run, opts["host_calls"], opts["host_batches"],
                             opts["warmup"]))
    except Exception as e:
        rec["host_reason"] = G.short(e)
    rec.update(eager_time(prep.run, opts["runs"], opts["warmup"]))
    if getattr(prep, "no_graph", ""):
        rec["graph_reason"] = prep.no_graph
        return

    def check_replay(out):
        if status != "ok":
            return ""  # an unchecked method's replay goes unchecked too
        g_status, rec["graph_rel_error"], g_reason = check(G, case, causal, prep, out,
                                                           rec["tolerance"])
        return "" if g_status == "ok" else f"the replay's output is wrong: {g_reason}"

    time_replays(G, prep.run, rec, opts, check_replay)


def progress_line(rec, tag, memory_bound):
    status = rec["status"]
    text = f"[{rec['workload']} {rec['dtype']} {mask_name(rec['causal'])}{tag}] " \
           f"{rec['method']:<12} {status:<11}"
    if rec.get("host_us") is not None:
        text += f" host {rec['host_us']:.1f} µs{' (gpu_bound)' if rec['host_gpu_bound'] else ''}"
    for mode in ("eager", "graph"):
        t = rec.get(f"{mode}_ms")
        if t is None:
            continue
        rate = (f"{rec[f'{mode}_tbps']:.2f} TB/s" if memory_bound
                else f"{rec[f'{mode}_tflops']:.1f} TF/s")
        text += f" {mode} {t:.4f} ms ({rate})"
    if rec.get("rel_error") is not None:
        text += f" err {rec['rel_error']:.1e}"
    why = "; ".join(x for x in (rec.get("reason"), rec.get("host_reason"),
                                rec.get("graph_reason")) if x)
    return text + (f" {why[:200]}" if why else "")


# ---- driver ------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    masks = W.MASKS[args.masks]
    torch, G = import_gpu_modules("call_overhead.py", args.lib)
    if torch is None:
        return 2
    from peers import write_json

    ctx = {"flex_dynamic": None}
    load_jfa(ctx, args.lib)
    load_fa3(ctx, args.fa3_lib)
    env = run_environment(G, ctx, args.lib, args.cli)
    cli = env["jfa_cli"]
    for what in ("jfa", "fa3"):
        if ctx.get(f"{what}_error"):
            print(f"{what}: unavailable: {ctx[f'{what}_error']}", flush=True)

    opts = {"host_calls": args.host_calls, "host_batches": args.host_batches,
            "runs": args.runs, "warmup": args.warmup}
    loaded = load_workloads(args.workload_ids, cli)
    records = []
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, args.name + ".json")
    settings = {k: v for k, v in vars(args).items()
                if k not in ("workload_ids", "dtype_names", "method_names")}
    settings.update(workloads=args.workload_ids, dtypes=args.dtype_names,
                    methods=args.method_names, masks=[mask_name(c) for c in masks],
                    clock_hz_for_spin=CLOCK_HZ, tolerance=G.TOLERANCE, data_seed=G.DATA_SEED)
    doc = result_document(
        "jfa call overhead: host, eager and CUDA-graph time per call", env, settings, loaded,
        records, workload_summary,
        figures={"host_us": "host time per call, calls back to back behind a spin kernel",
                 "eager_ms": "CUDA events around one call, synchronized after each",
                 "graph_ms": "CUDA events around one replay of the captured call"})
    for wid, err in doc["workload_errors"].items():
        print(f"{wid}: unavailable: {err}", flush=True)
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, jfa {env.get('jfa_version')} "
          f"(torch ops: {env.get('jfa_torch_ops_kind')}: {env.get('jfa_torch_ops_detail')}), fa3: {env.get('fa3')}", flush=True)
    warm_up_gpu(G, args.warm_seconds)

    for wid, w, _ in loaded:
        if w is None:
            continue
        memory_bound = W.floors(w, "fp16", False)["bound"] == "memory"
        for dtype in [d for d in args.dtype_names if d in w.spec.dtypes]:
            try:
                case = G.Case(w, dtype)
            except Exception as e:
                print(f"[{wid} {dtype}] building the inputs failed: {G.short(e)}", flush=True)
                torch.cuda.empty_cache()
                continue
            for causal in [c for c in masks if c in w.spec.causal]:
                try:
                    case.reference(causal)
                except Exception as e:
                    print(f"[{wid} {dtype} {mask_name(causal)}] reference failed: {G.short(e)}",
                          flush=True)
                    continue

                def report(rec):
                    tag = f" r{rec['round']}" if args.rounds > 1 else ""
                    print(progress_line(rec, tag, memory_bound), flush=True)

                per_method = rounds.measure_rounds(
                    args.method_names, args.rounds,
                    lambda m: measure(G, ctx, m, case, causal, opts), report)
                records.extend(median_round(per_method[m]) for m in args.method_names)
            case.release()
            case = None
            torch.cuda.empty_cache()
            doc["summary"] = summarize(records, args.workload_ids)
            doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            write_json(json_path, doc)
    doc["summary"] = summarize(records, args.workload_ids)
    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    doc["table"] = format_tables(records, args.workload_ids)
    write_json(json_path, doc)
    print(doc["table"])
    print(f"\nwrote {json_path} ({doc['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
