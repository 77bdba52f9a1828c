"""Local attention, softcap and sinks through the numpy path, against a float64 numpy reference
written here (the mask as jfa.h states it), and the argument checks."""

import numpy as np
import pytest

import jfa
from jfa_reference import offsets


def _ref(q, k, v, cu_q, cu_k, causal, window, softcap, sinks, scale):
    """out float64 [total_q, hq, dv], lse [hq, total_q]."""
    hq, hkv = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], hq, v.shape[2]))
    lse = np.full((hq, q.shape[0]), -np.inf)
    left, right = window
    if causal:
        right = 0
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        diag = i + lk - lq
        seen = np.ones((lq, lk), dtype=bool)
        if left >= 0:
            seen &= j >= diag - left
        if right >= 0:
            seen &= j <= diag + right
        for h in range(hq):
            g = h // (hq // hkv)
            s = q[q0:q1, h].astype(np.float64) @ k[k0:k1, g].astype(np.float64).T * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            w = np.where(seen, np.exp(s), 0.0)
            total = w.sum(axis=1) + (np.exp(float(sinks[h])) if sinks is not None else 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                out[q0:q1, h] = np.where(total[:, None] > 0,
                                         (w @ v[k0:k1, g].astype(np.float64)) / total[:, None], 0)
                lse[h, q0:q1] = np.log(total)
    return out, lse


CASES = [
    dict(window_size=(0, 0)),
    dict(window_size=(1, 1)),
    dict(window_size=(3, -1)),
    dict(window_size=(-1, 2)),
    dict(window_size=(500, 500)),
    dict(window_size=(4, 9), causal=True),
    dict(softcap=2.0),
    dict(softcap=2.0, causal=True, window_size=(5, -1)),
    dict(sinks="large"),
    dict(sinks="small"),
    dict(sinks="random", window_size=(2, 1), softcap=1.5),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matches_numpy_reference(case, dtype):
    rng = np.random.default_rng(7)
    lq, lk = [5, 0, 33, 1, 70, 9], [9, 4, 0, 1, 64, 3]
    cu_q, cu_k = offsets(lq), offsets(lk)
    q = rng.standard_normal((cu_q[-1], 4, 16)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], 2, 16)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], 2, 8)).astype(dtype)
    kind = case.get("sinks")
    sinks = None if kind is None else {
        "large": np.full(4, 10.0, np.float32), "small": np.full(4, -10.0, np.float32),
        "random": rng.standard_normal(4).astype(np.float32)}[kind]
    kwargs = dict(causal=case.get("causal", False), window_size=case.get("window_size", (-1, -1)),
                  softcap=case.get("softcap", 0.0), sinks=sinks)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, softmax_scale=1.25, return_lse=True,
                                    **kwargs)
    ref_out, ref_lse = _ref(q, k, v, cu_q, cu_k, kwargs["causal"], kwargs["window_size"],
                            kwargs["softcap"], sinks, np.float32(1.25))
    tol = 2e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=tol, rtol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)
    ref64, ref_lse64 = jfa.attention_reference(q, k, v, cu_q, cu_k, softmax_scale=1.25,
                                               return_lse=True, **kwargs)
    np.testing.assert_allclose(ref64, ref_out, atol=1e-10, rtol=1e-10)
    if sinks is not None:  # every LSE finite: a row without keys has lse = its sink
        assert np.isfinite(lse).all()


def test_causal_wins_over_window_right():
    rng = np.random.default_rng(1)
    cu = offsets([7, 3])
    q, k, v = (rng.standard_normal((10, 2, 8)).astype(np.float32) for _ in range(3))
    a = jfa.jagged_attention(q, k, v, cu, causal=True)
    b = jfa.jagged_attention(q, k, v, cu, causal=True, window_size=(-1, 4))
    c = jfa.jagged_attention(q, k, v, cu, window_size=(-1, 0))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_argument_checks():
    rng = np.random.default_rng(2)
    cu = offsets([3])
    q, k, v = (rng.standard_normal((3, 2, 8)).astype(np.float32) for _ in range(3))
    with pytest.raises(ValueError, match="window_size left must be >= 0, or -1"):
        jfa.jagged_attention(q, k, v, cu, window_size=(-2, 0))
    with pytest.raises(TypeError, match="window_size must be a pair"):
        jfa.jagged_attention(q, k, v, cu, window_size=3)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
            jfa.jagged_attention(q, k, v, cu, softcap=bad)
    with pytest.raises(ValueError, match=r"sinks must have shape \[heads_q\]"):
        jfa.jagged_attention(q, k, v, cu, sinks=np.zeros(3, np.float32))
    with pytest.raises(jfa.JfaInvalidArgumentError, match="sinks must be finite"):
        jfa.jagged_attention(q, k, v, cu, sinks=np.array([0.0, np.nan], np.float32))
