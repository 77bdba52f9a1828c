"""Context parallelism for jagged batches: the attention of one packed batch spread over the ranks
of a ``torch.distributed`` process group, each rank holding a share of every long sequence.

    import jfa.distributed as jd

    plan = jd.shard_jagged_batch(cu_seqlens, world_size)       # the same on every rank
    q_local, k_local, v_local = (jd.shard(t, plan, rank) for t in (q, k, v))
    out_local = jd.context_parallel_attention(q_local, k_local, v_local, plan, causal=True)
    out = jd.unshard([out_of_rank_0, out_of_rank_1, ...], plan)  # where the whole batch is wanted

The plan (:func:`shard_jagged_batch`)
-------------------------------------
Tokens, not sequences, are assigned to ranks, so that every rank has about the same causal work
(query-key pairs ``j <= i``):

- A sequence of at least ``2 * world_size * min_chunk_tokens`` tokens is *split*: cut into
  ``2 * world_size`` chunks of near-equal length (chunk ``c`` holds positions
  ``[c * n // (2W), (c + 1) * n // (2W))``), and rank ``r`` takes chunks ``r`` and
  ``2W - 1 - r`` ("zigzag"): an early chunk, cheap under a causal mask, with a late, costly one.
- A shorter sequence is kept whole on one rank (chunks of fewer than ``min_chunk_tokens`` tokens
  would waste the kernels' tiles and the messages' latency). These go, longest first, each to the
  rank whose causal cost is lowest so far (ties: the lowest rank), after the split sequences have
  been placed.
- Zero-length sequences are on no rank.

The cost of a rank is the number of causal pairs of its queries: a chunk at positions
``[s, s + n)`` of its sequence costs ``sum_{i=s}^{s+n-1} (i + 1)`` (a whole sequence
``n (n + 1) / 2``). The same plan serves non-causal attention, where split sequences spread evenly
too and whole ones are placed by the same (causal) cost.

A :class:`JaggedShardPlan` holds, for each rank, a :class:`RankShard`: ``token_indices`` (int64,
ascending: the positions in the packed batch of its tokens, its chunks in batch order),
``cu_seqlens`` (int32 local offsets, one entry per chunk plus one: each chunk is one query
sequence of the local attention), ``chunk_sequences`` (the batch index of each chunk's sequence),
``chunk_starts`` (the position of each chunk's first token within its sequence: the global
offset that the causal mask against other ranks' keys needs), ``chunk_lengths``,
``position_ids`` (int64, each token's position within its sequence, e.g. for rotary embeddings)
and ``causal_cost``. Every rank must build the same plan (the function is deterministic: give it
the same offsets and arguments everywhere). :func:`shard` takes a rank's tokens out of a packed
tensor, :func:`unshard` puts the ranks' shards back in batch order.

The attention (:func:`context_parallel_attention`)
--------------------------------------------------
Each rank passes its shard of q, k and v and gets its shard of the output, exactly the rows that
``jfa.jagged_attention`` would give on the whole batch (up to float rounding), differentiable in
q, k and v. Self-attention only: every sequence's queries are its keys (``len_q == len_k``), as
one plan over one ``cu_seqlens`` describes.

Forward: a ring. K and V travel together (one message of ``[tokens, heads_kv, head_dim +
head_dim_v]``) around the ranks: at step ``s`` rank ``r`` holds the block of rank
``(r - s) mod W`` and has already posted the exchange that sends it to rank ``r + 1`` and
receives the next one from rank ``r - 1`` (``dist.batch_isend_irecv``), so the transfer overlaps
the attention of its queries against the block in hand. Each step is one ``jfa.jagged_attention``
call in which every local query chunk is one sequence and its keys are those of the block's chunks
it may see, gathered in position order:

- causal: a key chunk of the same sequence that lies entirely before the query chunk is seen in
  full, the query chunk's own chunk causally, a later chunk not at all. The own chunk is only in
  the rank's own block (step 0); placed after the earlier chunks, as the last keys, it makes the
  bottom-right aligned causal mask of jagged_attention exactly "every earlier key, then
  ``j <= i``". The other steps only see whole earlier chunks: a non-causal call. So each step is
  one call.
- not causal: every chunk of the same sequence is seen; the local chunks of one sequence form one
  query sequence (no key is gathered twice).

Each call returns a partial ``(out, lse)``; the partials are merged by their log-sum-exps in
float32 (``lse = logaddexp(lse_a, lse_b)``, ``out = out_a exp(lse_a - lse) + out_b exp(lse_b -
lse)``; a row with ``-inf`` on both sides, no key seen yet, stays 0 and ``-inf``).

Backward: the ring again, with the merged (global) ``out`` and ``lse`` of the forward. Given the
global ``out`` and ``lse``, ``torch.ops.jfa.jagged_attention_bwd`` on one block gives exactly that
block's share of the gradients: it recomputes ``P = exp(S - lse)``, the global probabilities of
the block's pairs, and ``D = rowsum(dO * O)`` of the global output. dQ sums locally. dK and dV of
a block are summed into an accumulator (float32, whatever the inputs' dtype, so that W partial
sums are not each rounded) that travels with the block: rank ``r`` adds its share of block
``(r - s) mod W`` at step ``s`` and passes the accumulator to rank ``r + 1``, which works on that
block at step ``s + 1``; after the last step the next rank is the block's owner, which so receives
its complete dK and dV. A ring rather than a reduce-scatter (or all-reduce) of dK/dV: those
would need every rank to hold dK/dV for the whole batch (memory of all blocks, not one), padded
to equal blocks (the blocks differ in size: a plan balances work, not tokens), and could only
start after the last step; the ring's messages are the size of the keys' and overlap the next
step's compute as in the forward. K and V are sent around again rather than kept from the
forward (memory: one block at a time).

Communication is torch.distributed point-to-point only (``P2POp`` + ``batch_isend_irecv``, the
keys and values with tag 0, the gradients with tag 1), so gloo (CPU tensors) and NCCL (CUDA
tensors; ``torch.cuda.set_device`` as NCCL needs) run the same code. Every rank takes part in
every exchange, with zero-size messages where a rank holds no tokens.

Supported: float16, bfloat16 and float32 (the partial outputs are in the inputs' dtype, so 16-bit
results differ from a single call's by a little more rounding), GQA/MQA (``heads_kv`` dividing
``heads_q``), ``head_dim_v`` of its own, causal or not, ``softmax_scale``, ``return_lse`` (the
merged LSE, differentiable), ranks without tokens. Not (yet): cross attention (``len_q !=
len_k``: ValueError), sliding windows, softcap and attention sinks (NotImplementedError),
gradients of the gradients. Every rank must call the forward and, where gradients are taken, the
backward: both are collective.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._torch_support import torch
from ._torch_support import unavailable_reason as _torch_unavailable_reason

if torch is None:
    raise ImportError(f"jfa.distributed needs jfa's torch support: {_torch_unavailable_reason}")

import torch.distributed as dist  # noqa: E402
from torch import Tensor  # noqa: E402

from .attention import jagged_attention  # noqa: E402

__all__ = ["DEFAULT_MIN_CHUNK_TOKENS", "JaggedShardPlan", "RankShard", "shard_jagged_batch",
           "shard", "unshard", "context_parallel_attention"]

# A chunk shorter than this is not worth its own share of a split: the GPU kernels take query rows
# in tiles of 64 to 192, and a short chunk leaves most of its tile idle.
DEFAULT_MIN_CHUNK_TOKENS = 128

_KV_TAG = 0
_GRAD_TAG = 1


class _Chunk(NamedTuple):
    sequence: int  # index of its sequence in the batch
    start: int  # position of its first token within the sequence
    length: int


def _causal_pairs(start: int, length: int) -> int:
    """Query-key pairs j <= i of the queries at positions [start, start + length)."""
    end = start + length
    return (end * (end + 1) - start * (start + 1)) // 2


@dataclass(frozen=True, eq=False)
class RankShard:
    """What one rank holds under a :class:`JaggedShardPlan`."""

    rank: int
    token_indices: Tensor  # int64 [num_tokens]: positions in the packed batch, ascending
    cu_seqlens: Tensor  # int32 [num_chunks + 1]: local offsets of its chunks
    chunk_sequences: Tuple[int, ...]  # batch index of each chunk's sequence
    chunk_starts: Tuple[int, ...]  # position of each chunk's first token within its sequence
    chunk_lengths: Tuple[int, ...]
    position_ids: Tensor  # int64 [num_tokens]: each token's position within its sequence
    causal_cost: int  # causal query-key pairs of its queries

    @property
    def num_tokens(self) -> int:
        return int(self.token_indices.shape[0])

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_lengths)

    @property
    def max_chunk_length(self) -> int:
        return max(self.chunk_lengths, default=0)

    def chunks(self) -> List[_Chunk]:
        return [_Chunk(*c) for c in zip(self.chunk_sequences, self.chunk_starts,
                                        self.chunk_lengths)]


@dataclass(frozen=True, eq=False)
class JaggedShardPlan:
    """The assignment of a packed batch's tokens to ranks (see the module's docstring)."""

    world_size: int
    seq_lengths: Tuple[int, ...]
    min_chunk_tokens: int
    split_sequences: Tuple[int, ...]  # batch indices of the sequences cut into 2W chunks
    ranks: Tuple[RankShard, ...]
    # Per device: index tensors moved there, ring schedules (built once, reused every call).
    _cache: Dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lengths)

    @property
    def costs(self) -> Tuple[int, ...]:
        """The causal cost of each rank."""
        return tuple(r.causal_cost for r in self.ranks)

    def _cached(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def _token_indices(self, rank: int, device) -> Tensor:
        return self._cached(("indices", rank, str(device)),
                            lambda: self.ranks[rank].token_indices.to(device))

    def _unshard_order(self, device) -> Tensor:
        """For each batch position, where its token is in the ranks' shards concatenated."""
        def build():
            gathered = torch.cat([r.token_indices for r in self.ranks])
            order = torch.empty_like(gathered)
            order[gathered] = torch.arange(gathered.shape[0])
            return order.to(device)
        return self._cached(("unshard", str(device)), build)


def _host_offsets(cu_seqlens) -> List[int]:
    """cu_seqlens (tensor, array or list) as checked Python ints (a host sync for CUDA)."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
            raise ValueError("cu_seqlens must be a 1-D integer tensor (batch + 1 offsets), got "
                             f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
        offsets = cu_seqlens.tolist()
    else:
        try:
            offsets = [int(x) for x in cu_seqlens]
        except TypeError:
            raise TypeError("cu_seqlens must be a tensor or a sequence of ints, got "
                            f"{type(cu_seqlens).__name__}") from None
    if not offsets or offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start with 0 (batch + 1 offsets), got {offsets[:1]}")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ValueError(f"cu_seqlens must be non-decreasing; cu_seqlens[{i}]={offsets[i]} < "
                             f"cu_seqlens[{i - 1}]={offsets[i - 1]}")
    return offsets


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _rank_shard(rank: int, chunks: List[_Chunk], offsets: List[int], cost: int) -> RankShard:
    chunks = sorted(chunks)  # batch order: by sequence, then position
    lengths = torch.tensor([c.length for c in chunks], dtype=torch.int64)
    local_starts = torch.cumsum(lengths, 0) - lengths  # where each chunk begins in the shard
    num_tokens = int(lengths.sum())
    # Each token's position within its chunk, from one arange over the shard.
    within_chunk = torch.arange(num_tokens) - torch.repeat_interleave(local_starts, lengths)
    starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    batch_starts = torch.tensor([offsets[c.sequence] + c.start for c in chunks], dtype=torch.int64)
    cu = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return RankShard(
        rank=rank,
        token_indices=torch.repeat_interleave(batch_starts, lengths) + within_chunk,
        cu_seqlens=cu,
        chunk_sequences=tuple(c.sequence for c in chunks),
        chunk_starts=tuple(c.start for c in chunks),
        chunk_lengths=tuple(c.length for c in chunks),
        position_ids=torch.repeat_interleave(starts, lengths) + within_chunk,
        causal_cost=cost)


def shard_jagged_batch(cu_seqlens, world_size: int, *,
                       min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS) -> JaggedShardPlan:
    """Plans which rank holds which tokens of a packed batch, balancing causal work.

    Args:
        cu_seqlens: the batch's ``batch + 1`` offsets (a tensor, read on the host, or a list).
        world_size: the number of ranks (the size of the process group that will run it).
        min_chunk_tokens: a sequence is split zigzag into ``2 * world_size`` chunks when it has
            at least ``2 * world_size * min_chunk_tokens`` tokens; shorter ones stay whole on one
            rank. With one rank nothing is split.

    Returns:
        A :class:`JaggedShardPlan` (see the module's docstring for its fields).
    """
    offsets = _host_offsets(cu_seqlens)
    world_size = _positive_int("world_size", world_size)
    min_chunk_tokens = _positive_int("min_chunk_tokens", min_chunk_tokens)
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    num_chunks = 2 * world_size
    chunks_of_rank: List[List[_Chunk]] = [[] for _ in range(world_size)]
    costs = [0] * world_size
    split, whole = [], []
    for seq, n in enumerate(lengths):
        if n == 0:
            continue
        if world_size > 1 and n >= num_chunks * min_chunk_tokens:
            split.append(seq)
            bounds = [c * n // num_chunks for c in range(num_chunks + 1)]
            for rank in range(world_size):
                for c in (rank, num_chunks - 1 - rank):  # an early and a late chunk
                    chunk = _Chunk(seq, bounds[c], bounds[c + 1] - bounds[c])
                    chunks_of_rank[rank].append(chunk)
                    costs[rank] += _causal_pairs(chunk.start, chunk.length)
        else:
            whole.append(seq)
    # Longest first onto the least loaded rank: the most loaded rank got its last sequence while
    # it was the least loaded, so the ranks end within that sequence's cost of each other (plus
    # the split sequences' rounding), and longest first keeps the sequences placed last small.
    for seq in sorted(whole, key=lambda s: -lengths[s]):
        rank = min(range(world_size), key=costs.__getitem__)
        chunks_of_rank[rank].append(_Chunk(seq, 0, lengths[seq]))
        costs[rank] += _causal_pairs(0, lengths[seq])
    return JaggedShardPlan(
        world_size=world_size, seq_lengths=tuple(lengths), min_chunk_tokens=min_chunk_tokens,
        split_sequences=tuple(split),
        ranks=tuple(_rank_shard(r, chunks_of_rank[r], offsets, costs[r])
                    for r in range(world_size)))


def _check_plan(plan) -> None:
    if not isinstance(plan, JaggedShardPlan):
        raise TypeError("plan must be a JaggedShardPlan (from jfa.distributed.shard_jagged_batch), "
                        f"got {type(plan).__name__}")


def _check_rank(plan: JaggedShardPlan, rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) \
            or not 0 <= rank < plan.world_size:
        raise ValueError(f"rank must be an int in [0, {plan.world_size}), got {rank!r}")
    return int(rank)


def shard(tensor: Tensor, plan: JaggedShardPlan, rank: int, *, dim: int = 0) -> Tensor:
    """The tokens of ``rank`` (dimension ``dim`` of ``tensor`` runs over the packed batch), in the
    plan's order. Differentiable (an ``index_select``)."""
    _check_plan(plan)
    rank = _check_rank(plan, rank)
    if tensor.shape[dim] != plan.total_tokens:
        raise ValueError(f"tensor has {tensor.shape[dim]} tokens along dim {dim}, the plan's batch "
                         f"{plan.total_tokens}")
    return tensor.index_select(dim, plan._token_indices(rank, tensor.device))


def unshard(parts, plan: JaggedShardPlan, *, dim: int = 0) -> Tensor:
    """The inverse of :func:`shard`: the whole packed batch from the ranks' shards.

    ``parts`` is a list of the ``world_size`` shards in rank order, or one tensor holding them
    concatenated along ``dim`` (what a gather of the shards gives). Differentiable."""
    _check_plan(plan)
    if isinstance(parts, (list, tuple)):
        if len(parts) != plan.world_size:
            raise ValueError(f"parts must hold one shard per rank ({plan.world_size}), got "
                             f"{len(parts)}")
        for rank, part in enumerate(parts):
            if part.shape[dim] != plan.ranks[rank].num_tokens:
                raise ValueError(f"the shard of rank {rank} has {part.shape[dim]} tokens along "
                                 f"dim {dim}, the plan gives it {plan.ranks[rank].num_tokens}")
        gathered = torch.cat(list(parts), dim)
    elif isinstance(parts, Tensor):
        gathered = parts
    else:
        raise TypeError(f"parts must be a list of tensors or a tensor, got {type(parts).__name__}")
    if gathered.shape[dim] != plan.total_tokens:
        raise ValueError(f"the shards hold {gathered.shape[dim]} tokens along dim {dim}, the "
                         f"plan's batch {plan.total_tokens}")
    return gathered.index_select(dim, plan._unshard_order(gathered.device))


# ---- the ring ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _RingStep:
    """One step of the ring on one rank: the attention of its queries against one block."""

    source: int  # the rank whose K/V block is in hand
    key_index: Optional[Tensor]  # int64 rows of the block, in order per query; None: all, as is
    num_keys: int
    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool


def _query_segments(me: RankShard, causal: bool) -> List[Tuple[int, int, int]]:
    """(sequence, first chunk start, length) of each query sequence of the local calls: a chunk
    each when causal (its mask depends on its position); the chunks of one sequence together
    otherwise (they see the same keys)."""
    segments: List[Tuple[int, int, int]] = []
    for c in me.chunks():
        if not causal and segments and segments[-1][0] == c.sequence:
            seq, start, length = segments[-1]
            segments[-1] = (seq, start, length + c.length)
        else:
            segments.append((c.sequence, c.start, c.length))
    return segments


def _visible(causal: bool, query_start: int, key: _Chunk) -> bool:
    """Whether a query chunk starting at query_start sees (part of) the key chunk of its
    sequence. Chunks are disjoint: a key chunk is the query's own or lies wholly before or after."""
    return not causal or key.start == query_start or key.start + key.length <= query_start


def _is_whole_block(rows: List[Tuple[int, int]], block_tokens: int) -> bool:
    """Whether the (offset, length) rows are the block's, once each and in order (no gather)."""
    end = 0
    for offset, length in rows:
        if offset != end:
            return False
        end += length
    return end == block_tokens


def _ring_steps(plan: JaggedShardPlan, rank: int, causal: bool, device) -> List[_RingStep]:
    me = plan.ranks[rank]
    segments = _query_segments(me, causal)
    cu_q = torch.tensor([0] + [s[2] for s in segments], dtype=torch.int64).cumsum(0)
    cu_q = cu_q.to(torch.int32).to(device)
    max_q = max((s[2] for s in segments), default=0)
    steps = []
    for step in range(plan.world_size):
        source = (rank - step) % plan.world_size
        block = plan.ranks[source]
        chunks_by_sequence: Dict[int, List[Tuple[_Chunk, int]]] = {}
        offset = 0
        for c in block.chunks():
            chunks_by_sequence.setdefault(c.sequence, []).append((c, offset))
            offset += c.length
        # The keys of each query segment: its visible chunks of the block, in position order (its
        # own chunk, when causal, is the last: see the module's docstring).
        rows: List[Tuple[int, int]] = []  # (offset in the block, length)
        keys_per_segment = []
        for seq, start, _ in segments:
            count = 0
            for chunk, chunk_offset in chunks_by_sequence.get(seq, ()):
                if _visible(causal, start, chunk):
                    rows.append((chunk_offset, chunk.length))
                    count += chunk.length
            keys_per_segment.append(count)
        num_keys = sum(keys_per_segment)
        key_index = None
        if num_keys and not _is_whole_block(rows, block.num_tokens):
            key_index = torch.cat([torch.arange(o, o + n) for o, n in rows]).to(device)
        cu_k = torch.tensor([0] + keys_per_segment, dtype=torch.int64).cumsum(0)
        steps.append(_RingStep(
            source=source, key_index=key_index, num_keys=num_keys, cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k.to(torch.int32).to(device), max_seqlen_q=max_q,
            max_seqlen_k=max(keys_per_segment, default=0),
            causal=causal and step == 0))  # the own chunk is only in the own block
    return steps


class _Ring:
    """Point-to-point exchanges with the two neighbours of a ring over a process group."""

    def __init__(self, group, rank: int, world_size: int):
        self.group = group
        self.world_size = world_size

        def global_rank(group_rank):
            return group_rank if group is None else dist.get_global_rank(group, group_rank)

        self.next_peer = global_rank((rank + 1) % world_size)
        self.previous_peer = global_rank((rank - 1) % world_size)

    def exchange(self, send: Tensor, receive: Tensor, tag: int):
        """Posts send -> next rank and previous rank -> receive; returns the works to wait on."""
        return dist.batch_isend_irecv([
            dist.P2POp(dist.isend, send, self.next_peer, self.group, tag),
            dist.P2POp(dist.irecv, receive, self.previous_peer, self.group, tag)])


def _wait(works) -> None:
    for work in works:
        work.wait()


def _block_keys(kv: Tensor, step: _RingStep, head_dim: int):
    keys = kv if step.key_index is None else kv.index_select(0, step.key_index)
    return keys[..., :head_dim], keys[..., head_dim:]


def _merge_partial(out: Tensor, lse: Tensor, part_out: Tensor, part_lse: Tensor) -> None:
    """Adds one block's partial attention to the running (out, lse), in place, float32."""
    merged = torch.logaddexp(lse, part_lse)
    # A row that has seen no key on either side keeps out 0 and lse -inf: its weights are taken
    # against 0 there (exp(-inf - 0) = 0) instead of against -inf (NaN).
    reference = torch.where(torch.isneginf(merged), torch.zeros_like(merged), merged)
    keep = torch.exp(lse - reference).t().unsqueeze(-1)  # [tokens, heads, 1]
    take = torch.exp(part_lse - reference).t().unsqueeze(-1)
    out.mul_(keep).add_(part_out.float() * take)
    lse.copy_(merged)


class _ContextParallelAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, plan, rank, ring, causal, softmax_scale, return_lse, deterministic):
        steps = plan._cached(("ring", rank, causal, str(q.device)),
                             lambda: _ring_steps(plan, rank, causal, q.device))
        head_dim = k.shape[2]
        kv = torch.cat([k, v], dim=2)  # one message per step for both
        out = torch.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=torch.float32,
                          device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), -float("inf"), dtype=torch.float32,
                         device=q.device)
        for i, step in enumerate(steps):
            incoming = pending = None
            if i + 1 < len(steps):  # fetch the next block while this one is attended
                size = plan.ranks[steps[i + 1].source].num_tokens
                incoming = kv.new_empty((size,) + tuple(kv.shape[1:]))
                pending = ring.exchange(kv, incoming, _KV_TAG)
            if step.num_keys and q.shape[0]:
                k_block, v_block = _block_keys(kv, step, head_dim)
                part_out, part_lse = jagged_attention(
                    q, k_block, v_block, step.cu_seqlens_q, step.cu_seqlens_k, step.max_seqlen_q,
                    step.max_seqlen_k, causal=step.causal, softmax_scale=softmax_scale,
                    return_lse=True)
                _merge_partial(out, lse, part_out, part_lse)
            if pending is not None:
                _wait(pending)
                kv = incoming
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.schedule = (plan, rank, ring, steps)
        ctx.options = (softmax_scale, deterministic)
        ctx.set_materialize_grads(False)
        return (out, lse) if return_lse else out

    @staticmethod
    def backward(ctx, grad_out, grad_lse=None):
        q, k, v, out, lse = ctx.saved_tensors
        plan, rank, ring, steps = ctx.schedule
        softmax_scale, deterministic = ctx.options
        if grad_out is None:  # only the LSE was used
            grad_out = torch.zeros_like(out)
        grad_out = grad_out.contiguous()
        grad_lse = None if grad_lse is None else grad_lse.contiguous()
        head_dim = k.shape[2]
        kv = torch.cat([k, v], dim=2)
        grad_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        grad_in_flight = None  # (works, buffer): the accumulator of the next step's block
        block_grad = None
        for i, step in enumerate(steps):
            incoming = pending = None
            if i + 1 < len(steps):
                size = plan.ranks[steps[i + 1].source].num_tokens
                incoming = kv.new_empty((size,) + tuple(kv.shape[1:]))
                pending = ring.exchange(kv, incoming, _KV_TAG)
            # This rank's share of the gradient of the block in hand, then what the ranks before
            # it on the ring have added.
            block_grad = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            if step.num_keys and q.shape[0]:
                k_block, v_block = _block_keys(kv, step, head_dim)
                dq, dk, dv, _ = torch.ops.jfa.jagged_attention_bwd(
                    grad_out, q, k_block, v_block, out, lse, step.cu_seqlens_q,
                    step.cu_seqlens_k, step.max_seqlen_q, step.max_seqlen_k, step.causal,
                    softmax_scale, grad_lse, deterministic)
                grad_q += dq
                dkv = torch.cat([dk, dv], dim=2).float()
                if step.key_index is None:
                    block_grad += dkv
                else:  # a key gathered for several query chunks sums their gradients
                    block_grad.index_add_(0, step.key_index, dkv)
            if grad_in_flight is not None:
                _wait(grad_in_flight[0])
                block_grad += grad_in_flight[1]
            if plan.world_size > 1:
                # On to the next rank: it works on this block at the next step, or, after the last
                # step, owns it. The one received is the block this rank works on next (or, after
                # the last step, its own, complete).
                size = plan.ranks[(rank - i - 1) % plan.world_size].num_tokens
                received = torch.empty((size,) + tuple(kv.shape[1:]), dtype=torch.float32,
                                       device=kv.device)
                grad_in_flight = (ring.exchange(block_grad, received, _GRAD_TAG), received)
            if pending is not None:
                _wait(pending)
                kv = incoming
        if grad_in_flight is not None:
            _wait(grad_in_flight[0])
            block_grad = grad_in_flight[1]
        grad_k = block_grad[..., :head_dim].to(k.dtype)
        grad_v = block_grad[..., head_dim:].to(v.dtype)
        return (grad_q.to(q.dtype), grad_k, grad_v) + (None,) * 7


def _group_rank_and_size(group, plan: JaggedShardPlan) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        if plan.world_size == 1 and group is None:
            return 0, 1  # one rank, nothing to exchange: no process group needed
        raise RuntimeError("context_parallel_attention needs an initialized torch.distributed "
                           "process group (torch.distributed.init_process_group) for a plan of "
                           f"{plan.world_size} ranks")
    return dist.get_rank(group), dist.get_world_size(group)


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, plan: JaggedShardPlan, *,
                               causal: bool = False, softmax_scale: Optional[float] = None,
                               group=None, return_lse: bool = False, deterministic: bool = False,
                               window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                               sinks=None):
    """Jagged self-attention of a batch whose tokens are spread over the ranks of ``group``.

    Collective: every rank of the group calls it with its own shard, in the same order as its
    other collectives (and runs the backward, where gradients are taken).

    Args:
        q, k, v: this rank's tokens (``shard(x, plan, rank)``): ``[n, heads_q, head_dim]``,
            ``[n, heads_kv, head_dim]`` and ``[n, heads_kv, head_dim_v]``, with ``n`` the plan's
            token count for the rank; CPU tensors (gloo) or CUDA tensors (NCCL).
        plan: from :func:`shard_jagged_batch`, the same on every rank, for ``group``'s size.
        causal: the causal mask of each whole sequence (query i sees key j iff j <= i).
        softmax_scale: defaults to 1/sqrt(head_dim).
        group: the process group (None: the default one). A one-rank plan runs without any.
        return_lse: also return this rank's rows of the LSE, float32 ``[heads_q, n]``
            (differentiable).
        deterministic: passed to jfa's backward (bit-identical gradients on CUDA).
        window_size, softcap, sinks: not supported yet; anything but the defaults raises
            NotImplementedError.

    Returns:
        ``out`` ``[n, heads_q, head_dim_v]`` in q's dtype, the rows of this rank's tokens, or
        ``(out, lse)``. Differentiable in q, k and v.
    """
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("context_parallel_attention does not support sliding windows "
                                  f"yet (window_size={tuple(window_size)}); use (-1, -1)")
    if softcap != 0.0:
        raise NotImplementedError("context_parallel_attention does not support softcap yet "
                                  f"(softcap={softcap}); use 0.0")
    if sinks is not None:
        raise NotImplementedError("context_parallel_attention does not support attention sinks "
                                  "yet; use sinks=None")
    _check_plan(plan)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [tokens, heads, head_dim], got shape "
                             f"{tuple(t.shape)}")
    if k.shape[1] != v.shape[1] or k.dtype != v.dtype:
        raise ValueError("k and v must have the same number of heads and dtype, got "
                         f"{tuple(k.shape)} {k.dtype} and {tuple(v.shape)} {v.dtype}")
    rank, world_size = _group_rank_and_size(group, plan)
    if world_size != plan.world_size:
        raise ValueError(f"the plan is for {plan.world_size} ranks, the process group has "
                         f"{world_size}")
    expected = plan.ranks[rank].num_tokens
    if not q.shape[0] == k.shape[0] == v.shape[0] == expected:
        raise ValueError(
            "context_parallel_attention supports self-attention only (each sequence's queries are "
            "its keys, len_q == len_k, as the plan's one cu_seqlens gives): q, k and v must each "
            f"hold the {expected} tokens the plan gives rank {rank}, got q {q.shape[0]}, "
            f"k {k.shape[0]}, v {v.shape[0]}")
    ring = _Ring(group, rank, world_size) if world_size > 1 else None
    return _ContextParallelAttention.apply(q, k, v, plan, rank, ring, bool(causal),
                                           softmax_scale, bool(return_lse), bool(deterministic))
