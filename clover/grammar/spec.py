"""`SamplingParams.structured` -> the `GrammarSpec` to compile, with errors that say what is wrong.

Accepted forms, exactly one key (plus `tool_choice` beside `tools`):
  {"json_schema": {...}} or {"json_schema": {"schema": {...}, "name": ..., "strict": true}}
                                              (numbers bounded, strict honoured: schema_rules.py)
  {"json_object": True}                       any JSON object
  {"regex": "..."}                            the whole output matches the regex
  {"lark": "..."}                             a Lark grammar (llguidance syntax)
  {"choice": ["a", "b"]}                      exactly one of the strings
  {"tools": [...], "tool_choice": "auto" | "required" | "none" | {"type": "function",
   "function": {"name": ...}}}                text and/or <tool_call> blocks (see tools.py);
   "parallel_tool_calls": false beside them allows at most one call (OpenAI's flag)
"""

from __future__ import annotations

import json
from typing import Any

from clover.grammar.backend import GrammarSpec
from clover.grammar.schema_rules import bounded_schema
from clover.grammar.tools import special_token_id, tool_call_lark
from clover.tokenizer import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

FORMS = ("json_schema", "json_object", "regex", "lark", "choice", "tools")
_WRAPPER_KEYS = {"schema", "name", "strict", "description"}
_TOOL_OPTIONS = ("tool_choice", "parallel_tool_calls")


def grammar_spec(structured: Any, tokenizer: Any = None) -> GrammarSpec:
    """Validate `structured` and turn it into a spec; the tokenizer gives the tool-tag ids."""
    if not isinstance(structured, dict):
        raise ValueError(f"structured must be a dict such as {{'json_schema': {{...}}}} "
                         f"(got {type(structured).__name__})")
    keys = [k for k in structured if k not in _TOOL_OPTIONS]
    if len(keys) != 1 or keys[0] not in FORMS:
        raise ValueError(f"structured must have exactly one of the keys {FORMS} "
                         f"(got {sorted(structured)})")
    for option in _TOOL_OPTIONS:
        if option in structured and keys[0] != "tools":
            raise ValueError(f'structured["{option}"] only goes with structured["tools"]')
    form, value = keys[0], structured[keys[0]]
    return _BUILDERS[form](value, structured, tokenizer)


def _json_schema(value: Any, _structured: dict, _tok: Any) -> GrammarSpec:
    strict = False
    if isinstance(value, dict) and "schema" in value and set(value) <= _WRAPPER_KEYS:
        strict = value.get("strict") is True
        value = value["schema"]  # OpenAI's response_format.json_schema wrapper
    if value is False:
        raise ValueError('structured["json_schema"] is false: that schema matches nothing')
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f'structured["json_schema"] must be a JSON Schema object '
                         f"(got {type(value).__name__})")
    return GrammarSpec("json_schema", _dumps(bounded_schema(value, strict=strict),
                                             "json_schema"))


def _json_object(value: Any, _structured: dict, _tok: Any) -> GrammarSpec:
    if value is not True:
        raise ValueError(f'structured["json_object"] must be True (got {value!r})')
    return GrammarSpec("json_schema", _dumps(bounded_schema({"type": "object"}), "json_object"))


def _text(form: str):
    def build(value: Any, _structured: dict, _tok: Any) -> GrammarSpec:
        if not isinstance(value, str) or not value:
            raise ValueError(f'structured["{form}"] must be a non-empty string (got {value!r})')
        return GrammarSpec(form, value)  # type: ignore[arg-type]
    return build


def _choice(value: Any, _structured: dict, _tok: Any) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise ValueError(f'structured["choice"] must be a non-empty list of strings '
                         f"(got {value!r})")
    return GrammarSpec("lark", "start: " + " | ".join(json.dumps(s) for s in value))


def _tools(value: Any, structured: dict, tokenizer: Any) -> GrammarSpec:
    ids = [special_token_id(tokenizer, t) if tokenizer is not None else None
           for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]
    parallel = structured.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ValueError(f'structured["parallel_tool_calls"] must be true or false '
                         f"(got {parallel!r})")
    lark = tool_call_lark(value, structured.get("tool_choice", "auto"),
                          open_token=ids[0], close_token=ids[1], parallel=parallel)
    return GrammarSpec("lark", lark)


def _dumps(value: Any, form: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f'structured["{form}"] is not JSON-serialisable: {e}') from e


_BUILDERS = {"json_schema": _json_schema, "json_object": _json_object, "regex": _text("regex"),
             "lark": _text("lark"), "choice": _choice, "tools": _tools}
