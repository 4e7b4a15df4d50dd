"""`clover convert` against transformers' own classes on random tiny checkpoints built here.

Each family is saved with `save_pretrained` (hidden 64, 2-3 layers, vocab 300, every weight,
norm and bias randomised so a swapped or untransposed key shows), converted, and must give
transformers' logits within 1e-4 (fp32, causal) and the same greedy tokens through Clover's engine
as `generate(do_sample=False)`. Catches a wrong key, a missing bias or norm, a norm over the
wrong scope, experts stacked in the wrong order or a router that renormalises when it should not.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from clover.checkpoint import load_model
from clover.checkpoint.convert import convert
from clover.engine import LLM, SamplingParams

VOCAB = 300
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=256,
              eos_token_id=5, pad_token_id=0, tie_word_embeddings=False)
SPARE_ID = 1  # the lowest id that is neither eos nor pad: the converted config's mask_id
MOE = dict(num_experts=4, num_experts_per_tok=2)

# family -> (config class, model class, extra config fields)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_hidden_layers=2, rope_theta=500.0)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM",
                   dict(num_hidden_layers=2, tie_word_embeddings=True, num_key_value_heads=4)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2,
                                                            sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_hidden_layers=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_hidden_layers=2, head_dim=24)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_hidden_layers=3, head_dim=16, moe_intermediate_size=32,
                       norm_topk_prob=True, mlp_only_layers=[0], **MOE)),
    "qwen3_moe-unnormed": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                           dict(num_hidden_layers=2, moe_intermediate_size=32,
                                norm_topk_prob=False, **MOE)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_hidden_layers=2, norm_topk_prob=False, **MOE)),
}


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (norm weights around 1): init-time ones and zeros hide mistakes."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)
        # Clover's engine reserves the converted model's spare id (1 here: eos 5, pad 0) as its
        # mask sentinel and never emits it; a near-zero head row keeps greedy decoding off it.
        model.get_output_embeddings().weight[SPARE_ID] *= 0.01
    return model.eval()


def hf_model(family: str, seed: int = 0):
    config_cls, model_cls, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    torch.manual_seed(seed)
    return randomise(getattr(transformers, model_cls)(config), seed)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """family -> (transformers model, converted Clover directory), built once per module."""
    cache = {}

    def get(family: str):
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            ref = hf_model(family)
            ref.save_pretrained(root / "hf")
            cache[family] = ref, convert(root / "hf", root / "clover")
        return cache[family]
    return get


def ids(batch: int = 2, length: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(converted, family):
    """Converted weights give transformers' logits (fp32, causal) for every family."""
    ref, path = converted(family)
    ours = load_model(path)
    x = ids()
    with torch.no_grad():
        expected = ref(x).logits
        got = ours(x).logits
    assert expected.abs().max() > 1.0  # random weights: logits far from uniform
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_matches_generate(converted, family):
    """Clover's engine decodes the same greedy tokens as `generate(do_sample=False)`."""
    ref, path = converted(family)
    llm = LLM(load_model(path), device="cpu", dtype="float32")
    prompts = ids(batch=2, length=6, seed=3).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=12)
    outputs = llm.generate(prompts, params)
    assert llm.config.mask_id == SPARE_ID
    for prompt, out in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            full = ref.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                eos_token_id=5, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == full[:len(out.token_ids)] and len(out.token_ids) == len(full)
