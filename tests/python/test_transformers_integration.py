"""jfa as transformers' attention implementation ("jfa", jfa.integrations.transformers) on the CPU
backend: small random-weight models (no weights downloaded) against the same weights with
transformers' own attention run on each sequence alone, in float32."""
import copy

import pytest

import jfa

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
if not jfa.torch_available():
    pytest.skip(f"jfa's torch path is unavailable: {jfa.torch_unavailable_reason()}",
                allow_module_level=True)

import jfa.integrations.transformers as jfa_transformers  # noqa: E402  (registers "jfa")

# Lengths 1, 16 +- 1 (a sliding window of 4 and a tile edge of the test's sizes) and others.
LENGTHS = [1, 7, 16, 17, 5, 15]
ATOL = 2e-5


def _llama():
    return transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=256)


def _qwen2():
    return transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, max_position_embeddings=256)


def _gemma2():
    # Softcap on the scores, a sliding window of 4 keys on every other layer, a scale of its own.
    return transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, sliding_window=4,
                                     attn_logit_softcapping=5.0, final_logit_softcapping=None,
                                     query_pre_attn_scalar=12, max_position_embeddings=256)


def _gpt_oss():
    # Attention sinks (one learned logit per query head), a sliding window of 4 keys on every other
    # layer, a small mixture of experts.
    return transformers.GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=4,
                                     max_position_embeddings=256)


def _deepseek_v3():
    # Multi-head latent attention: q and k of 24 columns (16 + 8 rotary), v of 12 (a value head
    # size of its own), experts after the first layer.
    return transformers.DeepseekV3Config(vocab_size=97, hidden_size=64, intermediate_size=96,
                                         moe_intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4,
                                         n_routed_experts=4, num_experts_per_tok=2,
                                         n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                         topk_group=1, kv_lora_rank=16, q_lora_rank=24,
                                         qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                                         max_position_embeddings=256)


CONFIGS = {"llama": (_llama, "sdpa"), "qwen2": (_qwen2, "sdpa"), "gemma2": (_gemma2, "eager"),
           "gpt_oss": (_gpt_oss, "eager"), "deepseek_v3": (_deepseek_v3, "sdpa")}


def _models(name, seed=0):
    """The model with attn_implementation="jfa" and the same weights with the reference one."""
    make, reference = CONFIGS[name]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(make()),
                                                          attn_implementation="jfa")
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(make()),
                                                        attn_implementation=reference)
    with torch.no_grad():
        for layer in model.model.layers:
            if name == "gemma2":  # scores well past the cap, so that the softcap shapes the softmax
                layer.self_attn.q_proj.weight.mul_(6.0)
                layer.self_attn.k_proj.weight.mul_(6.0)
            if name == "gpt_oss":  # sinks that take a visible share of each row's probability
                layer.self_attn.sinks.normal_(0.0, 2.0)
    ref.load_state_dict(model.state_dict())
    assert model.config._attn_implementation == "jfa"
    return model, ref


def _sequences(seed, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (n,), generator=g) for n in lengths]


def _packed(seqs):
    ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    return ids, positions


def _reference_logits(ref, seqs):
    return torch.cat([ref(input_ids=s[None]).logits[0] for s in seqs])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_batch_by_position_ids_matches_each_sequence_alone(name, seed):
    model, ref = _models(name, seed)
    seqs = _sequences(seed)
    ids, positions = _packed(seqs)
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=positions).logits[0]
        want = _reference_logits(ref, seqs)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)


def test_packed_batch_by_flash_keyword_arguments(seed):
    model, ref = _models("llama", seed)
    seqs = _sequences(seed)
    ids, positions = _packed(seqs)
    cu = jfa.lengths_to_offsets(torch.tensor([len(s) for s in seqs]))
    longest = max(len(s) for s in seqs)
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                    max_length_q=longest, max_length_k=longest).logits[0]
        want = _reference_logits(ref, seqs)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_step_gradients_match_each_sequence_alone(name, seed):
    """Logits and every parameter's gradient after one backward pass of a packed batch equal the
    reference's summed over the sequences run alone."""
    model, ref = _models(name, seed)
    model.train()
    ref.train()
    seqs = _sequences(seed)
    ids, positions = _packed(seqs)
    weights = torch.randn(ids.shape[1], 97, generator=torch.Generator().manual_seed(seed + 1))
    (model(input_ids=ids, position_ids=positions).logits[0] * weights).sum().backward()
    start = 0
    for s in seqs:
        (ref(input_ids=s[None]).logits[0] * weights[start:start + len(s)]).sum().backward()
        start += len(s)
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    for key, p in got.items():
        assert p.grad is not None, key
        torch.testing.assert_close(p.grad, want[key].grad, atol=1e-4, rtol=1e-3, msg=key)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_padded_batch_matches_the_packed_one(name, side, seed):
    """A padded batch with its attention mask: the logits of the real tokens equal each sequence
    run alone (the mask function registered with "jfa" brings the padding mask)."""
    model, ref = _models(name, seed)
    seqs = _sequences(seed)
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols] = s
        mask[i, cols] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        for i, s in enumerate(seqs):
            cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
            torch.testing.assert_close(logits[i, cols], ref(input_ids=s[None]).logits[0],
                                       atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_generate_matches_the_reference(name, seed):
    """Greedy generation with a KV cache (the prefill as a left-padded batch, then one query per
    row and step) gives the reference's tokens."""
    model, ref = _models(name, seed)
    seqs = _sequences(seed, [5, 9, 1])
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = s
        mask[i, width - len(s):] = 1
    args = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    got = model.generate(ids, **args)
    want = ref.generate(ids, **args)
    assert torch.equal(got, want)


def test_attention_dropout_is_refused(seed):
    config = _llama()
    config.attention_dropout = 0.1
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="jfa")
    model.train()
    ids, positions = _packed(_sequences(seed, [3, 4]))
    with pytest.raises(ValueError, match="no attention dropout"):
        model(input_ids=ids, position_ids=positions)


def test_register_is_idempotent():
    jfa_transformers.register()
    jfa_transformers.register()
    assert transformers.AttentionInterface._global_mapping["jfa"] is \
        jfa_transformers.jfa_attention_forward


def test_offsets_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    assert jfa.offsets_from_position_ids(pos).tolist() == [0, 3, 5, 6, 6, 6, 6]
    # Rows start sequences; a row need not start at 0, a jump starts one too.
    rows = torch.tensor([[5, 6, 7], [0, 1, 3]])
    assert jfa.offsets_from_position_ids(rows).tolist() == [0, 3, 5, 6, 6, 6, 6]
    assert jfa.offsets_from_position_ids(torch.tensor([0])).tolist() == [0, 1]
    assert jfa.offsets_from_position_ids(torch.zeros(0, dtype=torch.long)).tolist() == [0]
    with pytest.raises(TypeError, match="integer"):
        jfa.offsets_from_position_ids(torch.zeros(3))


def test_compiled_model_takes_new_lengths_without_recompiling(seed):
    """torch.compile(fullgraph=True) of a model with "jfa" as training runs it (no KV cache): no
    graph break, and packed batches of new lengths (new totals, new sequence counts) reuse the
    compiled graph."""
    model, _ = _models("llama", seed)
    model.eval()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    torch._dynamo.reset()
    for i, lengths in enumerate(([3, 5, 8], [2, 9, 1, 4, 1], [30])):
        ids, positions = _packed(_sequences(seed + i, lengths))
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=i > 0):
            got = compiled(input_ids=ids, position_ids=positions, use_cache=False).logits
            want = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
