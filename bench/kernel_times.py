#!/usr/bin/env python3
"""Kernel durations against call durations: for jfa and its peers on the benchmark workloads, the
median per-call CUDA-event time (bench/peers_gpu.py's timing) next to the median duration of every
kernel a call launches (CUPTI, through the torch profiler), in one process on the same inputs.
Tells the kernel's own time apart from what a call adds around it (jfa's work-list kernel, launch
gaps). Needs torch and a GPU; the methods are bench/peers_gpu.py's.

usage: python3 bench/kernel_times.py --lib build/src/libjfa.so --cli build/tools/jfa \\
           --workloads W1-d64,X2 [--methods jfa,fa3] [--dtypes fp16] [--masks noncausal]
"""
import argparse
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import workloads as W  # noqa: E402
from rounds import in_turn  # noqa: E402

SPIN_KERNEL = "spin_kernel"  # torch.cuda._sleep, queued before each call to hide host overhead


def kernel_medians(durations):
    """{kernel name: (launches, median µs)} from (name, µs) pairs, the spin kernel left out."""
    by_name = defaultdict(list)
    for name, us in durations:
        if SPIN_KERNEL not in name:
            by_name[name].append(us)
    return {name: (len(v), statistics.median(v)) for name, v in by_name.items()}


def short_name(name, limit=48):
    """A kernel name without its template arguments and parameter list, at most `limit` chars."""
    for stop in ("<", "("):
        if stop in name:
            name = name[:name.index(stop)]
    return name if len(name) <= limit else name[:limit - 3] + "..."


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libjfa.so")
    ap.add_argument("--cli", required=True, help="the jfa CLI (source of the workload lengths)")
    ap.add_argument("--workloads", default="W1,W1-d64,X2")
    ap.add_argument("--methods", default="jfa,fa3")
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--masks", default="noncausal", choices=list(W.MASKS))
    ap.add_argument("--calls", type=int, default=20, help="profiled calls per method and pass")
    ap.add_argument("--passes", type=int, default=2, help="times every method is measured, in turn")
    args = ap.parse_args(argv)

    import torch
    import peers_gpu as G
    from libjfa import Library

    ctx = {"jfa_lib": Library(args.lib), "flex_dynamic": None}
    methods = {m.name: m for m in G.METHODS}
    chosen = [methods[name] for name in args.methods.split(",")]
    masks = W.MASKS[args.masks]
    G.warm_gpu(3.0)
    timing = G.Timing()
    for wid, w, err in W.load(args.workloads.split(","), args.cli):
        if w is None:
            print(f"{wid}: {err}")
            continue
        for dtype in args.dtypes.split(","):
            case = G.Case(w, dtype)
            for causal in masks:
                for p in range(args.passes):
                    for method in in_turn(chosen, p):
                        prepared = method(ctx).prepare(case, causal)
                        call_ms, _, _ = G.time_ms(prepared.run, timing)
                        activities = [torch.profiler.ProfilerActivity.CUDA]
                        with torch.profiler.profile(activities=activities) as prof:
                            for _ in range(args.calls):
                                torch.cuda._sleep(timing.spin_cycles)
                                prepared.run()
                            torch.cuda.synchronize()
                        durations = [(e.name, e.device_time_total) for e in prof.events()
                                     if e.device_type == torch.autograd.DeviceType.CUDA]
                        kernels = kernel_medians(durations)
                        tflops = w.flops(causal) / (call_ms * 1e-3) / 1e12
                        listed = "; ".join(f"{short_name(k)} x{n} {us / 1000:.4f} ms"
                                           for k, (n, us) in kernels.items())
                        print(f"{wid} {dtype} {W.mask_name(causal)} pass {p} "
                              f"{method.name}: call {call_ms:.4f} ms ({tflops:.1f} TFLOP/s); "
                              f"kernels: {listed}", flush=True)
            case.release()


if __name__ == "__main__":
    main()
