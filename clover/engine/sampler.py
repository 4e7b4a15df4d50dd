"""Turn logits at masked positions into proposals: a token, its probability and the entropy.

Greedy at temperature 0; otherwise temperature, top-k and top-p, sampled with each request's own
seeded generator so a request's draws never depend on its batch neighbours. The mask token is
never proposed. Grammar masks, when present, are applied to the logits before this runs.
"""

# Shapes: N selected positions, V vocab

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class RowSampling:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None


def propose(logits_NV: Tensor, row_of: list[int], rows: list[RowSampling],
            mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens_N, conf_N, entropy_N) for positions whose request is rows[row_of[n]]."""
    logits_NV = logits_NV.float()
    logits_NV[:, mask_id] = float("-inf")
    if all(r.temperature == 0 for r in rows):
        logp_NV = torch.log_softmax(logits_NV, -1)
        conf_logp_N, tokens_N = logp_NV.max(-1)
        return tokens_N, conf_logp_N.exp(), _entropy(logp_NV)
    temp_N = logits_NV.new_tensor([rows[i].temperature or 1.0 for i in row_of])
    logits_NV = _filter(logits_NV / temp_N[:, None], row_of, rows)
    logp_NV = torch.log_softmax(logits_NV, -1)
    tokens_N = logp_NV.argmax(-1)
    for i, r in enumerate(rows):
        if r.temperature > 0:
            sel = torch.tensor([j for j, ri in enumerate(row_of) if ri == i], dtype=torch.long)
            if sel.numel():
                draws = torch.multinomial(logp_NV[sel].exp().cpu(), 1, generator=r.generator)
                tokens_N[sel.to(tokens_N.device)] = draws[:, 0].to(tokens_N.device)
    conf_N = logp_NV.gather(-1, tokens_N[:, None])[:, 0].exp()
    return tokens_N, conf_N, _entropy(logp_NV)


def _entropy(logp_NV: Tensor) -> Tensor:
    p_NV = logp_NV.exp()
    return -(p_NV * logp_NV.masked_fill(p_NV == 0, 0.0)).sum(-1)


def _filter(logits_NV: Tensor, row_of: list[int], rows: list[RowSampling]) -> Tensor:
    """Top-k then top-p (nucleus) per position, using each position's request settings."""
    top_k_N = [rows[i].top_k for i in row_of]
    top_p_N = logits_NV.new_tensor([rows[i].top_p for i in row_of])
    vocab = logits_NV.shape[-1]
    if any(0 < k < vocab for k in top_k_N):
        k_N = torch.tensor([k if 0 < k < vocab else vocab for k in top_k_N],
                           device=logits_NV.device)
        kth_N = logits_NV.sort(-1, descending=True).values.gather(-1, (k_N - 1)[:, None])
        logits_NV = logits_NV.masked_fill(logits_NV < kth_N, float("-inf"))
    if (top_p_N < 1).any():
        sorted_NV, order_NV = logits_NV.sort(-1, descending=True)
        cum_NV = sorted_NV.softmax(-1).cumsum(-1)
        drop_NV = cum_NV - sorted_NV.softmax(-1) >= top_p_N[:, None]  # keep the first over p
        sorted_NV = sorted_NV.masked_fill(drop_NV, float("-inf"))
        logits_NV = torch.full_like(logits_NV, float("-inf")).scatter(-1, order_NV, sorted_NV)
    return logits_NV
