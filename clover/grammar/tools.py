"""The tool-call grammar: an assistant turn of text and/or `<tool_call>{...}</tool_call>` blocks.

Calls are written exactly as `clover.tokenizer.format_tool_call` and the chat template write them:
`<tool_call>{"name": <const>, "arguments": {...}}</tool_call>`, one call per line, arguments
matching that tool's JSON Schema. `<tool_call>` and `</tool_call>` are special tokens, referenced
by id (`<[7]>`), so typing the same characters as plain text is never taken for a call; plain text
may not contain them either, so `parse_tool_calls` reads exactly what the grammar allowed.
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


def ordered_calls_lark(slots: list[tuple[str, dict]], required: list[range] = (),
                       max_text: int | None = None) -> str:
    """Lark source for an assistant turn (text, or text then calls; tool_choice "auto") whose
    calls follow `slots` in order: each slot, a (function name, parameters schema) pair, is
    called at most once and any may be skipped, except that each range of slot indices in
    `required` (contiguous, disjoint) needs at least one of its slots called, so with any
    range the turn must call. With no slots the turn is text only. max_text: at most that many
    characters of text (a model that wants a call the grammar no longer allows would otherwise
    write text until max_tokens). The `<tool_call>` tags are named as special tokens (Clover's
    tokenizers have them)."""
    text = _TEXT if max_text is None else _TEXT.replace("+/", f"{{1,{max_text}}}/", 1)
    if not slots:
        return f"start: TEXT\nTEXT: {text}"
    k = len(slots)
    range_of: dict[int, range] = {}
    for r in required:
        if not r or r.step != 1 or r.start < 0 or r.stop > k or any(j in range_of for j in r):
            raise ValueError(f"required ranges must be disjoint ranges of slot indices "
                             f"0..{k - 1} (got {list(required)})")
        range_of.update((j, r) for j in r)
    rules, bodies = [], {}

    def body(name: str, parameters: dict) -> str:
        source = json.dumps(call_schema(name, parameters), ensure_ascii=False)
        if source not in bodies:
            bodies[source] = f"body_{len(bodies)}"
            rules.append(f"{bodies[source]}: %json {source}")
        return bodies[source]

    def arrive(j: int) -> tuple[str, int]:  # the state at slot j once slot j-1 is settled
        r = range_of.get(j)
        return ("need", j) if r is not None and r.start == j else ("from", j)

    def name(state: tuple[str, int]) -> str:
        return f"{state[0]}_{state[1]}"

    # from_j: the calls from slot j on, nothing pending; need_j: one of slot j's range is owed
    start = f"start: TEXT? {name(arrive(0))}" + ("" if required else " | TEXT")
    lines, todo, seen = [start], [arrive(0)], set()
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        kind, j = state
        call = f"{TOOL_CALL_OPEN} {body(*slots[j])} {TOOL_CALL_CLOSE}"
        options, nexts = [call], []
        if j + 1 < k:
            then = arrive(j + 1)
            owed = any(r.start > j for r in required)  # a range after this slot
            options = [f'{call} "\\n" {name(then)}' if owed else f'{call} ("\\n" {name(then)})?']
            same = range_of.get(j) is not None and range_of.get(j + 1) is range_of.get(j)
            skip = ("need", j + 1) if kind == "need" and same else then if kind == "from" else None
            nexts = [then, *([skip] if skip else [])]
            options += [name(skip)] if skip else []
        lines.append(f"{name(state)}: " + " | ".join(options))
        todo += nexts
    return "\n".join(lines + rules + [f"TEXT: {text}"])


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
