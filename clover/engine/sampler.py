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
            mask_id: int, entropy: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens_N, conf_N, entropy_N) for positions whose request is rows[row_of[n]].
    `entropy=False`: entropy_N is NaN (no policy of these rows reads it)."""
    logits_NV = logits_NV.float()
    logits_NV[:, mask_id] = float("-inf")
    if all(r.temperature == 0 for r in rows):
        logp_NV = torch.log_softmax(logits_NV, -1)
        conf_logp_N, tokens_N = logp_NV.max(-1)
        return tokens_N, conf_logp_N.exp(), _entropy(logp_NV, entropy)
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
    return tokens_N, conf_N, _entropy(logp_NV, entropy)


def _entropy(logp_NV: Tensor, wanted: bool = True) -> Tensor:
    if not wanted:
        return logp_NV.new_full(logp_NV.shape[:-1], float("nan"))
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


def schedule_temperature(top: float, bottom: float | None, steps: int, done: int) -> Tensor:
    """The temperature of a uniform-canvas step: step k of N (k = N - done, counting down)
    samples at bottom + (top - bottom) * k / N, computed in fp32 as transformers' DiffusionGemma
    does (so both divide the logits by the same number)."""
    if bottom is None:
        return torch.tensor(top, dtype=torch.float32)
    k = torch.tensor(steps - done, dtype=torch.int32)
    return bottom + (top - bottom) * (k / steps)


def propose_uniform(logits_NV: Tensor, row_of: list[int], temps: list[Tensor],
                    generators: list[torch.Generator | None]) -> tuple[Tensor, Tensor, Tensor,
                                                                       Tensor]:
    """(sampled_N, argmax_N, entropy_N, processed_NV) for a uniform canvas: every token of the
    vocabulary can be drawn (there is no mask id), from softmax(logits / t). Rows without a
    generator draw together in one call on torch's default generator (as transformers' batched
    `generate` does); seeded rows draw alone, so their draws do not depend on the batch.
    Temperature 0 is greedy (sampled = argmax, entropies of the raw logits)."""
    temp_N = torch.stack([temps[i] for i in row_of]).to(logits_NV.device)
    greedy_N = temp_N == 0
    processed_NV = logits_NV.float() / torch.where(greedy_N, 1.0, temp_N)[:, None]
    logp_NV = torch.log_softmax(processed_NV, -1)
    argmax_N = processed_NV.argmax(-1)
    sampled_N = argmax_N.clone()
    shared = [n for n, i in enumerate(row_of) if generators[i] is None and not greedy_N[n]]
    _draw(processed_NV, shared, None, sampled_N)
    for i, gen in enumerate(generators):
        if gen is not None:
            own = [n for n, r in enumerate(row_of) if r == i and not greedy_N[n]]
            _draw(processed_NV, own, gen, sampled_N)
    return sampled_N, argmax_N, _entropy(logp_NV), processed_NV


def _draw(processed_NV: Tensor, rows: list[int], gen: torch.Generator | None,
          out_N: Tensor) -> None:
    if not rows:
        return
    index = torch.tensor(rows, device=processed_NV.device)
    probs = torch.softmax(processed_NV[index], -1, dtype=torch.float32)
    out_N[index] = torch.multinomial(probs.cpu(), 1, generator=gen)[:, 0].to(out_N.device)
