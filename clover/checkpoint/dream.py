"""Dream-7B (`model_type: Dream`, `DreamModel`): a Qwen2.5 layout run as a bidirectional dLLM.

Keys are Qwen2's (`model.layers.N.self_attn.{q,k,v}_proj` with biases, SwiGLU `mlp`, untied
`lm_head`). Dream keeps the AR head's alignment: the logits at position i - 1 predict the token at
masked position i, so the Clover config sets `shift_logits=True`, `attention="full"` and the mask
id 151666 (`<|mask|>`). Sliding-window attention and scaled RoPE are refused, not approximated.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.checkpoint.llada import first_id
from clover.checkpoint.llama import check_plain_llama, rope_theta
from clover.config import ModelConfig

ARCHITECTURES = ("DreamModel",)
MODEL_TYPES = ("Dream",)
DEFAULT_BLOCK = 32

QWEN_ATTENTION: KeyMap = {
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.o_proj.weight",
}
QWEN_FRAME: KeyMap = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attn_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,  # recomputed from rope_theta
}
DENSE_MLP: KeyMap = {
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.ffn.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.ffn.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.ffn.down_proj.weight",
}
KEYS: KeyMap = {
    **QWEN_FRAME, **QWEN_ATTENTION, **DENSE_MLP,
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attn.q_proj.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attn.k_proj.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attn.v_proj.bias",
}


def check_no_sliding(hf: dict[str, Any], family: str) -> None:
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"config.json: use_sliding_window=true is not supported for {family}")


def config_from_hf(hf: dict[str, Any], name: str = "dream") -> ModelConfig:
    """A bidirectional, shifted-prediction Clover config with Dream's math."""
    check_plain_llama(hf, "Dream")
    check_no_sliding(hf, "Dream")
    heads = hf["num_attention_heads"]
    eos = first_id(hf.get("eos_token_id"), 151643)
    return ModelConfig(
        name=name, vocab_size=hf["vocab_size"], dim=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=rope_theta(hf),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), ffn_dim=hf["intermediate_size"],
        qkv_bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings")), attention="full",
        block_size=DEFAULT_BLOCK, shift_logits=True,
        max_seq_len=int(hf.get("max_position_embeddings", 32768)),
        eos_id=eos, pad_id=first_id(hf.get("pad_token_id"), eos),
        mask_id=first_id(hf.get("mask_token_id"), 151666))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Dream's config.json for a dense, bidirectional, shifted Clover config with QKV bias."""
    if (cfg.is_moe or cfg.qk_norm or not cfg.qkv_bias or cfg.partial_rotary != 1.0
            or cfg.token_conv or not cfg.shift_logits or cfg.attention != "full"):
        raise CheckpointError(f"{cfg.name}: not expressible as a Dream checkpoint (needs dense, "
                              "full attention, shifted logits, QKV bias, no QK-norm)")
    return {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
        "use_sliding_window": False, "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id,
        "bos_token_id": cfg.eos_id, "mask_token_id": cfg.mask_id, "torch_dtype": "float32",
    }
