"""Tokenizer contract: fixed special ids, digit splitting, lossless bytes, the chat template and
tool-call parsing. Builds one small tokenizer in-process; CPU only, no hub."""

import copy
import json
import random
import time

import pytest

from clover.config import EOS_ID, MASK_ID, PAD_ID
from clover.tokenizer import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    ParsedOutput,
    format_tool_call,
    load_tokenizer,
    parse_tool_calls,
    render_chat,
    save_tokenizer,
    train_tokenizer,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "draw_no_fly_zone",
            "description": "Draw a cylinder on the map.",
            "parameters": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "finish", "description": "Done.", "parameters": {"type": "object"}},
    },
]


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(0)
    words = ["airspace", "restricted", "radius", "altitude", "NOTAM", "禁飞区", "北纬", "东经"]
    return [
        f"{rng.choice(words)} {rng.randint(0, 99999)} {rng.choice(words)} "
        f"{rng.uniform(-90, 90):.4f}N\n北纬31°08′36″ FL{rng.randint(10, 450)}"
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def tok():
    start = time.perf_counter()
    tokenizer = train_tokenizer(_corpus(), vocab_size=700)
    assert time.perf_counter() - start < 2.0, "training a test tokenizer must stay fast"
    return tokenizer


def _assistant_body(rendered: str) -> str:
    """The text the model would generate: after the last `<|assistant|>`, before `<|eos|>`."""
    return rendered.rsplit("<|assistant|>", 1)[1].split("<|eos|>", 1)[0]


def test_special_token_ids_are_fixed(tok):
    """Model configs and the decoder hard-code pad/eos/mask ids; every special must keep its id."""
    assert (tok.pad_token_id, tok.eos_token_id, tok.mask_token_id) == (PAD_ID, EOS_ID, MASK_ID)
    assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(len(SPECIAL_TOKENS)))
    assert tok.encode("<|user|>hi<|eos|>")[0] == SPECIAL_TOKENS.index("<|user|>")
    assert tok.encode("<|user|>hi<|eos|>")[-1] == EOS_ID


def test_digits_split_one_per_token(tok):
    """Coordinates are copied digit by digit: no token may hold two digits."""
    ids = tok.encode("31.0836N 12345 0000", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert all(sum(c.isdigit() for c in p) <= 1 for p in pieces)
    assert sum(p.isdigit() for p in pieces) == 15


def test_training_rejects_a_vocab_smaller_than_the_byte_alphabet():
    """Byte-level BPE needs all 256 bytes plus the specials; a smaller vocab is a user error."""
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


@pytest.mark.parametrize(
    "text",
    [
        "北纬31°08′36″ 东经121°",
        "line one\n\n  line two\ttab\r\n",
        "emoji 🛩️ ünïcödé",
        "a . b , c 's",
    ],
)
def test_decode_inverts_encode(tok, text):
    """Byte-level BPE must be lossless for any text, including unseen scripts and whitespace."""
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_save_load_round_trip(tok, tmp_path):
    """A model directory must reproduce the same ids, specials and chat template offline."""
    save_tokenizer(tok, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    loaded = load_tokenizer(tmp_path)
    text = "<|system|>北纬31°08′36″<|eos|><tool_call>{}</tool_call>"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.mask_token_id == MASK_ID
    assert loaded.chat_template == CHAT_TEMPLATE
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(loaded, messages, TOOLS) == render_chat(tok, messages, TOOLS)


def test_render_chat_with_tools(tok):
    """Each schema sits on its own line in the system turn, and the prompt ends ready to answer."""
    messages = [{"role": "system", "content": "You plot zones."}, {"role": "user", "content": "Go"}]
    text = render_chat(tok, messages, TOOLS)
    assert text.startswith("<|system|>You plot zones.\n<tools>\n")
    for tool in TOOLS:
        assert f"\n{json.dumps(tool, ensure_ascii=False)}\n" in text
    assert text.endswith("</tools><|eos|><|user|>Go<|eos|><|assistant|>")
    assert "\n\n" not in text


def test_tools_without_system_message_still_get_a_system_turn(tok):
    """The model only learns tools from the system turn, so one is made when the caller has none."""
    text = render_chat(tok, [{"role": "user", "content": "Go"}], TOOLS)
    assert text.startswith("<|system|><tools>\n")
    no_prompt = render_chat(tok, [{"role": "user", "content": "Go"}], add_generation_prompt=False)
    assert no_prompt == "<|user|>Go<|eos|>"


def test_every_turn_closes_with_eos(tok):
    """The engine stops at eos, so each role's turn must end with exactly that one token."""
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "tool_call_id": "x", "content": "r"},
    ]
    text = render_chat(tok, messages, add_generation_prompt=False)
    expected = (
        "<|system|>s<|eos|><|user|>u<|eos|><|assistant|>a<|eos|>"
        "<|tool|><tool_response>r</tool_response><|eos|>"
    )
    assert text == expected


def test_tool_call_round_trip(tok):
    """What the template renders for an assistant's calls must parse back to the same calls."""
    calls = [("draw_no_fly_zone", {"lat": 31.1433, "lon": 121.805, "name": "浦东"}), ("finish", {})]
    message = {
        "role": "assistant",
        "content": "Plotting.",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": calls[0][0], "arguments": calls[0][1]},
            },
            # OpenAI clients send arguments as a JSON string; it must render the same way.
            {"id": "c1", "type": "function", "function": {"name": "finish", "arguments": "{}"}},
        ],
    }
    body = _assistant_body(render_chat(tok, [message], add_generation_prompt=False))
    assert body == "Plotting.\n" + "\n".join(format_tool_call(n, a) for n, a in calls)
    parsed = parse_tool_calls(body)
    assert parsed.errors == [] and parsed.content == "Plotting."
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]
    assert got == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == 2


def test_parse_plain_text_and_surrounding_content():
    """Zero calls leaves the text as content; text around calls is kept, tags are not."""
    assert parse_tool_calls("  just text \n") == ParsedOutput("just text", [], [])
    call = format_tool_call("finish", {"ok": True})
    parsed = parse_tool_calls(f"before {call} after")
    assert parsed.content == "before  after" and len(parsed.tool_calls) == 1
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"ok": true}'


@pytest.mark.parametrize(
    ("body", "reason", "quoted"),
    [
        ('<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>', "invalid JSON", '{"a": 1'),
        ('<tool_call>{"name": "f", "arguments": {"a": 1}}', "missing </tool_call>", '{"a": 1}}'),
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', '"name"', '{"arguments"'),
        ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', '"arguments" is', "[1, 2]"),
        ('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>', "NaN", "NaN}}"),
        ("<tool_call>[1, 2]</tool_call>", "not a JSON object", "[1, 2]"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "too deeply", "[[[["),
        ("garbage </tool_call> more", "without <tool_call>", "garbage"),
        ("<tool_call><tool_call>\x00\ufffd}{</tool_call>", "missing </tool_call>", "}{"),
    ],
)
def test_malformed_calls_are_reported_not_raised(body, reason, quoted):
    """Bad model output is data for the caller (finish reason, error field), never an exception."""
    good = format_tool_call("finish", {})
    parsed = parse_tool_calls(f"{good} {body}")
    assert any(reason in e for e in parsed.errors), parsed.errors
    assert any(quoted in e for e in parsed.errors), "the error must quote the offending text"
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["finish"]


def test_load_missing_directory_names_it(tmp_path):
    """A wrong path must say which path, not fall through to a hub download."""
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")


def test_load_missing_or_corrupt_files_names_the_file(tok, tmp_path):
    """A broken model directory must point at the broken file."""
    save_tokenizer(tok, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    save_tokenizer(tok, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[oops")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        load_tokenizer(tmp_path)


def test_copied_values_tokenize_as_in_a_tool_call():
    """A value copied from a message must be the same tokens inside the call's JSON, or the
    model has to learn two spellings of every copy (space+letter merges, CJK merges)."""
    texts = ["PSN N533911E0073029 RADIUS 1KM", "A1234/26 NOTAMR C9859/26",
             "以北纬31°08′36″、东经121°48′18″为中心", " N5 C9 北纬 东经 为中心"] * 200
    tok = train_tokenizer(texts, vocab_size=400)
    for value, message in [("N533911E0073029", "PSN N533911E0073029 RADIUS 1KM"),
                           ("C9859/26", "A1234/26 NOTAMR C9859/26"),
                           ("北纬31°08′36″", "以北纬31°08′36″、东经121°48′18″为中心")]:
        in_json = tok.encode(f'"centre": "{value}"')
        value_ids = tok.encode(value)
        msg = tok.encode(message)
        assert any(in_json[i:i + len(value_ids)] == value_ids for i in range(len(in_json)))
        assert any(msg[i:i + len(value_ids)] == value_ids for i in range(len(msg)))


def test_message_only_template_is_the_chat_template_without_system_turn_and_tools(tok):
    """Single-task models see the conversation alone when the caller passes the task's fixed
    prompt; everything after the system turn renders exactly as with the full template, so calls
    and tool results look the same to the model."""
    from clover.tokenizer import MESSAGE_ONLY_TEMPLATE

    call = {"id": "c1", "type": "function",
            "function": {"name": "clear_zone", "arguments": '{"zone_id": "Z1"}'}}
    messages = [{"role": "system", "content": "You plot zones."},
                {"role": "user", "content": "A1/26 cancelled"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": '{"ok": true}', "tool_call_id": "c1"},
                {"role": "user", "content": "next"}]
    full = render_chat(tok, messages, TOOLS)
    tok_message = copy.deepcopy(tok)
    tok_message.chat_template = MESSAGE_ONLY_TEMPLATE
    short = render_chat(tok_message, messages, TOOLS, fixed_task_prompt=True)
    assert short.startswith("<|user|>A1/26 cancelled<|eos|><|assistant|><tool_call>")
    assert "<tools>" not in short and "You plot zones." not in short
    assert full.endswith(short) and full[:-len(short)].startswith("<|system|>You plot zones.")


def test_message_only_template_never_drops_a_callers_system_message_or_tools(tok):
    """Without fixed_task_prompt (an API client's own system message and tools) the message-only
    template renders them exactly as the full template does: nothing is dropped silently."""
    from clover.tokenizer import MESSAGE_ONLY_TEMPLATE

    messages = [{"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hello"}]
    tok_message = copy.deepcopy(tok)
    tok_message.chat_template = MESSAGE_ONLY_TEMPLATE
    shown = render_chat(tok_message, messages, TOOLS)
    assert shown == render_chat(tok, messages, TOOLS)
    assert "Answer in French." in shown and '"name": "draw_no_fly_zone"' in shown
