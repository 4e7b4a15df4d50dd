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
    # tags' text inside a JSON string (a tokenizer whose tags are plain text): part of the value
    '<tool_call>{"name": "f", "arguments": {"s": "a</tool_call> hi <tool_call>{"}}</tool_call> ok',
    # ... and inside a string that never closes: the call ends at the first tag, as before
    '<tool_call>{"name": "f", "arguments": {"s": "a}}</tool_call> b <tool_ca',
    '<tool_call>{"name": "f"<tool_call>{"name": "g", "arguments": {}}</tool_call>',  # unclosed
    "stray </tool_call> close and a partial <tool_ca",
]


def _accumulate(deltas: list[dict]) -> list[dict]:
    """Tool-call deltas joined the way OpenAI's docs tell clients to: by index, name and
    argument pieces concatenated."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
        call["name"] += d.get("function", {}).get("name") or ""
        call["arguments"] += d.get("function", {}).get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def _well_formed(call: dict) -> bool:
    try:
        return isinstance(json.loads(call["arguments"]), dict)
    except ValueError:
        return False


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("parallel", [True, False])
def test_chat_deltas_stream_equals_final_parse(text, parallel):
    """Feeding every prefix, then the whole text, sends content and tool-call pieces that join
    to parse_tool_calls(text): the same content, the same well-formed calls (a malformed one
    may have been started, and is reported in errors), never a retraction; the non-streamed
    answer holds exactly the parsed calls."""
    deltas = ChatDeltas(tools=True, parallel=parallel)
    content, pieces = "", []
    for n in range(len(text) + 1):
        piece, new = deltas.update(text[:n])
        content, pieces = content + piece, pieces + new
    piece, new = deltas.update(text, final=True)
    content, pieces = content + piece, pieces + new
    parsed = parse_tool_calls(text)
    want = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in (parsed.tool_calls if parallel else parsed.tool_calls[:1])]
    assert content == parsed.content
    assert [c for c in _accumulate(pieces) if _well_formed(c)] == want
    assert deltas.errors == parsed.errors
    plain = ChatDeltas(tools=True, parallel=parallel)
    plain.update(text, final=True)
    assert [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in plain.openai_calls()] == want


def test_tool_call_streams_name_first_then_argument_pieces():
    """OpenAI's order: a call's id and name as soon as the name is written, then its arguments
    in pieces while the model is still writing them."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}' \
           "</tool_call>"
    deltas, seen = ChatDeltas(tools=True), []
    for n in range(len(text) + 1):
        seen += deltas.update(text[:n])[1]
    seen += deltas.update(text, final=True)[1]
    assert seen[0]["function"] == {"name": "get_weather", "arguments": ""} and seen[0]["id"]
    assert len(seen) > 3 and all("name" not in d["function"] for d in seen[1:])
    assert _accumulate(seen) == [{"name": "get_weather",
                                  "arguments": '{"city": "Paris", "days": 3}'}]


def test_chat_deltas_without_tools_is_raw_text():
    deltas = ChatDeltas(tools=False)
    assert deltas.update("  <tool_call>{}") == ("  <tool_call>{}", [])
    assert deltas.update("  <tool_call>{}</tool_call>", final=True) == ("</tool_call>", [])


def test_forced_prefix_is_parsed_as_generated():
    deltas = ChatDeltas(tools=True, prefix='<tool_call>{"name": "f", "arguments": ')
    _, pieces = deltas.update('{"a": 1}}</tool_call>', final=True)
    assert [json.loads(c["arguments"]) for c in _accumulate(pieces)] == [{"a": 1}]
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
