"""Masked-diffusion math as small pure functions: the one implementation training uses.

Forward process (noise levels, masking), the masked-diffusion loss (MDLM / LLaDA form), the
confidence-sharpening term and the attention layout of vectorised block-diffusion training.
No module state, no model calls: tensors in, tensors out. `clover.train.objectives` wires these
into one objective per attention mode; decoding needs none of them (it only reverses the process).
"""

# Shapes: B batch, L length, M noisy columns, N selected positions, V vocab

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sample_t(num: int, *, eps: float = 1e-3, gen: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> Tensor:
    """`num` noise levels t ~ U[eps, 1] (eps keeps the 1/t weight finite)."""
    return eps + (1 - eps) * torch.rand(num, generator=gen, device=device)


def sample_block_t(length: int, block_size: int, *, eps: float = 1e-3,
                   gen: torch.Generator | None = None) -> Tensor:
    """Noise levels for one row of `length` tokens: one level per block, repeated over the block's
    positions: [ceil(length / block_size) * block_size].

    Block diffusion (BD3-LM) trains every block at its own level, as decoding meets them; a
    block_size >= length gives the row a single level (MDLM / LLaDA over the whole sequence).
    """
    num_levels = -(-length // block_size)
    return sample_t(num_levels, eps=eps, gen=gen).repeat_interleave(block_size)


def mask_tokens(x0_BL: Tensor, t: Tensor, mask_id: int, *, maskable_BL: Tensor | None = None,
                u_BL: Tensor | None = None,
                gen: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Forward process q(x_t | x_0): each maskable token independently becomes [MASK] w.p. t.

    t is [B] (one level per row) or [B, L] (e.g. one level per block). u_BL holds the uniform
    draws (drawn here from `gen` when None): token i is masked where u_i < t_i.
    Returns (x_t, masked_BL).
    """
    t_BL = t[:, None].expand_as(x0_BL) if t.ndim == 1 else t
    if u_BL is None:
        u_BL = torch.rand(x0_BL.shape, generator=gen, device=x0_BL.device)
    masked_BL = u_BL < t_BL
    if maskable_BL is not None:
        masked_BL &= maskable_BL
    return torch.where(masked_BL, mask_id, x0_BL), masked_BL


def masked_diffusion_loss_sum(logits_NV: Tensor, x0_N: Tensor, t_N: Tensor) -> Tensor:
    """sum_n -log p(x0_n | x_t) / t_n over the N masked positions; fp32 whatever the logits dtype.

    Divided by the number of tokens that *could* be masked (all, or the response in SFT), this is
    the MDLM / LLaDA (eq. 3) upper bound on the negative log-likelihood per token; the training
    loop divides by that count over the whole global batch. With t = 1 it is the plain
    cross-entropy sum (the AR loss, read at shifted positions).
    """
    ce_N = F.cross_entropy(logits_NV.float(), x0_N, reduction="none")
    return (ce_N * (1.0 / t_N)).sum()


def complementary_mask(maskable_BL: Tensor, masked_BL: Tensor, t: Tensor, mask_id: int,
                       x0_BL: Tensor, eps: float = 1e-3) -> tuple[Tensor, Tensor, Tensor]:
    """The second view of complementary masking (Fast-dLLM v2): every maskable token not masked
    in the first view is masked, at level 1 - t (floored at eps), so each target is predicted in
    exactly one of the two views. Returns (x_t, masked_BL, t_BL) of the second view."""
    masked2_BL = maskable_BL & ~masked_BL
    t2_BL = (1.0 - t).clamp_min(eps)
    return torch.where(masked2_BL, mask_id, x0_BL), masked2_BL, t2_BL


def confident_entropy_sum(logits_NV: Tensor, targets_N: Tensor) -> Tensor:
    """sum over n with argmax(logits_n) == target_n of the entropy of softmax(logits_n).

    The confidence-sharpening term (dParallel, LLaDA2.0-CAP): where the model is already right,
    lowering this entropy makes it confident enough to commit in parallel.
    """
    return _confident_entropy(F.log_softmax(logits_NV.float(), -1), logits_NV, targets_N)


def _confident_entropy(logp_NV: Tensor, logits_NV: Tensor, targets_N: Tensor) -> Tensor:
    entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    right_N = logits_NV.argmax(-1) == targets_N
    return (entropy_N * right_N).sum()


def loss_and_confident_entropy(logits_NV: Tensor, x0_N: Tensor,
                               t_N: Tensor) -> tuple[Tensor, Tensor]:
    """(`masked_diffusion_loss_sum`, `confident_entropy_sum`) from one fp32 log-softmax of the
    logits (the vocabulary-wide work of a training step, done once instead of twice)."""
    logp_NV = F.log_softmax(logits_NV.float(), -1)
    ce_N = F.nll_loss(logp_NV, x0_N, reduction="none")
    return (ce_N * (1.0 / t_N)).sum(), _confident_entropy(logp_NV, logits_NV, x0_N)


def noisy_clean_visibility(pos_BL: Tensor, noisy_pos_BM: Tensor, block_size: int,
                           view_M: Tensor | None = None) -> Tensor:
    """Attention mask for the vectorised block-diffusion layout [clean x_0 (L), noisy x_t (M)].

    A clean token sees clean tokens of its own and earlier blocks; a noisy token sees noisy tokens
    of its own block and clean tokens of strictly earlier blocks. So one forward gives every noisy
    block the context it has when decoded: finished blocks exact, its own block noised. With
    `view_M` (which noised copy each noisy column belongs to: complementary masks), a noisy token
    sees only the noisy tokens of its own block in its own copy.
    Returns [B, L + M, L + M].
    """
    blk_c = torch.div(pos_BL, block_size, rounding_mode="floor")
    blk_n = torch.div(noisy_pos_BM, block_size, rounding_mode="floor")
    cc = blk_c[:, None, :] <= blk_c[:, :, None]
    cn = torch.zeros(*blk_c.shape, blk_n.shape[1], dtype=torch.bool, device=pos_BL.device)
    nc = blk_c[:, None, :] < blk_n[:, :, None]
    nn_ = blk_n[:, None, :] == blk_n[:, :, None]
    if view_M is not None:
        nn_ = nn_ & (view_M[None, None, :] == view_M[None, :, None])
    return torch.cat([torch.cat([cc, cn], 2), torch.cat([nc, nn_], 2)], 1)
