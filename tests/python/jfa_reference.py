"""An independent float64 reference of jagged attention, written with numpy only."""

import math

import numpy as np


def attention_ref(q, k, v, cu_q, cu_k=None, *, causal=False, softmax_scale=None):
    """Explicit softmax per sequence and head, in float64.

    q [total_q, hq, d], k [total_k, hkv, d], v [total_k, hkv, d_v]; query head h reads kv head
    h // (hq // hkv).
    Causal is bottom-right aligned: query i sees key j iff j <= i + len_k - len_q. A row that sees
    no key gives zeros and lse -inf. Returns (out [total_q, hq, d_v], lse [hq, total_q]).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    cu_q = [int(x) for x in cu_q]
    cu_k = cu_q if cu_k is None else [int(x) for x in cu_k]
    total_q, hq, d = q.shape
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    out = np.zeros((total_q, hq, v.shape[2]))
    lse = np.full((hq, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = qe - qs, ke - ks
        if lq == 0 or lk == 0:
            continue
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        visible = (j <= i + (lk - lq)) if causal else np.ones((lq, lk), dtype=bool)
        rows = visible.any(axis=1)
        for h in range(hq):
            s = scale * (q[qs:qe, h] @ k[ks:ke, h // group].T)
            s = np.where(visible, s, -np.inf)
            m = np.where(rows, s.max(axis=1), 0.0)
            p = np.where(visible, np.exp(s - m[:, None]), 0.0)
            l = p.sum(axis=1)
            safe_l = np.where(rows, l, 1.0)
            o = (p @ v[ks:ke, h // group]) / safe_l[:, None]
            out[qs:qe, h] = np.where(rows[:, None], o, 0.0)
            lse[h, qs:qe] = np.where(rows, m + np.log(safe_l), -np.inf)
    return out, lse


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
