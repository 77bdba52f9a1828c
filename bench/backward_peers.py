#!/usr/bin/env python3
"""The attention backward and training step on the GPU: jfa against varlen FlashAttention-2,
FlashAttention-3, FlexAttention and padded cuDNN.

Two passes (--pass backward|step|both, default backward), on the same packed Q, K, V and the same
upstream gradient dO for every method:
- backward: every method runs its own forward once (outside the timing, saving what its backward
  needs) and then only its backward is measured.
- step: what a training step spends in attention: the forward (with what the backward needs
  saved) and the backward from the fixed dO, both in every timed call.
The methods:
- jfa: torch.ops.jfa.jagged_attention_bwd after torch.ops.jfa.jagged_attention_fwd with
  return_lse=True; with --deterministic also jfa_det, the same with deterministic=True (two runs
  must give identical gradients as well).
- jfa_autograd (by --methods only): jfa as users call it, jfa.jagged_attention differentiated by
  torch.autograd.grad; beside jfa, what the autograd path adds to the two ops.
- fa3: torch.ops.flash_attn_3.bwd after torch.ops.flash_attn_3.fwd, varlen, when FA3's op library
  is loaded (--fa3-lib or $FA3_LIB; else an installed flash_attn_interface, if any). Both calls are
  built from the ops' schemas, which differ between FA3 versions.
- cudnn_ragged: cuDNN's native ragged SDPA (bench/cudnn_ragged.py, through the cudnn-frontend
  package on torch's cuDNN): the packed tensors described to cuDNN with ragged offsets and the
  padding mask, forward graph and backward graph built once per cell; unavailable where `import
  cudnn` fails.
- fa4: flash-attn-4's flash_attn.cute.flash_attn_varlen_func (CuTe DSL; on Hopper its SM90 forward
  and backward, the FA3-class kernels at every head size it takes), differentiated by torch
  autograd as FlexAttention is; each shape's kernels are compiled at their first call (not timed).
- fa2_varlen: torch.ops.aten._flash_attention_backward after aten._flash_attention_forward
  (varlen FlashAttention-2 inside torch); the call is built from the schema found at run time, so a
  schema this script does not know is reported as the method failing.
- flex: torch.compile(flex_attention) on the packed sequence as one [1, H, tokens, D] batch with a
  document mask (bottom-right causal per sequence where causal), the block mask built once per
  workload and mask (bench/peers_gpu.py's, not timed); K/V heads fewer than Q heads go in with
  enable_gqa=True. Differentiated by torch autograd (torch.autograd.grad).
- cudnn_padded: F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.CUDNN_ATTENTION) on
  [B, H, Lmax, D] inputs padded with zeros (padding, unpadding and the layout of dO outside the
  timed call), differentiated by torch autograd; it computes on the padding too. GQA: K/V go in
  with their own head count and enable_gqa=True (cuDNN takes grouped heads as they are: no copy of
  K/V per query head). Causal cells with q and k lengths that differ are skipped: is_causal aligns
  the mask top-left on the padded square.
jfa, FA2 and FA3 call their forward and backward ops directly (what their autograd functions
call); FlexAttention and cuDNN go through autograd, whose host work is in their eager time. Those
two run on a CUDA stream of their own: autograd runs a backward on its forward's stream, and a
CUDA graph of the backward alone is captured there.

Before it is timed, every method's dQ, dK and dV are checked against float64 gradients: attention
of each sequence recomputed from the upcast inputs and differentiated with torch autograd, on a
sample of sequences (all of a small batch; else the longest, the shortest, the first and the last;
up to 64 of a batch of tiny ones). Relative error ||g - ref|| / ||ref|| of each gradient over the
sample must be <= 5e-3 (fp16) or 2e-2 (bf16), times --tolerance-scale, and every gradient must be
finite. A method that fails is reported and not timed. Gradient buffers a method takes (FA3's)
are filled with NaN before the call; for the others, blocks of the gradients' sizes are filled
with NaN and freed just before it, so rows a kernel never writes fail the check. Padded cuDNN is
checked on the real rows of its gradients; without the causal mask its padding keys are not
masked, so only the sampled sequences without padding keys are compared (the others get a
different softmax) and the cell is marked "*" (timed, partly checked).

Two times per method, workload, dtype, mask and pass, medians over --runs after warm-up:
- eager_ms: CUDA events around one call (the backward, or forward + backward for a step),
  torch.cuda.synchronize() after each: what a user timing one call sees.
- graph_ms: the call captured once in a CUDA graph and replayed (events around each replay);
  the replay's gradients are checked too.
With --rounds R every cell is measured R times, the methods in alternating order (bench/rounds.py);
each method keeps its median round by eager time, and graph_ms is the median of the rounds'.
Useful TFLOP/s = the pass's factor x the forward's useful FLOPs (4 * head_dim * heads * visible
pairs, counted exactly per sequence as bench/workloads.py does) / time; the factor is 2.5 for the
backward and 3.5 for a step (forward 1 + backward 2.5). "÷ FA2" is varlen FA2's time over the
method's (> 1: faster than varlen FA2). --chart draws the replays' TFLOP/s (bench/peers.py's chart).
The JSON's gpu_clocks holds each GPU's SM clock and power draw through the measurements
(bench/gpu_clocks.py; --merge keeps every run's under merged_from): the power limit lowers the
clock under sustained work, so figures move from run to run with it.

usage: python3 bench/backward_peers.py --lib build/gpu/src/libjfa.so [--cli build/gpu/tools/jfa]
           [--fa3-lib flash_attn_3.so] [--workloads W1,W2,W3,W4] [--dtypes fp16,bf16]
           [--causal both|on|off] [--head-dim 32|64|96|128] [--heads-kv N] [--deterministic]
           [--pass backward|step|both] [--methods jfa,fa2_varlen,...] [--rounds N] [--quick]
           [--json PATH] [--chart PATH.png]
"""
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import call_overhead as co  # noqa: E402
import gpu_clocks  # noqa: E402
import peers  # noqa: E402
import rounds  # noqa: E402
import workloads as W  # noqa: E402
from peers import parse_list, write_json  # noqa: E402
from workloads import mask_name  # noqa: E402

METHOD_ORDER = ["jfa", "jfa_det", "jfa_autograd", "fa3", "cudnn_ragged", "fa4", "fa2_varlen",
                "flex", "cudnn_padded"]
LABELS = {"jfa": "jfa", "jfa_det": "jfa deterministic", "jfa_autograd": "jfa through autograd",
          "fa3": "FA3 varlen", "cudnn_ragged": "cuDNN ragged",
          "fa4": "FA4 varlen (Hopper)",
          "fa2_varlen": "varlen FA2 (aten)", "flex": "FlexAttention",
          "cudnn_padded": "padded cuDNN"}
PADDED = ("cudnn_padded",)        # computes on [B, H, Lmax, D] padded inputs
AUTOGRAD = ("jfa_autograd", "fa4", "flex", "cudnn_padded")  # differentiated by torch autograd
OPT_IN = ("jfa_det", "jfa_autograd")  # by --methods (jfa_det also by --deterministic) only
BASELINE = "fa2_varlen"
TIMED = rounds.TIMED
CELL = {"wrong": "wrong", "unavailable": "n/a", "error": "err", "skipped": "skip"}

KNOWN_WORKLOADS = ["W1", "W2", "W3", "W4", "X1", "X2"]
DEFAULT_WORKLOADS = ["W1", "W2", "W3", "W4"]
QUICK_WORKLOADS = ["W1", "W4"]
CAUSAL = {"both": (False, True), "on": (True,), "off": (False,)}
PASSES = ("backward", "step")
PASS_CHOICES = {"backward": ("backward",), "step": ("step",), "both": PASSES}

# Useful FLOPs of a pass, in forwards: the backward does five matmuls of the forward's size where
# the forward does two; a step does both.
FLOP_FACTOR = {"backward": 2.5, "step": 3.5}
# Looser than the forward's check (bench/peers_gpu.py): dP, dS and the gradients pass through
# 16-bit operands once more, while a wrong tile or mask still shows as errors of order 1e-1.
TOLERANCE = {"fp16": 5e-3, "bf16": 2e-2}
GRADIENTS = ("dq", "dk", "dv")
ROUND_FIELDS = ("status", "eager_ms", "graph_ms", "rel_error")
GRAD_SEED_OFFSET = 1  # dO is drawn after Q, K, V, from its own seed

# aten's backward: argument names that changed between torch releases (position is the same).
FA2_ALIASES = {"philox_seed": ("philox_seed", "rng_state"),
               "philox_offset": ("philox_offset", "unused")}
FA2_KEYWORDS = {"scale": ("scale",)}
# aten's FA2 takes a window (left, right; -1 unbounded) by keyword, forward and backward.
FA2_WINDOW_KEYWORDS = {"window_size_left": ("window_size_left",),
                       "window_size_right": ("window_size_right",)}
FA3_BWD_KEYWORDS = {"softmax_scale": ("softmax_scale", "scale"),
                    "is_causal": ("is_causal", "causal")}


# ---- pure parts (no torch) ---------------------------------------------------------------------

def pass_flops(lengths_q, lengths_k, heads, head_dim, causal, pass_name="backward"):
    """Useful FLOPs of a pass: FLOP_FACTOR[pass_name] x the forward's (workloads.useful_flops)."""
    return FLOP_FACTOR[pass_name] * W.useful_flops(lengths_q, lengths_k, heads, head_dim, causal)


def backward_flops(lengths_q, lengths_k, heads, head_dim, causal):
    """Useful FLOPs of the backward: 2.5 x the forward's."""
    return pass_flops(lengths_q, lengths_k, heads, head_dim, causal, "backward")


def pass_of(rec):
    """The pass of a record; records written before there were passes are backward ones."""
    return rec.get("pass") or "backward"


def skip_reason(method, cross, causal):
    """Why a method leaves a cell out ("" if it does not): the padded peers' causal mask is not
    the same attention when q and k lengths differ (bench/peers.py's rule)."""
    return peers.padded_skip_reason(cross, causal) if method in PADDED else ""


def padded_check_sequences(sample, lengths_k, causal):
    """The sampled sequences whose gradients a padded peer computes exactly. Padded at the end,
    a real query row sees only real keys under the causal mask (equal lengths), and padding rows
    get a zero dO, so they pass nothing back: all of them. Without the mask every real row also
    attends to its sequence's padding keys: only the sequences without any (the longest k)."""
    if causal:
        return list(sample)
    longest = max(lengths_k, default=0)
    return [i for i in sample if lengths_k[i] == longest]


def partly_checked_reason(checked, sampled):
    """Why a padded peer's cell is marked "*" (timed, partly checked)."""
    if not checked:
        return ("padding keys are not masked: no sampled sequence is free of them, so only the "
                "gradients' shapes and finiteness are checked")
    return (f"padding keys are not masked: gradients checked on {checked} of the {sampled} "
            "sampled sequences (those without padding keys)")


class Slot:
    """A value of an op call that is known only at call time (a step's forward outputs)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Slot({self.name!r})"


def late_call(args, kwargs):
    """fill(values) -> (args, kwargs): the call with every Slot replaced by values[slot.name];
    the slots are found once, so a call costs two copies."""
    arg_slots = [(i, a.name) for i, a in enumerate(args) if isinstance(a, Slot)]
    kw_slots = [(k, v.name) for k, v in kwargs.items() if isinstance(v, Slot)]

    def fill(values):
        a, kw = list(args), dict(kwargs)
        for i, name in arg_slots:
            a[i] = values[name]
        for key, name in kw_slots:
            kw[key] = values[name]
        return a, kw

    return fill


def workload_spec(wid, head_dim=128, heads_kv=W.HEADS):
    """The spec of a workload of bench/workloads.py at another head_dim or K/V head count; its id
    says so (W1-d64, W1-kv4)."""
    base = W.SPEC_BY_ID[wid]
    suffix = "" if head_dim == base.head_dim else f"-d{head_dim}"
    suffix += "" if heads_kv == base.heads else f"-kv{heads_kv}"
    return dataclasses.replace(base, id=base.id + suffix, head_dim=head_dim, heads_kv=heads_kv)


def load_workloads(ids, cli, head_dim=128, heads_kv=W.HEADS):
    """[(id, Workload or None, error or None)]; lengths from the CLI, as every benchmark takes
    them."""
    out = []
    for wid in ids:
        spec = workload_spec(wid, head_dim, heads_kv)
        try:
            out.append((spec.id, W.make_workload(spec, W.cli_lengths(cli, spec.base)), None))
        except W.LengthsError as e:
            out.append((spec.id, None, str(e)))
    return out


def schema_call(arguments, values, aliases=None, keywords=None):
    """(args, kwargs) of an op call from its schema's arguments (names, or (name, default) pairs)
    and values by name: positional names are looked up under their aliases first, then the call is
    built as FA3's forward is (call_overhead.fa3_call). Raises ValueError on a schema that lacks a
    name or leaves a required argument unset."""
    aliases, keywords = aliases or {}, keywords or {}
    names = {a if isinstance(a, str) else a[0] for a in arguments}
    renamed = {}
    for key, value in values.items():
        if key in keywords:
            renamed[key] = value
            continue
        options = aliases.get(key, (key,))
        name = next((n for n in options if n in names), None)
        if name is None:
            raise ValueError(f"the schema has no {' or '.join(options)} (it has "
                             f"{', '.join(a if isinstance(a, str) else a[0] for a in arguments)})")
        renamed[name] = value
    return co.fa3_call(arguments, renamed, keywords)


def _slower_median(values):
    """The median; of two middle values the larger (the slower time), as rounds.median_round."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def combine_rounds(records):
    """One record from a method's rounds of one cell: the median round by eager time (a failed
    round is the result), with graph_ms the median of every round's replay time (None, with the
    reason, if some round has none)."""
    kept = rounds.median_round(records, key="eager_ms", higher_is_better=False,
                               fields=ROUND_FIELDS)
    if kept.get("status") in TIMED:
        graphs = [r.get("graph_ms") for r in records]
        if all(g for g in graphs):
            kept["graph_ms"] = _slower_median(graphs)
        else:
            kept["graph_ms"] = None
            kept["graph_reason"] = next((r["graph_reason"] for r in records
                                         if not r.get("graph_ms") and r.get("graph_reason")),
                                        "no replay time in some round")
    return kept


def add_rates(rec):
    """TFLOP/s of the record's eager and graph times (None where not timed), from the useful
    GFLOP of its pass."""
    flops = rec.get("useful_gflop", rec.get("bwd_gflop", 0.0)) * 1e9
    timed = rec.get("status") in TIMED
    for mode in ("eager", "graph"):
        t = rec.get(f"{mode}_ms")
        rec[f"{mode}_tflops"] = flops / (t * 1e-3) / 1e12 if timed and t else None
    return rec


def _time(rec, mode):
    if rec is None or rec.get("status") not in TIMED:
        return None
    t = rec.get(f"{mode}_ms")
    return t if t else None


def cell_of(rec):
    """(workload, dtype, causal, pass): the cell a record belongs to."""
    return rec["workload"], rec["dtype"], bool(rec["causal"]), pass_of(rec)


def add_ratios(records):
    """Sets vs_fa2_eager / vs_fa2_graph of every record: varlen FA2's time over the method's in the
    same cell (> 1: faster than varlen FA2), None where either was not timed."""
    base = {cell_of(r): r for r in records if r["method"] == BASELINE}
    for r in records:
        b = base.get(cell_of(r))
        for mode in ("eager", "graph"):
            mine, theirs = _time(r, mode), _time(b, mode)
            r[f"vs_fa2_{mode}"] = theirs / mine if mine and theirs else None
    return records


def summarize(records):
    """Per cell: every timed method's TFLOP/s and its ratio to varlen FA2."""
    out = []
    cells = {}
    for r in records:
        cells.setdefault(cell_of(r), []).append(r)
    for (wid, dtype, causal, pass_name), rs in cells.items():
        s = {"workload": wid, "dtype": dtype, "causal": causal, "pass": pass_name}
        for r in rs:
            s[r["method"]] = {k: r.get(k) for k in ("status", "eager_ms", "graph_ms",
                                                    "eager_tflops", "graph_tflops",
                                                    "vs_fa2_eager", "vs_fa2_graph")}
        out.append(s)
    return out


def _fmt(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def _row(rec):
    label = LABELS.get(rec["method"], rec["method"])
    st = rec.get("status")
    err = rec.get("rel_error")
    err = "-" if err is None else f"{err:.1e}"
    if st not in TIMED:
        return [label] + [CELL.get(st, st or "-")] * 6 + [err]
    star = "*" if st == "unchecked" else ""
    graph = "no graph" if rec.get("graph_ms") is None and rec.get("graph_reason") else (
        "-" if rec.get("graph_ms") is None else co.fmt_ms(rec["graph_ms"]) + star)
    ratio = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    return [label, co.fmt_ms(rec["eager_ms"]) + star, graph, _fmt(rec.get("eager_tflops"), 1),
            _fmt(rec.get("graph_tflops"), 1), ratio(rec.get("vs_fa2_eager")),
            ratio(rec.get("vs_fa2_graph")), err]


PASS_TITLES = {"backward": "backward", "step": "step: forward + backward"}


def _useful_gflop(rec):
    if rec.get("useful_gflop") is not None:
        return rec["useful_gflop"]
    return rec.get("bwd_gflop")


def format_tables(records, workload_order=None):
    """Markdown: one table per (workload, dtype, mask, pass), one row per method; notes follow."""
    if not records:
        return "no results"
    methods, wids, dtypes = co.table_axes(records, METHOD_ORDER, workload_order)
    by = {cell_of(r) + (r["method"],): r for r in records}
    passes = [p for p in PASSES if any(pass_of(r) == p for r in records)]
    head = ["method", "eager ms", "graph ms", "TFLOP/s eager", "TFLOP/s graph", "÷ FA2 eager",
            "÷ FA2 graph", "max rel. error"]
    lines = []
    for wid in wids:
        for dtype in dtypes:
            for causal in (False, True):
                for pass_name in passes:
                    cell = (wid, dtype, causal, pass_name)
                    rows = [by[cell + (m,)] for m in methods if cell + (m,) in by]
                    if not rows:
                        continue
                    r0 = rows[0]
                    lines += ["", f"### {wid}, {dtype}, {mask_name(causal)}, "
                                  f"{PASS_TITLES[pass_name]} (heads {r0.get('heads')}, K/V heads "
                                  f"{r0.get('heads_kv')}, head_dim {r0.get('head_dim')}; "
                                  f"{_fmt(_useful_gflop(r0), 1)} useful GFLOP = "
                                  f"{FLOP_FACTOR[pass_name]} x the forward's)", "",
                              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                    lines += ["| " + " | ".join(_row(r)) + " |" for r in rows]
    lines += ["", "eager: CUDA events around one call (backward: the backward alone; step: the "
              "forward, saving what the backward needs, and the backward), synchronized after "
              "each. graph: one replay of the captured call. TFLOP/s: useful FLOPs / time, "
              "counted as 2.5 x the forward's for the backward and 3.5 x for a step. "
              "÷ FA2: varlen FA2's time / the method's (> 1: faster). max rel. error: the largest "
              "of dQ, dK, dV against float64 autograd on the sampled sequences. n/a: unavailable. "
              "err: failed. wrong: failed the check, not timed. skip: left out (see the notes)."]
    present = {r["method"] for r in records}
    if any(r.get("status") == "unchecked" for r in records):
        lines += ["* timed, its gradients checked on part of the sample only (see the notes)."]
    if present & set(PADDED):
        names = ", ".join(LABELS[m] for m in PADDED if m in present)
        lines += [f"{names}: computes on [B, H, Lmax, D] inputs padded with zeros, padding rows "
                  "and keys included (padding and unpadding are not timed); its TFLOP/s count "
                  "the useful FLOPs only."]
    if present & set(AUTOGRAD):
        names = ", ".join(LABELS[m] for m in AUTOGRAD if m in present)
        lines += [f"{names}: differentiated by torch autograd (their host work is in the eager "
                  "time); jfa, FA2 and FA3 call their forward and backward ops directly."]
    lines += co.note_lines(records, LABELS, (("no graph", "graph_reason"),))
    return "\n".join(lines)


README_LABELS = {"jfa": "jfa", "jfa_det": "jfa, `deterministic=True`",
                 "jfa_autograd": "jfa through `torch.autograd.grad`",
                 "fa3": "FlashAttention-3 (varlen)",
                 "cudnn_ragged": "cuDNN SDPA, ragged (THD)",
                 "fa4": "FlashAttention-4, Hopper kernels (varlen)",
                 "fa2_varlen": "varlen FA2 (aten)",
                 "flex": "FlexAttention (document mask)", "cudnn_padded": "padded cuDNN"}
README_TITLES = {"backward": "backward", "step": "step (forward + backward)"}


def readme_tables(records, dtype="fp16", head_dim=128):
    """The README's tables for one dtype and head_dim: per pass, a row per method and a column per
    workload, each cell useful TFLOP/s eager non-causal / causal (graph replay's in brackets);
    a cell with either mask missing or not timed is "-"."""
    recs = [r for r in records if r.get("dtype") == dtype and r.get("head_dim") == head_dim]
    by = {(pass_of(r), r["method"], r["workload"], r["causal"]): r for r in recs
          if r.get("status") in TIMED and r.get("eager_tflops") is not None}
    wids = list(dict.fromkeys(r["workload"] for r in recs))
    lines = []
    for pass_name in PASSES:
        methods = [m for m in METHOD_ORDER
                   if any(k[0] == pass_name and k[1] == m for k in by)]
        if not methods:
            continue
        if lines:
            lines.append("")
        lines += peers.readme_table_head(f"{README_TITLES[pass_name]}, non-causal / causal",
                                         wids)
        for m in methods:
            cells = []
            for i, wid in enumerate(wids):
                nc, c = by.get((pass_name, m, wid, False)), by.get((pass_name, m, wid, True))
                # Both masks with their replays, or "-" (the forward's tables say why instead).
                complete = nc is not None and c is not None and None not in (
                    nc.get("graph_tflops"), c.get("graph_tflops"))
                cells.append(peers.readme_cell(nc, c, i == 0) if complete else "-")
            lines.append(f"| {README_LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_chart(records, path, workload_order=None):
    """write_chart into path, its folder made first; what write_chart returns."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as e:
        return f"chart not written: {e}"
    return write_chart(records, path, workload_order)


def pass_panel(rec):
    """The chart panel of a record: (sort key, title), one per pass, dtype and mask."""
    (rank, dtype, causal), title = peers.dtype_mask_panel(rec)
    pass_name = pass_of(rec)
    order = PASSES.index(pass_name) if pass_name in PASSES else len(PASSES)
    return (order, rank, dtype, causal), f"{PASS_TITLES.get(pass_name, pass_name)}, {title}"


def write_chart(records, path, workload_order=None):
    """bench/peers.py's bar chart of the CUDA-graph replays' useful TFLOP/s: a panel per pass,
    dtype and mask, a group per workload, a bar per method. Returns the path, or a string
    starting with 'chart not written' (no matplotlib, nothing timed, a failure)."""
    return peers.write_chart(
        records, path, workload_order, value="graph_tflops", method_order=METHOD_ORDER,
        labels=LABELS, panel=pass_panel,
        title="jagged attention backward and training step, useful TFLOP/s of the CUDA-graph "
              "replay (medians; numbers on jfa's bars)",
        unchecked_label="timed, partly checked")


def parse_args(argv=None):
    """The options, with --quick's defaults filled in and the lists parsed."""
    ap = co.bench_parser(__doc__)
    ap.add_argument("--fa3-lib", default=os.environ.get("FA3_LIB") or None,
                    help="FlashAttention-3's op library, loaded with torch.ops.load_library "
                         "(default: $FA3_LIB; without it, FA3 runs if torch.ops.flash_attn_3.bwd "
                         "exists after importing flash_attn_interface)")
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated, of {','.join(KNOWN_WORKLOADS)} (default "
                         f"{','.join(DEFAULT_WORKLOADS)}; --quick: {','.join(QUICK_WORKLOADS)})")
    ap.add_argument("--dtypes", default="fp16", help="fp16,bf16 (default fp16)")
    ap.add_argument("--causal", default="both", choices=list(CAUSAL),
                    help="masks: both, on (causal only) or off (non-causal only)")
    ap.add_argument("--head-dim", type=int, default=128, choices=W.CUDA_HEAD_DIMS)
    ap.add_argument("--heads-kv", type=int, default=W.HEADS,
                    help=f"K/V heads (GQA), a divisor of the {W.HEADS} query heads "
                         f"(default {W.HEADS})")
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated subset of {','.join(METHOD_ORDER)} (default: all but "
                         f"{' and '.join(OPT_IN)})")
    ap.add_argument("--pass", dest="pass_option", default="backward", choices=list(PASS_CHOICES),
                    help="what is timed: the backward alone, a whole training step of attention "
                         "(forward saving what the backward needs + backward), or both "
                         "(default backward)")
    ap.add_argument("--deterministic", action="store_true",
                    help="also time jfa's deterministic backward, as method jfa_det")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measure every cell this many times, the methods in alternating order "
                         "(default 3)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed calls for eager_ms and replays for graph_ms per round (default "
                         "30; --quick: 10)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed calls before each figure (default 5; --quick: 3)")
    ap.add_argument("--warm-seconds", type=float, default=None,
                    help="seconds of matmuls before the first timing (default 3; --quick: 1)")
    ap.add_argument("--tolerance-scale", type=float, default=1.0,
                    help="multiplies the check's tolerances (fp16 5e-3, bf16 2e-2)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke test: {','.join(QUICK_WORKLOADS)} unless --workloads, fewer "
                         "runs")
    ap.add_argument("--json", default=None, help="write every number to this JSON file")
    ap.add_argument("--chart", default=None, metavar="PATH.png",
                    help="draw the CUDA-graph replays' useful TFLOP/s per method and workload "
                         "(needs matplotlib; without it the run says so and goes on)")
    ap.add_argument("--merge", default=None, metavar="A.json,B.json",
                    help="measure nothing: join the results of earlier runs (their --json files, "
                         "e.g. one per dtype and head_dim) into one table, --json and --chart")
    ap.add_argument("--readme-tables", default=None, metavar="RESULTS.json",
                    help="measure nothing: print the README's backward and step tables (fp16, "
                         "head_dim 128) from a results file")
    args = ap.parse_args(argv)
    quick = args.quick
    co.settle_counts(ap, args, (("runs", 30, 10), ("warmup", 5, 3), ("warm_seconds", 3.0, 1.0)),
                     ("runs", "rounds"))
    if args.heads_kv < 1 or W.HEADS % args.heads_kv:
        ap.error(f"--heads-kv must divide the {W.HEADS} query heads, got {args.heads_kv}")
    if not args.tolerance_scale > 0:
        ap.error("--tolerance-scale must be positive")
    args.workload_ids = (parse_list(args.workloads, KNOWN_WORKLOADS, "workload")
                         if args.workloads else list(QUICK_WORKLOADS if quick
                                                     else DEFAULT_WORKLOADS))
    args.dtype_names = parse_list(args.dtypes, list(W.DTYPES), "dtype")
    methods = (parse_list(args.methods, METHOD_ORDER, "method") if args.methods
               else [m for m in METHOD_ORDER if m not in OPT_IN])
    if args.deterministic and "jfa_det" not in methods:
        methods.insert(methods.index("jfa") + 1 if "jfa" in methods else 0, "jfa_det")
    args.method_names = methods
    args.masks = CAUSAL[args.causal]
    args.passes = PASS_CHOICES[args.pass_option]
    if not (args.workload_ids and args.dtype_names and args.method_names):
        ap.error("nothing to run: --workloads, --dtypes and --methods must not be empty")
    return args


# ---- inputs and the float64 reference (torch, GPU) ---------------------------------------------

class BwdCase:
    """One workload in one dtype: bench/peers_gpu.py's Case (packed Q, K, V, offsets) plus the
    upstream gradient dO, the float64 reference gradients of the sampled sequences and
    FlexAttention's block masks (each built once)."""

    def __init__(self, G, workload, dtype_name):
        import torch
        self.case = G.Case(workload, dtype_name)
        c = self.case
        gen = torch.Generator(device=c.device)
        gen.manual_seed(G.DATA_SEED + GRAD_SEED_OFFSET)
        self.dout = torch.randn(c.total_q, c.H, c.D, device=c.device, dtype=c.dtype,
                                generator=gen)
        self._refs = {}
        self._flex_masks = {}

    def flex_mask(self, G, ctx, causal):
        """(block mask, how it was built, seconds) of the mask, built on first use and kept for
        every pass and round; a failure is kept too."""
        if causal not in self._flex_masks:
            _, cbm_compiled, cbm_eager = G.flex_functions(ctx)
            try:
                self._flex_masks[causal] = G.flex_block_mask(self.case, causal, cbm_compiled,
                                                             cbm_eager)
            except Exception as e:
                self._flex_masks[causal] = e
        got = self._flex_masks[causal]
        if isinstance(got, Exception):
            raise got
        return got

    def reference(self, causal):
        """{sequence index: (dq, dk, dv) float64} on the sample."""
        if causal not in self._refs:
            self._refs[causal] = {i: reference_grads(self.case, self.dout, i, causal)
                                  for i in self.case.sample}
        return self._refs[causal]

    def release(self):
        self._refs = {}
        self._flex_masks = {}
        self.dout = None
        self.case.release()


def reference_grads(case, dout, i, causal):
    """dQ [Lq, H, D], dK and dV [Lk, Hkv, D] of sequence i in float64: softmax(scale q k^T
    [+ bottom-right causal mask]) v on the upcast inputs, through torch autograd. A query row with
    no visible key gives zeros and passes no gradient (the convention of jfa and FlashAttention)."""
    import torch
    a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
    c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
    lq, lk = b - a, d - c
    H, Hkv, D = case.H, case.Hkv, case.D
    dev, f64 = case.device, torch.float64
    dq = torch.zeros(lq, H, D, device=dev, dtype=f64)
    dk = torch.zeros(lk, Hkv, D, device=dev, dtype=f64)
    dv = torch.zeros(lk, Hkv, D, device=dev, dtype=f64)
    if lq == 0 or lk == 0:
        return dq, dk, dv
    q = case.q[a:b].to(f64).transpose(0, 1)      # [H, Lq, D]
    k = case.k[c:d].to(f64).transpose(0, 1)      # [Hkv, Lk, D]
    v = case.v[c:d].to(f64).transpose(0, 1)
    g = dout[a:b].to(f64).transpose(0, 1)
    hidden = live = None
    if causal:
        ii = torch.arange(lq, device=dev)[:, None]
        jj = torch.arange(lk, device=dev)[None, :]
        hidden = jj > ii + (lk - lq)
        live = ~hidden.all(dim=1, keepdim=True)
        # A row without keys is left unmasked (finite softmax) and zeroed after it, so that no NaN
        # reaches the gradients.
        hidden = hidden & live
    rep = H // Hkv
    # Heads are independent: a chunk of them at a time, <= 2 GiB of float64 scores each.
    chunk = max(1, min(H, (1 << 28) // max(1, lq * lk)))
    with torch.enable_grad():
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            kv = torch.arange(h0, h1, device=dev) // rep
            qc = q[h0:h1].detach().clone().requires_grad_(True)
            kc = k[kv].detach().requires_grad_(True)
            vc = v[kv].detach().requires_grad_(True)
            s = torch.matmul(qc, kc.transpose(1, 2)) * case.scale
            if hidden is not None:
                s = s.masked_fill(hidden, float("-inf"))
            p = torch.softmax(s, dim=-1)
            del s
            if live is not None:
                p = p * live
            o = torch.matmul(p, vc)
            del p
            gq, gk, gv = torch.autograd.grad(o, (qc, kc, vc), grad_outputs=g[h0:h1])
            dq[:, h0:h1] = gq.transpose(0, 1)
            dk.index_add_(1, kv, gk.transpose(0, 1))
            dv.index_add_(1, kv, gv.transpose(0, 1))
            del o, gq, gk, gv, qc, kc, vc
    return dq, dk, dv


def grad_errors(bc, causal, grads, sequences=None):
    """{dq, dk, dv: relative error over the sample (or its `sequences`)} against the float64
    reference."""
    import math
    import torch
    c = bc.case
    ref = bc.reference(causal)
    if sequences is not None:
        ref = {i: ref[i] for i in sequences}
    out = {}
    for j, name in enumerate(GRADIENTS):
        cu = c.cu_q_host if j == 0 else c.cu_k_host
        num = torch.zeros((), dtype=torch.float64, device=c.device)
        den = torch.zeros((), dtype=torch.float64, device=c.device)
        for i, r in ref.items():
            rows = grads[j][cu[i]:cu[i + 1]].to(torch.float64)
            num += (rows - r[j]).pow(2).sum()
            den += r[j].pow(2).sum()
        n, dd = num.item(), den.item()
        if not math.isfinite(n):
            out[name] = float("nan")
        else:
            out[name] = math.sqrt(n / dd) if dd > 0 else (0.0 if n == 0 else float("inf"))
    return out


def check(bc, causal, grads, tolerance, sequences=None):
    """(status, {gradient: error}, largest error, reason) of one method's packed gradients,
    compared on the sample (or its `sequences`: none leaves the shapes and finiteness)."""
    import torch
    c = bc.case
    if not isinstance(grads, (tuple, list)) or len(grads) < 3:
        return "wrong", {}, None, f"expected (dq, dk, dv), got {type(grads).__name__}"
    for name, g, like in zip(GRADIENTS, grads, (c.q, c.k, c.v)):
        if g is None:
            return "wrong", {}, None, f"no {name}"
        if tuple(g.shape) != tuple(like.shape) or g.dtype != like.dtype:
            return "wrong", {}, None, (f"{name} is {tuple(g.shape)} {g.dtype}, expected "
                                       f"{tuple(like.shape)} {like.dtype}")
    errors = grad_errors(bc, causal, grads, sequences) if sequences != [] else {}
    # NaN counts as the worst.
    worst = max(errors.values(), key=lambda e: (e != e, e)) if errors else None
    bad = [n for n, g in zip(GRADIENTS, grads) if not bool(torch.isfinite(g).all().item())]
    if bad:
        return "wrong", errors, worst, f"non-finite values in {', '.join(bad)}"
    over = [f"{n} {e:.3g}" for n, e in errors.items() if not e <= tolerance]
    if over:
        return "wrong", errors, worst, f"relative error {', '.join(over)} > {tolerance:g}"
    return "ok", errors, worst, ""


# ---- methods (torch, GPU) ----------------------------------------------------------------------

class Prepared:
    """run(): one timed call (the backward, or a step: forward + backward), returns the gradients
    in the method's layout; unpack(them) gives (dq, dk, dv) packed as the case's Q, K, V.
    explain(e): (status, reason) of a failed first call. outputs: preallocated gradients the call
    writes (filled with NaN before checks). poison_like: tensors of the gradients' sizes (default
    the case's Q, K, V). check_sequences: the sampled sequences the check compares (None: all);
    partly_checked: why a check on part of the sample marks the cell "*". stream: the CUDA stream
    everything of the method runs on (None: the current one). context(): entered around every
    call of the method."""

    def __init__(self, run, provider="", note="", explain=None, outputs=(), keep=None,
                 unpack=None, poison_like=None, check_sequences=None, partly_checked="",
                 stream=None, context=None):
        self.run = run
        self.provider = provider
        self.note = note
        self.explain = explain
        self.outputs = outputs
        self.keep = keep  # tensors the call reads (the forward's out and LSE)
        self.unpack = unpack or (lambda grads: grads)
        self.poison_like = poison_like
        self.check_sequences = check_sequences
        self.partly_checked = partly_checked
        self.stream = stream
        self.context = context or contextlib.nullcontext


def prepare_jfa(G, ctx, bc, causal, step=False, deterministic=False):
    import torch
    jfa = ctx.get("jfa")
    if jfa is None:
        raise G.Unavailable(ctx.get("jfa_error") or "jfa is not loaded")
    c = bc.case
    fwd = torch.ops.jfa.jagged_attention_fwd
    bwd = torch.ops.jfa.jagged_attention_bwd
    q, k, v, cu_q, cu_k, mq, mk, scale = c.q, c.k, c.v, c.cu_q, c.cu_k, c.max_q, c.max_k, c.scale
    from jfa import _torch_native  # the native ops' messages as the package's errors

    def forward():  # the output and the LSE the backward needs
        return fwd(q, k, v, cu_q, cu_k, mq, mk, causal, scale, True, deterministic)

    try:
        out, lse = forward()
    except RuntimeError as e:
        e = _torch_native.translate(e, "jfa_attention_forward")
        raise RuntimeError(f"forward: {G.short(e)}") from None
    dout = bc.dout

    def backward(out, lse):
        return bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, causal, scale, None, deterministic)

    if step:
        out = lse = None

        def run():
            return backward(*forward())
    else:
        def run():
            return backward(out, lse)

    def explain(e):
        if isinstance(e, RuntimeError):
            e = _torch_native.translate(e, "jfa_attention_forward" if step
                                        else "jfa_attention_backward")
        unavailable = isinstance(e, (jfa.JfaUnsupportedError, jfa.JfaBackendUnavailableError))
        return ("unavailable" if unavailable else "error"), G.short(e)

    ops = "jagged_attention_fwd + _bwd" if step else "jagged_attention_bwd"
    return Prepared(run, provider=f"torch.ops.jfa.{ops} (torch ops: {ctx.get('jfa_ops_kind')}, "
                                  f"libjfa {ctx.get('jfa_version')})",
                    note="deterministic=True" if deterministic else "",
                    explain=explain, keep=(out, lse))


def prepare_jfa_det(G, ctx, bc, causal, step=False):
    return prepare_jfa(G, ctx, bc, causal, step, deterministic=True)


def prepare_jfa_autograd(G, ctx, bc, causal, step=False):
    jfa = ctx.get("jfa")
    if jfa is None:
        raise G.Unavailable(ctx.get("jfa_error") or "jfa is not loaded")
    c = bc.case

    def attend(q, k, v):
        return jfa.jagged_attention(q, k, v, c.cu_q, c.cu_k, c.max_q, c.max_k, causal=bool(causal),
                                    softmax_scale=c.scale)

    return _autograd_peer(
        step, attend, (c.q, c.k, c.v), bc.dout, lambda grads: tuple(grads),
        provider=f"jfa.jagged_attention, autograd (torch ops: {ctx.get('jfa_ops_kind')}, "
                 f"libjfa {ctx.get('jfa_version')})")


def prepare_cudnn_ragged(G, ctx, bc, causal, step=False):
    import cudnn_ragged
    try:
        sdpa, provider = cudnn_ragged.prepared(bc.case, causal)
    except cudnn_ragged.Unsupported as e:
        raise G.Unavailable(str(e)) from None
    dout = bc.dout

    if step:
        def run():
            sdpa.forward()
            return sdpa.backward(dout)
    else:
        def run():
            return sdpa.backward(dout)

    return Prepared(run, provider=provider, outputs=(sdpa.dq, sdpa.dk, sdpa.dv_), keep=sdpa)


def fa2_keywords(values, window):
    """FA2's keyword arguments for a call whose values are `values`: the scale, and the window
    (left, right), added to values, where given."""
    if window is None:
        return FA2_KEYWORDS
    values.update(window_size_left=window[0], window_size_right=window[1])
    return dict(FA2_KEYWORDS, **FA2_WINDOW_KEYWORDS)


def fa2_forward_call(G, ctx, c, causal, window=None):
    """(op, args, kwargs) of aten's varlen FA2 forward on case c, with a window (left, right)
    where given; ValueError where the schema does not take them."""
    fwd_op = ctx.get("fa2_fwd")
    if fwd_op is None or ctx.get("fa2_bwd") is None:
        raise G.Unavailable(ctx.get("fa2_error") or "aten._flash_attention_* is missing")
    forward = {"query": c.q, "key": c.k, "value": c.v, "cum_seq_q": c.cu_q, "cum_seq_k": c.cu_k,
               "max_q": c.max_q, "max_k": c.max_k, "dropout_p": 0.0, "is_causal": bool(causal),
               "return_debug_mask": False, "scale": c.scale}
    keywords = fa2_keywords(forward, window)
    try:
        fargs, fkwargs = schema_call(ctx["fa2_fwd_arguments"], forward, keywords=keywords)
    except ValueError as e:
        raise ValueError(f"aten._flash_attention_forward schema mismatch: {e}") from None
    return fwd_op, fargs, fkwargs


def prepare_fa2(G, ctx, bc, causal, step=False, window=None):
    """aten's varlen FA2 backward after its forward (step: both timed), with a window (left,
    right) where given."""
    c = bc.case
    fwd_op, fargs, fkwargs = fa2_forward_call(G, ctx, c, causal, window)
    bwd_op = ctx["fa2_bwd"]
    q, k, v, cu_q, cu_k, mq, mk = c.q, c.k, c.v, c.cu_q, c.cu_k, c.max_q, c.max_k
    res = fwd_op(*fargs, **fkwargs)
    if not isinstance(res, (tuple, list)) or len(res) < 4:
        raise ValueError(f"aten._flash_attention_forward returned {type(res).__name__} of "
                         f"{len(res) if isinstance(res, (tuple, list)) else 1} values, expected "
                         "(output, logsumexp, philox seed, philox offset, ...)")
    # As torch's own autograd formula passes them: the forward's outputs 2 and 3 are the
    # backward's philox_seed / rng_state and philox_offset / unused.
    values = {"grad_out": bc.dout, "query": q, "key": k, "value": v, "out": Slot("out"),
              "logsumexp": Slot("lse"), "cum_seq_q": cu_q, "cum_seq_k": cu_k, "max_q": mq,
              "max_k": mk, "dropout_p": 0.0, "is_causal": bool(causal),
              "philox_seed": Slot("seed"), "philox_offset": Slot("offset"), "scale": c.scale}
    keywords = fa2_keywords(values, window)
    try:
        fill = late_call(*schema_call(ctx["fa2_bwd_arguments"], values, FA2_ALIASES, keywords))
    except ValueError as e:
        raise ValueError(f"aten._flash_attention_backward schema mismatch: {e}") from None

    def saved(res):  # what the backward takes of the forward's outputs
        return {"out": res[0], "lse": res[1], "seed": res[2], "offset": res[3]}

    if step:
        res = None

        def run():
            args, kwargs = fill(saved(fwd_op(*fargs, **fkwargs)))
            return bwd_op(*args, **kwargs)
    else:
        args, kwargs = fill(saved(res))

        def run():
            return bwd_op(*args, **kwargs)

    ops = "_flash_attention_forward + _backward" if step else "_flash_attention_backward"
    return Prepared(run, provider=f"torch.ops.aten.{ops}", keep=res)


def prepare_fa3(G, ctx, bc, causal, step=False):
    import torch
    fwd_op, bwd_op = ctx.get("fa3_fwd"), ctx.get("fa3_bwd")
    if fwd_op is None or bwd_op is None:
        raise G.Unavailable(ctx.get("fa3_error") or "torch.ops.flash_attn_3 is missing")
    c = bc.case
    common = {"q": c.q, "k": c.k, "v": c.v, "cu_seqlens_q": c.cu_q, "cu_seqlens_k": c.cu_k,
              "max_seqlen_q": c.max_q, "max_seqlen_k": c.max_k, "softmax_scale": c.scale,
              "is_causal": bool(causal)}
    try:
        fargs, fkwargs = co.fa3_call(ctx["fa3_fwd_arguments"], common)
    except ValueError as e:
        raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")
    res = fwd_op(*fargs, **fkwargs)
    # FA3's backward writes into the gradients it is given (it returns its scratch buffers).
    dq, dk, dv = torch.empty_like(c.q), torch.empty_like(c.k), torch.empty_like(c.v)
    values = dict(common, dout=bc.dout, out=Slot("out"), softmax_lse=Slot("lse"), dq=dq, dk=dk,
                  dv=dv)
    try:
        fill = late_call(*schema_call(ctx["fa3_bwd_arguments"], values,
                                      keywords=FA3_BWD_KEYWORDS))
    except ValueError as e:
        raise G.Unavailable(f"torch.ops.flash_attn_3.bwd: {e}")

    if step:
        res = None

        def run():
            out = fwd_op(*fargs, **fkwargs)
            args, kwargs = fill({"out": out[0], "lse": out[1]})
            bwd_op(*args, **kwargs)
            return dq, dk, dv
    else:
        args, kwargs = fill({"out": res[0], "lse": res[1]})

        def run():
            bwd_op(*args, **kwargs)
            return dq, dk, dv

    def explain(e):
        text = G.short(e)
        low = text.lower()
        # A forward-only build (FLASHATTENTION_DISABLE_BACKWARD) has the op but refuses the call.
        if "backward" in low and ("not support" in low or "disabled" in low):
            return "unavailable", text
        return "error", text

    provider = ctx.get("fa3_provider", "")
    if step:
        provider = provider.replace("flash_attn_3.bwd", "flash_attn_3.fwd + bwd")
    return Prepared(run, provider=provider, explain=explain, outputs=(dq, dk, dv), keep=res)


def _autograd_peer(step, attend, inputs, dout, unpack, context=None, **about):
    """A peer that torch autograd differentiates: attend(q, k, v) on leaf copies of `inputs`
    (which require grad), then torch.autograd.grad of its output with `dout`, laid out as the
    output is. backward: one forward here, its graph kept (retain_graph) for every timed
    backward; step: every call runs the forward as well. All of it runs on a stream of its own:
    autograd runs the backward on its forward's stream, so the backward alone is captured in a
    CUDA graph there (call_overhead.capture)."""
    import torch
    context = context or contextlib.nullcontext
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    leaves = tuple(x.detach().requires_grad_(True) for x in inputs)
    with torch.cuda.stream(stream), context():
        first = attend(*leaves)
        grad_out = torch.empty_like(first).copy_(dout)  # the output's strides
    saved = None if step else first
    first = None
    if step:
        def run():
            return torch.autograd.grad(attend(*leaves), leaves, grad_outputs=grad_out)
    else:
        def run():
            return torch.autograd.grad(saved, leaves, grad_outputs=grad_out, retain_graph=True)

    return Prepared(run, unpack=unpack, poison_like=leaves, stream=stream, context=context,
                    keep=(saved, grad_out, leaves), **about)


def prepare_fa4(G, ctx, bc, causal, step=False):
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
    except Exception as e:
        raise G.Unavailable(f"flash_attn.cute: {G.short(e, 120)}")
    c = bc.case

    def attend(q, k, v):
        o = fa4_varlen(q, k, v, cu_seqlens_q=c.cu_q, cu_seqlens_k=c.cu_k, max_seqlen_q=c.max_q,
                       max_seqlen_k=c.max_k, softmax_scale=c.scale, causal=bool(causal))
        return o[0] if isinstance(o, (tuple, list)) else o

    versions = (G._dist_version("flash-attn-4"), G._dist_version("nvidia-cutlass-dsl"))
    return _autograd_peer(
        step, attend, (c.q, c.k, c.v), bc.dout, lambda grads: tuple(grads),
        provider="flash_attn.cute.flash_attn_varlen_func (flash-attn-4 %s, nvidia-cutlass-dsl %s), "
                 "autograd" % versions)


def prepare_flex(G, ctx, bc, causal, step=False):
    import torch
    # The backward-only timing runs one compiled backward again and again (retain_graph), which
    # torch refuses for a backward compiled with donated buffers; this must hold before the first
    # compile.
    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if functorch_config is not None and hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    flex = G.flex_functions(ctx)[0]
    c = bc.case
    block_mask, how, seconds = bc.flex_mask(G, ctx, causal)
    kwargs = G.flex_kwargs(c, block_mask)

    def attend(q, k, v):
        return flex(q, k, v, **kwargs)

    def unpack(grads):
        return tuple(G.flex_packed(g) for g in grads)

    gqa = ", enable_gqa=True" if kwargs.get("enable_gqa") else ""
    return _autograd_peer(
        step, attend, (G.flex_layout(c.q), G.flex_layout(c.k), G.flex_layout(c.v)),
        G.flex_layout(bc.dout), unpack,
        provider=f"torch.compile(flex_attention){gqa}, torch {torch.__version__}, autograd",
        note=f"document mask over the packed sequence: {how}, {seconds:.1f} s, once per workload "
             "and mask (not timed); [1, H, tokens, D] layout made outside the timed call")


def prepare_cudnn_padded(G, ctx, bc, causal, step=False):
    import warnings
    import torch
    import torch.nn.functional as F
    c = bc.case
    context = G.sdpa_pinned("CUDNN_ATTENTION")
    skip = skip_reason("cudnn_padded", c.cross, causal)
    if skip:
        raise G.Skipped(skip)
    kwargs = {"is_causal": bool(causal), "scale": c.scale}
    if c.H != c.Hkv:
        kwargs["enable_gqa"] = True  # cuDNN takes K/V with their own head count, no copies

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def unpack(grads):
        dq, dk, dv = grads
        return c.unpad(dq, "q"), c.unpad(dk, "k"), c.unpad(dv, "k")

    sequences = padded_check_sequences(c.sample, c.lk, causal)
    partly = ("" if len(sequences) == len(c.sample)
              else partly_checked_reason(len(sequences), len(c.sample)))
    gqa = ", enable_gqa=True" if c.H != c.Hkv else ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return _autograd_peer(
                step, attend, c.padded(), c.pad(bc.dout, "q"), unpack, context,
                check_sequences=sequences, partly_checked=partly,
                provider=f"F.scaled_dot_product_attention{gqa} under "
                         f"sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch {torch.__version__}, "
                         f"cuDNN {torch.backends.cudnn.version()}, autograd",
                note="[B, H, Lmax, D] inputs padded with zeros (padding and unpadding not "
                     "timed); computes on the padding")
        except RuntimeError as e:
            low = str(e).lower()
            if "no available kernel" not in low and "no viable backend" not in low:
                raise
            # SDPA says why cuDNN refused in warnings.
            why = "; ".join(dict.fromkeys(str(w.message).replace("\n", " ") for w in caught))
            raise G.Unavailable(f"SDPA has no cuDNN kernel for this call: {G.short(e, 100)}"
                                + (f" ({why[:400]})" if why else "")) from None


PREPARE = {"jfa": prepare_jfa, "jfa_det": prepare_jfa_det, "jfa_autograd": prepare_jfa_autograd,
           "fa3": prepare_fa3, "cudnn_ragged": prepare_cudnn_ragged,
           "fa4": prepare_fa4, "fa2_varlen": prepare_fa2, "flex": prepare_flex,
           "cudnn_padded": prepare_cudnn_padded}


def _op(namespace, name):
    import torch
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None


def _load_op_pair(ctx, method, namespace, names, missing, no_schema):
    """A method's forward and backward ops, torch.ops.<namespace>.<names>, into ctx as
    <method>_fwd / _bwd with their schemas' arguments (<method>_fwd_arguments / ...) and the
    schemas' text in ctx["schemas"]; else <method>_error, the `missing` or `no_schema` message.
    True when both ops are there."""
    ops = [_op(namespace, name) for name in names]
    if None in ops:
        ctx[f"{method}_error"] = missing
        return False
    try:
        schemas = [op.default._schema for op in ops]
    except Exception as e:
        ctx[f"{method}_error"] = f"{no_schema}: {type(e).__name__}: {e}"
        return False
    for direction, name, op, schema in zip(("fwd", "bwd"), names, ops, schemas):
        ctx["schemas"][f"{namespace}.{name}"] = str(schema)
        ctx[f"{method}_{direction}"] = op
        ctx[f"{method}_{direction}_arguments"] = co.schema_arguments(schema)
    return True


def load_fa2(ctx):
    """aten's varlen FlashAttention-2 forward and backward, and their schemas."""
    _load_op_pair(ctx, "fa2", "aten", ("_flash_attention_forward", "_flash_attention_backward"),
                  "torch.ops.aten._flash_attention_forward / _backward is missing",
                  "aten._flash_attention_* has no schema")


def load_fa3(ctx, lib_path):
    """FA3's fwd and bwd ops: from lib_path, else those already registered or registered by
    importing flash_attn_interface; their schemas."""
    if lib_path:
        if not co.load_fa3_library(ctx, lib_path):
            return
    elif _op("flash_attn_3", "bwd") is None:
        try:
            importlib.import_module("flash_attn_interface")  # an installed FA3 registers its ops
        except Exception:
            pass
    if _load_op_pair(ctx, "fa3", "flash_attn_3", ("fwd", "bwd"),
                     "torch.ops.flash_attn_3.fwd / .bwd is missing (pass --fa3-lib or set "
                     "FA3_LIB)", "torch.ops.flash_attn_3 has no schema"):
        ctx["fa3_provider"] = co.fa3_provider("bwd", lib_path)


# ---- one measurement ---------------------------------------------------------------------------

def _poison(bc, prep, step):
    """NaN where the gradients will land: the preallocated ones, and blocks of the gradients'
    sizes freed just before the call (the caching allocator likely hands them out again), so rows
    a kernel never writes fail the check. A step's forward output takes one block of Q's size
    first: one more of those."""
    import torch
    for t in prep.outputs:
        t.fill_(float("nan"))
    like = list(prep.poison_like or (bc.case.q, bc.case.k, bc.case.v))
    if step:
        like.insert(0, like[0])
    blocks = [torch.full_like(x, float("nan")) for x in like]
    del blocks


def _record(G, name, bc, causal, tolerance, pass_name="backward"):
    c, w = bc.case, bc.case.w
    return {"method": name, "label": LABELS.get(name, name), "workload": w.id,
            "dtype": c.dtype_name, "causal": bool(causal), "pass": pass_name, "heads": c.H,
            "heads_kv": c.Hkv, "head_dim": c.D, "batch": c.B, "total_q": c.total_q,
            "total_k": c.total_k, "status": None, "reason": "", "note": "", "provider": "",
            "rel_error": None, "rel_errors": {}, "tolerance": tolerance,
            "checked_sequences": len(c.sample), "fwd_gflop": w.flops(causal) / 1e9,
            "bwd_gflop": backward_flops(c.lq, c.lk, c.H, c.D, causal) / 1e9,
            "useful_gflop": pass_flops(c.lq, c.lk, c.H, c.D, causal, pass_name) / 1e9,
            "eager_ms": None, "graph_ms": None, "graph_reason": ""}


def _on_stream(stream):
    import torch
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def measure(G, ctx, name, bc, causal, opts, pass_name="backward"):
    """A record of one method on one case, mask and pass: checked, then timed eager and
    replayed."""
    import warnings
    import torch
    tolerance = TOLERANCE[bc.case.dtype_name] * opts["tolerance_scale"]
    rec = _record(G, name, bc, causal, tolerance, pass_name)
    step = pass_name == "step"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prep = None
        try:
            prep = PREPARE[name](G, ctx, bc, causal, step)
        except G.Unavailable as e:
            rec.update(status="unavailable", reason=str(e))
        except G.Skipped as e:
            rec.update(status="skipped", reason=str(e))
        except torch.cuda.OutOfMemoryError as e:
            rec.update(status="error", reason="out of memory while preparing: " + G.short(e, 150))
        except Exception as e:
            rec.update(status="error", reason="prepare: " + G.short(e))
        if prep is not None:
            rec["provider"], rec["note"] = prep.provider, prep.note
            try:
                with _on_stream(prep.stream), prep.context():
                    _measure(G, bc, causal, prep, rec, opts, deterministic=(name == "jfa_det"),
                             step=step)
            except torch.cuda.OutOfMemoryError as e:
                rec.update(status="error", reason="out of memory: " + G.short(e, 150))
            except Exception as e:
                rec.update(status="error", reason=G.short(e))
            co.synchronize_quietly()  # before the method's stream and tensors go
        prep = None
        torch.cuda.empty_cache()
    return add_rates(rec)


def first_gradients(G, prep, rec):
    """The method's gradients from its first, untimed run; None, with the record's status and
    reason set from the failure, where it fails."""
    import torch
    try:
        grads = prep.unpack(prep.run())
        torch.cuda.synchronize()
        return grads
    except Exception as e:
        co.synchronize_quietly()
        status, reason = prep.explain(e) if prep.explain else ("error", G.short(e))
        rec.update(status=status, reason=reason)
        return None


def _measure(G, bc, causal, prep, rec, opts, deterministic, step=False):
    import torch
    _poison(bc, prep, step)
    grads = first_gradients(G, prep, rec)
    if grads is None:
        return
    sequences = prep.check_sequences
    if sequences is not None:
        rec["checked_sequences"] = len(sequences)
    status, errors, worst, reason = check(bc, causal, grads, rec["tolerance"], sequences)
    if status == "ok" and prep.partly_checked:
        status, reason = "unchecked", prep.partly_checked
    rec.update(status=status, rel_errors=errors, rel_error=worst, reason=reason)
    if status == "ok" and deterministic:
        first = [g.clone() for g in grads]
        again = prep.unpack(prep.run())
        same = all(torch.equal(a, b) for a, b in zip(first, again))
        rec["repeat_identical"] = same
        if not same:
            rec.update(status="wrong", reason="deterministic mode: two runs gave different "
                                              "gradients")
        del first, again
    del grads
    if rec["status"] not in TIMED:
        return
    rec.update(co.eager_time(prep.run, opts["runs"], opts["warmup"]))

    def check_replay(out):
        g_status, _, rec["graph_rel_error"], g_reason = check(
            bc, causal, prep.unpack(out), rec["tolerance"], sequences)
        return "" if g_status == "ok" else f"the replay's gradients are wrong: {g_reason}"

    co.time_replays(G, prep.run, rec, opts, check_replay, nan_outputs=True, stream=prep.stream)


def progress_line(rec, tag):
    text = (f"[{rec['workload']} {rec['dtype']} {mask_name(rec['causal'])} {pass_of(rec)}{tag}] "
            f"{rec['method']:<12} {rec['status']:<11}")
    for mode in ("eager", "graph"):
        t = rec.get(f"{mode}_ms")
        if t is not None:
            tf = rec.get(f"{mode}_tflops")
            text += f" {mode} {t:.4f} ms" + (f" ({tf:.1f} TF/s)" if tf else "")
    errs = rec.get("rel_errors") or {}
    if errs:
        text += " err " + "/".join(f"{errs[n]:.1e}" for n in GRADIENTS if n in errs)
    why = "; ".join(x for x in (rec.get("reason"), rec.get("graph_reason")) if x)
    return text + (f" {why[:200]}" if why else "")


# ---- driver ------------------------------------------------------------------------------------

def merge_runs(paths, json_path, chart_path):
    """--merge: one document from earlier runs' documents, their results in the order given (the
    first run's environment; every run's settings and start time kept)."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    records = [r for d in docs for r in d.get("results", [])]
    if not records:
        print("--merge: the files hold no results", file=sys.stderr)
        return 1
    # What one run says of itself (its start, length, settings, chart) goes under merged_from.
    doc = {k: v for k, v in docs[0].items()
           if k not in ("started_utc", "elapsed_s", "settings", "chart", "gpu_clocks")}
    doc["merged_from"] = [{"file": os.path.basename(p), "started_utc": d.get("started_utc"),
                           "elapsed_s": d.get("elapsed_s"), "settings": d.get("settings"),
                           "gpu_clocks": d.get("gpu_clocks")}
                          for p, d in zip(paths, docs)]
    doc["workloads"] = {k: v for d in docs for k, v in d.get("workloads", {}).items()}
    doc["workload_errors"] = {k: v for d in docs for k, v in d.get("workload_errors", {}).items()}
    doc["results"] = add_ratios(records)
    doc["summary"] = summarize(records)
    order = list(dict.fromkeys(r["workload"] for r in records))
    doc["table"] = format_tables(records, order)
    if chart_path:
        doc["chart"] = save_chart(records, chart_path, order)
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        write_json(json_path, doc)
    print(doc["table"])
    if chart_path:
        print(doc["chart"])
    return 0


def clock_lines(summary):
    """A line per GPU from gpu_clocks.summarize()'s summary (none without one)."""
    lines = []
    for index, g in ((summary or {}).get("gpus") or {}).items():
        if not g.get("busy_samples"):
            continue
        clock, power = g["sm_clock_mhz"], g["power_w"]
        capped = g.get("power_capped_share")
        lines.append(f"GPU {index}: SM clock {clock['median']:.0f} MHz median, {clock['p10']:.0f} "
                     f"10th percentile, {clock['min']:.0f} lowest; {power['median']:.0f} W median "
                     f"of {g['power_limit_w'] or 0:.0f} W"
                     + (f"; the power limit held the clock in {100 * capped:.0f}% of "
                        f"{g['busy_samples']} busy samples" if capped is not None else ""))
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        return merge_runs(args.merge.split(","), args.json, args.chart)
    if args.readme_tables:
        with open(args.readme_tables) as f:
            print(readme_tables(json.load(f).get("results", [])))
        return 0
    t_start = time.perf_counter()
    torch, G = co.import_gpu_modules("backward_peers.py", args.lib)
    if torch is None:
        return 2

    ctx = {"schemas": {}}
    co.load_jfa(ctx, args.lib)
    load_fa3(ctx, args.fa3_lib)
    load_fa2(ctx)
    env = co.run_environment(G, ctx, args.lib, args.cli,
                             fa3_version=G._dist_version("flash_attn_3"), schemas=ctx["schemas"])
    cli = env["jfa_cli"]
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda_runtime')}, "
          f"jfa {env.get('jfa_version')} (torch ops: {env.get('jfa_torch_ops_kind')})",
          flush=True)
    for op, schema in ctx["schemas"].items():
        print(f"schema {op}: {schema}", flush=True)
    for what in ("jfa", "fa3", "fa2"):
        if ctx.get(f"{what}_error"):
            print(f"{what}: unavailable: {ctx[f'{what}_error']}", flush=True)

    opts = {"runs": args.runs, "warmup": args.warmup, "tolerance_scale": args.tolerance_scale}
    loaded = load_workloads(args.workload_ids, cli, args.head_dim, args.heads_kv)
    order = [wid for wid, _, _ in loaded]
    records = []
    settings = {k: v for k, v in vars(args).items()
                if k not in ("workload_ids", "dtype_names", "method_names", "masks", "passes",
                             "pass_option")}
    settings.update(workloads=args.workload_ids, dtypes=args.dtype_names,
                    methods=args.method_names, masks=[mask_name(c) for c in args.masks],
                    passes=list(args.passes), heads=W.HEADS,
                    tolerance={d: t * args.tolerance_scale for d, t in TOLERANCE.items()},
                    data_seed=G.DATA_SEED, grad_seed=G.DATA_SEED + GRAD_SEED_OFFSET)
    doc = co.result_document(
        "jfa backward and training step against their peers: eager and CUDA-graph time per "
        "call", env, settings, loaded, records,
        counting="useful TFLOP/s = factor * 4 * head_dim * heads * sum(visible pairs) / time, "
                 "factor 2.5 for the backward and 3.5 for a step (forward 1 + backward 2.5) "
                 "(causal: visible pairs counted exactly, bottom-right aligned; equal "
                 "lengths: half the square); padded peers' padding counts for nothing",
        passes={"backward": "the backward alone, after one untimed forward that saved what it "
                            "needs",
                "step": "forward (saving what the backward needs) + backward from a fixed dO, "
                        "both in every timed call"},
        figures={"eager_ms": "CUDA events around one call of the record's pass, synchronized "
                             "after each; median of the median round by eager time",
                 "graph_ms": "CUDA events around one replay of the captured call; median over "
                             "the rounds"})

    def save():
        if not args.json:
            return
        doc["summary"] = summarize(add_ratios(records))
        doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            write_json(args.json, doc)
        except Exception as e:
            print(f"cannot write {args.json}: {e}", file=sys.stderr)

    for wid, err in doc["workload_errors"].items():
        print(f"{wid}: unavailable: {err}", flush=True)
    # The SM clock and power through the measurements (gpu_clocks.py: the power limit lowers the
    # clock under sustained work, which moves every method's figures together).
    with gpu_clocks.Sampler() as clocks:
        co.warm_up_gpu(G, args.warm_seconds)

        for wid, w, _ in loaded:
            if w is None:
                continue
            for dtype in [d for d in args.dtype_names if d in w.spec.dtypes]:
                t_case = time.perf_counter()
                try:
                    bc = BwdCase(G, w, dtype)
                except Exception as e:
                    print(f"[{wid} {dtype}] building the inputs failed: {G.short(e)}", flush=True)
                    torch.cuda.empty_cache()
                    continue
                for causal in [c for c in args.masks if c in w.spec.causal]:
                    try:
                        t_ref = time.perf_counter()
                        bc.reference(causal)
                        print(f"[{wid} {dtype} {mask_name(causal)}] float64 reference on "
                              f"{len(bc.case.sample)} sequences: "
                              f"{time.perf_counter() - t_ref:.1f} s", flush=True)
                    except Exception as e:
                        reason = f"reference failed: {G.short(e)}"
                        print(f"[{wid} {dtype} {mask_name(causal)}] {reason}", flush=True)
                        for pass_name in args.passes:
                            for m in args.method_names:
                                rec = _record(G, m, bc, causal,
                                              TOLERANCE[dtype] * args.tolerance_scale, pass_name)
                                rec.update(status="error", reason=reason)
                                records.append(add_rates(rec))
                        torch.cuda.empty_cache()
                        continue

                    def report(rec):
                        tag = f" r{rec['round']}" if args.rounds > 1 else ""
                        print(progress_line(rec, tag), flush=True)

                    for pass_name in args.passes:
                        per_method = rounds.measure_rounds(
                            args.method_names, args.rounds,
                            lambda m: measure(G, ctx, m, bc, causal, opts, pass_name), report)
                        records.extend(add_rates(combine_rounds(per_method[m]))
                                       for m in args.method_names)
                bc.release()
                bc = None
                torch.cuda.empty_cache()
                print(f"[{wid} {dtype}] done in {time.perf_counter() - t_case:.1f} s", flush=True)
                save()

    doc["gpu_clocks"] = clocks.summary()
    add_ratios(records)
    doc["table"] = format_tables(records, order)
    if args.chart:
        doc["chart"] = save_chart(records, args.chart, order)
    save()
    print(doc["table"])
    if args.chart:
        print(doc["chart"] if doc["chart"].startswith("chart not written")
              else f"wrote {doc['chart']}")
    for line in clock_lines(doc["gpu_clocks"]):
        print(line)
    elapsed = time.perf_counter() - t_start
    print(f"\n{'wrote ' + args.json + ' ' if args.json else ''}({elapsed:.0f} s)")
    return 0 if any(w is not None for _, w, _ in loaded) else 1


if __name__ == "__main__":
    sys.exit(main())
