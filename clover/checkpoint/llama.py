"""Llama family (Llama, Mistral, SmolLM2: `LlamaForCausalLM` / `MistralForCausalLM`).

The config mapping both ways and the declarative key map. Clover's block is a pre-norm Llama block
(RMSNorm, RoPE rotate-half, GQA, SwiGLU), so the map is a renaming; nothing is permuted here (GGUF
files are un-permuted by `clover.checkpoint.gguf_file` before they reach this map).
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.checkpoint.llada import first_id
from clover.config import ModelConfig

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
MODEL_TYPES = ("llama", "mistral")

# the pieces every Llama-shaped family (Qwen, Dream, SDAR, LLaDA-MoE) names alike
FRAME: KeyMap = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attn_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,  # recomputed from rope_theta
}
ATTENTION: KeyMap = {
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.o_proj.weight",
}
QKV_BIAS: KeyMap = {
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attn.q_proj.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attn.k_proj.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attn.v_proj.bias",
}
DENSE_MLP: KeyMap = {
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.ffn.gate_proj.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.ffn.up_proj.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.ffn.down_proj.weight",
}
KEYS: KeyMap = {**FRAME, **ATTENTION, **DENSE_MLP}

def rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from either config style (transformers 5 `rope_parameters`, or `rope_theta`);
    scaled RoPE (YaRN, linear, llama3) is refused rather than computed wrongly."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported (only default)")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def refuse_true(hf: dict[str, Any], key: str, family: str) -> None:
    """A config.json flag this family's import does not implement, refused by name when set."""
    if hf.get(key):
        raise CheckpointError(f"config.json: {key}=true is not supported for {family}")


def check_plain_llama(hf: dict[str, Any], family: str = "Llama") -> None:
    """Refuse config fields that change the math in ways Clover does not implement."""
    if hf.get("mlp_bias"):
        raise CheckpointError(f"config.json: mlp_bias=true is not supported for {family}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: hidden_act={hf['hidden_act']!r} is not supported "
                              f"for {family} (silu only)")


def config_from_hf(hf: dict[str, Any], name: str = "llama") -> ModelConfig:
    """A causal Clover config with the same math as this Llama config.json."""
    refuse_true(hf, "attention_bias", "Llama")
    return ModelConfig(name=name, **common_fields(hf, "Llama"))


def common_fields(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """The ModelConfig fields every Llama-shaped family (Llama, Qwen, OLMoE) reads alike."""
    check_plain_llama(hf, family)
    num_heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    eos = (eos[0] if isinstance(eos, list) else eos) or 0
    pad = hf.get("pad_token_id")
    vocab = hf["vocab_size"]
    return dict(
        vocab_size=vocab, dim=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=num_heads, num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        rope_theta=rope_theta(hf), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        ffn_dim=hf["intermediate_size"], tie_embeddings=bool(hf.get("tie_word_embeddings")),
        attention="causal", block_size=1, max_seq_len=_context(hf),
        eos_id=eos, pad_id=eos if pad is None else pad, mask_id=_spare_id(vocab, eos, pad))


def dllm_fields(hf: dict[str, Any], *, eos: int, mask: int, context: int,
                norm_eps: float = 1e-6) -> dict[str, Any]:
    """The ModelConfig shape and token fields of a dLLM family built on the Llama/Qwen layout
    (Dream, LLaDA2, LLaDA-MoE); the defaults are the family's published ids where a config.json
    leaves them out."""
    heads = hf["num_attention_heads"]
    eos_id = first_id(hf.get("eos_token_id"), eos)
    return dict(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=rope_theta(hf),
        norm_eps=float(hf.get("rms_norm_eps", norm_eps)),
        tie_embeddings=bool(hf.get("tie_word_embeddings")),
        max_seq_len=int(hf.get("max_position_embeddings", context)),
        eos_id=eos_id, pad_id=first_id(hf.get("pad_token_id"), eos_id),
        mask_id=first_id(hf.get("mask_token_id"), mask))


def _context(hf: dict[str, Any]) -> int:
    """max_position_embeddings, capped by a sliding window when one is in use (Mistral v0.1):
    up to the window, sliding-window attention is plain causal attention."""
    context = int(hf.get("max_position_embeddings", 4096))
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window", True):
        context = min(context, int(window))
    return context


def _spare_id(vocab: int, *used: int | None) -> int:
    """A causal model never reads its mask id; any id other than eos/pad satisfies the config."""
    return next(i for i in range(vocab) if i not in used)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `LlamaForCausalLM` with the same math (causal attention)."""
    require_features(cfg, "Llama")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common_to_hf(cfg),
            "attention_bias": False, "mlp_bias": False}


def require_features(cfg: ModelConfig, family: str, *, qkv_bias: bool = False,
                     qk_norm: str | None = None, moe: bool = False) -> None:
    """Refuse a Clover config whose math the target family cannot express.

    qk_norm: None (no QK-norm) or the scope the family normalises over ("head" or "all").
    """
    have = {"QKV bias": cfg.qkv_bias, "QK-norm": cfg.qk_norm_scope if cfg.qk_norm else None,
            "MoE": cfg.is_moe, "partial RoPE": cfg.partial_rotary != 1.0,
            "token conv": bool(cfg.token_conv)}
    need = {"QKV bias": qkv_bias, "QK-norm": qk_norm, "MoE": moe, "partial RoPE": False,
            "token conv": False}
    wrong = [k for k in have if have[k] != need[k]]
    if wrong:
        raise CheckpointError(f"{cfg.name}: not expressible as a {family} checkpoint ("
                              + ", ".join(f"{k}: {have[k]} here, {need[k]} there" for k in wrong)
                              + ")")


def common_to_hf(cfg: ModelConfig, *, head_dim: bool = True, ffn: bool = True,
                 mask: bool = False) -> dict[str, Any]:
    """The config.json fields every Llama-shaped family writes alike (`head_dim`,
    `intermediate_size` and `mask_token_id` where the family names them so)."""
    out = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
        "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id, "torch_dtype": "float32",
    }
    if head_dim:
        out["head_dim"] = cfg.head_dim
    if ffn:
        out["intermediate_size"] = cfg.ffn_dim
    if mask:
        out["mask_token_id"] = cfg.mask_id
    return out
