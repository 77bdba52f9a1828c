"""Plain Triton JFA: a straightforward jagged flash-attention forward in Triton (a benchmark peer).

One program per (q tile, head, sequence): grid = (cdiv(max_seqlen_q, BLOCK_M), heads_q, batch).
Each program reads its sequence's start and end from cu_seqlens, loads its Q tile with a masked
load (no TMA), streams K/V tiles with masked loads, keeps an online softmax in float32 (exp2, the
softmax scale folded into log2(e)), and stores O with a row mask. Causal is bottom-right aligned
(query row i sees keys j <= i + Lk - Lq) and the key loop ends at the diagonal. GQA maps query
head h to key/value head h // (heads_q // heads_kv). A query row with no visible key gets zeros.

Tiles: K/V blocks wholly visible to every row of the Q tile run without masks; only the blocks at
the sequence end or across the diagonal are masked. Configurations come from a small table per
(head_dim, causal); a 10-configuration sweep on the H200 (W1, fp16, head_dim 128) found 128x64 with 8 warps
and 4 stages best non-causal, 64x64 with 4 warps and 3 stages causal; at head_dim 64, 64x64 with 4
warps and 3 stages led both. `python3 bench/triton_jfa.py [--head-dim 64] --sweep` times a few
configurations on a random W1-like batch to revisit the table.

Inputs are packed [total, heads, head_dim] tensors (fp16 or bf16, head_dim 16..256, a power of
two), cu_seqlens int32 [batch + 1] on the device.
"""
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# (head_dim, causal) -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
CONFIGS = {
    (128, False): (128, 64, 8, 4),
    (128, True): (64, 64, 4, 3),
    (64, False): (64, 64, 4, 3),   # sweep on the H200 (random W1-like batch, fp16): 401 TF/s
    (64, True): (64, 64, 4, 3),    # 350 TF/s; 128x64 with 8 warps and 3 stages: 399 / 335
}

SWEEP = [
    (128, 64, 8, 4), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3),
    (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 32, 4, 4),
]


def config_for(head_dim, causal):
    key = (int(head_dim), bool(causal))
    if key in CONFIGS:
        return CONFIGS[key]
    return (64, 64, 4, 3) if head_dim > 128 else (128, 64, 4, 3)


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n, offs_d,
            lo, hi, len_k, diag, qk_scale,
            BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    # Key blocks [lo, hi): the online-softmax update of one Q tile.
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kt + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            in_seq = cols < len_k
            k = tl.load(k_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 there so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _jfa_fwd_kernel(Q, K, V, O, cu_seqlens_q, cu_seqlens_k,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_ot, stride_oh, qk_scale, group,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr):
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q + seq)
    q_end = tl.load(cu_seqlens_q + seq + 1)
    k_start = tl.load(cu_seqlens_k + seq)
    k_end = tl.load(cu_seqlens_k + seq + 1)
    len_q = q_end - q_start
    len_k = k_end - k_start
    row0 = pid_m * BLOCK_M
    if row0 >= len_q:
        return
    head_kv = head // group

    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < len_q

    q_base = Q + q_start.to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    k_base = K + k_start.to(tl.int64) * stride_kt + head_kv.to(tl.int64) * stride_kh
    v_base = V + k_start.to(tl.int64) * stride_vt + head_kv.to(tl.int64) * stride_vh
    q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    diag = len_k - len_q  # causal: row i sees keys j <= i + diag
    if CAUSAL:
        last_row = tl.minimum(row0 + BLOCK_M, len_q) - 1
        hi = tl.maximum(tl.minimum(len_k, last_row + diag + 1), 0)       # keys any row sees
        full = tl.maximum(tl.minimum(len_k, row0 + diag + 1), 0)         # keys every row sees
    else:
        hi = len_k
        full = len_k
    full = (full // BLOCK_N) * BLOCK_N

    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_n, offs_d, 0, full, len_k, diag, qk_scale,
                            BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                            offs_n, offs_d, full, hi, len_k, diag, qk_scale,
                            BLOCK_N, True, CAUSAL)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_base = O + q_start.to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


def _check(q, k, v, cu_seqlens_q, cu_seqlens_k):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"triton_jfa: fp16 or bf16 expected, got {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("triton_jfa: q, k, v must share a dtype")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("triton_jfa: q, k, v must be [total, heads, head_dim]")
    d = q.shape[2]
    if k.shape[2] != d or v.shape[2] != d or d < 16 or d > 256 or (d & (d - 1)) != 0:
        raise ValueError(f"triton_jfa: head_dim must be a power of two in [16, 256], got {d}")
    if q.shape[1] % k.shape[1] != 0 or k.shape[1] != v.shape[1]:
        raise ValueError("triton_jfa: heads_q must be a multiple of heads_kv")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if t.stride(2) != 1:
            raise ValueError(f"triton_jfa: {name} needs a contiguous last dimension")
    for c, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if c.dtype != torch.int32 or c.device != q.device:
            raise ValueError(f"triton_jfa: {name} must be int32 on {q.device}")


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=False,
              softmax_scale=None, out=None, config=None):
    """out[total_q, heads_q, D] = softmax(scale * q k^T [+ causal]) v per sequence and head."""
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    d = q.shape[2]
    heads_q, heads_kv = q.shape[1], k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    if out is None:
        out = torch.empty_like(q)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    block_m, block_n, warps, stages = config or config_for(d, causal)
    if batch <= 0 or max_seqlen_q <= 0 or q.shape[0] == 0:
        return out
    grid = (triton.cdiv(int(max_seqlen_q), block_m), heads_q, batch)
    _jfa_fwd_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), float(softmax_scale) * LOG2E, heads_q // heads_kv,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
        num_warps=warps, num_stages=stages)
    return out


# ---- self-check and configuration sweep (python3 bench/triton_jfa.py [--sweep]) ---------------

def _reference(q, k, v, lq, lk, causal, scale):
    qs, ks, vs = (t.transpose(0, 1).float() for t in (q, k, v))
    rep = qs.shape[0] // ks.shape[0]
    if rep > 1:
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
    s = torch.matmul(qs, ks.transpose(1, 2)) * scale
    if causal:
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (lk - lq), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.matmul(p, vs).transpose(0, 1)


def _main():
    import argparse
    import statistics
    ap = argparse.ArgumentParser(description="check the plain Triton JFA and sweep its configs")
    ap.add_argument("--lengths", default=None, help="q lengths (default: 32 random in [1024, 3072])")
    ap.add_argument("--lengths-k", default=None)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    dev = "cuda"
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    g = torch.Generator().manual_seed(1234)
    lq = ([int(x) for x in args.lengths.split(",")] if args.lengths else
          torch.randint(1024, 3073, (32,), generator=g).tolist())
    lk = [int(x) for x in args.lengths_k.split(",")] if args.lengths_k else list(lq)
    H, D = args.heads, args.head_dim
    Hkv = args.heads_kv or H
    cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    torch.manual_seed(0)
    q = torch.randn(sum(lq), H, D, device=dev, dtype=dt)
    k = torch.randn(sum(lk), Hkv, D, device=dev, dtype=dt)
    v = torch.randn(sum(lk), Hkv, D, device=dev, dtype=dt)
    scale = 1.0 / math.sqrt(D)
    tol = 2e-3 if args.dtype == "fp16" else 1e-2
    for causal in (False, True):
        pairs = sum((a * b / 2 if a == b else sum(max(0, min(b, i + b - a + 1)) for i in range(a)))
                    if causal else a * b for a, b in zip(lq, lk))
        flops = 4.0 * pairs * H * D
        configs = SWEEP if args.sweep else [config_for(D, causal)]
        for cfg in configs:
            try:
                out = attention(q, k, v, cu_q, cu_k, max(lq), causal, scale, config=cfg)
                torch.cuda.synchronize()
            except Exception as e:  # e.g. out of shared memory for a big tile
                print(f"causal={causal} {cfg}: failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            num = den = 0.0
            for i in sorted({0, len(lq) - 1, max(range(len(lq)), key=lambda j: lq[j])}):
                a0, b0 = int(cu_q[i]), int(cu_k[i])
                ref = _reference(q[a0:a0 + lq[i]], k[b0:b0 + lk[i]], v[b0:b0 + lk[i]], lq[i],
                                 lk[i], causal, scale)
                num += (out[a0:a0 + lq[i]].float() - ref).pow(2).sum().item()
                den += ref.pow(2).sum().item()
            err = math.sqrt(num / max(den, 1e-30))
            times = []
            for _ in range(3):
                attention(q, k, v, cu_q, cu_k, max(lq), causal, scale, out=out, config=cfg)
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                attention(q, k, v, cu_q, cu_k, max(lq), causal, scale, out=out, config=cfg)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            print(f"causal={causal!s:5} BLOCK_M,BLOCK_N,warps,stages={cfg}: rel err {err:.2e} "
                  f"({'ok' if err <= tol else 'WRONG'}), {ms:.3f} ms, "
                  f"{flops / ms / 1e9:.1f} useful TFLOP/s")


if __name__ == "__main__":
    _main()
