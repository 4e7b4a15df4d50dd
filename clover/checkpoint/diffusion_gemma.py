"""DiffusionGemma (`model_type: diffusion_gemma`, `DiffusionGemmaForBlockDiffusion`, in
transformers 5.25).

The text model only: Gemma-4 MoE layers (sandwich norms, a dense GELU-tanh MLP beside the
experts, router with input and per-expert scales, a learned layer scalar), sliding and full
attention layers (full ones with their own head dim and kv heads, keys doubling as values,
proportional partial RoPE), self-conditioning and soft-capped logits, in Clover's
`arch="diffusion_gemma"` model with `canvas` attention and a `uniform` canvas. The encoder and
the decoder share every text weight, so the checkpoint stores them once under `model.decoder.*`;
the encoder's own copies of the layer scalars (buffers) must equal the decoder's and are checked,
then dropped. The vision tower and its embedder are dropped: images are not supported.
"""

from __future__ import annotations

from typing import Any

import torch

from clover.checkpoint.keymap import CheckpointError, KeyMap, Split
from clover.checkpoint.llada import first_id
from clover.config import ModelConfig

ARCHITECTURES = ("DiffusionGemmaForBlockDiffusion",)
MODEL_TYPES = ("diffusion_gemma",)
MASK_ID = 4  # Gemma's `<mask>`; the uniform canvas never feeds it, the engine never samples it
DROPPED_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
ENCODER_SCALAR = "model.encoder.language_model.layers.{}.layer_scalar"

_LAYER = "model.decoder.layers.{}."
_LAYER_PARTS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
    "pre_feedforward_layernorm_2.weight", "post_feedforward_layernorm_1.weight",
    "post_feedforward_layernorm_2.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "router.proj.weight", "router.scale", "router.per_expert_scale",
    "experts.down_proj", "layer_scalar",
)
KEYS: KeyMap = {
    "model.decoder.embed_tokens.weight": "embed.weight",
    "model.decoder.norm.weight": "norm.weight",
    "lm_head.weight": None,  # tied to the embedding
    **{_LAYER + part: "layers.{}." + part for part in _LAYER_PARTS},
    _LAYER + "experts.gate_up_proj": Split("layers.{}.experts.gate_proj",
                                           "layers.{}.experts.up_proj", dim=1),
    "model.decoder.self_conditioning.pre_norm.weight": "self_conditioning.pre_norm.weight",
    **{f"model.decoder.self_conditioning.{p}.weight": f"self_conditioning.mlp.{p}.weight"
       for p in ("gate_proj", "up_proj", "down_proj")},
    ENCODER_SCALAR: None,  # the decoder's copy is used; `select_tensors` checks they agree
}


def select_tensors(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Drop the vision tower; refuse encoder layer scalars that differ from the decoder's."""
    out = {k: v for k, v in tensors.items() if not k.startswith(DROPPED_PREFIXES)}
    for key, value in out.items():
        if key.startswith("model.encoder.language_model.layers.") and key.endswith(
                ".layer_scalar"):
            twin = key.replace("encoder.language_model.", "decoder.")
            if twin in out and not torch.equal(out[twin], value):
                raise CheckpointError(f"{where}: {key!r} differs from {twin!r}; Clover runs one "
                                      "set of weights for the encoder and the decoder")
    return out


def _refuse(text: dict[str, Any]) -> None:
    checks = [
        (not text.get("attention_bias"), "attention_bias=true"),
        (text.get("hidden_activation", "gelu_pytorch_tanh") == "gelu_pytorch_tanh",
         f"hidden_activation={text.get('hidden_activation')!r}"),
        (text.get("use_bidirectional_attention") is None,
         f"use_bidirectional_attention={text.get('use_bidirectional_attention')!r}"),
        (text.get("tie_word_embeddings", True), "tie_word_embeddings=false"),
        (bool(text.get("num_experts")), "num_experts=0 (a dense text model)"),
    ]
    for ok, what in checks:
        if not ok:
            raise CheckpointError(f"config.json: text_config {what} is not supported for "
                                  "DiffusionGemma")


def _rope(text: dict[str, Any], kind: str, default_type: str) -> dict[str, Any]:
    params = (text.get("rope_parameters") or {}).get(kind) or {}
    rope_type = params.get("rope_type", default_type)
    if rope_type != default_type or float(params.get("factor", 1.0)) != 1.0:
        raise CheckpointError(f"config.json: {kind} rope_type {rope_type!r} (factor "
                              f"{params.get('factor', 1.0)}) is not supported; DiffusionGemma "
                              f"uses {default_type!r}")
    if rope_type == "default" and float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(f"config.json: {kind} partial_rotary_factor is not supported")
    return params


def _global_shape(text: dict[str, Any], types: list[str]) -> tuple[int, int]:
    """(head dim, kv heads) of the full layers, from `per_layer_config` or the global fields."""
    per_layer = text.get("per_layer_config") or {}
    full = [str(i) for i, t in enumerate(types) if t == "full"]
    entry = next((per_layer[i] for i in full if i in per_layer), {})
    head_dim = entry.get("head_dim") or text.get("global_head_dim") or 512
    kv = entry.get("num_key_value_heads") or text.get("num_global_key_value_heads") or 0
    return int(head_dim), int(kv)


def config_from_hf(hf: dict[str, Any], name: str = "diffusion_gemma") -> ModelConfig:
    """A Clover `diffusion_gemma` config with the text model's math."""
    text = hf.get("text_config") or {}
    _refuse(text)
    layers = int(text["num_hidden_layers"])
    types = text.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                        for i in range(layers)]
    types = ["sliding" if t == "sliding_attention" else "full" for t in types]
    types[-1] = "full"  # transformers forces the last layer to full attention
    sliding = _rope(text, "sliding_attention", "default")
    full = _rope(text, "full_attention", "proportional")
    global_head_dim, global_kv = _global_shape(text, types)
    eos = first_id(text.get("eos_token_id"), 1)
    return ModelConfig(
        name=name, arch="diffusion_gemma", attention="canvas", canvas="uniform",
        vocab_size=int(text["vocab_size"]), dim=int(text["hidden_size"]), num_layers=layers,
        num_heads=int(text["num_attention_heads"]), num_kv_heads=int(text["num_key_value_heads"]),
        head_dim=int(text.get("head_dim") or 256), rope_theta=float(sliding.get("rope_theta", 1e4)),
        global_rope_theta=float(full.get("rope_theta", 1e6)),
        global_partial_rotary=float(full.get("partial_rotary_factor", 1.0)),
        layer_types=types, sliding_window=int(text.get("sliding_window") or 512),
        global_head_dim=global_head_dim, num_global_kv_heads=global_kv,
        norm_eps=float(text.get("rms_norm_eps", 1e-6)), ffn_dim=int(text["intermediate_size"]),
        num_experts=int(text["num_experts"]), num_experts_per_tok=int(text["top_k_experts"]),
        expert_ffn_dim=int(text["moe_intermediate_size"]), tie_embeddings=True,
        logit_softcap=float(text.get("final_logit_softcapping") or 30.0),
        block_size=int(hf.get("canvas_length") or 256),
        max_seq_len=int(text.get("max_position_embeddings", 131072)),
        eos_id=eos, pad_id=first_id(text.get("pad_token_id"), 0), mask_id=MASK_ID)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    raise CheckpointError(f"{cfg.name}: exporting DiffusionGemma back to transformers is not "
                          "supported (import only)")
