"""A/B timing of the CUDA backward or forward across builds of libjfa: one process per build and
round, the builds in alternating order from round to round, each process timing the same cells
(workload, mask, deterministic mode). What a kernel step is measured with before it lands
(bench/NOTES.md); peers and the useful-FLOP rates are bench/peers.py's and
bench/backward_peers.py's job.

    python3 bench/kernel_ab.py --cli build/release/tools/jfa --rounds 3 [--pass forward] \\
        base=build/release/src/libjfa.so candidate=/tmp/other/src/libjfa.so

A cell's figure is the median over the rounds of each process's median of --runs calls (events
around one call, after --warmup calls; with --kernel-times, the summed durations of the call's
kernels and memsets as the CUDA profiler records them, which leave out the GPU's idle gaps between
and around them). With two builds or more, a second table compares each
build with the first round by round: the median of its time over the first build's in the same
round, their range, and in how many rounds it was the faster. The GPU's speed drifts between
rounds by more than a kernel step may change (a few percent); the ratio of a round's two processes,
run back to back, drifts less, and a step that wins in only some rounds has not shown a gain.
Needs torch with CUDA; the jfa torch ops run over ctypes, so each process loads exactly the
library it is given.
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workloads as W  # noqa: E402  (no torch)
CELLS = ("W1", "W1c", "W2", "W2c", "W3", "W3c", "W4", "W4c", "W1d", "W1cd")


FORWARD_CELLS = ("W1", "W1c", "W2", "W2c", "W3", "W3c", "W4", "W4c")
PASSES = ("backward", "forward")


def parse_cell(cell, pass_name="backward"):
    """'W1cd' -> ('W1', causal, deterministic); the forward has no deterministic mode."""
    base = cell[:2]
    flags = cell[2:]
    allowed = {"c", "d"} if pass_name == "backward" else {"c"}
    if base not in ("W1", "W2", "W3", "W4") or set(flags) - allowed:
        raise ValueError(f"cell {cell!r}: a workload W1..W4, then c (causal)" +
                         (" and/or d (deterministic)" if pass_name == "backward" else
                          " (no d: the forward is always deterministic)"))
    return base, "c" in flags, "d" in flags


def paired_ratios(rounds, cells):
    """{name: {cell: (median, lowest, highest, rounds faster)}} of each build after the first
    against the first, round by round (rounds: {name: [{cell: ms} per round]}, in build order)."""
    names = list(rounds)
    base = rounds[names[0]]
    out = {}
    for name in names[1:]:
        out[name] = {}
        for c in cells:
            ratios = [mine[c] / theirs[c] for mine, theirs in zip(rounds[name], base)]
            out[name][c] = (statistics.median(ratios), min(ratios), max(ratios),
                            sum(r < 1 for r in ratios))
    return out


def paired_table(rounds, cells):
    """The markdown table of paired_ratios (empty with one build)."""
    names = list(rounds)
    if len(names) < 2:
        return ""
    n = len(rounds[names[0]])
    lines = [f"| ÷ {names[0]}, same round | " + " | ".join(cells) + " |",
             "| --- |" + " --- |" * len(cells)]
    for name, per_cell in paired_ratios(rounds, cells).items():
        lines.append(f"| {name} | " + " | ".join(
            f"{m:.3f} ({lo:.3f}–{hi:.3f}, {k}/{n} faster)" for m, lo, hi, k in
            (per_cell[c] for c in cells)) + " |")
    return "\n".join(lines)


def per_call_ms(spans, runs):
    """The GPU time of each of `runs` calls, in ms, from the (start, duration) pairs in µs of the
    kernels and memsets they ran in order: every call runs the same number of them. None if the
    count does not divide into the calls."""
    if runs < 1 or not spans or len(spans) % runs:
        return None
    spans = sorted(spans)
    k = len(spans) // runs
    return [sum(d for _, d in spans[i * k:(i + 1) * k]) / 1000.0 for i in range(runs)]


def time_cells(cli, cells, head_dim, dtype_name, runs, warmup, pass_name="backward",
               heads_kv=None, kernel_times=False):
    """In the child process: {cell: median ms}."""
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import jfa  # noqa: F401  (registers torch.ops.jfa)

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    heads_kv = W.HEADS if heads_kv is None else heads_kv
    result = {}
    for cell in cells:
        base, causal, deterministic = parse_cell(cell, pass_name)
        lengths = W.cli_lengths(cli, base)
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                          device="cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(int(cu[-1]), heads, head_dim, device="cuda", dtype=dtype,
                                     generator=g)
                         for heads in (W.HEADS, heads_kv, heads_kv, W.HEADS))
        longest = max(lengths)
        out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, longest, longest, causal,
                                                      None, True)

        def call():
            if pass_name == "forward":  # with the LSE, as a training forward writes it
                torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, longest, longest, causal, None,
                                                   True)
            else:
                torch.ops.jfa.jagged_attention_bwd(dout, q, k, v, out, lse, cu, cu, longest,
                                                   longest, causal, None, None, deterministic)

        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        if kernel_times:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(runs):
                    call()
                torch.cuda.synchronize()
            spans = [(e.time_range.start, e.device_time) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA]
            times = per_call_ms(spans, runs)
            if times is None:
                raise RuntimeError(f"{cell}: {len(spans)} kernels and memsets do not divide "
                                   f"into {runs} calls")
        else:
            times = []
            for _ in range(runs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        result[cell] = statistics.median(times)
        del q, k, v, dout, out, lse
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="*", metavar="NAME=LIBJFA",
                    help="a name and the libjfa.so of one build")
    ap.add_argument("--cli", required=True, help="the jfa CLI, source of the workload lengths")
    ap.add_argument("--pass", dest="pass_name", default="backward", choices=PASSES,
                    help="the call timed (default backward)")
    ap.add_argument("--cells", default=None,
                    help="comma-separated cells: W1..W4, then c (causal) and/or d "
                         f"(deterministic, backward only); default {','.join(CELLS)}, forward "
                         f"{','.join(FORWARD_CELLS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=128, choices=W.CUDA_HEAD_DIMS,
                    help="q, k and v columns")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--heads-kv", type=int, default=None,
                    help=f"K/V heads (GQA), a divisor of the {W.HEADS} query heads (default "
                         f"{W.HEADS})")
    ap.add_argument("--kernel-times", action="store_true",
                    help="time the call's kernels under the CUDA profiler instead of events "
                         "around the call")
    ap.add_argument("--json", help="write every round's figures to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.heads_kv is not None and (args.heads_kv < 1 or W.HEADS % args.heads_kv != 0):
        ap.error(f"--heads-kv {args.heads_kv}: a divisor of the {W.HEADS} query heads")
    if args.cells is None:
        args.cells = ",".join(CELLS if args.pass_name == "backward" else FORWARD_CELLS)
    cells = args.cells.split(",")
    for cell in cells:
        try:
            parse_cell(cell, args.pass_name)
        except ValueError as e:
            ap.error(str(e))

    if args.child:
        print(json.dumps(time_cells(args.cli, cells, args.head_dim, args.dtype, args.runs,
                                    args.warmup, args.pass_name, args.heads_kv,
                                    args.kernel_times)))
        return 0

    if not args.builds:
        ap.error("give at least one NAME=path/to/libjfa.so")
    builds = []
    for spec in args.builds:
        name, sep, lib = spec.partition("=")
        if not sep or not os.path.isfile(lib):
            ap.error(f"{spec!r}: expected NAME=path/to/libjfa.so of an existing file")
        builds.append((name, os.path.abspath(lib)))

    rounds = {name: [] for name, _ in builds}
    for r in range(args.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, lib in order:
            env = dict(os.environ, JFA_LIBRARY=lib, JFA_TORCH_OPS="ctypes")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--cli", args.cli,
                   "--cells", args.cells, "--runs", str(args.runs), "--warmup",
                   str(args.warmup), "--head-dim", str(args.head_dim), "--dtype", args.dtype,
                   "--pass", args.pass_name]
            if args.heads_kv is not None:
                cmd += ["--heads-kv", str(args.heads_kv)]
            if args.kernel_times:
                cmd.append("--kernel-times")
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stderr)
                print(f"{name}: round {r + 1} failed (exit {p.returncode})", file=sys.stderr)
                return 1
            rounds[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {rounds[name][-1]}", file=sys.stderr, flush=True)

    print("| build | " + " | ".join(cells) + " |")
    print("| --- |" + " --- |" * len(cells))
    for name, _ in builds:
        medians = [statistics.median(x[c] for x in rounds[name]) for c in cells]
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in medians) + " |")
    paired = paired_table(rounds, cells)
    if paired:
        print()
        print(paired)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"unit": "ms", "timing": "kernels" if args.kernel_times else "call",
                       "pass": args.pass_name, "head_dim": args.head_dim,
                       "dtype": args.dtype, "heads_kv": args.heads_kv or W.HEADS, "rounds": rounds},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
