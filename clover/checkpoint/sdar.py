"""SDAR dense (`model_type: sdar`, `SDARForCausalLM`, JetLM): Qwen3 layout run as block diffusion.

Keys are Qwen3's (per-head `q_norm` / `k_norm`, no biases, SwiGLU `mlp`). SDAR decodes blocks
of `block_size` tokens (4 in the published models) with attention bidirectional inside a block and
causal across blocks, and predicts each masked position from its own logits: Clover's `block`
mode with own-token prediction. The mask id is the tokenizer's `<|MASK|>` (config
`mask_token_id` when present, else 151669).
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama
from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.checkpoint.llada import first_id
from clover.config import ModelConfig

ARCHITECTURES = ("SDARForCausalLM",)
MODEL_TYPES = ("sdar",)
DEFAULT_BLOCK = 4
MASK_ID = 151669

QK_NORM: KeyMap = {
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.weight",
}
KEYS: KeyMap = {**llama.FRAME, **llama.ATTENTION, **QK_NORM, **llama.DENSE_MLP}


def common_fields(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """ModelConfig fields shared by SDAR dense and MoE (Qwen3 attention, block diffusion)."""
    llama.check_plain_llama(hf, family)
    llama.refuse_true(hf, "use_sliding_window", family)
    llama.refuse_true(hf, "attention_bias", family)
    heads = hf["num_attention_heads"]
    eos = first_id(hf.get("eos_token_id"), 151643)
    return dict(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=llama.rope_theta(hf),
        qk_norm=True, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), attention="block",
        block_size=int(hf.get("block_size") or DEFAULT_BLOCK),
        max_seq_len=int(hf.get("max_position_embeddings", 32768)),
        eos_id=eos, pad_id=first_id(hf.get("pad_token_id"), eos),
        mask_id=first_id(hf.get("mask_token_id"), MASK_ID))


def config_from_hf(hf: dict[str, Any], name: str = "sdar") -> ModelConfig:
    """A block-diffusion Clover config with SDAR's (Qwen3's) math."""
    return ModelConfig(name=name, ffn_dim=hf["intermediate_size"], **common_fields(hf, "SDAR"))


def common_hf(cfg: ModelConfig) -> dict[str, Any]:
    if (not cfg.qk_norm or cfg.qkv_bias or cfg.partial_rotary != 1.0 or cfg.token_conv
            or cfg.shift_logits or cfg.attention != "block"):
        raise CheckpointError(f"{cfg.name}: not expressible as an SDAR checkpoint (needs block "
                              "attention, QK-norm, no bias, full RoPE, own-token prediction)")
    return {**llama.common_to_hf(cfg, ffn=False, mask=True), "attention_bias": False,
            "use_sliding_window": False, "block_size": cfg.block_size}


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.is_moe:
        raise CheckpointError(f"{cfg.name}: an MoE model exports as sdar_moe, not sdar")
    return {"architectures": ["SDARForCausalLM"], "model_type": "sdar",
            "intermediate_size": cfg.ffn_dim, **common_hf(cfg)}
