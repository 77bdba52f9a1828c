"""Tuning sweep of the Hopper forward: tuning builds of libjfa (-DJFA_SM90_TUNING=ON) that differ in
compile-time choices (e.g. pipeline depth) crossed with their switches (JFA_SM90_SCHEDULE,
JFA_SM90_LPT, ...; re-read before and after each measurement), on the
benchmark workloads, on the same inputs. Every variant's output is checked before it is timed
(bench/peers_gpu.py's check and timing). Needs torch and an H100/H200-class GPU.

    python3 bench/tune_sm90.py --lib base=build/a/src/libjfa.so --schedules 0,1,2 \\
        --workloads W1,W2,W3,W4 --dtypes fp16 --rounds 3 --out /tmp/tune/base
    python3 bench/tune_sm90.py --summarize /tmp/tune/*/tune.json

Clock and power make one timing of the same build vary by up to ~8% on an H200, so --rounds
measures every variant that many times, interleaved (A B A B ...), and reports the median of the
rounds with their spread. Builds with a static CUDA runtime cannot share a process: time each in
its own run (alternating runs, as scripts/tune-sm90.sh does) and merge them with --summarize.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import workloads as W  # noqa: E402
from rounds import in_turn  # noqa: E402


def parse_settings(env_specs, schedules):
    """[(label, {variable: value})] from --env LABEL:VAR=VAL[+VAR=VAL] specs, else one per
    JFA_SM90_SCHEDULE value."""
    settings = []
    for spec in env_specs:
        label, _, assigns = spec.partition(":")
        settings.append((label, dict(a.split("=", 1) for a in assigns.split("+") if "=" in a)))
    if not settings:
        settings = [(f"s{s.strip()}", {"JFA_SM90_SCHEDULE": s.strip()})
                    for s in schedules.split(",") if s.strip()]
    return settings


def summarize(records, workload_order=None):
    """Markdown table: one row per (workload, dtype, mask), one column per variant; each cell the
    median useful TFLOP/s over the rounds, with min-max when there were several, or the status."""
    variants = []
    for r in records:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    order = {w: i for i, w in enumerate(workload_order or [])}
    keys = sorted({(r["workload"], r["dtype"], r["causal"]) for r in records},
                  key=lambda k: (order.get(k[0], len(order)), k[0], k[1], k[2]))
    lines = ["| workload | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
    for wid, dtype, causal in keys:
        cells = []
        for v in variants:
            rs = [r for r in records if (r["workload"], r["dtype"], r["causal"], r["variant"])
                  == (wid, dtype, causal, v)]
            good = [r["useful_tflops"] for r in rs
                    if r.get("status") == "ok" and r.get("useful_tflops") is not None]
            if not rs:
                cells.append("-")
            elif len(good) < len(rs):
                bad = next(r for r in rs if r.get("status") != "ok")
                cells.append(bad.get("status") or "error")
            elif len(good) == 1:
                cells.append(f"{good[0]:.0f}")
            else:
                cells.append(f"{statistics.median(good):.0f} ({min(good):.0f}-{max(good):.0f})")
        lines.append(f"| {wid} {dtype} {'causal' if causal else 'full'} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


def load_records(paths):
    records = []
    for path in paths:
        with open(path) as f:
            records.extend(json.load(f)["records"])
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=PATH",
                    help="a libjfa.so build to measure (repeatable only for copies that can share "
                         "a process; builds with a static CUDA runtime each need their own run)")
    ap.add_argument("--schedules", default="0,1,2", help="JFA_SM90_SCHEDULE values")
    ap.add_argument("--env", action="append", default=[], metavar="LABEL:VAR=VAL[+VAR=VAL]",
                    help="run-time settings to measure instead of --schedules (repeatable), "
                         "e.g. sorted:JFA_SM90_LPT=1 unsorted:JFA_SM90_LPT=0")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--masks", default="both", choices=list(W.MASKS))
    ap.add_argument("--cli", default=None, help="the jfa CLI (source of the workload lengths)")
    ap.add_argument("--triton", action="store_true", help="also measure the plain Triton JFA")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per measurement")
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved repetitions of every measurement (median reported)")
    ap.add_argument("--round-offset", type=int, default=0,
                    help="index of the first round (rounds alternate the order of the variants)")
    ap.add_argument("--out", default=None, help="directory for tune.json")
    ap.add_argument("--summarize", nargs="+", metavar="TUNE_JSON",
                    help="print the merged table of earlier runs and exit (no GPU needed)")
    args = ap.parse_args(argv)

    workload_ids = args.workloads.split(",")
    if args.summarize:
        print(summarize(load_records(args.summarize), workload_ids))
        return 0
    if not args.lib:
        ap.error("--lib is required unless --summarize is given")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    import torch
    import peers_gpu as G
    from libjfa import Library, cli_next_to

    libs = []
    for spec in args.lib:
        name, _, path = spec.partition("=")
        if not path:
            ap.error(f"--lib wants NAME=PATH, got {spec!r}")
        libs.append((name, Library(path)))
    settings = parse_settings(args.env, args.schedules)
    masks = W.MASKS[args.masks]
    cli = args.cli or cli_next_to(libs[0][1].path) or W.find_cli(None, REPO)
    timing = G.Timing(min_runs=args.runs, max_runs=args.runs, warmup=3, warmup_ms=25.0,
                      target_ms=0.0)
    G.warm_gpu(2.0)

    variants = [(f"{name}/{label}", lib, env) for name, lib in libs for label, env in settings]
    records = []
    for wid, w, err in W.load(workload_ids, cli):
        if w is None:
            print(f"{wid}: unavailable: {err}", flush=True)
            continue
        for dtype in args.dtypes.split(","):
            case = G.Case(w, dtype)
            for causal in masks:
                case.reference(causal)
                methods = [(label, G.Jfa({"jfa_lib": lib}), env) for label, lib, env in variants]
                lib_of = {label: lib for label, lib, _ in variants}
                if args.triton:
                    methods.append(("triton_jfa", G.TritonJfa({}), {}))
                for round_index in range(args.rounds):
                    for label, method, env in in_turn(methods, round_index + args.round_offset):
                        os.environ.update(env)
                        variant_lib = lib_of.get(label)  # None for the Triton peer
                        if variant_lib is not None:
                            variant_lib.reload_tuning_switches()
                        rec = G.measure(method, case, causal, timing)
                        for var in env:
                            os.environ.pop(var, None)
                        if variant_lib is not None:
                            variant_lib.reload_tuning_switches()
                        rec["variant"] = label
                        rec["round"] = round_index
                        records.append(rec)
                        tf = rec.get("useful_tflops")
                        print(f"[{wid} {dtype} {'causal' if causal else 'full'} r{round_index}] "
                              f"{label:<16} {rec['status']:<8} "
                              + (f"{rec['median_ms']:.3f} ms {tf:6.1f} TF/s "
                                 f"{rec['eff_tbps']:.2f} TB/s" if tf is not None
                                 else rec.get("reason", "")), flush=True)
            case.release()
            torch.cuda.empty_cache()

    print()
    print(summarize(records, workload_ids))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tune.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "environment": G.environment(),
                       "records": records}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
