"""Dream-7B (`model_type: Dream`, `DreamModel`): a Qwen2.5 layout run as a bidirectional dLLM.

Keys are Qwen2's (`model.layers.N.self_attn.{q,k,v}_proj` with biases, SwiGLU `mlp`, untied
`lm_head`). Dream keeps the AR head's alignment: the logits at position i - 1 predict the token at
masked position i, so the Clover config sets `shift_logits=True`, `attention="full"` and the mask
id 151666 (`<|mask|>`). Sliding-window attention and scaled RoPE are refused, not approximated.
"""

from __future__ import annotations

from typing import Any

from clover.checkpoint import llama
from clover.checkpoint.keymap import CheckpointError, KeyMap
from clover.config import ModelConfig

ARCHITECTURES = ("DreamModel",)
MODEL_TYPES = ("Dream",)
DEFAULT_BLOCK = 32

KEYS: KeyMap = {**llama.KEYS, **llama.QKV_BIAS}


def config_from_hf(hf: dict[str, Any], name: str = "dream") -> ModelConfig:
    """A bidirectional, shifted-prediction Clover config with Dream's math."""
    llama.check_plain_llama(hf, "Dream")
    llama.refuse_true(hf, "use_sliding_window", "Dream")
    return ModelConfig(
        name=name, **llama.dllm_fields(hf, eos=151643, mask=151666, context=32768),
        ffn_dim=hf["intermediate_size"], qkv_bias=True, attention="full",
        block_size=DEFAULT_BLOCK, shift_logits=True)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Dream's config.json for a dense, bidirectional, shifted Clover config with QKV bias."""
    if (cfg.is_moe or cfg.qk_norm or not cfg.qkv_bias or cfg.partial_rotary != 1.0
            or cfg.token_conv or not cfg.shift_logits or cfg.attention != "full"):
        raise CheckpointError(f"{cfg.name}: not expressible as a Dream checkpoint (needs dense, "
                              "full attention, shifted logits, QKV bias, no QK-norm)")
    return {"architectures": ["DreamModel"], "model_type": "Dream",
            **llama.common_to_hf(cfg, mask=True), "use_sliding_window": False,
            "bos_token_id": cfg.eos_id}
