"""Log-probabilities of committed tokens, recorded at the step that commits them.

A diffusion decoder commits a token at some step, not in order, so a token's log-probability is
the model's at the step that committed it: log-softmax of that step's logits at the position
(temperature 1, before top-k / top-p, after the grammar's mask), with the `top` most likely
tokens at the same place. A token re-masked by the grammar and committed again is recorded again;
a token the grammar forced without asking the model has none (reported as probability 1).
"""

# Shapes: N logits positions, V vocab, B rows, M masked positions per row

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


def wants_logprobs(batch) -> bool:
    return any(p.request.params.logprobs is not None for p in batch.rows)


def record_logprobs(logits_NV: Tensor, row_N: Tensor, col_N: Tensor, tokens_BM: Tensor,
                    commit_BM: Tensor, batch) -> None:
    """Store in each asking request's `token_logprobs` (absolute position -> TokenLogprob)."""
    logp_NV = torch.log_softmax(logits_NV.float(), -1)
    rows, cols = row_N.tolist(), col_N.tolist()
    commits, tokens = commit_BM.tolist(), tokens_BM.tolist()
    for n, (b, m) in enumerate(zip(rows, cols, strict=True)):
        plan = batch.rows[b]
        k = plan.request.params.logprobs
        if k is None or not commits[b][m]:
            continue
        position = len(plan.request.seq) + plan.masked[m]
        plan.request.token_logprobs[position] = _entry(logp_NV[n], tokens[b][m], k)


def output_logprobs(request, num_tokens: int) -> list[TokenLogprob]:
    """One entry per output token (the first `num_tokens` generated); forced tokens get 0.0."""
    start = len(request.prompt)
    out = []
    for i in range(num_tokens):
        entry = request.token_logprobs.get(start + i)
        token = request.seq[start + i]
        if entry is None or entry.token_id != token:
            entry = TokenLogprob(token, 0.0, [(token, 0.0)] if request.params.logprobs else [])
        out.append(entry)
    return out


def token_logprob(logits_V: Tensor, token: int, k: int) -> TokenLogprob:
    """`token`'s log-probability under one position's logits, with the `k` most likely."""
    return _entry(torch.log_softmax(logits_V.float(), -1), token, k)


def _entry(logp_V: Tensor, token: int, k: int) -> TokenLogprob:
    top_lp, top_id = logp_V.topk(k) if k else (logp_V[:0], logp_V[:0])
    return TokenLogprob(token, float(logp_V[token]), [
        (int(t), float(lp)) for t, lp in zip(top_id.tolist(), top_lp.tolist(), strict=True)
        if lp > float("-inf")])
