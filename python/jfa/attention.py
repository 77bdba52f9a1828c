"""jfa.jagged_attention: one entry for numpy arrays and torch tensors."""

from __future__ import annotations

from ._torch_support import ops as _ops
from ._torch_support import torch as _torch

__all__ = ["jagged_attention", "attention_reference", "paged_attention"]


def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None, *, causal=False, softmax_scale=None, return_lse=False,
                     deterministic=False, device_check=None, window_size=(-1, -1), softcap=0.0,
                     sinks=None):
    """Exact softmax attention over packed variable-length sequences, differentiable in q, k, v and
    sinks (torch tensors).

    Follows ``flash_attn_varlen_func``: ``q`` is ``[total_q, heads_q, head_dim]``, ``k``
    ``[total_k, heads_kv, head_dim]`` and ``v`` ``[total_k, heads_kv, head_dim_v]`` (a value head
    size of its own, by default ``head_dim``) with ``heads_q`` a multiple of ``heads_kv`` (GQA/MQA),
    and ``cu_seqlens_q`` / ``cu_seqlens_k`` hold ``batch + 1`` int32 offsets (``cu_seqlens_k``
    defaults to ``cu_seqlens_q``).

    Args:
        q, k, v: torch tensors (CUDA -> the GPU kernel on the current stream; CPU -> the CPU
            backend; float16, bfloat16, float32 on CPU) or numpy arrays (float16, float32; CPU
            backend). The last dimension must be contiguous; other strides are passed through.
        cu_seqlens_q, cu_seqlens_k: int32 offsets on the device of q (numpy: int32 arrays or
            lists of ints).
        max_seqlen_q, max_seqlen_k: optional int hints of the longest sequence (None =
            unknown). They are never read from the offsets, so the call does not synchronize;
            under torch.compile with dynamic shapes they stay symbolic (a new value does not
            recompile).
        causal: bottom-right aligned causal mask: query i sees key j iff j <= i + len_k - len_q.
        softmax_scale: defaults to 1/sqrt(head_dim).
        return_lse: also return the float32 log-sum-exp ``[heads_q, total_q]`` (natural log;
            -inf for rows that see no key); differentiable too.
        deterministic: bit-identical gradients from run to run (torch autograd). The CPU backward
            always is.
        device_check: None, or a 1-element int32 tensor on q's device for the checked mode:
            the call (and its backward) checks cu_seqlens_q and cu_seqlens_k where it runs and
            stores 0 there when they are valid, else the OR of the rule bits they break; on CUDA
            its kernels add a bit (256) for results that are not finite (scores q.k beyond
            float32, NaN or infinite inputs, an LSE beyond float32, gradients that overflow).
            ``jfa.device_check_message`` says what a word reports. On CUDA the checks run in
            stream order and the call does not wait for them: read the word after a
            synchronization. The CPU backend checks the offsets on the host anyway (invalid ones
            raise), raises on scores it cannot hold, and stores 0.
        window_size: ``(left, right)`` local attention as in ``flash_attn_varlen_func``,
            bottom-right aligned: query i sees key j iff ``i + len_k - len_q - left <= j <= i +
            len_k - len_q + right``; -1 leaves a side unbounded. With ``causal`` the right bound
            is 0 whatever ``right`` is.
        softcap: 0 (off) or a cap c > 0: scores s (after the scale) become ``c * tanh(s / c)``
            before the softmax.
        sinks: None, or float32 ``[heads_q]`` logits that join each row's softmax denominator
            with no value (torch: a float32 tensor on q's device, differentiable; numpy: an
            array; either: a list of floats). The LSE includes them: a row that sees no key has
            out 0 and lse = its sink.

    Returns:
        ``out`` ``[total_q, heads_q, head_dim_v]`` of q's dtype, or ``(out, lse)``.

    Raises:
        TypeError / ValueError naming the argument for bad types, devices, shapes or strides;
        jfa.JfaError (a JfaInvalidArgumentError, also a ValueError, for invalid values) with the
        library's message when libjfa rejects the call.
    """
    if _torch is not None and isinstance(q, _torch.Tensor):
        if not (isinstance(k, _torch.Tensor) and isinstance(v, _torch.Tensor)):
            raise TypeError("q, k and v must all be torch tensors or all numpy arrays, got "
                            f"q {type(q).__name__}, k {type(k).__name__}, v {type(v).__name__}")
        return _ops.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal, softmax_scale, return_lse, deterministic, device_check,
                              window_size, softcap, sinks)
    if _torch is not None and (isinstance(k, _torch.Tensor) or isinstance(v, _torch.Tensor)):
        raise TypeError("q, k and v must all be torch tensors or all numpy arrays, got "
                        f"q {type(q).__name__}, k {type(k).__name__}, v {type(v).__name__}")
    if _is_foreign_tensor(q):
        raise TypeError(f"q is a {type(q).__module__}.{type(q).__name__} but torch support is not "
                        f"available: {_unavailable_reason()}")
    from . import _checks, _numpy_backend

    _checks.flag("deterministic", deterministic)  # no gradients for numpy arrays
    if device_check is not None:  # host offsets are checked before every call
        raise TypeError("device_check is for torch tensors (device offsets); numpy calls check "
                        f"their offsets on the host, got {type(device_check).__name__}")
    return _numpy_backend.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, causal, softmax_scale, return_lse, window_size,
                                    softcap, sinks)


def attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k=None, *, causal=False,
                        softmax_scale=None, q_tokens=None, return_lse=False,
                        window_size=(-1, -1), softcap=0.0, sinks=None):
    """libjfa's float64 reference over numpy arrays (float16/float32 inputs).

    Returns ``out`` float64 ``[n, heads_q, head_dim_v]`` for the query tokens in ``q_tokens`` (all
    when None), and ``lse`` float64 ``[heads_q, n]`` when ``return_lse``.
    """
    if any(_is_foreign_tensor(x) for x in (q, k, v)):
        raise TypeError("attention_reference takes numpy arrays; pass t.cpu().numpy() for a "
                        "torch tensor t (float16 or float32)")
    from . import _numpy_backend

    return _numpy_backend.attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                              softmax_scale=softmax_scale, q_tokens=q_tokens,
                                              return_lse=return_lse, window_size=window_size,
                                              softcap=softcap, sinks=sinks)


def _is_foreign_tensor(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _unavailable_reason() -> str:
    from . import _torch_support

    return _torch_support.unavailable_reason


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q, *,
                    max_seqlen_q=None, max_seqlen_k=None, causal=False, softmax_scale=None,
                    return_lse=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                    reference=False, q_tokens=None, k_new=None, v_new=None,
                    cu_seqlens_new=None, device_check=None):
    """Attention of packed queries over a paged KV cache (serving: decode, speculative decode,
    chunked prefill), torch tensors or numpy arrays. Forward only: no gradients.

    Args:
        q: ``[total_q, heads_q, head_dim]``, packed by ``cu_seqlens_q``. torch: float16,
            bfloat16 or float32 (CUDA -> the GPU backend on the current stream; CPU -> the CPU
            backend), the last dimension contiguous; numpy: float16 or float32 (CPU backend).
        k_cache, v_cache: ``[num_pages, page_size, heads_kv, head_dim]`` (v: its own head_dim),
            contiguous, q's dtype and device (a strided view is refused, not copied: an append
            must land in the caller's cache).
        block_table: int32 ``[batch, max_pages_per_seq]``: each sequence's pages in order (shuffled
            or shared pages are fine; only the entries of pages that hold keys are read).
        seqused_k: int32 ``[batch]``: each sequence's cache length, its len_k.
        cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, softmax_scale, return_lse, window_size,
            softcap, sinks: as for :func:`jagged_attention` (the causal mask and windows aligned
            bottom-right with len_k = seqused_k, plus the appended rows). torch: block_table,
            seqused_k and the offsets on q's device (the offsets may be lists of ints); nothing is
            read on the host, so a call on CUDA tensors does not synchronize. The CUDA kernels plan
            their launch from max_seqlen_q, which they need.
        reference: compute libjfa's float64 reference instead (rows ``q_tokens``, all when None);
            numpy arrays only (pass ``t.cpu().numpy()`` for a float16/float32 tensor t).
        k_new, v_new, cu_seqlens_new: an append (one call per decode or prefill step): the step's
            new keys ``[total_new, heads_kv, head_dim]`` and values, packed by ``cu_seqlens_new``,
            written into each sequence's pages after its ``seqused_k`` rows (the caches change in
            place; ``seqused_k`` does not) and attended over with them. The reference writes
            nothing. A call rejected for its arguments writes nothing.
        device_check: torch only: None, or the 1-element int32 word of the checked mode on q's
            device, as for :func:`jagged_attention` (on CUDA the call checks cu_seqlens_q,
            seqused_k and the block table where it runs; the CPU backend checks them on the host
            and stores 0).

    With torch tensors the call is ``torch.ops.jfa.paged_attention``, whose schema marks k_cache
    and v_cache written; ``torch.compile(fullgraph=True)`` keeps it in the graph. On CUDA tensors
    (Hopper) the paged kernels take decode, speculative decode and chunked prefill: at most 4096
    query tokens a sequence, max_seqlen_q given, float16/bfloat16, head_dim 64, 128 or 256 (the
    same for v); with the append; the rest raises jfa.JfaUnsupportedError (the CPU backend takes
    every call). On CUDA an invalid block table entry, cache length or append
    offset is not an error but a bit of ``device_check`` (the results unspecified).

    Returns ``out`` ``[total_q, heads_q, head_dim_v]`` of q's dtype (float64 with ``reference``),
    or ``(out, lse)`` (lse float32 ``[heads_q, total_q]``). Raises TypeError/ValueError for bad
    arguments and jfa.JfaError (with the library's message: a block table entry outside
    [0, num_pages), a cache length past the table, ...) when libjfa rejects the call. A gradient
    that reaches the result of a torch call raises NotImplementedError.
    """
    if _torch is not None and isinstance(q, _torch.Tensor):
        if not (isinstance(k_cache, _torch.Tensor) and isinstance(v_cache, _torch.Tensor)):
            raise TypeError("q, k_cache and v_cache must all be torch tensors or all numpy arrays, "
                            f"got q {type(q).__name__}, k_cache {type(k_cache).__name__}, "
                            f"v_cache {type(v_cache).__name__}")
        if reference or q_tokens is not None:
            raise TypeError("paged_attention(reference=True) and q_tokens take numpy arrays; pass "
                            "t.cpu().numpy() for a torch tensor t (float16 or float32)")
        return _ops.paged_attention(q, k_cache, v_cache, block_table, seqused_k, cu_seqlens_q,
                                    max_seqlen_q, max_seqlen_k, causal, softmax_scale, return_lse,
                                    window_size, softcap, sinks, device_check, k_new, v_new,
                                    cu_seqlens_new)
    if _torch is not None and (isinstance(k_cache, _torch.Tensor)
                               or isinstance(v_cache, _torch.Tensor)):
        raise TypeError("q, k_cache and v_cache must all be torch tensors or all numpy arrays, got "
                        f"q {type(q).__name__}, k_cache {type(k_cache).__name__}, "
                        f"v_cache {type(v_cache).__name__}")
    if _is_foreign_tensor(q):
        raise TypeError(f"q is a {type(q).__module__}.{type(q).__name__} but torch support is not "
                        f"available: {_unavailable_reason()}")
    if device_check is not None:  # host offsets and tables are checked before every call
        raise TypeError("device_check is for torch tensors; numpy calls check their offsets and "
                        f"block table on the host, got {type(device_check).__name__}")
    from . import _numpy_backend
    # The reference takes no length hints (as attention_reference).
    hints = (None, None) if reference else (max_seqlen_q, max_seqlen_k)
    return _numpy_backend.paged_attention(q, k_cache, v_cache, block_table, seqused_k,
                                          cu_seqlens_q, *hints, causal, softmax_scale, return_lse,
                                          window_size, softcap, sinks, q_tokens, reference, k_new,
                                          v_new, cu_seqlens_new)
