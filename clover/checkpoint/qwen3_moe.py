"""Qwen3-MoE family (`Qwen3MoeForCausalLM`): Qwen3 attention, softmax top-k routed experts.

Config mapping both ways and the declarative key map. Checkpoints on disk hold one key per expert
(`mlp.experts.E.gate_proj.weight`, what transformers' `save_pretrained` writes); they are stacked
into Clover's grouped expert tensors `layers.N.ffn.experts.{gate,up,down}_proj` [E, ...].
transformers >= 5 keeps experts fused in memory (`gate_up_proj` [E, 2F, D], gate first, and
`down_proj` [E, D, F]); that layout is read too (`ALT_KEYS`), and exports write per-expert keys.
The router is softmax over all experts, top-k, renormalised when `norm_topk_prob` (Clover's
`router_renorm`); it has no expert bias, so Clover's starts (and must stay) at zero. Dense layers
(`mlp_only_layers`, `decoder_sparse_step`) must lead, as Clover's `num_dense_layers` does.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama, qwen3
from clover.checkpoint.keymap import CheckpointError, KeyMap, Split
from clover.config import ModelConfig

ARCHITECTURES = ("Qwen3MoeForCausalLM",)
MODEL_TYPES = ("qwen3_moe",)

MOE_KEYS: KeyMap = {
    "model.layers.{}.mlp.gate.weight": "layers.{}.ffn.router.gate.weight",
    "model.layers.{}.mlp.experts.{}.gate_proj.weight": "layers.{}.ffn.experts.gate_proj[{}]",
    "model.layers.{}.mlp.experts.{}.up_proj.weight": "layers.{}.ffn.experts.up_proj[{}]",
    "model.layers.{}.mlp.experts.{}.down_proj.weight": "layers.{}.ffn.experts.down_proj[{}]",
}
# transformers >= 5's fused in-memory expert layout, accepted on import only
FUSED_EXPERT_KEYS: KeyMap = {
    "model.layers.{}.mlp.experts.gate_up_proj": Split(
        "layers.{}.ffn.experts.gate_proj", "layers.{}.ffn.experts.up_proj", dim=1),
    "model.layers.{}.mlp.experts.down_proj": "layers.{}.ffn.experts.down_proj",
}
KEYS: KeyMap = {**qwen3.KEYS, **MOE_KEYS}
ALT_KEYS: KeyMap = FUSED_EXPERT_KEYS
ZEROS = ("layers.{}.ffn.router.expert_bias",)  # softmax routers have none


def num_experts(hf: dict[str, Any]) -> int:
    return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


def num_dense_layers(hf: dict[str, Any]) -> int:
    """How many leading layers are dense; refuses dense layers anywhere else."""
    step = int(hf.get("decoder_sparse_step", 1))
    dense_only = set(hf.get("mlp_only_layers") or [])
    is_moe = [i not in dense_only and (i + 1) % step == 0
              for i in range(hf["num_hidden_layers"])]
    leading = is_moe.index(True) if True in is_moe else len(is_moe)
    if leading == len(is_moe) or not all(is_moe[leading:]):
        raise CheckpointError("config.json: mlp_only_layers / decoder_sparse_step give MoE layers "
                              f"{[i for i, m in enumerate(is_moe) if m]}; Clover needs the dense "
                              "layers first and at least one MoE layer")
    return leading


def moe_fields(hf: dict[str, Any], expert_ffn_dim: int) -> dict[str, Any]:
    """The routed-expert fields shared by softmax top-k MoE families."""
    return dict(num_experts=num_experts(hf), num_experts_per_tok=int(hf["num_experts_per_tok"]),
                expert_ffn_dim=expert_ffn_dim, router="softmax",
                router_renorm=bool(hf.get("norm_topk_prob", False)))


def config_from_hf(hf: dict[str, Any], name: str = "qwen3_moe") -> ModelConfig:
    """A causal Clover config with the same math as this Qwen3-MoE config.json."""
    llama.refuse_true(hf, "attention_bias", "Qwen3-MoE")
    return ModelConfig(name=name, **llama.common_fields(hf, "Qwen3-MoE"), qk_norm=True,
                       qk_norm_scope="head", num_dense_layers=num_dense_layers(hf),
                       **moe_fields(hf, int(hf["moe_intermediate_size"])))


def require_softmax_moe(cfg: ModelConfig, family: str) -> None:
    """Refuse router features the softmax top-k families do not have."""
    if cfg.router != "softmax" or cfg.routed_scaling != 1.0 or cfg.num_shared_experts:
        raise CheckpointError(f"{cfg.name}: not expressible as a {family} checkpoint (router "
                              f"{cfg.router!r}, routed_scaling {cfg.routed_scaling}, "
                              f"{cfg.num_shared_experts} shared experts; needs softmax, 1.0, 0)")


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `Qwen3MoeForCausalLM` with the same math."""
    llama.require_features(cfg, "Qwen3-MoE", qk_norm="head", moe=True)
    require_softmax_moe(cfg, "Qwen3-MoE")
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            **llama.common_to_hf(cfg), "attention_bias": False, "use_sliding_window": False,
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "moe_intermediate_size": cfg.expert_ffn_dim, "norm_topk_prob": cfg.router_renorm,
            "decoder_sparse_step": 1, "mlp_only_layers": list(range(cfg.num_dense_layers))}
