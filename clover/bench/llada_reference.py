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
