"""The FlexAttention peer of bench/local_peers.py, forward and backward: the kind's window as a
mask_mod over the packed sequences and its block mask, the softcap as a score_mod, the sinks by
a correction of the output by its LSE, and the methods' prepares (flex_prepare,
flex_backward_prepare)."""

import time

import backward_peers as bp
from local_kinds import method_label

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
