#!/usr/bin/env python3
"""jfa against FlashAttention-3 and FlexAttention on local attention (sliding windows, softcap,
attention sinks): the forward and the backward, bf16, on the GPU.

Cells: workload x kind x pass. Workloads: bench/workloads.py's W1, W2, W3 (--workloads) at each
of --head-dims (64,128,256: W1-d64 .. W3-d256), 16 query and 16 KV heads as in bench/peers.py.
Kinds (--kinds; window (left, right): query i sees key j iff i + Lk - Lq - left <= j <=
i + Lk - Lq + right, -1 unbounded, causal is right = 0; jfa.h):
  swa128 causal, window (128, 0) (GPT-OSS)  swa4096 causal, window (4096, 0) (Mistral)
  swa128nc non-causal, window (128, 128)            softcap50 causal, softcap 50 (Gemma 2)
  swa_softcap causal, window (4096, 0), softcap 50  sinks causal, sinks ~ N(0, 1)
  swa_sinks causal, window (128, 0), sinks (GPT-OSS)
Passes (--pass forward|backward|both, default forward):
- forward: the attention forward.
- backward: the backward op alone, after one untimed forward of the same method that saved its
  output and LSE; the upstream gradient dO is bench/backward_peers.py's (its seed).
FlashAttention-3 (fa3): torch.ops.flash_attn_3.fwd and, for the backward, .bwd, varlen, from the
op library --fa3-lib names (e.g. its full bf16 build: windows and softcap at head_dim 64, 128,
256, forward and backward), the calls built from the ops' schemas as bench/peers.py and
bench/backward_peers.py do, window_size_left, window_size_right and softcap by keyword.
FA3 has no sinks: the sinks kinds time jfa with sinks against jfa without them (jfa_nosinks,
same window and mask), the ratio being what the sinks cost. FlexAttention (flex, every kind):
torch.compile(flex_attention) on the packed sequences as one [1, H, tokens, D] batch, as
bench/peers.py and bench/backward_peers.py run it (peers_gpu's flex_functions, flex_layout,
flex_kwargs), with a block mask of the document mask and the kind's window (flex_local_mask_mod:
jfa.h's bottom-right aligned rule per sequence; built once per workload and mask, not timed) and
the softcap as a score_mod (cap * tanh(score / cap)); its backward is torch autograd of that call
after one forward, the backward alone timed (backward_peers._autograd_peer). FlexAttention has no
sinks: on the sinks kinds it runs as "FlexAttention + LSE sink correction", its output corrected
by its LSE, out * sigmoid(lse - sink) (exact, forward and autograd: flex_sink_correction; one
compiled kernel, timed with it), dsinks from autograd checked as jfa's. --peers fa3,flex (default
both) chooses the peers; FlexAttention's compiles take minutes. jfa: its C entry through
bench/libjfa.py, as bench/peers.py, with window_left, window_right, softcap and sinks (float32
[heads] on the GPU) set in its params; its backward is jfa_attention_backward from the forward's
out and LSE, writing dsinks (float32 [heads]) where the kind has sinks. A build whose CUDA
kernels reject them says so in its cells.

Checks, before anything is timed: forward outputs against a float64 reference (local_reference,
jfa.h's rules) on workloads.check_sample's sequences (all of a small batch, else the longest, the
shortest, the first and the last): relative error ||out - ref|| / ||ref|| <= 1e-2 in bf16
(peers_gpu's TOLERANCE), the max absolute error kept too. Backward: dq, dk and dv against float64
torch autograd through the same attention (local_reference_grads: window, softcap, the sink logit
in the softmax's denominator) on the sampled sequences, and jfa's dsinks (FlexAttention's too,
from autograd), a sum over the batch, against the reference's over every sequence; relative error
of each <= 2e-2 in bf16 (backward_peers' TOLERANCE), from gradient buffers filled with NaN first.
A method that fails is "wrong" and gets no eager or graph time; one that is missing or fails says
why, and the run goes on. Times: forward (peers_gpu.measure, on one side stream): eager_ms (CUDA
events around one call, synchronized) and graph_ms (replays of the call captured in a CUDA graph,
the replay checked too), medians of --runs, and the kernel time median_ms; backward: eager_ms and
graph_ms as bench/backward_peers.py takes them, on the same side stream (FlexAttention's on its
autograd stream, as backward_peers). --rounds N measures every cell N times, the methods in
alternating order (bench/rounds.py; forward: peers.combine_rounds, backward:
backward_peers.combine_rounds). Useful TFLOP/s count the visible (query, key) pairs under mask
and window exactly (visible_pairs): forward 2 * pairs * heads * (head_dim + head_dim_v), backward
2.5 times that (backward_peers' factor); so causal without a window is L(L+1)/2 a sequence here,
not peers.py's L^2/2.

Writes <out>/<YYYY-MM-DD>-<gpu>-local.json (--pass backward: -local-backward.json, both:
-local-both.json; --name: another stem) after every cell, a record per method
(jfa, fa3 or jfa_nosinks, flex), and prints a table per pass: a row per workload x kind x
head_dim, jfa's and the peer's TFLOP/s eager and graph, jfa ÷ peer, and where FlexAttention ran,
its TFLOP/s and jfa ÷ FlexAttention (÷F). --time-limit-s S: no cell starts after S seconds; the
JSON and the table say so.

usage: python3 bench/local_peers.py --lib build/gpu/src/libjfa.so
           --fa3-lib .peers/fa3_full_bf16.so [--cli build/gpu/tools/jfa] [--out bench/results]
           [--workloads W1,W2,W3] [--head-dims 64,128,256] [--kinds swa128,sinks,...]
           [--pass forward|backward|both] [--peers fa3,flex] [--rounds N] [--runs N]
           [--warmup N] [--time-limit-s S] [--name NAME]
"""
import argparse
import ctypes
import datetime
import math
import os
import sys
import time
import warnings
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import backward_peers as bp  # noqa: E402
import call_overhead as co  # noqa: E402
import peers  # noqa: E402
import workloads as W  # noqa: E402
from rounds import measure_rounds  # noqa: E402

# causal, window (left, right) (-1: unbounded), softcap (0: off), sinks (jfa only).
Kind = namedtuple("Kind", "causal left right softcap sinks")
KINDS = {"swa128": Kind(True, 128, 0, 0.0, False), "swa4096": Kind(True, 4096, 0, 0.0, False),
         "swa128nc": Kind(False, 128, 128, 0.0, False),
         "softcap50": Kind(True, -1, 0, 50.0, False),
         "swa_softcap": Kind(True, 4096, 0, 50.0, False), "sinks": Kind(True, -1, 0, 0.0, True),
         "swa_sinks": Kind(True, 128, 0, 0.0, True)}
DEFAULT_WORKLOADS = ["W1", "W2", "W3"]
DEFAULT_HEAD_DIMS = ["64", "128", "256"]
METHODS = {"jfa": "jfa", "fa3": peers.FA3_LABEL, "jfa_nosinks": "jfa without sinks",
           "flex": "FlexAttention"}
PEER_SHORT = {"fa3": "FA3", "jfa_nosinks": "jfa-nosink"}
# The peers --peers chooses from (jfa_nosinks, the sinks kinds' baseline, runs either way).
PEER_CHOICES = ("fa3", "flex")
# FlexAttention on the sinks kinds: its output corrected by the LSE (flex_sink_correction).
FLEX_SINKS_LABEL = "FlexAttention + LSE sink correction"
SINK_METHODS = ("jfa", "flex")  # the methods that take a kind's sinks
# FA3's keywords: peers' (scale, mask) and the local-attention arguments.
FA3_LOCAL_KEYWORDS = {"window_size_left": ("window_size_left",),
                      "window_size_right": ("window_size_right",), "softcap": ("softcap",)}
SINKS_SEED = 1
PASSES = ("forward", "backward")
PASS_CHOICES = {"forward": ("forward",), "backward": ("backward",), "both": PASSES}
PASS_STEMS = {"forward": "local", "backward": "local-backward", "both": "local-both"}
PASS_TITLES = {"forward": "forward",
               "backward": "backward (the backward op alone, after one untimed forward)"}
# Useful FLOPs of a pass, in forwards: backward_peers' 2.5 for the backward (five matmuls of the
# forward's size where the forward does two).
FLOP_FACTOR = {"forward": 1.0, "backward": bp.FLOP_FACTOR["backward"]}


# ---- counting and the reference -----------------------------------------------------------------

def visible_pairs(lq, lk, causal=False, left=-1, right=-1):
    """Visible (query, key) pairs of one sequence, exactly: query i sees the keys j of [0, lk)
    with d - left <= j <= d + right, d = i + lk - lq (-1: that side unbounded; causal: right 0)."""
    lq, lk = int(lq), int(lk)
    if causal:
        right = 0
    if lq <= 0 or lk <= 0:
        return 0

    def prefix(x):  # sum of min(a, lk) for a = 1..x (0 for x <= 0)
        if x <= 0:
            return 0
        return x * (x + 1) // 2 if x <= lk else lk * (lk + 1) // 2 + (x - lk) * lk

    def upto(c):  # sum over i of clamp(i + c, 0, lk): keys j < i + c of each row
        return prefix(c + lq - 1) - prefix(c - 1)

    shift = lk - lq
    seen = upto(shift + right + 1) if right >= 0 else lq * lk
    return seen - (upto(shift - left) if left >= 0 else 0)


def local_flops(lengths_q, lengths_k, kind, heads, head_dim, head_dim_v=0):
    """Useful FLOPs of a kind: 2 * visible pairs * heads * (head_dim + head_dim_v)."""
    pairs = sum(visible_pairs(a, b, kind.causal, kind.left, kind.right)
                for a, b in zip(lengths_q, lengths_k))
    return 2.0 * pairs * heads * (head_dim + (head_dim_v or head_dim))


def pass_flops(lengths_q, lengths_k, kind, heads, head_dim, head_dim_v=0, pass_name="forward"):
    """Useful FLOPs of a pass: FLOP_FACTOR[pass_name] x local_flops (the backward 2.5 x the
    forward's, as backward_peers.backward_flops counts it, over the visible pairs)."""
    return FLOP_FACTOR[pass_name] * local_flops(lengths_q, lengths_k, kind, heads, head_dim,
                                                head_dim_v)


def visible(lq, lk, causal=False, window=(-1, -1), device=None):
    """[Lq, Lk] bool: query i sees key j (jfa.h's rule, bottom-right aligned; causal: right 0)."""
    import torch
    left, right = window[0], 0 if causal else window[1]
    d = torch.arange(lq, device=device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=device)[None, :]
    seen = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= j >= d - left
    if right >= 0:
        seen &= j <= d + right
    return seen


def local_probs(s, seen, softcap=0.0, sink=None):
    """The attention weights of scaled scores s [h, Lq, Lk] under softcap, the mask seen
    [Lq, Lk] and a sink logit per head (sink [h], or None), which joins each row's softmax
    denominator and carries no value: [h, Lq, Lk]. Out of place, so that torch autograd
    differentiates it."""
    import torch
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    live = seen.any(dim=1, keepdim=True)
    # A row that sees no key is left unmasked (a finite softmax) and zeroed after it: its output
    # is zeros and no NaN reaches the gradients (jfa's convention: it passes nothing back).
    s = s.masked_fill(~seen & live, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink[:, None, None].expand(s.shape[0], s.shape[1], 1)], dim=-1)
    return (torch.softmax(s, dim=-1) * live)[..., :seen.shape[1]]


def local_reference(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, sinks=None):
    """Attention of one sequence in float64 (torch, any device): q [Lq, H, D], k [Lk, Hkv, D],
    v [Lk, Hkv, Dv], sinks None or [H]; out [Lq, H, Dv], zeros for a row with no key."""
    import torch
    lq, H = q.shape[0], q.shape[1]
    lk, Hkv, Dv = v.shape
    out = torch.zeros(lq, H, Dv, dtype=torch.float64, device=q.device)
    if lq == 0 or lk == 0:
        return out
    seen = visible(lq, lk, causal, window, q.device)
    qs, ks, vs = (x.double().transpose(0, 1) for x in (q, k, v))
    if H != Hkv:
        ks, vs = ks.repeat_interleave(H // Hkv, 0), vs.repeat_interleave(H // Hkv, 0)
    chunk = max(1, min(H, (1 << 27) // (lq * (lk + 1))))  # <= 1 GiB a tensor of scores
    with torch.no_grad():
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            sink = None if sinks is None else sinks[h0:h1].to(q.device, torch.float64)
            # The scores go in unnamed: local_probs drops each step's tensor as it goes.
            p = local_probs(torch.matmul(qs[h0:h1], ks[h0:h1].transpose(1, 2)).mul_(scale),
                            seen, softcap, sink)
            out[:, h0:h1] = torch.matmul(p, vs[h0:h1]).transpose(0, 1)
    return out


def local_reference_grads(q, k, v, dout, scale, causal=False, window=(-1, -1), softcap=0.0,
                          sinks=None):
    """The gradients of local_reference's attention of one sequence given dout [Lq, H, Dv], in
    float64 through torch autograd: dq [Lq, H, D], dk [Lk, Hkv, D], dv [Lk, Hkv, Dv] (GQA: summed
    over each group's query heads) and dsinks [H] (None without sinks). A row that sees no key
    passes nothing back, to the sinks either (jfa's convention)."""
    import torch
    f64, dev = torch.float64, q.device
    lq, H, D = q.shape
    lk, Hkv, Dv = v.shape
    dq = torch.zeros(lq, H, D, dtype=f64, device=dev)
    dk = torch.zeros(lk, Hkv, D, dtype=f64, device=dev)
    dv = torch.zeros(lk, Hkv, Dv, dtype=f64, device=dev)
    dsinks = None if sinks is None else torch.zeros(H, dtype=f64, device=dev)
    if lq == 0 or lk == 0:
        return dq, dk, dv, dsinks
    seen = visible(lq, lk, causal, window, dev)
    qs, ks, vs, g = (x.to(f64).transpose(0, 1) for x in (q, k, v, dout))
    # Heads are independent: a chunk of them at a time, <= 512 MiB of float64 scores each (autograd
    # keeps several tensors of that size).
    chunk = max(1, min(H, (1 << 26) // (lq * (lk + 1))))
    with torch.enable_grad():
        for h0 in range(0, H, chunk):
            h1 = min(H, h0 + chunk)
            kv = torch.arange(h0, h1, device=dev) // (H // Hkv)
            leaves = [qs[h0:h1].detach().clone(), ks[kv].detach(), vs[kv].detach()]
            if sinks is not None:
                leaves.append(sinks[h0:h1].detach().to(dev, f64).clone())
            for x in leaves:
                x.requires_grad_(True)
            s = torch.matmul(leaves[0], leaves[1].transpose(1, 2)) * scale
            p = local_probs(s, seen, softcap, leaves[3] if sinks is not None else None)
            o = torch.matmul(p, leaves[2])
            del s, p
            grads = torch.autograd.grad(o, leaves, grad_outputs=g[h0:h1])
            dq[:, h0:h1] = grads[0].transpose(0, 1)
            dk.index_add_(1, kv, grads[1].transpose(0, 1))
            dv.index_add_(1, kv, grads[2].transpose(0, 1))
            if sinks is not None:
                dsinks[h0:h1] = grads[3]
            del o, grads, leaves
    return dq, dk, dv, dsinks


def local_case_grads(case, dout, kind, sinks=None):
    """The float64 reference of the backward of a kind on a case (peers_gpu's Case, dout packed
    as its output): ({sampled sequence: (dq, dk, dv)}, dsinks [H] or None). jfa sums a sink's
    gradient over the batch, so dsinks takes every sequence, not the sample alone."""
    refs, dsinks, sample = {}, None, set(case.sample)
    for i in (range(case.B) if sinks is not None else case.sample):
        a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
        c, d = case.cu_k_host[i], case.cu_k_host[i + 1]
        dq, dk, dv, ds = local_reference_grads(
            case.q[a:b], case.k[c:d], case.v[c:d], dout[a:b], case.scale, kind.causal,
            (kind.left, kind.right), kind.softcap, sinks)
        if i in sample:
            refs[i] = (dq, dk, dv)
        if ds is not None:
            dsinks = ds if dsinks is None else dsinks + ds
    return refs, dsinks


# ---- report (no torch needed) -------------------------------------------------------------------

def peer_of(kind_name):
    """The method jfa is compared with: FA3, or jfa without sinks where the kind has sinks."""
    return "jfa_nosinks" if KINDS[kind_name].sinks else "fa3"


def cell_methods(kind_name, available=None):
    """The methods of a kind's cells, in measuring order: jfa, its peer (peer_of), FlexAttention;
    those of `available` (the run's methods: --peers) alone where given."""
    methods = ["jfa", peer_of(kind_name), "flex"]
    return [m for m in methods if available is None or m in available]


def method_label(name, sinks=None):
    """The label of a method's records: FlexAttention with sinks is the LSE-corrected variant."""
    return FLEX_SINKS_LABEL if name == "flex" and sinks is not None else METHODS[name]


def _rate(r, mode):
    return r.get(f"{mode}_tflops") if r and r.get("status") in peers.RANKED else None


def _cell(r, mode):
    if r is not None and r.get("status") not in peers.RANKED:
        return peers.CELL.get(r.get("status"), r.get("status") or "-")
    return "-" if _rate(r, mode) is None else f"{_rate(r, mode):.1f}"


def table_rows(records):
    """(workload, dtype, kind) of every row: by workload base (in the records' order), dtype,
    kind (KINDS' order), head size."""
    bases, rows = [], {}
    for r in records:
        base = r.get("base", r["workload"])
        if base not in bases:
            bases.append(base)
        rows.setdefault((r["workload"], r["dtype"], r["kind"]),
                        (bases.index(base), r["dtype"], list(KINDS).index(r["kind"]),
                         r.get("head_dim", 0), r.get("head_dim_v") or 0))
    return sorted(rows, key=rows.get)


def pass_of(rec):
    """The pass of a record; records written before there were passes are forward ones."""
    return rec.get("pass") or "forward"


def _ratios(jfa, other):
    """jfa's TFLOP/s over another method's, eager and graph ("-" where either was not timed)."""
    out = []
    for mode in peers.MODES:
        a, b = _rate(jfa, mode), _rate(other, mode)
        out.append(f"{a / b:.2f}" if a and b else "-")
    return out


def pass_table(records, pass_name):
    """The lines of one pass's table: its title, the header, a row per workload base x kind x
    head_dim (table_rows) with jfa's and the peer's useful TFLOP/s eager and graph, jfa / peer
    (eager, graph), then, where the records hold FlexAttention's, its TFLOP/s and jfa / Flex
    (÷F), and the peer's name."""
    by = {(r["workload"], r["dtype"], r["kind"], r["method"]): r for r in records}
    flex = any(r["method"] == "flex" for r in records)
    counted = "" if pass_name == "forward" else f"{FLOP_FACTOR[pass_name]:g} x the forward's, "
    head = (f"{'workload':<9}{'dtype':<6}{'kind':<12}{'d':>7}{'jfa eager':>11}{'jfa graph':>11}"
            f"{'peer eager':>11}{'peer graph':>11}{'÷ eager':>9}{'÷ graph':>9}"
            + (f"{'flex eager':>11}{'flex graph':>11}{'÷F eager':>9}{'÷F graph':>9}" if flex
               else "") + "  peer")
    lines = [f"{PASS_TITLES[pass_name]}: useful TFLOP/s ({counted}visible pairs under mask and "
             "window), medians", head]
    for wid, dtype, kind in table_rows(records):
        peer = peer_of(kind)
        jfa, other = by.get((wid, dtype, kind, "jfa")), by.get((wid, dtype, kind, peer))
        fx = by.get((wid, dtype, kind, "flex"))
        any_r = jfa or other or fx
        d = peers.head_dim_text(any_r.get("head_dim"), any_r.get("head_dim_v"))
        line = (f"{any_r.get('base', wid):<9}{dtype:<6}{kind:<12}{d:>7}"
                + "".join(f"{_cell(r, m):>11}" for r in (jfa, other) for m in peers.MODES)
                + "".join(f"{x:>9}" for x in _ratios(jfa, other)))
        if flex:
            line += ("".join(f"{_cell(fx, m):>11}" for m in peers.MODES)
                     + "".join(f"{x:>9}" for x in _ratios(jfa, fx)))
        lines.append(line + f"  {PEER_SHORT[peer]}")
    return lines


def format_table(records, stopped=""):
    """A table per pass (pass_table: forward, then backward); then the reasons behind every cell
    that is not a number, and `stopped`."""
    if not records:
        return "\n".join(["no results"] + ([stopped] if stopped else []))
    lines = []
    for pass_name in PASSES:
        mine = [r for r in records if pass_of(r) == pass_name]
        if mine:
            lines += ([""] if lines else []) + pass_table(mine, pass_name)
    notes, seen = [], set()
    for r in records:
        where = r["kind"] + ("" if pass_of(r) == "forward" else f" {pass_of(r)}")
        for what, text in ((r["status"], r.get("reason") or ""),
                           ("no graph", r.get("graph_reason") or "")):
            if what != "ok" and text and (r["method"], pass_of(r), what, text) not in seen:
                seen.add((r["method"], pass_of(r), what, text))
                notes.append(f"  {peers.record_label(r)} [{what}] (first: {r['workload']} "
                             f"{where}): {text[:200]}")
    lines.append("n/a: unavailable.  err: failed.  wrong: failed the check, not timed.  "
                 "jfa-nosink: the sinks kinds' peer, jfa without sinks (FA3 has none).")
    if any(r["method"] == "flex" for r in records):
        lines.append("flex: FlexAttention, torch.compile(flex_attention) on the packed sequences "
                     "with a block mask of the kind's window (built once, not timed) and the "
                     "softcap as a score_mod; ÷F: jfa ÷ FlexAttention. On the sinks kinds, "
                     "which FlexAttention lacks, its output is corrected by sigmoid(lse - sink) "
                     "(exact), the correction timed with it.")
    if notes:
        lines += ["notes:"] + notes[:40]
    if stopped:
        lines.append(stopped)
    return "\n".join(lines)


# ---- options ------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="jfa against FlashAttention-3 and FlexAttention on local attention, forward "
                    "and backward, on the GPU (see the module docstring)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None,
                    help="libjfa.so (default: the newest build/**/src/libjfa.so)")
    ap.add_argument("--cli", default=None, help="the jfa CLI, source of the workload lengths "
                    "(default: that of --lib's build or carried folder (bin/jfa beside lib/), "
                    "else the newest build/**/tools/jfa)")
    ap.add_argument("--fa3-lib", default=os.environ.get("FA3_LIB") or None,
                    help="FlashAttention-3's op library (torch.ops.flash_attn_3.fwd), e.g. "
                         ".peers/fa3_full_bf16.so (default: $FA3_LIB)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--name", default=None,
                    help="file stem of the JSON, as bench/peers.py (default <date>-<gpu>-local, "
                         "-local-backward or -local-both by --pass)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help="comma-separated bases of bench/workloads.py (default W1,W2,W3)")
    ap.add_argument("--head-dims", default=",".join(DEFAULT_HEAD_DIMS),
                    help=f"comma-separated head sizes of {','.join(peers.HEAD_DIM_SUFFIX)} "
                         "(default 64,128,256)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated of {','.join(KINDS)} (default all)")
    ap.add_argument("--dtypes", default="bf16", help="fp16,bf16 (default bf16)")
    ap.add_argument("--peers", default=",".join(PEER_CHOICES),
                    help="comma-separated peers of jfa, of fa3,flex (default both); FlexAttention "
                         "compiles its kernels for every workload and pass, for softcap and for "
                         "sinks (minutes): --peers fa3 leaves it out. The sinks kinds' jfa "
                         "without sinks runs either way")
    ap.add_argument("--pass", dest="pass_option", default="forward", choices=list(PASS_CHOICES),
                    help="what is timed: the forward, the backward op alone (after one untimed "
                         "forward saving what it needs), or both (default forward)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every cell N times, the methods in alternating order; medians")
    ap.add_argument("--runs", type=int, default=peers.RUNS,
                    help=f"timed calls and graph replays per round (default {peers.RUNS})")
    ap.add_argument("--warmup", type=int, default=peers.WARMUP,
                    help=f"untimed calls before each timing (default {peers.WARMUP})")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no cell after this many seconds; write what was measured")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.warmup < 0:
        ap.error("--rounds and --runs must be at least 1, --warmup at least 0")
    bases = peers.parse_list(args.workloads, W.QUICK_IDS, "workload")
    try:
        args.workload_ids = peers.head_dim_ids(peers.parse_list(args.head_dims), bases)
    except ValueError as e:
        ap.error(f"--head-dims: {e}")
    args.kind_names = peers.parse_list(args.kinds, list(KINDS), "kind")
    args.dtype_names = peers.parse_list(args.dtypes, list(W.DTYPES), "dtype")
    given = peers.parse_list(args.peers, list(PEER_CHOICES), "peer")
    args.peer_names = [p for p in PEER_CHOICES if p in given]
    args.passes = PASS_CHOICES[args.pass_option]
    if not (args.workload_ids and args.kind_names and args.dtype_names):
        ap.error("no cell: --workloads, --head-dims, --kinds and --dtypes must not be empty")
    return args


def default_stem(date, gpu, pass_option):
    """The JSON's file stem without --name: <date>-<gpu>-local, -local-backward or -local-both."""
    return f"{date}-{peers.gpu_slug(gpu)}-{PASS_STEMS[pass_option]}"


def carried_cli(lib_path):
    """<dir>/bin/jfa for a library <dir>/lib/libjfa.so (scripts/gpu-check.sh's carried folder)."""
    if not lib_path:
        return None
    cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib_path))), "bin", "jfa")
    return cand if os.path.isfile(cand) else None


# ---- the GPU side -------------------------------------------------------------------------------

class LocalLibrary:
    """A bench/libjfa.py Library whose params() also set the cell's local-attention fields
    (self.fields: window_left, window_right, softcap, sinks), so peers_gpu.Jfa runs them; with
    the backward's calls, which libjfa.Library lacks."""

    def __init__(self, lib):
        self.lib, self.fields = lib, {}

    def params(self, **kw):
        p = self.lib.params(**kw)
        for name, value in self.fields.items():
            setattr(p, name, value)
        return p

    def backward_params(self, forward, *, dout, dq, dk, dv, dsinks=None):
        """A jfa_attention_backward_params filled by this build's sized init, holding a copy of
        the forward's params (out and lse as that call wrote them) and the pointers given
        (integers, dsinks None without sinks)."""
        from libjfa import _library
        b = _library.BackwardParams()
        self.check(self.lib.lib.jfa_attention_backward_params_init_sized(
            ctypes.byref(b), ctypes.sizeof(b)), "jfa_attention_backward_params_init_sized")
        b.forward = forward
        b.dout, b.dq, b.dk, b.dv, b.dsinks = dout, dq, dk, dv, dsinks
        return b

    def backward_workspace_size(self, b):
        """Bytes of device workspace a backward with these params needs."""
        size = ctypes.c_size_t(0)
        self.check(self.lib.lib.jfa_attention_backward_workspace_size(
            ctypes.byref(b), ctypes.byref(size)), "jfa_attention_backward_workspace_size")
        return size.value

    def backward_fn(self, b):
        """A zero-argument callable running the backward on fixed params, as forward_fn."""
        from libjfa import SUCCESS
        bwd, ref, check = self.lib.lib.jfa_attention_backward, ctypes.byref(b), self.check

        def run():
            s = bwd(ref)
            if s != SUCCESS:
                check(s, "jfa_attention_backward")

        run.params = b  # keeps the params alive as long as the callable
        return run

    def __getattr__(self, name):
        return getattr(self.lib, name)


def local_fields(kind, sinks=None):
    """LocalLibrary.fields of a kind: its window and softcap, and sinks (a tensor, or None)."""
    return {"window_left": kind.left, "window_right": kind.right, "softcap": kind.softcap,
            "sinks": None if sinks is None else sinks.data_ptr()}


def cell_sinks(torch, kind, heads, device):
    """The sinks of a kind's cells: float32 [heads] ~ N(0, 1) from SINKS_SEED on device; None
    for a kind without."""
    if not kind.sinks:
        return None
    gen = torch.Generator(device="cpu").manual_seed(SINKS_SEED)
    return torch.randn(heads, generator=gen, dtype=torch.float32).to(device)


class Variant:
    """A method of this bench (peers_gpu.measure's interface): its prepare, with the rows of the
    check wrapped to keep the max absolute error against the reference."""

    def __init__(self, name, prepare):
        self.name, self.label, self._prepare = name, METHODS[name], prepare
        self.max_abs_error = None

    def current_label(self):
        return self.label

    def prepare(self, case, causal):
        self.max_abs_error = None
        prep = self._prepare(case, causal)
        inner, refs = prep.rows, case.reference(causal)

        def rows(out, i):
            o = inner(out, i)
            err = (o.double() - refs[i]).abs().max().item() if o.numel() else 0.0
            m = self.max_abs_error
            if m is None or math.isnan(err) or (not math.isnan(m) and err > m):
                self.max_abs_error = err
            return o

        if inner is not None:
            prep.rows = rows
        return prep


def fa3_values(case, kind):
    """FA3's forward arguments by name for a kind's cell: the varlen batch, the scale, the mask,
    the window and the softcap (the backward takes them under the same names)."""
    return {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_q,
            "cu_seqlens_k": case.cu_k, "max_seqlen_q": case.max_q, "max_seqlen_k": case.max_k,
            "softmax_scale": case.scale, "is_causal": bool(kind.causal),
            "window_size_left": kind.left, "window_size_right": kind.right,
            "softcap": float(kind.softcap)}


def fa3_prepare(G, co, ctx):
    """FA3's varlen forward with the cell's window and softcap (ctx["kind"])."""
    def prepare(case, causal):
        op, kind = ctx.get("fa3_op"), ctx["kind"]
        if op is None:
            raise G.Unavailable(ctx.get("fa3_error") or peers.FA3_NOT_AVAILABLE)
        if kind.sinks:
            raise G.Unavailable("FlashAttention-3 has no attention sinks")
        G._fa3_check_head_dims(case)
        try:
            args, kwargs = co.fa3_call(ctx["fa3_arguments"], fa3_values(case, kind),
                                       dict(co.FA3_KEYWORDS, **FA3_LOCAL_KEYWORDS))
        except ValueError as e:
            raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")
        return G.Prepared(lambda: op(*args, **kwargs)[0], lambda out, i: case.q_rows(out, i),
                          dense=lambda o: o, label=peers.FA3_LABEL,
                          provider=ctx.get("fa3_provider", "torch.ops.flash_attn_3.fwd"))
    return prepare


def measure_cell(torch, G, ctx, impls, case, kind_name, timing, opts, rounds, report):
    """One record per method of the cell that impls holds (cell_methods; peers.combine_rounds of
    its rounds) of a kind's forward on a case: jfa and FlexAttention with the kind's sinks, FA3 and
    jfa_nosinks without (ctx["kind"] and ctx["sinks"] say which to the methods)."""
    kind, w = KINDS[kind_name], case.w
    flops = local_flops(w.lengths_q, w.lengths_k, kind, case.H, case.D, case.Dv)
    sinks = cell_sinks(torch, kind, case.H, case.device)
    refs = {}

    def measure(m):
        with_sinks = sinks if m in SINK_METHODS else None
        key = with_sinks is not None
        if key not in refs:
            refs[key] = {i: local_reference(
                case.q_rows(case.q, i), case.k[case.cu_k_host[i]:case.cu_k_host[i + 1]],
                case.v[case.cu_k_host[i]:case.cu_k_host[i + 1]], case.scale, kind.causal,
                (kind.left, kind.right), kind.softcap, with_sinks) for i in case.sample}
        case._refs = {kind.causal: refs[key]}  # what peers_gpu's check compares with
        ctx["kind"], ctx["sinks"] = kind, with_sinks
        if "jfa_lib" in ctx:
            ctx["jfa_lib"].fields = local_fields(kind, with_sinks)
        rec = G.measure(impls[m], case, kind.causal, timing, opts)
        rec.update(kind=kind_name, base=w.spec.base, window=[kind.left, kind.right],
                   softcap=kind.softcap, sinks=key, max_abs_error=impls[m].max_abs_error,
                   useful_gflop=flops / 1e9)
        rec["pass"] = "forward"
        if rec["status"] == "wrong":  # not timed: the kernel time peers_gpu took is dropped
            rec.update(median_ms=None, min_ms=None, useful_tflops=None, eff_tbps=None)
        elif rec.get("median_ms"):
            rec["useful_tflops"] = flops / (rec["median_ms"] * 1e-3) / 1e12
        return peers.add_rates(rec)

    methods = cell_methods(kind_name, impls)
    per_method = measure_rounds(methods, rounds, measure, report)
    return [peers.combine_rounds(per_method[m]) for m in methods]


# ---- the backward -------------------------------------------------------------------------------

class LocalBwdCase:
    """A case of the backward: peers_gpu's Case, the upstream gradient dO (packed as the output,
    [total_q, H, Dv]) and the float64 reference of the kind in use (use()), in
    backward_peers.check's interface (case, reference)."""

    def __init__(self, case, seed):
        import torch
        self.case = case
        gen = torch.Generator(device=case.device).manual_seed(seed)
        self.dout = torch.randn(case.total_q, case.H, case.Dv, device=case.device,
                                dtype=case.dtype, generator=gen)
        self._refs, self._in_use = {}, None

    def use(self, kind, sinks=None):
        """Makes the reference of a kind with these sinks (None: without) the one in use,
        computed once (local_case_grads)."""
        key = (kind, sinks is not None)
        if key not in self._refs:
            self._refs[key] = local_case_grads(self.case, self.dout, kind, sinks)
        self._in_use = key

    def reference(self, causal=None):
        """{sampled sequence: (dq, dk, dv)} of the kind in use (the kind sets the mask)."""
        return self._refs[self._in_use][0]

    def dsinks(self):
        """The reference's dsinks [H] over every sequence, None without sinks."""
        return self._refs[self._in_use][1]

    def release(self):
        self._refs, self._in_use, self.dout = {}, None, None


def check_backward(bc, kind, grads, tolerance):
    """(status, {gradient: relative error}, the largest, reason) of a method's gradients:
    backward_peers.check of dq, dk and dv on the sample, then dsinks (grads[3], where the method
    has sinks) against the reference's over every sequence."""
    import torch
    status, errors, worst, reason = bp.check(bc, kind.causal, tuple(grads[:3]), tolerance)
    if len(grads) < 4:
        return status, errors, worst, reason
    ref = bc.dsinks()
    num = (grads[3].double() - ref).norm().item()
    den = ref.norm().item()
    err = num / den if den > 0 else (0.0 if num == 0 else math.inf)  # NaN stays NaN
    errors = dict(errors, dsinks=err)
    worst = max(errors.values(), key=lambda e: (e != e, e))  # NaN counts as the worst
    if status != "ok":
        return status, errors, worst, reason
    if not bool(torch.isfinite(grads[3]).all().item()):
        return "wrong", errors, worst, "non-finite values in dsinks"
    if not err <= tolerance:
        return "wrong", errors, worst, f"relative error dsinks {err:.3g} > {tolerance:g}"
    return "ok", errors, worst, ""


def jfa_backward_prepare(G, ctx):
    """jfa's backward through its C entry: the cell's forward once (ctx["jfa_lib"]'s params carry
    the kind's window and softcap and the sinks given), saving out and LSE, then
    jfa_attention_backward from them, writing dsinks (float32 [heads]) where there are sinks. Kept
    workspaces, as peers_gpu.Jfa's; the CPU backend for a case on the CPU."""
    def prepare(bc, kind, sinks):
        import torch
        lib = ctx.get("jfa_lib")
        if lib is None:
            raise G.Unavailable(ctx.get("jfa_error") or "libjfa.so not loaded")
        lib.fields = local_fields(kind, sinks)  # the forward's sinks are the ones dsinks is for
        c, gpu = bc.case, bc.case.device.type == "cuda"
        out = torch.empty(c.total_q, c.H, c.Dv, device=c.device, dtype=c.dtype)
        lse = torch.empty(c.H, c.total_q, device=c.device, dtype=torch.float32)
        p = lib.params(q=c.q.data_ptr(), k=c.k.data_ptr(), v=c.v.data_ptr(), out=out.data_ptr(),
                       lse=lse.data_ptr(), cu_seqlens_q=c.cu_q.data_ptr(),
                       cu_seqlens_k=c.cu_k.data_ptr(), batch=c.B, total_q=c.total_q,
                       total_k=c.total_k, heads_q=c.H, heads_kv=c.Hkv, head_dim=c.D,
                       dtype=c.dtype_name, causal=kind.causal, softmax_scale=c.scale,
                       max_seqlen_q=c.max_q, max_seqlen_k=c.max_k,
                       backend="cuda" if gpu else "cpu",
                       stream=torch.cuda.current_stream().cuda_stream if gpu else None)
        if c.Dv != c.D:
            p.head_dim_v = c.Dv
        fwd_space = torch.empty(lib.workspace_size(p), dtype=torch.uint8, device=c.device)
        p.workspace, p.workspace_bytes = fwd_space.data_ptr(), fwd_space.numel()
        lib.forward_fn(p)()
        grads = tuple(torch.empty_like(x) for x in (c.q, c.k, c.v))
        if sinks is not None:
            grads += (torch.empty(c.H, device=c.device, dtype=torch.float32),)
        b = lib.backward_params(p, dout=bc.dout.data_ptr(), dq=grads[0].data_ptr(),
                                dk=grads[1].data_ptr(), dv=grads[2].data_ptr(),
                                dsinks=grads[3].data_ptr() if sinks is not None else None)
        bwd_space = torch.empty(lib.backward_workspace_size(b), dtype=torch.uint8,
                                device=c.device)
        b.forward.workspace, b.forward.workspace_bytes = bwd_space.data_ptr(), bwd_space.numel()
        bwd = lib.backward_fn(b)

        def run():
            bwd()
            return grads

        return bp.Prepared(run, provider=f"libjfa {lib.version()} ({os.path.basename(lib.path)}),"
                                         " jfa_attention_backward",
                           explain=lambda e: jfa_failure(G, e), outputs=grads,
                           keep=(out, lse, fwd_space, bwd_space))
    return prepare


def jfa_failure(G, e):
    """(status, reason) of jfa's failed backward call: "unavailable" where the build does not
    take what was asked (JFA_ERROR_UNSUPPORTED, no CUDA backend), else "error"."""
    from jfa import JfaBackendUnavailableError, JfaUnsupportedError
    unavailable = isinstance(e, (JfaUnsupportedError, JfaBackendUnavailableError))
    return ("unavailable" if unavailable else "error"), G.short(e)


def fa3_failure(G, e):
    """(status, reason) of FA3's failed backward call: "unavailable" where the build refuses it
    (a forward-only build, no local attention or softcap: "does not support", "disabled"), else
    "error"."""
    text = G.short(e)
    low = text.lower()
    return ("unavailable" if "not support" in low or "disabled" in low else "error"), text


def fa3_backward_prepare(G, co, ctx):
    """FA3's varlen backward, torch.ops.flash_attn_3.bwd, after one forward, both with the cell's
    window and softcap, the calls built from the ops' schemas (co.fa3_call, backward_peers'
    schema_call); it writes the dq, dk and dv it is given."""
    def prepare(bc, kind, sinks):
        import torch
        fwd_op, bwd_op = ctx.get("fa3_fwd"), ctx.get("fa3_bwd")
        if fwd_op is None or bwd_op is None:
            raise G.Unavailable(ctx.get("fa3_bwd_error") or peers.FA3_NOT_AVAILABLE)
        if kind.sinks or sinks is not None:
            raise G.Unavailable("FlashAttention-3 has no attention sinks")
        c = bc.case
        G._fa3_check_head_dims(c)
        values = fa3_values(c, kind)
        try:
            fargs, fkwargs = co.fa3_call(ctx["fa3_fwd_arguments"], values,
                                         dict(co.FA3_KEYWORDS, **FA3_LOCAL_KEYWORDS))
        except ValueError as e:
            raise G.Unavailable(f"torch.ops.flash_attn_3.fwd: {e}")
        res = fwd_op(*fargs, **fkwargs)
        grads = tuple(torch.empty_like(x) for x in (c.q, c.k, c.v))
        values.update(dout=bc.dout, out=res[0], softmax_lse=res[1], dq=grads[0], dk=grads[1],
                      dv=grads[2])
        try:
            args, kwargs = bp.schema_call(ctx["fa3_bwd_arguments"], values,
                                          keywords=dict(bp.FA3_BWD_KEYWORDS,
                                                        **FA3_LOCAL_KEYWORDS))
        except ValueError as e:
            raise G.Unavailable(f"torch.ops.flash_attn_3.bwd: {e}")

        def run():
            bwd_op(*args, **kwargs)
            return grads

        return bp.Prepared(run, provider=ctx.get("fa3_bwd_provider") or "",
                           explain=lambda e: fa3_failure(G, e), outputs=grads, keep=res)
    return prepare


def load_fa3_backward(ctx, lib_path):
    """FA3's fwd and bwd ops and their schemas (backward_peers.load_fa3; loading lib_path again
    is a no-op once the forward has) into ctx as fa3_fwd, fa3_bwd and their _arguments, the
    schemas' text as fa3_schemas, its provider and error as fa3_bwd_provider and fa3_bwd_error:
    the forward's own keys stay as they are."""
    got = {"schemas": {}}
    bp.load_fa3(got, lib_path)
    for key in ("fa3_fwd", "fa3_bwd", "fa3_fwd_arguments", "fa3_bwd_arguments"):
        if key in got:
            ctx[key] = got[key]
    ctx.update(fa3_schemas=got["schemas"], fa3_bwd_provider=got.get("fa3_provider"),
               fa3_bwd_error=got.get("fa3_error"))


# ---- FlexAttention ------------------------------------------------------------------------------
# As bench/peers_gpu.py's Flex and bench/backward_peers.py's prepare_flex: the packed sequences as
# one [1, H, tokens, D] batch (peers_gpu.flex_layout), torch.compile(flex_attention) and
# create_block_mask from peers_gpu.flex_functions, its keywords from peers_gpu.flex_kwargs, the
# backward through torch autograd (backward_peers._autograd_peer). What is added: the kind's window
# in the mask_mod, the softcap as a score_mod, the sinks by a correction of the output by the LSE.

_FLEX_LOCAL = {}
_SCORE_MODS = {}


def flex_documents(case):
    """(doc_q [total_q], doc_k [total_k], shift [B] or None) of a case, int32 on its device: the
    sequence of every packed query and key row (peers_gpu.flex_block_mask's document ids) and
    shift[b] = cu_k[b + 1] - cu_q[b + 1], the end of sequence b's keys less the end of its queries
    (None where every q length is its k length: all zeros)."""
    import torch
    dev = case.device
    ids = torch.arange(case.B, dtype=torch.int32, device=dev)
    lq = torch.tensor(case.lq, dtype=torch.int64, device=dev)
    doc_q = torch.repeat_interleave(ids, lq, output_size=case.total_q)
    if not case.cross:
        return doc_q, doc_q, None
    lk = torch.tensor(case.lk, dtype=torch.int64, device=dev)
    doc_k = torch.repeat_interleave(ids, lk, output_size=case.total_k)
    shift = (case.cu_k[1:].to(torch.int32) - case.cu_q[1:].to(torch.int32)).contiguous()
    return doc_q, doc_k, shift


def flex_local_mask_mod(doc_q, doc_k, shift, kind):
    """FlexAttention's mask_mod of a kind over packed sequences (flex_documents): query row q_idx
    sees key row kv_idx iff both are of one sequence b and, with delta = kv_idx - q_idx - shift[b]
    (= j - (i + Lk - Lq) in the sequence's own positions i, j), -left <= delta <= right, a side
    of -1 unbounded, right 0 where causal: jfa.h's bottom-right aligned window (visible). Torch
    ops only, so it runs on index tensors of any shape as well as inside create_block_mask and
    the compiled kernels. left and right are int32 tensors it captures, not constants: every
    kind's mask then has the same code, and torch.compile(flex_attention) compiles once for all
    windows of a workload (with constants, once per kind; the block mask's sparsity is data)."""
    import torch
    dev = doc_q.device
    left = torch.tensor(kind.left, dtype=torch.int32, device=dev)
    right = torch.tensor(0 if kind.causal else kind.right, dtype=torch.int32, device=dev)

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        delta = kv_idx - q_idx if shift is None else kv_idx - q_idx - shift[d]
        return ((d == doc_k[kv_idx]) & ((left < 0) | (delta >= -left))
                & ((right < 0) | (delta <= right)))

    return mask_mod


def flex_softcap_score_mod(cap):
    """FlexAttention's score_mod of a softcap: cap * tanh(score / cap) of the scaled score (jfa's
    and local_probs' formula). One function per cap, kept: a new one would compile anew."""
    cap = float(cap)
    if cap not in _SCORE_MODS:
        import torch

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / cap) * cap

        _SCORE_MODS[cap] = score_mod
    return _SCORE_MODS[cap]


def flex_sink_correction(out, lse, sinks):
    """FlexAttention's output made the output with attention sinks: out [B, H, T, Dv] and lse
    [B, H, T] (natural log, over the scaled, soft-capped scores each row sees; -inf for a row that
    sees none) of the attention without sinks, sinks [H]. With a sink logit s in each row's
    softmax denominator, p_j = exp(x_j) / (exp(s) + S), S = sum_j exp(x_j) = exp(lse), so the
    output is out * S / (S + exp(s)) = out * sigmoid(lse - s): exact, and so is its autograd
    (dq, dk, dv through out and lse, dsinks summed over every row). A row that sees no key stays
    zeros and passes nothing back (sigmoid(-inf) = 0, as jfa). In out's dtype, computed in lse's
    (float32 from FlexAttention)."""
    import torch
    w = torch.sigmoid(lse - sinks.to(lse.dtype).view(1, -1, 1))
    return (out * w.unsqueeze(-1)).to(out.dtype)


def _no_donated_buffers():
    """As backward_peers.prepare_flex: the backward-only timing runs one compiled backward again
    and again (retain_graph), which torch refuses for a backward compiled with donated buffers;
    this must hold before the first compile."""
    import torch
    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if functorch_config is not None and hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False


def flex_fns(G, ctx):
    """(flex_attention, create_block_mask tried first, create_block_mask, the sink correction):
    ctx["flex_functions"] where set (the tests' eager ones), else peers_gpu.flex_functions'
    torch.compile(flex_attention), torch.compile(create_block_mask) and create_block_mask with
    torch.compile(flex_sink_correction) (one fused kernel), made once per process; Unavailable
    where this torch has no FlexAttention."""
    if ctx.get("flex_functions"):
        return ctx["flex_functions"]
    _no_donated_buffers()
    flex, cbm_compiled, cbm_eager = G.flex_functions(ctx)
    if "correction" not in _FLEX_LOCAL:
        import torch
        _FLEX_LOCAL["correction"] = torch.compile(flex_sink_correction,
                                                  dynamic=ctx.get("flex_dynamic"))
    return flex, cbm_compiled, cbm_eager, _FLEX_LOCAL["correction"]


def flex_mask_key(kind):
    """What a kind's block mask depends on: (causal, left, right) (not softcap, not sinks)."""
    return bool(kind.causal), kind.left, 0 if kind.causal else kind.right


def flex_local_block_mask(G, fns, case, kind):
    """(block mask, how it was built, seconds) of a kind's mask_mod on a case (flex_documents,
    flex_local_mask_mod), built once per case and flex_mask_key, kept on the case for every pass
    and round (a failure too; release_flex_masks drops them): create_block_mask compiled, else
    eager as peers_gpu.flex_block_mask (Skipped where that would materialize > 2^31 entries)."""
    cache = case.__dict__.setdefault("_flex_local_masks", {})
    key = flex_mask_key(kind)
    if key not in cache:
        try:
            cache[key] = _build_flex_block_mask(G, fns, case, kind)
        except Exception as e:
            cache[key] = e
    got = cache[key]
    if isinstance(got, Exception):
        raise got
    return got


def _build_flex_block_mask(G, fns, case, kind):
    import torch
    _, cbm_compiled, cbm_eager, _ = fns
    mask_mod = flex_local_mask_mod(*flex_documents(case), kind)
    dev = case.device
    t0 = time.perf_counter()
    try:
        bm = cbm_compiled(mask_mod, None, None, case.total_q, case.total_k, device=str(dev))
        how = "create_block_mask" if cbm_compiled is cbm_eager else (
            "torch.compile(create_block_mask)")
    except Exception as e:
        if case.total_q * case.total_k > (1 << 31):
            raise G.Skipped("compiled create_block_mask failed (%s) and the eager one would "
                            "materialize a %d x %d mask" % (G.short(e, 150), case.total_q,
                                                            case.total_k))
        bm = cbm_eager(mask_mod, None, None, case.total_q, case.total_k, device=str(dev))
        how = "eager create_block_mask (compiled one failed: %s)" % G.short(e, 120)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return bm, how, time.perf_counter() - t0


def release_flex_masks(case):
    """Drops the block masks flex_local_block_mask kept on a case."""
    case.__dict__.pop("_flex_local_masks", None)


def flex_lse_request():
    """(flex_attention's keywords asking for the LSE, a function taking it from what comes back
    second): return_aux=AuxRequest(lse=True) where this torch has it, else return_lse=True."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return {"return_lse": True}, lambda lse: lse
    return {"return_aux": AuxRequest(lse=True)}, lambda aux: aux.lse


def flex_attend(G, fns, case, kind, block_mask, with_sinks=False):
    """attend(q, k, v) of a kind on [1, H, tokens, D] inputs: flex_attention with the kind's block
    mask, the case's scale (peers_gpu.flex_kwargs, enable_gqa where K/V have fewer heads) and the
    softcap's score_mod; with_sinks: attend(q, k, v, sinks), flex_sink_correction of its output
    by its LSE."""
    flex, _, _, correct = fns
    kwargs = G.flex_kwargs(case, block_mask)
    if kind.softcap:
        kwargs["score_mod"] = flex_softcap_score_mod(kind.softcap)
    if not with_sinks:
        def attend(q, k, v):
            return flex(q, k, v, **kwargs)
        return attend
    lse_kwargs, lse_of = flex_lse_request()

    def attend_sinks(q, k, v, sinks):
        out, aux = flex(q, k, v, **kwargs, **lse_kwargs)
        return correct(out, lse_of(aux), sinks)

    return attend_sinks


def flex_about(case, kind, sinks, how, seconds, autograd=False):
    """(provider, note) of FlexAttention's records."""
    import torch
    gqa = ", enable_gqa=True" if case.H != case.Hkv else ""
    provider = f"torch.compile(flex_attention){gqa}, torch {torch.__version__}"
    if sinks is not None:
        provider += " + torch.compile(out * sigmoid(lse - sink)) (return_aux lse)"
    if autograd:
        provider += ", autograd"
    note = (f"block mask of the window over the packed sequences: {how}, {seconds:.1f} s, once "
            "per workload and mask (not timed); [1, H, tokens, D] layout made outside the timed "
            "call")
    if kind.softcap:
        note += f"; softcap {kind.softcap:g} as a score_mod"
    if sinks is not None:
        note += ("; sinks: FlexAttention has none, its output corrected by sigmoid(lse - sink) "
                 "(exact), timed with it")
    return provider, note


def flex_prepare(G, ctx):
    """FlexAttention's forward of the cell's kind (ctx["kind"]) with its sinks (ctx["sinks"]:
    the LSE-corrected variant, labelled FLEX_SINKS_LABEL), peers_gpu.measure's interface."""
    def prepare(case, causal):
        kind, sinks = ctx["kind"], ctx.get("sinks")
        fns = flex_fns(G, ctx)
        bm, how, seconds = flex_local_block_mask(G, fns, case, kind)
        attend = flex_attend(G, fns, case, kind, bm, sinks is not None)
        args = (G.flex_layout(case.q), G.flex_layout(case.k), G.flex_layout(case.v))
        if sinks is not None:
            args += (sinks,)

        def run():
            return attend(*args)

        def rows(out, i):
            a, b = case.cu_q_host[i], case.cu_q_host[i + 1]
            return out[0, :, a:b, :].transpose(0, 1)

        provider, note = flex_about(case, kind, sinks, how, seconds)
        return G.Prepared(run, rows, dense=lambda o: o, label=method_label("flex", sinks),
                          provider=provider, note=note)
    return prepare


def flex_backward_prepare(G, ctx):
    """FlexAttention's backward of a kind, torch autograd of flex_attend after one forward
    (backward_peers._autograd_peer: the forward's graph kept, the backward alone timed, on a
    stream of its own); with sinks, dsinks too (the sinks a leaf as q, k and v): the gradients
    (dq, dk, dv[, dsinks]) packed as the case's."""
    def prepare(bc, kind, sinks):
        fns = flex_fns(G, ctx)
        _no_donated_buffers()
        c = bc.case
        bm, how, seconds = flex_local_block_mask(G, fns, c, kind)
        attend = flex_attend(G, fns, c, kind, bm, sinks is not None)
        inputs = (G.flex_layout(c.q), G.flex_layout(c.k), G.flex_layout(c.v))
        if sinks is not None:
            inputs += (sinks,)

        def unpack(grads):
            return tuple(G.flex_packed(g) for g in grads[:3]) + tuple(grads[3:])

        provider, note = flex_about(c, kind, sinks, how, seconds, autograd=True)
        return bp._autograd_peer(False, attend, inputs, G.flex_layout(bc.dout), unpack,
                                 provider=provider, note=note)
    return prepare


def backward_record(name, bc, kind_name, sinks, flops):
    """The record of a method's backward on a cell, before it is measured."""
    c, kind = bc.case, KINDS[kind_name]
    return {"method": name, "label": method_label(name, sinks), "pass": "backward",
            "workload": c.w.id, "base": c.w.spec.base, "dtype": c.dtype_name, "kind": kind_name,
            "causal": kind.causal, "window": [kind.left, kind.right], "softcap": kind.softcap,
            "sinks": sinks is not None, "heads": c.H, "heads_kv": c.Hkv, "head_dim": c.D,
            "head_dim_v": c.Dv, "status": None, "reason": "", "provider": "", "rel_error": None,
            "rel_errors": {}, "tolerance": bp.TOLERANCE[c.dtype_name],
            "checked_sequences": len(c.sample), "useful_gflop": flops / 1e9, "eager_ms": None,
            "graph_ms": None, "graph_reason": ""}


def measure_backward(G, bc, prepare, kind, sinks, rec, opts):
    """rec filled in for one method's backward on a cell, on peers_gpu's side stream (an autograd
    peer's, FlexAttention's, on its own stream, prep.stream): prepared (its forward run once), its
    gradients (prep.unpack: packed as the case's) checked from NaN-filled buffers (rows it never
    writes fail), then, if right, timed eager and replayed in a CUDA graph (the replay checked
    too)."""
    import torch
    stream = G.side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")
            _measure_backward(G, bc, prepare, kind, sinks, rec, opts, stream)
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="error", reason="out of memory: " + G.short(e, 150))
    except Exception as e:
        rec.update(status="error", reason=G.short(e))
    finally:
        co.synchronize_quietly()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.empty_cache()
    return rec


def _measure_backward(G, bc, prepare, kind, sinks, rec, opts, stream):
    try:
        prep = prepare(bc, kind, sinks)
    except G.Unavailable as e:
        rec.update(status="unavailable", reason=str(e))
        return
    except G.Skipped as e:
        rec.update(status="skipped", reason=str(e))
        return
    except Exception as e:
        rec.update(status="error", reason="prepare: " + G.short(e))
        return
    rec["provider"] = prep.provider
    if prep.note:
        rec["note"] = prep.note
    # An autograd peer (FlexAttention) runs on a stream of its own, as in backward_peers.measure:
    # autograd runs the backward on its forward's stream, and the graph is captured there.
    with bp._on_stream(prep.stream), prep.context():
        _check_and_time_backward(G, bc, prep, kind, rec, opts, prep.stream or stream)


def _check_and_time_backward(G, bc, prep, kind, rec, opts, stream):
    import torch
    bp._poison(bc, prep, False)
    try:
        grads = prep.unpack(prep.run())
        torch.cuda.synchronize()
    except Exception as e:
        co.synchronize_quietly()
        status, reason = prep.explain(e) if prep.explain else ("error", G.short(e))
        rec.update(status=status, reason=reason)
        return
    status, errors, worst, reason = check_backward(bc, kind, grads, rec["tolerance"])
    rec.update(status=status, rel_errors=errors, rel_error=worst, reason=reason)
    del grads
    if status != "ok":
        return
    rec.update(co.eager_time(prep.run, opts["runs"], opts["warmup"]))

    def check_replay(out):
        ok, _, rec["graph_rel_error"], why = check_backward(bc, kind, prep.unpack(out),
                                                            rec["tolerance"])
        return "" if ok == "ok" else f"the replay's gradients are wrong: {why}"

    co.time_replays(G, prep.run, rec, opts, check_replay, nan_outputs=True, stream=stream)


def backward_progress_line(rec, tag):
    """backward_peers.progress_line of a record, with the dsinks error where there is one."""
    line = bp.progress_line(rec, tag)
    err = (rec.get("rel_errors") or {}).get("dsinks")
    return line if err is None else f"{line} dsinks err {err:.1e}"


def measure_backward_cell(torch, G, ctx, impls, bc, kind_name, opts, rounds, report):
    """One record per method of the cell that impls holds (cell_methods;
    backward_peers.combine_rounds of its rounds) of a kind's backward on a case: jfa and
    FlexAttention with the kind's sinks, its peer (FA3, or jfa without sinks) with none."""
    kind, c = KINDS[kind_name], bc.case
    flops = pass_flops(c.lq, c.lk, kind, c.H, c.D, c.Dv, "backward")
    sinks = cell_sinks(torch, kind, c.H, c.device)

    def measure(m):
        with_sinks = sinks if m in SINK_METHODS else None
        bc.use(kind, with_sinks)
        rec = backward_record(m, bc, kind_name, with_sinks, flops)
        return bp.add_rates(measure_backward(G, bc, impls[m], kind, with_sinks, rec, opts))

    methods = cell_methods(kind_name, impls)
    per_method = measure_rounds(methods, rounds, measure, report)
    return [bp.add_rates(bp.combine_rounds(per_method[m])) for m in methods]


def load_peers(ctx, env, passes, fa3_lib):
    """FA3's ops for the passes asked (co.load_fa3 for the forward, load_fa3_backward for the
    backward) into ctx, what was loaded or why not into env; a line to print per op schema."""
    lines = []
    if "forward" in passes:
        co.load_fa3(ctx, fa3_lib)
        env["fa3"] = ctx.get("fa3_provider") or ctx.get("fa3_error")
    if "backward" in passes:
        load_fa3_backward(ctx, fa3_lib)
        env["fa3_backward"] = ctx.get("fa3_bwd_provider") or ctx.get("fa3_bwd_error")
        env["fa3_schemas"] = ctx["fa3_schemas"]
        lines += [f"schema {op}: {schema}" for op, schema in ctx["fa3_schemas"].items()]
    return lines


def error_records(w, dtype, kind_name, pass_name, reason, available=None):
    """The records of a cell whose inputs or reference failed: one per method (cell_methods of
    the run's methods, `available`)."""
    return [{"method": m, "label": METHODS[m], "pass": pass_name, "workload": w.id,
             "base": w.spec.base, "dtype": dtype, "kind": kind_name, "head_dim": w.spec.head_dim,
             "head_dim_v": w.spec.value_dim, "causal": KINDS[kind_name].causal, "status": "error",
             "reason": reason} for m in cell_methods(kind_name, available)]


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch = peers.torch_with_cuda("local_peers.py")
    if torch is None:
        return 2
    import peers_gpu as G
    from libjfa import Library, cli_next_to, find_library

    env, ctx = G.environment(), {"jfa_error": "libjfa.so not found (pass --lib)"}
    lib_path = find_library(args.lib, REPO)
    try:
        lib = Library(lib_path) if lib_path else None
        if lib is not None and lib.cuda_available():  # else peers_gpu.Jfa says jfa_error
            ctx["jfa_lib"], env["jfa_version"] = LocalLibrary(lib), lib.version()
            del ctx["jfa_error"]
        elif lib is not None:
            ctx["jfa_error"] = f"{lib_path}: jfa_cuda_available() = 0 (no CUDA backend or GPU)"
    except Exception as e:
        ctx["jfa_error"] = f"cannot load {lib_path}: {G.short(e)}"
    schema_lines = []
    if "fa3" in args.peer_names:
        schema_lines = load_peers(ctx, env, args.passes, args.fa3_lib)
    else:
        env["fa3"] = "left out (--peers)"
    env["flex"] = (f"torch.compile(flex_attention), torch {torch.__version__}"
                   if "flex" in args.peer_names else "left out (--peers)")
    env["jfa_lib"] = lib_path
    cli = args.cli or cli_next_to(lib_path) or carried_cli(lib_path) or W.find_cli(None, REPO)
    env["jfa_cli"] = cli
    if "jfa_error" in ctx:
        print(f"jfa: unavailable: {ctx['jfa_error']}", flush=True)
    peer_line = ", ".join(f"{k}: {env[k]}" for k in ("fa3", "fa3_backward", "flex") if k in env)
    print(f"GPU {env.get('gpu')}, torch {env.get('torch')}, jfa {env.get('jfa_version', 'n/a')}, "
          f"{peer_line}", flush=True)
    for line in schema_lines:
        print(line, flush=True)

    jfa = G.Jfa(ctx).prepare
    impls = {"jfa": Variant("jfa", jfa), "jfa_nosinks": Variant("jfa_nosinks", jfa)}
    jfa_bwd = jfa_backward_prepare(G, ctx)
    bwd_impls = {"jfa": jfa_bwd, "jfa_nosinks": jfa_bwd}
    if "fa3" in args.peer_names:
        impls["fa3"] = Variant("fa3", fa3_prepare(G, co, ctx))
        bwd_impls["fa3"] = fa3_backward_prepare(G, co, ctx)
    if "flex" in args.peer_names:
        impls["flex"] = Variant("flex", flex_prepare(G, ctx))
        bwd_impls["flex"] = flex_backward_prepare(G, ctx)
    timing = G.Timing(min_runs=10, max_runs=30, warmup=3, warmup_ms=25.0, target_ms=150.0)
    opts = {"runs": args.runs, "warmup": args.warmup}
    date = datetime.date.today().isoformat()
    stem = args.name or default_stem(date, env.get("gpu"), args.pass_option)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, stem + ".json")
    loaded = W.load(args.workload_ids, cli)
    records, skipped = [], []
    settings = {k: getattr(args, k) for k in ("workload_ids", "dtype_names", "rounds", "runs",
                                              "warmup", "fa3_lib", "time_limit_s")}
    settings.update(kinds={k: KINDS[k]._asdict() for k in args.kind_names}, timing=vars(timing),
                    tolerance=G.TOLERANCE, data_seed=G.DATA_SEED, sinks_seed=SINKS_SEED,
                    passes=list(args.passes), peers=list(args.peer_names))
    if "backward" in args.passes:
        settings.update(backward_tolerance=bp.TOLERANCE,
                        grad_seed=G.DATA_SEED + bp.GRAD_SEED_OFFSET)
    counting = ("useful FLOPs = 2 * visible pairs * heads * (head_dim + head_dim_v), pairs "
                "counted exactly under the mask and window")
    if "backward" in args.passes:
        counting += f"; the backward's: {FLOP_FACTOR['backward']:g} x that"
    doc = {"title": f"jfa local-attention peers benchmark ({' and '.join(args.passes)})",
           "date": date, "environment": env, "settings": settings, "counting": counting,
           "workloads": {w.id: w.summary() for _, w, _ in loaded if w is not None},
           "workload_errors": {wid: err for wid, w, err in loaded if w is None},
           "results": records}
    for wid, err in doc["workload_errors"].items():
        print(f"{wid}: unavailable: {err}", flush=True)

    def report(r):
        line = peers.progress_line if pass_of(r) == "forward" else backward_progress_line
        print(line(r, f" {r['kind']} r{r['round']}"), flush=True)

    G.warm_gpu(3.0)
    for wid, w, _ in loaded:
        for dtype in (args.dtype_names if w is not None else []):
            case = bc = None
            for kind_name in args.kind_names:
                for pass_name in args.passes:
                    elapsed = time.perf_counter() - t_start
                    if args.time_limit_s is not None and elapsed > args.time_limit_s:
                        skipped.append(f"{wid} {dtype} {kind_name}"
                                       + ("" if pass_name == "forward" else f" {pass_name}"))
                        continue
                    try:
                        case = case or G.Case(w, dtype)
                        if pass_name == "forward":
                            records.extend(measure_cell(torch, G, ctx, impls, case, kind_name,
                                                        timing, opts, args.rounds, report))
                        else:
                            bc = bc or LocalBwdCase(case, G.DATA_SEED + bp.GRAD_SEED_OFFSET)
                            records.extend(measure_backward_cell(
                                torch, G, ctx, bwd_impls, bc, kind_name, opts, args.rounds,
                                report))
                    except Exception as e:  # inputs or reference: every method of the cell
                        reason = f"inputs or reference failed: {G.short(e)}"
                        print(f"[{wid} {dtype} {kind_name} {pass_name}] {reason}", flush=True)
                        records.extend(error_records(w, dtype, kind_name, pass_name, reason,
                                                     impls))
                    # After every cell: FlexAttention's compiles make a workload take minutes,
                    # and a run stopped by its caller keeps what it measured.
                    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
                    peers.write_json(json_path, doc)
            if bc is not None:
                bc.release()
            if case is not None:
                release_flex_masks(case)
                case.release()
            torch.cuda.empty_cache()
            doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            peers.write_json(json_path, doc)
    stopped = ""
    if skipped:
        stopped = (f"stopped: --time-limit-s {args.time_limit_s:g} reached; {len(skipped)} cells "
                   f"not measured (first: {skipped[0]})")
        doc.update(stopped=stopped, not_measured=skipped)
    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    peers.write_json(json_path, doc)
    print(f"\nwrote {json_path}\ntotal {doc['elapsed_s']:.0f} s on {env.get('gpu')}")
    print(format_table(records, stopped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
