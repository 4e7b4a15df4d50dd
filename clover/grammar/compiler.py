"""Budgeted, cached grammar compilation for a server: structured spec -> a request's constraint.

`GrammarCompiler.build(structured, prompt_len, cancel)` validates the spec, refuses one over the
size budget, try-compiles it in the sandbox (`sandbox.py`: time and memory budgets, cancellable),
then compiles it in this process (llguidance releases the GIL, and the backend caches compiled
grammars) and returns a fresh `FrontierConstraint`. Verdicts are cached per spec, so a grammar
that failed its budget is refused at once the next time. Errors are `ValueError`s (a
`BudgetExceeded` names the limit); `Cancelled` when the caller gave up. Blocking and thread-safe:
the server calls it from a thread pool, never from the engine loop.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from clover.grammar.backend import GrammarSpec, compile_error, get_backend
from clover.grammar.frontier import FrontierConstraint
from clover.grammar.sandbox import BudgetExceeded, Cancelled, GrammarSandbox
from clover.grammar.spec import grammar_spec

__all__ = ["BudgetExceeded", "Cancelled", "CompileBudget", "GrammarCompiler"]


@dataclass(kw_only=True)
class CompileBudget:
    time_s: float = 5.0  # wall time of one compilation
    memory_mb: int = 1024  # memory one compilation may add
    max_bytes: int = 256 * 1024  # size of the grammar source (schema JSON, regex, Lark)
    workers: int = 1  # sandbox processes (parallel compilations)
    cache_size: int = 1024  # verdicts remembered

    def __post_init__(self) -> None:
        for name in ("time_s", "memory_mb", "max_bytes", "workers", "cache_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CompileBudget.{name} must be > 0 (got {getattr(self, name)})")


class GrammarCompiler:
    def __init__(self, tokenizer: Any, config: Any, budget: CompileBudget | None = None,
                 backend: str = "llguidance") -> None:
        if tokenizer is None:
            raise ValueError("structured output needs a tokenizer")
        self.tokenizer, self.config = tokenizer, config
        self.budget = budget or CompileBudget()
        self.backend = get_backend(tokenizer, config.vocab_size, config.eos_id, backend)
        self.sandbox = GrammarSandbox(_tokenizer_json(tokenizer), config.vocab_size,
                                      config.eos_id, memory_bytes=self.budget.memory_mb * 2**20,
                                      workers=self.budget.workers)
        # spec -> None (compiles) or (budget limit or None, error message)
        self._verdicts: OrderedDict[GrammarSpec, tuple | None] = OrderedDict()
        self._lock = threading.Lock()

    def build(self, structured: dict, prompt_len: int,
              cancel: threading.Event | None = None) -> FrontierConstraint:
        spec = grammar_spec(structured, self.tokenizer)
        self._check(spec, cancel)
        matcher = self.backend.matcher(spec)
        return FrontierConstraint(matcher, prompt_len=prompt_len, eos_id=self.config.eos_id,
                                  mask_id=self.config.mask_id)

    def close(self) -> None:
        self.sandbox.close()

    def _check(self, spec: GrammarSpec, cancel: threading.Event | None) -> None:
        """Raise the spec's verdict: cached, or from a sandboxed compilation."""
        with self._lock:
            if spec in self._verdicts:
                self._verdicts.move_to_end(spec)
                verdict = self._verdicts[spec]
                if verdict is None:
                    return
                limit, message = verdict
                raise BudgetExceeded(limit, message) if limit else ValueError(message)
        try:
            self._sandboxed(spec, cancel)
        except Cancelled:
            raise
        except ValueError as e:
            self._remember(spec, (getattr(e, "limit", None), str(e)))
            raise
        self._remember(spec, None)

    def _sandboxed(self, spec: GrammarSpec, cancel: threading.Event | None) -> None:
        size = len(spec.source.encode("utf-8"))
        if size > self.budget.max_bytes:
            raise BudgetExceeded("size", f"the grammar source is {size} bytes, over the "
                                 f"{self.budget.max_bytes} byte budget (--grammar-max-bytes)")
        error = self.sandbox.check(self.backend.grammar_text(spec), self.budget.time_s, cancel)
        if error is not None:
            raise compile_error(spec, error)

    def _remember(self, spec: GrammarSpec, verdict: tuple | None) -> None:
        with self._lock:
            self._verdicts[spec] = verdict
            while len(self._verdicts) > self.budget.cache_size:
                self._verdicts.popitem(last=False)


def _tokenizer_json(tokenizer: Any) -> str:
    """The Rust tokenizer as JSON (padding and truncation off), as llguidance.hf reads it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("structured output needs a fast (Rust) tokenizer")
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()
