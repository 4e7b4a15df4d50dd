"""What the self-speculative pair commits from one forward's logits: greedy, or sampled.

Greedy (no `RowSampling`, or temperature 0): a draft holds while it is the AR model's argmax,
and the AR model's own token follows; drafts are the drafter's argmax. Sampled (temperature > 0,
with top-k / top-p as the engine's sampler applies them): speculative sampling (Leviathan et al.
2023, Chen et al. 2023). Drafts are drawn from the drafter's processed distribution q; draft x
at a place holds with probability min(1, p(x) / q(x)), p the AR model's processed distribution
there given the tokens before it; at the first that does not, a token is drawn from
max(0, p - q) renormalised and the rest are dropped; when all hold, the next token is drawn from
p. Each written token is then distributed as the AR model alone would sample it, whatever q is
(q only sets how many drafts hold). Draws use the request's own generator (seeded requests
repeat), torch's default one otherwise.
"""

# Shapes: K places (rows of one sequence), V vocab

from __future__ import annotations

import torch
from torch import Tensor

from clover.engine.sampler import RowSampling, _filter


def probs(logits_KV: Tensor, s: RowSampling) -> Tensor:
    """The distribution the engine's sampler draws from: temperature, then top-k and top-p."""
    K = logits_KV.shape[0]
    return torch.softmax(_filter(logits_KV.float() / s.temperature, [0] * K, [s]), -1)


def draw(p_KV: Tensor, gen: torch.Generator | None) -> list[int]:
    """One token from each row's distribution."""
    if not p_KV.shape[0]:
        return []
    return torch.multinomial(p_KV.float().cpu(), 1, generator=gen)[:, 0].tolist()


def check(rows_KV: Tensor, spec: list[int], q_KV: Tensor | None,
          s: RowSampling | None) -> tuple[int, int]:
    """(drafts that hold, the token written after them) for drafts `spec` (drawn from `q_KV`
    when sampled), given the AR model's logits `rows_KV` at the len(spec) + 1 places from the
    first draft's on."""
    if s is None:
        best = rows_KV.argmax(-1).tolist()
        ok = 0
        while ok < len(spec) and best[ok] == spec[ok]:
            ok += 1
        return ok, best[ok]
    p_KV = probs(rows_KV, s)
    for k, x in enumerate(spec):
        u = float(torch.rand((), generator=s.generator))
        if u * float(q_KV[k, x]) < float(p_KV[k, x]):
            continue  # holds with probability min(1, p / q)
        rest = (p_KV[k] - q_KV[k]).clamp_min(0)
        rest = rest if float(rest.sum()) > 0 else p_KV[k]  # p = q there: nothing is left over
        return k, draw((rest / rest.sum())[None], s.generator)[0]
    return len(spec), draw(p_KV[len(spec):], s.generator)[0]


def first(logits_V: Tensor, s: RowSampling | None) -> int:
    """The token the prefill writes: the AR model's argmax, or a draw from p."""
    return int(logits_V.argmax()) if s is None else draw(probs(logits_V[None], s), s.generator)[0]


def drafts(window_KV: Tensor, tau: float, s: RowSampling | None
           ) -> tuple[list[int], Tensor | None]:
    """(drafts, their q rows when sampled) from the drafter's logits at the places after the
    written token, left to right while the draft's probability is >= tau."""
    if s is None:
        conf_K, tokens_K = window_KV.softmax(-1).max(-1)
        q_KV = None
    else:
        q_KV = probs(window_KV, s)
        tokens_K = torch.tensor(draw(q_KV, s.generator), dtype=torch.long)
        conf_K = q_KV.gather(-1, tokens_K[:, None].to(q_KV.device))[:, 0]
    spec = []
    for t, p in zip(tokens_K.tolist(), conf_K.tolist(), strict=True):
        if p < tau:
            break
        spec.append(t)
    return spec, None if q_KV is None else q_KV[:len(spec)]
