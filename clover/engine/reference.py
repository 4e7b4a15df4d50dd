"""The slow, obviously correct decoder the engine is tested against.

One request at a time, no KV cache: every step runs the model on the whole sequence so far (and,
for `full` models, the whole canvas), takes the logits of the masked positions of the active
block, and applies the same sampler and policy as the engine. Same block boundaries, same EOS
fill, same stopping rules; only the caching and batching differ.
"""

from __future__ import annotations

import torch

from clover.engine.params import SamplingParams
from clover.engine.policies import POLICIES, Proposal
from clover.engine.sampler import RowSampling, propose
from clover.model import CloverModel


@torch.inference_mode()
def reference_generate(model: CloverModel, prompt: list[int], params: SamplingParams) -> list[int]:
    """Generated ids (up to and excluding the first EOS unless ignore_eos)."""
    cfg = model.config
    causal, full = cfg.attention == "causal", cfg.attention == "full"
    shift = 1 if causal else int(cfg.shift_logits)
    bs = 1 if causal else (params.block_size or cfg.block_size if full else cfg.block_size)
    stop_ids = {cfg.eos_id, *params.stop_token_ids}
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    seq, canvas_end = list(prompt), len(prompt) + params.max_tokens
    while len(seq) - len(prompt) < params.max_tokens:
        a = len(seq)
        end = min(a + bs, canvas_end) if full else min((a // bs + 1) * bs, canvas_end)
        block = _denoise_block(model, seq, end - a, canvas_end, shift, params, gen)
        seq += block
        if any(t in stop_ids for t in block) and not params.ignore_eos:
            break
    out = seq[len(prompt):]
    if params.ignore_eos:
        return out
    first = next((j for j, t in enumerate(out) if t in stop_ids), len(out))
    return out[:first]


def _denoise_block(model, seq, length, canvas_end, shift, params, gen) -> list[int]:
    cfg, mask = model.config, model.config.mask_id
    block, steps = [mask] * length, 0
    while mask in block:
        masked = [j for j, t in enumerate(block) if t == mask]
        ids = seq + block
        if cfg.attention == "full":
            ids = ids + [mask] * (canvas_end - len(ids))
        if cfg.attention == "causal":
            ids = seq
        logits = model(torch.tensor([ids])).logits[0]
        at = [len(seq) + j - shift for j in masked]
        row = RowSampling(params.temperature, params.top_p, params.top_k, gen)
        tokens, conf, ent = propose(logits[at], [0] * len(at), [row], mask)
        left = Proposal.left_masked([params.policy], [masked], len(masked))
        p = Proposal(tokens[None], conf[None], ent[None], torch.ones(1, len(at), dtype=torch.bool),
                     torch.tensor([params.tau]), torch.tensor([params.gamma]),
                     torch.tensor([max(params.steps_per_block - steps, 1)]),
                     left_masked_BM=None if left is None else torch.tensor(left))
        commit = POLICIES[params.policy]().select(p)[0]
        for j, t, c in zip(masked, tokens.tolist(), commit.tolist(), strict=True):
            if c:
                block[j] = t
        _eos_fill(block, {cfg.eos_id, *params.stop_token_ids}, mask, cfg.eos_id)
        steps += 1
    return block


def _eos_fill(block: list[int], stop_ids: set[int], mask: int, eos: int) -> None:
    first = next((j for j, t in enumerate(block) if t in stop_ids), None)
    if first is not None:
        for j in range(first + 1, len(block)):
            if block[j] == mask:
                block[j] = eos
