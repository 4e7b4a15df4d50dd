"""Training a block-diffusion adapter as the drafter of self-speculative decoding.

In `clover.engine.speculative` the AR model (the verifier) runs every clean row and the diffusion
adapter only the mask rows, which see the verifier's keys of every clean token before them and
each other: the rest of the current block, after its first unknown position. `draft_block` trains
exactly that: per row, the verifier runs the clean sequence once without gradient (its shared
system prompt once per run, `PrefixMemo`: it never changes); the noise (suffix masks: each block
masked from some position to its end, `--suffix-masks 1`) places mask rows, each of which sees
the clean tokens before its block's first masked position and the mask rows of its block; the
loss is the cross-entropy of each mask row's draft of the next position in its block (shifted
prediction). A block's first masked position is read from a clean row, the verifier's, so it
has no draft loss: the AR model writes it in decoding.
"""

# Shapes: B batch, L length (after the shared prefix), M mask rows per row, S key slots, N drafts

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.model.transformer import KVCache
from clover.train.data import Batch
from clover.train.objectives import (
    LossOutput,
    Noise,
    PrefixMemo,
    clean_noise,
    shared_prefix_len,
    split_prefix,
)


class Verifier:
    """A frozen causal model whose clean keys the drafter reads (`draft_block(verifier=...)`)."""

    def __init__(self, model: nn.Module) -> None:
        if model.config.attention != "causal":
            raise ValueError(f"a verifier is a causal (AR) model, not attention "
                             f"{model.config.attention!r}")
        self.model = model.eval().requires_grad_(False)
        self.memo = PrefixMemo()

    @torch.no_grad()
    def clean_cache(self, batch: Batch, P: int) -> tuple[KVCache, Batch]:
        """(a cache holding the verifier's keys of every clean token at slot = position, with
        room for as many mask rows again; the batch from position P on)."""
        B, L = batch.ids_BL.shape
        cfg = self.model.config
        cache, _, rest, _ = split_prefix(self.model, cfg, batch, clean_noise(batch), P,
                                         grad=False, copies=2, memo=self.memo)
        if cache is None:
            cache, rest = KVCache(cfg, B, 2 * L, device=batch.ids_BL.device), batch
        self.model(rest.ids_BL, rest.pos_BL, cache=cache, valid_BL=rest.valid_BL,
                   logits_mask_BL=torch.zeros_like(rest.valid_BL))
        cache.end = L
        return cache, rest


def draft_block(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise, *,
                verifier: Verifier) -> LossOutput:
    """Sum over drafts of the cross-entropy (see the module docstring); the noise must mask a
    suffix of each block (`batch_noise(..., suffix=1.0)`)."""
    P = shared_prefix_len(batch, config)
    cache, rest = verifier.clean_cache(batch, P)
    masked_BL = noise.masked_BL[:, P:]
    B, L = masked_BL.shape
    bs, device = config.block_size, masked_BL.device
    b_N, i_N = masked_BL.nonzero(as_tuple=True)  # row-major: each row's columns in order
    if b_N.numel() == 0:
        return LossOutput(_zero(model), None)
    col_N = (masked_BL.long().cumsum(1) - 1)[b_N, i_N]
    M = int(col_N.max()) + 1
    q_N = rest.pos_BL[b_N, i_N]
    blk_N = q_N // bs
    # the first masked position of each mask row's block: what the verifier's clean rows end at
    n_blocks = int(rest.pos_BL.max()) // bs + 1
    first_BK = torch.full((B * n_blocks,), 1 << 40, dtype=torch.long, device=device)
    first_BK = first_BK.scatter_reduce(0, b_N * n_blocks + blk_N, q_N, "amin").view(B, n_blocks)
    ids_BM = torch.full((B, M), config.mask_id, dtype=torch.long, device=device)
    pos_BM = torch.zeros(B, M, dtype=torch.long, device=device)
    valid_BM = torch.zeros(B, M, dtype=torch.bool, device=device)
    blk_BM = torch.full((B, M), -1, dtype=torch.long, device=device)
    pos_BM[b_N, col_N], valid_BM[b_N, col_N], blk_BM[b_N, col_N] = q_N, True, blk_N
    first_BM = first_BK.gather(1, blk_BM.clamp(min=0))
    clean_pos_BS = cache.pos_BS[:, :P + L]
    vis_BMS = torch.cat([
        (clean_pos_BS[:, None, :] < first_BM[:, :, None]) & cache.valid_BS[:, None, :P + L],
        (blk_BM[:, :, None] == blk_BM[:, None, :]) & valid_BM[:, None, :]], 2)
    # a mask row drafts the next position when that one is masked in the same block
    nxt_N = (i_N + 1).clamp(max=L - 1)
    has_N = (i_N + 1 < L) & masked_BL[b_N, nxt_N] & (rest.pos_BL[b_N, nxt_N] % bs != 0)
    sel_BM = torch.zeros(B, M, dtype=torch.bool, device=device)
    sel_BM[b_N[has_N], col_N[has_N]] = True
    out = model(ids_BM, pos_BM, cache=cache, slot_B=torch.full((B,), P + L, device=device),
                valid_BL=valid_BM, logits_mask_BL=sel_BM, attn_mask_BLS=vis_BMS)
    targets_N = rest.ids_BL[b_N[has_N], nxt_N[has_N]]
    # as the decoder drafts: over the verifier's vocabulary, never the mask token
    logits = out.logits.float()[:, :verifier.model.config.vocab_size]
    if config.mask_id is not None and config.mask_id < logits.shape[-1]:
        logits[:, config.mask_id] = float("-inf")
    loss = F.cross_entropy(logits, targets_N, reduction="sum")
    return LossOutput(loss, None)


def _zero(model: nn.Module) -> Tensor:
    """A zero loss that still reaches every trainable parameter (backward stays valid)."""
    return sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)
