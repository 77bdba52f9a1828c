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

The module's ``scaling``, causal flag, ``sliding_window`` (a window of that many keys up to and
including the query's own, transformers' convention), ``softcap`` and attention sinks
(``s_aux``) are passed on; dropout must be 0 and ``output_attentions`` is not available. The head
sizes are those the backend takes (the CPU backend: 1 to 512; CUDA: see the README), others raise
``jfa.JfaUnsupportedError`` naming the size.
"""

from __future__ import annotations

import torch

from .. import jagged_attention, lengths_to_offsets, offsets_from_position_ids

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


def register() -> None:
    """Registers "jfa" with transformers' AttentionInterface and, so that a padded batch brings its
    padding mask (2-D, or None without padding) instead of a dense 4-D one, with its
    AttentionMaskInterface. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, jfa_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
