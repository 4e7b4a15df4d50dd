"""Qwen2 / Qwen2.5 family (`Qwen2ForCausalLM`): a Llama block with biases on Q, K and V.

Config mapping both ways and the declarative key map (the Llama map plus the three biases).
The output projection has no bias in Qwen2, as in Clover (`qkv_bias`). Sliding-window layers
(`use_sliding_window`) cap the context at the window, where they equal causal attention.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama
from clover.checkpoint.keymap import KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("Qwen2ForCausalLM",)
MODEL_TYPES = ("qwen2",)

KEYS: KeyMap = {**llama.KEYS, **llama.QKV_BIAS}


def config_from_hf(hf: dict[str, Any], name: str = "qwen2") -> ModelConfig:
    """A causal Clover config with the same math as this Qwen2 config.json."""
    return ModelConfig(name=name, **llama.common_fields(hf, "Qwen2"), qkv_bias=True)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for `Qwen2ForCausalLM` with the same math."""
    llama.require_features(cfg, "Qwen2", qkv_bias=True)
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            **llama.common_to_hf(cfg), "use_sliding_window": False}
