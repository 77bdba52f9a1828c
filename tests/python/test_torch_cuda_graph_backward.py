"""CUDA graphs of the backward on its own (Hopper): torch.cuda.make_graphed_callables over
jfa.jagged_attention (one graph for the forward, one for the backward), and the backward of a
forward that ran before the capture. Skipped, with the reason, without torch, a
compute-capability-9.0 GPU or a CUDA build of libjfa.

torch runs a node's backward on the stream its forward ran on, and a capture rejects work on the
legacy default stream: a forward that ran there before the capture cannot have its backward
captured, for any op (aten's included). These tests run the forward on a side stream, as
torch.cuda.graph's rules ask."""

import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}", allow_module_level=True)

import torch  # noqa: E402

from cuda_skip import cuda_skip_reason  # noqa: E402
from test_torch_cuda_backward import _check_grads, _inputs, _reference_grads, _unseen  # noqa: E402

_REASON = cuda_skip_reason()
pytestmark = pytest.mark.skipif(bool(_REASON), reason=_REASON or "n/a")

LENGTHS = [0, 1, 63, 65, 300, 17, 129]


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_make_graphed_callables_replays_forward_and_backward(seed, causal):
    q, k, v, cu, _ = _inputs(seed, LENGTHS, None, 8, 2, 128, torch.float16)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(q.shape, generator=g).to("cuda", torch.float16)

    def attend(q, k, v):
        return jfa.jagged_attention(q, k, v, cu, max_seqlen_q=300, max_seqlen_k=300,
                                    causal=causal)

    graphed = torch.cuda.make_graphed_callables(attend, (q, k, v))
    want = _reference_grads(q, k, v, cu, cu, causal, grad_out, None)
    for _ in range(2):  # each replay writes fresh gradients into .grad
        for t in (q, k, v):
            t.grad = None
        out = graphed(q, k, v)
        out.backward(grad_out)
        torch.cuda.synchronize()
        _check_grads((q.grad, k.grad, v.grad), want, torch.float16, _unseen(cu, cu, causal))


def test_backward_of_an_earlier_forward_captures_and_replays(seed):
    """The forward runs eagerly (on a side stream) before the capture; only torch.autograd.grad is
    captured, then replayed twice."""
    q, k, v, cu, _ = _inputs(seed, LENGTHS, None, 8, 2, 128, torch.float16)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(q.shape, generator=g).to("cuda", torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = jfa.jagged_attention(q, k, v, cu)
        torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    want = _reference_grads(q, k, v, cu, cu, False, grad_out, None)
    for _ in range(2):
        for t in grads:
            t.fill_(float("nan"))  # poison: the replay must write every element
        graph.replay()
        torch.cuda.synchronize()
        _check_grads(grads, want, torch.float16, _unseen(cu, cu, False))
