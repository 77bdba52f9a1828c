#!/usr/bin/env python3
"""jfa against FlashAttention-3, varlen FlashAttention-2 and FlexAttention on local attention
(sliding windows, softcap, attention sinks): the forward and the backward, bf16, on the GPU.

Cells: workload x kind x pass. Workloads: bench/workloads.py's W1, W2, W3 (--workloads) at each
of --head-dims (64,128,256: W1-d64 .. W3-d256), 16 query and 16 KV heads as in bench/peers.py.
Kinds (--kinds; window (left, right): query i sees key j iff i + Lk - Lq - left <= j <=
i + Lk - Lq + right, -1 unbounded, causal is right = 0; jfa.h):
  swa128 causal, window (128, 0) (GPT-OSS)  swa4096 causal, window (4096, 0) (Mistral)
  swa128nc non-causal, window (128, 128)            softcap50 causal, softcap 50 (Gemma 2)
  swa_softcap causal, window (4096, 0), softcap 50  sinks causal, sinks ~ N(0, 1)
  swa_sinks causal, window (128, 0), sinks (GPT-OSS)
Passes (--pass forward|backward|both, default forward):
- forward: the attention forward.
- backward: the backward op alone, after one untimed forward of the same method that saved its
  output and LSE; the upstream gradient dO is bench/backward_peers.py's (its seed).
FlashAttention-3 (fa3): torch.ops.flash_attn_3.fwd and, for the backward, .bwd, varlen, from the
op library --fa3-lib names (e.g. its full bf16 build: windows and softcap at head_dim 64, 128,
256, forward and backward), the calls built from the ops' schemas as bench/peers.py and
bench/backward_peers.py do, window_size_left, window_size_right and softcap by keyword.
FA3 has no sinks: the sinks kinds time jfa with sinks against jfa without them (jfa_nosinks,
same window and mask), the ratio being what the sinks cost. The softcap kinds time, beside FA3,
jfa without softcap (jfa_nosoftcap: softcap 0, window, mask and sinks as the kind has them), the
ratio being what the softcap costs (local_kinds.BASELINES: jfa's baselines, each on the kinds
with its modifier, whatever --peers says). FlexAttention (flex, every kind):
torch.compile(flex_attention) on the packed sequences as one [1, H, tokens, D] batch, as
bench/peers.py and bench/backward_peers.py run it (peers_gpu's flex_functions, flex_layout,
flex_kwargs), with a block mask of the document mask and the kind's window (flex_local_mask_mod:
jfa.h's bottom-right aligned rule per sequence; built once per workload and mask, not timed) and
the softcap as a score_mod (cap * tanh(score / cap)); its backward is torch autograd of that call
after one forward, the backward alone timed (backward_peers._autograd_peer). FlexAttention has no
sinks: on the sinks kinds it runs as "FlexAttention + LSE sink correction", its output corrected
by its LSE, out * sigmoid(lse - sink) (exact, forward and autograd: flex_sink_correction; one
compiled kernel, timed with it), dsinks from autograd checked as jfa's. Varlen FlashAttention-2
(fa2): torch's own, aten._flash_attention_forward and, for the backward, _backward, with the
window by keyword (window_size_left, window_size_right); it has no softcap or sinks, so its
records on those kinds say "unavailable". --peers fa3,fa2,flex (default all three) chooses the
peers (jfa's baselines run either way); FlexAttention's compiles take minutes.
jfa: its C entry through bench/libjfa.py, as bench/peers.py, with window_left, window_right,
softcap and sinks (float32 [heads] on the GPU) set in its params; its backward is
jfa_attention_backward from the forward's out and LSE, writing dsinks (float32 [heads]) where the
kind has sinks. A build whose CUDA kernels reject them says so in its cells.

Checks, before anything is timed, each method against the reference of what it runs (a
baseline's without its modifier): forward outputs against a float64 reference (local_reference,
jfa.h's rules) on workloads.check_sample's sequences (all of a small batch, else the longest, the
shortest, the first and the last): relative error ||out - ref|| / ||ref|| <= 1e-2 in bf16
(peers_gpu's TOLERANCE), the max absolute error kept too. Backward: dq, dk and dv against float64
torch autograd through the same attention (local_reference_grads: window, softcap, the sink logit
in the softmax's denominator) on the sampled sequences, and jfa's dsinks (FlexAttention's too,
from autograd), a sum over the batch, against the reference's over every sequence; relative error
of each <= 2e-2 in bf16 (backward_peers' TOLERANCE), from gradient buffers filled with NaN first.
A method that fails is "wrong" and gets no eager or graph time; one that is missing or fails says
why, and the run goes on. Times: forward (peers_gpu.measure, on one side stream): eager_ms (CUDA
events around one call, synchronized) and graph_ms (replays of the call captured in a CUDA graph,
the replay checked too), medians of --runs, and the kernel time median_ms; backward: eager_ms and
graph_ms as bench/backward_peers.py takes them, on the same side stream (FlexAttention's on its
autograd stream, as backward_peers). --rounds N measures every cell N times, the methods in
alternating order (bench/rounds.py; forward: peers.combine_rounds, backward:
backward_peers.combine_rounds). Useful TFLOP/s count the visible (query, key) pairs under mask
and window exactly (visible_pairs): forward 2 * pairs * heads * (head_dim + head_dim_v), backward
2.5 times that (backward_peers' factor); so causal without a window is L(L+1)/2 a sequence here,
not peers.py's L^2/2.

Writes <out>/<YYYY-MM-DD>-<gpu>-local.json (--pass backward: -local-backward.json, both:
-local-both.json; --name: another stem) after every cell, a record per method
(jfa, fa3 or jfa_nosinks, jfa_nosoftcap on the softcap kinds, flex), and prints a table per pass:
a row per workload x kind x head_dim, jfa's and the peer's TFLOP/s eager and graph, jfa ÷ peer,
where FlexAttention ran, its TFLOP/s and jfa ÷ FlexAttention (÷F), and where jfa without softcap
ran, its TFLOP/s (nocap) and jfa ÷ it (÷C). --time-limit-s S: no cell starts after S seconds; the
JSON and the table say so.

This script holds the options, the table, the forward methods and main; beside it,
bench/local_kinds.py (the kinds, methods and shared cell set-up), bench/local_reference.py
(counting and the float64 reference), bench/local_backward.py (the backward methods and their
measurement) and bench/local_flex.py (the FlexAttention peer), their names re-exported here.

usage: python3 bench/local_peers.py --lib build/gpu/src/libjfa.so
           --fa3-lib .peers/fa3_full_bf16.so [--cli build/gpu/tools/jfa] [--out bench/results]
           [--workloads W1,W2,W3] [--head-dims 64,128,256] [--kinds swa128,sinks,...]
           [--pass forward|backward|both] [--peers fa3,fa2,flex] [--rounds N] [--runs N]
           [--warmup N] [--time-limit-s S] [--name NAME]
"""
import argparse
import ctypes
import datetime
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import backward_peers as bp  # noqa: E402
import call_overhead as co  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from rounds import measure_rounds  # noqa: E402

# The modules beside this script; what they hold is re-exported here (the tests and callers use
# local_peers' names).
from local_kinds import (BASELINES, FA3_LOCAL_KEYWORDS,  # noqa: E402,F401
                         FLEX_SINKS_LABEL, FLOP_FACTOR, KINDS, METHODS, SINK_METHODS, SINKS_SEED,
                         Kind, baselines_of, cell_methods, cell_sinks, fa3_values, local_fields,
                         method_label, method_run, peer_of)
from local_reference import (local_case_grads, local_flops, local_probs,  # noqa: E402,F401
                             local_reference, local_reference_grads, pass_flops, visible,
                             visible_pairs)
from local_backward import (LocalBwdCase, backward_progress_line,  # noqa: E402,F401
                            backward_record, check_backward, fa2_backward_prepare, fa2_window,
                            fa3_backward_prepare, fa3_failure, jfa_backward_prepare,
                            jfa_failure, load_fa2, load_fa3_backward, measure_backward,
                            measure_backward_cell)
from local_flex import (flex_about, flex_attend, flex_backward_prepare,  # noqa: E402,F401
                        flex_documents, flex_fns, flex_local_block_mask, flex_local_mask_mod,
                        flex_lse_request, flex_mask_key, flex_prepare, flex_sink_correction,
                        flex_softcap_score_mod, release_flex_masks)

DEFAULT_WORKLOADS = ["W1", "W2", "W3"]
DEFAULT_HEAD_DIMS = ["64", "128", "256"]
PEER_SHORT = {"fa3": "FA3", "jfa_nosinks": "jfa-nosink"}
# The table's column groups after the peer's, each where the records hold its method: (method,
# the name of its TFLOP/s columns, that of jfa ÷ it).
EXTRA_COLUMNS = (("fa2", "FA2", "÷2"), ("flex", "flex", "÷F"), ("jfa_nosoftcap", "nocap", "÷C"))
# The peers --peers chooses from (jfa's baselines, BASELINES, run either way).
PEER_CHOICES = ("fa3", "fa2", "flex")
PASSES = ("forward", "backward")
PASS_CHOICES = {"forward": ("forward",), "backward": ("backward",), "both": PASSES}
PASS_STEMS = {"forward": "local", "backward": "local-backward", "both": "local-both"}
PASS_TITLES = {"forward": "forward",
               "backward": "backward (the backward op alone, after one untimed forward)"}


# ---- report (no torch needed) -------------------------------------------------------------------

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


def pass_of(rec):
    """The pass of a record; records written before there were passes are forward ones."""
    return rec.get("pass") or "forward"


def _ratios(jfa, other):
    """jfa's TFLOP/s over another method's, eager and graph ("-" where either was not timed)."""
    out = []
    for mode in peers.MODES:
        a, b = _rate(jfa, mode), _rate(other, mode)
        out.append(f"{a / b:.2f}" if a and b else "-")
    return out


def pass_table(records, pass_name):
    """The lines of one pass's table: its title, the header, a row per workload base x kind x
    head_dim (table_rows) with jfa's and the peer's useful TFLOP/s eager and graph, jfa / peer
    (eager, graph), then, per group of EXTRA_COLUMNS whose method the records hold
    (FlexAttention, jfa without softcap), its TFLOP/s and jfa / it ("-" on a kind without it),
    and the peer's name."""
    by = {(r["workload"], r["dtype"], r["kind"], r["method"]): r for r in records}
    methods = {r["method"] for r in records}
    extra = [(m, short, ratio, max(11, len(short) + 7)) for m, short, ratio in EXTRA_COLUMNS
             if m in methods]
    counted = "" if pass_name == "forward" else f"{FLOP_FACTOR[pass_name]:g} x the forward's, "
    head = (f"{'workload':<9}{'dtype':<6}{'kind':<12}{'d':>7}{'jfa eager':>11}{'jfa graph':>11}"
            f"{'peer eager':>11}{'peer graph':>11}{'÷ eager':>9}{'÷ graph':>9}"
            + "".join(f"{short + ' eager':>{w}}{short + ' graph':>{w}}{ratio + ' eager':>9}"
                      f"{ratio + ' graph':>9}" for _, short, ratio, w in extra) + "  peer")
    lines = [f"{PASS_TITLES[pass_name]}: useful TFLOP/s ({counted}visible pairs under mask and "
             "window), medians", head]
    for wid, dtype, kind in table_rows(records):
        peer = peer_of(kind)
        row = {m: by.get((wid, dtype, kind, m)) for m in ["jfa", peer] + [e[0] for e in extra]}
        jfa, other = row["jfa"], row[peer]
        any_r = next(r for r in row.values() if r is not None)
        d = peers.head_dim_text(any_r.get("head_dim"), any_r.get("head_dim_v"))
        line = (f"{any_r.get('base', wid):<9}{dtype:<6}{kind:<12}{d:>7}"
                + "".join(f"{_cell(r, m):>11}" for r in (jfa, other) for m in peers.MODES)
                + "".join(f"{x:>9}" for x in _ratios(jfa, other)))
        for m, _, _, w in extra:
            line += ("".join(f"{_cell(row[m], mode):>{w}}" for mode in peers.MODES)
                     + "".join(f"{x:>9}" for x in _ratios(jfa, row[m])))
        lines.append(line + f"  {PEER_SHORT[peer]}")
    return lines


def format_table(records, stopped=""):
    """A table per pass (pass_table: forward, then backward); then the reasons behind every cell
    that is not a number, and `stopped`."""
    if not records:
        return "\n".join(["no results"] + ([stopped] if stopped else []))
    lines = []
    for pass_name in PASSES:
        mine = [r for r in records if pass_of(r) == pass_name]
        if mine:
            lines += ([""] if lines else []) + pass_table(mine, pass_name)
    notes, seen = [], set()
    for r in records:
        where = r["kind"] + ("" if pass_of(r) == "forward" else f" {pass_of(r)}")
        for what, text in ((r["status"], r.get("reason") or ""),
                           ("no graph", r.get("graph_reason") or "")):
            if what != "ok" and text and (r["method"], pass_of(r), what, text) not in seen:
                seen.add((r["method"], pass_of(r), what, text))
                notes.append(f"  {peers.record_label(r)} [{what}] (first: {r['workload']} "
                             f"{where}): {text[:200]}")
    lines.append("n/a: unavailable.  err: failed.  wrong: failed the check, not timed.  "
                 "jfa-nosink: the sinks kinds' peer, jfa without sinks (FA3 has none).")
    if any(r["method"] == "fa2" for r in records):
        lines.append("FA2: varlen FlashAttention-2 inside torch (aten._flash_attention_forward / "
                     "_backward) with the kind's window; it has no softcap or sinks (n/a on those "
                     "kinds); ÷2: jfa ÷ it.")
    if any(r["method"] == "flex" for r in records):
        lines.append("flex: FlexAttention, torch.compile(flex_attention) on the packed sequences "
                     "with a block mask of the kind's window (built once, not timed) and the "
                     "softcap as a score_mod; ÷F: jfa ÷ FlexAttention. On the sinks kinds, "
                     "which FlexAttention lacks, its output is corrected by sigmoid(lse - sink) "
                     "(exact), the correction timed with it.")
    if any(r["method"] == "jfa_nosoftcap" for r in records):
        lines.append("nocap: jfa without softcap (softcap 0, window, mask and sinks as the kind "
                     "has them) on the softcap kinds; ÷C: jfa ÷ it, what the softcap costs jfa.")
    if notes:
        lines += ["notes:"] + notes[:40]
    if stopped:
        lines.append(stopped)
    return "\n".join(lines)


# ---- options ------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="jfa against FlashAttention-3, varlen FlashAttention-2 and FlexAttention on "
                    "local attention, forward "
                    "and backward, on the GPU (see the module docstring)",
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
                    help="file stem of the JSON, as bench/peers.py (default <date>-<gpu>-local, "
                         "-local-backward or -local-both by --pass)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help="comma-separated bases of bench/workloads.py (default W1,W2,W3)")
    ap.add_argument("--head-dims", default=",".join(DEFAULT_HEAD_DIMS),
                    help=f"comma-separated head sizes of {','.join(peers.HEAD_DIM_SUFFIX)} "
                         "(default 64,128,256)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated of {','.join(KINDS)} (default all)")
    ap.add_argument("--dtypes", default="bf16", help="fp16,bf16 (default bf16)")
    ap.add_argument("--peers", default=",".join(PEER_CHOICES),
                    help="comma-separated peers of jfa, of fa3,fa2,flex (default all); FlexAttention "
                         "compiles its kernels for every workload and pass, for softcap and for "
                         "sinks (minutes): --peers fa3,fa2 leaves it out. jfa without sinks (the "
                         "sinks kinds) and without softcap (the softcap kinds) run either way")
    ap.add_argument("--pass", dest="pass_option", default="forward", choices=list(PASS_CHOICES),
                    help="what is timed: the forward, the backward op alone (after one untimed "
                         "forward saving what it needs), or both (default forward)")
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
    given = peers.parse_list(args.peers, list(PEER_CHOICES), "peer")
    args.peer_names = [p for p in PEER_CHOICES if p in given]
    args.passes = PASS_CHOICES[args.pass_option]
    if not (args.workload_ids and args.kind_names and args.dtype_names):
        ap.error("no cell: --workloads, --head-dims, --kinds and --dtypes must not be empty")
    return args


def default_stem(date, gpu, pass_option):
    """The JSON's file stem without --name: <date>-<gpu>-local, -local-backward or -local-both."""
    return f"{date}-{peers.gpu_slug(gpu)}-{PASS_STEMS[pass_option]}"


def carried_cli(lib_path):
    """<dir>/bin/jfa for a library <dir>/lib/libjfa.so (scripts/gpu-check.sh's carried folder)."""
    if not lib_path:
        return None
    cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib_path))), "bin", "jfa")
    return cand if os.path.isfile(cand) else None


# ---- the GPU side -------------------------------------------------------------------------------

class LocalLibrary:
    """A bench/libjfa.py Library whose params() also set the cell's local-attention fields
    (self.fields: window_left, window_right, softcap, sinks), so peers_gpu.Jfa runs them; with
    the backward's calls, which libjfa.Library lacks."""

    def __init__(self, lib):
        self.lib, self.fields = lib, {}

    def params(self, **kw):
        p = self.lib.params(**kw)
        for name, value in self.fields.items():
            setattr(p, name, value)
        return p

    def backward_params(self, forward, *, dout, dq, dk, dv, dsinks=None):
        """A jfa_attention_backward_params filled by this build's sized init, holding a copy of
        the forward's params (out and lse as that call wrote them) and the pointers given
        (integers, dsinks None without sinks)."""
        from libjfa import _library
        b = _library.BackwardParams()
        self.check(self.lib.lib.jfa_attention_backward_params_init_sized(
            ctypes.byref(b), ctypes.sizeof(b)), "jfa_attention_backward_params_init_sized")
        b.forward = forward
        b.dout, b.dq, b.dk, b.dv, b.dsinks = dout, dq, dk, dv, dsinks
        return b

    def backward_workspace_size(self, b):
        """Bytes of device workspace a backward with these params needs."""
        size = ctypes.c_size_t(0)
        self.check(self.lib.lib.jfa_attention_backward_workspace_size(
            ctypes.byref(b), ctypes.byref(size)), "jfa_attention_backward_workspace_size")
        return size.value

    def backward_fn(self, b):
        """A zero-argument callable running the backward on fixed params, as forward_fn."""
        from libjfa import SUCCESS
        bwd, ref, check = self.lib.lib.jfa_attention_backward, ctypes.byref(b), self.check

        def run():
            s = bwd(ref)
            if s != SUCCESS:
                check(s, "jfa_attention_backward")

        run.params = b  # keeps the params alive as long as the callable
        return run

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
        try:
            args, kwargs = co.fa3_call(ctx["fa3_arguments"], fa3_values(case, kind),
                                       dict(co.FA3_KEYWORDS, **FA3_LOCAL_KEYWORDS))
        except ValueError as e:
            raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")
        return G.Prepared(lambda: op(*args, **kwargs)[0], lambda out, i: case.q_rows(out, i),
                          dense=lambda o: o, label=peers.FA3_LABEL,
                          provider=ctx.get("fa3_provider", "torch.ops.flash_attn_3.fwd"))
    return prepare


def fa2_prepare(G, ctx):
    """aten's varlen FA2 forward with the cell's window (ctx["kind"]); unavailable on a kind with
    softcap or sinks."""
    def prepare(case, causal):
        op, args, kwargs = bp.fa2_forward_call(G, ctx, case, causal,
                                               fa2_window(G, ctx["kind"], ctx.get("sinks")))
        return G.Prepared(lambda: op(*args, **kwargs)[0], lambda out, i: case.q_rows(out, i),
                          dense=lambda o: o, label=METHODS["fa2"],
                          provider="torch.ops.aten._flash_attention_forward")
    return prepare


def measure_cell(torch, G, ctx, impls, case, kind_name, timing, opts, rounds, report):
    """One record per method of the cell that impls holds (cell_methods; peers.combine_rounds of
    its rounds) of a kind's forward on a case, each method running the kind as method_run says
    (jfa and FlexAttention with the kind's sinks and softcap, FA3 without sinks, a baseline
    without its modifier; ctx["kind"] and ctx["sinks"] tell the methods) and checked against the
    float64 reference of what it runs, one per (softcap, sinks) of the cell."""
    kind, w = KINDS[kind_name], case.w
    flops = local_flops(w.lengths_q, w.lengths_k, kind, case.H, case.D, case.Dv)
    sinks = cell_sinks(torch, kind, case.H, case.device)
    refs = {}

    def measure(m):
        run, with_sinks = method_run(kind, sinks, m)
        key = (run.softcap, with_sinks is not None)  # the window and mask are the cell's
        if key not in refs:
            refs[key] = {i: local_reference(
                case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
                case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, run.causal,
                (run.left, run.right), run.softcap, with_sinks) for i in case.sample}
        case._refs = {run.causal: refs[key]}  # what peers_gpu's check compares with
        ctx["kind"], ctx["sinks"] = run, with_sinks
        if "jfa_lib" in ctx:
            ctx["jfa_lib"].fields = local_fields(run, with_sinks)
        rec = G.measure(impls[m], case, run.causal, timing, opts)
        rec.update(kind=kind_name, base=w.spec.base, window=[run.left, run.right],
                   softcap=run.softcap, sinks=with_sinks is not None,
                   max_abs_error=impls[m].max_abs_error, useful_gflop=flops / 1e9)
        rec["pass"] = "forward"
        if rec["status"] == "wrong":  # not timed: the kernel time peers_gpu took is dropped
            rec.update(median_ms=None, min_ms=None, useful_tflops=None, eff_tbps=None)
        elif rec.get("median_ms"):
            rec["useful_tflops"] = flops / (rec["median_ms"] * 1e-3) / 1e12
        return peers.add_rates(rec)

    methods = cell_methods(kind_name, impls)
    per_method = measure_rounds(methods, rounds, measure, report)
    return [peers.combine_rounds(per_method[m]) for m in methods]


def load_peers(ctx, env, passes, fa3_lib):
    """FA3's ops for the passes asked (co.load_fa3 for the forward, load_fa3_backward for the
    backward) into ctx, what was loaded or why not into env; a line to print per op schema."""
    lines = []
    if "forward" in passes:
        co.load_fa3(ctx, fa3_lib)
        env["fa3"] = ctx.get("fa3_provider") or ctx.get("fa3_error")
    if "backward" in passes:
        load_fa3_backward(ctx, fa3_lib)
        env["fa3_backward"] = ctx.get("fa3_bwd_provider") or ctx.get("fa3_bwd_error")
        env["fa3_schemas"] = ctx["fa3_schemas"]
        lines += [f"schema {op}: {schema}" for op, schema in ctx["fa3_schemas"].items()]
    return lines


def error_records(w, dtype, kind_name, pass_name, reason, available=None):
    """The records of a cell whose inputs or reference failed: one per method (cell_methods of
    the run's methods, `available`)."""
    return [{"method": m, "label": METHODS[m], "pass": pass_name, "workload": w.id,
             "base": w.spec.base, "dtype": dtype, "kind": kind_name, "head_dim": w.spec.head_dim,
             "head_dim_v": w.spec.value_dim, "causal": KINDS[kind_name].causal, "status": "error",
             "reason": reason} for m in cell_methods(kind_name, available)]


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch = peers.torch_with_cuda("local_peers.py")
    if torch is None:
        return 2
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
    schema_lines = []
    if "fa3" in args.peer_names:
        schema_lines = load_peers(ctx, env, args.passes, args.fa3_lib)
    else:
        env["fa3"] = "left out (--peers)"
    if "fa2" in args.peer_names:
        load_fa2(ctx)
        env["fa2"] = ("torch.ops.aten._flash_attention_forward / _backward"
                      if "fa2_error" not in ctx else ctx["fa2_error"])
    else:
        env["fa2"] = "left out (--peers)"
    env["flex"] = (f"torch.compile(flex_attention), torch {torch.__version__}"
                   if "flex" in args.peer_names else "left out (--peers)")
    env["jfa_lib"] = lib_path
    cli = args.cli or cli_next_to(lib_path) or carried_cli(lib_path) or W.find_cli(None, REPO)
    env["jfa_cli"] = cli
    if "jfa_error" in ctx:
        print(f"jfa: unavailable: {ctx['jfa_error']}", flush=True)
    peer_line = ", ".join(f"{k}: {env[k]}" for k in ("fa3", "fa3_backward", "fa2", "flex")
                          if k in env)
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, jfa {env.get('jfa_version', 'n/a')}, "
          f"{peer_line}", flush=True)
    for line in schema_lines:
        print(line, flush=True)

    # jfa and its baselines (whatever --peers says): one method, the kind set per method_run.
    jfa, jfa_bwd = G.Jfa(ctx).prepare, jfa_backward_prepare(G, ctx)
    impls = {m: Variant(m, jfa) for m in ("jfa", *BASELINES)}
    bwd_impls = {m: jfa_bwd for m in ("jfa", *BASELINES)}
    if "fa3" in args.peer_names:
        impls["fa3"] = Variant("fa3", fa3_prepare(G, co, ctx))
        bwd_impls["fa3"] = fa3_backward_prepare(G, co, ctx)
    if "fa2" in args.peer_names:
        impls["fa2"] = Variant("fa2", fa2_prepare(G, ctx))
        bwd_impls["fa2"] = fa2_backward_prepare(G, ctx)
    if "flex" in args.peer_names:
        impls["flex"] = Variant("flex", flex_prepare(G, ctx))
        bwd_impls["flex"] = flex_backward_prepare(G, ctx)
    timing = G.Timing(min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0)
    opts = {"runs": args.runs, "warmup": args.warmup}
    date = datetime.date.today().isoformat()
    stem = args.name or default_stem(date, env.get("gpu"), args.pass_option)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, stem + ".json")
    loaded = W.load(args.workload_ids, cli)
    records, skipped = [], []
    settings = {k: getattr(args, k) for k in ("workload_ids", "dtype_names", "rounds", "runs",
                                              "warmup", "fa3_lib", "time_limit_s")}
    settings.update(kinds={k: KINDS[k]._asdict() for k in args.kind_names}, timing=vars(timing),
                    tolerance=G.TOLERANCE, data_seed=G.DATA_SEED, sinks_seed=SINKS_SEED,
                    passes=list(args.passes), peers=list(args.peer_names))
    if "backward" in args.passes:
        settings.update(backward_tolerance=bp.TOLERANCE,
                        grad_seed=G.DATA_SEED + bp.GRAD_SEED_OFFSET)
    counting = ("useful FLOPs = 2 * visible pairs * heads * (head_dim + head_dim_v), pairs "
                "counted exactly under the mask and window")
    if "backward" in args.passes:
        counting += f"; the backward's: {FLOP_FACTOR['backward']:g} x that"
    doc = {"title": f"jfa local-attention peers benchmark ({' and '.join(args.passes)})",
           "date": date, "environment": env, "settings": settings, "counting": counting,
           "workloads": {w.id: w.summary() for _, w, _ in loaded if w is not None},
           "workload_errors": {wid: err for wid, w, err in loaded if w is None},
           "results": records}
    for wid, err in doc["workload_errors"].items():
        print(f"{wid}: unavailable: {err}", flush=True)

    def report(r):
        line = peers.progress_line if pass_of(r) == "forward" else backward_progress_line
        print(line(r, f" {r['kind']} r{r['round']}"), flush=True)

    G.warm_gpu(3.0)
    for wid, w, _ in loaded:
        for dtype in (args.dtype_names if w is not None else []):
            case = bc = None
            for kind_name in args.kind_names:
                for pass_name in args.passes:
                    elapsed = time.perf_counter() - t_start
                    if args.time_limit_s is not None and elapsed > args.time_limit_s:
                        skipped.append(f"{wid} {dtype} {kind_name}"
                                       + ("" if pass_name == "forward" else f" {pass_name}"))
                        continue
                    try:
                        case = case or G.Case(w, dtype)
                        if pass_name == "forward":
                            records.extend(measure_cell(torch, G, ctx, impls, case, kind_name,
                                                        timing, opts, args.rounds, report))
                        else:
                            bc = bc or LocalBwdCase(case, G.DATA_SEED + bp.GRAD_SEED_OFFSET)
                            records.extend(measure_backward_cell(
                                torch, G, ctx, bwd_impls, bc, kind_name, opts, args.rounds,
                                report))
                    except Exception as e:  # inputs or reference: every method of the cell
                        reason = f"inputs or reference failed: {G.short(e)}"
                        print(f"[{wid} {dtype} {kind_name} {pass_name}] {reason}", flush=True)
                        records.extend(error_records(w, dtype, kind_name, pass_name, reason,
                                                     impls))
                    # After every cell: FlexAttention's compiles make a workload take minutes,
                    # and a run stopped by its caller keeps what it measured.
                    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
                    peers.write_json(json_path, doc)
            if bc is not None:
                bc.release()
            if case is not None:
                release_flex_masks(case)
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
