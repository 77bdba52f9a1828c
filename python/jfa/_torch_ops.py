"""The torch path: the custom ops ``torch.ops.jfa.*`` over libjfa.

``jfa::jagged_attention_fwd`` and ``jfa::jagged_attention_bwd`` are implemented in C++
(libjfa_torch.so, PyTorch's stable ABI) and registered with the dispatcher for CPU and CUDA
tensors; where that library is missing, the same ops are defined in Python over ctypes
(jfa._torch_ctypes_op). Either way this module registers their fake (meta) kernels, so
``torch.compile(fullgraph=True)`` keeps them in the graph, and the forward's autograd formula,
which calls the backward op. On CUDA tensors both ops launch on the current CUDA stream, take their
workspace from torch's caching allocator and never read the offsets on the host, so a forward and
its backward can be captured in a CUDA graph and replayed after new lengths are written into the
same offsets buffer. Both ops take ``device_check``, the word of libjfa's checked mode (device
offsets, results that are not finite), which they write (in stream order, without waiting for it).

``jfa::paged_attention``, the forward over a paged KV cache (serving), is built and registered the
same way (native or ctypes, the fake kernel here); it has no backward: its autograd formula raises
when a gradient reaches it. It writes its caches when it appends (k_new, v_new), and its schema
marks them written, so torch.compile functionalizes the call (the append still lands in the caller's
caches, copied back at the end of the graph where inductor cannot write them in place).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch._library import autograd as _library_autograd  # see _torch_support.PRIVATE_API

from . import _checks, _torch_native
from ._torch_checks import (_tensor, check_backward_inputs, check_device_check, check_inputs,
                            check_paged_inputs, check_sinks)

KIND, KIND_DETAIL = _torch_native.load(torch)
if KIND == "ctypes":
    from . import _torch_ctypes_op

    _torch_ctypes_op.register()


def _forward_outputs(q, head_dim_v, return_lse):
    """The fake forwards' out [total_q, heads_q, head_dim_v] and lse [heads_q, total_q] (empty
    without return_lse)."""
    total_q, heads_q = q.shape[0], q.shape[1]
    out = q.new_empty((total_q, heads_q, head_dim_v))
    lse = q.new_empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("jfa::jagged_attention_fwd")
def _jagged_attention_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, return_lse, deterministic=False,
                               device_check=None, window_left=-1, window_right=-1, softcap=0.0,
                               sinks=None):
    check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_device_check(device_check, q.device)
    check_sinks(sinks, q.shape[1], q.device)
    return _forward_outputs(q, v.shape[2], return_lse)  # v's head_dim (head_dim_v)


@torch.library.register_fake("jfa::jagged_attention_bwd")
def _jagged_attention_bwd_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, causal, softmax_scale, grad_lse,
                               deterministic, device_check=None, window_left=-1, window_right=-1,
                               softcap=0.0, sinks=None):
    check_backward_inputs(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, grad_lse)
    check_device_check(device_check, q.device)
    check_sinks(sinks, q.shape[1], q.device)
    dsinks = q.new_empty((0 if sinks is None else q.shape[1],), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


@torch.library.register_fake("jfa::paged_attention")
def _paged_attention_fake(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                          max_seqlen_k, causal, softmax_scale, return_lse, device_check=None,
                          window_left=-1, window_right=-1, softcap=0.0, sinks=None, k_new=None,
                          v_new=None, cu_seqlens_new=None):
    check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, k_new, v_new,
                       cu_seqlens_new)
    check_device_check(device_check, q.device)
    check_sinks(sinks, q.shape[1], q.device)
    return _forward_outputs(q, v_cache.shape[3], return_lse)  # v_cache's head_dim (head_dim_v)


NEEDS_LSE_MESSAGE = (
    "jfa::jagged_attention_fwd was called with return_lse=False, so its gradient cannot be taken "
    "(the backward needs the LSE): call jfa.jagged_attention, or the op with return_lse=True")


# The defaults of the forward's arguments after return_lse (make_autograd_impl fills them back in
# where the dispatcher dropped them; this covers a torch that does not).
_FWD_DEFAULTS = (False, None, -1, -1, 0.0, None)


def _setup_context(ctx, inputs, output):
    inputs = tuple(inputs) + _FWD_DEFAULTS[len(inputs) - 10:]
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, deterministic, device_check,
     window_left, window_right, softcap, sinks) = inputs
    out, lse = output
    _save_for_backward(ctx, (q, k, v, out, lse, cu_q, cu_k, sinks), (max_q, max_k, causal, scale),
                       (window_left, window_right, softcap), deterministic, device_check)
    ctx.return_lse = return_lse


def _save_for_backward(ctx, tensors, args, local, deterministic, device_check):
    """What the backward op needs of a forward call, on its autograd node."""
    ctx.save_for_backward(*tensors)
    ctx.args = args
    ctx.local = local
    ctx.deterministic = deterministic
    # Kept as an attribute, not saved: a saved tensor that a later call writes (the same word for
    # every layer of a model) would fail autograd's version check.
    ctx.device_check = device_check
    # An output the loss does not use (most often the LSE) gets None, not a tensor of zeros that
    # would be allocated, filled and read by the backward.
    ctx.set_materialize_grads(False)


def _call_backward(ctx, grad_out, grad_lse):
    """dq, dk, dv, dsinks of the forward call saved on ctx (_save_for_backward); dsinks None
    without sinks.

    Without create_graph (grad mode off, not tracing) the op is called below the autograd and
    ADInplaceOrView layers, whose Python kernels would only pass the call on; the word's version
    is then bumped here. With create_graph the call goes through them, so that the gradients
    carry the formula that stops a double backward with a clear error."""
    q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    if grad_out is None:  # only the LSE is used
        grad_out = torch.zeros_like(out)
    args = (grad_out.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.args,
            None if grad_lse is None else grad_lse.contiguous(), ctx.deterministic,
            ctx.device_check, *ctx.local, sinks)
    if _grad_enabled() or _is_compiling():
        dq, dk, dv, dsinks = _BWD(*args)
    else:
        try:
            with _below_inplace_or_view():
                dq, dk, dv, dsinks = _BWD(*args)
        except RuntimeError as e:  # what the skipped ADInplaceOrView kernel does
            _raise_translated(e)
        if ctx.device_check is not None:
            _bump_version(ctx.device_check)
    return dq, dk, dv, (None if sinks is None else dsinks)


def _backward(ctx, grad_out, grad_lse):
    if not ctx.return_lse:
        raise RuntimeError(NEEDS_LSE_MESSAGE)
    dq, dk, dv, dsinks = _call_backward(ctx, grad_out, grad_lse)
    # One gradient per argument of the schema: q, k, v, ..., sinks (the 16th).
    return (dq, dk, dv) + (None,) * 12 + (dsinks,)


def _raise_translated(error: RuntimeError):
    """Raises the exception that a native op's tagged error stands for (the error itself when it
    carries no tag: those of the ctypes op are raised as they are)."""
    translated = _torch_native.translate(error)
    if translated is error:
        raise error
    raise translated from None


def _register_autograd(name: str, backward, setup_context, written=None) -> None:
    """torch.library.register_autograd for an op whose only written argument is device_check,
    with the version bump of the word that custom_op registers for a written argument.
    ``written(args)``, where given, names the tensors a call writes instead (those to bump).

    register_autograd refuses ops that write an argument, as a formula cannot know how a written
    tensor that needs a gradient changed; the word is int32 and never needs one, so the formula of
    the functional op holds. The bump skips a word left out (the dispatcher drops arguments equal
    to their default) or None.

    The ADInplaceOrView kernel also turns the tagged errors of the native op (C++ cannot raise a
    TypeError or a JfaError through the stable ABI) into the exceptions that the ctypes op raises,
    so a direct call of torch.ops.jfa.* raises the same ones whichever kind is in use; the try
    costs nothing when nothing is raised. Every call passes through that kernel, with or without
    autograd, but one under torch.inference_mode() whose tensors are all inference tensors."""
    op = getattr(torch.ops.jfa, name).default
    word = next(i for i, a in enumerate(op._schema.arguments) if a.name == "device_check")
    after_view = torch._C._after_ADInplaceOrView_keyset
    bump = torch.autograd.graph.increment_version
    if written is None:
        def written(args):
            return (args[word],) if len(args) > word and args[word] is not None else ()

    def ad_inplace_or_view(keyset, *args, **kwargs):
        tensors = written(args)
        if tensors:
            bump(tensors)
        try:
            return op.redispatch(keyset & after_view, *args, **kwargs)
        except RuntimeError as e:
            _raise_translated(e)

    info = _library_autograd.Info(backward, setup_context)
    _LIB.impl(name, _library_autograd.make_autograd_impl(op, info), "Autograd", with_keyset=True)
    _LIB.impl(name, ad_inplace_or_view, "ADInplaceOrView", with_keyset=True)


_LIB = torch.library.Library("jfa", "FRAGMENT")  # noqa: TOR901  (kept for the process)
_register_autograd("jagged_attention_fwd", _backward, _setup_context)

DOUBLE_BACKWARD_MESSAGE = (
    "jfa.jagged_attention: gradients of its gradients (a double backward, create_graph=True) are "
    "not implemented")


def _backward_of_backward(ctx, *grads):
    raise NotImplementedError(DOUBLE_BACKWARD_MESSAGE)


# Without a formula, autograd would treat the gradients as constants and give a wrong second
# derivative; with this one a double backward stops with a clear error.
_register_autograd("jagged_attention_bwd", _backward_of_backward,
                   lambda ctx, inputs, output: None)

PAGED_NO_BACKWARD_MESSAGE = (
    "jfa.paged_attention (torch.ops.jfa.paged_attention) is forward only (serving): it has no "
    "backward; call it under torch.no_grad() or torch.inference_mode(), or on inputs that do not "
    "require grad, or use jfa.jagged_attention on packed keys to train")


def _paged_backward(ctx, *grads):
    raise NotImplementedError(PAGED_NO_BACKWARD_MESSAGE)


_PAGED_ARGS = [a.name for a in torch.ops.jfa.paged_attention.default._schema.arguments]
_PAGED_WORD = _PAGED_ARGS.index("device_check")
_PAGED_K_NEW = _PAGED_ARGS.index("k_new")


def _paged_written(args):
    """The tensors a paged call writes: the word, and the caches when it appends (the dispatcher
    leaves out trailing arguments equal to their defaults, so a missing k_new is None)."""
    word = args[_PAGED_WORD] if len(args) > _PAGED_WORD else None
    caches = args[1:3] if len(args) > _PAGED_K_NEW and args[_PAGED_K_NEW] is not None else ()
    return tuple(caches) + (() if word is None else (word,))


# The formula raises at the backward, not the forward: a call with inputs that need a gradient
# (a model run without no_grad) works, and only a gradient that reaches it fails, with the reason.
_register_autograd("paged_attention", _paged_backward, lambda ctx, inputs, output: None,
                   _paged_written)

_FWD = torch.ops.jfa.jagged_attention_fwd.default
_BWD = torch.ops.jfa.jagged_attention_bwd.default
_PAGED = torch.ops.jfa.paged_attention.default
_below_inplace_or_view = torch._C._AutoDispatchBelowADInplaceOrView
_bump_version = torch.autograd.graph.increment_version
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _offsets_tensor(name: str, x, device) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)):
        return torch.tensor(x, dtype=torch.int32, device=device)
    raise TypeError(f"{name} must be an int32 torch.Tensor (or a list of ints), got {type(x).__name__}")


def _hint(name: str, value):
    """A max_seqlen hint as the op takes it. A SymInt (torch.compile with dynamic shapes) passes
    unchecked: comparing it would specialize the graph on its value; the kernel checks the int it
    gets at run time."""
    if type(value) is int or isinstance(value, torch.SymInt):
        return value
    return _checks.seqlen_hint(name, value)


def _sinks_tensor(sinks, device):
    """None, a tensor (checked by the op), or a list of floats as a float32 tensor on device."""
    if sinks is None or isinstance(sinks, Tensor):
        return sinks
    if isinstance(sinks, (list, tuple)):
        return torch.tensor(sinks, dtype=torch.float32, device=device)
    raise TypeError("sinks must be a float32 torch.Tensor [heads_q] (or a list of floats) or None, "
                    f"got {type(sinks).__name__}")


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
              softmax_scale, return_lse, deterministic=False, device_check=None,
              window_size=(-1, -1), softcap=0.0, sinks=None):
    """The torch face of jfa.jagged_attention (traceable by torch.compile).

    When no input needs a gradient the op is called below the autograd and ADInplaceOrView
    layers, which skips their Python kernels (the costliest part of a call's host time otherwise);
    the word's version is then bumped here."""
    cu_q = _offsets_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
    cu_k = cu_q if cu_seqlens_k is None else _offsets_tensor("cu_seqlens_k", cu_seqlens_k, q.device)
    scale = None if softmax_scale is None else _checks.scale_value(softmax_scale)
    return_lse = _checks.flag("return_lse", return_lse)
    deterministic = _checks.flag("deterministic", deterministic)
    check_device_check(device_check, q.device)
    window_left, window_right = _checks.window(window_size)
    sinks = _sinks_tensor(sinks, q.device)
    local = (window_left, window_right, _checks.softcap_value(softcap), sinks)
    args = (q, k, v, cu_q, cu_k, _hint("max_seqlen_q", max_seqlen_q),
            _hint("max_seqlen_k", max_seqlen_k), _checks.flag("causal", causal), scale)
    if _is_compiling():
        # Traced here, a rejection is raised as the exception itself; raised by the op's fake
        # kernel, torch would wrap it in its own TorchRuntimeError.
        check_inputs(q, k, v, cu_q, cu_k)
        check_sinks(sinks, q.shape[1], q.device)
    try:
        if _is_compiling():
            # Traced through the op's registered formula. The backward needs the LSE.
            out, lse = _FWD(*args, True, deterministic, device_check, *local)
        elif _needs_grad(q, k, v, sinks):
            result = _JaggedAttention.apply(q, k, v, sinks, args, local[:3], return_lse,
                                            deterministic, device_check)
            return result if return_lse else result[0]
        else:
            with _below_inplace_or_view():
                out, lse = _FWD(*args, return_lse, False, device_check, *local)
            if device_check is not None:
                _bump_version(device_check)  # what the skipped ADInplaceOrView kernel does
    except RuntimeError as e:  # the fast path skips the ADInplaceOrView kernel that translates
        _raise_translated(e)
    return (out, lse) if return_lse else out


def _needs_grad(*tensors) -> bool:
    return _grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _JaggedAttention(torch.autograd.Function):
    """attention() with a gradient, outside torch.compile: one autograd node whose forward and
    backward call the ops below the autograd and ADInplaceOrView layers. Through the op's
    registered formula the same step passes each op through those layers' Python kernels on top
    (about 0.1 ms of host time a step, measured on the CPU), which the GPU waits for on small
    batches. The gradients are the same: the same ops with the same arguments."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, args, local, return_lse, deterministic, device_check):
        try:
            with _below_inplace_or_view():
                out, lse = _FWD(*args, True, deterministic, device_check, *local, sinks)
        except RuntimeError as e:
            _raise_translated(e)
        if device_check is not None:
            _bump_version(device_check)  # what the skipped ADInplaceOrView kernel does
        _save_for_backward(ctx, (q, k, v, out, lse) + args[3:5] + (sinks,), args[5:], local,
                           deterministic, device_check)
        if not return_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        dq, dk, dv, dsinks = _call_backward(ctx, grad_out, grad_lse)
        return dq, dk, dv, dsinks, *(None,) * 5


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                    max_seqlen_k, causal, softmax_scale, return_lse, window_size=(-1, -1),
                    softcap=0.0, sinks=None, device_check=None, k_new=None, v_new=None,
                    cu_seqlens_new=None):
    """The torch face of jfa.paged_attention (traceable by torch.compile). As attention(), a call
    that needs no gradient skips the autograd and ADInplaceOrView layers, and bumps the versions
    of what it wrote (the word; the caches when it appends) here."""
    # TypeErrors naming the argument, not the dispatcher's.
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seqused_k", seqused_k)):
        _tensor(name, t)
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t is not None:
            _tensor(name, t)
    cu_q = _offsets_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
    cu_new = (None if cu_seqlens_new is None else
              _offsets_tensor("cu_seqlens_new", cu_seqlens_new, q.device))
    scale = None if softmax_scale is None else _checks.scale_value(softmax_scale)
    return_lse = _checks.flag("return_lse", return_lse)
    check_device_check(device_check, q.device)
    window_left, window_right = _checks.window(window_size)
    sinks = _sinks_tensor(sinks, q.device)
    args = (q, k_cache, v_cache, block_table, seqused_k, cu_q,
            _hint("max_seqlen_q", max_seqlen_q), _hint("max_seqlen_k", max_seqlen_k),
            _checks.flag("causal", causal), scale, return_lse, device_check, window_left,
            window_right, _checks.softcap_value(softcap), sinks, k_new, v_new, cu_new)
    if _is_compiling():
        # Raised here while tracing, as the exception itself (see attention()).
        check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k, cu_q, k_new, v_new,
                           cu_new)
        check_sinks(sinks, q.shape[1], q.device)
    try:
        if _is_compiling() or _needs_grad(q, k_cache, v_cache, k_new, v_new, sinks):
            out, lse = _PAGED(*args)
        else:
            with _below_inplace_or_view():
                out, lse = _PAGED(*args)
            written = _paged_written(args)
            if written:
                _bump_version(written)  # what the skipped ADInplaceOrView kernel does
    except RuntimeError as e:  # the fast path skips the ADInplaceOrView kernel that translates
        _raise_translated(e)
    return (out, lse) if return_lse else out
