"""The backward methods of bench/local_peers.py and their measurement: the backward's case
(LocalBwdCase, with its float64 reference), the gradients' check (dsinks included), jfa's, FA3's
and varlen FA2's backward methods (FlexAttention's is in local_flex), and a backward cell measured
on the GPU (measure_backward, measure_backward_cell)."""

import math
import os
import warnings

import backward_peers as bp
import call_overhead as co
import peers
from local_kinds import (FA3_LOCAL_KEYWORDS, KINDS, cell_methods, cell_sinks, fa3_values,
                         local_fields, method_label, method_run)
from local_reference import local_case_grads, pass_flops
from rounds import measure_rounds


class LocalBwdCase:
    """A case of the backward: peers_gpu's Case, the upstream gradient dO (packed as the output,
    [total_q, H, Dv]) and the float64 reference of the kind in use (use(); one per kind as a
    method runs it, a baseline's without its softcap or sinks), in backward_peers.check's
    interface (case, reference)."""

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


def fa2_window(G, kind, sinks=None):
    """The window aten's varlen FA2 runs a kind with, (left, right); Unavailable for a kind with
    softcap or sinks, which it does not take."""
    if kind.sinks or sinks is not None:
        raise G.Unavailable("FlashAttention-2 (aten) has no attention sinks")
    if kind.softcap:
        raise G.Unavailable("FlashAttention-2 (aten) has no softcap")
    return (kind.left, kind.right)


def fa2_backward_prepare(G, ctx):
    """aten's varlen FA2 backward (backward_peers.prepare_fa2) after one forward, both with the
    cell's window."""
    def prepare(bc, kind, sinks):
        return bp.prepare_fa2(G, ctx, bc, kind.causal, window=fa2_window(G, kind, sinks))
    return prepare


def load_fa2(ctx):
    """aten's varlen FA2 forward and backward (backward_peers.load_fa2) into ctx as fa2_fwd,
    fa2_bwd and their _arguments, their schemas' text as fa2_schemas, or fa2_error."""
    got = {"schemas": {}}
    bp.load_fa2(got)  # its keys are all fa2_*, but for the schemas'
    ctx["fa2_schemas"] = got.pop("schemas")
    ctx.update(got)


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


def backward_record(name, bc, kind_name, run, sinks, flops):
    """The record of a method's backward on a cell of kind_name, before it is measured: its
    window, softcap and sinks those the method runs (run, sinks: method_run's)."""
    c = bc.case
    return {"method": name, "label": method_label(name, sinks), "pass": "backward",
            "workload": c.w.id, "base": c.w.spec.base, "dtype": c.dtype_name, "kind": kind_name,
            "causal": run.causal, "window": [run.left, run.right], "softcap": run.softcap,
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
    bp._poison(bc, prep, False)
    grads = bp.first_gradients(G, prep, rec)
    if grads is None:
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
    backward_peers.combine_rounds of its rounds) of a kind's backward on a case, each method
    running the kind as method_run says (jfa and FlexAttention with the kind's sinks and softcap,
    FA3 without sinks, a baseline without its modifier) and checked against the reference of
    what it runs (LocalBwdCase.use)."""
    kind, c = KINDS[kind_name], bc.case
    flops = pass_flops(c.lq, c.lk, kind, c.H, c.D, c.Dv, "backward")
    sinks = cell_sinks(torch, kind, c.H, c.device)

    def measure(m):
        run, with_sinks = method_run(kind, sinks, m)
        bc.use(run, with_sinks)
        rec = backward_record(m, bc, kind_name, run, with_sinks, flops)
        return bp.add_rates(measure_backward(G, bc, impls[m], run, with_sinks, rec, opts))

    methods = cell_methods(kind_name, impls)
    per_method = measure_rounds(methods, rounds, measure, report)
    return [bp.add_rates(bp.combine_rounds(per_method[m])) for m in methods]
