"""The torch backward on CUDA (Hopper): gradients of jfa.jagged_attention against float64 autograd,
deterministic mode, a CUDA graph of a forward and backward replayed with new lengths,
torch.compile of a training step, the checked mode (device offsets, results that are not
finite), and opcheck of both ops.
Skipped, with the reason, without torch, a compute-capability-9.0 GPU or a CUDA build of
libjfa."""

import copy
import itertools
import math

import numpy as np
import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}", allow_module_level=True)

import torch  # noqa: E402

from cuda_graphs import capture  # noqa: E402
from cuda_pool import default_pool_peak  # noqa: E402
from cuda_skip import cuda_skip_reason  # noqa: E402


_REASON = cuda_skip_reason()
pytestmark = pytest.mark.skipif(bool(_REASON), reason=_REASON or "n/a")

DTYPES = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
# Relative L2 error of dq, dk and dv against the float64 gradients of the same (rounded) inputs.
GRAD_TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}

CASES = {
    # 0: no query and no key; 1, 63, 65, 129: around the tile edges.
    "self": ([0, 1, 63, 65, 129, 17], None),
    # Pairs: fewer queries than keys, no keys (rows see nothing), no queries (keys seen by
    # nothing), equal, more queries than keys (causal: the first rows see nothing), a short q over
    # long k, and causal rows that see no key or a single key.
    "cross": ([63, 1, 0, 129, 65, 5, 2], [65, 0, 7, 129, 63, 200, 1]),
}


def _offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32,
                        device="cuda")


def _inputs(seed, lengths_q, lengths_k, hq, hkv, d, dtype, dv=None):
    """q, k, v (leaves that require grad; v with dv columns, d by default) and the offsets, drawn on
    the host for reproducibility."""
    g = torch.Generator().manual_seed(seed)
    lengths_k = lengths_q if lengths_k is None else lengths_k
    tq, tk = int(sum(lengths_q)), int(sum(lengths_k))
    q, k, v = (torch.randn(shape, generator=g).to("cuda", dtype).requires_grad_(True)
               for shape in ((tq, hq, d), (tk, hkv, d), (tk, hkv, d if dv is None else dv)))
    return q, k, v, _offsets(lengths_q), _offsets(lengths_k)


def _upstream(seed, out, lse, loss):
    """The gradients a loss sends to out and lse: loss is "out", "out+lse" or "lse"."""
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to("cuda", out.dtype) if "out" in loss else None
    grad_lse = torch.randn(lse.shape, generator=g).to("cuda") if "lse" in loss else None
    return grad_out, grad_lse


def _loss(out, lse, grad_out, grad_lse):
    """sum(grad_out * out) + sum(grad_lse * lse) over the rows that see a key (lse is -inf on the
    others), either term left out when its weights are None."""
    loss = 0
    if grad_out is not None:
        loss = (out.float() * grad_out.float()).sum()
    if grad_lse is not None:
        loss = loss + torch.where(torch.isfinite(lse), lse * grad_lse, 0).sum()
    return loss


def _reference_grads(q, k, v, cu_q, cu_k, causal, grad_out, grad_lse, scale=None):
    """dq, dk, dv of _loss by torch autograd over a per-sequence float64 softmax attention of the
    inputs upcast (bottom-right causal mask, query head h reads kv head h // group)."""
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    hq, d = q.shape[1], q.shape[2]
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    offs_q, offs_k = cu_q.tolist(), cu_k.tolist()
    loss = qd.new_zeros(())
    for b in range(len(offs_q) - 1):
        q0, q1, k0, k1 = offs_q[b], offs_q[b + 1], offs_k[b], offs_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0 or lk == 0:  # no (query, key) pair: nothing flows back
            continue
        K = kd[k0:k1].repeat_interleave(group, 1)
        V = vd[k0:k1].repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qd[q0:q1], K) * scale
        if causal:
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (lk - lq), -math.inf)
        lse = torch.logsumexp(s, -1)
        seen = torch.isfinite(lse)
        p = torch.where(seen[..., None], torch.exp(s - torch.where(seen, lse, 0)[..., None]), 0)
        out = torch.einsum("hqk,khd->qhd", p, V)
        if grad_out is not None:
            loss = loss + (out * grad_out[q0:q1].double()).sum()
        if grad_lse is not None:
            loss = loss + torch.where(seen, lse * grad_lse[:, q0:q1].double(), 0).sum()
    loss.backward()
    return tuple(torch.zeros_like(t) if t.grad is None else t.grad for t in (qd, kd, vd))


def _unseen(cu_q, cu_k, causal):
    """Query rows that see no key, and keys that no query sees (their gradients are zeros)."""
    offs_q, offs_k = cu_q.tolist(), cu_k.tolist()
    rows = torch.zeros(offs_q[-1], dtype=torch.bool)
    keys = torch.zeros(offs_k[-1], dtype=torch.bool)
    for b in range(len(offs_q) - 1):
        lq, lk = offs_q[b + 1] - offs_q[b], offs_k[b + 1] - offs_k[b]
        no_key = lk == 0 or (causal and lq > lk)
        if no_key:  # the first rows: all of them without keys, else lq - lk under the mask
            rows[offs_q[b]:offs_q[b] + (lq if lk == 0 else lq - lk)] = True
        if lq == 0:  # with a query, the last one sees every key, causal or not
            keys[offs_k[b]:offs_k[b + 1]] = True
    return rows.to("cuda"), keys.to("cuda")


def _check_grads(got, want, dtype, unseen=None, what=""):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        label = f"{what}{name}"
        assert g.dtype == dtype and g.shape == w.shape and g.device == w.device, label
        assert torch.isfinite(g).all(), f"{label}: not finite"
        ref_norm = w.norm().item()
        if ref_norm == 0:  # e.g. dv when the loss reads only the LSE
            assert torch.count_nonzero(g).item() == 0, f"{label}: nonzero, the reference is zero"
        else:
            err = ((g.double() - w).norm() / ref_norm).item()
            assert err <= GRAD_TOL[dtype], f"{label}: relative L2 error {err:.3g}"
    if unseen is not None:
        rows, keys = unseen
        assert torch.count_nonzero(got[0][rows]).item() == 0, f"{what}dq of rows that see no key"
        for name, g in zip(("dk", "dv"), got[1:]):
            assert torch.count_nonzero(g[keys]).item() == 0, f"{what}{name} of keys no query sees"


# ---- gradients against float64 autograd ----------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("sizes", [(32, 32), (64, 64), (96, 96), (128, 128), (192, 192),
                                   (192, 128), (256, 256)],
                         ids=["d32", "d64", "d96", "d128", "d192", "d192v128", "d256"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("loss", ["out", "out+lse"])
def test_cuda_gradients_match_float64_autograd(seed, dtype, sizes, causal, heads, case, loss):
    lq, lk = CASES[case]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, heads[0], heads[1], sizes[0], dtype, sizes[1])
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, max(lq), max(lk or lq), causal=causal,
                                    return_lse=True)
    grad_out, grad_lse = _upstream(seed, out, lse, loss)
    got = torch.autograd.grad(_loss(out, lse, grad_out, grad_lse), (q, k, v))
    want = _reference_grads(q, k, v, cu_q, cu_k, causal, grad_out, grad_lse)
    _check_grads(got, want, dtype, _unseen(cu_q, cu_k, causal))


@DTYPES
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("sizes", [(192, 128), (192, 192), (256, 256)],
                         ids=["d192v128", "d192", "d256"])
def test_cuda_large_head_sizes_forward_match_float64(seed, dtype, causal, heads, sizes):
    """The forward at the head sizes whose backward splits the work by role (192/128: v and out
    with 128 columns) against a float64 reference."""
    from jfa_reference import attention_ref

    d, dv = sizes
    lq, lk = CASES["cross"]
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lq), sum(lk)
    q, k, v = (torch.randn(shape, generator=g).to("cuda", dtype)
               for shape in ((tq, heads[0], d), (tk, heads[1], d), (tk, heads[1], dv)))
    cu_q, cu_k = _offsets(lq), _offsets(lk)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.shape == (tq, heads[0], dv) and out.dtype == dtype
    ref_out, ref_lse = attention_ref(*(t.double().cpu().numpy() for t in (q, k, v)),
                                     cu_q.cpu().numpy(), cu_k.cpu().numpy(), causal=causal)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double().cpu(), torch.from_numpy(ref_out), atol=tol, rtol=tol)
    seen = torch.from_numpy(np.isfinite(ref_lse))
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    torch.testing.assert_close(lse.double().cpu()[seen], torch.from_numpy(ref_lse)[seen],
                               atol=1e-3, rtol=1e-4)


@DTYPES
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_gradients_of_the_lse_alone(seed, dtype, causal):
    """A loss that reads only the LSE: the op gets no gradient for out (zeros), dv is zero."""
    lq, lk = CASES["cross"]
    q, k, v, cu_q, cu_k = _inputs(seed, lq, lk, 8, 2, 128, dtype)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    _, grad_lse = _upstream(seed, out, lse, "lse")
    got = torch.autograd.grad(_loss(out, lse, None, grad_lse), (q, k, v))
    want = _reference_grads(q, k, v, cu_q, cu_k, causal, None, grad_lse)
    _check_grads(got, want, dtype, _unseen(cu_q, cu_k, causal))


def test_cuda_backward_of_strided_views_on_a_side_stream(seed):
    """q, k, v as views of one packed qkv buffer (the gradients land in its slots), a custom scale,
    no max_seqlen hints, forward and backward on a side stream."""
    lengths = [33, 0, 150, 1, 77]
    cu = _offsets(lengths)
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn((sum(lengths), 3, 4, 64), generator=g).to("cuda", torch.float16)
    qkv.requires_grad_(True)
    q, k, v = qkv.unbind(1)
    out_grad = torch.randn((sum(lengths), 4, 64), generator=g).to("cuda", torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = jfa.jagged_attention(q, k, v, cu, causal=True, softmax_scale=0.2)
        (grad,) = torch.autograd.grad(out, qkv, out_grad)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    want = _reference_grads(q, k, v, cu, cu, True, out_grad, None, scale=0.2)
    _check_grads(grad.unbind(1), want, torch.float16, _unseen(cu, cu, True))


# ---- deterministic mode --------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_deterministic_gradients_are_bit_identical(seed, dtype, causal):
    """Long sequences (many query tiles add into each dq row, many query heads into each dk/dv of
    GQA): three runs give the same bits, and match the reference."""
    lengths_q, lengths_k = [700, 0, 1, 1100, 129, 64], [700, 5, 0, 1100, 257, 64]
    q, k, v, cu_q, cu_k = _inputs(seed, lengths_q, lengths_k, 8, 2, 128, dtype)
    grad_out = grad_lse = None
    runs = []
    for _ in range(3):
        out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True,
                                        deterministic=True)
        if grad_out is None:
            grad_out, grad_lse = _upstream(seed, out, lse, "out+lse")
        runs.append(torch.autograd.grad(_loss(out, lse, grad_out, grad_lse), (q, k, v)))
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(a, b), f"{name} differs between runs"
    want = _reference_grads(q, k, v, cu_q, cu_k, causal, grad_out, grad_lse)
    _check_grads(runs[0], want, dtype, _unseen(cu_q, cu_k, causal))


# ---- CUDA graphs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("hints", [True, False], ids=["hints", "no-hints"])
def test_cuda_graph_of_forward_and_backward_replays_new_lengths(seed, hints):
    """One capture of a forward and its backward (torch.autograd.grad), replayed after new lengths
    (the same total) are written into the same offsets tensor and new values into q."""
    lengths_a, lengths_b = [100, 28, 0, 128, 1], [1, 200, 55, 0, 1]  # both total 257
    q, k, v, cu, _ = _inputs(seed, lengths_a, None, 8, 2, 128, torch.float16)
    max_len = max(lengths_a + lengths_b) if hints else None
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(q.shape, generator=g).to("cuda", torch.float16)
    grad_lse = torch.randn((q.shape[1], q.shape[0]), generator=g).to("cuda")

    def step():
        out, lse = jfa.jagged_attention(q, k, v, cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
                                        causal=True, return_lse=True)
        return torch.autograd.grad(_loss(out, lse, grad_out, grad_lse), (q, k, v))

    graph, grads = capture(step)

    for i, lengths in enumerate((lengths_a, lengths_b)):
        cu.copy_(_offsets(lengths))
        if i:
            with torch.no_grad():
                q.copy_(torch.randn(q.shape, generator=g).to(q))
        graph.replay()
        torch.cuda.synchronize()
        want = _reference_grads(q, k, v, cu, cu, True, grad_out, grad_lse)
        _check_grads(grads, want, torch.float16, _unseen(cu, cu, True), what=f"lengths {lengths}: ")


# ---- checked mode --------------------------------------------------------------------------------

# Bits of jfa_device_check_bits (include/jfa/jfa.h).
Q_DECREASING, Q_ABOVE_MAX, RESULT_NOT_FINITE = 2, 8, 256


def _word():
    """A checked-mode word holding a value no check stores, so that a stale word cannot pass."""
    return torch.full((1,), -1, dtype=torch.int32, device="cuda")


def _read(word):
    torch.cuda.synchronize()  # the call does not wait for its check
    return word.item()


def test_cuda_device_check_valid_offsets_give_zero(seed):
    """Valid offsets: the forward stores 0 without synchronizing with the host, and so does the
    backward that autograd runs (into the same word)."""
    q, k, v, cu_q, cu_k = _inputs(seed, [63, 0, 130, 5], [65, 7, 0, 200], 8, 2, 128, torch.float16)
    word = _word()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, 130, 200, causal=True,
                                        return_lse=True, device_check=word)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert _read(word) == 0
    grad_out, grad_lse = _upstream(seed, out, lse, "out+lse")
    word.fill_(-1)
    got = torch.autograd.grad(_loss(out, lse, grad_out, grad_lse), (q, k, v))
    assert _read(word) == 0, jfa.device_check_message(word.item())
    want = _reference_grads(q, k, v, cu_q, cu_k, True, grad_out, grad_lse)
    _check_grads(got, want, torch.float16, _unseen(cu_q, cu_k, True))


@pytest.mark.parametrize("hints", [False, True], ids=["no-hints", "hints"])
def test_cuda_device_check_reports_decreasing_offsets(seed, hints):
    """Offsets that decrease, written into the q offsets tensor on the device: the forward and its
    backward set the DECREASING bit (and, with a max_seqlen_q hint below a length they now give,
    the ABOVE_MAX bit too); the k offsets are valid, so no k bit."""
    q, k, v, cu_q, cu_k = _inputs(seed, [5, 9, 3], [4, 6, 8], 4, 2, 64, torch.bfloat16)
    cu_q.copy_(torch.tensor([0, 9, 5, 17], dtype=torch.int32))  # lengths 9, -4, 12; same total
    max_q = 9 if hints else None
    expected = Q_DECREASING | (Q_ABOVE_MAX if hints else 0)
    word = _word()
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, max_q, None, return_lse=True,
                                    device_check=word)
    got = _read(word)
    assert got == expected, jfa.device_check_message(got)
    assert jfa.device_check_message(got).startswith("cu_seqlens_q decreases")
    word.fill_(-1)
    torch.autograd.grad(out.float().sum(), (q, k, v))  # results unspecified, buffers respected
    got = _read(word) & ~RESULT_NOT_FINITE  # so may the result bit be
    assert got == expected, f"backward: {jfa.device_check_message(got)}"


def test_cuda_device_check_in_a_graph_replayed_with_new_lengths(seed):
    """One capture of a forward and its backward with a word: replays with valid lengths store 0,
    a replay after decreasing offsets are written into the same offsets tensor stores the bit."""
    q, k, v, cu, _ = _inputs(seed, [100, 28, 0, 128, 1], None, 8, 2, 128, torch.float16)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q)
    word = _word()

    def step():
        out = jfa.jagged_attention(q, k, v, cu, causal=True, device_check=word)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    graph, grads = capture(step)

    for offsets, expected in (([0, 1, 201, 256, 256, 257], 0),
                              ([0, 100, 128, 30, 256, 257], Q_DECREASING | (Q_DECREASING << 4)),
                              ([0, 100, 128, 128, 256, 257], 0)):
        cu.copy_(torch.tensor(offsets, dtype=torch.int32))
        word.fill_(-1)
        graph.replay()
        got = _read(word)
        if expected:  # broken offsets: results unspecified, so the result bit may come too
            got &= ~RESULT_NOT_FINITE
        assert got == expected, f"offsets {offsets}: {jfa.device_check_message(got)}"
    want = _reference_grads(q, k, v, cu, cu, True, grad_out, None)
    _check_grads(grads, want, torch.float16, _unseen(cu, cu, True))


def test_cuda_device_check_reports_scores_beyond_float32(seed):
    """bf16 q and k of about 1e19: q.k overflows float32 in the tensor cores, the rows are NaN and
    the word says so, in the forward and in its backward; the same values scaled down give 0."""
    q, k, v, cu, _ = _inputs(seed, [1, 77, 200], None, 4, 2, 128, torch.bfloat16)
    for gain, expected in ((1.0, 0), (1e19, RESULT_NOT_FINITE)):
        with torch.no_grad():
            qg, kg = (x.detach() * gain for x in (q, k))
        qg.requires_grad_(True)
        kg.requires_grad_(True)
        word = _word()
        out = jfa.jagged_attention(qg, kg, v, cu, device_check=word)
        got = _read(word)
        assert got == expected, f"gain {gain}: {jfa.device_check_message(got)}"
        assert bool(torch.isnan(out).any()) == (expected != 0)
        word.fill_(-1)
        torch.autograd.grad(out.float().sum(), (qg, kg, v))
        got = _read(word)
        assert got == expected, f"gain {gain}, backward: {jfa.device_check_message(got)}"


# ---- torch.compile -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16], ids=["fp16"])
def test_cuda_compile_fullgraph_forward_and_autograd_grad(seed, dtype):
    """Forward, loss and torch.autograd.grad in one compiled function: the gradients equal eager
    ones (deterministic backward) and the reference."""
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        pytest.skip(f"torch {torch.__version__} cannot trace torch.autograd.grad")
    q, k, v, cu, _ = _inputs(seed, [40, 0, 129, 7, 65], None, 8, 2, 128, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(q.shape, generator=g).to("cuda", dtype)
    grad_lse = torch.randn((q.shape[1], q.shape[0]), generator=g).to("cuda")

    def step(q, k, v, cu, grad_out, grad_lse):
        out, lse = jfa.jagged_attention(q, k, v, cu, max_seqlen_q=129, max_seqlen_k=129,
                                        causal=True, return_lse=True, deterministic=True)
        return torch.autograd.grad(_loss(out, lse, grad_out, grad_lse), (q, k, v))

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(step, fullgraph=True)
        got = compiled(q, k, v, cu, grad_out, grad_lse)
    want = step(q, k, v, cu, grad_out, grad_lse)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}")
    _check_grads(got, _reference_grads(q, k, v, cu, cu, True, grad_out, grad_lse), dtype,
                 _unseen(cu, cu, True))


class _TinyAttention(torch.nn.Module):
    """Projections around jagged attention (GQA, causal), for a training step."""

    def __init__(self, dim=96, heads=4, kv_heads=2, head_dim=64):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wq = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, cu, max_len):
        t = x.shape[0]
        q = self.wq(x).view(t, self.heads, self.head_dim)
        k = self.wk(x).view(t, self.kv_heads, self.head_dim)
        v = self.wv(x).view(t, self.kv_heads, self.head_dim)
        out = jfa.jagged_attention(q, k, v, cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
                                   causal=True, deterministic=True)
        return self.wo(out.reshape(t, -1))


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_cuda_compile_fullgraph_training_step(seed, dtype):
    """A compiled module and loss, backward and an optimizer step outside: three steps track the
    eager twin (losses, gradients, weights)."""
    lengths = [40, 0, 129, 7, 65]
    cu, total = _offsets(lengths), sum(lengths)
    torch.manual_seed(seed)
    eager = _TinyAttention().to("cuda", dtype)
    model = copy.deepcopy(eager)
    g = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn((total, 96), generator=g).to("cuda", dtype) for _ in range(3)]
    targets = [torch.randn((total, 96), generator=g).to("cuda") for _ in range(3)]

    def loss_of(m, x, target):
        return (m(x, cu, max(lengths)).float() - target).square().mean()

    torch._dynamo.reset()
    compiled_loss = torch.compile(loss_of, fullgraph=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    for step, (x, target) in enumerate(zip(xs, targets)):
        losses = []
        for m, fn in zip((eager, model), (loss_of, compiled_loss)):
            loss = fn(m, x, target)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-3, atol=1e-5)
        for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
            err = ((pc.grad.double() - pe.grad.double()).norm() / pe.grad.double().norm()).item()
            assert err <= 1e-3, f"step {step}: grad of {name}: relative L2 error {err:.3g}"
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(pc, pe, msg=lambda m, name=name: f"{name}: {m}")


def test_cuda_compile_dynamic_hints_compile_once(seed):
    """A new max_seqlen hint on every call of a function compiled with dynamic shapes: one graph
    serves them all (the hints are SymInt in the op schemas) and the kernels get each value; the
    output and the gradients (deterministic backward) equal eager ones."""
    q, k, v, cu, _ = _inputs(seed, [40, 0, 129, 7], None, 8, 2, 64, torch.float16)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q)

    def forward(q, k, v, cu, m):
        return jfa.jagged_attention(q, k, v, cu, max_seqlen_q=m, max_seqlen_k=m, causal=True,
                                    deterministic=True)

    torch._dynamo.reset()
    compiled = torch.compile(forward, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for m in range(129, 141):
            got, want = ((out, *torch.autograd.grad(out, (q, k, v), grad_out))
                         for out in (compiled(q, k, v, cu, m), forward(q, k, v, cu, m)))
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                torch.testing.assert_close(a, b, msg=lambda e, name=name, m=m: f"{name} {m}: {e}")


# ---- errors -------------------------------------------------------------------------------------

def test_cuda_direct_op_calls_raise_the_documented_errors(seed):
    """torch.ops.jfa.* called directly with an argument on the wrong device or a dtype the kernel
    does not take: the TypeError, ValueError or JfaError of jfa.jagged_attention, whichever kind of
    op is in use."""
    q, k, v, cu, _ = (t.detach() for t in _inputs(seed, [5, 9], None, 2, 2, 64, torch.float16))
    out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, None, None, False, None, True)

    def fwd(q=q, k=k, v=v, cu=cu, word=None):
        return torch.ops.jfa.jagged_attention_fwd(q, k, v, cu, cu, 0, 0, False, None, True, False,
                                                  word)

    def bwd(lse=lse):
        return torch.ops.jfa.jagged_attention_bwd(out, q, k, v, out, lse, cu, cu, 0, 0, False,
                                                  None, None, False)

    cases = [
        (lambda: fwd(cu=cu.cpu()), ValueError,
         r"cu_seqlens_q must be on the device of q \(cuda:0\), got cpu$"),
        (lambda: fwd(word=torch.zeros(1, dtype=torch.int32)), ValueError,
         r"device_check must be on the device of q \(cuda:0\), got cpu$"),
        (lambda: bwd(lse=lse.cpu()), ValueError,
         r"lse must be on the device of q \(cuda:0\), got cpu$"),
        (lambda: fwd(q=q.double(), k=k.double(), v=v.double()), TypeError,
         r"q must be float16, bfloat16 or float32, got torch.float64$"),
        (lambda: fwd(q=q.float(), k=k.float(), v=v.float()), jfa.JfaUnsupportedError,
         "float32 is not supported on CUDA"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message) as info:
            call()
        assert type(info.value) is kind, (jfa.torch_ops_kind(), info.value)


# ---- opcheck ------------------------------------------------------------------------------------

@DTYPES
def test_cuda_opcheck_forward_op(seed, dtype):
    q, k, v, cu_q, cu_k = _inputs(seed, [3, 0, 70, 1], [5, 2, 64, 0], 4, 2, 64, dtype)
    fwd = torch.ops.jfa.jagged_attention_fwd.default
    plain = [t.detach() for t in (q, k, v)]
    word = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    for return_lse in (False, True):
        torch.library.opcheck(fwd, (*plain, cu_q, cu_k, 0, 0, True, None, return_lse))
        torch.library.opcheck(fwd, (*plain, cu_q, cu_k, 0, 0, True, None, return_lse, False, word))
    # With inputs that need gradients (the backward needs the LSE): the autograd formula and its
    # backward through AOT dispatch; deterministic, so that eager and traced gradients are equal.
    torch.library.opcheck(fwd, (q, k, v, cu_q, cu_k, 70, 64, True, None, True, True))
    torch.library.opcheck(fwd, (q, k, v, cu_q, cu_k, 70, 64, True, None, True, True, word))


@DTYPES
@pytest.mark.parametrize("head_dim", [32, 64, 96, 256])
def test_cuda_opcheck_backward_op(seed, dtype, head_dim):
    q, k, v, cu_q, cu_k = (t.detach() for t in _inputs(seed, [3, 0, 70, 1], [5, 2, 64, 0], 4, 2,
                                                       head_dim, dtype))
    out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu_q, cu_k, 0, 0, True, None, True)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to("cuda", dtype)
    grad_lse = torch.randn(lse.shape, generator=g).to("cuda")
    bwd = torch.ops.jfa.jagged_attention_bwd.default
    word = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    for dlse, deterministic, extra in itertools.product((None, grad_lse), (False, True),
                                                        ((), (word,))):
        args = (grad_out, q, k, v, out, lse, cu_q, cu_k, 0, 0, True, None, dlse, deterministic,
                *extra)
        # test_aot_dispatch_dynamic compares an eager run with a traced one: deterministic only.
        utils = (("test_schema", "test_autograd_registration", "test_faketensor",
                  "test_aot_dispatch_dynamic") if deterministic else
                 ("test_schema", "test_autograd_registration", "test_faketensor"))
        torch.library.opcheck(bwd, args, test_utils=utils)


# ---- memory -------------------------------------------------------------------------------------

def test_cuda_warm_backward_allocates_no_device_memory(seed):
    """After a warm-up, forward and backward take everything (workspaces included) from torch's
    cache: no new device allocation by torch's allocator, none from the default memory pool."""
    lengths = [300, 0, 1, 129, 1000]
    q, k, v, cu, _ = _inputs(seed, lengths, None, 8, 2, 128, torch.float16)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q)

    def step():
        out = jfa.jagged_attention(q, k, v, cu, causal=True)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    for _ in range(3):  # the same pattern as below: two sets of gradients alive at a time
        grads = step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["num_device_alloc"]
    if default_pool_peak(reset=True) is None:
        pytest.skip("libcudart.so.13 is not loadable here to read the default pool")
    for _ in range(20):
        grads = step()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["num_device_alloc"] == before
    assert default_pool_peak(reset=False) == 0
    want = _reference_grads(q, k, v, cu, cu, True, grad_out, None)
    _check_grads(grads, want, torch.float16, _unseen(cu, cu, True))
