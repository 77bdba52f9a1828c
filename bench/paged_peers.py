#!/usr/bin/env python3
"""jfa's paged-KV forward against FlashAttention-3 and FlashInfer on serving's decode steps, bf16,
on the GPU: one or four query tokens a sequence (by --cells, chunks of 256: chunked prefill) over a
KV cache kept in shuffled pages.

Cells: mode x batch x cache x GQA x head_dim x page size; --cells picks values of any axis (the
others keep their defaults), --quick takes a small set. Modes: decode (1 query token a sequence) and
spec4 (speculative decode: 4 tokens, the last 4 positions of their sequence, causal bottom-right);
causal is set in both (a no-op at one token). By --cells only, append: the decode step with its
append in the same call, 1 query token and 1 new key/value row a sequence, each sequence's cache
holding its length - 1 rows before the call (the call's seqused_k; its pages have room for the
last), so that the keys attended, the appended row included, are the decode cell's; the call writes
the new rows into the pages, then attends over them (every timed call and graph replay re-writes the
same rows with the same values: idempotent). By --cells only, chunk256: a chunk of chunked
prefill, 256 query tokens a sequence, the last 256 positions of their sequence (causal
bottom-right, as spec4's 4). Batches B1, B8, B64, B256. Caches (seqused_k, each sequence's
keys): u512, u4k, u32k (every sequence 512, 4096, 32768 keys), tail (heavy-tailed: lognormal,
median 2048, sigma 1.25, rounded into [16, 32768], the same draws for a (--seed, batch) in every
run) and, by --cells only, u8k (every sequence 8192 keys, where chunked prefill is usually
measured). GQA 32:8 and 64:8 (query:KV heads), head_dim 128 and 64 (d128, d64), page size 16
(p16; p1, p64, p256 or any other by --cells). The pages a batch uses are one random permutation of
the cache's pages, dealt out in order: every page serves one sequence once, neighbours in a sequence
lie anywhere in the cache, and a last page's rows past the sequence's end hold random values like
the rest (a kernel that reads them fails the check). Keys, values and queries ~ N(0, 1) from --seed;
softmax scale 1/sqrt(head_dim). A cell whose cache is above --max-cache-gib is skipped, saying so.
A cell where a sequence has fewer keys than its query tokens (chunk256 on the tail cache, whose
lengths go down to 16: all but its smallest batches) is skipped for every method, the reason
naming the shortest: a chunk's keys include the chunk itself, so no prefill step has fewer; the
rows that would see no key time an edge case rather than the attention, and clipping the chunk
would give the methods ragged queries of their own choosing.

Methods (--methods):
- jfa: jfa_attention_forward_paged, its C entry through bench/libjfa.py (ctypes) on device
  buffers, max_seqlen_q and max_seqlen_k given, a kept workspace of the size libjfa asks for the
  call (jfa_attention_paged_workspace_size: its split plan's partials). Where libjfa does not
  take the call (no CUDA paged kernels for the device or the head size), jfa's cells say the
  library's "unsupported" reason. append: jfa_paged_kv's k_new, v_new [B, heads_kv, D] packed by
  cu_seqlens_new (0, 1, .., B), total_new = B, and seqused_k the rows before the call.
- fa3: FlashAttention-3's paged forward: torch.ops.flash_attn_3.fwd of --fa3-lib (its full bf16
  build), q [B, tokens, H, D] with page_table, seqused_k, num_splits=0 (its own heuristic) and
  pack_gqa=True, the call built from the op's schema as bench/peers.py builds it; without
  --fa3-lib, FA3's own wrapper flash_attn_interface.flash_attn_with_kvcache where it imports.
  append: the op's k_new and v_new as [B, 1, heads_kv, D] (the batch form, so no
  cu_seqlens_k_new) and seqused_k the rows before the call, as flash_attn_with_kvcache(q, k_cache,
  v_cache, k=, v=, cache_seqlens=) passes them (it appends at seqused_k and attends over seqused_k
  + 1 keys); the wrapper gets k= and v=.
- jfa_prefill, jfa_decode, jfa_rows, jfa_nosplits, jfa_pdl (by --methods only): jfa as above
  under the library's switches, set for the method's measurement (JFA_VARIANTS): the prefill tiles
  forced for every call they take (JFA_CUDA_PAGED_PREFILL=1) or for none (=0: the decode kernel),
  the prefill tiles' pages copied by rows instead of loaded by TMA (JFA_CUDA_PAGED_LOADS=rows) or
  their keys never split (JFA_CUDA_PAGED_SPLITS=0), and the decode kernel's combine launched as its
  programmatic dependent (JFA_CUDA_UNVERIFIED_PAGED_PDL=1, built for measurement). Beside jfa in the same process, so that a kernel
  choice is an A/B of one run; they are not peers (jfa ÷ best peer is jfa's).
- flashinfer: FlashInfer (flashinfer-python) where it imports, NHD pages (the cache's own layout):
  BatchDecodeWithPagedKVCacheWrapper for decode (tensor cores above 4 query heads a KV head, as
  vLLM chooses), BatchPrefillWithPagedKVCacheWrapper with causal=True for spec4 and chunk256;
  planned once per cell, outside the timing. Where it does not import, its cells say why.
  append: skipped, saying why: its attention calls take no new rows (its append,
  flashinfer.page.append_paged_kv_cache, is a kernel of its own), so it has no one-call step to
  compare.

Checks, before anything is timed: every method's output against a float64 reference (the pages
of each sampled sequence gathered in torch, softmax attention in float64: paged_reference) on up
to 8 sequences (all of a small batch; else the longest, the shortest, the first, the last and
evenly spaced ones): relative error ||out - ref|| / ||ref|| <= 1e-2 (peers_gpu's bf16
TOLERANCE), the largest absolute error kept too, and every output finite, from outputs filled
with NaN first. append: the reference attends over each sequence's rows before the call (the
call's seqused_k) gathered from its pages, then its k_new / v_new row (the cache with the rows
appended); before each method's first call the cache rows the call appends are NaN (restored
when the cell ends), so a method that attends without writing them, or writes them elsewhere,
fails (a graph replay re-writes rows already there: its output is checked, not its writes). A
method that fails is "wrong" and gets no time; one that is missing or fails says why, and the
run goes on.

Figures, on peers_gpu's side stream, as bench/call_overhead.py takes them: host_us (host time per
call: --host-calls calls issued back to back behind a spin kernel, the median of --host-batches
batches), eager_ms (CUDA events around one call, synchronized), graph_ms (replays of the call
captured once in a CUDA graph, the replay's output checked too), medians of --runs. KV TB/s: KV
bytes read / time, KV bytes = sum over sequences of seqused_k * heads_kv * (head_dim +
head_dim_v) * 2 (append: the keys attended, the call's seqused_k + 1 a sequence, plus the B
rows written, each heads_kv * (head_dim + head_dim_v) * 2 bytes; reading k_new and v_new is not
counted), beside the device's copy rate, measured once per run (a 2 GiB device-to-device
torch copy: bytes read + written / time). TFLOP/s: useful FLOPs / time, useful FLOPs = 4 *
heads_q * head_dim * the (query, key) pairs the causal mask lets through (two GEMMs; head_dim_v =
head_dim), a sequence of t query tokens and n keys, query row i seeing keys [0, n - t + i] within
[0, n), seeing min(t, n) * (n - min(t, n)) + min(t, n) * (min(t, n) + 1) / 2 pairs. jfa ÷ best
peer: jfa's KV TB/s over the fastest peer's, eager and graph (> 1: jfa is faster; every method of
a cell has the same bytes and FLOPs, so it is the ratio of speeds, TFLOP/s cells too). --rounds N
measures every cell N times, the methods in alternating order (bench/rounds.py), and keeps each
method's median round by eager_ms (every round's figures in its record's "rounds").

Writes <out>/<YYYY-MM-DD>-<gpu>-paged.json (--name: another stem) after every cache and prints a
table last: a row per cell, each method's eager and graph ms, graph KV TB/s (graph TFLOP/s
instead for a cell of more than 4 query tokens a sequence, compute-bound: chunk256) and host µs,
and jfa ÷ best peer. --time-limit-s S: no cell starts after S seconds; the JSON and the table say
so.

usage: python3 bench/paged_peers.py --lib build/gpu/src/libjfa.so
           --fa3-lib .peers/fa3_full_bf16.so [--quick]
           [--cells decode,spec4,append,chunk256,B8,B64,u4k,u8k,tail,32:8,d128,p16]
           [--methods jfa,jfa_prefill,jfa_decode,jfa_rows,jfa_nosplits,jfa_pdl,fa3,flashinfer]
           [--rounds N] [--runs N] [--warmup N] [--host-calls N] [--max-cache-gib G]
           [--time-limit-s S] [--seed N] [--out bench/results] [--name NAME]
"""
import argparse
import contextlib
import ctypes
import datetime
import itertools
import math
import os
import random
import sys
import time
import warnings
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import call_overhead as co  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from rounds import TIMED, measure_rounds  # noqa: E402

# ---- cells --------------------------------------------------------------------------------------

Cell = namedtuple("Cell", "mode batch cache heads heads_kv head_dim page_size")
MODES = {"decode": 1, "spec4": 4, "append": 1, "chunk256": 256}  # query tokens a sequence
APPENDS = {"append": 1}  # new key/value rows a sequence the call appends (other modes: none)
DEFAULT_MODES = ("decode", "spec4")  # append and chunk256 by --cells only
BATCHES = (1, 8, 64, 256)
CACHES = {"u512": 512, "u4k": 4096, "u8k": 8192, "u32k": 32768,
          "tail": None}  # None: heavy-tailed lengths
DEFAULT_CACHES = ("u512", "u4k", "u32k", "tail")  # u8k, for chunked prefill, by --cells only
# Above this many query tokens a sequence a cell is compute-bound: the table shows its TFLOP/s.
FLOP_TOKENS = 4
GQAS = ("32:8", "64:8")
HEAD_DIMS = (128, 64)
PAGE_SIZES = (16,)
FULL = {"mode": list(DEFAULT_MODES), "batch": list(BATCHES), "cache": list(DEFAULT_CACHES),
        "gqa": [tuple(int(n) for n in g.split(":")) for g in GQAS],
        "head_dim": list(HEAD_DIMS), "page_size": list(PAGE_SIZES)}
QUICK = dict(FULL, batch=[8, 64], cache=["u4k", "tail"], gqa=[(32, 8)], head_dim=[128])
# The heavy tail: lognormal lengths around a median, rounded into [TAIL_MIN, TAIL_MAX].
TAIL_MEDIAN, TAIL_SIGMA, TAIL_MIN, TAIL_MAX = 2048, 1.25, 16, 32768
DTYPE = "bf16"  # FlashAttention-3's full build is bf16 only
ELEMENT_BYTES = 2
CHECK_FEW = 8  # sequences checked at most
SEED = 0
COPY_BYTES = 2 << 30  # the copy-rate buffer: large against L2, small against the caches
DEVICE = "cuda"  # where the caches go (the tests drive a run on the CPU)

# jfa's kernels under the library's switches, beside its default choice in the same process (by
# --methods only): the prefill tiles forced on or off, their row copies, their keys unsplit.
JFA_VARIANTS = {
    "jfa_prefill": {"JFA_CUDA_PAGED_PREFILL": "1"},
    "jfa_decode": {"JFA_CUDA_PAGED_PREFILL": "0"},
    "jfa_rows": {"JFA_CUDA_PAGED_PREFILL": "1", "JFA_CUDA_PAGED_LOADS": "rows"},
    "jfa_nosplits": {"JFA_CUDA_PAGED_PREFILL": "1", "JFA_CUDA_PAGED_SPLITS": "0"},
    "jfa_pdl": {"JFA_CUDA_UNVERIFIED_PAGED_PDL": "1"},
}
METHODS = ("jfa", *JFA_VARIANTS, "fa3", "flashinfer")
DEFAULT_METHODS = ("jfa", "fa3", "flashinfer")
PEERS = ("fa3", "flashinfer")
LABELS = {"jfa": "jfa (jfa_attention_forward_paged)", "fa3": "FlashAttention-3 (paged)",
          "flashinfer": "FlashInfer",
          **{m: f"jfa with {' '.join(f'{k}={v}' for k, v in env.items())}"
             for m, env in JFA_VARIANTS.items()}}
# Column names; a variant's from its method name (jfa_rows: "jfa rows").
SHORT = {"jfa": "jfa", "fa3": "FA3", "flashinfer": "FlashInfer",
         **{m: m.replace("_", " ") for m in JFA_VARIANTS}}
# FA3's paged call: peers' keywords (scale, mask), the split count and pack-GQA.
FA3_PAGED_KEYWORDS = dict(co.FA3_KEYWORDS, num_splits=("num_splits",), pack_gqa=("pack_gqa",))
FLASHINFER_WORKSPACE_BYTES = 256 << 20
APPEND_COUNTING = ("append: the call writes each sequence's new row, then attends over its "
                   "keys with it; KV bytes = (keys attended + rows written) * heads_kv * "
                   "(head_dim + head_dim_v) * 2")
FLASHINFER_NO_APPEND = ("FlashInfer's attention calls take no new rows (its append, "
                        "flashinfer.page.append_paged_kv_cache, is a kernel of its own): no "
                        "one-call decode step with the append to compare")
FLOP_COUNTING = ("useful FLOPs = 4 * heads_q * head_dim * visible (query, key) pairs, a sequence "
                 "of t query tokens and n keys seeing (causal bottom-right) min(t, n) * (n - "
                 "min(t, n)) + min(t, n) * (min(t, n) + 1) / 2; TFLOP/s = useful FLOPs / time")


def token_axis(token):
    """(axis, value) of one --cells token: decode, spec4, append, chunk256; B<n>; u512, u4k,
    u8k, u32k, tail; H:Hkv; d<n>; p<n>. ValueError for anything else."""
    t = token.strip()
    if t in MODES:
        return "mode", t
    if t in CACHES:
        return "cache", t
    if ":" in t:
        h, _, kv = t.partition(":")
        if h.isdigit() and kv.isdigit() and int(kv) > 0 and int(h) % int(kv) == 0:
            return "gqa", (int(h), int(kv))
    for prefix, axis in (("B", "batch"), ("d", "head_dim"), ("p", "page_size")):
        if t.startswith(prefix) and t[1:].isdigit() and int(t[1:]) > 0:
            return axis, int(t[1:])
    raise ValueError(f"unknown cell value {token!r} (modes {', '.join(MODES)}; B<batch>; caches "
                     f"{', '.join(CACHES)}; <query heads>:<KV heads>, a multiple; d<head_dim>; "
                     "p<page size>)")


def parse_cells(text, quick=False):
    """{axis: values} of the cells to run: --cells' comma-separated tokens (token_axis), the
    values given for an axis replacing that axis's default (the full grid, or --quick's)."""
    axes = {a: list(v) for a, v in (QUICK if quick else FULL).items()}
    given = {}
    for token in (text or "").split(","):
        if token.strip():
            axis, value = token_axis(token)
            if value not in given.setdefault(axis, []):
                given[axis].append(value)
    axes.update(given)
    return axes


def cells_of(axes):
    """Every cell of the axes in run order: page size, head_dim, cache, batch, KV heads, query
    heads, mode, so that the cells sharing a cache (cache_key) follow each other."""
    out = [Cell(m, b, c, h, kv, d, p)
           for p in axes["page_size"] for d in axes["head_dim"] for c in axes["cache"]
           for b in axes["batch"] for h, kv in sorted(axes["gqa"], key=lambda g: (g[1], g[0]))
           for m in axes["mode"]]
    return out


def cache_key(cell):
    """What a cell's KV cache depends on: the cells with one key share one cache."""
    return (cell.page_size, cell.head_dim, cell.cache, cell.batch, cell.heads_kv)


def cell_name(cell):
    """A cell's name in the table and the records: 'decode B64 u4k 32:8 d128 p16'."""
    return (f"{cell.mode} B{cell.batch} {cell.cache} {cell.heads}:{cell.heads_kv} "
            f"d{cell.head_dim} p{cell.page_size}")


def cache_lengths(cache, batch, seed=SEED):
    """seqused_k of each sequence: the cache's length, or for tail lognormal draws (median
    TAIL_MEDIAN, sigma TAIL_SIGMA) rounded into [TAIL_MIN, TAIL_MAX], the same for a (seed,
    batch) in every run and every Python."""
    if CACHES[cache] is not None:
        return [CACHES[cache]] * batch
    rng = random.Random(f"paged-tail-{seed}-{batch}")
    mu = math.log(TAIL_MEDIAN)
    return [min(max(int(round(rng.lognormvariate(mu, TAIL_SIGMA))), TAIL_MIN), TAIL_MAX)
            for _ in range(batch)]


def pages_per_sequence(lengths, page_size):
    """The pages each sequence's keys take: ceil(length / page_size)."""
    return [-(-int(n) // page_size) for n in lengths]


def block_table(lengths, page_size, seed=SEED):
    """(table, num_pages): table int32 [batch, max_pages] (torch, CPU), sequence b's pages in its
    row in order, the pages of all rows together one random permutation of [0, num_pages) from
    seed, so every page serves one sequence once and a sequence's neighbouring pages lie anywhere
    in the cache; entries past a sequence's pages are 0 (no kernel reads them)."""
    import torch
    counts = pages_per_sequence(lengths, page_size)
    num_pages = sum(counts)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    width = max(counts + [1])
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    # A row-major mask takes the permutation sequence by sequence, each row's pages in order.
    used = torch.arange(width)[None, :] < torch.tensor(counts, dtype=torch.int64)[:, None]
    table[used] = perm
    return table, num_pages


def kv_bytes(lengths, heads_kv, head_dim, head_dim_v=None, element_bytes=ELEMENT_BYTES,
             written=0):
    """Bytes of keys and values a call reads at least, and writes: (sum of the keys attended,
    `lengths` (seqused_k, or with an append seqused_k + the new rows), + the rows `written` by
    an append) * heads_kv * (head_dim + head_dim_v) * element_bytes."""
    rows = sum(int(n) for n in lengths) + int(written)
    return rows * heads_kv * (head_dim + (head_dim_v or head_dim)) * element_bytes


def appended_rows(cell):
    """Key/value rows a cell's call appends (and writes): APPENDS' rows a sequence x batch."""
    return APPENDS.get(cell.mode, 0) * cell.batch


def visible_pairs(tokens, keys):
    """(query, key) pairs the causal mask lets through for one sequence of `tokens` query tokens
    and `keys` keys, aligned bottom-right (query row i sees keys [0, keys - tokens + i] within
    [0, keys)): the last min(tokens, keys) rows see keys - min + 1 .. keys keys, the rows before
    them none."""
    m = min(int(tokens), int(keys))
    return m * (int(keys) - m) + m * (m + 1) // 2


def useful_flops(lengths, tokens, heads, head_dim, head_dim_v=None):
    """FLOPs of the attention a call does at least: two GEMMs over the visible pairs (QK^T, 2 *
    head_dim a pair; PV, 2 * head_dim_v), every query head, summed over the sequences' `lengths`
    (the keys each attends); the masked pairs, the softmax and the append are not counted."""
    pairs = sum(visible_pairs(tokens, n) for n in lengths)
    return 2 * heads * (head_dim + (head_dim_v or head_dim)) * pairs


def short_cache_reason(cell, lengths):
    """Why a cell is left out where a sequence has fewer keys than the cell's query tokens
    (chunk256 on the tail cache): a prefill chunk's keys include the chunk, so no step has fewer,
    and the methods would differ on rows that see no key rather than on speed. "" where every
    sequence has enough."""
    tokens, shortest = MODES[cell.mode], min(lengths)
    if shortest >= tokens:
        return ""
    short = sum(1 for n in lengths if n < tokens)
    return (f"{cell.mode}: {tokens} query tokens a sequence need as many keys; {short} of "
            f"{len(lengths)} sequences of the {cell.cache} cache have fewer (the shortest "
            f"{shortest})")


def cache_bytes(lengths, page_size, heads_kv, head_dim, element_bytes=ELEMENT_BYTES):
    """Bytes of the whole cache (keys and values, every row of every page) a cell allocates."""
    rows = sum(pages_per_sequence(lengths, page_size)) * page_size
    return rows * heads_kv * 2 * head_dim * element_bytes


def check_sample(lengths, tokens, few=CHECK_FEW):
    """The sequences every method is checked on: all of a batch of at most `few`; else
    workloads.check_sample's (the longest, the shortest, the first, the last) and evenly spaced
    ones up to `few` (uniform caches would otherwise check only the first and the last)."""
    n = len(lengths)
    if n <= few:
        return list(range(n))
    picks = set(W.check_sample([tokens] * n, list(lengths), tiny_len=0))  # the extremes alone
    for i in [k * (n - 1) // (few - 1) for k in range(few)] + list(range(n)):
        if len(picks) >= few:
            break
        picks.add(i)
    return sorted(picks)


def jfa_workspace_bytes(lib, params, kv):
    """Bytes of workspace jfa's paged forward asks for these params and cache (lib: a
    libjfa.Library): the library's own answer, jfa_attention_paged_workspace_size, from the
    call's sizes and hints (its split plan's partials; 0 on the CPU backend or with one split). A
    smaller workspace would make the call allocate its own, in the timing."""
    size = ctypes.c_size_t(0)
    lib.check(lib.lib.jfa_attention_paged_workspace_size(ctypes.byref(params), ctypes.byref(kv),
                                                         ctypes.byref(size)),
              "jfa_attention_paged_workspace_size")
    return size.value


# ---- the reference ------------------------------------------------------------------------------

def gather_pages(cache, table_row, length):
    """The first `length` rows of a sequence's pages in order: [length, heads_kv, d] of a cache
    [num_pages, page_size, heads_kv, d] (torch)."""
    count = -(-int(length) // cache.shape[1])
    return cache[table_row[:count].long()].flatten(0, 1)[:length]


def attention_f64(q, k, v, scale, causal=True):
    """Softmax attention of one sequence in float64 (torch, any device): q [T, H, D], k [L, Hkv,
    D], v [L, Hkv, Dv] -> [T, H, Dv]. Query head h reads KV head h // (H / Hkv); causal is
    bottom-right (query t sees keys j <= t + L - T); a row that sees no key is zeros."""
    import torch
    T, H, D = q.shape
    L, Hkv, Dv = v.shape
    # Grouped as [Hkv, group, T, D]: each KV head's keys are read once, never repeated per head.
    qs = q.double().reshape(T, Hkv, H // Hkv, D).permute(1, 2, 0, 3)
    s = torch.matmul(qs, k.double().permute(1, 2, 0).unsqueeze(1)).mul_(scale)
    if causal:
        hidden = (torch.arange(L, device=q.device)[None, :]
                  > torch.arange(T, device=q.device)[:, None] + (L - T))
        s.masked_fill_(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num_(0.0)  # a row of -inf only: NaN -> zeros
    out = torch.matmul(p, v.double().permute(1, 0, 2).unsqueeze(1))
    return out.permute(2, 0, 1, 3).reshape(T, H, Dv)


def paged_reference(q, k_cache, v_cache, table, lengths, tokens, scale, causal, sample,
                    k_new=None, v_new=None, cu_new=None):
    """{sequence: float64 [tokens, H, Dv]} of the sampled sequences: each one's pages gathered
    from the caches through its row of the block table, then attention_f64. q is packed
    [batch * tokens, H, D], sequence i's rows at i * tokens. With an append (k_new, v_new
    [total_new, Hkv, D], packed by cu_new, batch + 1 offsets): sequence i's keys are its
    lengths[i] rows (seqused_k, before the call) from the pages, then its new rows
    k_new[cu_new[i]:cu_new[i + 1]] (the cache as the call leaves it, whatever the pages hold at
    those rows now)."""
    import torch
    cu = None if k_new is None else [int(c) for c in cu_new]

    def keys(cache, new, i):
        rows = gather_pages(cache, table[i], lengths[i])
        return rows if new is None else torch.cat([rows, new[cu[i]:cu[i + 1]].to(rows.dtype)])

    with torch.no_grad():
        return {i: attention_f64(q[i * tokens:(i + 1) * tokens], keys(k_cache, k_new, i),
                                 keys(v_cache, v_new, i), scale, causal)
                for i in sample}


def check_output(out, refs, tokens, tolerance):
    """(status, relative error, largest absolute error, reason) of a packed output [batch *
    tokens, H, Dv] against the reference's rows: "wrong" where it is not finite anywhere or the
    relative error over the sample is above tolerance."""
    import torch
    num = den = 0.0
    worst = 0.0
    for i, ref in refs.items():
        diff = out[i * tokens:(i + 1) * tokens].double() - ref
        num += diff.pow(2).sum().item()
        den += ref.pow(2).sum().item()
        if diff.numel():
            worst = max(worst, diff.abs().max().item(), key=lambda e: (e != e, e))
    err = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
    if not bool(torch.isfinite(out).all().item()):
        return "wrong", err, worst, "non-finite values in the output"
    if not err <= tolerance:
        return "wrong", err, worst, f"relative error {err:.3g} > {tolerance:g}"
    return "ok", err, worst, ""


# ---- report (no torch needed) -------------------------------------------------------------------

def add_rates(rec, copy_tbps=None):
    """KV TB/s of the record's eager and graph times (None where not timed), their share of
    the device's copy rate, and TFLOP/s of its useful FLOPs (useful_gflop)."""
    gflop = rec.get("useful_gflop")
    for mode in peers.MODES:
        t = rec.get(f"{mode}_ms") if rec.get("status") in TIMED else None
        rate = rec["kv_bytes"] / (t * 1e-3) / 1e12 if t else None
        rec[f"{mode}_kv_tbps"] = rate
        rec[f"{mode}_of_copy"] = rate / copy_tbps if rate and copy_tbps else None
        rec[f"{mode}_tflops"] = gflop * 1e9 / (t * 1e-3) / 1e12 if t and gflop else None
    return rec


def shows_flops(rec):
    """Whether the table shows a record's TFLOP/s instead of its KV TB/s: above FLOP_TOKENS
    query tokens a sequence (compute-bound)."""
    return (rec.get("tokens") or 1) > FLOP_TOKENS


def _rate(rec, mode):
    return rec.get(f"{mode}_kv_tbps") if rec and rec.get("status") in TIMED else None


def best_peer(cell_records, mode):
    """The peer record with the highest KV TB/s of a cell in a mode, or None."""
    timed = [r for r in cell_records if r["method"] in PEERS and _rate(r, mode)]
    return max(timed, key=lambda r: _rate(r, mode), default=None)


def cell_summary(cell_records):
    """jfa ÷ best peer of one cell's records, eager and graph (KV TB/s over KV TB/s, > 1: jfa is
    faster), the peer each, and jfa's graph rate as a share of the copy rate."""
    jfa = next((r for r in cell_records if r["method"] == "jfa"), None)
    s = {"cell": cell_records[0]["cell"], "jfa_graph_of_copy": (jfa or {}).get("graph_of_copy")}
    for mode in peers.MODES:
        best = best_peer(cell_records, mode)
        mine = _rate(jfa, mode)
        s[f"best_peer_{mode}"] = best["method"] if best else None
        s[f"jfa_over_best_{mode}"] = mine / _rate(best, mode) if mine and best else None
    return s


def by_cell(records):
    """{cell name: its records}, the cells in the records' order."""
    out = {}
    for r in records:
        out.setdefault(r["cell"], []).append(r)
    return out


def summarize(records):
    return [cell_summary(rs) for rs in by_cell(records).values()]


def _cells(rec):
    """A method's eager ms, graph ms, graph KV TB/s (graph TFLOP/s where shows_flops) and host
    µs cells."""
    if rec is None:
        return ["-"] * 4
    if rec.get("status") not in TIMED:
        return [peers.CELL.get(rec.get("status"), rec.get("status") or "-")] * 4
    flops = shows_flops(rec)
    eager, graph, rate, host = (rec.get(k) for k in ("eager_ms", "graph_ms", "graph_tflops"
                                                     if flops else "graph_kv_tbps", "host_us"))
    return ["-" if eager is None else co.fmt_ms(eager),
            "no graph" if graph is None and rec.get("graph_reason") else
            "-" if graph is None else co.fmt_ms(graph),
            "-" if rate is None else f"{rate:.1f}" if flops else f"{rate:.2f}",
            "-" if host is None else co.fmt_us(host) + ("!" if rec.get("host_gpu_bound") else "")]


def table_methods(records):
    """The methods of the records in METHODS' order."""
    return [m for m in METHODS if any(r["method"] == m for r in records)]


def variant_lines(records):
    """A line per cell where jfa's variants (JFA_VARIANTS) ran beside jfa: each variant's speed
    over jfa's, graph and eager (jfa's time over the variant's: > 1, the variant is faster)."""
    lines = []
    for name, rs in by_cell(records).items():
        by = {r["method"]: r for r in rs}
        base = by.get("jfa")
        parts = []
        for m in JFA_VARIANTS:
            rec = by.get(m)
            if rec is None:
                continue
            ratios = []
            for mode in ("graph", "eager"):
                mine, theirs = (r.get(f"{mode}_ms") if r and r.get("status") in TIMED else None
                                for r in (base, rec))
                ratios.append(f"{mine / theirs:.2f}" if mine and theirs else "-")
            parts.append(f"{SHORT[m]} {ratios[0]} / {ratios[1]}")
        if parts:
            lines.append(f"  {name}: " + ", ".join(parts))
    if lines:
        lines.insert(0, "jfa's variants, speed over jfa's (graph / eager; > 1: the variant is "
                        "faster):")
    return lines


def note_lines(records):
    """The reasons behind every cell that is not a number, once per (method, kind, text), with
    the first cell each appears in."""
    notes, seen = [], set()
    for r in records:
        for kind, text in ((r.get("status"), r.get("reason") or ""),
                           ("no graph", r.get("graph_reason") or ""),
                           ("host", r.get("host_reason") or "")):
            if kind != "ok" and text and (r["method"], kind, text) not in seen:
                seen.add((r["method"], kind, text))
                notes.append(f"  {SHORT[r['method']]} [{kind}] (first: {r['cell']}): "
                             f"{text[:200]}")
    return notes


def format_table(records, copy=None, stopped=""):
    """The run's table: a title with the copy rate, a row per cell with each method's eager ms,
    graph ms, graph KV TB/s (graph TFLOP/s for a cell of more than FLOP_TOKENS query tokens a
    sequence, the title says so) and host µs, jfa ÷ best peer (eager, graph) and that peer; then
    the reasons behind the cells that are not numbers, and `stopped`."""
    if not records:
        return "\n".join(["no results"] + ([stopped] if stopped else []))
    methods = table_methods(records)
    rate = copy.get("copy_tbps") if copy else None
    lines = [f"paged decode, {DTYPE}: medians; TB/s = KV bytes read / graph time"
             + (f" (the device copies {rate:.2f} TB/s, read + written)" if rate else "")
             + (f"; cells of more than {FLOP_TOKENS} query tokens a sequence: TFLOP/s = useful "
                "FLOPs / graph time in the TB/s column" if any(shows_flops(r) for r in records)
                else "")
             + "; host µs per call back to back; ÷ = jfa's KV TB/s over the best peer's"]
    width = 30
    head = f"{'':<{width}}" + "".join(f"{'':4}{SHORT[m]:<32}" for m in methods)
    cols = f"{'cell':<{width}}" + "".join(
        f"{'eager':>9}{'graph':>9}{'TB/s':>8}{'host':>8}  " for _ in methods)
    lines += [head.rstrip(), cols + f"{'÷ eager':>9}{'÷ graph':>9}  best peer"]
    for name, rs in by_cell(records).items():
        by = {r["method"]: r for r in rs}
        s = cell_summary(rs)
        row = f"{name:<{width}}" + "".join(
            "".join(f"{c:>{w}}" for c, w in zip(_cells(by.get(m)), (9, 9, 8, 8))) + "  "
            for m in methods)
        ratios = [s[f"jfa_over_best_{mode}"] for mode in peers.MODES]
        best = s["best_peer_graph"] or s["best_peer_eager"]
        row += "".join("-".rjust(9) if v is None else f"{v:>9.2f}" for v in ratios)
        lines.append(row + f"  {SHORT[best] if best else '-'}")
    lines.append("n/a: unavailable.  err: failed.  wrong: failed the check, not timed.  skip: "
                 "left out (the reason below).  !: gpu_bound, the host may have waited for "
                 "the GPU.")
    if any(r.get("mode") in APPENDS for r in records):
        lines.append(APPEND_COUNTING)
    if any(shows_flops(r) for r in records):
        lines.append(FLOP_COUNTING)
    lines += variant_lines(records)
    notes = note_lines(records)
    if notes:
        lines += ["notes:"] + notes[:40]
    if stopped:
        lines.append(stopped)
    return "\n".join(lines)


def progress_line(rec, tag=""):
    """One line per measurement: status, host, eager and graph times with their KV TB/s (and
    TFLOP/s where the table shows them), the error, and why where something is missing."""
    text = f"[{rec['cell']}{tag}] {rec['method']:<10} {rec['status']:<11}"
    if rec.get("host_us") is not None:
        text += f" host {rec['host_us']:.1f} µs"
    for mode in peers.MODES:
        t, rate, tflops = (rec.get(f"{mode}_{k}") for k in ("ms", "kv_tbps", "tflops"))
        if t is not None:
            flops = f", {tflops:.1f} TFLOP/s" if tflops and shows_flops(rec) else ""
            text += f" {mode} {t:.4f} ms" + (f" ({rate:.2f} TB/s{flops})" if rate else "")
    if rec.get("rel_error") is not None:
        text += f" err {rec['rel_error']:.1e}"
    why = "; ".join(x for x in (rec.get("reason"), rec.get("graph_reason"),
                                rec.get("host_reason")) if x)
    return text + (f" {why[:200]}" if why else "")


# ---- options ------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--lib", default=None,
                    help="libjfa.so (default: the newest build/**/src/libjfa.so)")
    ap.add_argument("--fa3-lib", default=os.environ.get("FA3_FULL_LIB") or None,
                    help="FlashAttention-3's op library with paged KV (its full bf16 build, e.g. "
                         ".peers/fa3_full_bf16.so; default $FA3_FULL_LIB; without it, "
                         "flash_attn_interface.flash_attn_with_kvcache where it imports)")
    ap.add_argument("--cells", default=None,
                    help="comma-separated values of any axis, each replacing that axis's "
                         "default: decode,spec4 (default both), append (the decode step with "
                         "its append in the call), chunk256 (a chunked prefill's 256 tokens a "
                         "sequence); B<batch>; u512,u4k,u32k,tail (default all), u8k; "
                         "<H>:<Hkv>; d<head_dim>; p<page size> (e.g. decode,B64,u4k,tail,p1,p16 "
                         "or chunk256,B8,u4k,u8k)")
    ap.add_argument("--quick", action="store_true",
                    help="a small set (B8,B64 u4k,tail 32:8 d128 p16, decode and spec4, unless "
                         "--cells says otherwise), one round, fewer runs and calls")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help=f"comma-separated of {','.join(METHODS)} (default "
                         f"{','.join(DEFAULT_METHODS)})")
    ap.add_argument("--rounds", type=int, default=None,
                    help="measure every cell N times, the methods in alternating order "
                         "(default 1)")
    ap.add_argument("--runs", type=int, default=None,
                    help=f"timed calls and graph replays (default {peers.RUNS}; --quick: "
                         f"{peers.QUICK_RUNS})")
    ap.add_argument("--warmup", type=int, default=None,
                    help=f"untimed calls before each figure (default {peers.WARMUP}; --quick: "
                         f"{peers.QUICK_WARMUP})")
    ap.add_argument("--host-calls", type=int, default=None,
                    help="calls issued back to back for host_us (default 100; --quick: 30)")
    ap.add_argument("--host-batches", type=int, default=3,
                    help="batches of --host-calls calls; host_us is their median (default 3)")
    ap.add_argument("--warm-seconds", type=float, default=None,
                    help="seconds of matmuls before the first timing (default 3; --quick: 1)")
    ap.add_argument("--max-cache-gib", type=float, default=None,
                    help="skip cells whose KV cache is larger (default 45%% of the GPU's memory)")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the lengths, pages and data")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no cell after this many seconds; write what was measured")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--name", default=None, help="file stem of the JSON (default "
                                                 "<date>-<gpu>-paged)")
    args = ap.parse_args(argv)
    co.settle_counts(ap, args, (("rounds", 1, 1), ("runs", peers.RUNS, peers.QUICK_RUNS),
                                ("warmup", peers.WARMUP, peers.QUICK_WARMUP),
                                ("host_calls", 100, 30), ("warm_seconds", 3.0, 1.0)),
                     ("rounds", "runs", "host_calls", "host_batches"))
    try:
        args.axes = parse_cells(args.cells, args.quick)
    except ValueError as e:
        ap.error(f"--cells: {e}")
    args.cell_list = cells_of(args.axes)
    args.method_names = peers.parse_list(args.methods, list(METHODS), "method")
    if not args.cell_list or not args.method_names:
        ap.error("no cell or no method: --cells and --methods must not be empty")
    return args


def default_stem(date, gpu):
    """The JSON's file stem without --name: <date>-<gpu>-paged."""
    return f"{date}-{peers.gpu_slug(gpu)}-paged"


# ---- inputs (torch) -----------------------------------------------------------------------------

class PagedCache:
    """One KV cache, shared by the cells of one cache_key: k and v [num_pages, page_size,
    heads_kv, head_dim] ~ N(0, 1), the block table (block_table) and seqused_k, on `device`."""

    def __init__(self, lengths, page_size, heads_kv, head_dim, dtype, device, seed=SEED):
        import torch
        self.lengths, self.page_size = [int(n) for n in lengths], page_size
        self.heads_kv, self.head_dim = heads_kv, head_dim
        table, self.num_pages = block_table(self.lengths, page_size, seed)
        self.device = torch.device(device)
        self.table = table.to(self.device)
        self.used = torch.tensor(self.lengths, dtype=torch.int32, device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        shape = (self.num_pages, page_size, heads_kv, head_dim)
        self.k = torch.randn(shape, generator=gen, dtype=dtype, device=self.device)
        self.v = torch.randn(shape, generator=gen, dtype=dtype, device=self.device)
        self._flashinfer = None

    def flashinfer_layout(self):
        """(indptr [B + 1], indices, last_page_len [B]), int32 on the cache's device: the same
        pages as the block table, in FlashInfer's CSR form (built once)."""
        if self._flashinfer is None:
            import torch
            counts = pages_per_sequence(self.lengths, self.page_size)
            indptr = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32)
            width = self.table.shape[1]
            used = torch.arange(width)[None, :] < torch.tensor(counts)[:, None]
            last = [n - (c - 1) * self.page_size if c else 0
                    for n, c in zip(self.lengths, counts)]
            self._flashinfer = (indptr.to(self.device), self.table[used.to(self.device)],
                                torch.tensor(last, dtype=torch.int32, device=self.device))
        return self._flashinfer

    def release(self):
        self.k = self.v = self.table = self.used = self._flashinfer = None


class DecodeInputs:
    """One cell's inputs over its cache: queries q [batch * tokens, heads, head_dim] ~ N(0, 1)
    packed by cu_q (int32), the scale, the mask, the sampled sequences and their float64
    reference (reference(), computed once). An append cell (new_rows > 0 a sequence) has too:
    the rows before the call, before (a list) and used_before (int32, the call's seqused_k: the
    cache's lengths - new_rows), the new rows k_new and v_new [batch * new_rows, heads_kv,
    head_dim] ~ N(0, 1) packed by cu_new (int32), and the cache's values at the rows they go to,
    kept to put back (release())."""

    def __init__(self, cell, cache, seed=SEED):
        import torch
        self.cell, self.cache = cell, cache
        self.tokens, self.batch = MODES[cell.mode], cell.batch
        self.heads, self.heads_kv, self.head_dim = cell.heads, cell.heads_kv, cell.head_dim
        self.total_q = self.batch * self.tokens
        self.device, dtype = cache.device, cache.k.dtype
        gen = torch.Generator(device=self.device).manual_seed(seed + 1)
        self.q = torch.randn(self.total_q, self.heads, self.head_dim, generator=gen, dtype=dtype,
                             device=self.device)
        self.cu_q = torch.arange(0, self.total_q + 1, self.tokens, dtype=torch.int32,
                                 device=self.device)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.causal = True
        self.sample = check_sample(cache.lengths, self.tokens)
        self._refs = None
        self.new_rows = APPENDS.get(cell.mode, 0)
        self.before = self.used_before = self.k_new = self.v_new = self.cu_new = None
        self._slots = self._saved = None
        if self.new_rows:
            self._append_inputs(gen)

    def _append_inputs(self, gen):
        import torch
        c, n = self.cache, self.new_rows
        if min(c.lengths) < n:
            raise ValueError(f"an append of {n} rows needs every cache length >= {n}")
        self.before = [length - n for length in c.lengths]
        self.used_before = torch.tensor(self.before, dtype=torch.int32, device=self.device)
        shape = (self.batch * n, self.heads_kv, self.head_dim)
        self.k_new = torch.randn(shape, generator=gen, dtype=c.k.dtype, device=self.device)
        self.v_new = torch.randn(shape, generator=gen, dtype=c.v.dtype, device=self.device)
        self.cu_new = torch.arange(0, self.batch * n + 1, n, dtype=torch.int32,
                                   device=self.device)
        self._slots = append_slots(c.table, self.before, n, c.page_size)
        self._saved = (c.k[self._slots].clone(), c.v[self._slots].clone())

    def poison_appended(self):
        """NaN into the cache rows the call appends (a no-op without an append)."""
        if self._slots is not None:
            self.cache.k[self._slots] = float("nan")
            self.cache.v[self._slots] = float("nan")

    def restore_appended(self):
        """The cache's own values back at the rows the call appends, as before the cell."""
        if self._slots is not None:
            self.cache.k[self._slots] = self._saved[0]
            self.cache.v[self._slots] = self._saved[1]

    def reference(self):
        if self._refs is None:
            c = self.cache
            if self.new_rows:
                self._refs = paged_reference(self.q, c.k, c.v, c.table, self.before,
                                             self.tokens, self.scale, self.causal, self.sample,
                                             self.k_new, self.v_new, self.cu_new.tolist())
            else:
                self._refs = paged_reference(self.q, c.k, c.v, c.table, c.lengths, self.tokens,
                                             self.scale, self.causal, self.sample)
        return self._refs

    def release(self):
        """Frees the inputs; an append cell first puts the cache's values back at the rows it
        appends, for the cells after it on the same cache."""
        try:
            self.restore_appended()
        except Exception:  # a lost CUDA context: the run stops after this cell anyway
            pass
        self.q = self.cu_q = self._refs = None
        self.k_new = self.v_new = self.cu_new = self.used_before = None
        self._slots = self._saved = None


def append_slots(table, before, new_rows, page_size):
    """(pages, rows) int64 index tensors on the table's device: the cache slots sequence b's
    new rows go to, its rows before[b] .. before[b] + new_rows - 1 through its row of the block
    table, sequence by sequence (the order of the packed new rows)."""
    import torch
    pos = [p for b in before for p in range(b, b + new_rows)]
    seq = [i for i in range(len(before)) for _ in range(new_rows)]
    pos_t = torch.tensor(pos, dtype=torch.int64, device=table.device)
    seq_t = torch.tensor(seq, dtype=torch.int64, device=table.device)
    pages = table[seq_t, pos_t // page_size].long()
    return pages, pos_t % page_size


# ---- methods ------------------------------------------------------------------------------------

class Skipped(Exception):
    """A method that does not take a cell's call (its message: why): the cell's record is
    "skipped", not timed."""


class Prepared:
    """run(): one timed call, returning a tuple whose first item is the output in the method's
    layout; packed(out): that output as [batch * tokens, H, Dv]. explain(e): (status, reason) of
    a failed first call. outputs: buffers the call writes (NaN before the check). keep: what the
    call needs alive."""

    def __init__(self, run, packed=None, provider="", explain=None, outputs=(), keep=None):
        self.run, self.provider, self.outputs, self.keep = run, provider, outputs, keep
        self.packed = packed or (lambda out: out)
        self.explain = explain


def paged_kv(lib, cache):
    """A jfa_paged_kv of this build (its sized init) over the cache's device buffers."""
    from libjfa import _library
    kv = _library.PagedKv()
    lib.check(lib.lib.jfa_paged_kv_init_sized(ctypes.byref(kv), ctypes.sizeof(kv)),
              "jfa_paged_kv_init_sized")
    kv.k_cache, kv.v_cache = cache.k.data_ptr(), cache.v.data_ptr()
    kv.block_table, kv.seqused_k = cache.table.data_ptr(), cache.used.data_ptr()
    kv.num_pages, kv.page_size = cache.num_pages, cache.page_size
    kv.max_pages_per_seq = cache.table.shape[1]
    return kv


def with_append(kv, x):
    """kv with an append cell's append (a no-op for other cells): seqused_k the rows before the
    call, k_new and v_new packed by cu_seqlens_new, total_new their rows."""
    if x.new_rows:
        kv.seqused_k = x.used_before.data_ptr()
        kv.k_new, kv.v_new = x.k_new.data_ptr(), x.v_new.data_ptr()
        kv.cu_seqlens_new, kv.total_new = x.cu_new.data_ptr(), x.k_new.shape[0]
    return kv


def paged_forward_fn(lib, params, kv):
    """A zero-argument callable running jfa_attention_forward_paged on fixed params and cache
    (raising the package's JfaError with the library's message on failure)."""
    from libjfa import SUCCESS
    fwd, p, c = lib.lib.jfa_attention_forward_paged, ctypes.byref(params), ctypes.byref(kv)

    def run():
        s = fwd(p, c)
        if s != SUCCESS:
            lib.check(s, "jfa_attention_forward_paged")

    run.keep = (params, kv)  # the structs live as long as the callable
    return run


def jfa_failure(G, e):
    """(status, reason) of jfa's failed first call: "unavailable" where the build does not take
    the call (unsupported: no paged kernels for the device or shape; no CUDA backend); else
    "error"."""
    from jfa import JfaBackendUnavailableError, JfaUnsupportedError
    if isinstance(e, (JfaUnsupportedError, JfaBackendUnavailableError)):
        return "unavailable", G.short(e)
    return "error", G.short(e)


def jfa_prepare(G, ctx):
    """jfa's paged forward through its C entry (ctx["jfa_lib"]: a libjfa.Library): params as
    for the packed forward without k, v and their offsets, the cache's jfa_paged_kv (an append
    cell's append in it: with_append), out filled with NaN, a kept workspace of the size libjfa
    asks (jfa_workspace_bytes); the CPU backend for inputs on the CPU."""
    def prepare(x):
        import torch
        lib = ctx.get("jfa_lib")
        if lib is None:
            raise G.Unavailable(ctx.get("jfa_error") or "libjfa.so not loaded")
        gpu = x.device.type == "cuda"
        out = torch.full((x.total_q, x.heads, x.head_dim), float("nan"), dtype=x.q.dtype,
                         device=x.device)
        p = lib.params(q=x.q.data_ptr(), k=None, v=None, out=out.data_ptr(),
                       cu_seqlens_q=x.cu_q.data_ptr(), batch=x.batch, total_q=x.total_q,
                       heads_q=x.heads, heads_kv=x.heads_kv, head_dim=x.head_dim, dtype=DTYPE,
                       causal=x.causal, softmax_scale=x.scale, max_seqlen_q=x.tokens,
                       max_seqlen_k=max(x.cache.lengths), backend="cuda" if gpu else "cpu",
                       stream=torch.cuda.current_stream().cuda_stream if gpu else None)
        p.cu_seqlens_k, p.total_k = None, 0  # the keys come from the cache
        kv = with_append(paged_kv(lib, x.cache), x)
        size = jfa_workspace_bytes(lib, p, kv)
        workspace = torch.empty(size, dtype=torch.uint8, device=x.device) if size else None
        p.workspace, p.workspace_bytes = (workspace.data_ptr(), size) if size else (None, 0)
        fwd = paged_forward_fn(lib, p, kv)

        def run():
            fwd()
            return (out,)

        append = ", append (k_new, v_new, cu_seqlens_new)" if x.new_rows else ""
        return Prepared(run, provider=f"libjfa {lib.version()} ({os.path.basename(lib.path)}), "
                                      f"jfa_attention_forward_paged{append}, workspace {size} "
                                      "bytes",
                        explain=lambda e: jfa_failure(G, e), outputs=(out,),
                        keep=(workspace, fwd))
    return prepare


def fa3_values(x):
    """FA3's paged forward arguments by name: q as [batch, tokens, H, D], the caches, seqused_k,
    the block table, the scale, the mask, num_splits 0 (its heuristic) and pack-GQA on. An
    append cell's too: k_new and v_new as [batch, new rows, Hkv, D] (FA3's batch form, which
    needs no cu_seqlens_k_new) and seqused_k the rows before the call (FA3 appends there and
    attends over seqused_k + the new rows)."""
    c = x.cache
    values = {"q": x.q.view(x.batch, x.tokens, x.heads, x.head_dim), "k": c.k, "v": c.v,
              "seqused_k": c.used, "page_table": c.table, "softmax_scale": x.scale,
              "is_causal": x.causal, "num_splits": 0, "pack_gqa": True}
    if x.new_rows:
        shape = (x.batch, x.new_rows, x.heads_kv, x.head_dim)
        values.update(k_new=x.k_new.view(shape), v_new=x.v_new.view(shape),
                      seqused_k=x.used_before)
    return values


def fa3_failure(G, e):
    """(status, reason) of FA3's failed first call: "unavailable" where the build refuses it (no
    paged KV or head size: "not support", "disabled"), else "error"."""
    text = G.short(e)
    low = text.lower()
    return ("unavailable" if "not support" in low or "disabled" in low else "error"), text


def fa3_prepare(G, ctx):
    """FlashAttention-3's paged forward: its op (ctx["fa3_op"], the call built from its schema,
    ctx["fa3_arguments"]), else its Python wrapper's flash_attn_with_kvcache
    (ctx["fa3_interface"]), the same arguments (an append's new rows as its k= and v=)."""
    def prepare(x):
        op, values = ctx.get("fa3_op"), fa3_values(x)
        if op is not None:
            try:
                args, kwargs = co.fa3_call(ctx["fa3_arguments"], values, FA3_PAGED_KEYWORDS)
            except ValueError as e:
                raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")

            def run():
                return (op(*args, **kwargs)[0],)

            provider = ctx.get("fa3_provider") or "torch.ops.flash_attn_3.fwd"
        elif ctx.get("fa3_interface") is not None:
            fn = ctx["fa3_interface"].flash_attn_with_kvcache
            new = {"k": values["k_new"], "v": values["v_new"]} if x.new_rows else {}

            def run():
                return (fn(values["q"], values["k"], values["v"], cache_seqlens=values["seqused_k"],
                           page_table=values["page_table"], softmax_scale=x.scale,
                           causal=x.causal, num_splits=0, pack_gqa=True, **new),)

            provider = "flash_attn_interface.flash_attn_with_kvcache (FA3)"
        else:
            raise G.Unavailable(unavailable_reason(ctx, "fa3"))
        shape = (x.total_q, x.heads, x.head_dim)
        append = ("k_new, v_new, " if op is not None else "k, v, ") if x.new_rows else ""
        return Prepared(run, packed=lambda out: out.reshape(shape),
                        explain=lambda e: fa3_failure(G, e),
                        provider=provider + f" (page_table, seqused_k, {append}num_splits=0, "
                                            "pack_gqa=True)")
    return prepare


def load_flashinfer(G, ctx):
    """FlashInfer into ctx (flashinfer and its version), else why not (flashinfer_error)."""
    try:
        import flashinfer
    except Exception as e:
        ctx["flashinfer_error"] = f"import flashinfer: {G.short(e, 200)}"
        return
    ctx["flashinfer"] = flashinfer
    ctx["flashinfer_version"] = getattr(flashinfer, "__version__", "?")


def flashinfer_prepare(G, ctx):
    """FlashInfer's paged attention, planned once: the decode wrapper for one token (tensor
    cores above 4 query heads a KV head, as vLLM chooses), the prefill wrapper with the causal
    mask for more; NHD pages, the cache's CSR form (PagedCache.flashinfer_layout). An append
    cell is Skipped (FLASHINFER_NO_APPEND)."""
    def prepare(x):
        import torch
        if x.new_rows:
            raise Skipped(FLASHINFER_NO_APPEND)
        fi = ctx.get("flashinfer")
        if fi is None:
            raise G.Unavailable(unavailable_reason(ctx, "flashinfer"))
        c = x.cache
        workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=x.device)
        indptr, indices, last = c.flashinfer_layout()
        common = {"q_data_type": x.q.dtype, "kv_data_type": x.q.dtype, "sm_scale": x.scale}
        if x.tokens == 1:
            tensor_cores = x.heads // x.heads_kv > 4
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                            use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, indices, last, x.heads, x.heads_kv, x.head_dim, c.page_size,
                         pos_encoding_mode="NONE", **common)
            how = f"BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores={tensor_cores}"
        else:
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper.plan(x.cu_q, indptr, indices, last, x.heads, x.heads_kv, x.head_dim,
                         c.page_size, causal=x.causal, **common)
            how = "BatchPrefillWithPagedKVCacheWrapper, causal"
        caches = (c.k, c.v)

        def run():
            return (wrapper.run(x.q, caches),)

        return Prepared(run, provider=f"flashinfer {ctx.get('flashinfer_version', '?')} {how}",
                        keep=(workspace, wrapper))
    return prepare


# ---- one measurement ----------------------------------------------------------------------------

def new_record(method, cell, lengths, tokens, sample, tolerance):
    """A method's record of a cell before it is measured. lengths: the keys each sequence
    attends (an append cell's call has seqused_k one less: appended_rows, batch rows, are
    written, and counted in kv_bytes)."""
    flops = useful_flops(lengths, tokens, cell.heads, cell.head_dim)
    return {"method": method, "label": LABELS[method], "cell": cell_name(cell), "mode": cell.mode,
            "tokens": tokens, "batch": cell.batch, "cache": cell.cache, "heads": cell.heads,
            "heads_kv": cell.heads_kv, "head_dim": cell.head_dim, "head_dim_v": cell.head_dim,
            "page_size": cell.page_size, "dtype": DTYPE, "causal": True,
            "seqused_k_sum": sum(lengths), "seqused_k_max": max(lengths),
            "kv_bytes": kv_bytes(lengths, cell.heads_kv, cell.head_dim,
                                 written=appended_rows(cell)),
            "appended_rows": appended_rows(cell), "useful_gflop": flops / 1e9,
            "status": None, "reason": "", "provider": "", "rel_error": None,
            "max_abs_error": None, "tolerance": tolerance, "checked_sequences": len(sample),
            "host_us": None, "host_reason": "", "eager_ms": None, "graph_ms": None,
            "graph_reason": ""}


def synchronize(x):
    import torch
    if x.device.type == "cuda":
        torch.cuda.synchronize()


def poison(x, prep):
    """NaN into the buffers the call writes, and into a freed block of the output's size that
    the caching allocator likely hands to an output the call allocates, so rows a kernel never
    writes fail the check; for an append cell, into the cache rows the call appends too, so a
    call that attends without writing them fails."""
    import torch
    for t in prep.outputs:
        t.fill_(float("nan"))
    x.poison_appended()
    block = torch.full((x.total_q, x.heads, x.head_dim), float("nan"), dtype=x.q.dtype,
                       device=x.device)
    del block


def prepare_and_check(G, prepare, x, rec):
    """The method prepared on a cell's inputs and its first call checked, into rec (status,
    reason, provider, errors); the Prepared where the output is right, else None."""
    try:
        prep = prepare(x)
    except G.Unavailable as e:
        rec.update(status="unavailable", reason=str(e))
        return None
    except Skipped as e:
        rec.update(status="skipped", reason=str(e))
        return None
    except Exception as e:
        rec.update(status="error", reason="prepare: " + G.short(e))
        return None
    rec["provider"] = prep.provider
    poison(x, prep)
    try:
        out = prep.run()
        synchronize(x)
    except Exception as e:
        if x.device.type == "cuda":
            co.synchronize_quietly()
        status, reason = prep.explain(e) if prep.explain else ("error", G.short(e))
        rec.update(status=status, reason=reason)
        return None
    status, err, worst, reason = check_output(prep.packed(out[0]), x.reference(), x.tokens,
                                              rec["tolerance"])
    rec.update(status=status, rel_error=err, max_abs_error=worst, reason=reason)
    return prep if status == "ok" else None


def time_method(G, prep, x, rec, opts):
    """host_us, eager_ms and graph_ms of a checked method into rec (call_overhead's figures),
    the graph's replay checked as the first call was; the stream current is the one it runs on."""
    import torch
    try:
        rec.update(co.host_time(prep.run, opts["host_calls"], opts["host_batches"],
                                opts["warmup"]))
    except Exception as e:
        rec["host_reason"] = G.short(e)
        co.synchronize_quietly()
    rec.update(co.eager_time(prep.run, opts["runs"], opts["warmup"]))

    def check_replay(out):
        status, rec["graph_rel_error"], _, why = check_output(
            prep.packed(out[0]), x.reference(), x.tokens, rec["tolerance"])
        return "" if status == "ok" else f"the replay's output is wrong: {why}"

    co.time_replays(G, prep.run, rec, opts, check_replay, nan_outputs=True,
                    stream=torch.cuda.current_stream())


@contextlib.contextmanager
def environment(variables):
    """The process environment with `variables` set (the library reads its switches at each
    call, a graph's kernels at its capture), restored after."""
    old = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure_method(G, prepare, x, rec, opts):
    """rec filled in for one method on one cell, on peers_gpu's side stream (a CUDA graph is
    captured on the stream a call launches on, and jfa's params hold the stream they were made
    on): prepared, checked, and timed where right."""
    import torch
    stream = G.side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    prep = None
    try:
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")
            prep = prepare_and_check(G, prepare, x, rec)
            if prep is not None:
                time_method(G, prep, x, rec, opts)
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="error", reason="out of memory: " + G.short(e, 150))
    except Exception as e:
        rec.update(status="error", reason=G.short(e))
    finally:
        prep = None
        co.synchronize_quietly()
        try:
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.empty_cache()
        except Exception:  # a lost context fails these too: the record has the cause
            pass
    return rec


def measure_order(methods):
    """The methods in the order of a cell's first round: the peers, then jfa's. A kernel that
    faults loses the process's CUDA context; jfa's, the newest, then do so after the peers'
    figures of their cell are taken."""
    return [m for m in methods if m in PEERS] + [m for m in methods if m not in PEERS]


def measure_cell(G, impls, x, methods, opts, rounds, copy_tbps, report=None):
    """One record per method of a cell, in the order of `methods` (call_overhead.median_round of
    its rounds, by eager_ms), with its KV rates; a jfa variant measured under its switches."""
    tolerance = G.TOLERANCE[DTYPE]

    def measure(m):
        rec = new_record(m, x.cell, x.cache.lengths, x.tokens, x.sample, tolerance)
        with environment(JFA_VARIANTS.get(m, {})):  # a jfa variant's switches
            return add_rates(measure_method(G, impls[m], x, rec, opts), copy_tbps)

    per_method = measure_rounds(measure_order(methods), rounds, measure, report)
    return [add_rates(co.median_round(per_method[m]), copy_tbps) for m in methods]


def cuda_context_lost(G):
    """Why the process's CUDA context can run nothing more (a kernel's sticky error, such as an
    illegal address, fails every later call), or "" while it can."""
    import torch
    try:
        torch.ones(1, device="cuda").add_(1).item()
        torch.cuda.synchronize()
    except Exception as e:
        return G.short(e, 200)
    return ""


class Stop:
    """Why no more cells start (why()): the time limit reached, or a lost CUDA context (lost());
    "" while they may."""

    def __init__(self, limit_s, t_start):
        self.limit_s, self.t_start, self.reason = limit_s, t_start, ""

    def lost(self, cell, why):
        self.reason = self.reason or f"the CUDA context was lost after {cell_name(cell)}: {why}"

    def why(self):
        late = self.limit_s is not None and time.perf_counter() - self.t_start > self.limit_s
        if late and not self.reason:
            self.reason = f"--time-limit-s {self.limit_s:g} reached"
        return self.reason


def copy_rate(torch, nbytes=COPY_BYTES, runs=20):
    """The device's copy rate: dst.copy_(src) of nbytes on the GPU, median CUDA-event time of
    `runs` copies, counted as bytes read + written (2 * nbytes) over that time."""
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = sorted(co.event_times(lambda: dst.copy_(src), runs))[runs // 2]
    src = dst = None  # freed before the cells' caches
    torch.cuda.empty_cache()
    return {"copy_tbps": 2 * nbytes / (ms * 1e-3) / 1e12, "copy_ms": ms, "copy_bytes": nbytes,
            "counting": "bytes read + written (2 x the buffer) over the median CUDA-event time "
                        f"of {runs} device-to-device torch copies"}


def skipped_records(cell, lengths, methods, why):
    """The records of a cell left out (its cache too large, or too short for its query tokens),
    one per method."""
    return [dict(new_record(m, cell, lengths, MODES[cell.mode], [], None), status="skipped",
                 reason=why) for m in methods]


def error_records(cell, lengths, methods, why):
    """The records of a cell whose inputs or reference failed, one per method."""
    return [dict(new_record(m, cell, lengths, MODES[cell.mode], [], None), status="error",
                 reason=why) for m in methods]


# ---- driver -------------------------------------------------------------------------------------

def unavailable_reason(ctx, method):
    """Why a method cannot run at all after loading (None where it can): jfa without its
    library or CUDA backend, FA3 with neither its op nor its wrapper, FlashInfer not imported."""
    if method == "fa3":
        if ctx.get("fa3_op") is not None or ctx.get("fa3_interface") is not None:
            return None
        return (ctx.get("fa3_error") or ctx.get("fa3_interface_error")
                or peers.FA3_NOT_AVAILABLE)
    if method == "flashinfer":
        return None if ctx.get("flashinfer") else (ctx.get("flashinfer_error")
                                                    or "flashinfer is not loaded")
    return None if ctx.get("jfa_lib") else (ctx.get("jfa_error") or "libjfa.so not loaded")


def load_methods(G, args, ctx, env):
    """jfa's library, FA3 and FlashInfer into ctx (peers_gpu.load_fa3 for FA3), what each was
    loaded as or why not into env."""
    from libjfa import Library, find_library
    lib_path = find_library(args.lib, REPO)
    env["jfa_lib"] = lib_path
    try:
        lib = Library(lib_path) if lib_path else None
        if lib is None:
            ctx["jfa_error"] = "libjfa.so not found (pass --lib)"
        elif not lib.cuda_available():
            ctx["jfa_error"] = f"{lib_path}: jfa_cuda_available() = 0 (no CUDA backend or GPU)"
        else:
            ctx["jfa_lib"], env["jfa_version"] = lib, lib.version()
    except Exception as e:
        ctx["jfa_error"] = f"cannot load {lib_path}: {G.short(e)}"
    if "fa3" in args.method_names:
        G.load_fa3(ctx, args.fa3_lib)
        env["fa3"] = unavailable_reason(ctx, "fa3") or ctx.get("fa3_provider") or (
            "flash_attn_interface.flash_attn_with_kvcache")
    if "flashinfer" in args.method_names:
        load_flashinfer(G, ctx)
        env["flashinfer"] = ctx.get("flashinfer_version") or ctx.get("flashinfer_error")
    env["jfa"] = env.get("jfa_version") or ctx.get("jfa_error")


def run_settings(args, G, max_cache):
    """The settings a run's JSON keeps: the options, the axes, dtype, tolerance, the cache limit
    and the heavy tail's parameters."""
    settings = {k: getattr(args, k) for k in ("cells", "quick", "method_names", "rounds", "runs",
                                              "warmup", "host_calls", "host_batches", "seed",
                                              "fa3_lib", "time_limit_s")}
    settings.update(axes={a: [":".join(map(str, v)) if isinstance(v, tuple) else v
                              for v in vs] for a, vs in args.axes.items()},
                    dtype=DTYPE, tolerance=G.TOLERANCE[DTYPE], max_cache_bytes=max_cache,
                    tail={"median": TAIL_MEDIAN, "sigma": TAIL_SIGMA, "min": TAIL_MIN,
                          "max": TAIL_MAX})
    return settings


def measure_cache_group(G, args, impls, cells, copy, max_cache, stop, report):
    """(records, cells not started) of the cells that share one cache (cache_key), the cache
    built once for them and freed after: no cell starts once stop.why() says so, and a lost CUDA
    context stops the run; a cell above max_cache is skipped; one whose inputs or reference fail
    gets an error record per method, and one with a sequence shorter than its query tokens
    (short_cache_reason) a skipped record."""
    import torch
    records, late, cache = [], [], None
    for cell in cells:
        if stop.why():
            late.append(cell_name(cell))
            continue
        lengths = cache_lengths(cell.cache, cell.batch, args.seed)
        short = short_cache_reason(cell, lengths)
        if short:
            records.extend(skipped_records(cell, lengths, args.method_names, short))
            continue
        size = cache_bytes(lengths, cell.page_size, cell.heads_kv, cell.head_dim)
        if size > max_cache:
            why = (f"the cache ({size / 2**30:.1f} GiB) is above {max_cache / 2**30:.1f} GiB "
                   "(--max-cache-gib)")
            records.extend(skipped_records(cell, lengths, args.method_names, why))
            continue
        x = None
        try:
            cache = cache or PagedCache(lengths, cell.page_size, cell.heads_kv, cell.head_dim,
                                        G.TORCH_DTYPES[DTYPE], DEVICE, args.seed)
            x = DecodeInputs(cell, cache, args.seed)
            x.reference()
            opts = {k: getattr(args, k) for k in ("runs", "warmup", "host_calls",
                                                  "host_batches")}
            records.extend(measure_cell(G, impls, x, args.method_names, opts, args.rounds,
                                        copy["copy_tbps"], report))
        except Exception as e:  # inputs or reference: every method of the cell
            why = f"inputs or reference failed: {G.short(e)}"
            print(f"[{cell_name(cell)}] {why}", flush=True)
            records.extend(error_records(cell, lengths, args.method_names, why))
        finally:
            if x is not None:
                x.release()
        lost = cuda_context_lost(G)
        if lost:
            print(f"[{cell_name(cell)}] the CUDA context is lost: {lost}", flush=True)
            stop.lost(cell, lost)
    if cache is not None:
        cache.release()
    if not stop.why().startswith("the CUDA context"):  # else freeing would raise again
        torch.cuda.empty_cache()
    return records, late


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch = peers.torch_with_cuda("paged_peers.py")
    if torch is None:
        return 2
    import peers_gpu as G

    ctx, env = {}, G.environment()
    load_methods(G, args, ctx, env)
    impls = {"jfa": jfa_prepare(G, ctx), "fa3": fa3_prepare(G, ctx),
             "flashinfer": flashinfer_prepare(G, ctx),
             **{m: jfa_prepare(G, ctx) for m in JFA_VARIANTS}}
    for m in args.method_names:
        if unavailable_reason(ctx, m):
            print(f"{m}: unavailable: {unavailable_reason(ctx, m)}", flush=True)
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, jfa {env['jfa']}, fa3: "
          f"{env.get('fa3', '-')}, flashinfer: {env.get('flashinfer', '-')}", flush=True)
    co.warm_up_gpu(G, args.warm_seconds)
    copy = copy_rate(torch)
    print(f"device copy rate {copy['copy_tbps']:.2f} TB/s (read + written)", flush=True)
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    max_cache = args.max_cache_gib * 2**30 if args.max_cache_gib is not None else 0.45 * total
    date = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out,
                             (args.name or default_stem(date, env.get("gpu"))) + ".json")
    records, skipped = [], []
    doc = {"title": "jfa paged-KV decode against FlashAttention-3 and FlashInfer",
           "date": date, "environment": env, "settings": run_settings(args, G, max_cache),
           "copy": copy, "counting": "KV bytes = sum over sequences of seqused_k * heads_kv * "
                                     "(head_dim + head_dim_v) * 2; KV TB/s = KV bytes / time; "
                                     + FLOP_COUNTING + ("; " + APPEND_COUNTING
                                        if any(m in APPENDS for m in args.axes["mode"])
                                        else ""),
           "results": records, "summary": []}

    def report(r):
        print(progress_line(r, f" r{r['round']}" if args.rounds > 1 else ""), flush=True)

    stop = Stop(args.time_limit_s, t_start)
    for _, group in itertools.groupby(args.cell_list, key=cache_key):
        done, late = measure_cache_group(G, args, impls, list(group), copy, max_cache, stop,
                                         report)
        records.extend(done)
        skipped.extend(late)
        doc.update(summary=summarize(records), elapsed_s=round(time.perf_counter() - t_start, 1))
        peers.write_json(json_path, doc)
    stopped = ""
    if skipped:
        cells = "cell" if len(skipped) == 1 else "cells"
        stopped = (f"stopped: {stop.why()}; {len(skipped)} {cells} not measured (first: "
                   f"{skipped[0]})")
        doc.update(stopped=stopped, not_measured=skipped)
    doc.update(summary=summarize(records), elapsed_s=round(time.perf_counter() - t_start, 1),
               table=format_table(records, copy, stopped))
    peers.write_json(json_path, doc)
    print(f"\nwrote {json_path}\ntotal {doc['elapsed_s']:.0f} s on {env.get('gpu')}")
    print(doc["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
