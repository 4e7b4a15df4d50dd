"""Clover's tokenizer: byte-level BPE, fixed special tokens, the chat template, tool-call parsing.

Promises: special tokens sit at fixed ids (`<|pad|>` 0, `<|eos|>` 1, `<|mask|>` 2, matching
`clover.config`); digits are always split one per token; decode(encode(x)) == x for any text;
every chat turn is `<|role|>` + content + `<|eos|>`; assistant tool calls render exactly as
`format_tool_call` writes them, and `parse_tool_calls` turns generated text back into OpenAI-style
`tool_calls`, reporting malformed calls in `errors` instead of raising. Loading reads local files
only and never touches a model hub. This module knows nothing about models or devices.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from clover.config import EOS_ID, MASK_ID, PAD_ID

PAD, EOS, MASK = "<|pad|>", "<|eos|>", "<|mask|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

# Fixed order: the position of each token is its id. Append only, never reorder.
SPECIAL_TOKENS: list[str] = [
    PAD, EOS, MASK,
    "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
    TOOL_CALL_OPEN, TOOL_CALL_CLOSE,
    "<tool_response>", "</tool_response>",
    "<tools>", "</tools>",
]  # fmt: skip

CHAT_TEMPLATE: str = Path(__file__).with_name("chat_template.jinja").read_text(encoding="utf-8")
# For single-task models too small to read a system prompt and tool schemas, trained on the
# conversation alone. A caller that passes the task's own fixed system turn and tools says so
# (`render_chat(..., fixed_task_prompt=True)`: the airspace agent, trainer and benchmarks) and they
# are left out, as in training; any other system message or tool list (an API client's) renders as
# with CHAT_TEMPLATE, never dropped silently. Tools still constrain decoding (grammar) either way.
MESSAGE_ONLY_TEMPLATE: str = (
    "{#- Clover message-only chat template: with fixed_task_prompt (the caller's system turn "
    "and tools are the fixed prompt of the model's task) they are not rendered; otherwise "
    "they are. -#}\n"
    "{%- if fixed_task_prompt | default(false) -%}\n"
    "{%- set tools = none -%}\n"
    "{%- set messages = messages | rejectattr('role', 'in', ['system', 'developer']) | list -%}\n"
    "{%- endif -%}\n"
    + CHAT_TEMPLATE
)
PROMPT_FORMATS = {"chat": CHAT_TEMPLATE, "message": MESSAGE_ONLY_TEMPLATE}

TOKENIZER_FILE, CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"
_SNIPPET_CHARS = 200
_JSON_DECODER = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


# ---------------------------------------------------------------------------------------------
# Training, saving, loading


# A space before a capital letter + digit (`RADIUS N533911E...`, `NOTAMR C9859/26`) and every CJK
# character stand alone, so a value copied from a message tokenizes exactly as it does inside the
# JSON of a tool call (after a quote). On 300 airspace validation messages this took identically
# tokenized copies from 75% to 99% for 16% more tokens (measured in the session note).
_COPY_BOUNDARIES = r" (?=\p{Lu}\d)|[\p{Han}\u3000-\u303f\uff00-\uffef]"


def _empty_bpe() -> Tokenizer:
    """Byte-level BPE whose pre-tokenizer isolates every digit and the copy boundaries above."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_COPY_BOUNDARIES), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The `transformers` view of a trained tokenizer, with Clover's specials and chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        mask_token=MASK,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`; special tokens get ids 0..len(SPECIAL_TOKENS)-1."""
    floor = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < floor:
        raise ValueError(f"vocab_size={vocab_size} is too small: need at least {floor}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency} must be >= 1")
    tok = _empty_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    wrapped = _wrap(tok)
    ids = (wrapped.pad_token_id, wrapped.eos_token_id, wrapped.mask_token_id)
    assert ids == (PAD_ID, EOS_ID, MASK_ID), ids
    return wrapped


def save_tokenizer(tok: PreTrainedTokenizerFast, path: str | Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (specials, chat template) into dir `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # transformers 5.x would otherwise write the template to chat_template.jinja; a stale copy of
    # that file would also override the one in tokenizer_config.json on load.
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tok.save_pretrained(str(path), save_jinja_files=False)


def _check_files(path: Path) -> None:
    """Raise FileNotFoundError / ValueError naming the tokenizer file that is missing or corrupt."""
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    for name in (TOKENIZER_FILE, CONFIG_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"missing {path / name}: save the tokenizer with save_tokenizer"
            )
    try:
        Tokenizer.from_file(str(path / TOKENIZER_FILE))
    except Exception as e:
        raise ValueError(f"corrupt tokenizer file {path / TOKENIZER_FILE}: {e}") from e
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt tokenizer config {path / CONFIG_FILE}: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"corrupt tokenizer config {path / CONFIG_FILE}: not a JSON object")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by `save_tokenizer` from the local directory `path` (no hub)."""
    path = Path(path)
    _check_files(path)
    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


# ---------------------------------------------------------------------------------------------
# Chat rendering


def format_tool_call(name: str, arguments: dict) -> str:
    """One tool call as the model writes it; the chat template renders calls identically."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def _text(content: Any) -> Any:
    """OpenAI content parts -> plain text; other non-strings (tool results) -> JSON."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and "text" in p for p in content):
        return "".join(p["text"] for p in content)
    return json.dumps(content, ensure_ascii=False)


def normalize_tool_call(call: dict) -> dict:
    """Arguments that arrive as a JSON string become a dict, so they render like training data."""
    fn = dict(call.get("function", call))
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass  # not JSON: the template emits the string as it is
    return {**call, "function": fn}


def _normalize_message(message: dict) -> dict:
    out = {**message, "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [normalize_tool_call(c) for c in message["tool_calls"]]
    return out


def _normalize_tool(tool: dict) -> dict:
    """Accept bare `{name, description, parameters}` as well as OpenAI's `{type, function}`."""
    return tool if "function" in tool else {"type": "function", "function": tool}


def render_chat(
    tok: PreTrainedTokenizerFast,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    *,
    fixed_task_prompt: bool = False,
) -> str:
    """Render OpenAI-style messages (and tools as JSON Schemas) to prompt text via the template.

    fixed_task_prompt: the system turn and tools are the fixed prompt of the task the model was
    trained for; a message-only template (`MESSAGE_ONLY_TEMPLATE`) then leaves them out, as in its
    training. Other templates render everything regardless.
    """
    return tok.apply_chat_template(
        [_normalize_message(m) for m in messages],
        tools=[_normalize_tool(t) for t in tools] if tools else None,
        chat_template=None if tok.chat_template else CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        fixed_task_prompt=fixed_task_prompt,
    )


# ---------------------------------------------------------------------------------------------
# Tool-call parsing


@dataclass
class ParsedOutput:
    """Generated text split into plain content, OpenAI-style tool calls and parse errors."""

    content: str
    tool_calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _snippet(text: str) -> str:
    return repr(text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "...")


def _reject_constant(name: str) -> None:
    """NaN / Infinity are not JSON; Python's json module would accept them."""
    raise ValueError(f"{name} is not valid JSON")


def _call_from_json(body: str) -> dict:
    """One `<tool_call>` body -> OpenAI tool call; ValueError says what is wrong with it."""
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except ValueError as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"invalid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ValueError('missing or non-string "name"')
    if not isinstance(arguments, dict):
        raise ValueError('"arguments" is not a JSON object')
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def json_call_end(text: str, body_start: int) -> int | None:
    """End of the call's `</tool_call>` when the text at `body_start` is one complete JSON value
    followed only by whitespace and that tag (what a grammar-constrained call always is), else
    None. Its strings may hold the tags' text: with a tokenizer whose tags are plain text (no
    special tokens), a JSON string is free to contain `</tool_call>` or `<tool_call>`."""
    try:
        _, end = _JSON_DECODER.raw_decode(text, _JSON_SPACE.match(text, body_start).end())
    except (ValueError, RecursionError):
        return None
    close = _JSON_SPACE.match(text, end).end()
    return close + len(TOOL_CALL_CLOSE) if text.startswith(TOOL_CALL_CLOSE, close) else None


def next_call_span(text: str, start: int) -> tuple[int, int, bool]:
    """(open, end, closed) for the next `<tool_call>` at or after `start`; open is -1 if none.

    A call whose body is one JSON value then `</tool_call>` ends there (`json_call_end`). Any
    other ends at the first `</tool_call>` after it; an unclosed one (truncated generation, or a
    new `<tool_call>` before `</tool_call>`) ends where the text or the next call begins.
    """
    open_ = text.find(TOOL_CALL_OPEN, start)
    if open_ == -1:
        return -1, len(text), False
    body_start = open_ + len(TOOL_CALL_OPEN)
    end = json_call_end(text, body_start)
    if end is not None:
        return open_, end, True
    close = text.find(TOOL_CALL_CLOSE, body_start)
    reopen = text.find(TOOL_CALL_OPEN, body_start)
    if close == -1 or -1 < reopen < close:
        return open_, len(text) if reopen == -1 else reopen, False
    return open_, close + len(TOOL_CALL_CLOSE), True


def _strip_stray_closes(text: str, errors: list[str]) -> str:
    if TOOL_CALL_CLOSE in text:
        errors.append(f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}: {_snippet(text)}")
    return text.replace(TOOL_CALL_CLOSE, "")


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split generated text into content and tool calls. Never raises on any string input."""
    pieces: list[str] = []
    out = ParsedOutput(content="")
    pos = 0
    while pos < len(text):
        open_, end, closed = next_call_span(text, pos)
        pieces.append(_strip_stray_closes(text[pos : end if open_ == -1 else open_], out.errors))
        if open_ != -1:
            _add_call(text[open_:end], closed, out)
        pos = end
    out.content = "".join(pieces).strip()
    return out


def _add_call(span: str, closed: bool, out: ParsedOutput) -> None:
    """Parse one `<tool_call>...` span into `out.tool_calls`, or report it in `out.errors`."""
    if not closed:
        out.errors.append(f"tool call: missing {TOOL_CALL_CLOSE}: {_snippet(span)}")
        return
    body = span[len(TOOL_CALL_OPEN) : -len(TOOL_CALL_CLOSE)].strip()
    try:
        out.tool_calls.append(_call_from_json(body))
    except RecursionError:
        out.errors.append(f"tool call: JSON nested too deeply: {_snippet(span)}")
    except ValueError as e:
        out.errors.append(f"tool call: {e}: {_snippet(span)}")
