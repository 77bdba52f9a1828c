#!/usr/bin/env python3
"""W1 forward on the GPU: jfa (libjfa.so through ctypes) against varlen FlashAttention-2 (aten).

W1: B = 32 sequences, lengths uniform integers in [1024, 3072] (fixed seed), 16 heads, head_dim 128.
Checks jfa against fp32 SDPA per sequence, then times both with CUDA events in the same process
(warm-up, median of the timed runs), non-causal and causal, and prints useful TFLOP/s
(4 * sum L^2 * H * D, half of that when causal).

usage: gpu_w1_vs_fa2.py [--lib build/gpu/src/libjfa.so] [--dtype fp16|bf16] [--head-dim 128]
                         [--runs 30] [--json out.json]
"""
import argparse
import ctypes
import glob
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

JFA_DTYPE = {"fp16": 0, "bf16": 1}
TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Layout(ctypes.Structure):
    _fields_ = [("token_stride", ctypes.c_int64), ("head_stride", ctypes.c_int64)]


class Params(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64), ("total_q", ctypes.c_int64), ("total_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int32), ("heads_kv", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("dtype", ctypes.c_int),
        ("q_layout", Layout), ("k_layout", Layout), ("v_layout", Layout), ("out_layout", Layout),
        ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int),
        ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
        ("backend", ctypes.c_int), ("stream", ctypes.c_void_p),
    ]


def find_lib(path):
    if path:
        return path
    hits = sorted(glob.glob("build/**/src/libjfa.so", recursive=True), key=os.path.getmtime)
    if not hits:
        sys.exit("libjfa.so not found; pass --lib")
    return hits[-1]


def w1_lengths(batch=32, lo=1024, hi=3072, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (batch,), generator=g).tolist()


def median_ms(fn, runs, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None)
    ap.add_argument("--dtype", default="fp16", choices=sorted(JFA_DTYPE))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--lengths", default=None,
                    help="comma-separated lengths (e.g. from `jfa bench --workload W1 --print-lengths`); "
                         "default: a W1 batch drawn here")
    args = ap.parse_args()

    lib = ctypes.CDLL(find_lib(args.lib))
    lib.jfa_attention_forward.restype = ctypes.c_int
    lib.jfa_attention_forward.argtypes = [ctypes.POINTER(Params)]
    lib.jfa_attention_params_init.argtypes = [ctypes.POINTER(Params)]
    lib.jfa_last_error_message.restype = ctypes.c_char_p
    lib.jfa_cuda_available.restype = ctypes.c_int

    dev = torch.device("cuda")
    dt = TORCH_DTYPE[args.dtype]
    H, D = args.heads, args.head_dim
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else w1_lengths()
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    max_len = max(lengths)
    torch.manual_seed(0)
    q = torch.randn(total, H, D, device=dev, dtype=dt)
    k = torch.randn(total, H, D, device=dev, dtype=dt)
    v = torch.randn(total, H, D, device=dev, dtype=dt)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, jfa_cuda_available="
          f"{lib.jfa_cuda_available()}")
    print(f"W1: B={len(lengths)} total={total} max={max_len} H={H} D={D} {args.dtype}")

    def jfa_call(causal, o=out, hint=True):
        p = Params()
        lib.jfa_attention_params_init(ctypes.byref(p))
        p.q, p.k, p.v, p.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        p.cu_seqlens_q = p.cu_seqlens_k = cu.data_ptr()
        p.batch, p.total_q, p.total_k = len(lengths), total, total
        p.heads_q = p.heads_kv = H
        p.head_dim = D
        p.dtype = JFA_DTYPE[args.dtype]
        p.softmax_scale = scale
        p.causal = int(causal)
        if hint:
            p.max_seqlen_q = p.max_seqlen_k = max_len
        p.backend = 2
        p.stream = torch.cuda.current_stream().cuda_stream
        s = lib.jfa_attention_forward(ctypes.byref(p))
        if s != 0:
            raise RuntimeError(f"jfa status {s}: {lib.jfa_last_error_message().decode()}")

    def fa2_call(causal):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, causal,
                                                       False, scale=scale)[0]

    results = {}
    rows = []
    for causal in (False, True):
        # Correctness against fp32 SDPA per sequence.
        jfa_call(causal)
        torch.cuda.synchronize()
        num = den = 0.0
        fa2_out = fa2_call(causal)
        num_fa2 = 0.0
        for i, L in enumerate(lengths):
            s0, s1 = int(cu[i]), int(cu[i + 1])
            qs, ks, vs = (t[s0:s1].transpose(0, 1).float() for t in (q, k, v))
            ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale).transpose(0, 1)
            num += (out[s0:s1].float() - ref).pow(2).sum().item()
            num_fa2 += (fa2_out[s0:s1].float() - ref).pow(2).sum().item()
            den += ref.pow(2).sum().item()
        err, err_fa2 = math.sqrt(num / den), math.sqrt(num_fa2 / den)
        flops = 4.0 * sum(L * L for L in lengths) * H * D * (0.5 if causal else 1.0)
        t_jfa = median_ms(lambda: jfa_call(causal), args.runs)
        t_fa2 = median_ms(lambda: fa2_call(causal), args.runs)
        t_jfa2 = median_ms(lambda: jfa_call(causal), args.runs)  # again: spread between repeats
        tf_jfa, tf_fa2 = flops / t_jfa / 1e9, flops / t_fa2 / 1e9
        key = "causal" if causal else "non-causal"
        results[key] = dict(jfa_ms=t_jfa, jfa_ms_repeat=t_jfa2, fa2_ms=t_fa2, jfa_tflops=tf_jfa,
                            fa2_tflops=tf_fa2, jfa_rel_err=err, fa2_rel_err=err_fa2)
        rows.append((key, err, err_fa2, t_jfa, t_jfa2, t_fa2, tf_jfa, tf_fa2))
    print(f"{'mask':<11} {'jfa err':>9} {'fa2 err':>9} {'jfa ms':>8} {'(again)':>8} {'fa2 ms':>8} "
          f"{'jfa TF/s':>9} {'fa2 TF/s':>9} {'ratio':>6}")
    for key, err, err_fa2, tj, tj2, tf, fj, ff in rows:
        print(f"{key:<11} {err:9.2e} {err_fa2:9.2e} {tj:8.3f} {tj2:8.3f} {tf:8.3f} {fj:9.1f} {ff:9.1f} "
              f"{fj / ff:6.2f}")
    ok = all(r[1] < (2e-3 if args.dtype == "fp16" else 1e-2) for r in rows)
    print("correctness:", "PASS" if ok else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(workload="W1", dtype=args.dtype, head_dim=D, heads=H, results=results), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
