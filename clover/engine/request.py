"""One request's whole decoding state, its statistics, and what the caller gets back.

A `Request` is plain Python (lists of ints, no tensors): the fixed sequence so far, the active
block with mask ids where nothing is committed yet, how much of it lives in the KV cache, and the
request's counters. The scheduler mutates it; nothing here touches the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from clover.engine.params import SamplingParams


@dataclass
class RequestStats:
    forwards: int = 0  # forward passes this request took part in (NFE)
    tokens_processed: int = 0  # input tokens this request fed to the model, over all forwards
    generated_tokens: int = 0  # up to and including EOS
    steps: int = 0
    arrival_s: float = 0.0
    first_block_s: float | None = None  # time to first committed block, from arrival
    total_s: float = 0.0
    unique_experts_sum: float = 0.0  # batch-level experts touched per MoE layer, summed per forward
    draft_tokens: int = 0  # self-speculative decoding: drafts put to the AR model's check
    accepted_tokens: int = 0  # ... and those it accepted (each saves a forward)

    @property
    def tpf(self) -> float:
        """Tokens committed per forward."""
        return self.generated_tokens / max(self.forwards, 1)

    @property
    def tps(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        return {"forwards": self.forwards, "generated_tokens": self.generated_tokens,
                "tokens_processed": self.tokens_processed, "tpf": round(self.tpf, 4),
                "tps": round(self.tps, 2), "first_block_s": self.first_block_s,
                "total_s": round(self.total_s, 6),
                "tokens_processed_per_forward": round(self.tokens_processed / max(self.forwards, 1),
                                                      2),
                "unique_experts_per_forward": round(self.unique_experts_sum
                                                    / max(self.forwards, 1), 2),
                **({"draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                    "acceptance_rate": round(self.accepted_tokens / self.draft_tokens, 4)}
                   if self.draft_tokens else {})}


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    mask_id: int
    seq: list[int] = field(default_factory=list)  # prompt + generated tokens that are final
    block: list[int] = field(default_factory=list)  # active block; mask_id where still masked
    cache_len: int = 0  # leading tokens of seq whose keys/values are in the exact cache
    canvas_end: int = 0  # `full` models: one past the last position of the fixed canvas
    steps_in_block: int = 0
    row: int = -1  # KV-cache row while running
    eos_seen: bool = False
    prefix_stored: bool = False  # its prompt's chunks went to the prefix cache
    finish_reason: str | None = None
    text: str | None = None  # final text, cut at a stop string if one matched
    stats: RequestStats = field(default_factory=RequestStats)
    generator: Any = None  # torch.Generator for seeded sampling (opaque here)
    constraint: Any = None  # a `Constraint` (grammar) or None; see clover/engine/constraint.py
    token_logprobs: dict = field(default_factory=dict)  # position -> TokenLogprob (if asked)
    # uniform canvases: `block` is a draft of real tokens (nothing settled until the block ends),
    # and `drafts` the argmax canvases of the latest steps (the stop criterion's history)
    uniform: bool = False
    drafts: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.seq:
            self.seq = list(self.prompt)
        self.stats.arrival_s = time.perf_counter()

    @property
    def num_generated(self) -> int:
        return len(self.seq) - len(self.prompt)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def masked_positions(self) -> list[int]:
        return [j for j, t in enumerate(self.block) if t == self.mask_id]

    def settled_ids(self) -> list[int]:
        """Generated ids that can no longer change, in order: finished blocks plus the active
        block's committed run from its start (what a stream may send so far; may include EOS)."""
        run = []
        for t in [] if self.uniform else self.block:
            if t == self.mask_id:
                break
            run.append(t)
        if self.constraint is not None:  # beyond the grammar frontier, commits are provisional
            run = run[:max(self.constraint.frontier(self) - len(self.seq), 0)]
        return self.seq[len(self.prompt):] + run

    def output_ids(self, stop_ids: set[int]) -> list[int]:
        """Generated ids up to (not including) the first EOS / stop token."""
        out = self.seq[len(self.prompt):]
        for j, t in enumerate(out):
            if t in stop_ids:
                return out[:j]
        return out


@dataclass
class CompletionOutput:
    """One generated sequence, as vLLM's `CompletionOutput` (`outputs[i]` of a RequestOutput)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[Any] | None = None  # TokenLogprob per token, when asked for
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    """What the caller gets for one prompt: `text`, `token_ids`, `finish_reason` and `stats` of
    the first sequence at the top level (Clover's surface), every sequence in `outputs` (vLLM's
    surface: `out.outputs[0].text`); with SamplingParams.n > 1, `outputs` holds n of them."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # stop | length | tool_calls | abort
    stats: RequestStats
    tool_calls: list[dict] = field(default_factory=list)
    content: str | None = None  # text outside tool calls (chat)
    errors: list[str] = field(default_factory=list)  # malformed tool calls etc., never raised
    logprobs: list[Any] | None = None  # TokenLogprob per token, when asked for
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt: str | None = None  # the prompt text, when it was given as text

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [CompletionOutput(0, self.text, self.token_ids, self.finish_reason,
                                             self.logprobs)]
