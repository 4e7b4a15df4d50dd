"""From settled token ids to what a client sees: stream-safe text, content and tool-call deltas.

`visible_text` decodes the ids a request can no longer change and keeps only what is final:
complete UTF-8, cut at EOS / stop ids and at the first stop string, holding back a tail that could
still grow into a stop string. `ChatDeltas` turns that text into content and tool calls; fed the
growing text step by step and then the final text, it emits exactly what a non-streamed answer
holds (the same content, the same calls), so streamed chunks always concatenate to the answer.
This module knows nothing about HTTP or the engine loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clover.tokenizer import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_tool_calls

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


def cut_at_stop_ids(ids: list[int], stop_ids: set[int]) -> list[int]:
    for j, t in enumerate(ids):
        if t in stop_ids:
            return ids[:j]
    return ids


def _held_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def visible_text(decode, ids: list[int], stop_ids: set[int], stops: list[str],
                 final: bool) -> str:
    """The text of `ids` a stream may send now (all of it once `final`)."""
    text = decode(cut_at_stop_ids(ids, stop_ids))
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)]
    if final:
        return text
    text = text.rstrip(REPLACEMENT)  # an unfinished multi-byte character waits for its bytes
    return text[:len(text) - _held_suffix(text, stops)]


def _stable_end(text: str) -> int:
    """How much of `text` parses the same whatever comes next: up to the first tool call that is
    still open, or up to a tail that could still become `<tool_call>` / `</tool_call>`."""
    pos = 0
    while (open_ := text.find(TOOL_CALL_OPEN, pos)) != -1:
        body = open_ + len(TOOL_CALL_OPEN)
        close, reopen = text.find(TOOL_CALL_CLOSE, body), text.find(TOOL_CALL_OPEN, body)
        if reopen != -1 and (close == -1 or reopen < close):
            pos = reopen  # an unclosed call cut short by the next one: final as it is
        elif close == -1:
            return open_
        else:
            pos = close + len(TOOL_CALL_CLOSE)
    return len(text) - _held_suffix(text[pos:], [TOOL_CALL_OPEN, TOOL_CALL_CLOSE])


@dataclass
class ChatDeltas:
    """Content and tool calls of one chat answer, emitted incrementally.

    With tools off, content is the generated text as it is. With tools on, `<tool_call>` spans
    become OpenAI tool calls and the rest is content (stripped, as `parse_tool_calls` does);
    `parallel=False` keeps only the first call. `prefix` is text the server put at the start of
    the answer (a forced tool-call opening), parsed as if generated.
    """

    tools: bool
    parallel: bool = True
    prefix: str = ""
    content: str = ""
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def update(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """(new content, new tool calls) given the answer's text so far."""
        if not self.tools:
            return self._advance(text, [])
        text = self.prefix + text
        parsed = parse_tool_calls(text if final else text[:_stable_end(text)])
        calls = parsed.tool_calls if self.parallel else parsed.tool_calls[:1]
        if final:
            self.errors = parsed.errors
        return self._advance(parsed.content, calls[len(self.calls):])

    def _advance(self, content: str, new_calls: list[dict]) -> tuple[str, list[dict]]:
        if not content.startswith(self.content):  # cannot happen for prefix-stable input
            content = self.content
        delta, self.content = content[len(self.content):], content
        self.calls.extend(new_calls)
        return delta, new_calls


@dataclass
class TextDeltas:
    """Text of one completion, emitted incrementally; never sends what it would have to retract."""

    text: str = ""

    def update(self, text: str) -> str:
        if not text.startswith(self.text):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta


def finish_reason(reason: str, calls: list[dict]) -> str:
    return "tool_calls" if calls and reason == "stop" else reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def provisional(decode, block: list[int], settled_in_block: int, mask_id: int,
                glyph: str = "\u2591") -> dict[str, Any]:
    """The active block's draft past the settled run: ids (None where masked) and text with
    `glyph` for each masked position. Not final: later steps may fill or change what follows."""
    draft = block[settled_in_block:]
    pieces, run = [], []
    for t in draft + [mask_id]:
        if t != mask_id:
            run.append(t)
            continue
        if run:
            pieces.append(decode(run))
            run = []
        pieces.append(glyph)
    text = "".join(pieces)[:-1]
    return {"offset": settled_in_block, "token_ids": [None if t == mask_id else t for t in draft],
            "text": text}
