"""MoE dLLM importers against transformers' Qwen3-MoE run bidirectionally or under a block mask.

LLaDA-MoE's math (per-head QK-norm, softmax top-k without renormalisation, bidirectional) is
Qwen3-MoE with `norm_topk_prob=False` and `is_causal=False`; SDAR-MoE is Qwen3-MoE under SDAR's
block mask. A random tiny `Qwen3MoeForCausalLM` is written in each family's published layout (one
key per expert, sharded + index, the family's config.json fields), converted, and must give the
same logits; import + export gives back the same bytes.
"""

import json

import pytest
import torch
from test_dllm_dense import bidirectional
from test_sdar import block_mask
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from clover.checkpoint import load_model
from clover.checkpoint.convert import convert, export_hf, read_hf_dir
from clover.checkpoint.hf_files import write_hf_dir
from clover.checkpoint.keymap import CheckpointError

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
            num_experts=8, num_experts_per_tok=3, rms_norm_eps=1e-5, rope_theta=50000.0,
            max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="eager")


def qwen3_moe(norm_topk_prob: bool, seed: int = 3):
    torch.manual_seed(seed)
    ref = Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, norm_topk_prob=norm_topk_prob)).eval()
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.2)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.2)
            layer.mlp.gate.weight.normal_(0, 0.5)  # decisive routing
    return ref


def per_expert(state: dict) -> dict:
    """transformers 5 keeps experts fused in memory; checkpoints on the Hub hold one key each."""
    out = {}
    for key, value in state.items():
        if key.endswith("experts.gate_up_proj"):
            prefix, F = key[: -len("gate_up_proj")], value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = value[e, :F].clone()
                out[f"{prefix}{e}.up_proj.weight"] = value[e, F:].clone()
        elif key.endswith("experts.down_proj"):
            prefix = key[: -len("down_proj")]
            out.update({f"{prefix}{e}.down_proj.weight": value[e].clone()
                        for e in range(value.shape[0])})
        else:
            out[key] = value.clone()
    return out


def llada_moe_config() -> dict:
    return {"architectures": ["LLaDAMoEModelLM"], "model_type": "lladamoe", "vocab_size": 300,
            "hidden_size": 64, "dense_intermediate_size": 96, "expert_intermediate_size": 32,
            "shared_expert_intermediate_size": None, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_act": "silu",
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
            "rope_scaling": None, "attention_bias": False, "clip_qkv": None,
            "qk_layernorm": True, "num_experts": 8, "num_experts_per_tok": 3,
            "moe_layer_freq": [1, 1], "moe_router_enable_expert_bias": False,
            "moe_router_score_function": "softmax", "norm_topk_prob": False,
            "tie_word_embeddings": False, "pad_token_id": 5, "eos_token_id": 5,
            "mask_token_id": 9, "use_cache": False}


@pytest.fixture(scope="module")
def llada_moe_source(tmp_path_factory):
    ref = bidirectional(qwen3_moe(norm_topk_prob=False))
    path = tmp_path_factory.mktemp("lladamoe")
    tensors = per_expert(ref.state_dict())
    return ref, write_hf_dir(path / "hf", llada_moe_config(), tensors, shards=3), tensors


def test_llada_moe_logits_match_bidirectional_qwen3_moe(llada_moe_source, tmp_path):
    """Catches renormalised top-k weights (LLaDA-MoE has none), a causal mask, a dropped QK-norm
    or experts stacked in the wrong order."""
    ref, src, _ = llada_moe_source
    model = load_model(convert(src, tmp_path / "clover"))
    cfg = model.config
    assert (cfg.attention, cfg.router, cfg.router_renorm, cfg.num_experts) == (
        "full", "softmax", False, 8)
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-4, rtol=0)


def test_llada_moe_round_trip_is_bit_exact(llada_moe_source, tmp_path):
    _, src, tensors = llada_moe_source
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back", family="lladamoe")
    exported_config, exported = read_hf_dir(back)
    assert exported_config["moe_layer_freq"] == [1, 1]
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)


def test_llada_moe_dense_first_layer_and_shared_expert_keys(llada_moe_source, tmp_path):
    """moe_layer_freq [0, 1] and a shared expert: the dense layer's `mlp.*_proj` and the
    layer-level `shared_expert.*` land in Clover's dense FFN and shared expert, and back."""
    _, _, tensors = llada_moe_source
    config = {**llada_moe_config(), "moe_layer_freq": [0, 1],
              "shared_expert_intermediate_size": 64}
    tensors = {k: v for k, v in tensors.items() if not k.startswith("model.layers.0.mlp.")}
    gen = torch.Generator().manual_seed(0)
    for name, shape in (("mlp.gate_proj", (96, 64)), ("mlp.up_proj", (96, 64)),
                        ("mlp.down_proj", (64, 96))):
        tensors[f"model.layers.0.{name}.weight"] = torch.randn(*shape, generator=gen)
    for name, shape in (("gate_proj", (64, 64)), ("up_proj", (64, 64)), ("down_proj", (64, 64))):
        tensors[f"model.layers.1.shared_expert.{name}.weight"] = torch.randn(*shape, generator=gen)
    src = write_hf_dir(tmp_path / "hf", config, tensors)
    dst = convert(src, tmp_path / "clover")
    model = load_model(dst)
    assert model.config.num_dense_layers == 1 and model.config.num_shared_experts == 2
    assert torch.equal(model.layers[1].ffn.shared.up_proj.weight,
                       tensors["model.layers.1.shared_expert.up_proj.weight"])
    _, exported = read_hf_dir(export_hf(dst, tmp_path / "back", family="lladamoe"))
    assert sorted(exported) == sorted(tensors)


def test_llada_moe_refuses_a_biased_softmax_router(llada_moe_source, tmp_path):
    _, _, tensors = llada_moe_source
    config = {**llada_moe_config(), "moe_router_enable_expert_bias": True}
    with pytest.raises(CheckpointError, match="moe_router_enable_expert_bias"):
        convert(write_hf_dir(tmp_path / "hf", config, tensors), tmp_path / "out")


def test_sdar_moe_logits_match_qwen3_moe_under_the_block_mask(tmp_path):
    ref = qwen3_moe(norm_topk_prob=True, seed=4)
    config = {**json.loads(ref.config.to_json_string()), "model_type": "sdar_moe",
              "architectures": ["SDARMoeForCausalLM"], "block_size": 4, "eos_token_id": 5,
              "pad_token_id": 5, "mask_token_id": 9}
    tensors = per_expert(ref.state_dict())
    src = write_hf_dir(tmp_path / "hf", config, tensors, shards=2)
    model = load_model(convert(src, tmp_path / "clover"))
    assert (model.config.attention, model.config.block_size, model.config.router_renorm) == (
        "block", 4, True)
    ids = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        want = ref(ids, attention_mask=block_mask(10, 4)).logits
        torch.testing.assert_close(model(ids).logits, want, atol=1e-4, rtol=0)
    _, exported = read_hf_dir(export_hf(tmp_path / "clover", tmp_path / "back",
                                        family="sdar_moe"))
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)
