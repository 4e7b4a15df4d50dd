"""`clover convert` against transformers' own classes on random tiny checkpoints built here.

Each family is saved with `save_pretrained` (hidden 64, 2-3 layers, vocab 300, every weight,
norm and bias randomised so a swapped or untransposed key shows), converted, and must give
transformers' logits within 1e-4 (fp32, causal) and the same greedy tokens through Clover's engine
as `generate(do_sample=False)`. Catches a wrong key, a missing bias or norm, a norm over the
wrong scope, experts stacked in the wrong order or a router that renormalises when it should not.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from clover.checkpoint import load_model, read_state
from clover.checkpoint.convert import convert, export_hf, to_clover
from clover.checkpoint.keymap import CheckpointError
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


EXPORTABLE = ["llama", "llama-tied", "qwen2", "qwen3", "qwen3_moe", "olmoe"]


@pytest.mark.parametrize("family", EXPORTABLE)
def test_round_trip_gives_identical_tensors(converted, family, tmp_path):
    """HF -> Clover -> HF (`--to hf`) writes back exactly the tensors save_pretrained wrote."""
    _, path = converted(family)
    hf_dir = path.parent / "hf"
    back = export_hf(path, tmp_path / "back")
    original, exported = load_file(str(hf_dir / "model.safetensors")), load_file(
        str(back / "model.safetensors"))
    assert exported.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key


@pytest.mark.parametrize("family", EXPORTABLE)
def test_export_loads_in_transformers_with_equal_logits(converted, family, tmp_path):
    """The exported directory is an ordinary HF checkpoint: AutoModelForCausalLM loads it (the
    family read from its config.json) and computes the same logits."""
    ref, path = converted(family)
    back = export_hf(path, tmp_path / "back")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.float32)
    assert type(loaded) is type(ref)
    x = ids(seed=5)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x).logits, ref(x).logits, atol=1e-5, rtol=0)


def test_fused_expert_layout_converts_like_per_expert_keys(converted):
    """transformers >= 5 holds experts fused (`gate_up_proj` [E, 2F, D], `down_proj`); a state
    dict in that layout converts to the same Clover tensors as the per-expert files."""
    ref, path = converted("qwen3_moe")
    fused = ref.state_dict()
    assert "model.layers.1.mlp.experts.gate_up_proj" in fused
    config, state = to_clover(json.loads((path.parent / "hf" / "config.json").read_text()),
                              fused, name="fused", where="memory")
    stored = read_state(path)
    assert state.keys() == stored.keys()
    for key in stored:
        assert torch.equal(state[key], stored[key]), key


def _hf_parts(family: str, converted):
    _, path = converted(family)
    hf = path.parent / "hf"
    return json.loads((hf / "config.json").read_text()), load_file(str(hf / "model.safetensors"))


def test_unknown_key_is_named(converted):
    config, tensors = _hf_parts("qwen2", converted)
    tensors["model.layers.0.self_attn.q_proj.lora_A"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=r"unknown key 'model\.layers\.0\.self_attn\.q_proj"
                                              r"\.lora_A'"):
        to_clover(config, tensors, name="x", where="hf")


def test_missing_key_is_named(converted):
    config, tensors = _hf_parts("qwen2", converted)
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(CheckpointError, match=r"missing key for 'layers\.1\.attn\.k_proj\.bias'"):
        to_clover(config, tensors, name="x", where="hf")


def test_missing_expert_is_named(converted):
    config, tensors = _hf_parts("olmoe", converted)
    del tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"layers\.1\.ffn\.experts\.up_proj\[2\]"):
        to_clover(config, tensors, name="x", where="hf")


def test_key_for_a_layer_the_config_lacks_is_refused(converted):
    """A dense FFN key in a layer that the config makes MoE is unexpected, not silently kept."""
    config, tensors = _hf_parts("olmoe", converted)
    tensors["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(96, 64)
    with pytest.raises(CheckpointError, match=r"unexpected key 'model\.layers\.0\.mlp\.gate_proj"):
        to_clover(config, tensors, name="x", where="hf")


def test_wrong_shape_is_named(converted):
    config, tensors = _hf_parts("llama", converted)
    tensors["model.norm.weight"] = torch.ones(65)
    with pytest.raises(CheckpointError, match=r"'norm\.weight' has shape \(65,\)"):
        to_clover(config, tensors, name="x", where="hf")


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"mlp_only_layers": [1]}, "dense layers first"),
])
def test_unsupported_config_is_refused(converted, change, message):
    config, tensors = _hf_parts("qwen3_moe", converted)
    with pytest.raises(CheckpointError, match=message):
        to_clover({**config, **change}, tensors, name="x", where="hf")


def test_export_refuses_a_family_that_cannot_express_the_model(converted, tmp_path):
    _, path = converted("olmoe")
    with pytest.raises(CheckpointError, match="not expressible as a Qwen3-MoE checkpoint"):
        export_hf(path, tmp_path / "x", family="qwen3_moe")
