"""SDAR MoE (`model_type: sdar_moe`, `SDARMoeForCausalLM`, e.g. SDAR-30B-A3B): Qwen3-MoE layout
run as block diffusion.

Keys are Qwen3-MoE's (per-expert `mlp.experts.E.*` stacked into Clover's [E, ...] tensors, softmax
router `mlp.gate`, transformers 5's fused in-memory expert layout read too); the attention and
decoding fields are SDAR's (block attention, block 4, own-token prediction, `<|MASK|>`).
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import qwen3_moe, sdar
from clover.checkpoint.keymap import KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("SDARMoeForCausalLM",)
MODEL_TYPES = ("sdar_moe",)

KEYS: KeyMap = {**sdar.KEYS, **qwen3_moe.MOE_KEYS}
ALT_KEYS: KeyMap = qwen3_moe.ALT_KEYS
ZEROS = qwen3_moe.ZEROS  # softmax routers have no expert bias


def config_from_hf(hf: dict[str, Any], name: str = "sdar_moe") -> ModelConfig:
    """A block-diffusion MoE Clover config with SDAR-MoE's (Qwen3-MoE's) math."""
    return ModelConfig(
        name=name, ffn_dim=hf.get("intermediate_size") or hf["moe_intermediate_size"],
        num_dense_layers=qwen3_moe.num_dense_layers(hf),
        **qwen3_moe.moe_fields(hf, int(hf["moe_intermediate_size"])),
        **sdar.common_fields(hf, "SDAR-MoE"))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    qwen3_moe.require_softmax_moe(cfg, "SDAR-MoE")
    return {"architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe",
            "intermediate_size": cfg.ffn_dim, **sdar.common_hf(cfg),
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.expert_ffn_dim, "norm_topk_prob": cfg.router_renorm,
            "decoder_sparse_step": 1, "mlp_only_layers": list(range(cfg.num_dense_layers))}
