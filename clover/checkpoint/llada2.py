"""LLaDA2.0 / 2.1 mini and flash (`llada2_moe`, BailingMoeV2 layout): block-diffusion MoE.

What the layout holds and where it lands in Clover:
- fused `attention.query_key_value` ([H | G | G] heads of Dh rows) -> q/k/v (a `Split` rule;
  part sizes from Clover's shapes), `attention.dense` -> o_proj, per-head `query_layernorm` /
  `key_layernorm` -> q_norm / k_norm; partial RoPE (`partial_rotary_factor`, rotate-half on the
  first half of each head);
- `first_k_dense_replace` leading dense layers (`mlp.{gate,up,down}_proj`), then MoE layers:
  `mlp.gate.weight` + `mlp.gate.expert_bias` (sigmoid scores, bias for selection only,
  group-limited top-k over `n_group` groups keeping `topk_group`, weights renormalised and
  multiplied by `routed_scaling_factor`), `mlp.experts.E.*` stacked into Clover's [E, ...]
  tensors (`[{}]` rules), `mlp.shared_experts.*` -> the shared expert;
- block diffusion (block 32, own-token prediction, mask id 156895).
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama
from clover.checkpoint.keymap import CheckpointError, KeyMap, Split
from clover.config import ModelConfig

ARCHITECTURES = ("LLaDA2MoeModelLM",)
MODEL_TYPES = ("llada2_moe",)
DEFAULT_BLOCK = 32
MASK_ID = 156895

_L = "model.layers.{}."
PROJS = ("gate_proj", "up_proj", "down_proj")

KEYS: KeyMap = {
    "model.word_embeddings.weight": "embed.weight",
    _L + "input_layernorm.weight": "layers.{}.attn_norm.weight",
    **{_L + f"attention.query_key_value.{kind}": Split(
        *(f"layers.{{}}.attn.{p}_proj.{kind}" for p in "qkv")) for kind in ("weight", "bias")},
    _L + "attention.dense.weight": "layers.{}.attn.o_proj.weight",
    _L + "attention.query_layernorm.weight": "layers.{}.attn.q_norm.weight",
    _L + "attention.key_layernorm.weight": "layers.{}.attn.k_norm.weight",
    _L + "post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    **{_L + f"mlp.{p}.weight": f"layers.{{}}.ffn.{p}.weight" for p in PROJS},
    _L + "mlp.gate.weight": "layers.{}.ffn.router.gate.weight",
    _L + "mlp.gate.expert_bias": "layers.{}.ffn.router.expert_bias",
    **{_L + f"mlp.experts.{{}}.{p}.weight": f"layers.{{}}.ffn.experts.{p}[{{}}]" for p in PROJS},
    **{_L + f"mlp.shared_experts.{p}.weight": f"layers.{{}}.ffn.shared.{p}.weight"
       for p in PROJS},
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def _check(hf: dict[str, Any]) -> None:
    if hf.get("use_bias"):
        raise CheckpointError("config.json: use_bias=true (biases on dense/o_proj) is not "
                              "supported for LLaDA2")
    if hf.get("score_function", "sigmoid") != "sigmoid":
        raise CheckpointError(f"config.json: score_function={hf['score_function']!r} is not "
                              "supported for LLaDA2 (sigmoid only)")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: hidden_act={hf['hidden_act']!r} is not supported")
    if hf.get("num_nextn_predict_layers"):
        raise CheckpointError("config.json: num_nextn_predict_layers > 0 (MTP layers) is not "
                              "supported for LLaDA2")


def config_from_hf(hf: dict[str, Any], name: str = "llada2") -> ModelConfig:
    """A block-diffusion MoE Clover config with BailingMoeV2's math."""
    _check(hf)
    top_k = hf["num_experts_per_tok"]
    return ModelConfig(
        name=name, **llama.dllm_fields(hf, eos=156892, mask=MASK_ID, context=32768),
        partial_rotary=float(hf.get("partial_rotary_factor", 1.0)),
        qk_norm=bool(hf.get("use_qk_norm")), qkv_bias=bool(hf.get("use_qkv_bias")),
        ffn_dim=hf["intermediate_size"],
        num_dense_layers=hf.get("first_k_dense_replace", 0), num_experts=hf["num_experts"],
        num_experts_per_tok=top_k, num_shared_experts=hf.get("num_shared_experts") or 0,
        expert_ffn_dim=hf["moe_intermediate_size"], router="sigmoid",
        router_renorm=top_k > 1,  # BailingMoeV2 renormalises whenever top_k > 1
        routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        num_expert_groups=hf.get("n_group") or 1, topk_groups=hf.get("topk_group") or 1,
        attention="block", block_size=int(hf.get("block_size", DEFAULT_BLOCK)))


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The BailingMoeV2 config.json (`llada2_moe`) for a block-diffusion sigmoid-router MoE."""
    if (not cfg.is_moe or cfg.router != "sigmoid" or cfg.attention != "block"
            or cfg.shift_logits or cfg.token_conv or cfg.router_renorm != (
                cfg.num_experts_per_tok > 1)):
        raise CheckpointError(f"{cfg.name}: not expressible as a LLaDA2 checkpoint (needs a "
                              "block-diffusion MoE with a sigmoid router, own-token prediction)")
    return {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        **llama.common_to_hf(cfg, mask=True),
        "partial_rotary_factor": cfg.partial_rotary,
        "use_qk_norm": cfg.qk_norm, "use_qkv_bias": cfg.qkv_bias, "use_bias": False,
        "first_k_dense_replace": cfg.num_dense_layers, "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "num_shared_experts": cfg.num_shared_experts or None,
        "moe_intermediate_size": cfg.expert_ffn_dim, "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True, "norm_topk_prob": True,
        "routed_scaling_factor": cfg.routed_scaling, "n_group": cfg.num_expert_groups,
        "topk_group": cfg.topk_groups, "block_size": cfg.block_size,
        "num_nextn_predict_layers": 0,
    }
