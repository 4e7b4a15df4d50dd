"""How sure a task score is: message-level bootstrap intervals and paired run comparisons.

A message's zones are scored together and fail together (a second zone missed, a broken call),
so resampling draws whole messages, never zones; ratio metrics (zone F1, validity) are recomputed
from the resampled messages' summed counts, as `scorer.score` computes them. Two runs over the
same messages are compared paired: each resample scores both runs on the same drawn messages, so
what the messages share (hard ones, easy ones) cancels and the interval is the runs' difference.
Pure functions of per-message counts: no decoding, no files.
"""

# Shapes: R resamples, N messages, C count columns (COUNTS)

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from clover.tasks.airspace.scorer import score_each

COUNTS = ("num_truth", "num_pred", "num_correct", "exact", "num_calls", "num_invalid")
DEFAULT_RESAMPLES = 2000
RESAMPLE_CHUNK = 1000  # resamples drawn at once: [chunk, N, C] counts in memory


def message_counts(predictions: list[Any], truths: list[Any]) -> Tensor:
    """[N, C] float64: each message's COUNTS from `scorer.score_each`, the scores `score` sums."""
    rows = [(s.num_truth, s.num_pred, s.num_correct, float(s.exact), s.num_calls, s.num_invalid)
            for s in score_each(predictions, truths)]
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, len(COUNTS))


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, 1 where den is 0 (the scorer's convention: nothing asked, nothing wrong)."""
    return torch.where(den > 0, num / den.clamp(min=1e-12), torch.ones_like(num))


def zone_f1(sums_RC: Tensor, num_messages: int) -> Tensor:
    precision = _ratio(sums_RC[..., 2], sums_RC[..., 1])
    recall = _ratio(sums_RC[..., 2], sums_RC[..., 0])
    total = precision + recall
    return torch.where(total > 0, 2 * precision * recall / total.clamp(min=1e-12), 0.0)


def exact_message_accuracy(sums_RC: Tensor, num_messages: int) -> Tensor:
    return sums_RC[..., 3] / max(num_messages, 1)


def tool_call_validity(sums_RC: Tensor, num_messages: int) -> Tensor:
    return _ratio(sums_RC[..., 4] - sums_RC[..., 5], sums_RC[..., 4])


METRICS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "zone_f1": zone_f1,
    "exact_message_accuracy": exact_message_accuracy,
    "tool_call_validity": tool_call_validity,
}


@dataclass(frozen=True)
class Interval:
    """A metric on all messages and its percentile bootstrap interval."""

    value: float
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4)]


def _resampled(counts: list[Tensor], fn: Callable[[Tensor, int], Tensor], resamples: int,
               seed: int) -> list[Tensor]:  # fmt: skip
    """[R] values of `fn` per counts table, each resample drawing N messages with replacement;
    every table is scored on the same draws (seeded), a chunk of draws at a time (bounded
    memory whatever R is)."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    num_messages = counts[0].shape[0]
    if num_messages < 1:
        raise ValueError("no messages to resample")
    gen = torch.Generator().manual_seed(seed)
    out: list[list[Tensor]] = [[] for _ in counts]
    for start in range(0, resamples, RESAMPLE_CHUNK):
        size = min(RESAMPLE_CHUNK, resamples - start)
        draws_RN = torch.randint(num_messages, (size, num_messages), generator=gen)
        for values, counts_NC in zip(out, counts, strict=True):
            values.append(fn(counts_NC[draws_RN].sum(1), num_messages))
    return [torch.cat(values) for values in out]


def _interval(values_R: Tensor, value: float, level: float) -> Interval:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=values_R.dtype)
    low, high = torch.quantile(values_R, q).tolist()
    return Interval(value, low, high)


def interval(counts_NC: Tensor, metric: str = "zone_f1", resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0, level: float = 0.95) -> Interval:  # fmt: skip
    """`metric` over all messages and its bootstrap interval at `level` (messages resampled)."""
    fn, n = METRICS[metric], counts_NC.shape[0]
    (values_R,) = _resampled([counts_NC], fn, resamples, seed)
    return _interval(values_R, fn(counts_NC.sum(0), n).item(), level)


@dataclass(frozen=True)
class Comparison:
    """Run A against run B on the same messages: each metric, their difference (A - B) with its
    paired interval, and the share of resamples where A scores above B."""

    metric: str
    a: float
    b: float
    difference: Interval
    share_a_better: float

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "a": round(self.a, 4), "b": round(self.b, 4),
                "difference": round(self.difference.value, 4),
                "difference_ci": self.difference.as_list(),
                "share_a_better": round(self.share_a_better, 4)}  # fmt: skip


def compare(counts_a_NC: Tensor, counts_b_NC: Tensor, metric: str = "zone_f1",
            resamples: int = DEFAULT_RESAMPLES, seed: int = 0, level: float = 0.95
            ) -> Comparison:  # fmt: skip
    """Paired bootstrap of metric(A) - metric(B): both runs scored on the same drawn messages."""
    if counts_a_NC.shape != counts_b_NC.shape:
        raise ValueError(f"runs cover different messages: {counts_a_NC.shape[0]} against "
                         f"{counts_b_NC.shape[0]}")
    fn, n = METRICS[metric], counts_a_NC.shape[0]
    a_R, b_R = _resampled([counts_a_NC, counts_b_NC], fn, resamples, seed)
    a, b = fn(counts_a_NC.sum(0), n).item(), fn(counts_b_NC.sum(0), n).item()
    diff = _interval(a_R - b_R, a - b, level)
    return Comparison(metric, a, b, diff, (a_R > b_R).double().mean().item())
