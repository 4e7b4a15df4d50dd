"""Llama family (Llama, Mistral, SmolLM2: `LlamaForCausalLM` / `MistralForCausalLM`).

The config mapping both ways and the declarative key map. Clover's block is a pre-norm Llama block
(RMSNorm, RoPE rotate-half, GQA, SwiGLU), so the map is a renaming; nothing is permuted here (GGUF
files are un-permuted by `clover.checkpoint.gguf_file` before they reach this map).
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
MODEL_TYPES = ("llama", "mistral")

KEYS: KeyMap = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attn_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.o_proj.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.ffn.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.ffn.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.ffn.down_proj.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,  # recomputed from rope_theta
}

def rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from either config style (transformers 5 `rope_parameters`, or `rope_theta`);
    scaled RoPE (YaRN, linear, llama3) is refused rather than computed wrongly."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported (only default)")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def check_plain_llama(hf: dict[str, Any], family: str = "Llama") -> None:
    """Refuse config fields that change the math in ways Clover does not implement."""
    if hf.get("mlp_bias"):
        raise CheckpointError(f"config.json: mlp_bias=true is not supported for {family}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: hidden_act={hf['hidden_act']!r} is not supported "
                              f"for {family} (silu only)")


def config_from_hf(hf: dict[str, Any], name: str = "llama") -> ModelConfig:
    """A causal Clover config with the same math as this Llama config.json."""
    check_plain_llama(hf)
    if hf.get("attention_bias"):
        raise CheckpointError("config.json: attention_bias=true is not supported for Llama")
    num_heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id", 0)
    eos = eos[0] if isinstance(eos, list) else eos
    pad = hf.get("pad_token_id")
    vocab = hf["vocab_size"]
    return ModelConfig(
        name=name, vocab_size=vocab, dim=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=num_heads, num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        rope_theta=rope_theta(hf), norm_eps=float(hf["rms_norm_eps"]),
        ffn_dim=hf["intermediate_size"], tie_embeddings=bool(hf.get("tie_word_embeddings")),
        attention="causal", block_size=1,
        max_seq_len=int(hf.get("max_position_embeddings", 4096)),
        eos_id=eos, pad_id=eos if pad is None else pad, mask_id=_spare_id(vocab, eos, pad))


def _spare_id(vocab: int, *used: int | None) -> int:
    """A causal model never reads its mask id; any id other than eos/pad satisfies the config."""
    return next(i for i in range(vocab) if i not in used)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `LlamaForCausalLM` with the same math (causal attention)."""
    if cfg.is_moe or cfg.qk_norm or cfg.qkv_bias or cfg.partial_rotary != 1.0 or cfg.token_conv:
        raise CheckpointError(f"{cfg.name}: not expressible as a Llama checkpoint "
                              "(MoE, QK-norm, QKV bias, partial RoPE or token conv)")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False,
        "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id, "torch_dtype": "float32",
    }
