"""Local attention (window_size), softcap and sinks through the torch ops on the CPU: forward and
gradients (q, k, v, sinks) against a float64 eager torch implementation written here (the rules of
jfa.h), gradcheck, opcheck of both ops, torch.compile, and the argument checks of
jfa.jagged_attention. Run native and with JFA_TORCH_OPS=ctypes (scripts/torch-cpu-tests.sh)."""

import math

import numpy as np
import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}",
                allow_module_level=True)

import torch  # noqa: E402

from cuda_skip import cuda_skip_reason  # noqa: E402

_CUDA_REASON = cuda_skip_reason()
needs_cuda = pytest.mark.skipif(bool(_CUDA_REASON), reason=_CUDA_REASON or "n/a")

# Cross lengths (len_q != len_k, both ways), empty sequences and a single token.
LENGTHS_Q, LENGTHS_K = [5, 0, 33, 1, 70, 9, 3], [9, 4, 0, 1, 64, 3, 3]
HQ, HKV, D, DV = 4, 2, 16, 8
SCALE = 1.25  # scores about +-5 with unit normal inputs of head_dim 16: softcap 2 bites


def _offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def _inputs(seed, dtype, lengths_q=LENGTHS_Q, lengths_k=LENGTHS_K, hq=HQ, hkv=HKV, d=D, dv=DV):
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = _offsets(lengths_q), _offsets(lengths_k)
    q = torch.randn((sum(lengths_q), hq, d), generator=g).to(dtype)
    k = torch.randn((sum(lengths_k), hkv, d), generator=g).to(dtype)
    v = torch.randn((sum(lengths_k), hkv, dv), generator=g).to(dtype)
    return q, k, v, cu_q, cu_k


def _sinks(kind, seed, hq=HQ):
    if kind is None:
        return None
    if kind == "random":
        return 2 * torch.randn(hq, generator=torch.Generator().manual_seed(seed + 7))
    return torch.full((hq,), {"large": 10.0, "small": -10.0}[kind])


def reference(q, k, v, cu_q, cu_k, causal, window, softcap, sinks, scale):
    """out [total_q, hq, dv] and lse [hq, total_q] in float64 by eager torch ops, differentiable
    in q, k, v and sinks: query i sees key j iff i + lk - lq - left <= j <= i + lk - lq + right
    (-1 unbounded; causal sets right to 0), scores softcap * tanh(s / softcap), and each head's
    sink joins the softmax denominator with no value."""
    hq, group = q.shape[1], q.shape[1] // k.shape[1]
    left, right = window
    right = 0 if causal else right
    outs, lses = [], []
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        qs = q[cu_q[b]:cu_q[b + 1]]
        ks = k[cu_k[b]:cu_k[b + 1]].repeat_interleave(group, 1)
        vs = v[cu_k[b]:cu_k[b + 1]].repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        seen = torch.ones((lq, lk), dtype=torch.bool)
        if left >= 0:
            seen &= j >= i + lk - lq - left
        if right >= 0:
            seen &= j <= i + lk - lq + right
        s = s.masked_fill(~seen, -math.inf)
        logits = s if sinks is None else torch.cat([s, sinks[:, None, None].expand(hq, lq, 1)], -1)
        lse = torch.logsumexp(logits, -1)
        finite = torch.isfinite(lse)
        p = torch.where(finite[..., None], torch.exp(s - torch.where(finite, lse, 0)[..., None]), 0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, 1)


CASES = [
    dict(window_size=(0, 0)),
    dict(window_size=(1, 1)),
    dict(window_size=(500, 500)),  # longer than every sequence: full attention
    dict(window_size=(3, -1)),  # left only
    dict(window_size=(-1, 2)),  # right only
    dict(window_size=(0, -1), causal=True),
    dict(window_size=(4, 9), causal=True),  # causal wins over right
    dict(softcap=2.0),
    dict(softcap=2.0, causal=True, window_size=(5, -1)),
    dict(sinks="large"),
    dict(sinks="small"),
    dict(sinks="random", causal=True),
    dict(sinks="random", window_size=(2, 1), softcap=1.5),
]
def _case_ids(cases):
    return ["-".join(f"{k}={v}" for k, v in c.items()) for c in cases]


IDS = _case_ids(CASES)
OUT_TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _kwargs(case, seed):
    return dict(causal=case.get("causal", False), window_size=case.get("window_size", (-1, -1)),
                softcap=case.get("softcap", 0.0), sinks=_sinks(case.get("sinks"), seed))


def _reference_of(q, k, v, cu_q, cu_k, kw, sinks=None):
    sinks = kw["sinks"] if sinks is None else sinks
    return reference(q, k, v, cu_q, cu_k, kw["causal"], kw["window_size"], kw["softcap"], sinks,
                     float(np.float32(SCALE)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_float64(seed, case, dtype):
    q, k, v, cu_q, cu_k = _inputs(seed, dtype)
    kw = _kwargs(case, seed)
    out, lse = jfa.jagged_attention(q, k, v, cu_q, cu_k, softmax_scale=SCALE, return_lse=True,
                                    **kw)
    assert out.dtype == dtype and out.shape == (q.shape[0], HQ, DV) and lse.shape == (HQ, len(q))
    ref_out, ref_lse = _reference_of(q.double(), k.double(), v.double(), cu_q, cu_k, kw,
                                     None if kw["sinks"] is None else kw["sinks"].double())
    torch.testing.assert_close(out.double(), ref_out, atol=OUT_TOL[dtype], rtol=OUT_TOL[dtype])
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-4, rtol=1e-5)
    if kw["sinks"] is not None:  # a row without keys has lse = its sink
        assert torch.isfinite(lse).all()
    # libjfa's float64 reference (numpy) agrees with the one here.
    np_kw = dict(kw, sinks=None if kw["sinks"] is None else kw["sinks"].numpy())
    lib_out, lib_lse = jfa.attention_reference(
        *(t.float().numpy() if dtype == torch.bfloat16 else t.numpy() for t in (q, k, v)),
        cu_q.numpy(), cu_k.numpy(), softmax_scale=SCALE, return_lse=True, **np_kw)
    torch.testing.assert_close(torch.from_numpy(lib_out), ref_out, atol=1e-10, rtol=1e-10)
    # Without the LSE, through the no-grad fast path, the same out.
    assert torch.equal(jfa.jagged_attention(q, k, v, cu_q, cu_k, softmax_scale=SCALE, **kw), out)


def _assert_gradients_close(leaves, sinks, ref_leaves, ref_sinks, tolerance):
    """dq, dk, dv (and dsinks) of the leaves against the float64 reference's, relative L2."""
    pairs = list(zip(("dq", "dk", "dv"), leaves, ref_leaves))
    if sinks is not None:
        pairs.append(("dsinks", sinks, ref_sinks))
    for name, got, want in pairs:
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape, name
        assert torch.isfinite(got.grad).all(), name
        err = ((got.grad.double().cpu() - want.grad).norm()
               / want.grad.norm().clamp_min(1e-30)).item()
        assert err <= tolerance, f"{name}: relative error {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_match_float64_autograd(seed, case, dtype):
    q, k, v, cu_q, cu_k = _inputs(seed, dtype)
    kw = _kwargs(case, seed)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    sinks = None if kw["sinks"] is None else kw["sinks"].clone().requires_grad_(True)
    out, lse = jfa.jagged_attention(*leaves, cu_q, cu_k, softmax_scale=SCALE, return_lse=True,
                                    **dict(kw, sinks=sinks))
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    grad_lse = torch.randn(lse.shape, generator=g)
    loss = (out.float() * grad_out.float()).sum()
    (loss + torch.where(torch.isfinite(lse), lse * grad_lse, 0).sum()).backward()

    ref_leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref_sinks = None if sinks is None else sinks.detach().double().requires_grad_(True)
    ref_out, ref_lse = _reference_of(*ref_leaves, cu_q, cu_k, kw, ref_sinks)
    ref_loss = (ref_out * grad_out.double()).sum()
    (ref_loss + torch.where(torch.isfinite(ref_lse), ref_lse * grad_lse.double(), 0).sum()
     ).backward()
    _assert_gradients_close(leaves, sinks, ref_leaves, ref_sinks, GRAD_TOL[dtype])


def test_sinks_alone_need_a_gradient(seed):
    """Only sinks requires grad: the call takes the autograd path (not the no-grad fast path)
    and gives dsinks; q, k and v get none."""
    q, k, v, cu_q, cu_k = _inputs(seed, torch.float32)
    sinks = _sinks("random", seed).requires_grad_(True)
    out = jfa.jagged_attention(q, k, v, cu_q, cu_k, sinks=sinks, window_size=(3, 0))
    assert out.requires_grad
    out.sum().backward()
    ref_sinks = sinks.detach().double().requires_grad_(True)
    ref_out, _ = reference(q.double(), k.double(), v.double(), cu_q, cu_k, False, (3, 0), 0.0,
                           ref_sinks, 1 / math.sqrt(D))
    ref_out.sum().backward()
    torch.testing.assert_close(sinks.grad.double(), ref_sinks.grad, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert not jfa.jagged_attention(q, k, v, cu_q, cu_k, sinks=sinks).requires_grad


def test_backward_op_returns_dsinks(seed):
    """The backward op's fourth result: dsinks float32 [heads_q] with sinks, empty without."""
    q, k, v, cu_q, cu_k = _inputs(seed, torch.float32)
    sinks = _sinks("random", seed)
    for s in (None, sinks):
        out, lse = torch.ops.jfa.jagged_attention_fwd(q, k, v, cu_q, cu_k, None, None, False,
                                                      None, True, sinks=s, window_left=2)
        results = torch.ops.jfa.jagged_attention_bwd(torch.ones_like(out), q, k, v, out, lse,
                                                     cu_q, cu_k, None, None, False, None, None,
                                                     False, None, 2, -1, 0.0, s)
        assert len(results) == 4
        dsinks = results[3]
        assert dsinks.dtype == torch.float32 and dsinks.shape == ((0,) if s is None else (HQ,))


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_gradcheck(seed):
    """torch.autograd.gradcheck in float32 (the ops take 16- and 32-bit floats) with a window,
    softcap and sinks, over q, k, v and sinks."""
    q, k, v, cu_q, cu_k = _inputs(seed, torch.float32, [2, 3, 0, 4], [3, 1, 2, 4], 2, 1, 4, 3)
    sinks = torch.tensor([0.5, -1.0])
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]

    def f(q, k, v, sinks):
        return jfa.jagged_attention(q, k, v, cu_q, cu_k, window_size=(1, 1), softcap=3.0,
                                    sinks=sinks, return_lse=True)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-3, atol=2e-3, rtol=2e-3)


def test_opcheck_both_ops(seed):
    q, k, v, cu_q, cu_k = _inputs(seed, torch.float32, [3, 0, 6], [4, 2, 5], 2, 1, 16, 8)
    q.requires_grad_(True)
    sinks = _sinks("random", seed, 2).requires_grad_(True)
    word = torch.full((1,), -1, dtype=torch.int32)
    for local in ((3, 1, 0.0, None), (-1, 0, 2.0, sinks), (0, -1, 0.0, sinks)):
        for return_lse in (False, True):
            args = (q, k, v, cu_q, cu_k, 0, 0, False, None, return_lse, False, word, *local)
            torch.library.opcheck(torch.ops.jfa.jagged_attention_fwd.default, args,
                                  test_utils=("test_schema", "test_autograd_registration",
                                              "test_faketensor"))
        # Every test of opcheck (AOT dispatch with the autograd formula and dsinks included).
        torch.library.opcheck(torch.ops.jfa.jagged_attention_fwd.default,
                              (q, k, v, cu_q, cu_k, 0, 0, True, None, True),
                              dict(zip(("window_left", "window_right", "softcap", "sinks"),
                                       local)))
        out, lse = jfa.jagged_attention(q.detach(), k, v, cu_q, cu_k, return_lse=True,
                                        window_size=local[:2], softcap=local[2],
                                        sinks=None if local[3] is None else local[3].detach())
        for grad_lse in (None, torch.randn_like(lse)):
            args = (torch.randn_like(out), q.detach(), k, v, out, lse, cu_q, cu_k, 0, 0, False,
                    None, grad_lse, False, word, *local[:3],
                    None if local[3] is None else local[3].detach())
            torch.library.opcheck(torch.ops.jfa.jagged_attention_bwd.default, args,
                                  test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_with_window_and_sinks(seed):
    """A compiled training step (aot_eager traces the fake kernels, dsinks included) with a window,
    softcap and sinks equals the eager one, gradients of sinks included."""
    q, k, v, cu, _ = _inputs(seed, torch.float32, [4, 11, 0, 1], [4, 11, 0, 1], 2, 2, 16, 16)
    sinks = _sinks("random", seed, 2)

    def f(q, k, v, cu, sinks):
        out = jfa.jagged_attention(q, k, v, cu, causal=True, window_size=(3, -1), sinks=sinks)
        return jfa.jagged_attention(out, k, v, cu, window_size=(2, 2), softcap=4.0) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
        out = fn(*leaves[:3], cu, leaves[3])
        out.square().sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager)


def test_jagged_attention_argument_checks(seed):
    q, k, v, cu, _ = _inputs(seed, torch.float32, [3, 2], [3, 2], 2, 2, 8, 8)
    with pytest.raises(ValueError, match="window_size left must be >= 0, or -1"):
        jfa.jagged_attention(q, k, v, cu, window_size=(-2, 0))
    with pytest.raises(TypeError, match="window_size must be a pair"):
        jfa.jagged_attention(q, k, v, cu, window_size=3)
    with pytest.raises(TypeError, match="window_size right must be an int"):
        jfa.jagged_attention(q, k, v, cu, window_size=(1, 2.0))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
            jfa.jagged_attention(q, k, v, cu, softcap=bad)
    with pytest.raises(TypeError, match="softcap must be a float"):
        jfa.jagged_attention(q, k, v, cu, softcap="2")
    with pytest.raises(TypeError, match=r"sinks must be a float32 torch.Tensor \[heads_q\]"):
        jfa.jagged_attention(q, k, v, cu, sinks=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="sinks must be float32, got torch.float64"):
        jfa.jagged_attention(q, k, v, cu, sinks=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"sinks must have shape \(2,\) \[heads_q\], got \(3,\)"):
        jfa.jagged_attention(q, k, v, cu, sinks=torch.zeros(3))
    with pytest.raises(jfa.JfaInvalidArgumentError, match="sinks must be finite"):
        jfa.jagged_attention(q, k, v, cu, sinks=torch.tensor([0.0, math.nan]))
    # A list of floats is taken as float32 sinks on q's device.
    torch.testing.assert_close(jfa.jagged_attention(q, k, v, cu, sinks=[0.5, -1.0]),
                               jfa.jagged_attention(q, k, v, cu, sinks=torch.tensor([0.5, -1.0])))


def test_device_check_word_with_local_attention(seed):
    """The no-grad fast path with the new arguments still writes and bumps the checked mode's
    word, and the backward (with sinks) checks into it too."""
    q, k, v, cu_q, cu_k = _inputs(seed, torch.float32)
    word = torch.full((1,), -1, dtype=torch.int32)
    before = word._version
    jfa.jagged_attention(q, k, v, cu_q, cu_k, window_size=(2, 2), sinks=_sinks("small", seed),
                         device_check=word)
    assert word.item() == 0 and word._version > before
    word.fill_(-1)
    sinks = _sinks("large", seed).requires_grad_(True)
    out = jfa.jagged_attention(q, k, v, cu_q, cu_k, softcap=2.0, sinks=sinks, device_check=word)
    word.fill_(-1)
    out.sum().backward()
    assert word.item() == 0 and torch.isfinite(sinks.grad).all()


# On CUDA at head_dim 64 (scores of unit normal inputs at the default scale are about +-1, so a
# softcap of 0.5 bends them; sinks around them take a visible share), with longer sequences than
# on the CPU so that windows cross K tiles: the forward against the float64 reference, with and
# without the LSE, in a CUDA graph's capture too; the gradients against float64 autograd.
CUDA_LENGTHS_Q, CUDA_LENGTHS_K = [5, 0, 333, 1, 700, 129, 3], [9, 4, 0, 1, 640, 300, 3]
CUDA_CASES = [dict(c, softcap=0.5) if "softcap" in c else c for c in CASES]
CUDA_IDS = _case_ids(CUDA_CASES)
CUDA_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}
CUDA_GRAD_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}  # relative L2, as the GPU tests'


def _cuda_inputs(seed, dtype):
    return _inputs(seed, dtype, CUDA_LENGTHS_Q, CUDA_LENGTHS_K, 4, 2, 64, 64)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_forward_matches_float64(seed, case, dtype):
    q, k, v, cu_q, cu_k = _cuda_inputs(seed, dtype)
    kw = _kwargs(case, seed)
    ref_out, ref_lse = reference(q.double(), k.double(), v.double(), cu_q, cu_k, kw["causal"],
                                 kw["window_size"], kw["softcap"],
                                 None if kw["sinks"] is None else kw["sinks"].double(), 0.125)
    dev = [t.cuda() for t in (q, k, v, cu_q, cu_k)]
    if kw["sinks"] is not None:
        kw["sinks"] = kw["sinks"].cuda()
    out, lse = jfa.jagged_attention(*dev, return_lse=True, **kw)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=CUDA_TOL[dtype],
                               rtol=CUDA_TOL[dtype])
    lse = lse.cpu()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-3, rtol=1e-4)
    assert torch.equal(jfa.jagged_attention(*dev, **kw), out)
    graph_out = torch.full_like(out, float("nan"))
    graph = torch.cuda.CUDAGraph()
    jfa.jagged_attention(*dev, **kw)  # warm-up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        graph_out.copy_(jfa.jagged_attention(*dev, **kw))
    graph.replay()
    assert torch.equal(graph_out, out)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_gradients_match_float64_autograd(seed, case, dtype):
    q, k, v, cu_q, cu_k = _cuda_inputs(seed, dtype)
    kw = _kwargs(case, seed)
    leaves = [t.cuda().requires_grad_(True) for t in (q, k, v)]
    sinks = None if kw["sinks"] is None else kw["sinks"].cuda().requires_grad_(True)
    out, lse = jfa.jagged_attention(*leaves, cu_q.cuda(), cu_k.cuda(), return_lse=True,
                                    **dict(kw, sinks=sinks))
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    grad_lse = torch.randn(lse.shape, generator=g)
    loss = (out.float() * grad_out.cuda().float()).sum()
    (loss + torch.where(torch.isfinite(lse), lse * grad_lse.cuda(), 0).sum()).backward()

    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref_sinks = None if sinks is None else kw["sinks"].double().requires_grad_(True)
    ref_out, ref_lse = reference(*ref_leaves, cu_q, cu_k, kw["causal"], kw["window_size"],
                                 kw["softcap"], ref_sinks, 0.125)
    ref_loss = (ref_out * grad_out.double()).sum()
    (ref_loss + torch.where(torch.isfinite(ref_lse), ref_lse * grad_lse.double(), 0).sum()
     ).backward()
    _assert_gradients_close(leaves, sinks, ref_leaves, ref_sinks, CUDA_GRAD_TOL[dtype])


@needs_cuda
def test_cuda_sinks_must_be_on_the_device(seed):
    q, k, v, cu_q, _ = (t.cuda() for t in _inputs(seed, torch.float16, [5, 9], [5, 9], 2, 2, 64,
                                                   64))
    with pytest.raises(ValueError, match=r"sinks must be on the device of q \(cuda:0\), got cpu"):
        jfa.jagged_attention(q, k, v, cu_q, sinks=torch.zeros(2))
