"""The server's output layer without a server: stream-safe text and content / tool-call deltas.

The contract under test: whatever a stream sends is never retracted, and once the answer is final
the stream has sent exactly what the non-streamed response holds.
"""

import json

import pytest

from clover.server.output import (
    ChatDeltas,
    _stable_end,
    finish_reason,
    provisional,
    visible_text,
)
from clover.tokenizer import parse_tool_calls

EOS, MASK = 1, 2
BYTES = {i: bytes([i]) for i in range(256)}


def _decode(ids):
    """A byte-level decoder like the real one: invalid / unfinished UTF-8 shows as U+FFFD."""
    return b"".join(BYTES[i] for i in ids).decode("utf-8", errors="replace")


def _ids(text):
    return list(text.encode("utf-8"))


def test_unfinished_utf8_is_held_back():
    """A multi-byte character is sent only once all its bytes have settled."""
    ids = _ids("héllo €")
    seen = [visible_text(_decode, ids[:n], set(), [], final=False) for n in range(len(ids) + 1)]
    assert all("\ufffd" not in s for s in seen)
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:], strict=False))
    assert seen[-1] == "héllo €"


def test_stop_ids_and_stop_strings_cut_the_text():
    ids = _ids("abc") + [EOS] + _ids("zzz")
    assert visible_text(_decode, ids, {EOS}, [], final=False) == "abc"
    text = _ids("the answer: 42. STOP here")
    assert visible_text(_decode, text, set(), ["STOP"], final=False) == "the answer: 42. "
    # a tail that may still become a stop string waits
    assert visible_text(_decode, _ids("value ST"), set(), ["STOP"], final=False) == "value "
    assert visible_text(_decode, _ids("value ST"), set(), ["STOP"], final=True) == "value ST"


TEXTS = [
    "just some text, no calls at all  ",
    '  Let me check. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "g", "arguments": {"y": "<b>"}}</tool_call> done',
    '<tool_call>{"name": "f", "arguments": {"x": </tool_call>',  # malformed JSON
    '<tool_call>{"name": "f"<tool_call>{"name": "g", "arguments": {}}</tool_call>',  # unclosed
    "stray </tool_call> close and a partial <tool_ca",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("parallel", [True, False])
def test_chat_deltas_stream_equals_final_parse(text, parallel):
    """Feeding every prefix, then the whole text, sends content and calls that add up to
    parse_tool_calls(text), each call once and never retracted."""
    deltas = ChatDeltas(tools=True, parallel=parallel)
    content, calls = "", []
    for n in range(len(text) + 1):
        piece, new = deltas.update(text[:n])
        content, calls = content + piece, calls + new
    piece, new = deltas.update(text, final=True)
    content, calls = content + piece, calls + new
    parsed = parse_tool_calls(text)
    want = parsed.tool_calls if parallel else parsed.tool_calls[:1]
    assert content == parsed.content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in want]
    assert deltas.errors == parsed.errors


def test_chat_deltas_without_tools_is_raw_text():
    deltas = ChatDeltas(tools=False)
    assert deltas.update("  <tool_call>{}") == ("  <tool_call>{}", [])
    assert deltas.update("  <tool_call>{}</tool_call>", final=True) == ("</tool_call>", [])


def test_forced_prefix_is_parsed_as_generated():
    deltas = ChatDeltas(tools=True, prefix='<tool_call>{"name": "f", "arguments": ')
    _, calls = deltas.update('{"a": 1}}</tool_call>', final=True)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1}]
    assert deltas.content == ""


def test_stable_end_stops_before_an_open_call():
    assert _stable_end('hi <tool_call>{"name"') == 3
    assert _stable_end("hi <tool") == 3
    done = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert _stable_end(done + " ok") == len(done) + 3


def test_finish_reason_and_provisional_draft():
    assert finish_reason("stop", [{"id": "x"}]) == "tool_calls"
    assert finish_reason("length", [{"id": "x"}]) == "length"
    assert finish_reason("stop", []) == "stop"
    draft = provisional(_decode, _ids("ab") + [MASK] + _ids("c"), 1, MASK)
    assert draft == {"offset": 1, "token_ids": [ord("b"), None, ord("c")], "text": "b\u2591c"}
