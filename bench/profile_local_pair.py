"""One jfa call and one FlashAttention-3 call of the same local-attention cell, bracketed by
cudaProfilerStart/Stop after a warm-up of each, for Nsight Compute to profile side by side:

  ncu --profile-from-start off --clock-control none --set full -o OUT/pair \\
      python3 bench/profile_local_pair.py --head-dim 128 --window 4096 --pass backward

The cell: W1's lengths (32 sequences of 1024-3072 tokens, bench/workloads.py's seed), 16 heads
(`--heads-kv` of them for K and V: GQA), bf16, causal, window (left, 0) (-1: none), softcap; the pass's kernels of each library run once
inside the profiled range (the backward: each library's backward alone, the forward before the
range). Needs torch with CUDA, libjfa's torch ops (python/jfa, JFA_LIBRARY) and FA3's wrapper
(.peers/python, FA3_LIB naming its build with windows and softcap)."""

import argparse
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiled_range import profile_calls  # noqa: E402


def w1_lengths(seed=0):
    """W1: 32 lengths uniform in [1024, 3072]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1024, 3073, (32,), generator=gen).tolist()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=-1, help="left window (-1: none)")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--pass", dest="pass_name", choices=("forward", "backward"),
                    default="backward")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=None, help="K/V heads (default: --heads)")
    args = ap.parse_args(argv)
    hkv = args.heads if args.heads_kv is None else args.heads_kv
    if hkv < 1 or args.heads % hkv:
        ap.error("--heads-kv must divide --heads")
    sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, ".peers", "python")]
    import jfa
    from flash_attn_interface import flash_attn_varlen_func

    lengths = w1_lengths()
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    total, d, h = sum(lengths), args.head_dim, args.heads
    gen = torch.Generator(device="cuda").manual_seed(1)

    def leaf(heads):
        return torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_()

    q, k, v = leaf(h), leaf(hkv), leaf(hkv)
    dout = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    window = (args.window, 0)
    top = max(lengths)

    def jfa_call():
        return jfa.jagged_attention(q, k, v, cu, cu, top, top, causal=True, window_size=window,
                                    softcap=args.softcap)

    def fa3_call():
        out = flash_attn_varlen_func(q, k, v, cu, cu, top, top, causal=True, window_size=window,
                                     softcap=args.softcap)
        return out[0] if isinstance(out, tuple) else out

    calls = {"jfa": jfa_call, "fa3": fa3_call}
    outs = {}
    for name, call in calls.items():  # warm-up: every kernel loaded and tuned once
        for _ in range(2):
            out = call()
            out.backward(dout)
        outs[name] = call() if args.pass_name == "backward" else None
    if args.pass_name == "backward":  # each library's backward alone
        calls = {name: (lambda out=outs[name]: out.backward(dout)) for name in calls}
    profile_calls(calls)
    print(f"profiled {args.pass_name}: W1 lengths, {h}:{hkv} heads, d {d}, bf16, causal, window "
          f"{window}, softcap {args.softcap}; jfa then FA3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
