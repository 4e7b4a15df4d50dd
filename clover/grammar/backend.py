"""Grammar backend: compile a grammar once, then match it token by token for each request.

A backend turns a `GrammarSpec` (a JSON Schema, a regex or a Lark grammar) into a `Matcher` at
the grammar's start state. Compiled grammars are cached per backend, keyed by the spec, so each
request only pays for a cheap copy. A `Matcher` fills a token bitmask, accepts tokens (stopping
at the first rejected one, never entering an error state), rolls back, and reports forced tokens.
Grammar errors come out as `ValueError` saying what is wrong. This module knows nothing about
requests, blocks or frontiers; the only backend today is llguidance (`BACKENDS`).
"""

# Shapes: V vocab, W bitmask words (ceil(V / 32) int32 words, bit i of word w is token 32w + i)

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

GrammarKind = Literal["json_schema", "regex", "lark"]
KINDS: tuple[str, ...] = ("json_schema", "regex", "lark")
# JSON as Clover's tokenizer and chat template write it (json.dumps defaults): one space after
# ',' and ':' and no other whitespace. A schema's "x-guidance" key overrides this.
JSON_STYLE: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                              "key_separator": ": "}
_MAX_ERROR_CHARS = 600


@dataclass(frozen=True)
class GrammarSpec:
    """What to compile: `source` is JSON text for json_schema, the pattern or the grammar."""

    kind: GrammarKind
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {KINDS} (got {self.kind!r})")


class Matcher(Protocol):
    vocab_size: int

    def fill_bitmask(self, bitmask_W: Tensor) -> None:
        """Write the tokens allowed next into an int32 CPU tensor of ceil(V / 32) words."""
        ...

    def accept(self, tokens: list[int]) -> int:
        """Consume tokens up to the first one the grammar rejects; return how many were taken."""
        ...

    def rollback(self, num_tokens: int) -> None: ...

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces from here, whatever the model would say (may be empty)."""
        ...

    def is_accepting(self) -> bool:
        """The text so far is a complete match: EOS may come next."""
        ...

    def is_stopped(self) -> bool:
        """Complete, and nothing but EOS can follow."""
        ...

    def copy(self) -> Matcher:
        """An independent matcher in the same state."""
        ...


class Backend(Protocol):
    def matcher(self, spec: GrammarSpec) -> Matcher:
        """A fresh matcher at the start state; ValueError if the grammar is invalid or empty."""
        ...


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unpack_bitmask(bitmask_W: Tensor, vocab_size: int) -> Tensor:
    """allowed_V (bool, CPU) from a packed int32 CPU bitmask (little-endian words)."""
    bits = np.unpackbits(bitmask_W.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return torch.from_numpy(bits.astype(bool))


class LLGuidanceMatcher:
    """One request's position in a compiled llguidance grammar."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, bitmask_W: Tensor) -> None:
        assert bitmask_W.dtype == torch.int32 and bitmask_W.is_cpu and bitmask_W.is_contiguous()
        assert bitmask_W.numel() == bitmask_words(self.vocab_size), bitmask_W.shape
        self._m.unsafe_compute_mask_ptr(bitmask_W.data_ptr(), bitmask_W.numel() * 4)

    def accept(self, tokens: list[int]) -> int:
        return self._m.try_consume_tokens(list(tokens)) if tokens else 0

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self._m.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens")

    def forced_tokens(self) -> list[int]:
        return list(self._m.compute_ff_tokens())

    def is_accepting(self) -> bool:
        return self._m.is_accepting()

    def is_stopped(self) -> bool:
        return self._m.is_stopped()

    def copy(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._m.deep_copy(), self.vocab_size)


class LLGuidanceBackend:
    """llguidance over a Hugging Face fast tokenizer, padded to the model's vocabulary.

    Tokens the tokenizer lacks (ids up to `vocab_size`) are never allowed; `eos_id` is the
    grammar's stop token, allowed exactly where the grammar is complete.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_id: int,
                 cache_size: int = 256) -> None:
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        try:
            self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                          eos_token=eos_id)
        except Exception as e:  # llguidance raises plain Exceptions for unusable tokenizers
            raise ValueError(f"llguidance cannot use this tokenizer: {e}") from e
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self._compiled = functools.lru_cache(maxsize=cache_size)(self._compile)

    def matcher(self, spec: GrammarSpec) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._compiled(spec).deep_copy(), self.vocab_size)

    def cache_info(self) -> Any:
        return self._compiled.cache_info()

    def _compile(self, spec: GrammarSpec) -> Any:
        """The pristine matcher for `spec`: compiled and checked once, then only copied."""
        m = self._llg.LLMatcher(self.tokenizer, self.grammar_text(spec), log_level=0,
                                limits=self._llg.LLParserLimits(verbose_errors=False))
        if m.is_error():
            raise compile_error(spec, m.get_error())
        bitmask_W = torch.zeros(bitmask_words(self.vocab_size), dtype=torch.int32)
        LLGuidanceMatcher(m, self.vocab_size).fill_bitmask(bitmask_W)
        allowed_V = unpack_bitmask(bitmask_W, self.vocab_size)
        allowed_V[self.eos_id] = False
        if m.is_error() or not (m.is_accepting() or allowed_V.any()):
            raise ValueError(f"unsatisfiable {_NAMES[spec.kind]}: it matches no text at all")
        return m

    def grammar_text(self, spec: GrammarSpec) -> str:
        """llguidance's grammar text for `spec` (cheap: nothing is compiled yet)."""
        LLMatcher = self._llg.LLMatcher
        if spec.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(spec.source, defaults=JSON_STYLE)
            except ValueError as e:
                raise ValueError(f"invalid JSON schema: {_short(str(e))}") from e
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.source)
        return LLMatcher.grammar_from_lark(spec.source)


_NAMES = {"json_schema": "JSON schema", "regex": "regex", "lark": "Lark grammar"}


def compile_error(spec: GrammarSpec, error: str) -> ValueError:
    """The ValueError for llguidance's `error` on `spec`, with a hint where one helps."""
    error = _short(error)
    if error.startswith("unsatisfiable"):
        return ValueError(f"unsatisfiable {_NAMES[spec.kind]}: it matches no text at all")
    if "Unimplemented keys" in error:
        error += ' (add "x-guidance": {"lenient": true} to the schema to ignore them)'
    return ValueError(f"invalid {_NAMES[spec.kind]}: {error}")


def _short(message: str) -> str:
    message = message.strip()
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + "..."


BACKENDS: dict[str, type] = {"llguidance": LLGuidanceBackend}

# One backend per (tokenizer, vocab, eos, backend name): building llguidance's token trie costs
# about a second for a large vocabulary, and the compiled-grammar cache lives in the backend.
_BACKEND_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def get_backend(tokenizer: Any, vocab_size: int, eos_id: int,
                name: str = "llguidance") -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"grammar backend must be one of {sorted(BACKENDS)} (got {name!r})")
    per_tokenizer = _BACKEND_CACHE.setdefault(tokenizer, {})
    key = (vocab_size, eos_id, name)
    if key not in per_tokenizer:
        per_tokenizer[key] = BACKENDS[name](tokenizer, vocab_size, eos_id)
    return per_tokenizer[key]
