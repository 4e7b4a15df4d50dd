"""The scheduler: which requests run this step, what each feeds the model, and what a commit does.

Pure Python; it imports no torch. Every running request advances on its own: a row whose block
is complete starts its next block at the next step, so rows never wait for the slowest one.
Requests join (`add`) and leave (finish or `abort`) between steps, which is all continuous
batching needs. For each row the plan says: the input tokens, the absolute position (= KV-cache
slot) of the first one, which inputs need logits (one per masked block position), and the length
of the row's exact cache prefix after this forward.

Layout per mode (a = tokens fixed so far, shift = 1 when position i is predicted at i - 1):
- causal: feed seq[cache_len:a], read logits at a - 1; the whole fixed sequence becomes cache.
- block:  feed seq[cache_len:a] + active block, blocks aligned to absolute positions, so every
          completed block's keys are computed once more with its final tokens and become cache.
- full:   a fixed canvas; refresh steps feed all of it, others only the block (dual cache) or
          block + suffix (prefix cache).
- canvas: feed seq[cache_len:a] + the canvas (DiffusionGemma: causal prefix, bidirectional
          canvas); the fixed sequence becomes cache. A `uniform` canvas holds real tokens, not
          mask ids: every position is re-predicted each step, accepted ones stay in the draft,
          the rest are redrawn (`CanvasStep`), and the block's argmax is appended when it stops.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from clover.config import ModelConfig
from clover.engine.request import Request


@dataclass
class RowPlan:
    request: Request
    tokens: list[int]
    start: int  # absolute position, and cache slot, of tokens[0]
    logits_at: list[int]  # indexes into tokens, ascending, one per masked block position
    masked: list[int]  # the block indexes those logits are for
    commit_len: int | None  # the row's exact cache length after this forward (None: unchanged)


@dataclass
class ScheduledBatch:
    rows: list[RowPlan]


@dataclass
class CanvasStep:
    """A uniform-canvas row's step: the next draft (accepted tokens, the rest redrawn), the
    argmax canvas, and the mean entropy of the step's distributions."""

    draft: list[int]
    argmax: list[int]
    mean_entropy: float


StopCheck = Callable[[Request], str | None]  # returns the text cut at a stop string, or None
Verify = Callable[[Request], None]  # checks a constrained request's commits (see constraint.py)
Admit = Callable[[Request], None]  # a request got its row (the engine loads a cached prefix)
DrawCanvas = Callable[[Request, int], list[int]]  # n uniform random tokens for a new canvas


def after_commit(r: Request) -> None:
    """The default `Verify`: the request's constraint checks its committed run."""
    r.constraint.after_commit(r)


class Scheduler:
    def __init__(self, config: ModelConfig, max_batch_size: int,
                 stop_check: StopCheck | None = None, verify: Verify = after_commit,
                 on_admit: Admit | None = None, draw_canvas: DrawCanvas | None = None) -> None:
        self.config = config
        self.draw_canvas = draw_canvas  # needed by `uniform` canvases
        self.on_admit = on_admit  # may set request.cache_len (a prefix already in its row)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_rows = list(range(max_batch_size))
        self.stop_check = stop_check
        self.verify = verify  # the engine passes one that times the grammar work
        self.shift = 1 if config.attention == "causal" else int(config.shift_logits)
        self.stop_ids = {config.eos_id}

    # ---- admission ------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        if not request.prompt:
            raise ValueError("prompt must contain at least one token")
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        for r in list(self.waiting):
            if r.request_id == request_id:
                self.waiting.remove(r)
                r.finish_reason = "abort"
                return r
        for r in self.running:
            if r.request_id == request_id:
                self._finish(r, "abort")
                return r
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and self.free_rows:
            r = self.waiting.popleft()
            r.row = self.free_rows.pop(0)
            r.canvas_end = len(r.prompt) + r.params.max_tokens
            if self.on_admit is not None:
                self.on_admit(r)
            self._start_block(r)
            self.running.append(r)

    def _block_size(self, r: Request) -> int:
        if self.config.attention == "canvas":
            return self.config.block_size
        if self.config.attention == "full":
            return r.params.block_size or self.config.block_size
        return self.config.decode_block_size

    def _start_block(self, r: Request) -> None:
        a, bs = len(r.seq), self._block_size(r)
        remaining = r.params.max_tokens - r.num_generated
        if self.config.attention == "canvas":  # always a whole canvas (cut at max_tokens later)
            end = a + bs
        elif self.config.attention == "full":  # blocks are relative to the generation start
            end = min(a + bs, r.canvas_end)
        else:  # blocks are aligned to absolute positions, as the attention mask is
            end = min((a // bs + 1) * bs, a + remaining)
        r.block = (self.draw_canvas(r, end - a) if self.config.canvas == "uniform"
                   else [r.mask_id] * (end - a))
        r.steps_in_block = 0
        r.drafts = []

    # ---- planning -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Plans for the running rows. Rows with a long input (a new prompt to prefill) run on
        their own step: batched with decoding rows, every row would be padded to the prompt's
        length, and a steady stream of arrivals would make every step cost a full prefill."""
        self._admit()
        plans = [self._plan(r) for r in self.running]
        limit = max(2 * self.config.decode_block_size, 64)
        long = [p for p in plans if len(p.tokens) > limit]
        return ScheduledBatch(long if long else plans)

    def _plan(self, r: Request) -> RowPlan:
        a, masked = len(r.seq), r.masked_positions
        mode = self.config.attention
        if mode == "causal":
            s = r.cache_len
            return RowPlan(r, r.seq[s:a], s, [a - 1 - s], masked, a)
        if mode == "canvas":
            s = r.cache_len
            masked = list(range(len(r.block))) if self.config.canvas == "uniform" else masked
            return RowPlan(r, r.seq[s:] + r.block, s, self._logits_at(a, s, masked), masked, a)
        if mode == "block":
            s = min(r.cache_len, a - self.shift)
            commit = (a // self.config.block_size) * self.config.block_size
            return RowPlan(r, r.seq[s:] + r.block, s, self._logits_at(a, s, masked), masked, commit)
        return self._plan_full(r, a, masked)

    def _plan_full(self, r: Request, a: int, masked: list[int]) -> RowPlan:
        params = r.params
        canvas = r.seq + r.block + [r.mask_id] * (r.canvas_end - a - len(r.block))
        every = params.refresh_every
        refresh = params.cache == "none" or (
            r.steps_in_block == 0 if every == 0 else r.steps_in_block % every == 0)
        if refresh:
            s, e = 0, r.canvas_end
        else:
            s = a - self.shift
            e = a + len(r.block) if params.cache == "dual" else r.canvas_end
        return RowPlan(r, canvas[s:e], s, self._logits_at(a, s, masked), masked, None)

    def _logits_at(self, a: int, s: int, masked: list[int]) -> list[int]:
        return [a - s + j - self.shift for j in masked]

    # ---- commit ---------------------------------------------------------------------------------
    def update(self, batch: ScheduledBatch, tokens: list[list[int]],
               commits: list[list[bool]], experts: float = 0.0,
               canvas: list[CanvasStep] | None = None) -> list[Request]:
        """Apply each row's commits (uniform canvases: each row's `CanvasStep`); return the
        requests that finished this step."""
        done = []
        for i, (plan, row_tokens, row_commits) in enumerate(
                zip(batch.rows, tokens, commits, strict=True)):
            r = plan.request
            self._count(r, plan, experts)
            if canvas is not None:
                self._update_canvas(r, canvas[i])
                if r.finished:
                    done.append(r)
                continue
            for j, t, c in zip(plan.masked, row_tokens, row_commits, strict=True):
                if c:
                    r.block[j] = t
            self._eos_fill(r)
            if r.constraint is not None:
                # rejected tokens are re-masked and forced ones filled in, so a block only
                # completes once all of it is verified
                self.verify(r)
                stop_ids = self.stop_ids | set(r.params.stop_token_ids)
                r.eos_seen = any(t in stop_ids for t in r.block)
            if r.mask_id not in r.block:
                self._complete_block(r)
            if r.finished:
                done.append(r)
        return done

    def _update_canvas(self, r: Request, step: CanvasStep) -> None:
        """Keep the new draft; end the block (appending the argmax canvas) once the argmax has
        held for `stable_steps` steps with mean entropy under `stop_entropy`, or at the step
        limit (`steps_per_block`)."""
        p = r.params
        held = r.drafts[-p.stable_steps:] if p.stable_steps else []
        stable = len(held) == p.stable_steps and all(d == step.argmax for d in held)
        r.drafts = (r.drafts + [step.argmax])[-max(p.stable_steps, 1):]
        r.block = step.draft
        if (stable and step.mean_entropy < p.stop_entropy) or r.steps_in_block >= p.steps_per_block:
            r.block = step.argmax
            stop_ids = self.stop_ids | set(p.stop_token_ids)
            r.eos_seen = any(t in stop_ids for t in r.block)
            self._complete_block(r)

    def _count(self, r: Request, plan: RowPlan, experts: float) -> None:
        r.stats.forwards += 1
        r.stats.steps += 1
        r.stats.tokens_processed += len(plan.tokens)
        r.stats.unique_experts_sum += experts
        r.steps_in_block += 1
        if plan.commit_len is not None:
            r.cache_len = plan.commit_len

    def _eos_fill(self, r: Request) -> None:
        """After a committed EOS, the rest of the block is padding: fill it with EOS."""
        stop_ids = self.stop_ids | set(r.params.stop_token_ids)
        first = next((j for j, t in enumerate(r.block) if t in stop_ids), None)
        if first is None:
            return
        r.eos_seen = True
        for j in range(first + 1, len(r.block)):
            if r.block[j] == r.mask_id:
                r.block[j] = self.config.eos_id

    def _complete_block(self, r: Request) -> None:
        r.seq.extend(r.block)
        del r.seq[len(r.prompt) + r.params.max_tokens:]  # a whole canvas may run past it
        r.block = []
        if r.stats.first_block_s is None:
            r.stats.first_block_s = time.perf_counter() - r.stats.arrival_s
        if r.eos_seen and not r.params.ignore_eos:
            return self._finish(r, "stop")
        if r.params.stop and self.stop_check is not None:
            text = self.stop_check(r)
            if text is not None:
                r.text = text
                return self._finish(r, "stop")
        if r.num_generated >= r.params.max_tokens:
            return self._finish(r, "length")
        self._start_block(r)

    def _finish(self, r: Request, reason: str) -> None:
        r.finish_reason = reason
        r.stats.total_s = time.perf_counter() - r.stats.arrival_s
        stop_ids = self.stop_ids | set(r.params.stop_token_ids)
        out = r.output_ids(stop_ids)
        ended_on_stop = len(out) < r.num_generated and not r.params.ignore_eos
        r.stats.generated_tokens = len(out) + int(ended_on_stop)
        if r.params.ignore_eos:
            r.stats.generated_tokens = r.num_generated
        self.running.remove(r)
        self.free_rows.append(r.row)
        self.free_rows.sort()
