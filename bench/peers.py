#!/usr/bin/env python3
"""jfa against its peers on the GPU: every workload of bench/workloads.py, fp16 and bf16, causal and not.

For each workload x dtype the inputs are built once (random normal, fixed seed); for each mask a
float32 reference is computed on a sample of sequences (all of a small batch; else the longest,
the shortest, the first and the last; 64 sequences of a batch of tiny ones), and every method is
checked against it before it is timed (relative error ||out - ref|| / ||ref|| <= 2e-3 fp16,
1e-2 bf16). A method that fails the check is reported as "wrong" and not ranked; a method that
cannot be checked (padded layouts whose padding keys are not masked) is timed and marked "*".
A method that is missing or fails is reported with the reason and the run goes on.

Methods: jfa (libjfa.so through ctypes), plain Triton JFA (bench/triton_jfa.py), an FA3-class peer
(flash_attn_interface, flash-attn-4's SM90 forward or flashinfer's fa3 backend, when importable),
varlen FlashAttention-2 (aten), FlexAttention (document mask, compiled), padded cuDNN,
nested-tensor SDPA, padded FlashAttention-2. Times are medians of CUDA-event times of >= 10 runs
after warm-up, in one process; useful TFLOP/s count real (query, key) pairs only (bench/workloads.py); TB/s
are minimal bytes (Q, K, V read once, O written once) over the time.

With --rounds N every cell is measured N times, the methods in alternating order (bench/rounds.py),
and each method keeps its median round (every round's TFLOP/s in the record's "rounds"); a failed
check in any round is the result.

Writes <out>/<YYYY-MM-DD>-<gpu>.json (updated after every workload) and a .png chart next to it,
and prints a table last.

usage: python3 bench/peers.py --lib build/gpu/src/libjfa.so [--cli build/gpu/tools/jfa]
           [--out bench/results] [--workloads W1,W2,...] [--dtypes fp16,bf16]
           [--methods jfa,fa2_varlen,...] [--masks both|causal|noncausal] [--quick] [--rounds N]
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
from rounds import TIMED, in_turn, median_round  # noqa: E402
from workloads import mask_name  # noqa: E402

# Method order, names and labels (kept here too so the report code needs no torch).
METHOD_ORDER = ["jfa", "triton_jfa", "fa3", "fa2_varlen", "flex", "cudnn_padded", "nested_sdpa",
                "fa2_padded"]
LABELS = {"jfa": "jfa", "triton_jfa": "plain Triton JFA", "fa3": "FA3-class",
          "fa2_varlen": "varlen FA2", "flex": "FlexAttention", "cudnn_padded": "padded cuDNN",
          "nested_sdpa": "nested SDPA", "fa2_padded": "padded FA2"}
SHORT = {"jfa": "jfa", "triton_jfa": "Triton", "fa3": "FA3cls", "fa2_varlen": "FA2var",
         "flex": "Flex", "cudnn_padded": "cuDNNpad", "nested_sdpa": "nested",
         "fa2_padded": "FA2pad"}
RANKED = ("ok", "unchecked")
CELL = {"wrong": "wrong", "unavailable": "n/a", "error": "err", "skipped": "skip"}


# ---- rules of the methods (no torch needed) ----------------------------------------------------

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


def summarize(records):
    """Per (workload, dtype, causal): jfa's TFLOP/s, the best ranked peer and the ratio."""
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


def format_table(records, workload_order=None, memory_bound=()):
    """The compact text table: one block per (dtype, mask), rows = workloads, columns = methods."""
    if not records:
        return "no results"
    methods, wids = table_order(records, METHOD_ORDER, workload_order)
    by = {(r["workload"], r["dtype"], bool(r["causal"]), r["method"]): r for r in records}
    summ = {(s["workload"], s["dtype"], s["causal"]): s for s in summarize(records)}
    blocks = sorted({(r["dtype"], bool(r["causal"])) for r in records},
                    key=lambda k: (["fp16", "bf16"].index(k[0]) if k[0] in ("fp16", "bf16")
                                   else 9, k[1]))
    wcol = max(8, max(len(w) for w in wids) + 5)
    lines = []
    for dtype, causal in blocks:
        lines.append("")
        lines.append(f"{dtype}, {mask_name(causal)}: useful TFLOP/s (median)"
                     + ("; TB/s rows: minimal bytes / time" if memory_bound else ""))
        head = f"{'workload':<{wcol}}" + "".join(f"{SHORT.get(m, m)[:9]:>10}" for m in methods)
        lines.append(head + "   jfa / best peer")
        for wid in wids:
            row_rs = [by.get((wid, dtype, causal, m)) for m in methods]
            if all(r is None for r in row_rs):
                continue
            line = f"{wid:<{wcol}}" + "".join(f"{_fmt_cell(r):>10}" for r in row_rs)
            s = summ.get((wid, dtype, causal))
            if s and s["jfa_over_best"]:
                line += f"   {s['jfa_over_best']:.2f}x ({SHORT.get(s['best_peer'], s['best_peer'])})"
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
        if r["status"] in ("ok",):
            continue
        text = r.get("reason") or r.get("note") or ""
        key = (r["method"], r["status"], text)
        if key in seen:
            continue
        seen.add(key)
        where = f"{r['workload']} {r['dtype']} {mask_name(r['causal'])}"
        notes.append(f"  {LABELS.get(r['method'], r['method'])} [{r['status']}] (first: {where}): "
                     f"{text}")
    lines.append("")
    lines.append("* timed, not checked.  n/a: unavailable.  err: failed.  skip: left out.  "
                 "wrong: failed the check, not ranked.")
    if notes:
        lines.append("notes:")
        lines.extend(notes[:60])
        if len(notes) > 60:
            lines.append(f"  ... {len(notes) - 60} more in the JSON")
    return "\n".join(lines)


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


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="jfa against its peers on the GPU (see the module docstring)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None,
                    help="libjfa.so (default: the newest build/**/src/libjfa.so)")
    ap.add_argument("--cli", default=None,
                    help="the jfa CLI, source of the workload lengths (default: tools/jfa of the "
                         "--lib build tree, else the newest build/**/tools/jfa)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated (default: all = {','.join(W.DEFAULT_IDS)}; --quick: "
                         f"{','.join(W.QUICK_IDS)})")
    ap.add_argument("--dtypes", default=None, help="fp16,bf16 (default both; --quick: fp16)")
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated subset of {','.join(METHOD_ORDER)}")
    ap.add_argument("--masks", default="both", choices=list(W.MASKS))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: fp16 only, W1-W4 at head_dim 128 unless --workloads, "
                         "10 timed runs")
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
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    t_start = time.perf_counter()
    wids = parse_list(args.workloads, W.DEFAULT_IDS, "workload") if args.workloads else (
        list(W.QUICK_IDS) if args.quick else list(W.DEFAULT_IDS))
    dtypes = parse_list(args.dtypes, list(W.DTYPES), "dtype") if args.dtypes else (
        ["fp16"] if args.quick else list(W.DTYPES))
    methods = parse_list(args.methods, METHOD_ORDER, "method") if args.methods else list(METHOD_ORDER)
    masks = W.MASKS[args.masks]

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

    if args.quick:
        timing = G.Timing(min_runs=10, max_runs=10, warmup=2, warmup_ms=5.0, target_ms=0.0)
    else:
        timing = G.Timing(min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0)

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
                     "timing": vars(timing), "tolerance": G.TOLERANCE, "data_seed": G.DATA_SEED,
                     "flex_dynamic": args.flex_dynamic, "rounds": args.rounds,
                     "gpu_warmup_s": args.warmup_s if args.warmup_s is not None else (
                         0.5 if args.quick else 3.0)},
        "counting": "useful FLOPs = 4 * sum(visible pairs) * heads * head_dim (causal, equal "
                    "lengths: half); TB/s = (Q + K + V + O bytes) / time; times are medians of "
                    "per-call CUDA-event times",
        "ceilings": {"matmul_tflops_fp16": W.MATMUL_CEILING_TFLOPS,
                     "copy_tbps": W.COPY_CEILING_TBPS},
        "workloads": {w.id: w.summary() for w in wl_objects},
        "workload_errors": workload_errors,
        "results": records,
        "summary": [],
    }
    for wid, err in workload_errors.items():
        print(f"{wid}: unavailable: {err}", flush=True)

    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, CUDA {env.get('cuda_runtime')}, "
          f"triton {env.get('triton')}, jfa {env.get('jfa_version', 'n/a')}", flush=True)
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
                        records.append({"method": m, "label": LABELS.get(m, m), "workload": wid,
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
                rounds = {m: [] for m in methods}
                for round_index in range(args.rounds):
                    for m in in_turn(methods, round_index):
                        if round_index > 0 and rounds[m][0]["status"] not in TIMED:
                            continue  # unavailable, skipped or failed: once is the result
                        if ref_error:
                            rec = {"method": m, "label": LABELS.get(m, m), "workload": wid,
                                   "dtype": dtype, "causal": causal, "status": "error",
                                   "reason": ref_error}
                        else:
                            rec = G.measure(impls[m], case, causal, timing)
                        rounds[m].append(rec)
                        tf = rec.get("useful_tflops")
                        err_txt = (f" err {rec['rel_error']:.1e}"
                                   if rec.get("rel_error") is not None else "")
                        what = (f"{rec['median_ms']:.3f} ms {tf:7.1f} TF/s" if tf is not None
                                else "")
                        why = ("" if rec["status"] == "ok"
                               else f" {rec.get('reason') or rec.get('note', '')}")
                        tag = f" r{round_index}" if args.rounds > 1 else ""
                        print(f"[{wid} {dtype} {mask_name(causal)}{tag}] {LABELS.get(m, m):<17} "
                              f"{rec['status']:<11} {what}{err_txt}{why[:160]}", flush=True)
                records.extend(median_round(rounds[m]) for m in methods)
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
    try:
        write_json(json_path, doc)
        print(f"\nwrote {json_path}")
    except Exception as e:
        print(f"cannot write {json_path}: {e}", file=sys.stderr)
    print(chart if chart.startswith("chart not written") else f"wrote {chart}")
    print(f"total {doc['elapsed_s']:.0f} s on {env.get('gpu')}")
    print(format_table(records, wids, memory_bound_ids(wl_objects)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
