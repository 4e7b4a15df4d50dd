"""Training objectives: one per attention mode, each returning a loss *sum* over the batch.

`block`: masked block diffusion. Every block is noised at its own level and predicted from its
clean earlier blocks plus its own noised copy; `block_diffusion` does all blocks in one forward
(clean x_0 and noisy x_t side by side with a custom mask), `block_diffusion_reference` one block
at a time with the model's own block mask, and a test keeps them equal. `full`: masked diffusion
over the whole sequence. `causal`: next-token loss. Sums (not means) let the loop normalise by the
target count of the whole global batch, so gradient accumulation and DDP give the same update as
one big batch. Noise is drawn per row from the row's own seed, independent of batch composition.
The math itself (noise levels, masking, the weighted loss) is `clover.model.diffusion`'s.
"""

# Shapes: B batch, L length, M noisy columns, V vocab, N selected positions

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.model.diffusion import (
    complementary_mask,
    loss_and_confident_entropy,
    mask_tokens,
    masked_diffusion_loss_sum,
    noisy_clean_visibility,
    sample_block_t,
)
from clover.model.moe import MoEStats
from clover.model.transformer import KVCache, visibility
from clover.train.data import Batch

if TYPE_CHECKING:
    from clover.train.distill import Teacher


@dataclass
class Noise:
    xt_BL: Tensor  # x_t: targets replaced by the mask token where masked
    masked_BL: Tensor
    t_BL: Tensor  # noise level of each position (per block for block models)


@dataclass
class LossOutput:
    loss_sum: Tensor  # sum over targets of the (1/t-weighted) cross-entropy
    moe: MoEStats | None
    # sum over targets the model already gets right (argmax == target) of the predicted
    # distribution's entropy: the confidence-sharpening term (dParallel, LLaDA2.0-CAP)
    confident_entropy_sum: Tensor | None = None
    # diffusion models trained with an AR term (`ObjectiveModule(ar_coef=...)`): the sum over
    # targets of the next-token cross-entropy under a causal mask (unweighted)
    ar_sum: Tensor | None = None
    # block diffusion with a teacher (`clover.train.distill`): the sum of KL(teacher || model)
    # over the positions where both read the same context (each block's first masked one)
    distill_sum: Tensor | None = None


def draw_noise(batch: Batch, config: ModelConfig, eps: float = 1e-3,
               suffix: float = 0.0) -> Noise:
    """Per row: t (one per block for `block`, one per row for `full`), then a mask draw per token.

    Each row uses its own generator (seed_B), drawing a count that depends only on the row's own
    length, so the same example at the same step gets the same noise in any batch or process.
    `suffix` (block models): the share of blocks whose masked tokens are the block's last ones
    (`order_block_draws`) instead of anywhere in it.
    """
    B, L = batch.ids_BL.shape
    block_size = config.block_size if config.attention == "block" else L
    t_BL = torch.ones(B, L)
    u_BL = torch.ones(B, L)  # padding never masked
    for b in range(B):
        n = int(batch.length_B[b])
        gen = torch.Generator().manual_seed(int(batch.seed_B[b]))
        t_row = sample_block_t(n, block_size, eps=eps, gen=gen)[:L]
        t_BL[b, :t_row.numel()] = t_row
        u_BL[b, :n] = torch.rand(n, generator=gen)
        if suffix:
            u_BL[b, :n] = order_block_draws(u_BL[b, :n], block_size, suffix, gen)
    device = batch.ids_BL.device
    t_BL = t_BL.to(device)
    xt_BL, masked_BL = mask_tokens(batch.ids_BL, t_BL, config.mask_id,
                                   maskable_BL=batch.target_BL, u_BL=u_BL.to(device))
    return Noise(xt_BL, masked_BL, t_BL)


def order_block_draws(u_n: Tensor, block_size: int, share: float,
                      gen: torch.Generator) -> Tensor:
    """The uniform mask draws of one row with a `share` of its blocks (chosen with `gen`) sorted
    to fall along the block: a token is masked where its draw is below the block's level t, so
    such a block masks a suffix of itself, as many tokens as its unsorted draws would have
    masked. That is the state left-to-right decoding (the `prefix` policy) meets: the block's
    first tokens decided, the rest masked."""
    n = u_n.numel()
    num_blocks = -(-n // block_size)
    u_KB = torch.full((num_blocks * block_size,), float("-inf"))
    u_KB[:n] = u_n
    u_KB = u_KB.view(num_blocks, block_size)
    ordered_KB = u_KB.sort(-1, descending=True).values  # the row's padding (-inf) stays last
    pick_K = torch.rand(num_blocks, generator=gen) < share
    return torch.where(pick_K[:, None], ordered_KB, u_KB).reshape(-1)[:n]


def _selected_loss(logits_NV: Tensor, src_BS: Tensor, batch: Batch, noise: Noise | list[Noise],
                   moe: MoEStats | None) -> LossOutput:
    """Loss for logits taken where src_BS >= 0; src holds the flat index of the target predicted
    (view v of several noised views at v * B * L + flat index: their sums are averaged)."""
    views = noise if isinstance(noise, list) else [noise]
    flat = src_BS[src_BS >= 0]
    targets_N = batch.ids_BL.reshape(-1).repeat(len(views))[flat]
    t_N = torch.cat([v.t_BL.reshape(-1) for v in views])[flat]
    n = len(views)
    loss, entropy = loss_and_confident_entropy(logits_NV, targets_N, t_N)
    return LossOutput(loss / n, moe, entropy / n)


def _flat_index(masked_BL: Tensor) -> Tensor:
    B, L = masked_BL.shape
    return torch.arange(B * L, device=masked_BL.device).view(B, L)


# ---- block diffusion ----------------------------------------------------------------------------

def block_diffusion(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise, *,
                    share_prefix: bool = True, prefix_grad: bool = True,
                    complementary: bool = False, prefix_memo: PrefixMemo | None = None,
                    teacher: Teacher | None = None) -> LossOutput:
    """All blocks in one forward over [x_0 (L columns), x_t of the blocks holding a mask (M)].

    Noisy copies of blocks with no masked token anywhere in the batch are left out: nothing reads
    them. With shifted logits, target i is read at i - 1: the noisy copy when i - 1 is in the same
    block, else the clean copy (the last token of the finished block before it). A context prefix
    common to every row (SFT system prompt and tools) is run once and shared through a KV cache
    (without gradient when `prefix_grad` is off). `complementary` adds a second noisy copy masked
    exactly where the first is not (`complementary_mask`): every target gets a loss, the clean
    copy is computed once for both, and the loss is the mean of the two views'. A `teacher`
    adds `distill_sum` (`clover.train.distill.Teacher.kl`).
    """
    out, src_BS, cut, views = _block_forward(model, config, batch, noise, share_prefix,
                                             prefix_grad, complementary, prefix_memo)
    result = _selected_loss(out.logits, src_BS, cut, views, out.moe)
    if teacher is not None:
        result.distill_sum = teacher.kl(out.logits, src_BS, cut, views, config, batch)
    return result


def masked_predictions(model: nn.Module, config: ModelConfig, batch: Batch,
                       noise: Noise, memo: PrefixMemo | None = None
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The logits `block_diffusion` scores, one row per masked target of `noise` (one view, the
    shared prompt run once, or reused from `memo`), with each row's batch row, position and
    target token."""
    out, src_BS, batch, _ = _block_forward(model, config, batch, noise, True, False, False, memo)
    flat = src_BS[src_BS >= 0]
    L = batch.ids_BL.shape[1]
    return (out.logits, flat // L, batch.pos_BL.reshape(-1)[flat],
            batch.ids_BL.reshape(-1)[flat])


def _block_forward(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise,
                   share_prefix: bool, prefix_grad: bool, complementary: bool,
                   prefix_memo: PrefixMemo | None):
    """`block_diffusion`'s forward: (model output with its MoE stats merged, src_BS, the batch
    without the shared prefix, the noised views)."""
    P = shared_prefix_len(batch, config) if share_prefix else 0
    cache, prefix_moe, batch, noise = split_prefix(model, config, batch, noise, P, prefix_grad,
                                                   copies=3 if complementary else 2,
                                                   memo=prefix_memo)
    B, L = batch.ids_BL.shape
    bs = config.block_size
    views = [noise]
    if complementary:
        views.append(Noise(*complementary_mask(batch.target_BL, noise.masked_BL, noise.t_BL,
                                               config.mask_id, batch.ids_BL)))
    blk_L = batch.pos_BL[0] // bs
    ids, pos, valid, view_M, picks = [batch.ids_BL], [batch.pos_BL], [batch.valid_BL], [], []
    start = L
    for v, view in enumerate(views):
        noisy_blocks = torch.unique(blk_L[view.masked_BL.any(0)])
        keep_L = torch.isin(blk_L, noisy_blocks)
        noisy_col_L = start + torch.cumsum(keep_L, 0) - 1  # column of each kept noisy copy
        ids.append(view.xt_BL[:, keep_L])
        pos.append(batch.pos_BL[:, keep_L])
        valid.append(batch.valid_BL[:, keep_L])
        view_M.append(torch.full((int(keep_L.sum()),), v, device=keep_L.device))
        b_N, i_N = view.masked_BL.nonzero(as_tuple=True)
        col_N = noisy_col_L[i_N]
        if config.shift_logits:
            same_block = (batch.pos_BL[b_N, i_N] % bs) != 0
            col_N = torch.where(same_block, noisy_col_L[i_N - 1], i_N - 1)
        picks.append((b_N, col_N, v * B * L + _flat_index(view.masked_BL)[b_N, i_N]))
        start += int(keep_L.sum())
    ids, pos, valid = torch.cat(ids, 1), torch.cat(pos, 1), torch.cat(valid, 1)
    attn = noisy_clean_visibility(batch.pos_BL, pos[:, L:], bs,
                                  torch.cat(view_M) if complementary else None)
    src_BS = torch.full_like(ids, -1)
    for b_N, col_N, idx_N in picks:  # a target is masked in one view, so no column is shared
        src_BS[b_N, col_N] = idx_N
    if cache is not None:  # every new token sees the whole prefix (earlier blocks)
        attn = torch.cat([attn.new_ones(B, attn.shape[1], P), attn], 2)[:, :, :_cache_end(P, valid)]
    out = model(ids, pos, cache=cache, valid_BL=valid, logits_mask_BL=src_BS >= 0,
                attn_mask_BLS=attn)
    out.moe = _merge_moe(prefix_moe, P, out.moe, int(valid.sum()))
    return out, src_BS, batch, views


def block_diffusion_reference(model: nn.Module, config: ModelConfig, batch: Batch,
                              noise: Noise) -> LossOutput:
    """Slow and obvious: for each block k, run [x_0 of blocks < k, x_t of block k] with the
    model's own block-causal mask and score block k's masked positions."""
    bs = config.block_size
    shift = int(config.shift_logits)
    total = batch.ids_BL.new_zeros((), dtype=torch.float32)
    for start in range(0, batch.ids_BL.shape[1], bs):
        end = start + bs
        ids = torch.cat([batch.ids_BL[:, :start], noise.xt_BL[:, start:end]], 1)
        logits_BLV = model(ids, batch.pos_BL[:, :end], valid_BL=batch.valid_BL[:, :end]).logits
        for b, i in noise.masked_BL[:, start:end].nonzero().tolist():
            j = start + i
            total = total + masked_diffusion_loss_sum(logits_BLV[b, j - shift][None],
                                                      batch.ids_BL[b, j][None],
                                                      noise.t_BL[b, j][None])
    return LossOutput(total, None)


# ---- full-sequence diffusion and AR -------------------------------------------------------------

def full_diffusion(model: nn.Module, config: ModelConfig, batch: Batch,
                   noise: Noise) -> LossOutput:
    """Masked diffusion over the whole sequence (LLaDA / Dream); shifted logits read i - 1."""
    shift = int(config.shift_logits)
    src_BL = torch.full_like(batch.ids_BL, -1)
    b_N, i_N = noise.masked_BL.nonzero(as_tuple=True)
    src_BL[b_N, i_N - shift] = _flat_index(noise.masked_BL)[b_N, i_N]
    out = model(noise.xt_BL, batch.pos_BL, valid_BL=batch.valid_BL, logits_mask_BL=src_BL >= 0)
    return _selected_loss(out.logits, src_BL, batch, noise, out.moe)


def causal(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise, *,
           share_prefix: bool = True, prefix_grad: bool = True,
           prefix_memo: PrefixMemo | None = None) -> LossOutput:
    """Next-token loss on the targets: token i is read from the logits at i - 1 (no noise).

    A `block` or `full` model gets the same loss under a causal mask in place of its own (the AR
    term of `ObjectiveModule(ar_coef=...)`); a shared prefix is then run under the causal mask
    too (its own would let a prefix token see the rest of its block)."""
    out, src_BL, cut, tail = causal_forward(model, config, batch, noise, share_prefix,
                                            prefix_grad, prefix_memo)
    return _selected_loss(out.logits, src_BL, cut, tail, out.moe)


def causal_forward(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise,
                   share_prefix: bool = True, prefix_grad: bool = True,
                   prefix_memo: PrefixMemo | None = None):
    """`causal`'s forward: (output with MoE stats merged, src_BL: the flat index of the target
    each logits row predicts, the batch and noise without the shared prefix)."""
    own = config.attention == "causal"
    P = shared_prefix_len(batch, config, first=1) if share_prefix else 0
    cache, prefix_moe, batch, noise = split_prefix(model, config, batch, noise, P, prefix_grad,
                                                   copies=1, causal_prefix=not own,
                                                   memo=prefix_memo)
    causal_mask = None
    if not own:
        causal_mask = visibility("causal", 1, batch.pos_BL, batch.pos_BL)
        if cache is not None:  # every token sees the whole prefix
            causal_mask = torch.cat([causal_mask.new_ones(*causal_mask.shape[:2], P),
                                     causal_mask], 2)[:, :, :_cache_end(P, batch.valid_BL)]
    src_BL = torch.full_like(batch.ids_BL, -1)
    b_N, i_N = batch.target_BL.nonzero(as_tuple=True)
    assert bool((i_N > 0).all()), "causal targets need their previous token in the batch"
    src_BL[b_N, i_N - 1] = _flat_index(batch.target_BL)[b_N, i_N]
    out = model(batch.ids_BL, batch.pos_BL, cache=cache, valid_BL=batch.valid_BL,
                logits_mask_BL=src_BL >= 0, attn_mask_BLS=causal_mask)
    out.moe = _merge_moe(prefix_moe, P, out.moe, batch.num_tokens)
    return out, src_BL, batch, noise


# ---- shared context prefix ---------------------------------------------------------------------

def shared_prefix_len(batch: Batch, config: ModelConfig, first: int | None = None) -> int:
    """Length of the context prefix every row shares, cut to a block boundary (0: none).

    It holds no target and, when token i is read at i - 1 (`first` = 1; default: the config's
    reading), not the token before the first target. `full` attention lets the prefix see the
    rest of the row, so nothing is shared there.
    """
    if config.attention == "full" or batch.ids_BL.shape[0] < 2:
        return 0
    ids = batch.ids_BL
    same_L = (ids == ids[:1]).all(0) & batch.valid_BL.all(0)
    n = int(same_L.int().cumprod(0).sum())
    first = int(batch.target_BL.any(0).int().argmax()) - (
        first_target(config) if first is None else first)
    n = min(n, first)
    return max(n, 0) // config.block_size * config.block_size


def split_prefix(model: nn.Module, config: ModelConfig, batch: Batch, noise: Noise, P: int,
                 grad: bool = True, copies: int = 2, causal_prefix: bool = False,
                 memo: PrefixMemo | None = None):
    """Run the first P tokens once (row 0; under a causal mask with `causal_prefix`, else the
    model's own) and return (cache holding their keys and values for every row, with gradient
    unless `grad` is off, and room for `copies` copies of the rest; prefix MoE stats; the batch
    and noise from position P on). Without gradient a `memo` reuses the last such forward."""
    if P == 0:
        return None, None, batch, noise
    B, L = batch.ids_BL.shape
    device = batch.ids_BL.device
    pos_1P = batch.pos_BL[:1, :P]
    grad = grad and torch.is_grad_enabled()

    def run() -> tuple[KVCache, MoEStats | None]:
        one = KVCache(config, 1, P, device=device)
        mask = visibility("causal", 1, pos_1P, pos_1P) if causal_prefix else None
        with torch.set_grad_enabled(grad):
            out = model(batch.ids_BL[:1, :P], pos_1P, cache=one, attn_mask_BLS=mask,
                        logits_mask_BL=torch.zeros(1, P, dtype=torch.bool, device=device))
        return one, out.moe

    one, moe = (run() if grad or memo is None
                else memo.get(model, (causal_prefix, batch.ids_BL[0, :P], pos_1P), run))
    room = P + copies * (L - P)  # the prefix, then clean + noisy copies of the rest
    cache = KVCache(config, B, room, device=device)
    for layer in range(config.num_layers):
        cache.k[layer] = _spread(one.k[layer], B, room - P)
        cache.v[layer] = _spread(one.v[layer], B, room - P)
    for layer in range(len(one.h)):  # token_conv models: the prefix's convolution inputs
        cache.h[layer] = _spread(one.h[layer], B, room - P)
    cache.pos_BS[:, :P] = batch.pos_BL[:1, :P]
    cache.valid_BS[:, :P] = True
    cache.length_B[:] = P
    cache.end = P
    rest = batch.from_position(P)
    tail = Noise(noise.xt_BL[:, P:], noise.masked_BL[:, P:], noise.t_BL[:, P:])
    return cache, moe, rest, tail


class PrefixMemo:
    """The last gradient-free prefix forward (row 0's keys and values, its MoE stats), reused
    while the prompt, every parameter (storage and version) and the autocast and train/eval
    state are unchanged: the micro-batches of one optimizer step share the system prompt, and
    it then runs once per step instead of once per micro-batch."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.value: tuple[KVCache, MoEStats | None] | None = None

    def get(self, model: nn.Module, prompt: tuple, run: Callable[[], tuple]) -> tuple:
        flag, ids, pos = prompt
        params = list(model.parameters())
        device = ids.device.type
        key = (flag, tuple(ids.tolist()), tuple(pos.flatten().tolist()), model.training,
               torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
               tuple(p.data_ptr() for p in params), tuple(p._version for p in params))
        if key != self.key or self.value is None:
            self.key, self.value = key, run()
        return self.value


def _spread(kv_1GPD: Tensor, B: int, room: int) -> Tensor:
    """The prefix's keys for every row, followed by empty slots (a new tensor: autograd-safe)."""
    free = kv_1GPD.new_zeros(B, kv_1GPD.shape[1], room, kv_1GPD.shape[3])
    return torch.cat([kv_1GPD.expand(B, -1, -1, -1), free], 2)


def _cache_end(P: int, valid_BS: Tensor) -> int:
    """Slots attention reads after writing the new tokens: up to the last valid one."""
    cols = valid_BS.any(0).nonzero()
    return P + (int(cols.max()) + 1 if cols.numel() else 0)


def _merge_moe(prefix: MoEStats | None, n_prefix: int, rest: MoEStats | None,
               n_rest: int) -> MoEStats | None:
    """Routing stats of the prefix forward and the main forward: counts add, aux is the
    token-weighted mean."""
    if prefix is None or rest is None:
        return rest
    aux = (prefix.aux_loss * n_prefix + rest.aux_loss * n_rest) / max(n_prefix + n_rest, 1)
    return MoEStats(aux_loss=aux, counts_LE=prefix.counts_LE + rest.counts_LE)


Objective = Callable[[nn.Module, ModelConfig, Batch, Noise], LossOutput]

OBJECTIVES: dict[str, Objective] = {
    "block": block_diffusion,
    "full": full_diffusion,
    "causal": causal,
}


class ObjectiveModule(nn.Module):
    """A model and its objective as one module: DDP then sees one forward per backward, however
    many model calls the objective makes (shared prefix, reference loops).

    `ar_coef > 0` (diffusion models only) adds a second forward on the clean tokens under a
    causal mask (`ar_objective`: `causal`, sharing the prompt prefix as the main objective does)
    and returns its next-token loss as `ar_sum`, for the loop to add with that weight: an
    AR-initialised model keeps practising what it knew while it adapts. Its routing stats are
    left out (the diffusion forward drives MoE balancing)."""

    def __init__(self, model: nn.Module, objective: Objective, ar_coef: float = 0.0,
                 ar_objective: Objective | None = None) -> None:
        super().__init__()
        self.model, self.objective, self.ar_coef = model, objective, ar_coef
        self.ar_objective = ar_objective or causal

    def forward(self, batch: Batch, noise: Noise) -> LossOutput:
        config = self.model.config
        out = self.objective(self.model, config, batch, noise)
        if self.ar_coef and config.attention != "causal":
            out.ar_sum = self.ar_objective(self.model, config, batch,
                                           clean_noise(batch)).loss_sum
        return out


def clean_noise(batch: Batch) -> Noise:
    """No noise: clean tokens, nothing masked, t = 1 (the weight of every target is 1)."""
    ones = torch.ones_like(batch.ids_BL, dtype=torch.float32)
    return Noise(batch.ids_BL, torch.zeros_like(batch.target_BL), ones)


def batch_noise(batch: Batch, config: ModelConfig, eps: float = 1e-3,
                suffix: float = 0.0) -> Noise:
    """Noise for the config's objective (causal models train on clean tokens, t = 1)."""
    if config.attention == "causal":
        return clean_noise(batch)
    return draw_noise(batch, config, eps, suffix)


def first_target(config: ModelConfig) -> int:
    """1 when token i is predicted from position i - 1 (AR, or shifted diffusion logits)."""
    return 1 if config.attention == "causal" or config.shift_logits else 0
