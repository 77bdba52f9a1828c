"""The torch path: the custom op on CUDA (Hopper) and on CPU, torch.compile, CUDA graphs,
autograd, torch.nested interop. Skipped, with the reason, where torch or a GPU is missing."""

import math
import os
import threading

import numpy as np
import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cuda_graphs import capture  # noqa: E402
from cuda_pool import default_pool_peak  # noqa: E402
from cuda_skip import cuda_skip_reason  # noqa: E402
from jfa_reference import attention_ref  # noqa: E402


_CUDA_REASON = cuda_skip_reason()
needs_cuda = pytest.mark.skipif(bool(_CUDA_REASON), reason=_CUDA_REASON or "n/a")

TOL = {torch.float16: dict(atol=4e-3, rtol=4e-3), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float32: dict(atol=5e-5, rtol=5e-5)}


def _offsets(lengths, device):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)


def _inputs(seed, lengths_q, lengths_k, hq, hkv, d, dtype, device, d_v=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths_k = lengths_q if lengths_k is None else lengths_k
    cu_q, cu_k = _offsets(lengths_q, device), _offsets(lengths_k, device)
    tq, tk = int(sum(lengths_q)), int(sum(lengths_k))
    q = torch.randn((tq, hq, d), generator=g).to(device=device, dtype=dtype)
    k = torch.randn((tk, hkv, d), generator=g).to(device=device, dtype=dtype)
    v = torch.randn((tk, hkv, d if d_v is None else d_v), generator=g).to(device=device,
                                                                          dtype=dtype)
    return q, k, v, cu_q, cu_k


def sdpa_reference(q, k, v, cu_q, cu_k, causal, scale=None):
    """Per-sequence torch SDPA in float32, bottom-right causal mask; lse by explicit logsumexp."""
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    hq, d = q.shape[1], q.shape[2]
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((hq, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = qe - qs, ke - ks
        if lq == 0 or lk == 0:
            continue
        Q = q[qs:qe].float().transpose(0, 1)  # [hq, lq, d]
        K = k[ks:ke].float().transpose(0, 1).repeat_interleave(group, dim=0)
        V = v[ks:ke].float().transpose(0, 1).repeat_interleave(group, dim=0)
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        visible = (j <= i + (lk - lq)) if causal else torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        rows = visible.any(dim=1)
        o = F.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=visible,
                                           scale=scale)[0]
        o = torch.where(rows[None, :, None], o, 0.0)
        s = torch.where(visible, scale * Q @ K.transpose(1, 2), -math.inf)
        out[qs:qe] = o.transpose(0, 1)
        lse[:, qs:qe] = torch.logsumexp(s, dim=-1)
    return out, lse


def _compare(out, lse, ref_out, ref_lse, dtype):
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref_out, **TOL[dtype])
    no_keys = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), no_keys)
    torch.testing.assert_close(lse[~no_keys], ref_lse[~no_keys], atol=1e-3, rtol=1e-4)


CASES = {
    "self": ([0, 1, 127, 129, 300, 64, 2], None),
    "cross": ([5, 0, 200, 1, 130, 64], [9, 4, 0, 1, 257, 64]),
}


# ---- CUDA ----------------------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_matches_sdpa(seed, dtype, head_dim, causal, heads, case):
    lq, lk = CASES[case]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, heads[0], heads[1], head_dim, dtype, "cuda")
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, max(lq), max(lk or lq), causal=causal,
                                    return_lse=True)
    assert out.device == q.device and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (heads[0], q.shape[0]) and lse.dtype == torch.float32
    _compare(out, lse, *sdpa_reference(q, k, v, cu_q, cu_k, causal), dtype)


@needs_cuda
def test_cuda_no_hints_strided_and_scale(seed):
    """Views of a packed qkv buffer, no max_seqlen hints, a custom scale, a side stream."""
    lengths = [33, 0, 150, 1, 77]
    cu = _offsets(lengths, "cuda")
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn((sum(lengths), 3, 4, 64), generator=g).to("cuda", torch.float16)
    q, k, v = qkv.unbind(1)
    assert not q.is_contiguous()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, softmax_scale=0.2, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    _compare(out, lse, *sdpa_reference(q, k, v, cu, cu, True, 0.2), torch.float16)


@needs_cuda
def test_cuda_no_host_sync(seed):
    """The op and the helpers given max_len/total never synchronize with the host."""
    lengths = [17, 0, 90, 5]
    q, k, v, cu, _ = _inputs(seed, lengths, None, 4, 4, 64, torch.bfloat16, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = jfa.jagged_attention(q, k, v, cu, causal=True)
        padded = jfa.pad(out, cu, max_len=90)
        back = jfa.unpad(padded, cu, total=q.shape[0])
        cu2 = jfa.lengths_to_offsets(cu[1:] - cu[:-1])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(back, out) and torch.equal(cu2, cu)
    torch.testing.assert_close(out.float(), sdpa_reference(q, k, v, cu, cu, True)[0],
                               **TOL[torch.bfloat16])


@needs_cuda
@pytest.mark.parametrize("return_lse, dynamic", [(False, False), (True, False), (True, True)],
                         ids=["out", "out-lse", "out-lse-dynamic"])
def test_cuda_torch_compile_fullgraph(seed, return_lse, dynamic):
    q, k, v, cu, _ = _inputs(seed, [40, 0, 129, 7], None, 8, 2, 128, torch.float16, "cuda")

    def f(q, k, v, cu):
        return jfa.jagged_attention(q * 1.0, k, v, cu, max_seqlen_q=129, max_seqlen_k=129,
                                    causal=True, return_lse=return_lse)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    got, want = compiled(q, k, v, cu), f(q, k, v, cu)
    if return_lse:
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)
    else:
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    # New lengths in a new offsets tensor of the same shape: same graph, new result.
    cu2 = _offsets([100, 50, 20, 6], "cuda")
    torch.testing.assert_close(compiled(q, k, v, cu2), f(q, k, v, cu2), atol=0, rtol=0)
    if dynamic:  # another total and batch size through the same dynamic-shape graph
        q3, k3, v3, cu3, _ = _inputs(seed + 1, [3, 0, 120], None, 8, 2, 128, torch.float16, "cuda")
        torch.testing.assert_close(compiled(q3, k3, v3, cu3), f(q3, k3, v3, cu3), atol=0, rtol=0)


@needs_cuda
@pytest.mark.parametrize("hints", [True, False], ids=["hints", "no-hints"])
def test_cuda_graph_replay_with_new_lengths(seed, hints):
    lengths_a, lengths_b = [100, 28, 0, 128, 1], [1, 200, 55, 0, 1]  # same total (257)
    q, k, v, cu, _ = _inputs(seed, lengths_a, None, 8, 4, 64, torch.float16, "cuda")
    max_len = max(max(lengths_a), max(lengths_b)) if hints else None

    def run():
        return jfa.jagged_attention(q, k, v, cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
                                    causal=True, return_lse=True)

    graph, (out, lse) = capture(run)

    graph.replay()
    torch.cuda.synchronize()
    _compare(out, lse, *sdpa_reference(q, k, v, cu, cu, True), torch.float16)

    cu.copy_(_offsets(lengths_b, "cuda"))
    g = torch.Generator().manual_seed(seed + 1)
    q.copy_(torch.randn(q.shape, generator=g).to(q))
    graph.replay()
    torch.cuda.synchronize()
    _compare(out, lse, *sdpa_reference(q, k, v, cu, cu, True), torch.float16)


@needs_cuda
def test_cuda_errors(seed):
    q, k, v, cu, _ = _inputs(seed, [5, 9], None, 2, 2, 64, torch.float16, "cuda")
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be on the device of q \(cuda:0\), got cpu"):
        jfa.jagged_attention(q, k, v, cu.cpu())
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 tensor"):
        jfa.jagged_attention(q, k, v, cu.long())
    with pytest.raises(ValueError, match="q, k and v must be on the same device"):
        jfa.jagged_attention(q, k.cpu(), v, cu)
    with pytest.raises(ValueError, match=r"k: the last dimension \(head_dim\) must be contiguous"):
        jfa.jagged_attention(q, k.transpose(1, 2).contiguous().transpose(1, 2), v, cu)
    with pytest.raises(TypeError, match="all be torch tensors or all numpy arrays"):
        jfa.jagged_attention(q, k.cpu().numpy(), v, cu)
    with pytest.raises(jfa.JfaUnsupportedError, match="float32 is not supported on CUDA"):
        jfa.jagged_attention(q.float(), k.float(), v.float(), cu)
    qq = torch.zeros((14, 2, 80), dtype=torch.float16, device="cuda")
    with pytest.raises(jfa.JfaUnsupportedError, match="head_dim 80"):
        jfa.jagged_attention(qq, qq, qq, cu)


@needs_cuda
def test_cuda_jagged_helpers_and_nested(seed):
    lengths = [3, 7, 1, 12]
    cu = jfa.lengths_to_offsets(torch.tensor(lengths, device="cuda"))
    assert cu.dtype == torch.int32 and cu.device.type == "cuda"
    assert cu.tolist() == [0, 3, 10, 11, 23]
    g = torch.Generator().manual_seed(seed)
    values = torch.randn((23, 4, 64), generator=g).to("cuda", torch.float16)
    padded = jfa.pad(values, cu, padding_value=-1.0)
    assert padded.shape == (4, 12, 4, 64)
    assert (padded[0, 3:] == -1).all() and torch.equal(padded[3], values[11:])
    assert torch.equal(jfa.unpad(padded, cu), values)

    nt = jfa.to_nested(values, cu)
    assert nt.is_nested and nt.layout == torch.jagged and nt.size(0) == 4
    for b, part in enumerate(nt.unbind()):
        assert torch.equal(part, values[cu[b]:cu[b + 1]])
    vals, cu2 = jfa.from_nested(nt)
    assert vals.data_ptr() == values.data_ptr() and cu2.dtype == torch.int32
    assert torch.equal(cu2, cu)
    out = jfa.jagged_attention(vals, vals, vals, cu2, causal=True)
    torch.testing.assert_close(out.float(), sdpa_reference(values, values, values, cu, cu, True)[0],
                               **TOL[torch.float16])


# ---- CPU (torch tensors on the CPU backend) ------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_matches_reference(seed, dtype, causal):
    lq, lk = [5, 0, 33, 1, 70], [9, 4, 0, 1, 64]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, 4, 2, 32, dtype, "cpu")
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (4, q.shape[0])
    ref_out, ref_lse = attention_ref(q.double().numpy(), k.double().numpy(), v.double().numpy(),
                                     cu_q.numpy(), cu_k.numpy(), causal=causal)
    _compare(out, lse, torch.from_numpy(ref_out).float(), torch.from_numpy(ref_lse).float(), dtype)
    sdpa_out, _ = sdpa_reference(q, k, v, cu_q, cu_k, causal)
    torch.testing.assert_close(out.float(), sdpa_out, **TOL[dtype])


def test_cpu_op_registered_and_opcheck(seed):
    assert hasattr(torch.ops.jfa, "jagged_attention_fwd")
    q, k, v, cu, _ = _inputs(seed, [3, 0, 6], None, 2, 1, 16, torch.float32, "cpu")
    q.requires_grad_(True)
    word = torch.full((1,), -1, dtype=torch.int32)
    for return_lse in (False, True):
        for extra in ((), (False, word)):
            args = (q, k, v, cu, cu, 0, 0, True, None, return_lse, *extra)
            torch.library.opcheck(torch.ops.jfa.jagged_attention_fwd.default, args,
                                  test_utils=("test_schema", "test_autograd_registration",
                                              "test_faketensor"))
    # The written word through AOT dispatch, with the autograd formula (the CPU is deterministic).
    torch.library.opcheck(torch.ops.jfa.jagged_attention_fwd.default,
                          (q, k, v, cu, cu, 0, 0, True, None, True), {"device_check": word})


def _reference_with_grads(q, k, v, cu_q, cu_k, causal, grad_out, grad_lse):
    """Gradients of sum(grad_out * out) + sum(grad_lse * lse) (rows with a key) by torch autograd
    over a per-sequence float64 attention, bottom-right causal mask."""
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    hq, d = q.shape[1], q.shape[2]
    group = hq // k.shape[1]
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    loss = qd.new_zeros(())
    for b in range(len(cu_q) - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        qs = qd[cu_q[b]:cu_q[b + 1]]
        ks = kd[cu_k[b]:cu_k[b + 1]].repeat_interleave(group, 1)
        vs = vd[cu_k[b]:cu_k[b + 1]].repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(d)
        if causal:
            i = torch.arange(lq)[:, None]
            j = torch.arange(lk)[None, :]
            s = s.masked_fill(j > i + lk - lq, float("-inf"))
        lse = torch.logsumexp(s, -1)
        seen = torch.isfinite(lse)
        p = torch.where(seen[..., None], torch.exp(s - torch.where(seen, lse, 0)[..., None]), 0)
        out = torch.einsum("hqk,khd->qhd", p, vs)
        loss = loss + (out * grad_out[cu_q[b]:cu_q[b + 1]].double()).sum()
        loss = loss + torch.where(seen, lse * grad_lse[:, cu_q[b]:cu_q[b + 1]].double(), 0).sum()
    loss.backward()
    return qd.grad, kd.grad, vd.grad


GRAD_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("use_lse", [False, True], ids=["out", "out+lse"])
def test_cpu_backward_matches_float64_autograd(seed, dtype, causal, use_lse):
    lq, lk = [5, 0, 33, 1, 70, 64], [9, 4, 0, 1, 64, 65]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, 4, 2, 32, dtype, "cpu")
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    grad_lse = torch.randn(lse.shape, generator=g) if use_lse else torch.zeros(lse.shape)
    loss = (out.float() * grad_out.float()).sum()
    if use_lse:
        loss = loss + torch.where(torch.isfinite(lse), lse * grad_lse, 0).sum()
    loss.backward()
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                               _reference_with_grads(q, k, v, cu_q, cu_k, causal, grad_out,
                                                     grad_lse)):
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.isfinite(got).all(), name
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err <= GRAD_TOL[dtype], f"{name}: relative error {err}"


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_cpu_gradcheck(seed):
    """torch.autograd.gradcheck in float32 (jfa takes 16- and 32-bit floats; the float64 oracle is
    checked against finite differences in the C++ tests)."""
    q, k, v, cu_q, cu_k = _inputs(seed, [2, 3, 0], [3, 1, 2], 2, 1, 4, torch.float32, "cpu")
    for t in (q, k, v):
        t.requires_grad_(True)

    def f(q, k, v):
        out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
        return out, torch.where(torch.isfinite(lse), lse, 0)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-3)


def test_cpu_backward_op_opcheck(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 0, 6], None, 2, 1, 16, torch.float32, "cpu")
    out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, return_lse=True)
    grad_out = torch.randn_like(out)
    word = torch.full((1,), -1, dtype=torch.int32)
    for grad_lse in (None, torch.randn_like(lse)):
        for extra in ((), (word,)):
            args = (grad_out, q, k, v, out, lse, cu, cu, 0, 0, True, None, grad_lse, False, *extra)
            torch.library.opcheck(torch.ops.jfa.jagged_attention_bwd.default, args,
                                  test_utils=("test_schema", "test_faketensor"))


# (head_dim, head_dim_v): v, out, grad_out and dv with a head size of their own.
HEAD_DIMS_V = [(192, 128), (32, 64), (8, 3), (1, 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims", HEAD_DIMS_V, ids=lambda d: f"d{d[0]}-dv{d[1]}")
def test_cpu_head_dim_v_forward_and_gradients(seed, dtype, causal, dims):
    d, d_v = dims
    lq, lk = [5, 0, 33, 1, 70], [9, 4, 0, 1, 64]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, 4, 2, d, dtype, "cpu", d_v)
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == (q.shape[0], 4, d_v)
    ref_out, ref_lse = attention_ref(*(t.detach().double().numpy() for t in (q, k, v)),
                                     cu_q.numpy(), cu_k.numpy(), causal=causal)
    _compare(out.detach(), lse.detach(), torch.from_numpy(ref_out).float(),
             torch.from_numpy(ref_lse).float(), dtype)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    grad_lse = torch.randn(lse.shape, generator=g)
    loss = (out.float() * grad_out.float()).sum()
    (loss + torch.where(torch.isfinite(lse), lse * grad_lse, 0).sum()).backward()
    want = _reference_with_grads(q, k, v, cu_q, cu_k, causal, grad_out, grad_lse)
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want):
        assert got.dtype == dtype and got.shape == ref.shape, name
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err <= GRAD_TOL[dtype], f"{name}: relative error {err}"


def test_cpu_head_dim_v_opcheck_and_compile(seed):
    """Both ops' fake kernels give v's head_dim to out and dv (opcheck), and a compiled training
    step (aot_eager traces the fake kernels) equals the eager one."""
    q, k, v, cu, _ = _inputs(seed, [3, 0, 6], None, 2, 1, 16, torch.float32, "cpu", 24)
    for return_lse in (False, True):
        torch.library.opcheck(torch.ops.jfa.jagged_attention_fwd.default,
                              (q, k, v, cu, cu, 0, 0, True, None, return_lse),
                              test_utils=("test_schema", "test_faketensor"))
    out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, return_lse=True)
    args = (torch.randn_like(out), q, k, v, out, lse, cu, cu, 0, 0, True, None, None, False)
    torch.library.opcheck(torch.ops.jfa.jagged_attention_bwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    with pytest.raises(ValueError, match=r"grad_out must have the shape of out .* \(9, 2, 24\)"):
        torch.ops.jfa.jagged_attention_bwd(torch.randn_like(q), *args[1:])

    def f(q, k, v, cu):
        return jfa.jagged_attention(q, k, v, cu, causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, cu)
        assert out.shape == (9, 2, 24)
        out.square().sum().backward()
        assert leaves[2].grad.shape == v.shape
        results.append([out.detach()] + [t.grad for t in leaves])
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager)


@pytest.mark.parametrize("with_word", [False, True], ids=["plain", "offsets-check"])
def test_cpu_compile_fullgraph_training_step(seed, with_word):
    """A compiled forward with autograd: the backward op is in the traced graph and the gradients
    equal eager ones; a checked-mode word passes through the graph (two layers share it) and is
    written."""
    q, k, v, cu, _ = _inputs(seed, [4, 11, 0, 1], None, 2, 2, 16, torch.float32, "cpu")

    def f(q, k, v, cu, word):
        out = jfa.jagged_attention(q, k, v, cu, causal=True, device_check=word)
        return jfa.jagged_attention(out, k, v, cu, device_check=word) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (f, compiled):
        word = torch.full((1,), -1, dtype=torch.int32) if with_word else None
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, cu, word)
        assert word is None or word.item() == 0
        out.square().sum().backward()
        assert word is None or word.item() == 0
        grads.append([t.grad for t in leaves])
    for eager, traced in zip(*grads):
        torch.testing.assert_close(traced, eager)


def test_cpu_deterministic_gradients(seed):
    q, k, v, cu, _ = _inputs(seed, [40, 0, 77], None, 4, 2, 32, torch.bfloat16, "cpu")
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = jfa.jagged_attention(*leaves, cu, causal=True, deterministic=True)
        out.float().square().sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        jfa.jagged_attention(q, k, v, cu, deterministic=1)


def test_cpu_double_backward_is_a_clear_error(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 5], None, 2, 2, 8, torch.float32, "cpu")
    for t in (q, k, v):
        t.requires_grad_(True)
    out = jfa.jagged_attention(q, k, v, cu)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_q.sum().backward()


def _ops_of_a_step(q, k, v, cu, **kw):
    """The names of the dispatcher ops (aten::*, jfa::*) that one forward of jfa.jagged_attention
    and its backward through torch.autograd.grad record in the profiler, leaving out those that a
    jfa op runs inside itself (the ctypes op allocates its outputs with aten::empty)."""
    from torch.profiler import ProfilerActivity, profile
    grad_out = torch.randn(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = jfa.jagged_attention(q, k, v, cu, **kw)
        torch.autograd.grad(out, (q, k, v), grad_out)

    def inside_a_jfa_op(e):
        while e.cpu_parent is not None:
            e = e.cpu_parent
            if e.name.startswith("jfa::"):
                return True
        return False

    return [e.name for e in prof.events() if "::" in e.name and not e.name.startswith("autograd::")
            and not inside_a_jfa_op(e)]


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(3, 0), softcap=5.0)],
                         ids=["causal", "local"])
def test_cpu_autograd_step_calls_the_two_ops_and_nothing_else(seed, kw):
    """Through autograd a step runs the forward op and the backward op once each: no zeros for the
    LSE's unused gradient, no copies, nothing between autograd and the kernels."""
    q, k, v, cu, _ = _inputs(seed, [5, 0, 9], None, 2, 1, 16, torch.float32, "cpu")
    for t in (q, k, v):
        t.requires_grad_(True)
    ops = _ops_of_a_step(q, k, v, cu, **kw)
    assert sorted(ops) == ["jfa::jagged_attention_bwd", "jfa::jagged_attention_fwd"], ops


def test_cpu_unused_output_gradients_are_not_materialized(seed):
    """Only the output used by the loss brings a gradient: the LSE alone, the output alone, both;
    through jfa.jagged_attention and the op called directly, whose formulas agree."""
    q, k, v, cu, _ = _inputs(seed, [4, 7], None, 2, 2, 8, torch.float32, "cpu")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    fns = {"jfa": lambda *t: jfa.jagged_attention(*t, cu, causal=True, return_lse=True),
           "op": lambda *t: torch.ops.jfa.jagged_attention_fwd(*t, cu, cu, 0, 0, True, None, True)}
    grads = {}
    for name, fn in fns.items():
        for use in ("out", "lse", "both"):
            out, lse = fn(*leaves)
            loss = {"out": out.square().sum(), "lse": lse.sum(),
                    "both": out.square().sum() + lse.sum()}[use]
            grads[name, use] = torch.autograd.grad(loss, leaves)
    for use in ("out", "lse", "both"):
        for a, b in zip(grads["jfa", use], grads["op", use]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b, c in zip(grads["jfa", "out"], grads["jfa", "lse"], grads["jfa", "both"]):
        torch.testing.assert_close(a + b, c, rtol=1e-5, atol=1e-6)
        assert a.abs().max() > 0
    dq, dk, dv = grads["jfa", "lse"]  # the LSE depends on q and k, not on v
    assert dq.abs().max() > 0 and dk.abs().max() > 0 and not dv.any()


@needs_cuda
def test_cuda_autograd_step_launches_the_ops_kernels_and_nothing_else(seed):
    """Through autograd a step launches the same kernels as the two ops called directly (the
    profiler's kernel lists), and nothing else."""
    from torch.profiler import ProfilerActivity, profile
    q, k, v, cu, _ = _inputs(seed, [300, 17, 1000], None, 4, 2, 128, torch.bfloat16, "cuda")
    grad_out = torch.randn_like(q)

    def kernels(step):
        step()  # warm: workspace, lazy module loads
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return sorted(e.name for e in prof.events() if e.device_type.name == "CUDA")

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def through_autograd():
        torch.autograd.grad(jfa.jagged_attention(*leaves, cu, causal=True), leaves, grad_out)

    def ops_directly():
        out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, 1000, 1000, True, None,
                                                      True)
        torch.ops.jfa.jagged_attention_bwd(grad_out, q, k, v, out, lse, cu, cu, 1000, 1000, True,
                                           None, None, False)

    direct = kernels(ops_directly)
    assert direct, "the profiler recorded no kernel"
    assert kernels(through_autograd) == direct


def test_cpu_backward_needs_the_forward_lse(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 2], None, 1, 1, 8, torch.float32, "cpu")
    v.requires_grad_(True)
    out, _ = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, 0, 0, False, None, False)
    with pytest.raises(RuntimeError, match="return_lse=True"):
        out.sum().backward()
    with torch.no_grad():
        assert not jfa.jagged_attention(q, k, v, cu).requires_grad


def test_cpu_errors(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 2], None, 2, 2, 8, torch.float32, "cpu")
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 tensor"):
        jfa.jagged_attention(q, k, v, cu.long())
    with pytest.raises(TypeError, match="cu_seqlens_k must be an int32 tensor"):
        jfa.jagged_attention(q, k, v, cu, cu.to(torch.int16))
    with pytest.raises(ValueError, match="cu_seqlens_q must be 1-D"):
        jfa.jagged_attention(q, k, v, cu[None])
    with pytest.raises(TypeError, match="q must be float16, bfloat16 or float32"):
        jfa.jagged_attention(q.double(), k.double(), v.double(), cu)
    with pytest.raises(TypeError, match="same dtype"):
        jfa.jagged_attention(q, k.half(), v, cu)
    with pytest.raises(ValueError, match="multiple of the heads of k"):
        jfa.jagged_attention(q[:, :1].repeat(1, 3, 1), k, v, cu)
    with pytest.raises(ValueError, match="v: token and head strides must be positive"):
        jfa.jagged_attention(q, k, v[:1].expand(5, 2, 8), cu)
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"cu_seqlens_q\[0\] must be 0"):
        jfa.jagged_attention(q, k, v, cu + 1)
    with pytest.raises(ValueError, match="same length"):
        jfa.jagged_attention(q, k, v, cu, cu[:2])


def test_cpu_device_check_word_is_set_to_zero(seed):
    """The checked mode on the CPU: the host checks the offsets, the forward and (through autograd)
    the backward store 0 in the word, and torch sees the writes (the version counter moves)."""
    q, k, v, cu_q, cu_k = _inputs(seed, [3, 0, 5], [2, 4, 1], 2, 1, 8, torch.float32, "cpu")
    for shape in ((1,), (), (1, 1)):
        word = torch.full(shape, -1, dtype=torch.int32)
        before = word._version
        out = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=True, device_check=word)
        assert word.item() == 0 and word._version > before
        torch.testing.assert_close(out, jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=True))
    with torch.inference_mode():
        word = torch.full((1,), -1, dtype=torch.int32)
        jfa.jagged_attention(q, k, v, cu_q, cu_k, device_check=word)
        assert word.item() == 0

    word = torch.full((1,), -1, dtype=torch.int32)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = jfa.jagged_attention(*leaves, cu_q, cu_k, return_lse=True, device_check=word)
    assert word.item() == 0
    word.fill_(-1)  # the word is not saved for the backward: writing it in between is fine
    (out.sum() + torch.where(torch.isfinite(lse), lse, 0).sum()).backward()
    assert word.item() == 0, "the backward checks into the same word"
    for t in leaves:
        assert t.grad is not None and torch.isfinite(t.grad).all()

    # The ops themselves, the word by keyword.
    word.fill_(-1)
    fwd_out, fwd_lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu_q, cu_k, 0, 0, False, None,
                                                          True, device_check=word)
    assert word.item() == 0
    word.fill_(-1)
    torch.ops.jfa.jagged_attention_bwd(torch.ones_like(fwd_out), q, k, v, fwd_out, fwd_lse, cu_q,
                                       cu_k, 0, 0, False, None, None, False, device_check=word)
    assert word.item() == 0


def test_cpu_device_check_errors(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 2], None, 2, 2, 8, torch.float32, "cpu")
    for bad in (0, [0], np.zeros(1, dtype=np.int32)):
        with pytest.raises(TypeError, match="device_check must be a torch.Tensor"):
            jfa.jagged_attention(q, k, v, cu, device_check=bad)
    for dtype in (torch.int64, torch.float32, torch.uint8):
        with pytest.raises(TypeError, match=r"device_check must be an int32 tensor \(one "
                                            rf"element\), got {dtype}"):
            jfa.jagged_attention(q, k, v, cu, device_check=torch.zeros(1, dtype=dtype))
    for shape in ((2,), (0,), (1, 2)):
        with pytest.raises(ValueError, match=r"device_check must have exactly one element, got "
                                             rf"shape \({', '.join(map(str, shape))},?\)"):
            jfa.jagged_attention(q, k, v, cu, device_check=torch.zeros(shape, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"device_check must be on the device of q \(cpu\), got "
                                         "meta"):
        jfa.jagged_attention(q, k, v, cu, device_check=torch.empty(1, dtype=torch.int32,
                                                                    device="meta"))
    # The ops check too (the native op in C++, with the same messages and exceptions), forward and
    # backward.
    out, lse = jfa.jagged_attention(q, k, v, cu, return_lse=True)
    calls = (lambda w: torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, 0, 0, False, None,
                                                           False, False, w),
             lambda w: torch.ops.jfa.jagged_attention_bwd(out, q, k, v, out, lse, cu, cu, 0, 0,
                                                          False, None, None, False, w))
    for call in calls:
        with pytest.raises(TypeError, match="device_check must be an int32"):
            call(torch.zeros(1, dtype=torch.int64))
        with pytest.raises(ValueError, match="device_check must have exactly one"):
            call(torch.zeros(2, dtype=torch.int32))
    # libjfa refuses a word inside a buffer of the call.
    with pytest.raises(jfa.JfaInvalidArgumentError, match="device_check"):
        jfa.jagged_attention(q, k, v, cu, device_check=cu[1:2])
    # numpy calls check their host offsets on every call: no word to give.
    with pytest.raises(TypeError, match="device_check is for torch tensors"):
        jfa.jagged_attention(q.numpy(), k.numpy(), v.numpy(), cu.numpy(),
                             device_check=torch.zeros(1, dtype=torch.int32))


def test_torch_without_the_private_autograd_api_leaves_numpy_working():
    """A torch that lacks the internals the autograd registration uses (a future release may move
    them): `import jfa` still works, torch support is reported unavailable with the missing name,
    the numpy path runs, and a torch tensor gets the reason."""
    import subprocess
    import sys

    python_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    code = "\n".join([
        "import sys; sys.path.insert(0, %r)" % python_dir,
        "import numpy as np, torch, torch._library.autograd as a",
        "del a.make_autograd_impl",
        "import jfa",
        "assert not jfa.torch_available()",
        "print(jfa.torch_unavailable_reason())",
        "q = np.random.default_rng(0).standard_normal((5, 2, 64)).astype(np.float16)",
        "cu = np.array([0, 2, 5], dtype=np.int32)",
        "assert np.isfinite(jfa.jagged_attention(q, q, q, cu).astype(np.float32)).all()",
        "try:",
        "    jfa.jagged_attention(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q),",
        "                         torch.from_numpy(cu))",
        "except TypeError as e:",
        "    print(e)",
        "else:",
        "    raise SystemExit('a torch tensor was accepted without torch support')",
    ])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    reason, error = r.stdout.strip().splitlines()
    assert "make_autograd_impl" in reason and "cannot be registered" in reason, reason
    assert "make_autograd_impl" in error


def test_device_check_message():
    """The texts of jfa_device_check_message (the bits of jfa_device_check_bits in jfa.h)."""
    assert "device_check_message" in jfa.__all__
    assert jfa.device_check_message(0) == "valid"
    assert jfa.device_check_message(2) == "cu_seqlens_q decreases"  # JFA_OFFSETS_Q_DECREASING
    assert jfa.device_check_message(64) == "cu_seqlens_k[batch] is not total_k"
    assert "NaN or infinite" in jfa.device_check_message(256)  # JFA_CHECK_RESULT_NOT_FINITE
    assert (jfa.device_check_message(1 | 8 | 32) ==
            "cu_seqlens_q[0] is not 0; a q length is above max_seqlen_q; cu_seqlens_k decreases")
    assert (jfa.device_check_message(4 | 128 | 1024) == "cu_seqlens_q[batch] is not total_q; "
            "a k length is above max_seqlen_k; unknown bits 1024")
    assert jfa.device_check_message(np.int32(16)) == "cu_seqlens_k[0] is not 0"
    word = torch.tensor([2], dtype=torch.int32)
    assert jfa.device_check_message(word) == "cu_seqlens_q decreases"
    with pytest.raises(TypeError, match="word must be an int, got str"):
        jfa.device_check_message("2")
    with pytest.raises(TypeError, match="word must be an int, got bool"):
        jfa.device_check_message(True)
    with pytest.raises(ValueError, match="word must fit in int32"):
        jfa.device_check_message(2**31)


def test_cpu_lists_as_offsets(seed):
    q, k, v, cu, _ = _inputs(seed, [3, 2], None, 2, 2, 8, torch.float32, "cpu")
    torch.testing.assert_close(jfa.jagged_attention(q, k, v, [0, 3, 5]),
                               jfa.jagged_attention(q, k, v, cu))


def test_cpu_jagged_helpers(seed):
    cu = jfa.lengths_to_offsets(torch.tensor([2, 0, 5]))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 2, 7]
    assert jfa.lengths_to_offsets([1, 2], device="cpu").tolist() == [0, 1, 3]
    with pytest.raises(ValueError, match=r"lengths\[1\]=-1 must be >= 0"):
        jfa.lengths_to_offsets(torch.tensor([1, -1]))
    assert jfa.max_length(cu) == 5
    assert jfa.offsets_to_lengths(cu).tolist() == [2, 0, 5]
    values = torch.arange(7 * 3, dtype=torch.float64).reshape(7, 3)
    padded = jfa.pad(values, cu, padding_value=-1)
    assert padded.shape == (3, 5, 3) and (padded[1] == -1).all()
    assert torch.equal(jfa.unpad(padded, cu), values)
    # numpy and torch agree
    np_padded = jfa.pad(values.float().numpy(), cu.numpy(), padding_value=-1)
    assert np.array_equal(np_padded, padded.float().numpy())
    with pytest.raises(ValueError, match="sequence 2 has length 5 > max_len 4"):
        jfa.pad(values, cu, max_len=4)
    with pytest.raises(ValueError, match="must equal the total 6"):
        jfa.pad(values[:6], cu)
    with pytest.raises(ValueError, match="non-decreasing"):
        jfa.validate_offsets(torch.tensor([0, 3, 2], dtype=torch.int32))
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(5, 3)], layout=torch.jagged)
    vals, offs = jfa.from_nested(nt)
    assert vals.shape == (7, 3) and offs.tolist() == [0, 2, 7] and offs.dtype == torch.int32
    strided = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(5, 3)])
    with pytest.raises(ValueError, match="layout=torch.jagged"):
        jfa.from_nested(strided)


def test_to_nested_rejects_offsets_that_pad_rejects():
    """to_nested checks CPU offsets as pad, unpad and jagged_attention do (offsets past the
    values, a decrease, a first offset not 0, a sequence over max_seqlen), and from_nested does
    not hand back offsets that do not address its values."""
    values = torch.randn(20, 2, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\]=21 must equal the total 20"):
        jfa.to_nested(values, torch.tensor([0, 3, 3, 21], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\]=19 must equal the total 20"):
        jfa.to_nested(values, torch.tensor([0, 3, 19], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        jfa.to_nested(values, torch.tensor([0, 5, 3, 20], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\] must be 0"):
        jfa.to_nested(values, torch.tensor([1, 5, 20], dtype=torch.int64))
    with pytest.raises(ValueError, match="sequence 1 has length 15 > max_len 10"):
        jfa.to_nested(values, torch.tensor([0, 5, 20], dtype=torch.int32), max_seqlen=10)
    with pytest.raises(ValueError, match="max_seqlen must be in"):
        jfa.to_nested(values, torch.tensor([0, 5, 20], dtype=torch.int32), max_seqlen=-1)
    # Valid offsets, with and without a hint, still round-trip and unbind.
    cu = torch.tensor([0, 3, 3, 20], dtype=torch.int32)
    for hint in (None, 17):
        nt = jfa.to_nested(values, cu, max_seqlen=hint)
        assert [p.shape[0] for p in nt.unbind()] == [3, 0, 17]
        vals, cu2 = jfa.from_nested(nt)
        assert vals.data_ptr() == values.data_ptr() and torch.equal(cu2, cu)
    # A nested tensor torch built from offsets past its values is refused, not handed back.
    bad = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 3, 3, 21]))
    with pytest.raises(ValueError, match=r"nt.offsets\(\)\[-1\]=21 must equal the total 20"):
        jfa.from_nested(bad)


def test_native_op_registered_from_cpp():
    """Where libjfa_torch.so was built next to libjfa.so, the ops are its C++ kernels (unless
    JFA_TORCH_OPS=ctypes asks for the Python ones)."""
    from jfa import _torch_native

    path = _torch_native.library_path()
    if os.environ.get("JFA_TORCH_OPS") == "ctypes":
        assert jfa.torch_ops_kind() == "ctypes"
        return
    if not path.is_file():
        pytest.skip(f"{path} was not built (torch was not found at build time)")
    assert jfa.torch_ops_kind() == "native", jfa._torch_support.ops.KIND_DETAIL
    for op in ("jfa::jagged_attention_fwd", "jfa::jagged_attention_bwd"):
        dump = torch._C._dispatch_dump(op)
        for key in ("CPU", "CUDA"):
            line = next((x for x in dump.splitlines() if x.startswith(key + ":")), "")
            assert "src/torch/registration.cpp" in line, dump


def test_ops_have_one_schema_whichever_kind():
    """The ops in use (native or ctypes) have the schemas that the ctypes twin declares, word for
    word: the same arguments and defaults, device_check marked as written."""
    from jfa import _torch_ctypes_op

    for name, schema in _torch_ctypes_op.SCHEMAS.items():
        op = getattr(torch.ops.jfa, name).default
        assert str(op._schema) == "jfa::" + schema
        arguments = op._schema.arguments
        word = next(a for a in arguments if a.name == "device_check")
        assert word.alias_info.is_write
        # The local attention arguments come last, with defaults (positional calls of before work).
        assert [a.name for a in arguments[-4:]] == ["window_left", "window_right", "softcap",
                                                     "sinks"]
        assert all(a.has_default_value() for a in arguments[-5:])
    assert len(torch.ops.jfa.jagged_attention_bwd.default._schema.returns) == 4


@needs_cuda
def test_cuda_warm_calls_allocate_no_device_memory(seed):
    """After a warm-up, calls take everything (workspace included) from torch's cache: no new
    device allocation by torch's allocator, none from the default memory pool."""
    lengths = [300, 0, 1, 129, 1000]
    q, k, v, cu, _ = _inputs(seed, lengths, None, 8, 2, 128, torch.float16, "cuda")
    for _ in range(3):  # the same pattern as below: two results alive at a time
        out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, return_lse=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["num_device_alloc"]
    if default_pool_peak(reset=True) is None:
        pytest.skip("libcudart.so.13 is not loadable here to read the default pool")
    for _ in range(20):
        out, lse = jfa.jagged_attention(q, k, v, cu, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["num_device_alloc"] == before
    assert default_pool_peak(reset=False) == 0
    _compare(out, lse, *sdpa_reference(q, k, v, cu, cu, True), torch.float16)


@needs_cuda
def test_cuda_two_threads_two_streams(seed):
    """Two threads, each on its own stream with its own batch, call at the same time: each gets
    what a lone call gives."""
    cases = [([64, 200, 3, 0, 900], 8, 8, 128, torch.float16, True),
             ([1] * 300 + [513], 4, 1, 64, torch.bfloat16, False)]
    inputs = [_inputs(seed + i, c[0], None, c[1], c[2], c[3], c[4], "cuda")
              for i, c in enumerate(cases)]
    expected = [jfa.jagged_attention(q, k, v, cu, causal=c[5], return_lse=True)
                for (q, k, v, cu, _), c in zip(inputs, cases)]
    torch.cuda.synchronize()
    errors, results = [], [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        try:
            q, k, v, cu, _ = inputs[i]
            stream = torch.cuda.Stream()
            barrier.wait()
            with torch.cuda.stream(stream):
                got = [jfa.jagged_attention(q, k, v, cu, causal=cases[i][5], return_lse=True)
                       for _ in range(30)]
            stream.synchronize()
            results[i] = got
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        for out, lse in results[i]:
            assert torch.equal(out, expected[i][0]) and torch.equal(lse, expected[i][1])


def test_errors_name_the_argument_through_every_path(seed):
    """Values the C++ op rejects come out as the documented Python exceptions."""
    q, k, v, cu, _ = _inputs(seed, [3, 4], None, 2, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="max_seqlen_q must be in"):
        jfa.jagged_attention(q, k, v, cu, max_seqlen_q=2**40)
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        jfa.jagged_attention(q, k, v, cu, softmax_scale=1e39)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int or None"):
        jfa.jagged_attention(q, k, v, cu, max_seqlen_k=2.5)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        jfa.jagged_attention(q, k, v[:, :1], cu)
    with pytest.raises(TypeError, match="causal must be a bool"):
        jfa.jagged_attention(q, k, v, cu, causal="yes")
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        jfa.jagged_attention(q, k, v, cu, return_lse=1)


def _direct_call_cases(seed):
    """(id, call, exception type, message) for bad arguments of torch.ops.jfa.* called directly:
    every kind of op raises exactly these (the native op's C++ errors are translated on the way
    out)."""
    q, k, v, cu, _ = _inputs(seed, [2, 3], None, 2, 2, 8, torch.float32, "cpu")
    out, lse = jfa.jagged_attention(q, k, v, cu, return_lse=True)

    def fwd(q=q, k=k, v=v, cu_q=cu, cu_k=cu, hint_q=0, hint_k=0, scale=None, word=None,
            **local):
        return lambda: torch.ops.jfa.jagged_attention_fwd(q, k, v, cu_q, cu_k, hint_q, hint_k,
                                                          False, scale, True, False, word, **local)

    def bwd(grad_out=out, lse=lse, hint_q=0, scale=None, cu_q=cu, **local):
        return lambda: torch.ops.jfa.jagged_attention_bwd(grad_out, q, k, v, out, lse, cu_q, cu,
                                                          hint_q, 0, False, scale, None, False,
                                                          **local)

    meta = torch.empty(k.shape, device="meta")
    window_message = ("window_left and window_right must be >= 0, or -1 for unbounded, got "
                      "window_left={} window_right={} [invalid argument]")
    softcap_message = "softcap must be finite and >= 0 (0 = off), got {} [invalid argument]"
    return [
        ("q-dtype", fwd(q=q.double(), k=k.double(), v=v.double()), TypeError,
         "q must be float16, bfloat16 or float32, got torch.float64"),
        ("k-dtype", fwd(k=k.half()), TypeError,
         "q, k and v must have the same dtype, got q torch.float32 and k torch.float16"),
        ("k-device", fwd(k=meta), ValueError,
         "q, k and v must be on the same device, got q on cpu, k on meta, v on cpu"),
        ("q-shape", fwd(q=q[:, 0]), ValueError,
         "q must have 3 dimensions [total, heads, head_dim], got shape (5, 8)"),
        ("v-shape", fwd(v=v[:, :1]), ValueError,
         "v must have the shape of k but for its last dimension [total_k, heads_kv, head_dim_v], "
         "got k (5, 2, 8) and v (5, 1, 8)"),
        ("k-stride", fwd(k=k.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
         "k: the last dimension (head_dim) must be contiguous (stride 1 element), got stride 2; "
         "call .contiguous() on it"),
        ("offsets-dtype", fwd(cu_q=cu.long()), TypeError,
         "cu_seqlens_q must be an int32 tensor (batch + 1 offsets), got torch.int64"),
        ("offsets-dim", fwd(cu_k=cu[None]), ValueError,
         "cu_seqlens_k must be 1-D (batch + 1 offsets), got shape (1, 3)"),
        ("offsets-length", fwd(cu_k=cu[:2]), ValueError,
         "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got 3 and 2"),
        ("negative-hint", fwd(hint_q=-1), ValueError,
         "max_seqlen_q must be in [0, 2^31 - 1] (0 or None = unknown), got -1"),
        ("hint-too-big", fwd(hint_k=2**31), ValueError,
         "max_seqlen_k must be in [0, 2^31 - 1] (0 or None = unknown), got 2147483648"),
        ("scale-inf", fwd(scale=math.inf), ValueError,
         "softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), got inf"),
        ("scale-beyond-float32", fwd(scale=-1e39), ValueError,
         "softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), got -1e+39"),
        ("scale-nan", fwd(scale=math.nan), ValueError,
         "softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), got nan"),
        ("word-dtype", fwd(word=torch.zeros(1, dtype=torch.int64)), TypeError,
         "device_check must be an int32 tensor (one element), got torch.int64"),
        ("word-shape", fwd(word=torch.zeros(2, dtype=torch.int32)), ValueError,
         "device_check must have exactly one element, got shape (2,)"),
        ("offsets-values", fwd(cu_q=cu + 1), jfa.JfaInvalidArgumentError, None),
        ("bwd-grad-shape", bwd(grad_out=out[:4]), ValueError,
         "grad_out must have the shape of out [total_q, heads_q, head_dim_v] (5, 2, 8), got "
         "(4, 2, 8)"),
        ("bwd-lse-dtype", bwd(lse=lse.double()), TypeError,
         "lse must be float32, got torch.float64"),
        ("bwd-lse-shape", bwd(lse=lse[:, :4]), ValueError,
         "lse must have shape (2, 5) [heads_q, total_q] (the forward's with return_lse=True), got "
         "(2, 4)"),
        ("bwd-negative-hint", bwd(hint_q=-3), ValueError,
         "max_seqlen_q must be in [0, 2^31 - 1] (0 or None = unknown), got -3"),
        ("bwd-scale", bwd(scale=math.inf), ValueError,
         "softmax_scale must be finite in float32 (or None for 1/sqrt(head_dim)), got inf"),
        ("bwd-offsets-values", bwd(cu_q=cu + 1), jfa.JfaInvalidArgumentError, None),
        # Local attention, softcap and sinks: the ops check the torch-level types, shapes and
        # devices and the conversion to the C fields; libjfa checks the values.
        ("sinks-dtype", fwd(sinks=torch.zeros(2, dtype=torch.float64)), TypeError,
         "sinks must be float32, got torch.float64"),
        ("sinks-shape", fwd(sinks=torch.zeros(3)), ValueError,
         "sinks must have shape (2,) [heads_q], got (3,)"),
        ("sinks-2d", fwd(sinks=torch.zeros(1, 2)), ValueError,
         "sinks must have shape (2,) [heads_q], got (1, 2)"),
        ("sinks-stride", fwd(sinks=torch.zeros(4)[::2]), ValueError,
         "sinks must be contiguous; call .contiguous() on it"),
        ("sinks-device", fwd(sinks=torch.zeros(2, device="meta")), ValueError,
         "sinks must be on the device of q (cpu), got meta"),
        ("sinks-values", fwd(sinks=torch.tensor([0.0, math.inf])), jfa.JfaInvalidArgumentError,
         "jfa_attention_forward: sinks[1] is inf: sinks must be finite [invalid argument]"),
        ("window-beyond-int32", fwd(window_left=2**31), ValueError,
         "window_left must fit in int32 (>= 0, or -1 for unbounded), got 2147483648"),
        ("window-below-int32", fwd(window_right=-2**31 - 1), ValueError,
         "window_right must fit in int32 (>= 0, or -1 for unbounded), got -2147483649"),
        ("window-negative", fwd(window_right=-2), jfa.JfaInvalidArgumentError,
         "jfa_attention_forward: " + window_message.format(-1, -2)),
        ("softcap-negative", fwd(softcap=-0.5), jfa.JfaInvalidArgumentError,
         "jfa_attention_forward: " + softcap_message.format(-0.5)),
        ("softcap-beyond-float32", fwd(softcap=1e39), jfa.JfaInvalidArgumentError,
         "jfa_attention_forward: " + softcap_message.format("inf")),
        ("softcap-nan", fwd(softcap=math.nan), jfa.JfaInvalidArgumentError,
         "jfa_attention_forward: " + softcap_message.format("nan")),
        ("bwd-sinks-dtype", bwd(sinks=torch.zeros(2, dtype=torch.float16)), TypeError,
         "sinks must be float32, got torch.float16"),
        ("bwd-sinks-shape", bwd(sinks=torch.zeros(())), ValueError,
         "sinks must have shape (2,) [heads_q], got ()"),
        ("bwd-window-beyond-int32", bwd(window_right=2**40), ValueError,
         "window_right must fit in int32 (>= 0, or -1 for unbounded), got 1099511627776"),
        ("bwd-window-negative", bwd(window_left=-5), jfa.JfaInvalidArgumentError,
         "jfa_attention_backward: " + window_message.format(-5, -1)),
        ("bwd-softcap-inf", bwd(softcap=-math.inf), jfa.JfaInvalidArgumentError,
         "jfa_attention_backward: " + softcap_message.format("-inf")),
    ]


def test_direct_op_calls_raise_the_same_errors_whichever_kind(seed):
    """torch.ops.jfa.* called directly, with or without autograd, raise the TypeError, ValueError
    or JfaError that jfa.jagged_attention documents, with the same messages, native or ctypes."""
    for case, call, kind, message in _direct_call_cases(seed):
        for grad in (False, True):
            with torch.set_grad_enabled(grad), pytest.raises(Exception) as info:
                call()
            assert type(info.value) is kind, (case, jfa.torch_ops_kind(), info.value)
            if message is not None:
                assert str(info.value) == message, case
            else:  # a status of libjfa, named after the entry point
                function = "jfa_attention_" + ("backward" if case.startswith("bwd") else "forward")
                assert str(info.value).startswith(f"{function}: cu_seqlens_q[0] must be 0"), case
    # None hints (unknown, as 0) are taken by the ops themselves too.
    q, k, v, cu, _ = _inputs(seed, [2, 3], None, 2, 2, 8, torch.float32, "cpu")
    out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, None, None, True, None, True)
    torch.testing.assert_close(out, jfa.jagged_attention(q, k, v, cu, causal=True))
    torch.ops.jfa.jagged_attention_bwd(out, q, k, v, out, lse, cu, cu, None, None, True, None,
                                       None, False)


def test_direct_op_calls_under_inference_mode(seed):
    """Under torch.inference_mode(), a direct call whose tensors are all inference tensors (made
    under it) skips the kernel that translates the native op's errors: the native op raises a
    RuntimeError whose message is the tag ("TypeError: ", "ValueError: " or "jfa status N in
    FUNCTION: ") and the message. With any other tensor among the inputs the call raises as
    elsewhere; so does the ctypes op always, and jfa.jagged_attention in every mode."""
    native = jfa.torch_ops_kind() == "native"
    outside = {case: c for case, *c in _direct_call_cases(seed)}
    with torch.inference_mode():
        inside = {case: c for case, *c in _direct_call_cases(seed)}
        for case, tag in (("q-dtype", "TypeError"), ("negative-hint", "ValueError"),
                          ("bwd-lse-shape", "ValueError")):
            call, kind, message = outside[case]
            with pytest.raises(kind) as info:
                call()
            assert type(info.value) is kind and str(info.value) == message, case
            call, kind, message = inside[case]
            with pytest.raises(RuntimeError if native else kind) as info:
                call()
            assert str(info.value) == (f"{tag}: {message}" if native else message), case
        call, kind, _ = inside["offsets-values"]
        function = "jfa_attention_forward"
        with pytest.raises(RuntimeError if native else kind,
                           match=f"^jfa status 1 in {function}: " if native else f"^{function}: "):
            call()
        q, k, v, cu, _ = _inputs(seed, [2, 3], None, 2, 2, 8, torch.float32, "cpu")
        assert q.is_inference() and cu.is_inference()
        with pytest.raises(TypeError, match=r"^q must be float16, bfloat16 or float32"):
            jfa.jagged_attention(q.double(), k.double(), v.double(), cu)
        with pytest.raises(ValueError, match=r"^max_seqlen_q must be in \[0, 2\^31 - 1\]"):
            jfa.jagged_attention(q, k, v, cu, max_seqlen_q=-1)
        with pytest.raises(jfa.JfaInvalidArgumentError, match=r"cu_seqlens_q\[0\] must be 0"):
            jfa.jagged_attention(q, k, v, cu + 1)


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks", "fullgraph"])
def test_compiled_calls_raise_the_documented_exceptions(seed, fullgraph):
    """Under torch.compile jfa.jagged_attention rejects bad inputs with its own exception (checked
    while tracing, not by the op's fake kernel, whose errors torch wraps in TorchRuntimeError);
    with fullgraph=True torch reports it as Unsupported quoting jfa's message, as the README says.
    libjfa's run-time errors pass through unchanged either way."""
    q, k, v, cu, _ = _inputs(seed, [4, 6], None, 2, 2, 8, torch.float32, "cpu")
    cases = [(lambda: (q.double(), k.double(), v.double(), cu), TypeError,
              "q must be float16, bfloat16 or float32, got torch.float64"),
             (lambda: (q, k[:, :1].repeat(1, 3, 1), v[:, :1].repeat(1, 3, 1), cu), ValueError,
              "the heads of q must be a multiple of the heads of k and v (GQA/MQA), got heads_q=2 "
              "and heads_kv=3")]
    for make, kind, message in cases:
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v, cu: jfa.jagged_attention(q, k, v, cu),
                                 fullgraph=fullgraph, backend="aot_eager")
        with pytest.raises(torch._dynamo.exc.Unsupported if fullgraph else kind) as info:
            compiled(*make())
        assert message in str(info.value)
        if not fullgraph:
            assert type(info.value) is kind and str(info.value) == message
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, cu: jfa.jagged_attention(q, q, q, cu),
                             fullgraph=fullgraph, backend="aot_eager")
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"cu_seqlens_q\[2\]=11 must equal"):
        compiled(q, torch.tensor([0, 4, 11], dtype=torch.int32))


@pytest.mark.parametrize("direct", [False, True], ids=["jagged_attention", "op"])
def test_cpu_compile_dynamic_hints_compile_once(seed, direct):
    """torch.compile(dynamic=True, fullgraph=True) with a new max_seqlen hint on every call: the
    hints are SymInt in the op schemas, so one graph serves every value (no recompilation), forward
    and backward, and the results are those of eager calls."""
    q, k, v, cu, _ = _inputs(seed, [5, 0, 12, 3], None, 2, 1, 8, torch.float32, "cpu")

    def f(q, k, v, cu, m):
        if direct:
            return torch.ops.jfa.jagged_attention_fwd(q * 1.0, k, v, cu, cu, m, m, True, None,
                                                      True)[0]
        return jfa.jagged_attention(q * 1.0, k, v, cu, max_seqlen_q=m, max_seqlen_k=m,
                                    causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for m in range(12, 24):  # 12 values, each an upper bound of the lengths
            grads = []
            for fn in (f, compiled):
                leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
                out = fn(*leaves, cu, m)
                out.square().sum().backward()
                grads.append([out] + [t.grad for t in leaves])
            for eager, traced in zip(*grads):
                torch.testing.assert_close(traced, eager)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
def test_cpu_backward_rejects_an_lse_the_forward_cannot_write(seed, bad):
    """The CPU backward op with an lse entry that is NaN, +inf, or -inf in a row that sees a key:
    jfa.JfaInvalidArgumentError naming the head and the token, from the native and the ctypes op
    alike, instead of zero gradients. -inf where a row sees no key is what the forward writes."""
    q, k, v, cu, _ = _inputs(seed, [3, 4], None, 2, 2, 8, torch.float32, "cpu")
    out, lse = jfa.jagged_attention(q, k, v, cu, return_lse=True)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    broken = lse.clone()
    broken[1, 5] = bad
    with pytest.raises(jfa.JfaInvalidArgumentError, match=r"lse of head 1, token 5 is"):
        torch.ops.jfa.jagged_attention_bwd(grad_out, q, k, v, out, broken, cu, cu, 0, 0, False,
                                           None, None, False)
    # Causal with more queries than keys: the first row of the sequence sees no key, its -inf is
    # the forward's and the call runs.
    cu_q = torch.tensor([0, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 2], dtype=torch.int32)
    q3, k2, v2 = q[:3].contiguous(), k[:2].contiguous(), v[:2].contiguous()
    out3, lse3 = torch.ops.jfa.jagged_attention_fwd(q3, k2, v2, cu_q, cu_k, 0, 0, True, None, True)
    assert torch.isneginf(lse3[:, 0]).all() and torch.isfinite(lse3[:, 1:]).all()
    dq, dk, dv, _ = torch.ops.jfa.jagged_attention_bwd(out3, q3, k2, v2, out3, lse3, cu_q, cu_k, 0,
                                                       0, True, None, None, False)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
