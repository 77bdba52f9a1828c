#!/usr/bin/env python3
"""jfa against its peers on the GPU: every workload of bench/workloads.py, fp16 and bf16, causal and not.

For each workload x dtype the inputs are built once (random normal, fixed seed); for each mask a
float64 reference is computed on a sample of sequences (all of a small batch; else the longest,
the shortest, the first and the last; 64 sequences of a batch of tiny ones), and every method is
checked against it before it is timed (relative error ||out - ref|| / ||ref|| <= 2e-3 fp16,
1e-2 bf16). A method that fails the check is reported as "wrong" and not ranked; a method that
cannot be checked (padded layouts whose padding keys are not masked) is timed and marked "*".
A method that is missing or fails is reported with the reason and the run goes on.

Methods: jfa (libjfa.so through ctypes), plain Triton JFA (bench/triton_jfa.py), FlashAttention-3
(method fa3: its varlen forward, torch.ops.flash_attn_3.fwd from the op library that --fa3-lib or
$FA3_LIB names, called as built from the op's schema; without a library, FA3's own Python wrapper
flash_attn_interface when it imports, else an FA3-class peer: flash-attn-4's SM90 forward or
flashinfer's fa3 backend, labelled "FA3-class"), varlen FlashAttention-2 (aten), FlexAttention
(document mask, compiled), padded cuDNN, nested-tensor SDPA, padded FlashAttention-2. A run
without FlashAttention-3 says so in its output and in the JSON's peers_missing. FlashAttention-3
has kernels at head_dim 64, 96, 128, 192, 256 and 192 with head_dim_v 128: at other sizes (32) its
cells are "unavailable at head_dim 32". The workloads are bench/workloads.py's (W1-d192v128 ..
W4-d192v128: head_dim 192, head_dim_v 128, v and the output of 128 columns); --head-dims picks
W1-W4 (or the --workloads bases) at given sizes.

Three times per method and cell, in one process:
- the kernel time (median_ms, useful_tflops, eff_tbps; the text table and the chart): medians of
  CUDA-event times of >= 10 runs after warm-up, a short spin kernel queued before each call so
  that the host path stays out of the interval;
- eager_ms: CUDA events around one call, synchronized after each (--runs of them): what a user
  timing one call sees;
- graph_ms: the call captured once in a CUDA graph and replayed (--runs replays); the replay's
  output is checked as the first call's was, and a method that cannot be captured gets the reason
  (graph_reason) instead.
Every method runs on one side stream of the process (a capture needs a stream other than the
legacy default one). Useful TFLOP/s count real (query, key) pairs only (bench/workloads.py;
with head_dim_v: 2 * pairs * heads * (head_dim + head_dim_v)); TB/s are minimal bytes (Q, K, V read
once, O written once) over the time.

With --rounds N every cell is measured N times, the methods in alternating order (bench/rounds.py),
and each method keeps its median round by kernel time (every round's TFLOP/s in the record's
"rounds"), with eager_ms and graph_ms the medians of the rounds'; a failed check in any round is
the result.

Writes <out>/<YYYY-MM-DD>-<gpu>.json (updated after every workload) and a .png chart next to it,
and prints a table last, then the markdown tables of --readme-tables.
--readme-tables A.json[,B.json] measures nothing: it prints the README's tables of those results,
one per dtype (rows: methods; columns: workloads; cells: useful TFLOP/s eager non-causal / causal,
the graph replay's in brackets), with a "jfa ÷ FA3" row of the TFLOP/s ratios where FA3 ran.

usage: python3 bench/peers.py --lib build/gpu/src/libjfa.so [--cli build/gpu/tools/jfa]
           [--fa3-lib fa3_varlen.so] [--out bench/results] [--workloads W1,W2,...]
           [--head-dims 64,128,192/128,...] [--dtypes fp16,bf16] [--methods jfa,fa3,...]
           [--masks both|causal|noncausal] [--quick] [--rounds N] [--runs N] [--warmup N]
       python3 bench/peers.py --readme-tables RESULTS.json [--workloads ...] [--dtypes ...]
"""
import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import workloads as W  # noqa: E402
from rounds import TIMED, measure_rounds, median_round  # noqa: E402
from workloads import mask_name  # noqa: E402

# Method order, names and labels (kept here too so the report code needs no torch).
METHOD_ORDER = ["jfa", "triton_jfa", "fa3", "cudnn_ragged", "fa2_varlen", "flex", "cudnn_padded",
                "nested_sdpa", "fa2_padded"]
LABELS = {"jfa": "jfa", "triton_jfa": "plain Triton JFA", "fa3": "FA3-class",
          "cudnn_ragged": "cuDNN ragged", "fa2_varlen": "varlen FA2", "flex": "FlexAttention",
          "cudnn_padded": "padded cuDNN", "nested_sdpa": "nested SDPA", "fa2_padded": "padded FA2"}
SHORT = {"jfa": "jfa", "triton_jfa": "Triton", "fa3": "FA3cls", "cudnn_ragged": "cuDNNrag",
         "fa2_varlen": "FA2var", "flex": "Flex", "cudnn_padded": "cuDNNpad",
         "nested_sdpa": "nested", "fa2_padded": "FA2pad"}
RANKED = ("ok", "unchecked")
CELL = {"wrong": "wrong", "unavailable": "n/a", "error": "err", "skipped": "skip"}

# Method fa3 is FlashAttention-3 itself where its op library (--fa3-lib) or its Python wrapper
# (flash_attn_interface) is there; else an FA3-class fallback, labelled as such.
FA3_LABEL = "FlashAttention-3 (varlen)"
FA3_SHORT = "FA3"
FA3_CLASS_LABEL = LABELS["fa3"]
# (head_dim, head_dim_v) of FlashAttention-3's forward kernels.
FA3_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128))
FA3_NOT_AVAILABLE = "FlashAttention-3: not available (pass --fa3-lib or set FA3_LIB)"

# Times of the eager call and of the CUDA-graph replay, next to the kernel time.
MODES = ("eager", "graph")
RUNS, QUICK_RUNS = 30, 10
WARMUP, QUICK_WARMUP = 5, 3


# ---- workloads ---------------------------------------------------------------------------------

# --head-dims: the sizes (head_dim or head_dim/head_dim_v) and the workload id suffix of each.
HEAD_DIM_SUFFIX = {"32": "-d32", "64": "-d64", "96": "-d96", "128": "", "192": "-d192",
                   "256": "-d256", "192/128": "-d192v128"}
HEAD_DIM_BASES = ["W1", "W2", "W3", "W4"]


def head_dim_text(head_dim, head_dim_v=None):
    """"128", or "192/128" where v has a head size of its own."""
    if head_dim_v in (None, 0, head_dim):
        return str(head_dim)
    return f"{head_dim}/{head_dim_v}"


def head_dim_ids(head_dims, bases=None):
    """The workload ids of the bases (default W1-W4) at each of head_dims ("64", "192/128", ...),
    sizes first. Raises ValueError on a size or a workload that does not exist."""
    ids = []
    for hd in head_dims:
        if hd not in HEAD_DIM_SUFFIX:
            raise ValueError(f"unknown head size {hd!r} (known: {', '.join(HEAD_DIM_SUFFIX)})")
        for base in bases or HEAD_DIM_BASES:
            wid = base + HEAD_DIM_SUFFIX[hd]
            if wid not in W.SPEC_BY_ID:
                raise ValueError(f"no workload {wid} ({base} at head size {hd})")
            if wid not in ids:
                ids.append(wid)
    return ids


# ---- rules of the methods (no torch needed) ----------------------------------------------------

def fa3_head_dim_reason(head_dim, head_dim_v=None):
    """Why FlashAttention-3 leaves a head size out ("" where it has a kernel for it)."""
    dv = head_dim_v or head_dim
    if (head_dim, dv) in FA3_HEAD_DIMS:
        return ""
    sizes = ", ".join(str(d) for d, e in FA3_HEAD_DIMS if d == e)
    return (f"unavailable at head_dim {head_dim_text(head_dim, dv)}: FlashAttention-3 has "
            f"forward kernels at head_dim {sizes} and 192 with head_dim_v 128")


def fa3_missing_note(error=None):
    """The line a run without FlashAttention-3 prints and keeps in its JSON's peers_missing."""
    return f"FlashAttention-3: not available: {error}" if error else FA3_NOT_AVAILABLE


def padded_skip_reason(cross, causal):
    """Why a padded SDPA peer leaves a cell out ("" if it does not): with q and k lengths that
    differ, is_causal aligns the mask top-left on the padded square, not bottom-right per
    sequence."""
    if cross and causal:
        return ("q/k lengths differ: SDPA's is_causal is top-left aligned on the padded "
                "[Lmax_q, Lmax_k] square, not the same attention")
    return ""


# ---- report (no torch needed) ------------------------------------------------------------------

def _key(r):
    return (r["workload"], r["dtype"], bool(r["causal"]))


def record_label(r):
    """A record's label: the one it was measured under (method fa3: FlashAttention-3 or an
    FA3-class fallback), else the method's."""
    return r.get("label") or LABELS.get(r["method"], r["method"])


def method_short(records, method):
    """The short column name of a method: fa3 is "FA3" where FlashAttention-3 itself ran."""
    if method == "fa3" and any(r["method"] == "fa3" and r.get("label") == FA3_LABEL
                               for r in records):
        return FA3_SHORT
    return SHORT.get(method, method)


def _timed_value(r, key):
    if r is None or r.get("status") not in RANKED:
        return None
    v = r.get(key)
    return v if v else None


def add_rates(rec):
    """TFLOP/s and TB/s of the record's eager and graph times (None where not timed), from its
    useful GFLOP and minimal bytes."""
    flops = (rec.get("useful_gflop") or 0.0) * 1e9
    nbytes = rec.get("min_bytes") or 0.0
    for mode in MODES:
        t = _timed_value(rec, f"{mode}_ms")
        rec[f"{mode}_tflops"] = flops / (t * 1e-3) / 1e12 if t else None
        rec[f"{mode}_tbps"] = nbytes / (t * 1e-3) / 1e12 if t else None
    return rec


def _slower_median(values):
    """The median; of two middle values the larger (the slower time), as rounds.median_round."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def combine_rounds(records):
    """One record from a method's rounds of one cell: the median round by kernel TFLOP/s
    (rounds.median_round: a failed round is the result), with eager_ms and graph_ms the medians
    of every round's (None, with the reason, where some round has none); every round's times
    under eager_rounds_ms and graph_rounds_ms."""
    kept = median_round(records)
    if kept.get("status") in TIMED and len(records) > 1:
        for mode in MODES:
            values = [r.get(f"{mode}_ms") for r in records]
            kept[f"{mode}_rounds_ms"] = values
            kept[f"{mode}_ms"] = _slower_median(values) if all(values) else None
        if kept.get("graph_ms") is None:
            kept["graph_reason"] = next((r["graph_reason"] for r in records
                                         if not r.get("graph_ms") and r.get("graph_reason")),
                                        kept.get("graph_reason") or "")
        add_rates(kept)
    return kept


def summarize(records):
    """Per (workload, dtype, causal): jfa's TFLOP/s, the best ranked peer and the ratio (kernel
    times); jfa's TFLOP/s over FlashAttention-3's, kernel, eager and graph, where both ran."""
    groups = {}
    for r in records:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for (wid, dtype, causal), rs in groups.items():
        jfa = next((r for r in rs if r["method"] == "jfa" and r["status"] in RANKED), None)
        peers = [r for r in rs if r["method"] != "jfa" and r["status"] in RANKED
                 and r.get("useful_tflops")]
        best = max(peers, key=lambda r: r["useful_tflops"], default=None)
        s = {"workload": wid, "dtype": dtype, "causal": causal,
             "jfa_tflops": jfa["useful_tflops"] if jfa else None,
             "best_peer": best["method"] if best else None,
             "best_peer_tflops": best["useful_tflops"] if best else None, "jfa_over_best": None}
        if jfa and best and best["useful_tflops"]:
            s["jfa_over_best"] = jfa["useful_tflops"] / best["useful_tflops"]
        fa3 = next((r for r in rs if r["method"] == "fa3" and r.get("label") == FA3_LABEL), None)
        for key, field in (("jfa_over_fa3", "useful_tflops"), ("jfa_over_fa3_eager",
                                                                "eager_tflops"),
                           ("jfa_over_fa3_graph", "graph_tflops")):
            a, b = _timed_value(jfa, field), _timed_value(fa3, field)
            s[key] = a / b if a and b else None
        out.append(s)
    return out


def _fmt_cell(r, what="tflops"):
    if r is None:
        return "-"
    st = r.get("status")
    if st in RANKED:
        v = r.get("useful_tflops") if what == "tflops" else r.get("eff_tbps")
        if v is None:
            return "-"
        text = f"{v:.1f}" if what == "tflops" else f"{v:.2f}"
        return text + ("*" if st == "unchecked" else "")
    return CELL.get(st, st or "-")


def table_order(records, method_order, workload_order=None):
    """The methods and the workloads the records hold, in table order: those of method_order and
    workload_order first, in that order, then the others (methods sorted, workloads as met)."""
    methods = [m for m in method_order if any(r["method"] == m for r in records)]
    methods += sorted({r["method"] for r in records} - set(methods))
    wids = list(workload_order or [])
    for r in records:
        if r["workload"] not in wids:
            wids.append(r["workload"])
    return methods, wids


def format_table(records, workload_order=None, memory_bound=(), missing=()):
    """The compact text table: one block per (dtype, mask), rows = workloads, columns = methods
    (kernel times); the reasons behind every cell that is not a number, then `missing` (peers
    that are not there at all)."""
    if not records:
        return "\n".join(["no results"] + list(missing))
    methods, wids = table_order(records, METHOD_ORDER, workload_order)
    by = {(r["workload"], r["dtype"], bool(r["causal"]), r["method"]): r for r in records}
    summ = {(s["workload"], s["dtype"], s["causal"]): s for s in summarize(records)}
    blocks = sorted({(r["dtype"], bool(r["causal"])) for r in records},
                    key=lambda k: (["fp16", "bf16"].index(k[0]) if k[0] in ("fp16", "bf16")
                                   else 9, k[1]))
    wcol = max(8, max(len(w) for w in wids) + 5)
    shorts = {m: method_short(records, m) for m in methods}
    lines = []
    for dtype, causal in blocks:
        lines.append("")
        lines.append(f"{dtype}, {mask_name(causal)}: useful TFLOP/s (median kernel time)"
                     + ("; TB/s rows: minimal bytes / time" if memory_bound else ""))
        head = f"{'workload':<{wcol}}" + "".join(f"{shorts[m][:9]:>10}" for m in methods)
        lines.append(head + "   jfa / best peer")
        for wid in wids:
            row_rs = [by.get((wid, dtype, causal, m)) for m in methods]
            if all(r is None for r in row_rs):
                continue
            line = f"{wid:<{wcol}}" + "".join(f"{_fmt_cell(r):>10}" for r in row_rs)
            s = summ.get((wid, dtype, causal))
            if s and s["jfa_over_best"]:
                best = s["best_peer"]
                line += f"   {s['jfa_over_best']:.2f}x ({shorts.get(best, SHORT.get(best, best))})"
            elif s and s["jfa_tflops"] and not s["best_peer"]:
                line += "   (no ranked peer)"
            lines.append(line)
            if wid in memory_bound:
                lines.append(f"{'  TB/s':<{wcol}}" + "".join(f"{_fmt_cell(r, 'tbps'):>10}"
                                                            for r in row_rs))
    # Footnotes: the reasons behind every non-number, once each.
    notes = []
    seen = set()
    for r in records:
        for kind, text in ((r["status"], r.get("reason") or r.get("note") or ""),
                           ("no graph", r.get("graph_reason") or "")):
            if kind == "ok" or not text:
                continue
            key = (r["method"], kind, text)
            if key in seen:
                continue
            seen.add(key)
            where = f"{r['workload']} {r['dtype']} {mask_name(r['causal'])}"
            notes.append(f"  {record_label(r)} [{kind}] (first: {where}): {text}")
    lines.append("")
    lines.append("* timed, not checked.  n/a: unavailable.  err: failed.  skip: left out.  "
                 "wrong: failed the check, not ranked.")
    if notes:
        lines.append("notes:")
        lines.extend(notes[:60])
        if len(notes) > 60:
            lines.append(f"  ... {len(notes) - 60} more in the JSON")
    if missing:
        lines.append("missing peers:")
        lines.extend(f"  {m}" for m in missing)
    return "\n".join(lines)


# ---- the README's tables (no torch needed) -----------------------------------------------------

def readme_rate(v):
    """A TFLOP/s figure of the README's tables: no decimals from 100 on, one below."""
    return "-" if v is None else f"{v:.{0 if v >= 100 else 1}f}"


def _readme_value(r, mode):
    """One mask's figure of a README cell: TFLOP/s (* where timed, not checked), the status's
    word where not timed, "-" where not run."""
    if r is None:
        return "-"
    st = r.get("status")
    if st not in RANKED:
        return CELL.get(st, st or "-")
    v = r.get(f"{mode}_tflops")
    return "-" if v is None else readme_rate(v) + ("*" if st == "unchecked" else "")


def readme_table_head(title, columns):
    """The first two lines of a README table: the title cell and the columns, then the rule."""
    return [f"| {title} | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]


def readme_cell(nc, c, first=False):
    """"eager non-causal / causal (graph non-causal / causal)" of two records (either may be
    None); "graph " written in the first column only; without any replay, the eager pair alone."""
    if nc is None and c is None:
        return "-"
    text = f"{_readme_value(nc, 'eager')} / {_readme_value(c, 'eager')}"
    graph = (_readme_value(nc, "graph"), _readme_value(c, "graph"))
    timed = any(r is not None and r.get("status") in RANKED and r.get("graph_tflops")
                for r in (nc, c))
    if timed:
        text += f" ({'graph ' if first else ''}{graph[0]} / {graph[1]})"
    return text


def _ratio_text(a, b):
    return "-" if not (a and b) else f"{a / b:.2f}"


def readme_ratio_cell(jfa, fa3, first=False):
    """jfa's TFLOP/s over FA3's as readme_cell lays them out: {causal: record} each."""
    eager = [_ratio_text(_timed_value(jfa.get(c), "eager_tflops"),
                         _timed_value(fa3.get(c), "eager_tflops")) for c in (False, True)]
    graph = [_ratio_text(_timed_value(jfa.get(c), "graph_tflops"),
                         _timed_value(fa3.get(c), "graph_tflops")) for c in (False, True)]
    if eager == ["-", "-"] and graph == ["-", "-"]:
        return "-"
    text = f"{eager[0]} / {eager[1]}"
    if graph != ["-", "-"]:
        text += f" ({'graph ' if first else ''}{graph[0]} / {graph[1]})"
    return text


def readme_tables(records, dtypes=None, workloads=None):
    """The README's forward tables: one per dtype (of `dtypes`, default all the records hold), a
    row per method (method fa3 under the label it ran as: FlashAttention-3 or FA3-class), a column
    per workload (of `workloads`, default all, in the records' order), each cell useful TFLOP/s
    eager non-causal / causal with the graph replay's in brackets; then a "jfa ÷ FA3" row of jfa's
    TFLOP/s over FlashAttention-3's where it ran."""
    recs = [r for r in records if (dtypes is None or r.get("dtype") in dtypes)
            and (workloads is None or r.get("workload") in workloads)]
    if not recs:
        return "no results"
    _, wids = table_order(recs, METHOD_ORDER, workloads)
    wids = [w for w in wids if any(r["workload"] == w for r in recs)]
    order = list(dtypes or []) + [d for d in W.DTYPES if d not in (dtypes or [])]
    present = [d for d in order if any(r["dtype"] == d for r in recs)]
    present += sorted({r["dtype"] for r in recs} - set(present))
    methods, _ = table_order(recs, METHOD_ORDER)
    lines = []
    for dtype in present:
        mine = [r for r in recs if r["dtype"] == dtype]
        by = {(r["method"], record_label(r), r["workload"], bool(r["causal"])): r for r in mine}
        rows = []  # (method, label) in method order, each label as met
        for m in methods:
            for r in mine:
                key = (m, record_label(r))
                if r["method"] == m and key not in rows:
                    rows.append(key)
        if not rows:
            continue
        if lines:
            lines.append("")
        lines += readme_table_head(f"{dtype}, non-causal / causal", wids)
        for m, label in rows:
            cells = [readme_cell(by.get((m, label, w, False)), by.get((m, label, w, True)), i == 0)
                     for i, w in enumerate(wids)]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for m, label in rows:
            if m != "fa3" or label != FA3_LABEL:
                continue
            jfa_label = next((lab for mm, lab in rows if mm == "jfa"), None)
            if jfa_label is None:
                continue
            cells = []
            for i, w in enumerate(wids):
                jfa = {c: by.get(("jfa", jfa_label, w, c)) for c in (False, True)}
                fa3 = {c: by.get((m, label, w, c)) for c in (False, True)}
                cells.append(readme_ratio_cell(jfa, fa3, i == 0))
            if any(cell != "-" for cell in cells):
                lines.append(f"| jfa ÷ {FA3_SHORT} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if lines else "no results"


def read_results(paths):
    """The results of one or more runs' JSON files, in the order given."""
    records = []
    for path in paths:
        with open(path) as f:
            records += json.load(f).get("results", [])
    return records


def dtype_mask_panel(r):
    """The chart panel of a record: (sort key, title), one per dtype and mask."""
    dtype = r["dtype"]
    rank = W.DTYPES.index(dtype) if dtype in W.DTYPES else len(W.DTYPES)
    return (rank, dtype, bool(r["causal"])), f"{dtype}, {mask_name(r['causal'])}"


FORWARD_CHART_TITLE = "jagged attention forward, useful TFLOP/s (medians; numbers on jfa's bars)"


def write_chart(records, path, workload_order=None, ceiling=W.MATMUL_CEILING_TFLOPS,
                value="useful_tflops", method_order=None, labels=None, panel=dtype_mask_panel,
                title=FORWARD_CHART_TITLE, unchecked_label="timed, not checked"):
    """Grouped bars of r[value] (useful TFLOP/s): one panel per panel(r) (default: dtype and
    mask), one group per workload, one bar per method (method_order first, names from labels:
    default this script's); hatched = timed, not checked; wrong/unavailable methods have no bar.
    Returns the path, or a string starting with 'chart not written' on failure."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"chart not written: matplotlib: {type(e).__name__}: {e}"
    method_order = METHOD_ORDER if method_order is None else method_order
    labels = LABELS if labels is None else labels
    ranked = [r for r in records if r["status"] in RANKED and r.get(value)]
    if not ranked:
        return "chart not written: no timed results"
    methods = [m for m in method_order if any(r["method"] == m for r in ranked)]
    methods += sorted({r["method"] for r in ranked} - set(methods))
    wids = [w for w in (workload_order or []) if any(r["workload"] == w for r in ranked)]
    for r in ranked:
        if r["workload"] not in wids:
            wids.append(r["workload"])
    titles = {}
    by = {}
    for r in ranked:
        key, name = panel(r)
        titles[key] = name
        by[(r["workload"], key, r["method"])] = r
    cmap = plt.get_cmap("tab10")
    colors = {m: cmap(i % 10) for i, m in enumerate(method_order)}
    for i, m in enumerate(methods):
        colors.setdefault(m, cmap((len(method_order) + i) % 10))
    panels = sorted(titles)
    width = max(10.0, 0.13 * len(methods) * len(wids) + 2.0)
    height = 3.3 * len(panels) + 1.0
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, height), squeeze=False)
    bar_w = 0.8 / max(1, len(methods))
    try:
        from matplotlib.patches import Patch
        for ax, key in zip(axes[:, 0], panels):
            top = 0.0
            for mi, m in enumerate(methods):
                xs, ys, hatches = [], [], []
                for wi, wid in enumerate(wids):
                    r = by.get((wid, key, m))
                    if r is None:
                        continue
                    xs.append(wi - 0.4 + bar_w * (mi + 0.5))
                    ys.append(r[value])
                    hatches.append("//" if r["status"] == "unchecked" else "")
                if not xs:
                    continue
                bars = ax.bar(xs, ys, bar_w, color=colors[m], edgecolor="black", linewidth=0.4)
                for bar, h in zip(bars, hatches):
                    if h:
                        bar.set_hatch(h)
                if m == "jfa":
                    for x, y in zip(xs, ys):
                        ax.annotate(f"{y:.0f}", (x, y), ha="center", va="bottom", fontsize=7,
                                    xytext=(0, 2), textcoords="offset points")
                top = max(top, max(ys))
            if ceiling:
                ax.axhline(ceiling, color="grey", linestyle="--", linewidth=0.8)
                ax.text(len(wids) - 0.55, ceiling, f"fp16 matmul {ceiling:.0f}", ha="right",
                        va="bottom", fontsize=7, color="grey")
                top = max(top, ceiling)
            ax.set_ylim(0, top * 1.1 if top > 0 else 1)
            ax.set_xticks(range(len(wids)))
            ax.set_xticklabels(wids, fontsize=9)
            ax.set_xlim(-0.5, len(wids) - 0.5)
            ax.set_ylabel("useful TFLOP/s")
            ax.set_title(titles[key], fontsize=10)
            ax.grid(axis="y", linewidth=0.3, alpha=0.6)
        handles = [Patch(facecolor=colors[m], edgecolor="black", linewidth=0.4,
                         label=labels.get(m, m)) for m in methods]
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label=unchecked_label))
        fig.suptitle(title, fontsize=11, y=1 - 0.12 / height)
        fig.legend(handles=handles, loc="upper center", ncol=min(9, len(handles)), fontsize=8,
                   frameon=False, bbox_to_anchor=(0.5, 1 - 0.4 / height))
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
        fig.savefig(path, dpi=110)
    except Exception as e:
        return f"chart not written: {type(e).__name__}: {e}"
    finally:
        plt.close(fig)
    return path


def memory_bound_ids(wl_objects, dtype="fp16"):
    return [w.id for w in wl_objects if W.floors(w, dtype, False)["bound"] == "memory"]


def gpu_slug(name):
    n = (name or "").lower()
    for tag in ("h200", "h100", "h800", "h20", "gh200", "b200", "gb200", "a100"):
        if tag in n.replace(" ", ""):
            return tag
    slug = "".join(c if c.isalnum() else "-" for c in n).strip("-")
    return slug[:24] or "gpu"


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


# ---- driver ------------------------------------------------------------------------------------

def parse_list(text, known=None, what="value"):
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if known is not None:
        bad = [x for x in items if x not in known]
        if bad:
            raise SystemExit(f"unknown {what}: {', '.join(bad)} (known: {', '.join(known)})")
    return items


def torch_with_cuda(tool):
    """torch, when it imports and sees a CUDA GPU; else None, after saying why on stderr."""
    try:
        import torch
    except Exception as e:
        print(f"{tool} needs torch: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{tool} needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return None
    return torch


def parse_args(argv=None):
    """The options, with --quick's defaults filled in and the lists parsed (workload_ids,
    dtype_names, method_names, mask_values)."""
    ap = argparse.ArgumentParser(
        description="jfa against its peers on the GPU (see the module docstring)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None,
                    help="libjfa.so (default: the newest build/**/src/libjfa.so)")
    ap.add_argument("--cli", default=None,
                    help="the jfa CLI, source of the workload lengths (default: tools/jfa of the "
                         "--lib build tree, else the newest build/**/tools/jfa)")
    ap.add_argument("--fa3-lib", default=os.environ.get("FA3_LIB") or None,
                    help="FlashAttention-3's op library (torch.ops.flash_attn_3.fwd), loaded with "
                         "torch.ops.load_library; method fa3 then runs its varlen forward "
                         "(default: $FA3_LIB; without it, flash_attn_interface if it imports, "
                         "else an FA3-class fallback)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated (default: all = {','.join(W.DEFAULT_IDS)}; --quick: "
                         f"{','.join(W.QUICK_IDS)}); with --head-dims, the bases")
    ap.add_argument("--head-dims", default=None,
                    help=f"comma-separated head sizes of {','.join(HEAD_DIM_SUFFIX)}: the "
                         f"workloads {','.join(HEAD_DIM_BASES)} (or the --workloads bases) at "
                         "each, e.g. 64 -> W1-d64, 192/128 -> W1-d192v128")
    ap.add_argument("--dtypes", default=None, help="fp16,bf16 (default both; --quick: fp16)")
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated subset of {','.join(METHOD_ORDER)}")
    ap.add_argument("--masks", default="both", choices=list(W.MASKS))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: fp16 only, W1-W4 at head_dim 128 unless --workloads, "
                         f"10 timed runs for every figure, {QUICK_WARMUP} warm-up calls")
    ap.add_argument("--name", default=None,
                    help="file stem of the JSON and PNG (default <date>-<gpu>[-quick])")
    ap.add_argument("--warmup-s", type=float, default=None,
                    help="seconds of matmuls before the first timing, to bring the clocks up "
                         "(default 3; --quick: 0.5)")
    ap.add_argument("--flex-dynamic", default="auto", choices=["auto", "true", "false"],
                    help="dynamic= of torch.compile(flex_attention) (auto: torch's default)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every cell this many times, the methods in alternating order, "
                         "and keep each method's median round (bench/rounds.py)")
    ap.add_argument("--runs", type=int, default=None,
                    help=f"timed calls for eager_ms and replays for graph_ms per round (default "
                         f"{RUNS}; --quick: {QUICK_RUNS})")
    ap.add_argument("--warmup", type=int, default=None,
                    help=f"untimed calls before eager_ms and before graph_ms (default {WARMUP}; "
                         f"--quick: {QUICK_WARMUP})")
    ap.add_argument("--readme-tables", default=None, metavar="RESULTS.json[,MORE.json]",
                    help="measure nothing: print the README's tables (one per dtype, eager and "
                         "graph TFLOP/s, jfa ÷ FA3) of these results files; --workloads, "
                         "--head-dims and --dtypes, when given, pick the columns and tables")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else RUNS
    if args.warmup is None:
        args.warmup = QUICK_WARMUP if args.quick else WARMUP
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    bases = parse_list(args.workloads, W.DEFAULT_IDS, "workload") if args.workloads else None
    if args.head_dims:
        try:
            args.workload_ids = head_dim_ids(parse_list(args.head_dims), bases)
        except ValueError as e:
            ap.error(f"--head-dims: {e}")
    elif bases:
        args.workload_ids = bases
    elif args.readme_tables:
        args.workload_ids = None  # every workload of the results
    else:
        args.workload_ids = list(W.QUICK_IDS) if args.quick else list(W.DEFAULT_IDS)
    if args.dtypes:
        args.dtype_names = parse_list(args.dtypes, list(W.DTYPES), "dtype")
    else:
        args.dtype_names = (None if args.readme_tables else
                            ["fp16"] if args.quick else list(W.DTYPES))
    args.method_names = (parse_list(args.methods, METHOD_ORDER, "method") if args.methods
                         else list(METHOD_ORDER))
    args.mask_values = W.MASKS[args.masks]
    return args


def peers_missing(methods, fa3_available, fa3_error=None):
    """The peers a run asked for that are not there at all, one line each (the JSON's
    peers_missing): FlashAttention-3 without its library or wrapper (the fa3 cells then hold an
    FA3-class fallback, or say why none runs)."""
    if "fa3" in methods and not fa3_available:
        return [fa3_missing_note(fa3_error)]
    return []


def progress_line(rec, tag=""):
    """One line per measurement: status, kernel time and TFLOP/s, eager and graph times, error,
    and why where something is missing."""
    tf = rec.get("useful_tflops")
    what = f"{rec['median_ms']:.3f} ms {tf:7.1f} TF/s" if tf is not None else ""
    for mode in MODES:
        t, rate = rec.get(f"{mode}_ms"), rec.get(f"{mode}_tflops")
        if t is not None and rate is not None:
            what += f" {mode} {t:.3f} ms ({rate:.1f})"
    err = f" err {rec['rel_error']:.1e}" if rec.get("rel_error") is not None else ""
    why = [] if rec["status"] == "ok" else [rec.get("reason") or rec.get("note") or ""]
    if rec.get("graph_reason"):
        why.append("graph: " + rec["graph_reason"])
    why = "; ".join(x for x in why if x)
    return (f"[{rec['workload']} {rec['dtype']} {mask_name(rec['causal'])}{tag}] "
            f"{record_label(rec):<17} {rec['status']:<11} {what}{err}"
            + (f" {why[:200]}" if why else ""))


def main(argv=None):
    args = parse_args(argv)
    if args.readme_tables:
        records = read_results(parse_list(args.readme_tables))
        print(readme_tables(records, args.dtype_names, args.workload_ids))
        return 0

    t_start = time.perf_counter()
    wids, dtypes, methods, masks = (args.workload_ids, args.dtype_names, args.method_names,
                                    args.mask_values)

    torch = torch_with_cuda("peers.py")
    if torch is None:
        return 2
    try:
        import peers_gpu as G
    except Exception as e:
        print(f"cannot import bench/peers_gpu.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 2

    env = G.environment()
    ctx = {"flex_dynamic": {"auto": None, "true": True, "false": False}[args.flex_dynamic]}
    from libjfa import Library, cli_next_to, find_library
    lib_path = find_library(args.lib, REPO)
    if lib_path is None:
        ctx["jfa_error"] = "libjfa.so not found (pass --lib <build>/src/libjfa.so)"
    else:
        try:
            lib = Library(lib_path)
            if not lib.cuda_available():
                ctx["jfa_error"] = (f"{lib_path}: jfa_cuda_available() = 0 (built without CUDA, "
                                    "or no compute capability 9.0 GPU)")
            else:
                ctx["jfa_lib"] = lib
                env["jfa_version"] = lib.version()
        except Exception as e:
            ctx["jfa_error"] = f"cannot load {lib_path}: {type(e).__name__}: {e}"
    env["jfa_lib"] = os.path.basename(lib_path) if lib_path else lib_path
    cli = args.cli or cli_next_to(lib_path) or W.find_cli(None, REPO)
    env["jfa_cli"] = cli
    if ctx.get("jfa_error"):
        print(f"jfa: unavailable: {ctx['jfa_error']}", flush=True)
    missing = []
    if "fa3" in methods:
        G.load_fa3(ctx, args.fa3_lib)
        env["fa3"] = (ctx.get("fa3_provider") or ctx.get("fa3_error")
                      or ("flash_attn_interface" if ctx.get("fa3_interface") else "not available"))
        if ctx.get("fa3_preloaded"):
            env["fa3_preloaded"] = ctx["fa3_preloaded"]
        missing = peers_missing(methods, G.fa3_available(ctx), ctx.get("fa3_error"))
        for op, schema in ctx.get("schemas", {}).items():
            print(f"schema {op}: {schema}", flush=True)
    for line in missing:
        print(line, flush=True)

    if args.quick:
        timing = G.Timing(min_runs=10, max_runs=10, warmup=2, warmup_ms=5.0, target_ms=0.0)
    else:
        timing = G.Timing(min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0)
    opts = {"runs": args.runs, "warmup": args.warmup}

    date = datetime.date.today().isoformat()
    stem = args.name or f"{date}-{gpu_slug(env.get('gpu'))}{'-quick' if args.quick else ''}"
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, stem + ".json")
    png_path = os.path.join(args.out, stem + ".png")

    impls = {cls.name: cls(ctx) for cls in G.METHODS}
    loaded = W.load(wids, cli)
    wl_objects = [w for _, w, _ in loaded if w is not None]
    records = []
    workload_errors = {wid: err for wid, w, err in loaded if w is None}
    doc = {
        "title": "jfa peers benchmark (forward)",
        "date": date,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "settings": {"workloads": wids, "dtypes": dtypes, "methods": methods,
                     "masks": [mask_name(c) for c in masks], "quick": args.quick,
                     "timing": vars(timing), "runs": args.runs, "warmup": args.warmup,
                     "tolerance": G.TOLERANCE, "data_seed": G.DATA_SEED,
                     "flex_dynamic": args.flex_dynamic, "rounds": args.rounds,
                     "fa3_lib": args.fa3_lib,
                     "gpu_warmup_s": args.warmup_s if args.warmup_s is not None else (
                         0.5 if args.quick else 3.0)},
        "counting": "useful FLOPs = 4 * sum(visible pairs) * heads * head_dim (causal, equal "
                    "lengths: half; head_dim_v of its own: 2 * pairs * heads * (head_dim + "
                    "head_dim_v)); TB/s = (Q + K + V + O bytes) / time",
        "figures": {"median_ms": "median of per-call CUDA-event times, a spin kernel queued "
                                 "before each call (the host path out of the interval)",
                    "eager_ms": "CUDA events around one call, synchronized after each; median",
                    "graph_ms": "CUDA events around one replay of the captured call; median"},
        "ceilings": {"matmul_tflops_fp16": W.MATMUL_CEILING_TFLOPS,
                     "copy_tbps": W.COPY_CEILING_TBPS},
        "peers_missing": missing,
        "workloads": {w.id: w.summary() for w in wl_objects},
        "workload_errors": workload_errors,
        "results": records,
        "summary": [],
    }
    for wid, err in workload_errors.items():
        print(f"{wid}: unavailable: {err}", flush=True)

    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda_runtime')}, "
          f"triton {env.get('triton')}, jfa {env.get('jfa_version', 'n/a')}"
          + (f", fa3: {env['fa3']}" if "fa3" in env else ""), flush=True)
    try:
        G.warm_gpu(doc["settings"]["gpu_warmup_s"])
    except Exception as e:
        print(f"GPU warm-up failed (continuing): {G.short(e)}", flush=True)
    for wid, w, err in loaded:
        if w is None:
            continue
        spec = w.spec
        for dtype in [d for d in dtypes if d in spec.dtypes]:
            t_case = time.perf_counter()
            case = None
            try:
                case = G.Case(w, dtype)
            except Exception as e:
                reason = f"building the inputs failed: {G.short(e)}"
                print(f"[{wid} {dtype}] {reason}", flush=True)
                for causal in masks:
                    for m in methods:
                        records.append({"method": m, "label": impls[m].current_label(),
                                        "workload": wid,
                                        "dtype": dtype, "causal": causal, "status": "error",
                                        "reason": reason})
                torch.cuda.empty_cache()
                continue
            for causal in [c for c in masks if c in spec.causal]:
                try:
                    case.reference(causal)
                    ref_error = None
                except Exception as e:
                    ref_error = f"reference failed: {G.short(e)}"

                def measure(m):
                    if ref_error:
                        return {"method": m, "label": impls[m].current_label(), "workload": wid,
                                "dtype": dtype, "causal": causal, "status": "error",
                                "reason": ref_error}
                    return add_rates(G.measure(impls[m], case, causal, timing, opts))

                def report(rec):
                    tag = f" r{rec['round']}" if args.rounds > 1 else ""
                    print(progress_line(rec, tag), flush=True)

                per_method = measure_rounds(methods, args.rounds, measure, report)
                records.extend(combine_rounds(per_method[m]) for m in methods)
            case.release()
            case = None
            torch.cuda.empty_cache()
            print(f"[{wid} {dtype}] done in {time.perf_counter() - t_case:.1f} s", flush=True)
            doc["summary"] = summarize(records)
            doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            try:
                write_json(json_path, doc)
            except Exception as e:
                print(f"cannot write {json_path}: {e}", file=sys.stderr)

    doc["summary"] = summarize(records)
    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    chart = write_chart(records, png_path, wids)
    doc["chart"] = chart if chart.startswith("chart not written") else os.path.basename(chart)
    doc["readme_tables"] = readme_tables(records, None, wids)
    try:
        write_json(json_path, doc)
        print(f"\nwrote {json_path}")
    except Exception as e:
        print(f"cannot write {json_path}: {e}", file=sys.stderr)
    print(chart if chart.startswith("chart not written") else f"wrote {chart}")
    print(f"total {doc['elapsed_s']:.0f} s on {env.get('gpu')}")
    print(format_table(records, wids, memory_bound_ids(wl_objects), missing))
    print("\nuseful TFLOP/s, eager non-causal / causal (graph replay non-causal / causal):\n")
    print(doc["readme_tables"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
