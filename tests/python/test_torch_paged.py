"""jfa.paged_attention on torch tensors (torch.ops.jfa.paged_attention, native or ctypes): a paged
KV cache with shuffled and shared pages and partial last pages gives what libjfa's float64
reference and an independent float64 torch computation give, and what jfa.jagged_attention gives
on the same keys packed; the append writes the caches in place; bad arguments raise errors that
say why; opcheck and torch.compile(fullgraph=True) on the CPU. The CUDA tests (Hopper) run the
CUDA paged kernels against the CPU backend."""

import math

import numpy as np
import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}",
                allow_module_level=True)

import torch  # noqa: E402

from cuda_graphs import capture  # noqa: E402
from cuda_skip import cuda_skip_reason  # noqa: E402

_CUDA_REASON = cuda_skip_reason()
needs_cuda = pytest.mark.skipif(bool(_CUDA_REASON), reason=_CUDA_REASON or "n/a")

# Against float64 references on the same (rounded) inputs: the output's rounding dominates.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
LSE_TOL = dict(atol=2e-5, rtol=1e-5)


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _offsets(lengths, device="cpu"):
    return _i32([0] + np.cumsum(lengths).tolist(), device)


def _case(seed, page_size, used, len_q, heads_q=4, heads_kv=2, d=16, dv=16, dtype=torch.float32,
          share=True, spare_pages=3, device="cpu"):
    """Caches with every sequence's keys on shuffled pages (its first page shared with sequence 0
    now and then; entries past a sequence's pages hold garbage), and the same keys packed.
    Returns (q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, k, v, cu_seqlens_k)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    pages_of = [(n + page_size - 1) // page_size for n in used]
    num_pages = sum(pages_of) + spare_pages
    max_pages = max(pages_of + [0]) + 1
    k_cache = torch.randn((num_pages, page_size, heads_kv, d), generator=g).to(dtype)
    v_cache = torch.randn((num_pages, page_size, heads_kv, dv), generator=g).to(dtype)
    order = rng.permutation(num_pages)
    table = np.where(rng.random((len(used), max_pages)) < 0.5, -7, num_pages + 5).astype(np.int32)
    nxt, first = 0, None
    for b, n in enumerate(pages_of):
        for j in range(n):
            if share and j == 0 and first is not None and rng.random() < 0.4:
                table[b, j] = first  # an earlier sequence's first page, read by both
            else:
                table[b, j] = order[nxt]
                nxt += 1
            first = table[b, 0] if first is None else first
    table = torch.from_numpy(table)
    k, v = _gather(k_cache, v_cache, table, used)
    q = torch.randn((sum(len_q), heads_q, d), generator=g).to(dtype)
    return (q.to(device), k_cache.to(device), v_cache.to(device), table.to(device),
            _i32(used, device), _offsets(len_q, device), k.to(device), v.to(device),
            _offsets(used, device))


def _gather(k_cache, v_cache, table, lengths):
    """The first lengths[b] rows of each sequence's pages, packed."""
    page = k_cache.shape[1]
    rows = [(int(table[b, t // page]), t % page) for b, n in enumerate(lengths) for t in range(n)]
    k = torch.stack([k_cache[p, r] for p, r in rows]) if rows else k_cache[:0, 0]
    v = torch.stack([v_cache[p, r] for p, r in rows]) if rows else v_cache[:0, 0]
    return k, v


def torch_reference(q, k, v, cu_q, cu_k, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                    sinks=None):
    """Per-sequence float64 attention written out in torch: GQA, bottom-right aligned causal mask
    and window, softcap, sinks in the denominator. (out, lse); a row with no key: 0, -inf (or its
    sink)."""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    heads_q, d = q.shape[1], q.shape[2]
    group = heads_q // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros((q.shape[0], heads_q, v.shape[2]), dtype=torch.float64)
    lse = torch.full((heads_q, q.shape[0]), -math.inf, dtype=torch.float64)
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        ks = k[k0:k1].repeat_interleave(group, 1)
        vs = v[k0:k1].repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1], ks) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(lq)[:, None] + (lk - lq)  # bottom-right aligned
        j = torch.arange(lk)[None, :]
        seen = torch.ones((lq, lk), dtype=torch.bool)
        right = 0 if causal else window[1]
        if right >= 0:
            seen &= j <= i + right
        if window[0] >= 0:
            seen &= j >= i - window[0]
        s = s.masked_fill(~seen, -math.inf)
        logits = s
        if sinks is not None:
            sink = sinks.double().cpu()[:, None, None].expand(heads_q, lq, 1)
            logits = torch.cat([s, sink], dim=-1)
        m = torch.logsumexp(logits, dim=-1)  # [heads_q, lq]
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)  # rows of -inf: no key, no weight
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, vs)
        lse[:, q0:q1] = m
    return out, lse


def _numpy_reference(q, kc, vc, table, used, cu_q, **kwargs):
    """jfa.paged_attention's own float64 reference, on the tensors' numpy views."""
    kwargs = {name: x.cpu().numpy() if isinstance(x, torch.Tensor) else x
              for name, x in kwargs.items()}
    return jfa.paged_attention(*(t.cpu().numpy() for t in (q, kc, vc, table, used, cu_q)),
                               reference=True, return_lse=True, **kwargs)


def _close(out, lse, ref_out, ref_lse, dtype):
    ref_out, ref_lse = torch.as_tensor(ref_out), torch.as_tensor(ref_lse)
    torch.testing.assert_close(out.double().cpu(), ref_out.double(), **TOL[dtype])
    torch.testing.assert_close(lse.double().cpu(), ref_lse.double(), **LSE_TOL)


LOCAL = dict(window_size=(9, 0), softcap=4.0)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("local", [False, True], ids=["plain", "window-softcap-sinks"])
def test_matches_the_references_and_the_packed_call(seed, page_size, dtype, local):
    """Shuffled, shared and partial pages; cache lengths 0, 1, page multiples and +-1; decode rows
    and prefill chunks (and a sequence with no query); GQA 3:1 with head_dim_v != head_dim."""
    p = page_size
    used = [0, 1, max(p - 1, 2), p, p + 1, 2 * p, 3 * p - 1, 3 * p + 1, 37]
    len_q = [1, 1, 3, 0, 1, 5, 1, 2, 9]
    q, kc, vc, table, seqused, cu_q, k, v, cu_k = _case(seed, p, used, len_q, heads_q=6,
                                                        heads_kv=2, d=16, dv=12, dtype=dtype)
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(seed)) if local else None
    extra = dict(LOCAL, sinks=sinks) if local else {}
    for causal in (False, True):
        out, lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=causal,
                                       return_lse=True, **extra)
        assert out.dtype == dtype and out.shape == (q.shape[0], 6, 12)
        assert lse.dtype == torch.float32 and lse.shape == (6, q.shape[0])
        want, want_lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal,
                                              return_lse=True, **extra)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)  # the same packed kernel
        _close(out, lse, *torch_reference(q, k, v, cu_q, cu_k, causal, window=extra.get(
            "window_size", (-1, -1)), softcap=extra.get("softcap", 0.0), sinks=sinks), dtype)
        if dtype != torch.bfloat16:  # numpy has no bfloat16
            _close(out, lse, *_numpy_reference(q, kc, vc, table, seqused, cu_q, causal=causal,
                                               **extra), dtype)
        assert torch.equal(jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=causal,
                                               **extra), out)  # without the LSE


def test_mqa_scale_hints_and_strided_inputs(seed):
    """MQA, an explicit scale, max_seqlen hints, a strided q and a block table that is a column
    slice of a wider one (copied dense) give the contiguous call's result."""
    used, len_q = [5, 16, 33], [1, 4, 2]
    q, kc, vc, table, seqused, cu_q, k, v, cu_k = _case(seed, 8, used, len_q, heads_q=4,
                                                        heads_kv=1, d=8, dv=8)
    want = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, softmax_scale=0.3, causal=True)
    torch.testing.assert_close(want.double(), torch_reference(q, k, v, cu_q, cu_k, True,
                                                              scale=0.3)[0], **TOL[torch.float32])
    wide = torch.full((3, table.shape[1] + 4), 99, dtype=torch.int32)
    wide[:, :table.shape[1]] = table
    q_strided = torch.cat([q, q], dim=2)[:, :, :8]
    assert not q_strided.is_contiguous() and not wide[:, :table.shape[1]].is_contiguous()
    out = jfa.paged_attention(q_strided, kc, vc, wide[:, :table.shape[1]], seqused, cu_q,
                              softmax_scale=0.3, causal=True, max_seqlen_q=4, max_seqlen_k=33)
    assert torch.equal(out, want)
    listed = jfa.paged_attention(q, kc, vc, table, seqused, [0, 1, 5, 7], softmax_scale=0.3,
                                 causal=True)  # offsets as a list
    assert torch.equal(listed, want)


def test_rows_without_keys_and_sinks(seed):
    """A sequence with an empty cache, and causal rows before the first key: out 0, lse -inf, or
    the row's sink with sinks."""
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 4, [0, 2], [2, 4])
    out, lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=True, return_lse=True)
    empty_rows = [0, 1, 2, 3]  # sequence 0's two rows, and the first two of sequence 1 (4 > 2)
    assert torch.equal(out[empty_rows], torch.zeros_like(out[empty_rows]))
    assert torch.isneginf(lse[:, empty_rows]).all() and torch.isfinite(lse[:, 4:]).all()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out, lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=True, return_lse=True,
                                   sinks=sinks.tolist())  # a list of floats is taken too
    assert torch.equal(out[empty_rows], torch.zeros_like(out[empty_rows]))
    assert torch.equal(lse[:, empty_rows], sinks[:, None].expand(4, 4))


def test_a_block_table_of_no_columns(seed):
    """Every sequence empty: a [batch, 0] table is valid (its data pointer is NULL in torch)."""
    q, kc, vc, *_ = _case(seed, 4, [3], [1])
    cu_q = _i32([0, 1, 1])
    table = torch.empty((2, 0), dtype=torch.int32)
    out, lse = jfa.paged_attention(q, kc, vc, table, _i32([0, 0]), cu_q, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def _append_case(seed, page_size, full, added, len_q, dtype=torch.float32, **shape):
    """Caches whose sequences hold full[b] - added[b] rows, the added[b] new rows apart (the rows
    they go to made stale first), and the caches as the append must leave them (on the host;
    shape: _case's head counts and sizes)."""
    q, kc, vc, table, _, cu_q, k, v, cu_k = _case(seed, page_size, full, len_q, share=False,
                                                  dtype=dtype, **shape)
    before = [n - a for n, a in zip(full, added)]
    cu_k_list = cu_k.tolist()
    k_new = torch.cat([k[cu_k_list[b] + before[b]:cu_k_list[b + 1]] for b in range(len(full))])
    v_new = torch.cat([v[cu_k_list[b] + before[b]:cu_k_list[b + 1]] for b in range(len(full))])
    want_k, want_v = kc.clone(), vc.clone()
    for b in range(len(full)):
        for t in range(before[b], full[b]):
            kc[table[b, t // page_size], t % page_size] = 1e3
            vc[table[b, t // page_size], t % page_size] = -1e3
    return (q, kc, vc, table, _i32(before), cu_q, k_new.contiguous(), v_new.contiguous(),
            _offsets(added), k, v, cu_k, want_k, want_v)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad"])
def test_append_writes_the_caches_in_place(seed, page_size, mode):
    """A decode/prefill step in one call: each sequence's new rows land in its pages after its
    cached rows (across page boundaries, into an empty cache, none for some), nothing else
    changes, the output attends over old and new rows, and the caches' versions move."""
    full, added, len_q = [3, 9, 6, 17, 2], [1, 2, 0, 5, 2], [1, 2, 1, 5, 2]
    (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new, k, v, cu_k, want_k,
     want_v) = _append_case(seed, page_size, full, added, len_q)
    stale_k, stale_v = kc.clone(), vc.clone()
    ref, ref_lse = _numpy_reference(q, kc, vc, table, before, cu_q, causal=True, k_new=k_new,
                                    v_new=v_new, cu_seqlens_new=cu_new)
    assert torch.equal(kc, stale_k) and torch.equal(vc, stale_v)  # the reference writes nothing
    versions = kc._version, vc._version
    if mode == "grad":
        q = q.clone().requires_grad_(True)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
               "grad": torch.enable_grad}[mode]
    with context():
        out, lse = jfa.paged_attention(q, kc, vc, table, before, cu_q, causal=True,
                                       return_lse=True, k_new=k_new, v_new=v_new,
                                       cu_seqlens_new=cu_new)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert kc._version > versions[0] and vc._version > versions[1]
    want, want_lse = jfa.jagged_attention(q.detach(), k, v, cu_q, cu_k, causal=True,
                                          return_lse=True)
    assert torch.equal(out.detach(), want) and torch.equal(lse.detach(), want_lse)
    _close(out.detach(), lse.detach(), ref, ref_lse, torch.float32)
    _close(out.detach(), lse.detach(), *torch_reference(q, k, v, cu_q, cu_k, True),
           torch.float32)
    if mode == "grad":  # forward only: the gradient stops here, with the reason
        assert out.requires_grad
        with pytest.raises(NotImplementedError, match="is forward only"):
            out.sum().backward()


def test_append_of_no_rows_and_rejected_appends_write_nothing(seed):
    """An append of no rows is a plain call (its offsets still checked); a call rejected by libjfa
    (a page outside the cache, a page shared with another sequence) leaves the caches as they
    were."""
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 4, [3, 6], [1, 1], share=False)
    nothing = torch.empty((0, 2, 16))
    want = jfa.paged_attention(q, kc, vc, table, seqused, cu_q)
    out = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, k_new=nothing, v_new=nothing,
                              cu_seqlens_new=_i32([0, 0, 0]))
    assert torch.equal(out, want)
    with pytest.raises(jfa.JfaInvalidArgumentError, match="cu_seqlens_new"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, k_new=nothing, v_new=nothing,
                            cu_seqlens_new=_i32([0, 1, 0]))
    k_new, v_new, cu_new = torch.randn(2, 2, 16), torch.randn(2, 2, 16), _i32([0, 1, 2])
    before = kc.clone(), vc.clone()
    bad = table.clone()
    bad[1, 1] = kc.shape[0] + 3  # sequence 1's second page, which receives its new row
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"block_table\[1\]\[1\]="):
        jfa.paged_attention(q, kc, vc, bad, seqused, cu_q, k_new=k_new, v_new=v_new,
                            cu_seqlens_new=cu_new)
    shared = table.clone()
    shared[1, 1] = table[0, 0]  # sequence 0's page, written by sequence 1's append
    with pytest.raises(jfa.JfaInvalidArgumentError, match="belong to its sequence alone"):
        jfa.paged_attention(q, kc, vc, shared, seqused, cu_q, k_new=k_new, v_new=v_new,
                            cu_seqlens_new=cu_new)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def _error_cases(seed):
    """(id, kwargs changes of a valid call, exception, message): checked by torch, before libjfa,
    with the same messages whichever kind of op runs (the native op's C++ checks or the ctypes
    op's Python ones)."""
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 4, [3, 6], [1, 2])
    kn, vn, cun = torch.randn(2, 2, 16), torch.randn(2, 2, 16), _i32([0, 1, 2])
    base = dict(q=q, k_cache=kc, v_cache=vc, block_table=table, seqused_k=seqused,
                cu_seqlens_q=cu_q)
    append = dict(k_new=kn, v_new=vn, cu_seqlens_new=cun)
    return base, [
        ("q-dtype", dict(q=q.double()), TypeError,
         "q must be float16, bfloat16 or float32, got torch.float64"),
        ("cache-dtype", dict(v_cache=vc.half()), TypeError,
         "q, k_cache and v_cache must have the same dtype, got q torch.float32 and v_cache "
         "torch.float16"),
        ("q-dims", dict(q=q[0]), ValueError,
         "q must have 3 dimensions [total_q, heads_q, head_dim], got shape (4, 16)"),
        ("cache-dims", dict(k_cache=kc[0]), ValueError,
         "k_cache must have 4 dimensions [num_pages, page_size, heads_kv, head_dim], got shape "
         "(4, 2, 16)"),
        ("cache-shapes", dict(v_cache=vc[:, :2]), ValueError,
         "v_cache must have the shape of k_cache but for its last dimension [num_pages, "
         f"page_size, heads_kv, head_dim_v], got k_cache {tuple(kc.shape)} and v_cache "
         f"{tuple(vc[:, :2].shape)}"),
        ("head-dim", dict(q=q[:, :, :8]), ValueError,
         "q and k_cache must have the same head_dim (last dimension), got q 8 and k_cache 16"),
        ("gqa", dict(q=q[:, :3]), ValueError,
         "the heads of q must be a multiple of the heads of the caches (GQA/MQA), got heads_q=3 "
         "and heads_kv=2"),
        ("cache-strided", dict(k_cache=kc.transpose(1, 2).contiguous().transpose(1, 2)),
         ValueError, "k_cache must be contiguous (its pages are addressed packed, and appended to "
         "in place: pass the cache itself, not a copy)"),
        ("q-strided", dict(q=q.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
         "q: the last dimension (head_dim) must be contiguous (stride 1 element), got stride 4; "
         "call .contiguous() on it"),
        ("table-dtype", dict(block_table=table.long()), TypeError,
         "block_table must be an int32 tensor [batch, max_pages_per_seq], got torch.int64"),
        ("table-dims", dict(block_table=table[0]), ValueError,
         f"block_table must be 2-D [batch, max_pages_per_seq], got shape ({table.shape[1]},)"),
        ("seqused-dtype", dict(seqused_k=seqused.float()), TypeError,
         "seqused_k must be an int32 tensor [batch], got torch.float32"),
        ("cu-dtype", dict(cu_seqlens_q=cu_q.long()), TypeError,
         "cu_seqlens_q must be an int32 tensor (batch + 1 offsets), got torch.int64"),
        ("batch", dict(seqused_k=seqused[:1]), ValueError,
         "block_table has 2 rows and seqused_k 1 entries, but cu_seqlens_q describes 2 sequences"),
        ("append-together", dict(k_new=kn, v_new=vn), ValueError,
         "k_new, v_new and cu_seqlens_new go together (an append), or none"),
        ("k-new-shape", dict(append, k_new=kn[:, :1]), ValueError,
         "k_new must have shape [total_new, 2, 16], got (2, 1, 16)"),
        ("v-new-dtype", dict(append, v_new=vn.half()), TypeError,
         "v_new must have the dtype of q (torch.float32), got torch.float16"),
        ("k-new-strided", dict(append, k_new=torch.randn(2, 16, 2).transpose(1, 2)), ValueError,
         "k_new must be contiguous (the new rows are read packed); call .contiguous() on it"),
        ("new-rows", dict(append, v_new=vn[:1]), ValueError,
         "k_new and v_new must have the same number of rows (total_new), got 2 and 1"),
        ("cu-new-length", dict(append, cu_seqlens_new=cun[:2]), ValueError,
         "cu_seqlens_q and cu_seqlens_new must have the same length (batch + 1), got 3 and 2"),
        ("word", dict(device_check=torch.zeros(1, dtype=torch.int64)), TypeError,
         "device_check must be an int32 tensor (one element), got torch.int64"),
        ("sinks", dict(sinks=torch.zeros(3)), ValueError,
         "sinks must have shape (4,) [heads_q], got (3,)"),
        ("scale", dict(softmax_scale=math.inf), ValueError,
         "softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), got inf"),
    ]


def _op_args(call):
    """The op's positional arguments for a jfa.paged_attention keyword call."""
    window = call.get("window_size", (-1, -1))
    return (call["q"], call["k_cache"], call["v_cache"], call["block_table"], call["seqused_k"],
            call["cu_seqlens_q"], None, None, False, call.get("softmax_scale"), False,
            call.get("device_check"), window[0], window[1], 0.0, call.get("sinks"),
            call.get("k_new"), call.get("v_new"), call.get("cu_seqlens_new"))


def test_argument_errors_say_what_is_wrong(seed):
    """Through jfa.paged_attention and through the op itself, with and without autograd: the same
    exception and message for each bad argument."""
    base, cases = _error_cases(seed)
    for case_id, change, kind, message in cases:
        call = dict(base, **change)
        with pytest.raises(kind) as info:
            jfa.paged_attention(**call)
        assert str(info.value) == message, case_id
        for grad in (False, True):
            args = list(_op_args(call))
            if grad and args[0].dtype.is_floating_point:
                args[0] = args[0].detach().clone().requires_grad_(True)
            with pytest.raises(kind) as info:
                torch.ops.jfa.paged_attention(*args)
            assert str(info.value) == message, (case_id, grad)


def test_call_errors_of_the_python_layer_and_of_libjfa(seed):
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 4, [3, 6], [1, 2])
    with pytest.raises(TypeError, match="all be torch tensors or all numpy arrays"):
        jfa.paged_attention(q, kc.numpy(), vc, table, seqused, cu_q)
    with pytest.raises(TypeError, match="all be torch tensors or all numpy arrays"):
        jfa.paged_attention(q.numpy(), kc, vc, table, seqused, cu_q)
    with pytest.raises(TypeError, match="block_table must be a torch.Tensor, got list"):
        jfa.paged_attention(q, kc, vc, table.tolist(), seqused, cu_q)
    with pytest.raises(TypeError, match="k_new must be a torch.Tensor, got ndarray"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, k_new=np.zeros((0, 2, 16)),
                            v_new=torch.zeros(0, 2, 16), cu_seqlens_new=_i32([0, 0, 0]))
    with pytest.raises(TypeError, match=r"reference=True\) and q_tokens take numpy arrays"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, reference=True)
    with pytest.raises(TypeError, match="device_check is for torch tensors"):
        jfa.paged_attention(q.numpy(), kc.numpy(), vc.numpy(), table.numpy(), seqused.numpy(),
                            cu_q.numpy(), device_check=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="causal must be a bool"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, causal=1)
    with pytest.raises(ValueError, match="window_size left must be >= 0"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, window_size=(-2, 0))
    # Values: libjfa's checks, its message in a JfaError (a JfaInvalidArgumentError: a ValueError).
    bad = table.clone()
    bad[1, 0] = kc.shape[0]
    for direct in (False, True):
        call = ((lambda *a: torch.ops.jfa.paged_attention(*a, None, None, False, None, False))
                if direct else jfa.paged_attention)
        with pytest.raises(jfa.JfaInvalidArgumentError, match=r"block_table\[1\]\[0\]=") as info:
            call(q, kc, vc, bad, seqused, cu_q)
        assert info.value.function == "jfa_attention_forward_paged"
        with pytest.raises(jfa.JfaInvalidArgumentError, match=r"seqused_k\[0\]=999"):
            call(q, kc, vc, table, _i32([999, 6]), cu_q)
        with pytest.raises(jfa.JfaInvalidArgumentError, match=r"cu_seqlens_q\[2\]=4 must equal"):
            call(q, kc, vc, table, seqused, _i32([0, 1, 4]))
    with pytest.raises(jfa.JfaInvalidArgumentError, match="sinks"):
        jfa.paged_attention(q, kc, vc, table, seqused, cu_q, sinks=[math.nan, 0.0, 0.0, 0.0])


def test_device_check_word_on_the_cpu(seed):
    """The CPU backend checks on the host and stores 0 in the word; its version moves."""
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 4, [3, 6], [1, 2])
    word = torch.full((1,), -1, dtype=torch.int32)
    version = word._version
    jfa.paged_attention(q, kc, vc, table, seqused, cu_q, device_check=word)
    assert word.item() == 0 and word._version > version


def test_ops_have_one_schema_whichever_kind():
    """The op in use (native or ctypes) has the schema that the ctypes twin declares, word for
    word: the caches and the word marked written, the append last."""
    from jfa import _torch_ctypes_op

    op = torch.ops.jfa.paged_attention.default
    assert str(op._schema) == "jfa::" + _torch_ctypes_op.PAGED_SCHEMAS["paged_attention"]
    arguments = {a.name: a for a in op._schema.arguments}
    for name in ("k_cache", "v_cache", "device_check"):
        assert arguments[name].alias_info.is_write, name
    for name in ("q", "block_table", "seqused_k", "cu_seqlens_q", "k_new", "v_new", "sinks"):
        assert arguments[name].alias_info is None, name
    assert [a.name for a in op._schema.arguments[-3:]] == ["k_new", "v_new", "cu_seqlens_new"]
    assert len(op._schema.returns) == 2


def test_native_op_registered_from_cpp():
    import os

    from jfa import _torch_native

    if os.environ.get("JFA_TORCH_OPS") == "ctypes":
        assert jfa.torch_ops_kind() == "ctypes"
        return
    if not _torch_native.library_path().is_file():
        pytest.skip("libjfa_torch.so was not built (torch was not found at build time)")
    assert jfa.torch_ops_kind() == "native"
    dump = torch._C._dispatch_dump("jfa::paged_attention")
    for key in ("CPU", "CUDA"):
        line = next((x for x in dump.splitlines() if x.startswith(key + ":")), "")
        assert "src/torch/registration.cpp" in line, dump


def test_opcheck(seed):
    """torch.library.opcheck: the schema (the caches written by an append and declared so), the
    fake kernel, the autograd registration, and AOT dispatch with functionalization."""
    (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new, *_) = _append_case(
        seed, 4, [3, 9, 6], [1, 2, 0], [1, 2, 1])
    word = torch.full((1,), -1, dtype=torch.int32)
    sinks = torch.randn(4)
    calls = [(q, kc, vc, table, before, cu_q, 0, 0, True, None, return_lse, *extra)
             for return_lse in (False, True)
             for extra in ((), (word, 5, -1, 2.0, sinks),
                           (None, -1, -1, 0.0, None, k_new, v_new, cu_new),
                           (word, -1, -1, 0.0, None, k_new, v_new, cu_new))]
    op = torch.ops.jfa.paged_attention.default
    for args in calls:
        torch.library.opcheck(op, args)  # the default utils, AOT dispatch included
        grad_args = (args[0].clone().requires_grad_(True),) + args[1:]
        torch.library.opcheck(op, grad_args, test_utils=("test_schema",
                                                         "test_autograd_registration",
                                                         "test_faketensor"))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph(seed, dynamic):
    """torch.compile(fullgraph=True) of a decode step: the op stays in the graph, the results are
    the eager ones, the append lands in the caller's caches, and new hints or lengths do not
    recompile with dynamic=True."""
    full, added, len_q = [3, 9, 6], [1, 2, 0], [1, 2, 1]
    (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new, *_) = _append_case(
        seed, 4, full, added, len_q)
    sinks = torch.randn(4)

    def step(q, kc, vc, k_new, v_new, m):
        out, lse = jfa.paged_attention(q * 1.0, kc, vc, table, before, cu_q, max_seqlen_q=m,
                                       causal=True, return_lse=True, window_size=(5, 0),
                                       softcap=3.0, sinks=sinks, k_new=k_new, v_new=v_new,
                                       cu_seqlens_new=cu_new)
        return out + 0.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for m in (2, 3, 4) if dynamic else (2, 2, 2):
            caches = [(kc.clone(), vc.clone()) for _ in range(2)]
            eager = step(q, *caches[0], k_new, v_new, m)
            traced = compiled(q, *caches[1], k_new, v_new, m)
            for a, b in zip(eager, traced):
                assert torch.equal(a, b)
            assert torch.equal(caches[0][0], caches[1][0])
            assert torch.equal(caches[0][1], caches[1][1])
            assert not torch.equal(caches[1][0], kc)  # written
    # Errors raised while tracing are jfa's own (fullgraph reports them quoting the message).
    torch._dynamo.reset()
    bad = torch.compile(lambda q: jfa.paged_attention(q, kc, vc, table.long(), before, cu_q),
                        fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.Unsupported) as info:
        bad(q)
    assert "block_table must be an int32 tensor [batch, max_pages_per_seq]" in str(info.value)


def test_compile_inductor_writes_the_caches_in_place(seed):
    """With inductor (the default backend) the functionalized append is written back into the
    caller's caches."""
    (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new, k, v, cu_k, want_k, want_v) = \
        _append_case(seed, 4, [3, 9], [1, 2], [1, 2])

    def step(q, kc, vc):
        return jfa.paged_attention(q * 2.0, kc, vc, table, before, cu_q, causal=True,
                                   k_new=k_new, v_new=v_new, cu_seqlens_new=cu_new)

    torch._dynamo.reset()
    try:
        out = torch.compile(step, fullgraph=True)(q, kc, vc)
    except Exception as e:  # noqa: BLE001  (no C++ compiler for inductor's CPU code here)
        if "InductorError" in type(e).__name__ or "CppCompileError" in repr(e):
            pytest.skip(f"inductor cannot compile on this machine: {type(e).__name__}")
        raise
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert torch.equal(out, jfa.jagged_attention(q * 2.0, k, v, cu_q, cu_k, causal=True))


# ---- CUDA (Hopper): the paged kernels against the CPU backend ---------------------------------

def _decode_case(seed, dtype, batch=12, heads_q=32, heads_kv=8, d=128, page_size=16):
    used = [0, 1, 15, 16, 17, 31, 32, 33, 100, 257, 1000, 2048][:batch]
    return _case(seed, page_size, used, [1] * len(used), heads_q=heads_q, heads_kv=heads_kv, d=d,
                 dv=d, dtype=dtype, spare_pages=5, device="cuda"), max(used)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("local", [False, True], ids=["plain", "window-softcap-sinks"])
def test_cuda_decode_matches_the_cpu(seed, dtype, local):
    """Decode (one token per sequence), head_dim 128, GQA 4:1, page size 16, shuffled and shared
    pages: the CUDA kernels give what the CPU backend gives."""
    (q, kc, vc, table, seqused, cu_q, *_), longest = _decode_case(seed, dtype)
    sinks = torch.randn(32, generator=torch.Generator().manual_seed(seed)).cuda() if local else None
    extra = dict(window_size=(100, 0), softcap=20.0, sinks=sinks) if local else {}
    word = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    for hint_k in (None, longest):
        out, lse = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, max_seqlen_q=1,
                                       max_seqlen_k=hint_k, causal=True, return_lse=True,
                                       device_check=word, **extra)
        cpu = [t.cpu() for t in (q, kc, vc, table, seqused, cu_q)]
        cpu_extra = dict(extra, sinks=None if sinks is None else sinks.cpu())
        want, want_lse = jfa.paged_attention(*cpu, causal=True, return_lse=True, **cpu_extra)
        torch.cuda.synchronize()
        assert word.item() == 0, jfa.device_check_message(word.item())
        torch.testing.assert_close(out.cpu().float(), want.float(), **TOL[dtype])
        torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-3, rtol=1e-3)


@needs_cuda
def test_cuda_decode_is_graph_capturable(seed):
    """No host synchronization: the call captures into a CUDA graph, and a replay after new cache
    lengths are written into the same seqused_k gives the new result."""
    (q, kc, vc, table, seqused, cu_q, *_), longest = _decode_case(seed, torch.float16)
    graph, out = capture(lambda: jfa.paged_attention(q, kc, vc, table, seqused, cu_q,
                                                     max_seqlen_q=1, max_seqlen_k=longest,
                                                     causal=True))
    seqused.copy_(torch.clamp(seqused - 1, min=0))
    graph.replay()
    want = jfa.paged_attention(*(t.cpu() for t in (q, kc, vc, table, seqused, cu_q)),
                               causal=True)
    torch.testing.assert_close(out.cpu().float(), want.float(), **TOL[torch.float16])


def _paged_workspace_size(q, k_cache, batch, max_seqlen_q, max_seqlen_k):
    """libjfa's answer for a CUDA paged call of these sizes and hints (no buffer given)."""
    import ctypes

    from jfa import _library
    p, kv = _library.new_params(), _library.new_paged_kv()
    p.batch, p.total_q, p.heads_q, p.head_dim = batch, q.shape[0], q.shape[1], q.shape[2]
    p.heads_kv, p.head_dim_v = k_cache.shape[2], k_cache.shape[3]
    p.dtype = {torch.float16: _library.DTYPE_FLOAT16, torch.bfloat16: _library.DTYPE_BFLOAT16,
               torch.float32: _library.DTYPE_FLOAT32}[q.dtype]
    p.max_seqlen_q, p.max_seqlen_k = max_seqlen_q, max_seqlen_k
    p.backend = _library.BACKEND_CUDA
    size = ctypes.c_size_t(0)
    _library.call("jfa_attention_paged_workspace_size", ctypes.byref(p), ctypes.byref(kv),
                  ctypes.byref(size))
    return size.value


@needs_cuda
def test_cuda_workspace_comes_from_torch_s_allocator(seed):
    """Two long sequences split their keys over the SMs: the op asks libjfa for the workspace of
    the splits' partials (jfa_attention_paged_workspace_size) and takes it from torch's caching
    allocator, beside out, and the result is the CPU backend's."""
    used = [5000, 300]
    q, kc, vc, table, seqused, cu_q, *_ = _case(seed, 16, used, [1, 1], heads_q=32, heads_kv=8,
                                                d=128, dv=128, dtype=torch.float16, device="cuda")
    size = _paged_workspace_size(q, kc, 2, 1, max(used))
    assert size > 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = jfa.paged_attention(q, kc, vc, table, seqused, cu_q, max_seqlen_q=1,
                              max_seqlen_k=max(used), causal=True)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before >= size + out.numel() * out.element_size()
    want = jfa.paged_attention(*(t.cpu() for t in (q, kc, vc, table, seqused, cu_q)), causal=True)
    torch.testing.assert_close(out.cpu().float(), want.float(), **TOL[torch.float16])


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_append_matches_the_cpu(seed, dtype):
    """A decode and speculative step with the append on CUDA: the caches as the append must leave
    them, bit for bit, and the output the CPU backend gives; again from a CUDA graph replay after
    the caches were made stale, with the word of the checked mode 0."""
    full, added, len_q = [3, 40, 17, 300, 2, 33], [1, 4, 0, 2, 2, 16], [1, 4, 1, 2, 2, 16]
    (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new, k, v, cu_k, want_k,
     want_v) = _append_case(seed, 16, full, added, len_q, dtype=dtype, heads_q=8, heads_kv=2,
                            d=128, dv=128)
    want, want_lse = jfa.paged_attention(q, kc.clone(), vc.clone(), table, before, cu_q,
                                         causal=True, return_lse=True, k_new=k_new, v_new=v_new,
                                         cu_seqlens_new=cu_new)
    stale_k, stale_v = kc.cuda(), vc.cuda()
    dev = [t.cuda() for t in (q, kc, vc, table, before, cu_q, k_new, v_new, cu_new)]
    word = torch.full((1,), -1, dtype=torch.int32, device="cuda")

    def step():
        return jfa.paged_attention(dev[0], dev[1], dev[2], dev[3], dev[4], dev[5], max_seqlen_q=16,
                                   max_seqlen_k=max(full), causal=True, return_lse=True,
                                   k_new=dev[6], v_new=dev[7], cu_seqlens_new=dev[8],
                                   device_check=word)

    out, lse = step()
    torch.cuda.synchronize()
    assert word.item() == 0, jfa.device_check_message(word.item())
    assert torch.equal(dev[1].cpu(), want_k) and torch.equal(dev[2].cpu(), want_v)
    torch.testing.assert_close(out.cpu().float(), want.float(), **TOL[dtype])
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-3, rtol=1e-3)
    dev[1].copy_(stale_k)
    dev[2].copy_(stale_v)
    graph, (g_out, _) = capture(step)
    dev[1].copy_(stale_k)
    dev[2].copy_(stale_v)
    word.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert word.item() == 0, jfa.device_check_message(word.item())
    assert torch.equal(dev[1].cpu(), want_k) and torch.equal(dev[2].cpu(), want_v)
    torch.testing.assert_close(g_out.cpu().float(), want.float(), **TOL[dtype])


@needs_cuda
def test_cuda_refuses_a_table_elsewhere(seed):
    """A block table on the host is the op's ValueError."""
    (q, kc, vc, table, seqused, cu_q, *_), _ = _decode_case(seed, torch.float16, batch=3)
    with pytest.raises(ValueError, match=r"block_table must be on the device of q \(cuda:0\)"):
        jfa.paged_attention(q, kc, vc, table.cpu(), seqused, cu_q, max_seqlen_q=1)
