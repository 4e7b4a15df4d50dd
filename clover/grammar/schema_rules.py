"""Rewrite a JSON Schema before it is compiled: bounded numbers, and OpenAI's `strict` mode.

Bounded numbers: nothing in JSON Schema limits how many digits a number has, so a sampling model
can write `31.380000000...` until max_tokens. Every number gets |x| <= 10^int_digits and at
most `frac_digits` digits after the point (minimum/maximum and a `multipleOf` of 10^-frac_digits,
unless the schema sets its own), every integer the same bound, and
a value the schema leaves open (an object's extra properties, array items, `{}`) becomes any
JSON whose numbers obey the same bound. The language shrinks only by the numbers too long to be
useful, so an answer under the grammar always ends.
Strict (`strict: true` on a tool or a response_format): every object is closed
(`additionalProperties: false` unless given) and requires all its properties, as OpenAI's
structured outputs do. Pure functions over dicts; the input is never modified.
"""

from __future__ import annotations

from typing import Any

INT_DIGITS = 15  # digits before the point (a double holds 15-17 significant digits)
FRAC_DIGITS = 8  # digits after the point (1e-8 degrees of latitude is about a millimetre)
MAX_DEPTH = 64  # schemas nested deeper are refused (ValueError)
ANY_REF = "#/$defs/clover_bounded_json"
_ANY_NAME = "clover_bounded_json"

# keywords whose value is one subschema / a list of them / a dict of them
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_DICT = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def schema_depth(schema: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value (iterative: any depth is safe), counted up to limit + 1."""
    deepest, todo = 0, [(schema, 1)]
    while todo:
        value, depth = todo.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list) else ())
        todo.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def check_depth(schema: Any, what: str) -> None:
    if schema_depth(schema) > MAX_DEPTH:
        raise ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels")


def bounded_schema(schema: dict, *, strict: bool = False, int_digits: int = INT_DIGITS,
                   frac_digits: int = FRAC_DIGITS) -> dict:
    """`schema` with bounded numbers (and, if `strict`, closed objects); see the module doc."""
    check_depth(schema, "the JSON schema")
    rules = _Rules(strict, int_digits, frac_digits)
    out = rules.walk(schema)
    if rules.used_any:
        out.setdefault("$defs", {})[_ANY_NAME] = rules.any_json()
    return out


class _Rules:
    def __init__(self, strict: bool, int_digits: int, frac_digits: int) -> None:
        self.strict, self.int_digits, self.frac_digits = strict, int_digits, frac_digits
        self.used_any = False

    def walk(self, schema: Any) -> Any:
        if schema is True or schema == {}:
            return self.any_ref()
        if not isinstance(schema, dict):
            return schema
        out = dict(schema)
        for key in _ONE:
            if key in out and isinstance(out[key], dict | bool) and key != "additionalProperties":
                out[key] = self.walk(out[key])
        for key in _LIST:
            if isinstance(out.get(key), list):
                out[key] = [self.walk(s) for s in out[key]]
        for key in _DICT:
            if isinstance(out.get(key), dict):
                out[key] = {k: self.walk(s) for k, s in out[key].items()}
        self._numbers(out)
        self._objects(out)
        return out

    def any_ref(self) -> dict:
        self.used_any = True
        return {"$ref": ANY_REF}

    def any_json(self) -> dict:
        ref = {"$ref": ANY_REF}
        number = self._number_bounds({"type": "number"})
        return {"anyOf": [{"type": "string"}, number, {"type": "boolean"}, {"type": "null"},
                          {"type": "array", "items": ref},
                          {"type": "object", "additionalProperties": ref}]}

    def _types(self, schema: dict) -> set[str]:
        t = schema.get("type")
        return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()

    def _numbers(self, schema: dict) -> None:
        types = self._types(schema)
        if "number" in types or "integer" in types:
            self._number_bounds(schema, integer="number" not in types)

    def _number_bounds(self, schema: dict, integer: bool = False) -> dict:
        top = 10**self.int_digits  # |x| <= 10^int_digits: at most int_digits + 1 digits
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            schema["minimum"] = -top
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            schema["maximum"] = top
        if not integer and "multipleOf" not in schema:
            schema["multipleOf"] = 10**-self.frac_digits
        return schema

    def _objects(self, schema: dict) -> None:
        is_object = "object" in self._types(schema) or "properties" in schema
        if not is_object:
            return
        extra = schema.get("additionalProperties")
        if self.strict and extra is None:
            schema["additionalProperties"] = False
            schema["required"] = list(schema.get("properties", {}))
        elif self.strict:
            schema["required"] = list(schema.get("properties", {}))
        if isinstance(extra, dict) or extra is True:
            schema["additionalProperties"] = self.walk(extra)
        elif extra is None and not self.strict:
            schema["additionalProperties"] = self.any_ref()
