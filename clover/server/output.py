"""From settled token ids to what a client sees: stream-safe text, content and tool-call deltas.

`visible_text` decodes the ids a request can no longer change and keeps only what is final:
complete UTF-8, cut at EOS / stop ids and at the first stop string, holding back a tail that could
still grow into a stop string. `ChatDeltas` turns that text into content and tool-call deltas
(id and name first, then argument pieces, as OpenAI streams them); fed the growing text step by
step and then the final text, it emits what a non-streamed answer holds (the same content, the
same well-formed calls), so streamed chunks concatenate to the answer.
This module knows nothing about HTTP or the engine loop.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from clover.tokenizer import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, next_call_span, parse_tool_calls

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
    for open_, end, closed in _call_spans(text, final=False):
        if not closed and end == len(text):
            return open_
        pos = end
    return len(text) - _held_suffix(text[pos:], [TOOL_CALL_OPEN, TOOL_CALL_CLOSE])


def _call_spans(text: str, final: bool) -> list[tuple[int, int, bool]]:
    """(open, end, closed) of each `<tool_call>` span as `parse_tool_calls` reads them. Before
    the end (`final` False) a span whose `</tool_call>` falls inside an unterminated JSON string
    is still open to the end of the text: more text may close the string and make that tag part
    of the value (`json_call_end`)."""
    spans, pos = [], 0
    while (span := next_call_span(text, pos))[0] != -1:
        open_, end, closed = span
        if not final and closed and _in_string(text[open_ + len(TOOL_CALL_OPEN):end]):
            spans.append((open_, len(text), False))
            break
        spans.append(span)
        pos = end
    return spans


def _in_string(body: str) -> bool:
    """Whether `body` (a call's JSON so far, then its `</tool_call>`) ends that tag inside a
    JSON string, so the tag may be string content."""
    return _string_states(body[:len(body) - len(TOOL_CALL_CLOSE)])[-1]


def _string_states(text: str) -> list[bool]:
    """For JSON text: whether the scan is inside a string literal after each character (one more
    entry than characters; the first is the state before any)."""
    states, in_string, escaped = [False], False, False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        states.append(in_string)
    return states


_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def _value_end(text: str) -> int | None:
    """Where the JSON object or array at the start of `text` ends; None while it is open."""
    depth = 0
    for i, (ch, inside) in enumerate(zip(text, _string_states(text), strict=False)):
        if inside:  # the state before `ch`: brackets in a string do not count
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth <= 0:
                return i + 1
    return None


def _call_so_far(span: str, closed: bool) -> tuple[str, str] | None:
    """(name, raw arguments text so far) of one `<tool_call>` span, once its name is known."""
    body = span[len(TOOL_CALL_OPEN):]
    if closed:
        body = body[:-len(TOOL_CALL_CLOSE)]
    else:
        body = body[:len(body) - _held_suffix(body, [TOOL_CALL_CLOSE])]
    m = _HEADER.match(body)
    if m is None:
        return None
    try:
        name = json.loads(m.group(1))
    except ValueError:
        return None
    args = body[m.end():]
    end = _value_end(args)
    return name, args if end is None else args[:end]


@dataclass
class ChatDeltas:
    """Content and tool calls of one chat answer, emitted incrementally.

    With tools off, content is the generated text as it is. With tools on, `<tool_call>` spans
    become OpenAI tool calls and the rest is content (stripped, as `parse_tool_calls` does);
    `parallel=False` keeps only the first call. `prefix` is text the server put at the start of
    the answer (a forced tool-call opening), parsed as if generated. A call is streamed as
    OpenAI streams it: its id and name as soon as the name is written, then its arguments text
    as it settles; `arguments` is the text the model wrote (JSON, parsed to check it), so the
    streamed pieces join to the non-streamed answer. A call found malformed at the end is
    dropped from a non-streamed answer and reported in `errors` (a stream has sent its start).
    """

    tools: bool
    parallel: bool = True
    prefix: str = ""
    content: str = ""
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def update(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """(new content, tool-call deltas) given the answer's text so far."""
        if not self.tools:
            return self._advance(text), []
        text = self.prefix + text
        parsed = parse_tool_calls(text if final else text[:_stable_end(text)])
        if final:
            self.errors = parsed.errors
        deltas = []
        for i, (open_, end, closed) in enumerate(_call_spans(text, final)):
            now = _call_so_far(text[open_:end], closed)
            if now is None or (final and not _valid(text[open_:end])):
                continue
            if not self.parallel and any(c["_span"] != i for c in self.calls):
                break
            deltas += self._call_delta(i, *now)
        return self._advance(parsed.content), deltas

    def _call_delta(self, span_index: int, name: str, args: str) -> list[dict]:
        known = {c["_span"]: n for n, c in enumerate(self.calls)}
        out = []
        if span_index not in known:
            known[span_index] = len(self.calls)
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": name, "arguments": ""}, "_span": span_index}
            self.calls.append(call)
            out.append({"index": known[span_index], "id": call["id"], "type": "function",
                        "function": {"name": name, "arguments": ""}})
        fn = self.calls[known[span_index]]["function"]
        if args.startswith(fn["arguments"]) and len(args) > len(fn["arguments"]):
            out.append({"index": known[span_index],
                        "function": {"arguments": args[len(fn["arguments"]):]}})
            fn["arguments"] = args
        return out

    def openai_calls(self) -> list[dict]:
        """The calls as a message's `tool_calls`."""
        return [{k: v for k, v in c.items() if k != "_span"} for c in self.calls]

    def _advance(self, content: str) -> str:
        if not content.startswith(self.content):  # cannot happen for prefix-stable input
            content = self.content
        delta, self.content = content[len(self.content):], content
        return delta


def _valid(span: str) -> bool:
    """The span parses as one well-formed tool call."""
    return len(parse_tool_calls(span).tool_calls) == 1


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
