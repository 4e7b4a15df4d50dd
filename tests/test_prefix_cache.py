"""Prefix caching: requests behind a shared prompt head reuse its keys and values and decode
exactly what the no-cache reference decodes; the cache keeps to its budget; `full` models skip
it."""

import pytest
import torch

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.engine.reference import reference_generate
from clover.model import build_model

HEAD = list(range(40, 40 + 70))  # a 70-token "system prompt": 4 whole chunks of 16
PROMPTS = [HEAD + [5, 6, 7], HEAD + list(range(120, 141)), HEAD + [9], HEAD[:20] + [11, 12]]


def _model(mode, **kw):
    cfg = get_preset("tiny", attention=mode, block_size=1 if mode == "causal" else 4, **kw)
    model = build_model(cfg, seed=0).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # confident, varied proposals from a random model
    return model


@pytest.mark.parametrize("mode,kw", [("causal", {}), ("block", {}),
                                     ("block", {"shift_logits": True}),
                                     ("causal", {"token_conv": 4})])
def test_requests_behind_a_cached_head_decode_as_the_reference(mode, kw):
    model = _model(mode, **kw)
    llm = LLM(model, device="cpu", max_batch_size=2)
    params = SamplingParams(max_tokens=12, tau=0.5, ignore_eos=True)
    first = llm.generate(PROMPTS[:1], params)  # computes the head and stores its chunks
    rest = llm.generate(PROMPTS[1:], params)  # two reuse 64 head tokens, one 16
    cache = llm.engine.prefix_cache
    assert cache.hit_tokens == 64 + 64 + 16
    for prompt, out in zip(PROMPTS, first + rest, strict=True):
        assert out.token_ids == reference_generate(model, prompt, params)
    fed = [o.stats.tokens_processed for o in rest]
    uncached = LLM(model, device="cpu", max_batch_size=2, prefix_cache_mb=0)
    fed_without = [o.stats.tokens_processed for o in uncached.generate(PROMPTS[1:], params)]
    assert [a - b for a, b in zip(fed_without, fed, strict=True)] == [64, 64, 16]
    assert uncached.engine.prefix_cache.hit_tokens == 0


def test_the_whole_prompt_is_never_taken_from_the_cache():
    """A prompt that is all cached chunks still feeds its last token: the first logits are real."""
    model = _model("causal")
    llm = LLM(model, device="cpu")
    params = SamplingParams(max_tokens=6)
    prompt = HEAD[:64]
    a = llm.generate([prompt], params)[0]
    b = llm.generate([prompt], params)[0]
    assert llm.engine.prefix_cache.hit_tokens == 48
    assert a.token_ids == b.token_ids == reference_generate(model, prompt, params)


def test_budget_is_kept_and_eviction_keeps_answers_exact():
    model = _model("block")
    cfg = model.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # k and v, fp32
    budget_mb = 5 * 16 * per_token / 2**20  # room for 5 chunks
    llm = LLM(model, device="cpu", prefix_cache_mb=budget_mb)
    params = SamplingParams(max_tokens=8, tau=0.5)
    others = [list(range(200 + 100 * i, 270 + 100 * i)) for i in range(3)]
    for prompt in [PROMPTS[0], *others, PROMPTS[1]]:
        out = llm.generate([prompt], params)[0]
        assert out.token_ids == reference_generate(model, prompt, params)
        assert llm.engine.prefix_cache.bytes <= budget_mb * 2**20
    assert len(llm.engine.prefix_cache.entries) == 5


def test_full_attention_models_are_not_cached():
    model = _model("full")
    llm = LLM(model, device="cpu")
    params = SamplingParams(max_tokens=8, tau=0.5)
    llm.generate(PROMPTS[:2], params)
    llm.generate(PROMPTS[:2], params)
    assert llm.engine.prefix_cache.hit_tokens == 0 and not llm.engine.prefix_cache.entries


def test_negative_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        LLM(_model("causal"), device="cpu", prefix_cache_mb=-1)
