"""Engine statistics: totals over the engine's life, the clock that splits each step's wall time,
and the process's peak memory.

`Engine.step` laps a `StepClock` after each of its parts (model, grammar, policy, other) and hands
the laps and the step's counts to `EngineStats.add_step`: the one place step stats are collected.
Nothing here decides anything about decoding.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch

PARTS = ("model_s", "policy_s", "grammar_s", "other_s")


@dataclass
class EngineStats:
    """Totals over the engine's life (reset with a fresh instance): where the wall time went."""

    steps: int = 0
    forwards: int = 0
    generated_tokens: int = 0
    tokens_processed: int = 0
    model_s: float = 0.0
    policy_s: float = 0.0  # sampler + policy
    grammar_s: float = 0.0  # constraint masks and frontier checks
    other_s: float = 0.0  # scheduling, tensor building, bookkeeping
    unique_experts_sum: float = 0.0
    rows_sum: int = 0
    draft_tokens: int = 0  # self-speculative decoding (finished requests): drafts checked
    accepted_tokens: int = 0  # ... and accepted

    def add_step(self, *, rows: int, tokens_processed: int, unique_experts: float,
                 generated_tokens: int, laps: dict[str, float]) -> None:
        """One forward over `rows` rows; generated_tokens counts the requests that finished."""
        self.steps += 1
        self.forwards += 1
        self.rows_sum += rows
        self.tokens_processed += tokens_processed
        self.unique_experts_sum += unique_experts
        self.generated_tokens += generated_tokens
        self.model_s += laps["model_s"]
        self.policy_s += laps["policy_s"]
        self.grammar_s += laps["grammar_s"]
        self.other_s += laps["other_s"]

    @property
    def wall_s(self) -> float:
        return self.model_s + self.policy_s + self.grammar_s + self.other_s

    @classmethod
    def merged(cls, parts: Iterable[EngineStats]) -> EngineStats:
        """Several runs' totals as one run's: the counts and seconds add, so the ratios of
        `as_dict` (TPF, rows per step, overhead share) are those of all the steps together."""
        out = cls()
        for part in parts:
            for f in fields(cls):
                setattr(out, f.name, getattr(out, f.name) + getattr(part, f.name))
        return out

    def as_dict(self) -> dict[str, Any]:
        wall, per_forward = self.wall_s, max(self.forwards, 1)
        return {"steps": self.steps, "forwards": self.forwards,
                "generated_tokens": self.generated_tokens,
                "tpf": round(self.generated_tokens / per_forward, 4),
                "tokens_processed_per_forward": round(self.tokens_processed / per_forward, 2),
                "mean_batch_rows": round(self.rows_sum / max(self.steps, 1), 2),
                "model_s": round(self.model_s, 4), "policy_s": round(self.policy_s, 4),
                "grammar_s": round(self.grammar_s, 4), "other_s": round(self.other_s, 4),
                "overhead_share": round((wall - self.model_s) / wall, 4) if wall else 0.0,
                "unique_experts_per_forward": round(self.unique_experts_sum / per_forward, 2),
                "peak_memory_bytes": peak_memory(),
                **({"draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                    "acceptance_rate": round(self.accepted_tokens / self.draft_tokens, 4)}
                   if self.draft_tokens else {})}


class StepClock:
    """Splits one step's wall time: `lap(part)` files the time since the previous lap (or
    `start`) under `part`. With `sync`, a lap first waits for queued device work, so a forward's
    time is filed under the model and not under whatever reads its result next."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.start()

    def start(self) -> None:
        self.laps = dict.fromkeys(PARTS, 0.0)
        self._last = time.perf_counter()

    def lap(self, part: str, *, sync: bool = False) -> None:
        if sync and self.sync is not None:
            self.sync()
        now = time.perf_counter()
        self.laps[part] += now - self._last
        self._last = now


def peak_memory() -> int:
    """Peak bytes: CUDA's allocator high-water mark when CUDA is in use, else the process's
    maximum resident set size."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return max_rss()


def max_rss() -> int:
    """The process's maximum resident set size in bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
