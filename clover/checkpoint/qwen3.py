"""Qwen3 family (`Qwen3ForCausalLM`): a Llama block with RMSNorm on each head of Q and K.

Config mapping both ways and the declarative key map (the Llama map plus `q_norm` / `k_norm`,
each over head_dim, applied before RoPE: Clover's `qk_norm` with scope `head`). Qwen3 states
head_dim explicitly (it need not be hidden / heads). `attention_bias` (which in Qwen3 also puts
a bias on the output projection) is refused.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama
from clover.checkpoint.keymap import KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("Qwen3ForCausalLM",)
MODEL_TYPES = ("qwen3",)

KEYS: KeyMap = {
    **llama.KEYS,
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.weight",
}


def config_from_hf(hf: dict[str, Any], name: str = "qwen3") -> ModelConfig:
    """A causal Clover config with the same math as this Qwen3 config.json."""
    llama.refuse_true(hf, "attention_bias", "Qwen3")
    return ModelConfig(name=name, **llama.common_fields(hf, "Qwen3"), qk_norm=True,
                       qk_norm_scope="head")


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `Qwen3ForCausalLM` with the same math."""
    llama.require_features(cfg, "Qwen3", qk_norm="head")
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            **llama.common_to_hf(cfg), "attention_bias": False, "use_sliding_window": False}
