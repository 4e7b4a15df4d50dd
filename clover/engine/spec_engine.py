"""Self-speculative decoding behind the engine's request API (`add_request`, `step`,
`has_unfinished`, `output`, `stats`), so `LLM(model, draft=...)`, `LLM.generate` / `chat` and the
airspace agent (`clover eval airspace --draft`) run it unchanged.

The AR model checks a block-diffusion drafter inside each forward (`clover.engine.speculative`):
the output is the AR model's greedy output, and the drafts decide the tokens per forward.
Continuous batching: each step first prefills the requests admitted into free cache rows (one
forward over their prompts, which writes each one's first token; a prompt head an earlier
request computed comes from the prefix cache, as in the engine), then runs one forward over
every running request, each with its own clean rows (tokens to cache and drafts to check) and
mask rows (its block's rest), padded (`SelfSpeculative.forward_rows`); a finished request frees
its row at once. Greedy requests get the AR model's greedy output; sampled ones (temperature,
top-k, top-p, seed) get speculative sampling (`clover.engine.spec_sampling`): each token
distributed as the AR model alone would sample it. Log-probabilities (`logprobs=k`) are the AR
model's, read at the clean row that wrote each token, as the AR engine reports them. A request
for a grammar is refused with a ValueError naming the parameter. SamplingParams' policy and tau
are the diffusion model's commit rule and do not apply here (the drafts' bar is the engine's
`tau`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from clover.engine.llm import Engine
from clover.engine.params import SamplingParams
from clover.engine.prefix_cache import PrefixCache
from clover.engine.request import Request
from clover.engine.runner import grown
from clover.engine.sampler import RowSampling
from clover.engine.speculative import RoutedPair, SelfSpeculative, _Row, trimmed
from clover.engine.stats import EngineStats
from clover.model.transformer import KVCache


class SpecEngine:
    """The engine's request API over a `RoutedPair` (see the module docstring)."""

    def __init__(self, pair: RoutedPair, tokenizer: Any | None = None, *,
                 max_batch_size: int = 8, max_model_len: int | None = None,
                 prefix_cache_mb: float = 256.0, tau: float = 0.0,
                 max_drafts: int | None = None) -> None:
        self.pair, self.model, self.config = pair, pair.model, pair.model.config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or self.config.max_seq_len
        self.max_batch_size = max_batch_size
        self.decoder = SelfSpeculative(pair, tau, max_drafts=max_drafts)
        param = next(self.model.parameters())
        self.cache = KVCache(self.config, max_batch_size, min(self.max_model_len, 256),
                             param.device, param.dtype)
        self.waiting: deque[Request] = deque()
        self.running: dict[str, tuple[Request, _Row]] = {}
        self.free = list(range(max_batch_size))
        self.stats = EngineStats()
        # the clean rows' keys are the AR model's, causal: a prompt head's are exact to reuse
        self.prefix_cache = PrefixCache(self.config, prefix_cache_mb)
        self._next_id = 0

    @property
    def runner(self) -> SpecEngine:
        """It runs its own forwards: what a server reads of a runner (`max_batch_size`,
        `cache`) is its own."""
        return self

    def ensure_capacity(self, capacity: int) -> None:
        """Grow every row's slot count to at least `capacity`, keeping what is cached (a
        benchmark sizes the cache up front: growing it mid-run copies it)."""
        if capacity > self.cache.capacity:
            self.cache = grown(self.cache, self.config, capacity)

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, constraint: Any = None) -> Request:
        refused = self.refusal(params, constraint)
        if refused is not None:
            raise ValueError(f"SamplingParams.{refused[0]}: {refused[1]}")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        need = len(prompt_ids) + params.max_tokens
        if need > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the context length "
                             f"{self.max_model_len}")
        if request_id is None:
            request_id, self._next_id = f"req-{self._next_id}", self._next_id + 1
        r = Request(request_id, list(prompt_ids), params, self.config.mask_id)
        self.waiting.append(r)
        return r

    @staticmethod
    def refusal(params: SamplingParams, constraint: Any = None) -> tuple[str, str] | None:
        """(the SamplingParams field, why) when self-speculative decoding cannot serve `params`
        (a server asks before compiling anything), else None."""
        if params.structured is not None or constraint is not None:
            return "structured", ("self-speculative decoding (a drafter) has no "
                                  "grammar-constrained decoding")
        return None

    def stop_ids(self, params: SamplingParams) -> set[int]:
        eos = set() if params.ignore_eos else {self.config.eos_id}
        return eos | set(params.stop_token_ids)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> Request | None:
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return self._finish(r, "abort")
        if request_id in self.running:
            return self._finish(self.running[request_id][0], "abort")
        return None

    # a finished request as the caller sees it, and stop strings: as the engine does them
    output = Engine.output
    _through_stop_string = Engine._through_stop_string
    _stop_check = Engine._stop_check

    # ---- the loop -------------------------------------------------------------------------------
    @torch.no_grad()  # not inference_mode: abort() resets rows outside any step
    def step(self) -> list[Request]:
        """Admit and prefill waiting requests, then one forward over the running ones; the
        requests that finished."""
        done = self._admit()
        active = [(r, row) for r, row in self.running.values() if not row.done]
        if active:
            t0 = time.perf_counter()
            fed = self.decoder.step_rows(self.cache, [r.row for r, _ in active],
                                         [row for _, row in active],
                                         [self.stop_ids(r.params) for r, _ in active],
                                         [r.params.max_tokens for r, _ in active])
            done += self._settle(active, time.perf_counter() - t0, fed)
        return done

    def _admit(self) -> list[Request]:
        """Prefill waiting requests into free rows (one forward); those already finished."""
        new = []
        while self.waiting and self.free:
            r = self.waiting.popleft()
            r.row = self.free.pop(0)
            new.append(r)
        if not new:
            return []
        self.ensure_capacity(max(len(r.prompt) + r.params.max_tokens for r in new)
                             + 2 * self.decoder.block)
        t0 = time.perf_counter()
        heads = [self.prefix_cache.load(r.prompt, self.cache, r.row) for r in new]
        states = self.decoder.prefill_rows(self.cache, [r.row for r in new],
                                           [r.prompt for r in new], heads,
                                           [self.stop_ids(r.params) for r in new],
                                           [r.params.max_tokens for r in new],
                                           [r.params.logprobs for r in new],
                                           [_sampling(r.params) for r in new])
        for r, row in zip(new, states, strict=True):
            r.seq = row.seq  # shared: the request sees each commit without a copy
            r.token_logprobs = row.token_logprobs  # (the AR model's, when asked for)
            self.running[r.request_id] = (r, row)
            self.prefix_cache.store(r.prompt, self.cache, r.row, len(r.prompt))
        return self._settle(list(zip(new, states, strict=True)), time.perf_counter() - t0,
                            [len(r.prompt) - n for r, n in zip(new, heads, strict=True)])

    def _settle(self, pairs: list[tuple[Request, _Row]], model_s: float,
                fed: list[int]) -> list[Request]:
        """After a forward: sync each request with its row, finish the done ones, count."""
        done, generated = [], 0
        for (r, row), n in zip(pairs, fed, strict=True):
            r.stats.forwards, r.stats.steps = row.res.forwards, row.res.forwards
            r.stats.draft_tokens = row.res.drafted
            r.stats.accepted_tokens = sum(row.res.accepted_at.values())
            r.stats.tokens_processed += n
            r.stats.generated_tokens = len(r.seq) - len(r.prompt)
            if r.stats.first_block_s is None:
                r.stats.first_block_s = time.perf_counter() - r.stats.arrival_s
            text = self._stop_check(r) if r.params.stop else None
            if text is not None:
                r.text, row.done = text, True
            if row.done:
                reason = "stop" if (text is not None or not self.stop_ids(r.params).isdisjoint(
                    r.seq[len(r.prompt):])) else "length"
                done.append(self._finish(r, reason))
                generated += r.stats.generated_tokens
                self.stats.draft_tokens += r.stats.draft_tokens
                self.stats.accepted_tokens += r.stats.accepted_tokens
        self.stats.add_step(rows=len(pairs), tokens_processed=sum(fed), unique_experts=0.0,
                            generated_tokens=generated,
                            laps={"model_s": model_s, "policy_s": 0.0, "grammar_s": 0.0,
                                  "other_s": 0.0})
        return done

    def _finish(self, r: Request, reason: str) -> Request:
        """End a request: its tokens `trimmed` to the first stop and max_tokens, its row freed."""
        r.seq = r.prompt + trimmed(r.seq[len(r.prompt):], self.stop_ids(r.params),
                                   r.params.max_tokens)
        r.finish_reason = reason
        r.stats.generated_tokens = len(r.seq) - len(r.prompt)
        r.stats.total_s = time.perf_counter() - r.stats.arrival_s
        if self.running.pop(r.request_id, None) is not None:
            self.cache.reset_rows([r.row])
            self.free.append(r.row)
        return r


def _sampling(params: SamplingParams) -> RowSampling | None:
    """How a request's tokens are drawn: None (greedy) at temperature 0, else the engine's
    sampler's settings with the request's own generator when it is seeded."""
    if params.temperature == 0:
        return None
    gen = None if params.seed is None else torch.Generator().manual_seed(params.seed)
    return RowSampling(params.temperature, params.top_p, params.top_k, gen)


def load_spec_engine(llm: Any, device: torch.device, dtype: torch.dtype,
                     int8: bool) -> SpecEngine:
    """`LLM(model, draft=...)`: the pair of two adapter directories over one base (`spec_pair`),
    or a pair the caller loaded (`draft` a `RoutedPair`: a benchmark loads it once for many
    engines). Sets the LLM's model and tokenizer."""
    from pathlib import Path

    if isinstance(llm.model, torch.nn.Module) or not Path(llm.model).is_dir():
        raise ValueError(f"draft={llm.draft!r} needs the AR model as an adapter directory "
                         f"(got model={llm.model!r})")
    if llm.compile:
        raise ValueError("compile=True is not supported with a drafter (draft=...)")
    if isinstance(llm.draft, RoutedPair):
        pair, tokenizer = llm.draft, None
    else:
        pair, tokenizer = spec_pair(str(llm.model), str(llm.draft), device, dtype, int8)
    llm.model, llm.tokenizer = pair.model, llm.tokenizer or tokenizer
    return SpecEngine(pair, llm.tokenizer, max_batch_size=llm.max_batch_size,
                      max_model_len=llm.max_model_len, prefix_cache_mb=llm.prefix_cache_mb)


def spec_pair(ar_dir: str, draft_dir: str, device: torch.device, dtype: torch.dtype,
              int8: bool = False) -> tuple[RoutedPair, Any]:
    """(pair, the AR model's tokenizer) as `LLM(draft=)` decodes with it: `load_pair` (the
    drafter as a low-rank difference), on the engine's fused paths (int8: torchao weights,
    unfused)."""
    from pathlib import Path

    from clover.engine.speculative import fuse_pair, load_pair

    if not Path(draft_dir).is_dir():
        raise ValueError(f"draft={draft_dir!r}: no such model directory")
    pair, tokenizer = load_pair(ar_dir, draft_dir, device=device, dtype=dtype)
    if int8:
        from clover.bench.quant import quantize_int8

        quantize_int8(pair.model)
    elif pair.low_rank:
        fuse_pair(pair)
    return pair, tokenizer
