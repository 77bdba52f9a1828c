"""Forward and backward time of jfa.jagged_attention through torch autograd, on CPU or CUDA tensors:
medians over timed runs after warm-up, useful GFLOP/s on the unpadded pairs (the backward counted as
2.5 times the forward's FLOPs).

    python3 bench/backward_speed.py --lengths 1024,512,2048 --heads 8 --head-dim 64 [--causal]
"""

import argparse
import ctypes
import itertools
import statistics
import sys
import time

import libjfa  # noqa: F401  (puts the checkout's python/ first on the path)
import jfa
import torch
from jfa import _library


def useful_flops(lengths, heads, head_dim, causal):
    """The library's count (jfa_attention_flops): 4 * visible pairs * heads * head_dim, half of
    the square per sequence under the causal mask."""
    cu = (ctypes.c_int32 * (len(lengths) + 1))(0, *itertools.accumulate(lengths))
    flops = ctypes.c_double(0)
    _library.call("jfa_attention_flops", cu, cu, len(lengths), heads, head_dim, 1 if causal else 0,
                  ctypes.byref(flops))
    return flops.value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,512,2048", help="sequence lengths (q = k)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    total = sum(lengths)
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32,
                      device=args.device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((total, args.heads, args.head_dim), generator=g).to(args.device, dtype)
               .requires_grad_(True) for _ in range(3))
    sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
    fwd, bwd = [], []
    for run in range(args.warmup + args.runs):
        sync()
        t0 = time.perf_counter()
        out = jfa.jagged_attention(q, k, v, cu, causal=args.causal)
        sync()
        t1 = time.perf_counter()
        try:
            out.backward(torch.ones_like(out))
        except jfa.JfaUnsupportedError as e:
            print(f"backward: {e}")
            return 1
        sync()
        t2 = time.perf_counter()
        if run >= args.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    flops = useful_flops(lengths, args.heads, args.head_dim, args.causal)
    f, b = statistics.median(fwd), statistics.median(bwd)
    print(f"{args.device} {args.dtype} lengths={lengths} heads={args.heads} d={args.head_dim} "
          f"{'causal' if args.causal else 'non-causal'}: forward {f * 1e3:.1f} ms "
          f"({flops / f / 1e9:.1f} GFLOP/s), backward {b * 1e3:.1f} ms "
          f"({2.5 * flops / b / 1e9:.1f} GFLOP/s), {args.runs} runs, medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
