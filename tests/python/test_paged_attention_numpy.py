"""jfa.paged_attention on numpy arrays (the CPU backend): a paged KV cache with shuffled and
shared pages and partial last pages gives what jfa.jagged_attention gives on the same keys
packed, matches libjfa's float64 reference, and rejects bad arguments with errors that say why."""
import numpy as np
import pytest

import jfa


def _case(rng, page_size, used, len_q, heads_q=4, heads_kv=2, d=16, dv=16, dtype=np.float32,
          share=True):
    batch = len(used)
    max_pages = max([(n + page_size - 1) // page_size for n in used] + [0]) + 1
    needed = sum((n + page_size - 1) // page_size for n in used)
    num_pages = needed + 2
    k_cache = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(dtype)
    v_cache = rng.standard_normal((num_pages, page_size, heads_kv, dv)).astype(dtype)
    pages = rng.permutation(num_pages)
    table = np.full((batch, max_pages), -5, dtype=np.int32)  # entries past the used pages: garbage
    nxt = 0
    for b, n in enumerate(used):
        for j in range((n + page_size - 1) // page_size):
            if share and b > 0 and j == 0 and table[0, 0] >= 0 and rng.random() < 0.3:
                table[b, j] = table[0, 0]  # a page shared with sequence 0
            else:
                table[b, j] = pages[nxt]
                nxt += 1
    k = np.concatenate([np.concatenate([k_cache[table[b, j]] for j in range(max_pages)])[:n]
                        if n else np.zeros((0, heads_kv, d), dtype) for b, n in enumerate(used)])
    v = np.concatenate([np.concatenate([v_cache[table[b, j]] for j in range(max_pages)])[:n]
                        if n else np.zeros((0, heads_kv, dv), dtype) for b, n in enumerate(used)])
    q = rng.standard_normal((sum(len_q), heads_q, d)).astype(dtype)
    cu_q = jfa.lengths_to_offsets(len_q)
    cu_k = jfa.lengths_to_offsets(used)
    return q, k_cache, v_cache, table, np.asarray(used, dtype=np.int32), cu_q, k, v, cu_k


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("local", [False, True])
def test_paged_equals_packed_and_the_reference(rng, page_size, local):
    used = [0, 1, page_size - 1 or 2, page_size, page_size + 1, 3 * page_size + 2, 70]
    len_q = [1, 4, 1, 40, 1, 4, 2]
    q, kc, vc, table, seqused, cu_q, k, v, cu_k = _case(rng, page_size, used, len_q, dv=12)
    extra = dict(window_size=(7, 0), softcap=3.0, sinks=rng.standard_normal(4)) if local else {}
    for causal in (False, True):
        out, lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=causal,
                                       return_lse=True, **extra)
        want, want_lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal,
                                              return_lse=True, **extra)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(lse, want_lse)
        ref, ref_lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=causal,
                                           return_lse=True, reference=True, **extra)
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-4)


def test_errors_say_what_is_wrong(rng):
    q, kc, vc, table, seqused, cu_q, *_ = _case(rng, 8, [10, 3], [1, 2])
    bad = table.copy()
    bad[1, 0] = kc.shape[0]
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"block_table\[1\]\[0\]="):
        jfa.paged_attention(q, kc, vc, bad, seqused, cu_q)
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"seqused_k\[0\]=999"):
        jfa.paged_attention(q, kc, vc, table, np.array([999, 3], dtype=np.int32), cu_q)
    with pytest.raises(TypeError, match="block_table must be an int32 array"):
        jfa.paged_attention(q, kc, vc, table.astype(np.int64), seqused, cu_q)
    with pytest.raises(ValueError, match="cu_seqlens_q describes 2 sequences"):
        jfa.paged_attention(q, kc, vc, table[:1], seqused, cu_q)
    with pytest.raises(ValueError, match="must be C-contiguous"):
        jfa.paged_attention(q, kc[:, ::2], vc[:, ::2], table, seqused, cu_q)
    with pytest.raises(ValueError, match="head_dim"):
        jfa.paged_attention(q[:, :, :8], kc, vc, table, seqused, cu_q)


def test_append_writes_the_new_rows_and_attends_over_them(rng):
    """A decode step in one call: each sequence's new rows land in its pages after its cached
    rows, and the output is that of the packed call over both."""
    page = 4
    full = [3, 9, 6]  # keys after the append
    added = [1, 2, 0]
    q, kc, vc, table, _, cu_q, k, v, cu_k = _case(rng, page, full, [1, 2, 1], share=False)
    before = np.array([n - a for n, a in zip(full, added)], dtype=np.int32)
    k_new = np.concatenate([k[cu_k[b] + before[b]:cu_k[b + 1]] for b in range(3)])
    v_new = np.concatenate([v[cu_k[b] + before[b]:cu_k[b + 1]] for b in range(3)])
    cu_new = jfa.lengths_to_offsets(added)
    want_k, want_v = kc.copy(), vc.copy()
    for b in range(3):  # the rows the append must write, made stale first
        for t in range(before[b], full[b]):
            kc[table[b, t // page], t % page] = 1e3
            vc[table[b, t // page], t % page] = -1e3
    stale_k = kc.copy()
    ref = jfa.paged_attention(q, kc, vc, table, before, cu_q, causal=True, reference=True,
                              k_new=k_new, v_new=v_new, cu_seqlens_new=cu_new)
    np.testing.assert_array_equal(kc, stale_k)  # the reference writes nothing
    out = jfa.paged_attention(q, kc, vc, table, before, cu_q, causal=True, k_new=k_new,
                              v_new=v_new, cu_seqlens_new=cu_new)
    np.testing.assert_array_equal(kc, want_k)
    np.testing.assert_array_equal(vc, want_v)
    np.testing.assert_array_equal(out, jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=True))
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="go together"):
        jfa.paged_attention(q, kc, vc, table, before, cu_q, k_new=k_new)
    kc.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        jfa.paged_attention(q, kc, vc, table, before, cu_q, k_new=k_new, v_new=v_new,
                            cu_seqlens_new=cu_new)
