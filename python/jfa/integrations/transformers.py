"""jfa as an attention implementation of HuggingFace transformers: ``attn_implementation="jfa"``.

    import jfa.integrations.transformers  # registers "jfa" (or call register())
    model = AutoModelForCausalLM.from_config(config, attn_implementation="jfa")

What reaches the attention function decides how the batch is cut into sequences:

- ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (with ``max_length_q`` / ``max_length_k``), the keyword
  arguments of transformers' flash-attention path: packed sequences along the flattened batch, no
  synchronization.
- a 2-D padding mask (a padded batch, left or right padding, also with a KV cache): the tokens the
  mask keeps are gathered, attended as sequences and scattered back; the rows of padding get zeros.
  Gathering reads the mask's token count on the host (as unpadding does in any implementation).
- ``position_ids`` without a cache (a packed row as ``DataCollatorWithFlattening`` makes: positions
  restart at 0 at each sequence): offsets from ``jfa.offsets_from_position_ids``, of a size fixed
  by the shape, no synchronization.
- otherwise every row of the batch is one sequence (with a KV cache: the row's queries are its
  last tokens, as jfa's bottom-right causal alignment has them).

Continuous batching (``model.generate_batch``, transformers' paged KV cache) needs no name of its
own: transformers 5.25 pages the call, not the attention function (the ``paged|`` prefix is
deprecated). The cache's ``update`` writes the step's keys into their pages and gathers each
sequence's keys back, packed, with ``cu_seq_lens_k`` (per layer type, a sliding layer getting only
its window): the first case above, so ``jfa.jagged_attention``. ``jfa.paged_attention`` reads pages
only where transformers hands a block table instead (its decode fast path, which it opens only for
flash-attention 2/3 on CUDA/XPU): the step's keys are appended to the pages and attended there.
``register()`` lets continuous batching keep "jfa" (5.25 accepts only "paged|eager", "sdpa" and
flash implementations by name). Batches it pads (CUDA graphs, compile; off by default for "jfa")
are not supported: jfa's offsets must end at the last row.

The module's ``scaling``, causal flag, ``sliding_window`` (a window of that many keys up to and
including the query's own, transformers' convention), ``softcap`` and attention sinks
(``s_aux``) are passed on; dropout must be 0 and ``output_attentions`` is not available. The head
sizes are those the backend takes (the CPU backend: 1 to 512; CUDA: see the README), others raise
``jfa.JfaUnsupportedError`` naming the size.
"""

from __future__ import annotations

import functools

import torch

from .. import jagged_attention, lengths_to_offsets, offsets_from_position_ids, paged_attention

NAME = "jfa"

__all__ = ["NAME", "register", "jfa_attention_forward"]


def _offsets_of_rows(rows: int, length: int, device) -> torch.Tensor:
    return torch.arange(rows + 1, dtype=torch.int32, device=device) * length


def _window(sliding_window, causal: bool):
    if sliding_window is None:
        return (-1, -1)
    left = int(sliding_window) - 1
    return (left, 0 if causal else left)


def jfa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          sliding_window=None, softcap=None, is_causal=None, s_aux=None,
                          **kwargs):
    """The attention function registered as "jfa": query ``[batch, heads_q, q_len, head_dim]``,
    key and value ``[batch, heads_kv, kv_len, ...]`` in; ``([batch, q_len, heads_q, head_dim_v],
    None)`` out, as transformers' other attention functions return."""
    if dropout:
        raise ValueError(f"attn_implementation='jfa' has no attention dropout (got {dropout}); "
                         "set the config's attention_dropout to 0")
    if kwargs.get("output_attentions", False):
        raise ValueError("attn_implementation='jfa' does not return attention weights "
                         "(output_attentions=True); use 'eager' for them")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    batch, heads_q, q_len, _ = query.shape
    kv_len = key.shape[2]
    # One row of tokens, [batch * len, heads, dim], as jfa takes them.
    q, k, v = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (query, key, value))
    options = dict(causal=causal, softmax_scale=None if scaling is None else float(scaling),
                   window_size=_window(sliding_window, causal),
                   softcap=float(softcap) if softcap else 0.0,
                   sinks=s_aux.float() if s_aux is not None else None)

    def attend(cu_q, cu_k, max_q=None, max_k=None):
        out = jagged_attention(q, k, v, cu_q, cu_k, max_q, max_k, **options)
        return out.view(batch, q_len, heads_q, -1), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if kwargs.get("block_table") is not None:
        out = _attend_cache_pages(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), kwargs,
                                  options)
        return out.view(batch, q_len, heads_q, -1), None
    if cu_q is not None and cu_k is not None:
        return attend(cu_q.to(torch.int32), cu_k.to(torch.int32), kwargs.get("max_length_q"),
                      kwargs.get("max_length_k"))

    if attention_mask is not None and attention_mask.dim() == 2:
        return _attend_padded(q, k, v, attention_mask, batch, q_len, options), None
    if attention_mask is not None:
        raise ValueError(f"attn_implementation='jfa' takes a 2-D padding mask, got one of shape "
                         f"{tuple(attention_mask.shape)}")

    position_ids = kwargs.get("position_ids")
    if position_ids is not None and q_len == kv_len:
        cu = offsets_from_position_ids(position_ids.expand(batch, -1))
        return attend(cu, cu)

    return attend(_offsets_of_rows(batch, q_len, q.device),
                  _offsets_of_rows(batch, kv_len, q.device), q_len, kv_len)


def _attend_padded(q, k, v, mask, batch, q_len, options):
    """Attention over the tokens a 2-D padding mask ``[batch, kv_len]`` keeps (its last q_len
    columns are the queries'), of q, k, v as rows of ``batch`` x their lengths, scattered back
    into ``[batch, q_len, heads, dim_v]`` with zeros at the padding."""
    kv_len = k.shape[0] // batch
    mask = mask[:, -kv_len:].to(torch.bool)
    q_mask = mask[:, -q_len:]
    keep_k = mask.reshape(-1).nonzero().squeeze(1)
    keep_q = q_mask.reshape(-1).nonzero().squeeze(1)
    out = jagged_attention(q[keep_q], k[keep_k], v[keep_k], lengths_to_offsets(q_mask.sum(1)),
                           lengths_to_offsets(mask.sum(1)), **options)
    full = out.new_zeros(batch * q_len, out.shape[1], out.shape[2]).index_copy(0, keep_q, out)
    return full.view(batch, q_len, out.shape[1], -1)


def _attend_cache_pages(q, k_new, v_new, cu_q, cu_k, kwargs, options):
    """Continuous batching's block-table call (as flash_attn_with_kvcache takes it): the layer's
    pages ``k_cache`` / ``v_cache`` and ``block_table`` instead of gathered keys, ``cu_seq_lens_k``
    counting the step's own keys. These are appended to the pages and attended with the cached ones.
    Its max_length hints are placeholders (1), so none is passed; the appended rows are read
    packed, so they are made contiguous (a no-op for a model's projections)."""
    cached = (cu_k.diff() - cu_q.diff()).to(torch.int32)
    return paged_attention(q, kwargs["k_cache"], kwargs["v_cache"], kwargs["block_table"], cached,
                           cu_q, k_new=k_new.contiguous(), v_new=v_new.contiguous(),
                           cu_seqlens_new=cu_q, **options)


def _let_continuous_batching_keep_jfa() -> None:
    """transformers 5.25's continuous batching refuses implementations other than "paged|eager",
    "sdpa" and flash by name, though it calls any of them with what jfa takes (packed keys and
    their offsets). Its switch to a batching implementation leaves a model on "jfa" as it is."""
    try:
        from transformers.generation.continuous_batching.continuous_api import \
            ContinuousBatchingManager as manager
    except ImportError:  # a transformers without continuous batching
        return
    switch = getattr(manager, "switch_to_cb_friendly_attn", None)
    if switch is None or getattr(switch, "keeps_jfa", False):
        return

    @functools.wraps(switch)
    def switch_unless_jfa(self, model, *args, **kwargs):
        if model.config._attn_implementation != NAME:
            switch(self, model, *args, **kwargs)

    switch_unless_jfa.keeps_jfa = True
    manager.switch_to_cb_friendly_attn = switch_unless_jfa


def register() -> None:
    """Registers "jfa" with transformers' AttentionInterface and, so that a padded batch brings its
    padding mask (2-D, or None without padding) instead of a dense 4-D one, with its
    AttentionMaskInterface; lets continuous batching run it. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, jfa_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    _let_continuous_batching_keep_jfa()


register()
