"""The numpy path (CPU backend) against an independent float64 numpy reference."""

import numpy as np
import pytest

import jfa
from jfa_reference import attention_ref, offsets

# (lengths_q, lengths_k or None for the same): zero-length sequences, length 1, lengths that are
# not tile multiples, q/k lengths that differ in both directions.
LENGTHS = {
    "self": ([0, 1, 17, 64, 130, 3], None),
    "cross": ([5, 0, 33, 1, 70, 9], [9, 4, 0, 1, 128, 3]),
}
HEADS = [(4, 4), (4, 2), (6, 1)]
TOL = {np.float32: dict(atol=2e-5, rtol=2e-5), np.float16: dict(atol=2e-3, rtol=2e-3)}


def _inputs(rng, lengths_q, lengths_k, hq, hkv, d, dtype, d_v=None):
    lengths_k = lengths_q if lengths_k is None else lengths_k
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = rng.standard_normal((cu_q[-1], hq, d)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], hkv, d)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], hkv, d if d_v is None else d_v)).astype(dtype)
    return q, k, v, cu_q, cu_k


def _check(out, lse, q, k, v, cu_q, cu_k, causal, scale=None):
    ref_out, ref_lse = attention_ref(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=scale)
    assert out.shape == (q.shape[0], q.shape[1], v.shape[2]) and out.dtype == q.dtype
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.astype(np.float64), ref_out, **TOL[q.dtype.type])
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == np.float32
    no_keys = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), no_keys)
    assert np.isfinite(lse[~no_keys]).all()
    np.testing.assert_allclose(lse[~no_keys], ref_lse[~no_keys], atol=2e-5, rtol=2e-5)
    assert (out.astype(np.float64)[np.transpose(no_keys)] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("case", list(LENGTHS))
def test_matches_reference(rng, dtype, causal, heads, case):
    lengths_q, lengths_k = LENGTHS[case]
    d = int(rng.choice([8, 40, 64]))
    q, k, v, cu_q, cu_k = _inputs(rng, lengths_q, lengths_k, heads[0], heads[1], d, dtype)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    _check(out, lse, q, k, v, cu_q, cu_k, causal)


def test_random_lengths(rng):
    batch = int(rng.integers(1, 9))
    lengths_q = rng.integers(0, 150, size=batch)
    lengths_k = rng.integers(0, 150, size=batch)
    print(f"lengths_q={lengths_q.tolist()} lengths_k={lengths_k.tolist()}")
    causal = bool(rng.integers(0, 2))
    q, k, v, cu_q, cu_k = _inputs(rng, lengths_q, lengths_k, 4, 2, 32, np.float32)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    _check(out, lse, q, k, v, cu_q, cu_k, causal)


def test_softmax_scale_and_hints(rng):
    q, k, v, cu_q, cu_k = _inputs(rng, [7, 20, 1], [3, 25, 2], 2, 1, 16, np.float32)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, 20, 25, causal=True, softmax_scale=0.3,
                                    return_lse=True)
    _check(out, lse, q, k, v, cu_q, cu_k, True, scale=0.3)
    # Larger hints are fine; the result does not depend on them.
    again = jfa.jagged_attention(q, k, v, cu_q, cu_k, max_seqlen_q=1000, max_seqlen_k=1000,
                                 causal=True, softmax_scale=0.3)
    np.testing.assert_array_equal(out, again)


def test_default_cu_seqlens_k_and_out_only(rng):
    q, k, v, cu, _ = _inputs(rng, [4, 0, 9], None, 3, 3, 8, np.float32)
    out = jfa.jagged_attention(q, k, v, cu)
    assert isinstance(out, np.ndarray)
    ref, _ = attention_ref(q, k, v, cu)
    np.testing.assert_allclose(out, ref, **TOL[np.float32])


def test_offsets_as_lists(rng):
    q, k, v, cu, _ = _inputs(rng, [2, 5], None, 1, 1, 4, np.float16)
    out = jfa.jagged_attention(q, k, v, [0, 2, 7], (0, 2, 7), causal=True)
    ref, _ = attention_ref(q, k, v, cu, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), ref, **TOL[np.float16])


def test_strided_inputs(rng):
    """Views of a packed qkv buffer, a head slice and a head-major layout pass their strides."""
    lengths = [5, 0, 31, 12]
    cu = offsets(lengths)
    total, h, d = int(cu[-1]), 4, 16
    qkv = rng.standard_normal((total, 3, 2 * h, d)).astype(np.float32)
    q = qkv[:, 0, ::2]  # token stride 3*2h*d, head stride 2d
    k = qkv[:, 1, :h]
    v = np.ascontiguousarray(qkv[:, 2, :h].transpose(1, 0, 2)).transpose(1, 0, 2)  # head-major
    assert not q.flags.c_contiguous and not v.flags.c_contiguous
    out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, return_lse=True)
    _check(out, lse, q, k, v, cu, cu, True)


def test_readonly_inputs(rng):
    q, k, v, cu, _ = _inputs(rng, [3, 4], None, 2, 2, 8, np.float32)
    for a in (q, k, v, cu):
        a.setflags(write=False)
    out = jfa.jagged_attention(q, k, v, cu)
    np.testing.assert_allclose(out, attention_ref(q, k, v, cu)[0], **TOL[np.float32])


@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 0]], ids=["empty-batch", "one-empty", "all-empty"])
def test_empty(lengths):
    cu = offsets(lengths)
    q = np.zeros((0, 2, 8), np.float16)
    out, lse = jfa.jagged_attention(q, q, q, cu, causal=True, return_lse=True)
    assert out.shape == (0, 2, 8) and out.dtype == np.float16 and lse.shape == (2, 0)


def test_empty_keys(rng):
    """Queries whose sequence has no keys give zeros and lse -inf."""
    q, k, v, cu_q, cu_k = _inputs(rng, [3, 2], [0, 4], 2, 2, 8, np.float32)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert (out[:3] == 0).all() and np.isneginf(lse[:, :3]).all()
    _check(out, lse, q, k, v, cu_q, cu_k, False)


def test_library_reference_agrees(rng):
    q, k, v, cu_q, cu_k = _inputs(rng, [4, 0, 19], [6, 2, 11], 4, 2, 16, np.float16)
    ref_out, ref_lse = attention_ref(q, k, v, cu_q, cu_k, causal=True)
    out, lse = jfa.attention_reference(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref_out, atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12, rtol=1e-12)
    rows = [0, 22, 5]
    part = jfa.attention_reference(q, k, v, cu_q, cu_k, causal=True, q_tokens=rows)
    np.testing.assert_allclose(part, ref_out[rows], atol=1e-12, rtol=1e-12)


# (head_dim, head_dim_v): v and out with a head size of their own.
HEAD_DIMS_V = [(192, 128), (32, 64), (8, 3), (1, 5)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", HEAD_DIMS_V, ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_head_dim_v_matches_reference(rng, dtype, causal, dims):
    d, d_v = dims
    q, k, v, cu_q, cu_k = _inputs(rng, [5, 0, 33, 1, 70], [9, 4, 0, 1, 64], 4, 2, d, dtype, d_v)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.shape == (q.shape[0], 4, d_v)
    _check(out, lse, q, k, v, cu_q, cu_k, causal)
    # The default scale is 1/sqrt(head_dim) of q and k.
    scaled = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=d ** -0.5)
    np.testing.assert_array_equal(out, scaled)
    scale = float(np.float32(d ** -0.5))  # as the library holds it, so both use the same one
    ref = jfa.attention_reference(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=scale)
    assert ref.shape == (q.shape[0], 4, d_v)
    want = attention_ref(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=scale)[0]
    np.testing.assert_allclose(ref, want, atol=1e-12, rtol=1e-12)


def test_head_dim_v_shape_rules(rng):
    q, k, v, cu, _ = _inputs(rng, [3, 4], None, 2, 2, 8, np.float32, 5)
    with pytest.raises(ValueError, match="v must have the shape of k but for its last dimension"):
        jfa.jagged_attention(q, k, v[:, :1], cu)
    with pytest.raises(ValueError, match="v must have the shape of k but for its last dimension"):
        jfa.jagged_attention(q, k, v[:6], cu)
    with pytest.raises(ValueError, match="q and k must have the same head_dim"):
        jfa.jagged_attention(q, k[:, :, :4], v, cu)
    with pytest.raises(ValueError, match="head_dim_v"):
        jfa.jagged_attention(q, k, v[:, :, :0], cu)
