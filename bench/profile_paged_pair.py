"""One jfa call and one FlashAttention-3 call over the same paged KV cache, bracketed by
cudaProfilerStart/Stop after a warm-up of each, for Nsight Compute to profile side by side:

  ncu --profile-from-start off --clock-control none --set full -o OUT/pair \\
      python3 bench/profile_paged_pair.py --batch 8 --tokens 256 --cache 4096

The cell: `--batch` sequences, each `--tokens` new query tokens (1: decode; 256: a chunk of
chunked prefill) over `--cache` cached keys (the new tokens included, causal bottom-right), GQA
`--heads`:`--heads-kv`, `--head-dim`, pages of `--page-size` tokens in one random permutation,
bf16. jfa: jfa.paged_attention (its kernel choice as a user gets it; JFA_CUDA_PAGED_PREFILL forces
either path); FlashAttention-3: flash_attn_with_kvcache with num_splits=0 and pack_gqa=True, as
bench/paged_peers.py calls it. Needs torch with CUDA, libjfa's torch ops (python/jfa,
JFA_LIBRARY) and FA3's wrapper (.peers/python, FA3_LIB naming its build with paged KV)."""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiled_range import profile_calls  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256, help="query tokens a sequence")
    ap.add_argument("--cache", type=int, default=4096, help="keys a sequence, the tokens included")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args(argv)
    if not 1 <= args.tokens <= args.cache:
        ap.error("--tokens must be 1 .. --cache")
    if args.heads % args.heads_kv:
        ap.error("--heads-kv must divide --heads")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch
    sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, ".peers", "python")]
    import jfa
    from flash_attn_interface import flash_attn_with_kvcache

    b, t, n, page = args.batch, args.tokens, args.cache, args.page_size
    h, hkv, d = args.heads, args.heads_kv, args.head_dim
    pages_per_seq = (n + page - 1) // page
    gen = torch.Generator(device="cuda").manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    k_cache, v_cache = randn(b * pages_per_seq, page, hkv, d), randn(b * pages_per_seq, page, hkv, d)
    table = torch.randperm(b * pages_per_seq, device="cuda", generator=gen).to(torch.int32)
    table = table.view(b, pages_per_seq).contiguous()
    used = torch.full((b,), n, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device="cuda")
    q = randn(b * t, h, d)

    def jfa_call():
        return jfa.paged_attention(q, k_cache, v_cache, table, used, cu_q, max_seqlen_q=t,
                                   max_seqlen_k=n, causal=True)

    def fa3_call():
        out = flash_attn_with_kvcache(q.view(b, t, h, d), k_cache, v_cache, cache_seqlens=used,
                                      page_table=table, causal=True, num_splits=0, pack_gqa=True)
        return out[0] if isinstance(out, tuple) else out

    calls = {"jfa": jfa_call, "fa3": fa3_call}
    outs = {}
    for name, call in calls.items():  # warm-up: every kernel loaded once; the outputs compared
        for _ in range(2):
            outs[name] = call()
    torch.cuda.synchronize()
    diff = (outs["jfa"].float() - outs["fa3"].reshape(b * t, h, d).float()).abs().max().item()
    profile_calls(calls)
    print(f"profiled: batch {b}, {t} tokens over {n} keys, {h}:{hkv} heads, d {d}, pages of "
          f"{page}, bf16, causal; jfa then FA3; max |jfa - FA3| {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
