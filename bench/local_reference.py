"""Counting and the float64 reference of bench/local_peers.py: the visible (query, key) pairs
of a kind and its useful FLOPs per pass, the mask, and the attention of a kind in float64 through
torch with its gradients (torch autograd), per sequence and over a case. torch is imported where
used."""

from local_kinds import FLOP_FACTOR


def visible_pairs(lq, lk, causal=False, left=-1, right=-1):
    """Visible (query, key) pairs of one sequence, exactly: query i sees the keys j of [0, lk)
    with d - left <= j <= d + right, d = i + lk - lq (-1: that side unbounded; causal: right 0)."""
    lq, lk = int(lq), int(lk)
    if causal:
        right = 0
    if lq <= 0 or lk <= 0:
        return 0

    def prefix(x):  # sum of min(a, lk) for a = 1..x (0 for x <= 0)
        if x <= 0:
            return 0
        return x * (x + 1) // 2 if x <= lk else lk * (lk + 1) // 2 + (x - lk) * lk

    def upto(c):  # sum over i of clamp(i + c, 0, lk): keys j < i + c of each row
        return prefix(c + lq - 1) - prefix(c - 1)

    shift = lk - lq
    seen = upto(shift + right + 1) if right >= 0 else lq * lk
    return seen - (upto(shift - left) if left >= 0 else 0)


def local_flops(lengths_q, lengths_k, kind, heads, head_dim, head_dim_v=0):
    """Useful FLOPs of a kind: 2 * visible pairs * heads * (head_dim + head_dim_v)."""
    pairs = sum(visible_pairs(a, b, kind.causal, kind.left, kind.right)
                for a, b in zip(lengths_q, lengths_k))
    return 2.0 * pairs * heads * (head_dim + (head_dim_v or head_dim))


def pass_flops(lengths_q, lengths_k, kind, heads, head_dim, head_dim_v=0, pass_name="forward"):
    """Useful FLOPs of a pass: FLOP_FACTOR[pass_name] x local_flops (the backward 2.5 x the
    forward's, as backward_peers.backward_flops counts it, over the visible pairs)."""
    return FLOP_FACTOR[pass_name] * local_flops(lengths_q, lengths_k, kind, heads, head_dim,
                                                head_dim_v)


def visible(lq, lk, causal=False, window=(-1, -1), device=None):
    """[Lq, Lk] bool: query i sees key j (jfa.h's rule, bottom-right aligned; causal: right 0)."""
    import torch
    left, right = window[0], 0 if causal else window[1]
    d = torch.arange(lq, device=device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=device)[None, :]
    seen = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= j >= d - left
    if right >= 0:
        seen &= j <= d + right
    return seen


def local_probs(s, seen, softcap=0.0, sink=None):
    """The attention weights of scaled scores s [h, Lq, Lk] under softcap, the mask seen
    [Lq, Lk] and a sink logit per head (sink [h], or None), which joins each row's softmax
    denominator and carries no value: [h, Lq, Lk]. Out of place, so that torch autograd
    differentiates it."""
    import torch
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    live = seen.any(dim=1, keepdim=True)
    # A row that sees no key is left unmasked (a finite softmax) and zeroed after it: its output
    # is zeros and no NaN reaches the gradients (jfa's convention: it passes nothing back).
    s = s.masked_fill(~seen & live, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink[:, None, None].expand(s.shape[0], s.shape[1], 1)], dim=-1)
    return (torch.softmax(s, dim=-1) * live)[..., :seen.shape[1]]


def local_reference(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, sinks=None):
    """Attention of one sequence in float64 (torch, any device): q [Lq, H, D], k [Lk, Hkv, D],
    v [Lk, Hkv, Dv], sinks None or [H]; out [Lq, H, Dv], zeros for a row with no key."""
    import torch
    lq, H = q.shape[0], q.shape[1]
    lk, Hkv, Dv = v.shape
    out = torch.zeros(lq, H, Dv, dtype=torch.float64, device=q.device)
    if lq == 0 or lk == 0:
        return out
    seen = visible(lq, lk, causal, window, q.device)
    qs, ks, vs = (x.double().transpose(0, 1) for x in (q, k, v))
    if H != Hkv:
        ks, vs = ks.repeat_interleave(H // Hkv, 0), vs.repeat_interleave(H // Hkv, 0)
    chunk = max(1, min(H, (1 << 27) // (lq * (lk + 1))))  # <= 1 GiB a tensor of scores
    with torch.no_grad():
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            sink = None if sinks is None else sinks[h0:h1].to(q.device, torch.float64)
            # The scores go in unnamed: local_probs drops each step's tensor as it goes.
            p = local_probs(torch.matmul(qs[h0:h1], ks[h0:h1].transpose(1, 2)).mul_(scale),
                            seen, softcap, sink)
            out[:, h0:h1] = torch.matmul(p, vs[h0:h1]).transpose(0, 1)
    return out


def local_reference_grads(q, k, v, dout, scale, causal=False, window=(-1, -1), softcap=0.0,
                          sinks=None):
    """The gradients of local_reference's attention of one sequence given dout [Lq, H, Dv], in
    float64 through torch autograd: dq [Lq, H, D], dk [Lk, Hkv, D], dv [Lk, Hkv, Dv] (GQA: summed
    over each group's query heads) and dsinks [H] (None without sinks). A row that sees no key
    passes nothing back, to the sinks either (jfa's convention)."""
    import torch
    f64, dev = torch.float64, q.device
    lq, H, D = q.shape
    lk, Hkv, Dv = v.shape
    dq = torch.zeros(lq, H, D, dtype=f64, device=dev)
    dk = torch.zeros(lk, Hkv, D, dtype=f64, device=dev)
    dv = torch.zeros(lk, Hkv, Dv, dtype=f64, device=dev)
    dsinks = None if sinks is None else torch.zeros(H, dtype=f64, device=dev)
    if lq == 0 or lk == 0:
        return dq, dk, dv, dsinks
    seen = visible(lq, lk, causal, window, dev)
    qs, ks, vs, g = (x.to(f64).transpose(0, 1) for x in (q, k, v, dout))
    # Heads are independent: a chunk of them at a time, <= 512 MiB of float64 scores each (autograd
    # keeps several tensors of that size).
    chunk = max(1, min(H, (1 << 26) // (lq * (lk + 1))))
    with torch.enable_grad():
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            kv = torch.arange(h0, h1, device=dev) // (H // Hkv)
            leaves = [qs[h0:h1].detach().clone(), ks[kv].detach(), vs[kv].detach()]
            if sinks is not None:
                leaves.append(sinks[h0:h1].detach().to(dev, f64).clone())
            for x in leaves:
                x.requires_grad_(True)
            s = torch.matmul(leaves[0], leaves[1].transpose(1, 2)) * scale
            p = local_probs(s, seen, softcap, leaves[3] if sinks is not None else None)
            o = torch.matmul(p, leaves[2])
            del s, p
            grads = torch.autograd.grad(o, leaves, grad_outputs=g[h0:h1])
            dq[:, h0:h1] = grads[0].transpose(0, 1)
            dk.index_add_(1, kv, grads[1].transpose(0, 1))
            dv.index_add_(1, kv, grads[2].transpose(0, 1))
            if sinks is not None:
                dsinks[h0:h1] = grads[3]
            del o, grads, leaves
    return dq, dk, dv, dsinks


def local_case_grads(case, dout, kind, sinks=None):
    """The float64 reference of the backward of a kind on a case (peers_gpu's Case, dout packed
    as its output): ({sampled sequence: (dq, dk, dv)}, dsinks [H] or None). jfa sums a sink's
    gradient over the batch, so dsinks takes every sequence, not the sample alone."""
    refs, dsinks, sample = {}, None, set(case.sample)
    for i in (range(case.B) if sinks is not None else case.sample):
        a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
        c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
        dq, dk, dv, ds = local_reference_grads(
            case.q[a:b], case.k[c:d], case.v[c:d], dout[a:b], case.scale, kind.causal,
            (kind.left, kind.right), kind.softcap, sinks)
        if i in sample:
            refs[i] = (dq, dk, dv)
        if ds is not None:
            dsinks = ds if dsinks is None else dsinks + ds
    return refs, dsinks
