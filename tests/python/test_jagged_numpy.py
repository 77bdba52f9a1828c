"""Jagged helpers on numpy arrays: offsets, pad/unpad."""

import numpy as np
import pytest

import jfa
from jfa_reference import offsets


def test_lengths_to_offsets():
    cu = jfa.lengths_to_offsets([128, 4096, 512, 2048])
    assert cu.dtype == np.int32 and cu.tolist() == [0, 128, 4224, 4736, 6784]
    assert jfa.lengths_to_offsets(np.array([0, 3, 0], np.int64)).tolist() == [0, 0, 3, 3]
    assert jfa.lengths_to_offsets([]).tolist() == [0]
    with pytest.raises(ValueError, match=r"lengths\[1\]=-2 must be in"):
        jfa.lengths_to_offsets([1, -2])
    with pytest.raises(jfa.JfaInvalidArgumentError, match="overflows int32"):
        jfa.lengths_to_offsets([2**31 - 1, 1])
    with pytest.raises(TypeError, match="integer"):
        jfa.lengths_to_offsets(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        jfa.lengths_to_offsets(np.zeros((2, 2), np.int32))


def test_offsets_to_lengths_and_max_length():
    cu = offsets([3, 0, 7, 1])
    assert jfa.offsets_to_lengths(cu).tolist() == [3, 0, 7, 1]
    assert jfa.max_length(cu) == 7
    assert jfa.max_length([0]) == 0


def test_validate_offsets():
    jfa.validate_offsets(offsets([1, 2]), 3)
    jfa.validate_offsets([0, 0, 4])
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"non-decreasing; offsets\[2\]=1 < offsets\[1\]=4"):
        jfa.validate_offsets(np.array([0, 4, 1], np.int32))
    with pytest.raises(jfa.JfaInvalidArgumentError, match="must equal the total 5"):
        jfa.validate_offsets(offsets([1, 2]), 5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("row_shape", [(), (3,), (2, 5)], ids=["scalar", "vec", "mat"])
def test_pad_unpad_round_trip(rng, dtype, row_shape):
    lengths = [4, 0, 1, 9, 2]
    cu = offsets(lengths)
    values = (rng.standard_normal((int(cu[-1]),) + row_shape) * 10).astype(dtype)
    padded = jfa.pad(values, cu, padding_value=-7)
    assert padded.shape == (5, 9) + row_shape and padded.dtype == dtype
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(padded[b, :n], values[cu[b]:cu[b + 1]])
        assert (padded[b, n:] == -7).all()
    np.testing.assert_array_equal(jfa.unpad(padded, cu), values)
    wider = jfa.pad(values, cu, max_len=12)
    assert wider.shape == (5, 12) + row_shape and (wider[:, 9:] == 0).all()
    np.testing.assert_array_equal(jfa.unpad(wider, cu, total=int(cu[-1])), values)


def test_pad_non_contiguous_values(rng):
    cu = offsets([2, 3])
    base = rng.standard_normal((5, 4, 6)).astype(np.float32)
    values = base[:, ::2, 1:4]
    padded = jfa.pad(values, cu)
    np.testing.assert_array_equal(jfa.unpad(padded, cu), values)


def test_pad_errors(rng):
    cu = offsets([2, 5])
    values = rng.standard_normal((7, 3)).astype(np.float32)
    with pytest.raises(jfa.JfaInvalidArgumentError, match="sequence 1 has length 5 > max_length 4"):
        jfa.pad(values, cu, max_len=4)
    with pytest.raises(ValueError, match="sequence 1 has length 5 > max_len 4"):
        jfa.pad(values.astype(np.float64), cu, max_len=4)
    with pytest.raises(jfa.JfaInvalidArgumentError, match="must equal the total 6"):
        jfa.pad(values[:6], cu)
    with pytest.raises(TypeError, match="int32"):
        jfa.pad(values, cu.astype(np.int64))
    with pytest.raises(ValueError, match="max_len must be in"):
        jfa.pad(values, cu, max_len=-1)
    with pytest.raises(TypeError, match="values must be a numpy array"):
        jfa.pad(values.tolist(), cu)


def test_unpad_errors(rng):
    cu = offsets([2, 5])
    padded = rng.standard_normal((2, 4, 3)).astype(np.float32)
    with pytest.raises(jfa.JfaInvalidArgumentError, match="sequence 1 has length 5 > max_length 4"):
        jfa.unpad(padded, cu)
    with pytest.raises(ValueError, match="padded has 2 sequences but cu_seqlens describes 3"):
        jfa.unpad(padded, offsets([1, 1, 1]))
    with pytest.raises(ValueError, match=r"padded must have shape \[batch, max_len, ...\]"):
        jfa.unpad(padded[0, 0], cu)


def test_empty_batch():
    cu = offsets([])
    padded = jfa.pad(np.zeros((0, 3), np.float32), cu)
    assert padded.shape == (0, 0, 3)
    assert jfa.unpad(padded, cu).shape == (0, 3)
