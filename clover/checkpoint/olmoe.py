"""OLMoE family (`OlmoeForCausalLM`): every layer MoE, QK-norm over the whole projection.

Config mapping both ways and the declarative key map (the Qwen3-MoE layout: same names, per-expert
keys stacked into Clover's expert tensors). Unlike Qwen3, OLMoE's `q_norm` / `k_norm` normalise
the full Q and K projections (all heads at once, widths H*Dh and G*Dh) before splitting into heads:
Clover's `qk_norm_scope="all"`. Experts have width `intermediate_size`; the router is softmax
top-k, renormalised only when `norm_topk_prob`. `clip_qkv` is refused.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama, qwen3_moe
from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("OlmoeForCausalLM",)
MODEL_TYPES = ("olmoe",)

KEYS: KeyMap = qwen3_moe.KEYS
ALT_KEYS: KeyMap = qwen3_moe.FUSED_EXPERT_KEYS
ZEROS = qwen3_moe.ZEROS


def config_from_hf(hf: dict[str, Any], name: str = "olmoe") -> ModelConfig:
    """A causal Clover config with the same math as this OLMoE config.json."""
    llama.refuse_true(hf, "attention_bias", "OLMoE")
    if hf.get("clip_qkv") is not None:
        raise CheckpointError("config.json: clip_qkv is not supported for OLMoE (only null)")
    fields = llama.common_fields(hf, "OLMoE")
    return ModelConfig(name=name, **fields, qk_norm=True, qk_norm_scope="all",
                       **qwen3_moe.moe_fields(hf, int(hf["intermediate_size"])))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `OlmoeForCausalLM` with the same math."""
    llama.require_features(cfg, "OLMoE", qk_norm="all", moe=True)
    qwen3_moe.require_softmax_moe(cfg, "OLMoE")
    if cfg.num_dense_layers:
        raise CheckpointError(f"{cfg.name}: OLMoE has no dense layers "
                              f"(num_dense_layers={cfg.num_dense_layers})")
    hf = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
          **llama.common_to_hf(cfg), "attention_bias": False, "clip_qkv": None,
          "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
          "norm_topk_prob": cfg.router_renorm}
    hf["intermediate_size"] = cfg.expert_ffn_dim
    return hf
