"""Structured output for a non-left-to-right decoder: JSON Schema, regex, Lark and tool calls.

`build_constraint(structured, tokenizer, config, prompt_len)` is what the engine calls for a
request with `SamplingParams.structured`: it validates the spec (`spec.py`), compiles it once per
tokenizer and spec (`backend.py`, llguidance) and returns a per-request `FrontierConstraint`
(`frontier.py`). Bad specs raise `ValueError` saying what is wrong (the server answers 400).
"""

from __future__ import annotations

from typing import Any

from clover.grammar.backend import (
    BACKENDS,
    Backend,
    GrammarSpec,
    Matcher,
    get_backend,
    unpack_bitmask,
)
from clover.grammar.frontier import FrontierConstraint
from clover.grammar.spec import FORMS, grammar_spec
from clover.grammar.tools import tool_call_lark

__all__ = ["BACKENDS", "FORMS", "Backend", "FrontierConstraint", "GrammarSpec", "Matcher",
           "build_constraint", "compile_matcher", "get_backend", "grammar_spec",
           "tool_call_lark", "unpack_bitmask"]


def compile_matcher(structured: dict, tokenizer: Any, vocab_size: int, eos_id: int,
                    backend: str = "llguidance") -> Matcher:
    """A fresh matcher for `structured` (compiled once per tokenizer and spec, then copied)."""
    if tokenizer is None:
        raise ValueError("structured output needs a tokenizer")
    spec = grammar_spec(structured, tokenizer)
    return get_backend(tokenizer, vocab_size, eos_id, backend).matcher(spec)


def build_constraint(structured: dict, tokenizer: Any, config: Any, prompt_len: int,
                     backend: str = "llguidance") -> FrontierConstraint:
    """The engine's hook: one request's constraint (see clover/engine/constraint.py)."""
    matcher = compile_matcher(structured, tokenizer, config.vocab_size, config.eos_id, backend)
    return FrontierConstraint(matcher, prompt_len=prompt_len, eos_id=config.eos_id,
                              mask_id=config.mask_id)
