"""Masked-diffusion math as small pure functions, shared by training and decoding.

Forward process, the masked-diffusion loss (MDLM / LLaDA form), response-only masking for SFT and
the autoregressive loss. No module state, no model calls: tensors in, tensors out.
"""

# Shapes: B batch, L length, V vocab

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sample_t(batch: int, *, eps: float = 1e-3, gen: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> Tensor:
    """Noise levels t ~ U[eps, 1], one per row (eps keeps the 1/t weight finite)."""
    return eps + (1 - eps) * torch.rand(batch, generator=gen, device=device)


def mask_tokens(x0_BL: Tensor, t: Tensor, mask_id: int, *, maskable_BL: Tensor | None = None,
                gen: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Forward process q(x_t | x_0): each maskable token independently becomes [MASK] w.p. t.

    t is [B] (one level per row) or [B, L] (e.g. one level per block). Returns (x_t, masked_BL).
    """
    t_BL = t[:, None].expand_as(x0_BL) if t.ndim == 1 else t
    u_BL = torch.rand(x0_BL.shape, generator=gen, device=x0_BL.device)
    masked_BL = u_BL < t_BL
    if maskable_BL is not None:
        masked_BL &= maskable_BL
    return torch.where(masked_BL, mask_id, x0_BL), masked_BL


def masked_diffusion_loss(logits_BLV: Tensor, x0_BL: Tensor, masked_BL: Tensor, t: Tensor,
                          num_tokens: int | Tensor) -> Tensor:
    """L = (1 / num_tokens) * sum_{masked i} -log p(x0_i | x_t) / t_i.

    The 1/t weight makes this an upper bound on the negative log-likelihood (MDLM, LLaDA eq. 3).
    num_tokens is the count of tokens that *could* be masked (all, or the response in SFT), so the
    loss is per token and independent of how many happened to be masked.
    """
    t_BL = t[:, None].expand_as(x0_BL) if t.ndim == 1 else t
    ce = F.cross_entropy(logits_BLV[masked_BL].float(), x0_BL[masked_BL], reduction="none")
    return (ce / t_BL[masked_BL]).sum() / max(float(num_tokens), 1.0)


def response_mask(prompt_len_B: Tensor, length: int) -> Tensor:
    """SFT: True on response positions (>= the row's prompt length), which alone may be masked."""
    pos_L = torch.arange(length, device=prompt_len_B.device)
    return pos_L[None, :] >= prompt_len_B[:, None]


def ar_loss(logits_BLV: Tensor, ids_BL: Tensor, loss_mask_BL: Tensor | None = None) -> Tensor:
    """Next-token loss: mean over positions i of -log p(x_{i+1} | x_<=i), over counted targets.

    loss_mask_BL marks which *target* tokens count (e.g. response only in SFT).
    """
    logits = logits_BLV[:, :-1].float()
    targets = ids_BL[:, 1:]
    ce_BL = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    if loss_mask_BL is None:
        return ce_BL.mean()
    keep = loss_mask_BL[:, 1:].to(ce_BL.dtype)
    return (ce_BL * keep).sum() / keep.sum().clamp_min(1.0)


def sample_block_t(pos_BL: Tensor, block_size: int, *, eps: float = 1e-3,
                   gen: torch.Generator | None = None) -> Tensor:
    """One noise level per block (block = pos // block_size), broadcast to its positions: [B, L].

    Block diffusion (BD3-LM) trains every block at its own level, as decoding meets them.
    """
    block_BL = torch.div(pos_BL, block_size, rounding_mode="floor")
    num_blocks = int(block_BL.max()) + 1 if block_BL.numel() else 1
    t_BN = sample_t(pos_BL.shape[0] * num_blocks, eps=eps, gen=gen, device=pos_BL.device)
    return t_BN.view(-1, num_blocks).gather(1, block_BL)


def noisy_clean_visibility(pos_BL: Tensor, noisy_pos_BM: Tensor, block_size: int) -> Tensor:
    """Attention mask for the vectorised block-diffusion layout [clean x_0 (L), noisy x_t (M)].

    A clean token sees clean tokens of its own and earlier blocks; a noisy token sees noisy tokens
    of its own block and clean tokens of strictly earlier blocks. So one forward gives every noisy
    block the context it has when decoded: finished blocks exact, its own block noised.
    Returns [B, L + M, L + M].
    """
    blk_c = torch.div(pos_BL, block_size, rounding_mode="floor")
    blk_n = torch.div(noisy_pos_BM, block_size, rounding_mode="floor")
    cc = blk_c[:, None, :] <= blk_c[:, :, None]
    cn = torch.zeros(*blk_c.shape, blk_n.shape[1], dtype=torch.bool, device=pos_BL.device)
    nc = blk_c[:, None, :] < blk_n[:, :, None]
    nn_ = blk_n[:, None, :] == blk_n[:, :, None]
    return torch.cat([torch.cat([cc, cn], 2), torch.cat([nc, nn_], 2)], 1)
