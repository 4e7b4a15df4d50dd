"""LLaDA-8B (`model_type: llada`, `LLaDAModelLM`): GSAI-ML's OLMo-derived dense dLLM layout.

Its block is a Llama block under other names (`model.transformer.blocks.N.*`: `attn_norm`,
`q/k/v_proj`, `attn_out`, `ff_norm`, `ff_proj` = gate, `up_proj`, `ff_out` = down; `wte`, `ln_f`,
untied output `model.transformer.ff_out`), with bidirectional attention and own-token prediction
(position i's logits predict position i). The mapping is a renaming; config fields that change the
math in ways Clover does not implement (ALiBi, LayerNorm, QK-norm, biases, logit scaling) are
refused with a CheckpointError rather than converted wrongly.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("LLaDAModelLM",)
MODEL_TYPES = ("llada",)
DEFAULT_BLOCK = 32  # LLaDA's semi-autoregressive generate() uses block_length 32

KEYS: KeyMap = {
    "model.transformer.wte.weight": "embed.weight",
    "model.transformer.blocks.{}.attn_norm.weight": "layers.{}.attn_norm.weight",
    "model.transformer.blocks.{}.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.transformer.blocks.{}.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.transformer.blocks.{}.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.transformer.blocks.{}.attn_out.weight": "layers.{}.attn.o_proj.weight",
    "model.transformer.blocks.{}.ff_norm.weight": "layers.{}.ffn_norm.weight",
    "model.transformer.blocks.{}.ff_proj.weight": "layers.{}.ffn.gate_proj.weight",
    "model.transformer.blocks.{}.up_proj.weight": "layers.{}.ffn.up_proj.weight",
    "model.transformer.blocks.{}.ff_out.weight": "layers.{}.ffn.down_proj.weight",
    "model.transformer.ln_f.weight": "norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}

# field: the only value Clover implements (None: the field must be false/absent)
_REQUIRED = {
    "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "rope": True,
    "alibi": None, "attention_layer_norm": None, "include_bias": None, "include_qkv_bias": None,
    "input_emb_norm": None, "scale_logits": None, "bias_for_layer_norm": None,
}


def first_id(value: Any, default: int) -> int:
    """A token id from a config field that may hold an id, a list of ids or null."""
    if isinstance(value, list):
        value = value[0] if value else None
    return default if value is None else int(value)


def _check(hf: dict[str, Any]) -> None:
    for field, want in _REQUIRED.items():
        got = hf.get(field)
        if (want is None and got) or (want is not None and got is not None and got != want):
            raise CheckpointError(f"config.json: {field}={got!r} is not supported for LLaDA "
                                  f"(Clover implements {want if want is not None else 'false'})")
    if hf.get("layer_norm_with_affine") is False:
        raise CheckpointError("config.json: layer_norm_with_affine=false is not supported")


def config_from_hf(hf: dict[str, Any], name: str = "llada") -> ModelConfig:
    """A bidirectional (`full`) Clover config with LLaDA-8B's math."""
    _check(hf)
    heads = hf["n_heads"]
    kv_heads = 1 if hf.get("multi_query_attention") else (hf.get("n_kv_heads") or heads)
    eos = first_id(hf.get("eos_token_id"), 126081)
    return ModelConfig(
        name=name, vocab_size=hf.get("embedding_size") or hf["vocab_size"], dim=hf["d_model"],
        num_layers=hf["n_layers"], num_heads=heads, num_kv_heads=kv_heads,
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        ffn_dim=hf.get("mlp_hidden_size") or hf.get("mlp_ratio", 4) * hf["d_model"],
        tie_embeddings=bool(hf.get("weight_tying")), attention="full", block_size=DEFAULT_BLOCK,
        max_seq_len=int(hf.get("max_sequence_length", 4096)),
        eos_id=eos, pad_id=first_id(hf.get("pad_token_id"), eos),
        mask_id=first_id(hf.get("mask_token_id"), 126336))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """LLaDA's config.json for a dense, bidirectional, own-token Clover config."""
    if (cfg.is_moe or cfg.qk_norm or cfg.qkv_bias or cfg.partial_rotary != 1.0 or cfg.token_conv
            or cfg.shift_logits or cfg.attention != "full"
            or cfg.head_dim * cfg.num_heads != cfg.dim):
        raise CheckpointError(f"{cfg.name}: not expressible as a LLaDA checkpoint (needs dense, "
                              "full attention, no shift, no QK-norm/bias/partial RoPE/token conv)")
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "d_model": cfg.dim, "n_heads": cfg.num_heads, "n_kv_heads": cfg.num_kv_heads,
        "n_layers": cfg.num_layers, "mlp_hidden_size": cfg.ffn_dim,
        "mlp_ratio": max(1, cfg.ffn_dim // cfg.dim), "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.vocab_size, "max_sequence_length": cfg.max_seq_len,
        "rope": True, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
        "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu",
        "alibi": False, "attention_layer_norm": False, "include_bias": False,
        "include_qkv_bias": False, "bias_for_layer_norm": False, "input_emb_norm": False,
        "scale_logits": False, "weight_tying": cfg.tie_embeddings,
        "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id, "mask_token_id": cfg.mask_id,
        "use_cache": False,
    }
