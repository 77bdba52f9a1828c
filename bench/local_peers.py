#!/usr/bin/env python3
"""jfa against FlashAttention-3 on local attention (sliding windows, softcap, attention sinks):
the forward, bf16, on the GPU.

Cells: workload x kind. Workloads: bench/workloads.py's W1, W2, W3 (--workloads) at each of
--head-dims (64,128,256: W1-d64 .. W3-d256), 16 query and 16 KV heads as in bench/peers.py.
Kinds (--kinds; window (left, right): query i sees key j iff i + Lk - Lq - left <= j <=
i + Lk - Lq + right, -1 unbounded, causal is right = 0; jfa.h):
  swa128 causal, window (128, 0) (GPT-OSS)  swa4096 causal, window (4096, 0) (Mistral)
  swa128nc non-causal, window (128, 128)            softcap50 causal, softcap 50 (Gemma 2)
  swa_softcap causal, window (4096, 0), softcap 50  sinks causal, sinks ~ N(0, 1)
  swa_sinks causal, window (128, 0), sinks (GPT-OSS)
FlashAttention-3 (fa3): torch.ops.flash_attn_3.fwd, varlen, from the op library --fa3-lib names
(e.g. its full bf16 build: windows and softcap at head_dim 64, 128, 256), the call built from the
op's schema as bench/peers.py does, window_size_left, window_size_right and softcap by keyword.
FA3 has no sinks: the sinks kinds time jfa with sinks against jfa without them (jfa_nosinks,
same window and mask), the ratio being what the sinks cost. jfa: its C entry through
bench/libjfa.py, as bench/peers.py, with window_left, window_right, softcap and sinks (float32
[heads] on the GPU) set in its params; a build whose CUDA forward rejects them says so in its
cells.

Checks: every output against a float64 reference (local_reference, jfa.h's rules) on
workloads.check_sample's sequences (all of a small batch, else the longest, the shortest, the
first and the last): relative error ||out - ref|| / ||ref|| <= 1e-2 in bf16 (peers_gpu's
TOLERANCE), the max absolute error kept too. A method that fails is "wrong" and gets no eager or
graph time; one that is missing or fails says why, and the run goes on. Times (peers_gpu.measure,
on one side stream): eager_ms (CUDA events around one call, synchronized) and graph_ms (replays
of the call captured in a CUDA graph, the replay checked too), medians of --runs, and the kernel
time median_ms; --rounds N measures every cell N times, the methods in alternating order, medians
(bench/rounds.py, peers.combine_rounds). Useful TFLOP/s count the visible (query, key) pairs
under mask and window exactly (visible_pairs): 2 * pairs * heads * (head_dim + head_dim_v); so
causal without a window is L(L+1)/2 a sequence here, not peers.py's L^2/2.

Writes <out>/<YYYY-MM-DD>-<gpu>-local.json (--name: another stem) after every workload and dtype
and prints a table: a row per workload x kind x head_dim, jfa's and the peer's TFLOP/s eager and
graph, jfa ÷ peer. --time-limit-s S: no cell starts after S seconds; the JSON and the table say so.

usage: python3 bench/local_peers.py --lib build/gpu/src/libjfa.so
           --fa3-lib .peers/fa3_full_bf16.so [--cli build/gpu/tools/jfa] [--out bench/results]
           [--workloads W1,W2,W3] [--head-dims 64,128,256] [--kinds swa128,sinks,...]
           [--rounds N] [--runs N] [--warmup N] [--time-limit-s S] [--name NAME]
"""
import argparse
import datetime
import math
import os
import sys
import time
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import peers  # noqa: E402
import workloads as W  # noqa: E402
from rounds import measure_rounds  # noqa: E402

# causal, window (left, right) (-1: unbounded), softcap (0: off), sinks (jfa only).
Kind = namedtuple("Kind", "causal left right softcap sinks")
KINDS = {"swa128": Kind(True, 128, 0, 0.0, False), "swa4096": Kind(True, 4096, 0, 0.0, False),
         "swa128nc": Kind(False, 128, 128, 0.0, False),
         "softcap50": Kind(True, -1, 0, 50.0, False),
         "swa_softcap": Kind(True, 4096, 0, 50.0, False), "sinks": Kind(True, -1, 0, 0.0, True),
         "swa_sinks": Kind(True, 128, 0, 0.0, True)}
DEFAULT_WORKLOADS = ["W1", "W2", "W3"]
DEFAULT_HEAD_DIMS = ["64", "128", "256"]
METHODS = {"jfa": "jfa", "fa3": peers.FA3_LABEL, "jfa_nosinks": "jfa without sinks"}
PEER_SHORT = {"fa3": "FA3", "jfa_nosinks": "jfa-nosink"}
# FA3's keywords: peers' (scale, mask) and the local-attention arguments.
FA3_LOCAL_KEYWORDS = {"window_size_left": ("window_size_left",),
                      "window_size_right": ("window_size_right",), "softcap": ("softcap",)}
SINKS_SEED = 1


# ---- counting and the reference -----------------------------------------------------------------

def visible_pairs(lq, lk, causal=False, left=-1, right=-1):
    """Visible (query, key) pairs of one sequence, exactly: query i sees the keys j of [0, lk)
    with d - left <= j <= d + right, d = i + lk - lq (-1: that side unbounded; causal: right 0)."""
    lq, lk = int(lq), int(lk)
    if causal:
        right = 0
    if lq <= 0 or lk <= 0:
        return 0

    def prefix(x):  # sum of min(a, lk) for a = 1..x (0 for x <= 0)
        if x <= 0:
            return 0
        return x * (x + 1) // 2 if x <= lk else lk * (lk + 1) // 2 + (x - lk) * lk

    def upto(c):  # sum over i of clamp(i + c, 0, lk): keys j < i + c of each row
        return prefix(c + lq - 1) - prefix(c - 1)

    shift = lk - lq
    seen = upto(shift + right + 1) if right >= 0 else lq * lk
    return seen - (upto(shift - left) if left >= 0 else 0)


def local_flops(lengths_q, lengths_k, kind, heads, head_dim, head_dim_v=0):
    """Useful FLOPs of a kind: 2 * visible pairs * heads * (head_dim + head_dim_v)."""
    pairs = sum(visible_pairs(a, b, kind.causal, kind.left, kind.right)
                for a, b in zip(lengths_q, lengths_k))
    return 2.0 * pairs * heads * (head_dim + (head_dim_v or head_dim))


def local_reference(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, sinks=None):
    """Attention of one sequence in float64 (torch, any device): q [Lq, H, D], k [Lk, Hkv, D],
    v [Lk, Hkv, Dv], sinks None or [H]; out [Lq, H, Dv], zeros for a row with no key."""
    import torch
    lq, H = q.shape[0], q.shape[1]
    lk, Hkv, Dv = v.shape
    out = torch.zeros(lq, H, Dv, dtype=torch.float64, device=q.device)
    if lq == 0 or lk == 0:
        return out
    left, right = window[0], 0 if causal else window[1]
    d = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=q.device)[None, :]
    seen = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if left >= 0:
        seen &= j >= d - left
    if right >= 0:
        seen &= j <= d + right
    qs, ks, vs = (x.double().transpose(0, 1) for x in (q, k, v))
    if H != Hkv:
        ks, vs = ks.repeat_interleave(H // Hkv, 0), vs.repeat_interleave(H // Hkv, 0)
    chunk = max(1, min(H, (1 << 27) // (lq * (lk + 1))))  # <= 1 GiB of scores at a time
    for h0 in range(0, H, chunk):
        h1 = min(H, h0 + chunk)
        s = torch.matmul(qs[h0:h1], ks[h0:h1].transpose(1, 2)).mul_(scale)
        if softcap:
            s = torch.tanh(s.div_(softcap)).mul_(softcap)
        s.masked_fill_(~seen, float("-inf"))
        if sinks is not None:
            sink = sinks[h0:h1].to(device=q.device, dtype=torch.float64)
            s = torch.cat([s, sink[:, None, None].expand(h1 - h0, lq, 1)], dim=-1)
        p = torch.softmax(s, dim=-1).nan_to_num_(0.0)[..., :lk]
        out[:, h0:h1] = torch.matmul(p, vs[h0:h1]).transpose(0, 1)
    return out


# ---- report (no torch needed) -------------------------------------------------------------------

def peer_of(kind_name):
    """The method jfa is compared with: FA3, or jfa without sinks where the kind has sinks."""
    return "jfa_nosinks" if KINDS[kind_name].sinks else "fa3"


def _rate(r, mode):
    return r.get(f"{mode}_tflops") if r and r.get("status") in peers.RANKED else None


def _cell(r, mode):
    if r is not None and r.get("status") not in peers.RANKED:
        return peers.CELL.get(r.get("status"), r.get("status") or "-")
    return "-" if _rate(r, mode) is None else f"{_rate(r, mode):.1f}"


def table_rows(records):
    """(workload, dtype, kind) of every row: by workload base (in the records' order), dtype,
    kind (KINDS' order), head size."""
    bases, rows = [], {}
    for r in records:
        base = r.get("base", r["workload"])
        if base not in bases:
            bases.append(base)
        rows.setdefault((r["workload"], r["dtype"], r["kind"]),
                        (bases.index(base), r["dtype"], list(KINDS).index(r["kind"]),
                         r.get("head_dim", 0), r.get("head_dim_v") or 0))
    return sorted(rows, key=rows.get)


def format_table(records, stopped=""):
    """Rows: workload base x kind x head_dim (table_rows); columns: jfa's and the peer's useful
    TFLOP/s eager and graph, jfa / peer (eager, graph) and the peer's name; then the reasons
    behind every cell that is not a number, and `stopped`."""
    if not records:
        return "\n".join(["no results"] + ([stopped] if stopped else []))
    by = {(r["workload"], r["dtype"], r["kind"], r["method"]): r for r in records}
    rows = table_rows(records)
    head = (f"{'workload':<9}{'dtype':<6}{'kind':<12}{'d':>7}{'jfa eager':>11}{'jfa graph':>11}"
            f"{'peer eager':>11}{'peer graph':>11}{'÷ eager':>9}{'÷ graph':>9}  peer")
    lines = ["useful TFLOP/s (visible pairs under mask and window), medians", head]
    for wid, dtype, kind in rows:
        peer = peer_of(kind)
        jfa, other = by.get((wid, dtype, kind, "jfa")), by.get((wid, dtype, kind, peer))
        any_r = jfa or other
        ratios = []
        for mode in peers.MODES:
            a, b = _rate(jfa, mode), _rate(other, mode)
            ratios.append(f"{a / b:.2f}" if a and b else "-")
        d = peers.head_dim_text(any_r.get("head_dim"), any_r.get("head_dim_v"))
        lines.append(f"{any_r.get('base', wid):<9}{dtype:<6}{kind:<12}{d:>7}"
                     + "".join(f"{_cell(r, m):>11}" for r in (jfa, other) for m in peers.MODES)
                     + "".join(f"{x:>9}" for x in ratios) + f"  {PEER_SHORT[peer]}")
    notes, seen = [], set()
    for r in records:
        for what, text in ((r["status"], r.get("reason") or ""),
                           ("no graph", r.get("graph_reason") or "")):
            if what != "ok" and text and (r["method"], what, text) not in seen:
                seen.add((r["method"], what, text))
                notes.append(f"  {peers.record_label(r)} [{what}] (first: {r['workload']} "
                             f"{r['kind']}): {text[:200]}")
    lines.append("n/a: unavailable.  err: failed.  wrong: failed the check, not timed.  "
                 "jfa-nosink: the sinks kinds' peer, jfa without sinks (FA3 has none).")
    if notes:
        lines += ["notes:"] + notes[:40]
    if stopped:
        lines.append(stopped)
    return "\n".join(lines)


# ---- options ------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="jfa against FlashAttention-3 on local attention, forward, on the GPU "
                    "(see the module docstring)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None,
                    help="libjfa.so (default: the newest build/**/src/libjfa.so)")
    ap.add_argument("--cli", default=None, help="the jfa CLI, source of the workload lengths "
                    "(default: that of --lib's build or carried folder (bin/jfa beside lib/), "
                    "else the newest build/**/tools/jfa)")
    ap.add_argument("--fa3-lib", default=os.environ.get("FA3_LIB") or None,
                    help="FlashAttention-3's op library (torch.ops.flash_attn_3.fwd), e.g. "
                         ".peers/fa3_full_bf16.so (default: $FA3_LIB)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--name", default=None,
                    help="file stem of the JSON, as bench/peers.py (default <date>-<gpu>-local)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help="comma-separated bases of bench/workloads.py (default W1,W2,W3)")
    ap.add_argument("--head-dims", default=",".join(DEFAULT_HEAD_DIMS),
                    help=f"comma-separated head sizes of {','.join(peers.HEAD_DIM_SUFFIX)} "
                         "(default 64,128,256)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated of {','.join(KINDS)} (default all)")
    ap.add_argument("--dtypes", default="bf16", help="fp16,bf16 (default bf16)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every cell N times, the methods in alternating order; medians")
    ap.add_argument("--runs", type=int, default=peers.RUNS,
                    help=f"timed calls and graph replays per round (default {peers.RUNS})")
    ap.add_argument("--warmup", type=int, default=peers.WARMUP,
                    help=f"untimed calls before each timing (default {peers.WARMUP})")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no cell after this many seconds; write what was measured")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.warmup < 0:
        ap.error("--rounds and --runs must be at least 1, --warmup at least 0")
    bases = peers.parse_list(args.workloads, W.QUICK_IDS, "workload")
    try:
        args.workload_ids = peers.head_dim_ids(peers.parse_list(args.head_dims), bases)
    except ValueError as e:
        ap.error(f"--head-dims: {e}")
    args.kind_names = peers.parse_list(args.kinds, list(KINDS), "kind")
    args.dtype_names = peers.parse_list(args.dtypes, list(W.DTYPES), "dtype")
    if not (args.workload_ids and args.kind_names and args.dtype_names):
        ap.error("no cell: --workloads, --head-dims, --kinds and --dtypes must not be empty")
    return args


def carried_cli(lib_path):
    """<dir>/bin/jfa for a library <dir>/lib/libjfa.so (scripts/gpu-check.sh's carried folder)."""
    if not lib_path:
        return None
    cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib_path))), "bin", "jfa")
    return cand if os.path.isfile(cand) else None


# ---- the GPU side -------------------------------------------------------------------------------

class LocalLibrary:
    """A bench/libjfa.py Library whose params() also set the cell's local-attention fields
    (self.fields: window_left, window_right, softcap, sinks), so peers_gpu.Jfa runs them."""

    def __init__(self, lib):
        self.lib, self.fields = lib, {}

    def params(self, **kw):
        p = self.lib.params(**kw)
        for name, value in self.fields.items():
            setattr(p, name, value)
        return p

    def __getattr__(self, name):
        return getattr(self.lib, name)


class Variant:
    """A method of this bench (peers_gpu.measure's interface): its prepare, with the rows of the
    check wrapped to keep the max absolute error against the reference."""

    def __init__(self, name, prepare):
        self.name, self.label, self._prepare = name, METHODS[name], prepare
        self.max_abs_error = None

    def current_label(self):
        return self.label

    def prepare(self, case, causal):
        self.max_abs_error = None
        prep = self._prepare(case, causal)
        inner, refs = prep.rows, case.reference(causal)

        def rows(out, i):
            o = inner(out, i)
            err = (o.double() - refs[i]).abs().max().item() if o.numel() else 0.0
            m = self.max_abs_error
            if m is None or math.isnan(err) or (not math.isnan(m) and err > m):
                self.max_abs_error = err
            return o

        if inner is not None:
            prep.rows = rows
        return prep


def fa3_prepare(G, co, ctx):
    """FA3's varlen forward with the cell's window and softcap (ctx["kind"])."""
    def prepare(case, causal):
        op, kind = ctx.get("fa3_op"), ctx["kind"]
        if op is None:
            raise G.Unavailable(ctx.get("fa3_error") or peers.FA3_NOT_AVAILABLE)
        if kind.sinks:
            raise G.Unavailable("FlashAttention-3 has no attention sinks")
        G._fa3_check_head_dims(case)
        values = {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_q,
                  "cu_seqlens_k": case.cu_k, "max_seqlen_q": case.max_q,
                  "max_seqlen_k": case.max_k, "softmax_scale": case.scale,
                  "is_causal": bool(causal), "window_size_left": kind.left,
                  "window_size_right": kind.right, "softcap": float(kind.softcap)}
        try:
            args, kwargs = co.fa3_call(ctx["fa3_arguments"], values,
                                       dict(co.FA3_KEYWORDS, **FA3_LOCAL_KEYWORDS))
        except ValueError as e:
            raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")
        return G.Prepared(lambda: op(*args, **kwargs)[0], lambda out, i: case.q_rows(out, i),
                          dense=lambda o: o, label=peers.FA3_LABEL,
                          provider=ctx.get("fa3_provider", "torch.ops.flash_attn_3.fwd"))
    return prepare


def measure_cell(torch, G, ctx, impls, case, kind_name, timing, opts, rounds, report):
    """One record per method (peers.combine_rounds of its rounds) of a kind on a case."""
    kind, w = KINDS[kind_name], case.w
    flops = local_flops(w.lengths_q, w.lengths_k, kind, case.H, case.D, case.Dv)
    sinks = None
    if kind.sinks:
        gen = torch.Generator(device="cpu").manual_seed(SINKS_SEED)
        sinks = torch.randn(case.H, generator=gen, dtype=torch.float32).to(case.device)
    refs = {}

    def measure(m):
        with_sinks = sinks if m == "jfa" else None
        key = with_sinks is not None
        if key not in refs:
            refs[key] = {i: local_reference(
                case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
                case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, kind.causal,
                (kind.left, kind.right), kind.softcap, with_sinks) for i in case.sample}
        case._refs = {kind.causal: refs[key]}  # what peers_gpu's check compares with
        ctx["kind"] = kind
        if "jfa_lib" in ctx:
            ctx["jfa_lib"].fields = {"window_left": kind.left, "window_right": kind.right,
                                     "softcap": kind.softcap, "sinks": None if with_sinks is None
                                     else with_sinks.data_ptr()}
        rec = G.measure(impls[m], case, kind.causal, timing, opts)
        rec.update(kind=kind_name, base=w.spec.base, window=[kind.left, kind.right],
                   softcap=kind.softcap, sinks=key, max_abs_error=impls[m].max_abs_error,
                   useful_gflop=flops / 1e9)
        if rec["status"] == "wrong":  # not timed: the kernel time peers_gpu took is dropped
            rec.update(median_ms=None, min_ms=None, useful_tflops=None, eff_tbps=None)
        elif rec.get("median_ms"):
            rec["useful_tflops"] = flops / (rec["median_ms"] * 1e-3) / 1e12
        return peers.add_rates(rec)

    methods = ["jfa", peer_of(kind_name)]
    per_method = measure_rounds(methods, rounds, measure, report)
    return [peers.combine_rounds(per_method[m]) for m in methods]


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch = peers.torch_with_cuda("local_peers.py")
    if torch is None:
        return 2
    import call_overhead as co
    import peers_gpu as G
    from libjfa import Library, cli_next_to, find_library

    env, ctx = G.environment(), {"jfa_error": "libjfa.so not found (pass --lib)"}
    lib_path = find_library(args.lib, REPO)
    try:
        lib = Library(lib_path) if lib_path else None
        if lib is not None and lib.cuda_available():  # else peers_gpu.Jfa says jfa_error
            ctx["jfa_lib"], env["jfa_version"] = LocalLibrary(lib), lib.version()
            del ctx["jfa_error"]
        elif lib is not None:
            ctx["jfa_error"] = f"{lib_path}: jfa_cuda_available() = 0 (no CUDA backend or GPU)"
    except Exception as e:
        ctx["jfa_error"] = f"cannot load {lib_path}: {G.short(e)}"
    co.load_fa3(ctx, args.fa3_lib)
    env.update(jfa_lib=lib_path, fa3=ctx.get("fa3_provider") or ctx.get("fa3_error"))
    cli = args.cli or cli_next_to(lib_path) or carried_cli(lib_path) or W.find_cli(None, REPO)
    env["jfa_cli"] = cli
    if "jfa_error" in ctx:
        print(f"jfa: unavailable: {ctx['jfa_error']}", flush=True)
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, jfa {env.get('jfa_version', 'n/a')}, "
          f"fa3: {env['fa3']}", flush=True)

    jfa = G.Jfa(ctx).prepare
    impls = {"jfa": Variant("jfa", jfa), "jfa_nosinks": Variant("jfa_nosinks", jfa),
             "fa3": Variant("fa3", fa3_prepare(G, co, ctx))}
    timing = G.Timing(min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0)
    opts = {"runs": args.runs, "warmup": args.warmup}
    date = datetime.date.today().isoformat()
    stem = args.name or f"{date}-{peers.gpu_slug(env.get('gpu'))}-local"
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, stem + ".json")
    loaded = W.load(args.workload_ids, cli)
    records, skipped = [], []
    settings = {k: getattr(args, k) for k in ("workload_ids", "dtype_names", "rounds", "runs",
                                              "warmup", "fa3_lib", "time_limit_s")}
    settings.update(kinds={k: KINDS[k]._asdict() for k in args.kind_names}, timing=vars(timing),
                    tolerance=G.TOLERANCE, data_seed=G.DATA_SEED, sinks_seed=SINKS_SEED)
    doc = {"title": "jfa local-attention peers benchmark (forward)", "date": date,
           "environment": env, "settings": settings,
           "counting": "useful FLOPs = 2 * visible pairs * heads * (head_dim + head_dim_v), "
                       "pairs counted exactly under the mask and window",
           "workloads": {w.id: w.summary() for _, w, _ in loaded if w is not None},
           "workload_errors": {wid: err for wid, w, err in loaded if w is None},
           "results": records}
    for wid, err in doc["workload_errors"].items():
        print(f"{wid}: unavailable: {err}", flush=True)
    G.warm_gpu(3.0)
    for wid, w, _ in loaded:
        for dtype in (args.dtype_names if w is not None else []):
            case = None
            for kind_name in args.kind_names:
                elapsed = time.perf_counter() - t_start
                if args.time_limit_s is not None and elapsed > args.time_limit_s:
                    skipped.append(f"{wid} {dtype} {kind_name}")
                    continue
                try:
                    case = case or G.Case(w, dtype)
                    records.extend(measure_cell(
                        torch, G, ctx, impls, case, kind_name, timing, opts, args.rounds,
                        lambda r: print(peers.progress_line(r, f" {r['kind']} r{r['round']}"),
                                        flush=True)))
                except Exception as e:  # inputs or reference: every method of the cell
                    reason = f"inputs or reference failed: {G.short(e)}"
                    print(f"[{wid} {dtype} {kind_name}] {reason}", flush=True)
                    records.extend({"method": m, "workload": wid, "base": w.spec.base,
                                    "dtype": dtype, "kind": kind_name, "head_dim": w.spec.head_dim,
                                    "causal": KINDS[kind_name].causal, "status": "error",
                                    "reason": reason} for m in ("jfa", peer_of(kind_name)))
            if case is not None:
                case.release()
            torch.cuda.empty_cache()
            doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            peers.write_json(json_path, doc)
    stopped = ""
    if skipped:
        stopped = (f"stopped: --time-limit-s {args.time_limit_s:g} reached; {len(skipped)} cells "
                   f"not measured (first: {skipped[0]})")
        doc.update(stopped=stopped, not_measured=skipped)
    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    peers.write_json(json_path, doc)
    print(f"\nwrote {json_path}\ntotal {doc['elapsed_s']:.0f} s on {env.get('gpu')}")
    print(format_table(records, stopped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
