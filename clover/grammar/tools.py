"""The tool-call grammar: an assistant turn of text and/or `<tool_call>{...}</tool_call>` blocks.

Calls are written exactly as `clover.tokenizer.format_tool_call` and the chat template write them:
`<tool_call>{"name": <const>, "arguments": {...}}</tool_call>`, one call per line, arguments
matching that tool's JSON Schema. `<tool_call>` and `</tool_call>` are special tokens, referenced
by id (`<[7]>`), so typing the same characters as plain text is never taken for a call; plain text
may not contain them either, so `parse_tool_calls` reads exactly what the grammar allowed. With a
tokenizer that has no such tokens (SmolLM2) the tags are matched as text, and a JSON string may
then hold their characters: the parsers read a call as one JSON value then `</tool_call>`
(`clover.tokenizer.json_call_end`), so they still read what the grammar allowed.
tool_choice: "auto" (text, or calls, or text then calls), "required" (one or more calls), "none"
(text only), or a named function (one or more calls of it). Produces Lark for llguidance.
"""

from __future__ import annotations

import json
from typing import Any

from clover.grammar.backend import JSON_STYLE
from clover.grammar.schema_rules import bounded_schema
from clover.tokenizer import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

TOOL_CHOICES = ("auto", "required", "none")
# Any text that does not contain a tool-call tag (the special tokens cannot occur in a lexeme).
_TEXT = r"/(.|\n)+/ & ~/(.|\n)*<\/?tool_call>(.|\n)*/"


def normalize_tools(tools: Any) -> dict[str, dict]:
    """OpenAI function tools (or bare {name, parameters}) -> {name: parameters schema}; a tool
    with `strict: true` gets closed objects with every property required."""
    if not isinstance(tools, list) or not tools:
        raise ValueError('structured["tools"] must be a non-empty list of function tools')
    out: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
        name, params = fn.get("name"), fn.get("parameters", {"type": "object"})
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if name in out:
            raise ValueError(f"tools[{i}]: duplicate function name {name!r}")
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON Schema object")
        out[name] = bounded_schema(params, strict=True) if fn.get("strict") is True else params
    return out


def chosen_names(names: list[str], tool_choice: Any) -> tuple[str, list[str]]:
    """(mode, allowed function names) for a tool_choice; mode is auto | required | none."""
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {TOOL_CHOICES} or "
                             f'{{"type": "function", "function": {{"name": ...}}}} '
                             f"(got {tool_choice!r})")
        return tool_choice, names
    fn = tool_choice.get("function", tool_choice) if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ValueError(f'tool_choice must name a function: {{"type": "function", '
                         f'"function": {{"name": ...}}}} (got {tool_choice!r})')
    if name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools {names}")
    return "required", [name]


def tool_call_lark(tools: Any, tool_choice: Any = "auto", *, open_token: int | None = None,
                   close_token: int | None = None, parallel: bool = True) -> str:
    """Lark source for one assistant turn. open/close_token: the ids of `<tool_call>` and
    `</tool_call>` (None: match them as plain text, for tokenizers without those tokens).
    parallel=False: at most one call (OpenAI's `parallel_tool_calls: false`)."""
    schemas = normalize_tools(tools)
    mode, names = chosen_names(list(schemas), tool_choice)
    start = {"auto": "TEXT | TEXT? calls", "required": "calls", "none": "TEXT"}[mode]
    calls = r'call ("\n" call)*' if parallel else "call"
    lines = [f"start: {start}", f"calls: {calls}",
             f"call: {_tag(open_token, TOOL_CALL_OPEN)} body {_tag(close_token, TOOL_CALL_CLOSE)}",
             "body: " + " | ".join(f"fn_{i}" for i in range(len(names)))]
    lines += [f"fn_{i}: %json {json.dumps(call_schema(n, schemas[n]), ensure_ascii=False)}"
              for i, n in enumerate(names)]
    return "\n".join(lines + [f"TEXT: {_TEXT}"])


def call_schema(name: str, parameters: dict) -> dict:
    """The JSON Schema of one call's body, in format_tool_call's key order, numbers bounded."""
    return bounded_schema({"type": "object",
                           "properties": {"name": {"const": name}, "arguments": parameters},
                           "required": ["name", "arguments"], "additionalProperties": False,
                           "x-guidance": JSON_STYLE})


def _tag(token_id: int | None, text: str) -> str:
    return f"<[{token_id}]>" if token_id is not None else json.dumps(text)


def special_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of `text` if the tokenizer has it as one special token, else None."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == text:
        return ids[0]
    return None
