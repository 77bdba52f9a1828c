"""jfa.distributed (context parallelism) on the CPU: the plan, shard/unshard, and
context_parallel_attention over 2 and 4 gloo processes against one jfa.jagged_attention call on
the whole batch (out, LSE, dq, dk, dv). Skipped, with the reason, without torch or gloo.

The processes are started once per world size (a module-scoped fixture: each start costs a few
seconds of imports); they run every case and save their shards' results, which the tests compare
here with the single-process call."""

import os
import time
from datetime import timedelta

import pytest

import jfa

if not jfa.torch_available():
    pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}",
                allow_module_level=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
if not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend in this torch build",
                allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import jfa.distributed as jd  # noqa: E402

# Long, short and zero-length sequences. With MIN_CHUNK_TOKENS = 8, two ranks split the sequences
# of 37, 130 and 64 tokens (>= 2 * 2 * 8) and four ranks those of 130 and 64 (>= 64; 130 into
# chunks of 16 and 17), the others stay whole.
LENGTHS = [37, 0, 130, 5, 64, 1]
MIN_CHUNK_TOKENS = 8
SEED = 20240611

CASES = {
    "causal-gqa": dict(lengths=LENGTHS, heads=(4, 2), head_dim=16, head_dim_v=16, causal=True),
    "full-gqa": dict(lengths=LENGTHS, heads=(4, 2), head_dim=16, head_dim_v=16, causal=False),
    # A value head size of its own, a scale, and the LSE returned and used by the loss.
    "causal-mha-lse": dict(lengths=LENGTHS, heads=(2, 2), head_dim=32, head_dim_v=8, causal=True,
                           softmax_scale=0.3, return_lse=True),
    "full-mqa-lse": dict(lengths=LENGTHS, heads=(4, 1), head_dim=16, head_dim_v=16, causal=False,
                         return_lse=True),
    # Fewer sequences than ranks: with four, two ranks hold no token (zero-size messages).
    "few-tokens": dict(lengths=[3, 0, 2], heads=(2, 1), head_dim=16, head_dim_v=16, causal=True),
    # 16-bit inputs: partial outputs rounded to bfloat16 before the merge, dK/dV summed in float32.
    "causal-gqa-bf16": dict(lengths=LENGTHS, heads=(4, 2), head_dim=16, head_dim_v=16,
                            causal=True, dtype=torch.bfloat16),
}

# Against one jagged_attention call, as a fraction of the largest magnitude of each result. The
# ring sums the same products in another order (per block, then merged through
# exp(lse_block - lse); dK/dV summed over the ranks), so results differ by rounding: in float32 on
# this CPU backend at most 5e-7 for out, 2e-7 for the LSE and 1.2e-6 for dq, dk and dv (printed
# with -s); 2e-5 leaves room for other orders of summation (another thread count, another CPU).
# In bfloat16 each block's partial output and gradients are rounded to bfloat16 (one unit in the
# last place is 2^-8 = 3.9e-3 relative): measured at most 7e-3, allowed 2e-2. The mistakes tried
# (a wrong mask, a block's dK/dV lost on the way, a wrong merge weight) put some result off by
# 0.1 to 1, in every case they concern.
RTOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _inputs(case, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(case["lengths"])
    hq, hkv = case["heads"]
    dtype = case.get("dtype", torch.float32)
    q = torch.randn((total, hq, case["head_dim"]), generator=g).to(dtype)
    k = torch.randn((total, hkv, case["head_dim"]), generator=g).to(dtype)
    v = torch.randn((total, hkv, case["head_dim_v"]), generator=g).to(dtype)
    grad_out = torch.randn((total, hq, case["head_dim_v"]), generator=g).to(dtype)
    grad_lse = torch.randn((hq, total), generator=g)
    cu = jfa.lengths_to_offsets(torch.tensor(case["lengths"]))
    return dict(q=q, k=k, v=v, grad_out=grad_out, grad_lse=grad_lse, cu_seqlens=cu)


def _loss(out, lse, grad_out, grad_lse):
    loss = (out.float() * grad_out.float()).sum()
    if lse is not None:
        loss = loss + (lse * grad_lse).sum()
    return loss


def _worker(rank, world_size, store_path, inputs_path, results_dir):
    """One rank: every case through context_parallel_attention, forward and backward."""
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))  # a hang fails instead of waiting
    try:
        inputs = torch.load(inputs_path)
        results = {}
        for name, case in CASES.items():
            x = inputs[name]
            plan = jd.shard_jagged_batch(x["cu_seqlens"], world_size,
                                         min_chunk_tokens=MIN_CHUNK_TOKENS)
            q, k, v = (jd.shard(x[n], plan, rank).requires_grad_() for n in ("q", "k", "v"))
            start = time.perf_counter()
            result = jd.context_parallel_attention(
                q, k, v, plan, causal=case["causal"], softmax_scale=case.get("softmax_scale"),
                return_lse=case.get("return_lse", False))
            out, lse = result if case.get("return_lse") else (result, None)
            _loss(out, lse, jd.shard(x["grad_out"], plan, rank),
                  jd.shard(x["grad_lse"], plan, rank, dim=1)).backward()
            results[name] = dict(out=out.detach(), lse=None if lse is None else lse.detach(),
                                 dq=q.grad, dk=k.grad, dv=v.grad, tokens=q.shape[0],
                                 seconds=time.perf_counter() - start)
        torch.save(results, os.path.join(results_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def world(request, tmp_path_factory):
    """Runs the workers of one world size; returns (world_size, inputs, results of each rank)."""
    world_size = request.param
    tmp = tmp_path_factory.mktemp(f"world{world_size}")
    inputs = {name: _inputs(case, SEED + i) for i, (name, case) in enumerate(CASES.items())}
    torch.save(inputs, tmp / "inputs.pt")
    start = time.monotonic()
    # One thread each (read by the CPU backend when a process starts it): the ranks share the
    # machine's cores.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JFA_NUM_THREADS", "1")
        env.setenv("OMP_NUM_THREADS", "1")
        context = mp.start_processes(
            _worker, args=(world_size, str(tmp / "store"), str(tmp / "inputs.pt"), str(tmp)),
            nprocs=world_size, join=False, start_method="spawn")
    try:
        while not context.join(timeout=1):  # raises with the traceback of a failed worker
            if time.monotonic() - start > 180:
                pytest.fail(f"the {world_size} workers did not finish in 180 s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    print(f"{world_size} workers: {time.monotonic() - start:.1f} s")
    results = [torch.load(tmp / f"rank{r}.pt") for r in range(world_size)]
    return world_size, inputs, results


def _reference(case, x):
    """One jfa.jagged_attention call on the whole batch, with the workers' loss."""
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = jfa.jagged_attention(q, k, v, x["cu_seqlens"], causal=case["causal"],
                                    softmax_scale=case.get("softmax_scale"), return_lse=True)
    used_lse = lse if case.get("return_lse") else None
    _loss(out, used_lse, x["grad_out"], x["grad_lse"]).backward()
    return dict(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)


def _assert_close(name, got, want):
    assert got.dtype == want.dtype, name
    tolerance = RTOL[want.dtype]
    got, want = got.float(), want.float()
    scale = want.abs().max().item() if want.numel() else 0.0
    if want.numel():
        print(f"{name}: max error {(got - want).abs().max().item() / max(scale, 1e-30):.1e} of "
              "the largest magnitude")
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance * max(scale, 1e-30),
                               msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case_name", list(CASES))
def test_matches_one_call_on_the_whole_batch(world, case_name):
    world_size, inputs, results = world
    case, x = CASES[case_name], inputs[case_name]
    want = _reference(case, x)
    plan = jd.shard_jagged_batch(x["cu_seqlens"], world_size, min_chunk_tokens=MIN_CHUNK_TOKENS)
    for rank in range(world_size):
        got = results[rank][case_name]
        for key in ("out", "dq", "dk", "dv"):
            _assert_close(f"rank {rank} {key}", got[key], jd.shard(want[key], plan, rank))
        if case.get("return_lse"):
            _assert_close(f"rank {rank} lse", got["lse"], jd.shard(want["lse"], plan, rank, dim=1))
    # The shards put back together are the whole batch's result.
    for key in ("out", "dq", "dk", "dv"):
        _assert_close(f"unsharded {key}", jd.unshard([r[case_name][key] for r in results], plan),
                      want[key])


def test_the_cases_cover_what_they_claim(world):
    """Split and whole sequences at every world size, and ranks without tokens at four."""
    world_size, inputs, results = world
    plan = jd.shard_jagged_batch(inputs["causal-gqa"]["cu_seqlens"], world_size,
                                 min_chunk_tokens=MIN_CHUNK_TOKENS)
    assert plan.split_sequences == ((0, 2, 4) if world_size == 2 else (2, 4))
    tokens = [results[r]["few-tokens"]["tokens"] for r in range(world_size)]
    assert sorted(tokens) == ([2, 3] if world_size == 2 else [0, 0, 2, 3])
    print("seconds per case and rank:", {name: [round(results[r][name]["seconds"], 3)
                                               for r in range(world_size)] for name in CASES})


# ---- single process: the plan, shard/unshard, errors --------------------------------------------

def _offsets(lengths):
    return [0] + torch.tensor(lengths).cumsum(0).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_plan_places_every_token_once_zigzag(world_size):
    offsets = _offsets(LENGTHS)
    plan = jd.shard_jagged_batch(torch.tensor(offsets, dtype=torch.int32), world_size,
                                 min_chunk_tokens=MIN_CHUNK_TOKENS)
    assert plan.world_size == world_size and plan.total_tokens == sum(LENGTHS)
    everything = torch.cat([r.token_indices for r in plan.ranks])
    assert torch.equal(everything.sort().values, torch.arange(sum(LENGTHS)))
    chunks = 2 * world_size
    for r in plan.ranks:
        assert torch.equal(r.token_indices, r.token_indices.sort().values)  # batch order
        assert r.cu_seqlens.dtype == torch.int32
        assert r.cu_seqlens.tolist() == _offsets(list(r.chunk_lengths))
        expected_indices, expected_positions, cost = [], [], 0
        for seq, start, length in zip(r.chunk_sequences, r.chunk_starts, r.chunk_lengths):
            n = LENGTHS[seq]
            if seq in plan.split_sequences:
                # This rank's chunks of a split sequence: chunks r and 2W - 1 - r.
                bounds = [c * n // chunks for c in range(chunks + 1)]
                c = bounds.index(start)
                assert c in (r.rank, chunks - 1 - r.rank) and bounds[c + 1] - start == length
            else:
                assert (start, length) == (0, n)
            expected_indices += range(offsets[seq] + start, offsets[seq] + start + length)
            expected_positions += range(start, start + length)
            cost += sum(i + 1 for i in range(start, start + length))
        assert r.token_indices.tolist() == expected_indices
        assert r.position_ids.tolist() == expected_positions
        assert r.causal_cost == cost
    threshold = chunks * MIN_CHUNK_TOKENS
    assert plan.split_sequences == tuple(
        s for s, n in enumerate(LENGTHS) if world_size > 1 and n >= threshold)
    for seq in plan.split_sequences:  # each rank holds exactly two chunks of it
        assert all(r.chunk_sequences.count(seq) == 2 for r in plan.ranks)


def test_plan_balances_one_long_and_many_short_sequences():
    """Causal costs per rank within the largest whole sequence's cost of each other (the bound
    of placing longest first onto the least loaded rank) and within 1% of the mean; a contiguous
    split of the long sequence, or short sequences dealt out in turn, would be far off."""
    g = torch.Generator().manual_seed(SEED)
    short = torch.randint(1, 200, (60,), generator=g).tolist()
    lengths = short[:20] + [4096] + short[20:]
    world_size = 4
    plan = jd.shard_jagged_batch(_offsets(lengths), world_size, min_chunk_tokens=32)
    assert plan.split_sequences == (20,)
    costs = plan.costs
    assert sum(costs) == sum(n * (n + 1) // 2 for n in lengths)
    largest_whole = max(n * (n + 1) // 2 for n in short)
    assert max(costs) - min(costs) <= largest_whole, costs
    mean = sum(costs) / world_size
    assert max(costs) <= 1.01 * mean, costs
    # The long sequence's share is balanced on its own (zigzag), within a few chunk rows.
    long_share = [sum(sum(i + 1 for i in range(s, s + n))
                      for q, s, n in zip(r.chunk_sequences, r.chunk_starts, r.chunk_lengths)
                      if q == 20) for r in plan.ranks]
    assert max(long_share) - min(long_share) <= 2 * 4096, long_share


def test_plan_places_whole_sequences_longest_first():
    """Whole sequences go longest first to the least loaded rank, ties to the lowest rank:
    costs 6 (3 tokens) to rank 0, then 3 and 1 to rank 1; shortest first would give (7, 3)."""
    plan = jd.shard_jagged_batch([0, 1, 3, 6], 2)
    assert [r.chunk_sequences for r in plan.ranks] == [(2,), (0, 1)]
    assert plan.costs == (6, 4)
    assert [r.chunk_sequences for r in jd.shard_jagged_batch([0, 2, 4], 2).ranks] == [(0,), (1,)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shard_unshard_round_trip(world_size):
    plan = jd.shard_jagged_batch(_offsets(LENGTHS), world_size, min_chunk_tokens=MIN_CHUNK_TOKENS)
    total = sum(LENGTHS)
    x = torch.randn(total, 3, 5, requires_grad=True)
    parts = [jd.shard(x, plan, r) for r in range(world_size)]
    for r, part in enumerate(parts):
        assert torch.equal(part, x.detach()[plan.ranks[r].token_indices])
    assert torch.equal(jd.unshard(parts, plan), x)
    assert torch.equal(jd.unshard(torch.cat(parts), plan), x)  # gathered in rank order
    jd.unshard(parts, plan).mul(torch.arange(total).view(-1, 1, 1)).sum().backward()
    assert torch.equal(x.grad, torch.arange(total, dtype=x.dtype).view(-1, 1, 1).expand_as(x))
    lse = torch.randn(4, total)  # tokens along dim 1
    lse_parts = [jd.shard(lse, plan, r, dim=1) for r in range(world_size)]
    assert torch.equal(jd.unshard(lse_parts, plan, dim=1), lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_rank_runs_without_a_process_group(causal):
    """A one-rank plan: the same result as jagged_attention, with no process group."""
    case = dict(CASES["causal-mha-lse"], causal=causal)
    x = _inputs(case, SEED)
    want = _reference(case, x)
    plan = jd.shard_jagged_batch(x["cu_seqlens"], 1)
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = jd.context_parallel_attention(q, k, v, plan, causal=causal, softmax_scale=0.3,
                                             return_lse=True)
    _loss(out, lse, x["grad_out"], x["grad_lse"]).backward()
    for name, got in (("out", out), ("lse", lse), ("dq", q.grad), ("dk", k.grad),
                      ("dv", v.grad)):
        _assert_close(name, got.detach(), want[name])


def test_errors():
    plan = jd.shard_jagged_batch(_offsets([5, 7]), 1)
    q, k, v = torch.randn(12, 2, 8), torch.randn(12, 1, 8), torch.randn(12, 1, 8)
    for kwargs, what in ((dict(window_size=(4, 0)), "sliding windows"),
                         (dict(softcap=30.0), "softcap"),
                         (dict(sinks=torch.zeros(2)), "attention sinks")):
        with pytest.raises(NotImplementedError, match=f"does not support {what}"):
            jd.context_parallel_attention(q, k, v, plan, **kwargs)
    with pytest.raises(ValueError, match=r"self-attention only .* got q 12, k 9, v 9"):
        jd.context_parallel_attention(q, k[:9], v[:9], plan)
    with pytest.raises(TypeError, match="plan must be a JaggedShardPlan"):
        jd.context_parallel_attention(q, k, v, _offsets([5, 7]))
    two_ranks = jd.shard_jagged_batch(_offsets([5, 7]), 2)
    with pytest.raises(RuntimeError, match="needs an initialized torch.distributed process group"):
        jd.context_parallel_attention(q[:5], k[:5], v[:5], two_ranks)
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        jd.shard_jagged_batch([0, 5], 0)
    with pytest.raises(ValueError, match=r"non-decreasing; cu_seqlens\[2\]=3 < cu_seqlens\[1\]=5"):
        jd.shard_jagged_batch([0, 5, 3], 2)
    with pytest.raises(ValueError, match="must start with 0"):
        jd.shard_jagged_batch([1, 5], 2)
    with pytest.raises(ValueError, match="tensor has 11 tokens along dim 0, the plan's batch 12"):
        jd.shard(q[:11], plan, 0)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        jd.shard(q, two_ranks, 2)
    with pytest.raises(ValueError, match="one shard per rank"):
        jd.unshard([q], two_ranks)
