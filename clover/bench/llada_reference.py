"""LLaDA's published `generate` (greedy, low-confidence remasking), written out for any model.

The reference decoder that Clover's engine is compared against on LLaDA checkpoints, in tests
(same tokens) and in `benchmarks/dllm_vs_transformers.py` (same tokens, time ratio). It knows
nothing about Clover: `logits_fn(ids_BL) -> logits_BLV` is any model (transformers' own classes
in practice). Prompts in a batch have one length, as in LLaDA's script.
"""

# Shapes: B batch, L canvas length, V vocab

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def transfer_counts(block_length: int, steps: int) -> list[int]:
    """How many positions each step of a block commits: equal shares, the remainder first."""
    return [block_length // steps + (i < block_length % steps) for i in range(steps)]


@torch.inference_mode()
def llada_generate(logits_fn: Callable[[Tensor], Tensor], prompts: list[list[int]], *,
                   mask_id: int, gen_length: int, block_length: int, steps: int) -> list[list[int]]:
    """Generated ids per prompt: the canvas is prompt + gen_length masks, decoded block by block
    (steps / num_blocks steps each); each step runs the whole canvas and commits, inside the
    current block, the masked positions whose argmax token is most probable."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("llada_generate: prompts of one batch must have one length")
    if gen_length % block_length or steps % (gen_length // block_length):
        raise ValueError("gen_length must be a multiple of block_length, and steps of the "
                         "number of blocks")
    start = len(prompts[0])
    x_BL = torch.tensor([p + [mask_id] * gen_length for p in prompts])
    num_blocks = gen_length // block_length
    for b in range(num_blocks):
        end = start + (b + 1) * block_length
        for k in transfer_counts(block_length, steps // num_blocks):
            probs_BLV = logits_fn(x_BL).float().softmax(-1)
            p_BL, x0_BL = probs_BLV.max(-1)
            conf_BL = torch.where(x_BL == mask_id, p_BL, -torch.inf)
            conf_BL[:, end:] = -torch.inf
            chosen_Bk = conf_BL.topk(k, dim=-1).indices
            x_BL.scatter_(1, chosen_Bk, x0_BL.gather(1, chosen_Bk))
    return x_BL[:, start:].tolist()


# LLaDA-8B's published module names for a Llama layer's parts (its OLMo-style layout)
LLADA_NAMES = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj",
               "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm",
               "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}
_LLADA_TOP = {"model.embed_tokens.weight": "model.transformer.wte.weight",
              "model.norm.weight": "model.transformer.ln_f.weight",
              "lm_head.weight": "model.transformer.ff_out.weight"}


def llama_as_llada(model, *, eos_id: int, mask_id: int) -> tuple[dict, dict]:
    """(config.json, tensors): an untied transformers Llama's weights under LLaDA-8B's published
    key names (`model.transformer.blocks.N.*`, `wte`, `ln_f`, `ff_out`) and a config with
    LLaDA's published field names for the same shapes, so that `clover convert` can be checked
    against the Llama it came from (run with is_causal=False, that is LLaDA's math)."""
    tensors = {}
    for key, value in model.state_dict().items():
        if key.startswith("model.layers."):
            layer, rest = key[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            key = f"model.transformer.blocks.{layer}.{LLADA_NAMES[module]}.{kind}"
        else:
            key = _LLADA_TOP[key]
        tensors[key] = value.clone()
    c = model.config
    config = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": c.hidden_size,
              "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
              "n_layers": c.num_hidden_layers, "mlp_hidden_size": c.intermediate_size,
              "mlp_ratio": 4, "vocab_size": c.vocab_size, "embedding_size": c.vocab_size,
              "rope": True, "rope_theta": c.rope_parameters["rope_theta"],
              "rms_norm_eps": c.rms_norm_eps, "block_type": "llama", "layer_norm_type": "rms",
              "activation_type": "silu", "alibi": False, "include_bias": False,
              "include_qkv_bias": False, "weight_tying": False, "attention_layer_norm": False,
              "max_sequence_length": c.max_position_embeddings, "eos_token_id": eos_id,
              "pad_token_id": eos_id, "mask_token_id": mask_id}
    return config, tensors
