"""LLaDA-MoE (`lladamoe`, `LLaDAMoEModelLM`, e.g. LLaDA-MoE-7B-A1B): an OLMoE-like MoE dLLM.

Keys are OLMoE/Qwen3-MoE-like (`model.layers.N.self_attn.{q,k,v,o}_proj`, per-head `q_norm` /
`k_norm` applied to each head_dim slice, `mlp.gate` + per-expert `mlp.experts.E.*` stacked into
Clover's [E, ...] tensors, dense layers' `mlp.{gate,up,down}_proj`, an optional layer-level
`shared_expert`). The router is softmax top-k *without* renormalisation (`norm_topk_prob` is
hard-wired false in its modeling code); attention is bidirectional and each position predicts its
own token (mask id 156895). An expert bias added to the softmax weights
(`moe_router_enable_expert_bias`) and `clip_qkv` are refused: Clover does not implement them.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama, qwen3_moe
from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.checkpoint.sdar import QK_NORM
from clover.config import ModelConfig

ARCHITECTURES = ("LLaDAMoEModelLM",)
MODEL_TYPES = ("lladamoe",)
DEFAULT_BLOCK = 32
PROJS = ("gate_proj", "up_proj", "down_proj")

KEYS: KeyMap = {
    **llama.FRAME, **llama.ATTENTION, **QK_NORM, **qwen3_moe.MOE_KEYS,
    **llama.QKV_BIAS,
    **{f"model.layers.{{}}.mlp.{p}.weight": f"layers.{{}}.ffn.{p}.weight" for p in PROJS},
    **{f"model.layers.{{}}.shared_expert.{p}.weight": f"layers.{{}}.ffn.shared.{p}.weight"
       for p in PROJS},
}
ZEROS = qwen3_moe.ZEROS  # its softmax router's bias (when disabled) has no key


def _check(hf: dict[str, Any]) -> None:
    llama.check_plain_llama(hf, "LLaDA-MoE")
    if hf.get("moe_router_enable_expert_bias"):
        raise CheckpointError("config.json: moe_router_enable_expert_bias=true (a bias added to "
                              "softmax routing weights) is not supported for LLaDA-MoE")
    if hf.get("clip_qkv") is not None:
        raise CheckpointError("config.json: clip_qkv is not supported for LLaDA-MoE")
    if hf.get("moe_router_score_function", "softmax") != "softmax":
        raise CheckpointError("config.json: moe_router_score_function="
                              f"{hf['moe_router_score_function']!r} is not supported (softmax)")
    if hf["hidden_size"] % hf["num_attention_heads"]:
        raise CheckpointError("config.json: hidden_size must be a multiple of num_attention_heads")


def _layers(hf: dict[str, Any]) -> int:
    """Leading dense layers from `moe_layer_freq` (1 = MoE); dense layers must lead."""
    freq = hf.get("moe_layer_freq") or [1] * hf["num_hidden_layers"]
    if isinstance(freq, int):
        freq = [1 if (i + 1) % freq == 0 else 0 for i in range(hf["num_hidden_layers"])]
    leading = freq.index(1) if 1 in freq else len(freq)
    if leading == len(freq) or not all(freq[leading:]):
        raise CheckpointError(f"config.json: moe_layer_freq={freq}; Clover needs the dense "
                              "layers first and at least one MoE layer")
    return leading


def _shared(hf: dict[str, Any]) -> int:
    size, expert = hf.get("shared_expert_intermediate_size"), hf["expert_intermediate_size"]
    if not size or size < 0:
        return 0
    if size % expert:
        raise CheckpointError(f"config.json: shared_expert_intermediate_size={size} must be a "
                              f"multiple of expert_intermediate_size={expert}")
    return size // expert


def config_from_hf(hf: dict[str, Any], name: str = "llada-moe") -> ModelConfig:
    """A bidirectional MoE Clover config with LLaDA-MoE's math."""
    _check(hf)
    fields = llama.dllm_fields(hf, eos=156892, mask=156895, context=8192, norm_eps=1e-5)
    fields["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]  # no head_dim field
    return ModelConfig(
        name=name, **fields,
        qk_norm=bool(hf.get("qk_layernorm")), qkv_bias=bool(hf.get("attention_bias")),
        ffn_dim=max(hf.get("dense_intermediate_size") or 0, 1),
        num_dense_layers=_layers(hf), num_experts=hf["num_experts"],
        num_experts_per_tok=hf["num_experts_per_tok"], num_shared_experts=_shared(hf),
        expert_ffn_dim=hf["expert_intermediate_size"], router="softmax", router_renorm=False,
        attention="full", block_size=DEFAULT_BLOCK)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """LLaDA-MoE's config.json for a bidirectional softmax-router MoE (no renormalisation)."""
    if (not cfg.is_moe or cfg.router != "softmax" or cfg.router_renorm or cfg.routed_scaling != 1
            or cfg.attention != "full" or cfg.shift_logits or cfg.partial_rotary != 1.0
            or cfg.token_conv or cfg.head_dim * cfg.num_heads != cfg.dim
            or cfg.qk_norm_scope != "head"):
        raise CheckpointError(f"{cfg.name}: not expressible as a LLaDA-MoE checkpoint")
    return {
        "architectures": ["LLaDAMoEModelLM"], "model_type": "lladamoe",
        **llama.common_to_hf(cfg, head_dim=False, ffn=False, mask=True),
        "qk_layernorm": cfg.qk_norm,
        "attention_bias": cfg.qkv_bias, "dense_intermediate_size": cfg.ffn_dim,
        "expert_intermediate_size": cfg.expert_ffn_dim,
        "shared_expert_intermediate_size": cfg.expert_ffn_dim * cfg.num_shared_experts or None,
        "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
        "moe_layer_freq": [int(cfg.layer_is_moe(i)) for i in range(cfg.num_layers)],
        "moe_router_enable_expert_bias": False, "moe_router_score_function": "softmax",
        "clip_qkv": None,
    }
