"""jfa in transformers' continuous batching (``model.generate_batch``, its paged KV cache) on the
CPU backend: small random-weight models generating greedily, against transformers' own paged
implementation with the same weights (eager attention without a cache where that one drops the
model's softcap), and single attention calls against transformers' paged eager attention."""
import copy
import inspect
import types

import pytest

import jfa

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
continuous_api = pytest.importorskip("transformers.generation.continuous_batching.continuous_api",
                                     reason="this transformers has no continuous batching")
if not jfa.torch_available():
    pytest.skip(f"jfa's torch path is unavailable: {jfa.torch_unavailable_reason()}",
                allow_module_level=True)

import jfa.integrations.transformers as jfa_transformers  # noqa: E402  (registers "jfa")
from test_transformers_integration import _gemma2, _gpt_oss, _llama, _models  # noqa: E402

# Prompts of 1 token, under a page, over a page (16 tokens) and over two. Batches of at most 24
# tokens split the longer prefills into chunks whose queries follow keys of theirs already cached.
PROMPT_LENGTHS = [1, 7, 40, 17, 17]
NEW_TOKENS = 6
BATCHING = dict(page_size=16, num_blocks=32, max_batch_tokens=24, return_logprobs=True)
if "page_size" not in inspect.signature(getattr(transformers, "ContinuousBatchingConfig",
                                                lambda: None)).parameters:
    pytest.skip(f"written against transformers 5.25's ContinuousBatchingConfig(page_size=...); "
                f"transformers {transformers.__version__} has another API",
                allow_module_level=True)


def _mistral():
    # A sliding window of 6 keys on every layer: the cache keeps a ring of 6 per sequence.
    return transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, sliding_window=6,
                                      max_position_embeddings=256)


def _gemma2_without_softcap():
    # Sliding (4 keys) and full layers alternate: a cache group of each.
    config = _gemma2()
    config.attn_logit_softcapping = None
    return config


def _prompts(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _generate_batch(model, prompts):
    """Greedy generate_batch: each request's tokens and their log-probabilities, in prompt order."""
    config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False,
                                           eos_token_id=-1, pad_token_id=0)
    out = model.generate_batch(prompts, generation_config=config,
                               continuous_batching_config=transformers.ContinuousBatchingConfig(
                                   **BATCHING))
    results = [out[key] for key in sorted(out, key=lambda key: int(key.split("_")[-1]))]
    assert [r.error for r in results] == [None] * len(prompts)
    assert [r.prompt_ids for r in results] == prompts
    return [r.generated_tokens for r in results], torch.tensor([r.logprobs for r in results])


@pytest.mark.parametrize("make", [_llama, _mistral, _gemma2_without_softcap, _gpt_oss],
                         ids=["llama", "mistral", "gemma2", "gpt_oss"])
def test_generate_batch_matches_transformers_paged_eager(make, seed):
    """GQA, a sliding window on all or every other layer (a cache group each), sinks."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(make()),
                                                          attn_implementation="eager")
    if hasattr(model.model.layers[0].self_attn, "sinks"):
        with torch.no_grad():  # sinks that take a visible share of each row's probability
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    prompts = _prompts(seed)
    want_tokens, want_logprobs = _generate_batch(model, prompts)  # switched to "paged|eager"
    model.set_attn_implementation("jfa")
    got_tokens, got_logprobs = _generate_batch(model, prompts)
    assert model.config._attn_implementation == "jfa"
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_logprobs, want_logprobs, atol=1e-4, rtol=1e-4)


def test_generate_batch_with_softcap_matches_eager(seed):
    """Gemma 2's softcap, which transformers' paged implementations drop: the tokens jfa generates
    in continuous batching are the greedy ones of eager attention run over the prompt and them
    without a cache, and so are their log-probabilities. (Not against ``generate``: with this
    sliding window of 4, transformers' own generate drifts from its full forward, eager or jfa.)"""
    model, ref = _models("gemma2", seed)  # "jfa" and "eager", the same weights
    prompts = _prompts(seed)
    got_tokens, got_logprobs = _generate_batch(model, prompts)
    for prompt, tokens, logprobs in zip(prompts, got_tokens, got_logprobs):
        with torch.no_grad():
            steps = ref(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
        want = steps.log_softmax(-1)
        assert want.argmax(-1).tolist() == tokens
        torch.testing.assert_close(logprobs, want[torch.arange(NEW_TOKENS), tokens], atol=1e-4,
                                   rtol=1e-4)


def _step(seed, heads_q=4, heads_kv=2, head_dim=16):
    """One continuous-batching call as the paged cache hands it over: queries of several requests
    packed in one row, and each request's cached and new keys gathered after them."""
    past_and_new = [(0, 1), (5, 3), (20, 1), (9, 9)]
    g = torch.Generator().manual_seed(seed)
    cu_q = jfa.lengths_to_offsets(torch.tensor([new for _, new in past_and_new]))
    cu_k = jfa.lengths_to_offsets(torch.tensor([past + new for past, new in past_and_new]))
    query = torch.randn(1, heads_q, int(cu_q[-1]), head_dim, generator=g)
    key, value = (torch.randn(1, heads_kv, int(cu_k[-1]), head_dim, generator=g) for _ in "kv")
    return query, key, value, cu_q, cu_k


@pytest.mark.parametrize("window", [None, 4])
def test_one_step_matches_paged_eager(window, seed):
    """One call of requests with and without cached keys (GQA, sinks, a window or none) against
    transformers' paged eager attention and the block-diagonal mask continuous batching builds."""
    from transformers.generation.continuous_batching.utils import build_attention_mask
    from transformers.integrations.eager_paged import eager_paged_attention_forward

    query, key, value, cu_q, cu_k = _step(seed)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(seed))
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, sinks=sinks)
    mask = torch.full((1, 1, query.shape[2], key.shape[2]), torch.finfo(torch.float32).min)
    build_attention_mask(mask, cu_q.tolist(), cu_k.tolist(), sliding_window=window or 1)
    want, _ = eager_paged_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, weights = jfa_transformers.jfa_attention_forward(
        module, query, key, value, None, scaling=0.3, sliding_window=window, is_causal=True,
        s_aux=sinks, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k,
        max_length_q=int(cu_q.diff().max()), max_length_k=int(cu_k.diff().max()))
    assert weights is None
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_block_table_call_appends_to_the_pages(seed):
    """The block-table call (continuous batching's decode fast path, as flash_attn_with_kvcache
    takes it): the step's keys land in each request's pages after its cached ones, and the output
    is the gathered call's."""
    query, key, value, cu_q, cu_k = _step(seed)
    page_size, pages = 4, 16
    new = cu_q.diff()
    cached = cu_k.diff() - new
    table = torch.full((len(new), 8), -1, dtype=torch.int32)
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist()
    k_cache, v_cache = (torch.zeros(pages, page_size, 2, 16) for _ in "kv")
    k_rows, v_rows = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [total_k, heads_kv, dim]
    for i, start in enumerate(cu_k[:-1].tolist()):
        used = -(-int(cu_k[i + 1] - start) // page_size)
        table[i, :used] = torch.tensor([order.pop() for _ in range(used)])
        for pos in range(int(cached[i])):  # the cached keys; the step's are the call's to write
            page, slot = table[i, pos // page_size], pos % page_size
            k_cache[page, slot], v_cache[page, slot] = k_rows[start + pos], v_rows[start + pos]
    step_rows = torch.cat([torch.arange(int(s) + int(c), int(e)) for s, c, e in
                           zip(cu_k[:-1], cached, cu_k[1:])])
    options = dict(scaling=0.3, sliding_window=4, is_causal=True, cu_seq_lens_q=cu_q,
                   cu_seq_lens_k=cu_k)
    got, _ = jfa_transformers.jfa_attention_forward(
        None, query, key[:, :, step_rows], value[:, :, step_rows], None, max_length_q=1,
        max_length_k=1, block_table=table, k_cache=k_cache, v_cache=v_cache, **options)
    want, _ = jfa_transformers.jfa_attention_forward(None, query, key, value, None, **options)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    for i, start in enumerate(cu_k[:-1].tolist()):
        for pos in range(int(cu_k[i + 1]) - start):
            page, slot = table[i, pos // page_size], pos % page_size
            assert torch.equal(k_cache[page, slot], k_rows[start + pos])
            assert torch.equal(v_cache[page, slot], v_rows[start + pos])


def test_register_lets_continuous_batching_keep_jfa_once():
    jfa_transformers.register()
    jfa_transformers.register()
    switch = continuous_api.ContinuousBatchingManager.switch_to_cb_friendly_attn
    assert switch.keeps_jfa
    assert not getattr(switch.__wrapped__, "keeps_jfa", False)  # wrapped once, however many calls
