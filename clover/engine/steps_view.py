"""`clover generate --show-steps`: watch the denoising, one frame per engine step.

`generate_with_steps` drives `Engine.step` itself and, after every step, renders each request's
canvas (masked positions as ░, tokens committed this step highlighted) with a live rich panel on
a terminal, or one plain line per step otherwise (logs, pipes). It only reads requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from clover.engine.params import SamplingParams

MASK_GLYPH = "░"
_PLAIN_TAIL_CHARS = 80  # a plain step line shows the end of each request's canvas
_LIVE_TAIL_CHARS = 2000

Segments = list[tuple[str, str]]  # (text, kind); kind: old | new | mask


@dataclass
class RowView:
    """One request after one step: its state and its generated canvas, split by kind."""

    request_id: str
    state: str  # waiting | running | stop | length | ...
    segments: Segments
    new_tokens: int


def _canvas(r) -> list[int]:
    return r.seq + r.block


def _kinds(before: list[int], after: list[int], start: int, mask_id: int) -> list[list]:
    """Runs of [kind, ids] over after[start:]; a position is new if it was masked or absent."""
    runs: list[list] = []
    for i in range(start, len(after)):
        t = after[i]
        fresh = i >= len(before) or before[i] == mask_id
        kind = "mask" if t == mask_id else "new" if fresh else "old"
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(t)
        else:
            runs.append([kind, [t]])
    return runs


def row_view(r, before: list[int], decode: Callable[[list[int]], str]) -> RowView:
    runs = _kinds(before, _canvas(r), len(r.prompt), r.mask_id)
    segments = [(MASK_GLYPH * len(ids) if kind == "mask" else decode(ids), kind)
                for kind, ids in runs]
    new = sum(len(ids) for kind, ids in runs if kind == "new")
    state = r.finish_reason or ("running" if r.row >= 0 else "waiting")
    return RowView(r.request_id, state, segments, new)


def _tail(segments: Segments, limit: int) -> Segments:
    """The last `limit` characters of the segments, with a leading … when cut."""
    out, room = [], limit
    for text, kind in reversed(segments):
        if room <= 0:
            break
        out.append((text[-room:], kind))
        room -= len(text)
    cut = room < 0 or len(out) < len(segments)
    return ([("…", "old")] if cut else []) + out[::-1]


class PlainSteps:
    """One line per step: `step N: +K tokens | req-0 [running] "…text░░░"`; for logs and pipes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __enter__(self) -> PlainSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, step: int, rows: list[RowView]) -> None:
        new = sum(r.new_tokens for r in rows)
        parts = [f"{r.request_id} [{r.state}] "
                 + json.dumps("".join(t for t, _ in _tail(r.segments, _PLAIN_TAIL_CHARS)),
                              ensure_ascii=False) for r in rows]
        print(f"step {step}: +{new} tokens | " + " | ".join(parts), file=self.stream, flush=True)


class LiveSteps:
    """A rich Live panel redrawn after every step: masks dimmed, this step's commits highlighted."""

    STYLES = {"old": "", "new": "bold black on green", "mask": "dim"}

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.live = Live(console=Console(file=stream), auto_refresh=False)

    def __enter__(self) -> LiveSteps:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, step: int, rows: list[RowView]) -> None:
        from rich.console import Group
        from rich.text import Text

        new = sum(r.new_tokens for r in rows)
        header = Text(f"step {step}  ·  +{new} tokens committed this step", style="bold")
        body = [Text.assemble((f"{r.request_id} ", "bold cyan"), (f"[{r.state}] ", "dim"),
                              *((t, self.STYLES[k]) for t, k in _tail(r.segments,
                                                                       _LIVE_TAIL_CHARS)))
                for r in rows]
        self.live.update(Group(header, *body), refresh=True)


def _decoder(llm) -> Callable[[list[int]], str]:
    if llm.tokenizer is None:
        return lambda ids: " ".join(map(str, ids)) + " "
    return lambda ids: llm.tokenizer.decode(ids, skip_special_tokens=False)


def generate_with_steps(llm, ids: list[list[int]], params: SamplingParams, view) -> list:
    """`LLM.generate`, stepping the engine here so `view` sees every request after every step."""
    engine, decode = llm.engine, _decoder(llm)
    requests = [engine.add_request(p, params) for p in ids]
    before = {r.request_id: _canvas(r) for r in requests}
    step = 0
    with view:
        while engine.has_unfinished():
            live = [r for r in requests if not r.finished]
            engine.step()
            step += 1
            view.update(step, [row_view(r, before[r.request_id], decode) for r in live])
            before = {r.request_id: _canvas(r) for r in requests}
    return [llm.output(r) for r in requests]


def step_view(stream: TextIO):
    return LiveSteps(stream) if stream.isatty() else PlainSteps(stream)
