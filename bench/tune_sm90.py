"""Tuning sweep of the Hopper forward: builds of libjfa that differ in compile-time choices (e.g.
pipeline depth) crossed with the run-time mainloop schedules (JFA_SM90_SCHEDULE), on the benchmark
workloads, in one process on the same inputs. Every variant's output is checked before it is
timed (bench/peers_gpu.py's check and timing). Needs torch and an H100/H200-class GPU.

    python3 bench/tune_sm90.py --lib base=build/a/src/libjfa.so --lib stages3=build/b/src/libjfa.so \\
        --schedules 0,1,2 --workloads W1,W2,W3,W4 --dtypes fp16 --out /tmp/tune

Prints one line per measurement and a table (useful TFLOP/s; W4: TB/s as well) at the end; writes
tune.json into --out.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import workloads as W  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", required=True, metavar="NAME=PATH",
                    help="a libjfa.so build to measure (repeatable only for copies that can share "
                         "a process; builds with a static CUDA runtime each need their own run)")
    ap.add_argument("--schedules", default="0,1,2", help="JFA_SM90_SCHEDULE values")
    ap.add_argument("--env", action="append", default=[], metavar="LABEL:VAR=VAL[+VAR=VAL]",
                    help="run-time settings to measure instead of --schedules (repeatable), "
                         "e.g. sorted:JFA_SM90_LPT=1 unsorted:JFA_SM90_LPT=0")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--masks", default="both", choices=["both", "causal", "noncausal"])
    ap.add_argument("--cli", default=None, help="the jfa CLI (source of the workload lengths)")
    ap.add_argument("--triton", action="store_true", help="also measure the plain Triton JFA")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per measurement")
    ap.add_argument("--out", default=None, help="directory for tune.json")
    args = ap.parse_args(argv)

    import torch
    import peers_gpu as G
    from jfa_ctypes import JfaLib, cli_next_to

    libs = []
    for spec in args.lib:
        name, _, path = spec.partition("=")
        if not path:
            ap.error(f"--lib wants NAME=PATH, got {spec!r}")
        libs.append((name, JfaLib(path)))
    settings = []  # (label, {variable: value})
    for spec in args.env:
        label, _, assigns = spec.partition(":")
        settings.append((label, dict(a.split("=", 1) for a in assigns.split("+") if "=" in a)))
    if not settings:
        settings = [(f"s{s.strip()}", {"JFA_SM90_SCHEDULE": s.strip()})
                    for s in args.schedules.split(",") if s.strip()]
    masks = {"both": (False, True), "causal": (True,), "noncausal": (False,)}[args.masks]
    cli = args.cli or cli_next_to(libs[0][1].path) or W.find_cli(None, REPO)
    timing = G.Timing(min_runs=args.runs, max_runs=args.runs, warmup=3, warmup_ms=25.0,
                      target_ms=0.0)
    G.warm_gpu(2.0)

    variants = [(f"{name}/{label}", lib, env) for name, lib in libs for label, env in settings]
    records = []
    for wid, w, err in W.load(args.workloads.split(","), cli):
        if w is None:
            print(f"{wid}: unavailable: {err}", flush=True)
            continue
        for dtype in args.dtypes.split(","):
            case = G.Case(w, dtype)
            for causal in masks:
                case.reference(causal)
                methods = [(label, G.Jfa({"jfa_lib": lib}), env) for label, lib, env in variants]
                if args.triton:
                    methods.append(("triton_jfa", G.TritonJfa({}), {}))
                for label, method, env in methods:
                    os.environ.update(env)
                    rec = G.measure(method, case, causal, timing)
                    for var in env:
                        os.environ.pop(var, None)
                    rec["variant"] = label
                    records.append(rec)
                    tf = rec.get("useful_tflops")
                    print(f"[{wid} {dtype} {'causal' if causal else 'full'}] {label:<16} "
                          f"{rec['status']:<8} "
                          + (f"{rec['median_ms']:.3f} ms {tf:6.1f} TF/s {rec['eff_tbps']:.2f} TB/s"
                             if tf is not None else rec.get("reason", "")), flush=True)
            case.release()
            torch.cuda.empty_cache()

    labels = [v[0] for v in variants] + (["triton_jfa"] if args.triton else [])
    rows = sorted({(r["workload"], r["dtype"], r["causal"]) for r in records},
                  key=lambda k: (args.workloads.split(",").index(k[0]), k[1], k[2]))
    print("\n| workload | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for wid, dtype, causal in rows:
        cells = []
        for label in labels:
            r = next((r for r in records if (r["workload"], r["dtype"], r["causal"],
                                              r["variant"]) == (wid, dtype, causal, label)), None)
            if r is None or r.get("useful_tflops") is None:
                cells.append("-" if r is None else r["status"])
            else:
                flag = "" if r["status"] == "ok" else f" ({r['status']})"
                cells.append(f"{r['useful_tflops']:.0f}{flag}")
        print(f"| {wid} {dtype} {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tune.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "environment": G.environment(),
                       "records": records}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
