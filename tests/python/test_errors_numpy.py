"""Bad arguments raise TypeError / ValueError / JfaError naming the argument and the rule."""

import numpy as np
import pytest

import jfa
from jfa_reference import offsets


@pytest.fixture
def args(rng):
    cu = offsets([3, 5])
    q = rng.standard_normal((8, 4, 16)).astype(np.float32)
    k = rng.standard_normal((8, 2, 16)).astype(np.float32)
    v = rng.standard_normal((8, 2, 16)).astype(np.float32)
    return q, k, v, cu


def test_error_classes():
    assert issubclass(jfa.JfaError, RuntimeError)
    assert issubclass(jfa.JfaInvalidArgumentError, jfa.JfaError)
    assert issubclass(jfa.JfaInvalidArgumentError, ValueError)
    assert issubclass(jfa.JfaUnsupportedError, jfa.JfaError)
    assert not issubclass(jfa.JfaUnsupportedError, ValueError)
    assert issubclass(jfa.JfaOutOfMemoryError, MemoryError)
    e = jfa.JfaInvalidArgumentError(1, "x must be > 0", "jfa_fn")
    assert e.status == 1 and e.message == "x must be > 0" and "x must be > 0" in str(e)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_not_an_array(args, which):
    q, k, v, cu = args
    kw = dict(q=q, k=k, v=v)
    kw[which] = kw[which].tolist()
    with pytest.raises(TypeError, match=f"{which} must be a numpy.ndarray"):
        jfa.jagged_attention(kw["q"], kw["k"], kw["v"], cu)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_ndim(args, which):
    q, k, v, cu = args
    kw = dict(q=q, k=k, v=v)
    kw[which] = kw[which].reshape(kw[which].shape[0], -1)
    with pytest.raises(ValueError, match=f"{which} must have 3 dimensions"):
        jfa.jagged_attention(kw["q"], kw["k"], kw["v"], cu)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_unsupported_dtype(args, dtype):
    q, k, v, cu = args
    with pytest.raises(TypeError, match="q must be float16 or float32"):
        jfa.jagged_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), cu)


def test_mixed_dtypes(args):
    q, k, v, cu = args
    with pytest.raises(TypeError, match="same dtype.*k float16"):
        jfa.jagged_attention(q, k.astype(np.float16), v, cu)


def test_byte_order(args):
    q, k, v, cu = args
    with pytest.raises(TypeError, match="native byte order"):
        jfa.jagged_attention(q.astype(">f4"), k, v, cu)


def test_shapes(args):
    q, k, v, cu = args
    with pytest.raises(ValueError, match="v must have the shape of k"):
        jfa.jagged_attention(q, k, v[:, :1], cu)
    with pytest.raises(ValueError, match="same head_dim"):
        jfa.jagged_attention(q, k[:, :, :8], v[:, :, :8], cu)
    with pytest.raises(ValueError, match="multiple of the heads of k"):
        jfa.jagged_attention(q[:, :3], k, v, cu)


def test_strides(args):
    q, k, v, cu = args
    with pytest.raises(ValueError, match=r"q: the last dimension \(head_dim\) must be contiguous"):
        jfa.jagged_attention(q[:, :, ::2], k[:, :, :8], v[:, :, :8], cu)
    with pytest.raises(ValueError, match="k: token and head strides must be positive"):
        jfa.jagged_attention(q, k[::-1], v, cu)
    with pytest.raises(ValueError, match="v: token and head strides must be positive"):
        jfa.jagged_attention(q, k, np.broadcast_to(v[:1], v.shape), cu)


def test_unaligned(args):
    q, k, v, cu = args
    raw = np.zeros(q.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(q.shape)
    assert not unaligned.flags.aligned
    with pytest.raises(ValueError, match="q is not aligned"):
        jfa.jagged_attention(unaligned, k, v, cu)


def test_offsets_type_and_shape(args):
    q, k, v, cu = args
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 array"):
        jfa.jagged_attention(q, k, v, cu.astype(np.int64))
    with pytest.raises(TypeError, match="cu_seqlens_k must be an int32 array"):
        jfa.jagged_attention(q, k, v, cu, cu.astype(np.uint32))
    with pytest.raises(ValueError, match="cu_seqlens_q must be 1-D"):
        jfa.jagged_attention(q, k, v, cu.reshape(1, -1))
    with pytest.raises(ValueError, match="cu_seqlens_q must hold batch"):
        jfa.jagged_attention(q, k, v, np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="same length"):
        jfa.jagged_attention(q, k, v, cu, offsets([3, 5, 0]))
    with pytest.raises(TypeError, match="cu_seqlens_q must hold integers"):
        jfa.jagged_attention(q, k, v, [0.0, 3.0, 8.0])
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 numpy array or a list"):
        jfa.jagged_attention(q, k, v, "0,3,8")


@pytest.mark.parametrize("cu, pattern", [
    ([1, 3, 8], r"cu_seqlens_q\[0\] must be 0"),
    ([0, 5, 3, 8], r"cu_seqlens_q must be non-decreasing; cu_seqlens_q\[2\]=3 < cu_seqlens_q\[1\]=5"),
    ([0, 3, 7], r"cu_seqlens_q\[batch\].*must equal the total 8"),
])
def test_offsets_values_library_message(args, cu, pattern):
    q, k, v, _ = args
    cu = np.array(cu, np.int32)
    with pytest.raises(jfa.JfaInvalidArgumentError, match=pattern) as info:
        jfa.jagged_attention(q, k[: 8], v[: 8], cu, offsets([3, 5] + [0] * (len(cu) - 3)))
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert info.value.status == 1


def test_k_total(args):
    q, k, v, cu = args
    with pytest.raises(jfa.JfaInvalidArgumentError, match="cu_seqlens_k.*must equal the total 7"):
        jfa.jagged_attention(q, k[:7], v[:7], cu)


def test_hints(args):
    q, k, v, cu = args
    with pytest.raises(jfa.JfaInvalidArgumentError, match="max_seqlen_q=4 is smaller than the length 5"):
        jfa.jagged_attention(q, k, v, cu, max_seqlen_q=4)
    with pytest.raises(ValueError, match="max_seqlen_k must be in"):
        jfa.jagged_attention(q, k, v, cu, max_seqlen_k=-1)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int or None"):
        jfa.jagged_attention(q, k, v, cu, max_seqlen_q=5.0)


def test_softmax_scale(args):
    q, k, v, cu = args
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="softmax_scale must be finite"):
            jfa.jagged_attention(q, k, v, cu, softmax_scale=bad)
    with pytest.raises(TypeError, match="softmax_scale must be a float"):
        jfa.jagged_attention(q, k, v, cu, softmax_scale="0.1")
    # Finite in Python but not in float32, which the library computes in.
    for bad in (1e39, -3.5e38):
        with pytest.raises(ValueError, match="softmax_scale must be finite in float32"):
            jfa.jagged_attention(q, k, v, cu, softmax_scale=bad)
    # Finite in float32, but its product with log2(e) is not: the library names the argument.
    with pytest.raises(ValueError, match="softmax_scale 3.4e\\+38 cannot be used"):
        jfa.jagged_attention(q, k, v, cu, softmax_scale=3.4e38)
    # Representable scores (even huge ones) give a finite result; scores beyond float32 an error.
    out = jfa.jagged_attention(q, k, v, cu, softmax_scale=1e30)
    assert np.isfinite(out.astype(np.float64)).all()
    with pytest.raises(jfa.JfaUnsupportedError, match="not finite in float32"):
        jfa.jagged_attention(q, k, v, cu, softmax_scale=2.3e38)


def test_flags_are_bools(args):
    q, k, v, cu = args
    for name in ("causal", "return_lse"):
        for bad in ("yes", 1, None, [True]):
            with pytest.raises(TypeError, match=f"{name} must be a bool"):
                jfa.jagged_attention(q, k, v, cu, **{name: bad})
    with pytest.raises(TypeError, match="causal must be a bool"):
        jfa.attention_reference(q, k, v, cu, causal="no")
    out, lse = jfa.jagged_attention(q, k, v, cu, causal=np.bool_(True), return_lse=np.bool_(True))
    assert out.shape == q.shape and lse.shape == (4, 8)


def test_q_tokens_are_integers(args):
    q, k, v, cu = args
    with pytest.raises(TypeError, match="q_tokens must hold integers"):
        jfa.attention_reference(q, k, v, cu, q_tokens=[1.7])
    with pytest.raises(TypeError, match="q_tokens must hold integers"):
        jfa.attention_reference(q, k, v, cu, q_tokens=np.array([True, False]))
    whole = jfa.attention_reference(q, k, v, cu)
    assert np.array_equal(jfa.attention_reference(q, k, v, cu, q_tokens=np.array([1, 6], np.uint8)),
                          whole[[1, 6]])
    assert jfa.attention_reference(q, k, v, cu, q_tokens=[]).shape == (0, 4, 16)


def test_unsupported_head_dim(rng):
    """Valid but unsupported combinations come back as JfaUnsupportedError (not a ValueError)."""
    q = rng.standard_normal((2, 1, 600)).astype(np.float32)
    with pytest.raises(jfa.JfaUnsupportedError, match="head_dim 600 is not supported") as info:
        jfa.jagged_attention(q, q, q, offsets([2]))
    assert info.value.status == 2 and not isinstance(info.value, ValueError)


def test_zero_heads_or_dim():
    cu = offsets([1])
    with pytest.raises(ValueError, match="heads must be >= 1"):
        jfa.jagged_attention(np.zeros((1, 0, 4), np.float32), np.zeros((1, 0, 4), np.float32),
                             np.zeros((1, 0, 4), np.float32), cu)
    z = np.zeros((1, 1, 0), np.float32)
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        jfa.jagged_attention(z, z, z, cu)
