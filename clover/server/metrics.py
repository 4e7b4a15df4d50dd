"""Server metrics through `prometheus_client`, one registry per server, every series labelled
with the served model.

The HTTP layer and the engine loop thread update counters and histograms (prometheus_client is
thread-safe); gauges that derive from them (TPS, TPF, mean batch) and the loop's load are set
when `/metrics` is rendered. The registry also carries the process collector (CPU seconds,
resident memory, open fds) and the platform collector (Python version). Names follow Prometheus
habits (`_total` counters, `_seconds` units) and Clover's metric words (TPS, TPF; DESIGN.md).
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

__all__ = ["CONTENT_TYPE", "Metrics"]

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    def __init__(self, model: str = "clover") -> None:
        self.model = model
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        m = ["model"]
        self._http = Counter("clover_http_requests", "HTTP requests answered.",
                             m + ["endpoint", "status"], registry=r)
        self._finished = Counter("clover_requests_finished", "Generations finished, by reason.",
                                 m + ["finish_reason"], registry=r)
        self._aborted = Counter("clover_requests_aborted",
                                "Generations aborted (client disconnected).", m, registry=r)
        self._prompt = Counter("clover_prompt_tokens", "Prompt tokens of finished requests.", m,
                               registry=r)
        self._generated = Counter("clover_generation_tokens", "Generated tokens (up to and "
                                  "including EOS) of finished requests.", m, registry=r)
        self._steps = Counter("clover_engine_steps", "Engine steps (batched forward passes).", m,
                              registry=r)
        self._busy = Counter("clover_engine_busy_seconds", "Wall time spent in engine steps.", m,
                             registry=r)
        # self-speculative decoding (`clover serve --draft`), as vLLM's spec_decode counters
        self._drafts = Counter("clover_spec_decode_draft_tokens", "Drafter tokens put to the AR "
                               "model's check (finished requests).", m, registry=r)
        self._accepted = Counter("clover_spec_decode_accepted_tokens", "Drafter tokens the AR "
                                 "model accepted (finished requests).", m, registry=r)
        self._gauges = {name: Gauge(name, help_, m, registry=r) for name, help_ in _GAUGES}
        self._hist = {name: Histogram(name, help_, m, buckets=buckets, registry=r)
                      for name, help_, buckets in _HISTOGRAMS}
        self._lock = threading.Lock()
        # plain totals for derived gauges and for tests
        self.aborted = self.generated_tokens = self.forwards = self.steps = self.rows_sum = 0
        self.draft_tokens = self.accepted_tokens = 0
        self.busy_s = 0.0
        self.last_batch = 0

    # ---- updates --------------------------------------------------------------------------------
    def count_http(self, endpoint: str, status: int) -> None:
        self._http.labels(self.model, endpoint, str(status)).inc()

    def count_abort(self) -> None:
        with self._lock:
            self.aborted += 1
        self._aborted.labels(self.model).inc()

    def observe_step(self, seconds: float, rows: int) -> None:
        with self._lock:
            self.steps += 1
            self.busy_s += seconds
            self.last_batch = rows
            self.rows_sum += rows
        self._steps.labels(self.model).inc()
        self._busy.labels(self.model).inc(seconds)
        self._hist["clover_step_seconds"].labels(self.model).observe(seconds)

    def observe_queue(self, seconds: float) -> None:
        self._hist["clover_queue_wait_seconds"].labels(self.model).observe(seconds)

    def observe_compile(self, seconds: float) -> None:
        self._hist["clover_grammar_compile_seconds"].labels(self.model).observe(seconds)

    def observe_finished(self, job: Any, out: Any) -> None:
        """A request finished in the engine: `job` a worker Job, `out` its RequestOutput."""
        s = out.stats
        with self._lock:
            self.generated_tokens += s.generated_tokens
            self.forwards += s.forwards
            self.draft_tokens += s.draft_tokens
            self.accepted_tokens += s.accepted_tokens
        if s.draft_tokens:
            self._drafts.labels(self.model).inc(s.draft_tokens)
            self._accepted.labels(self.model).inc(s.accepted_tokens)
        self._finished.labels(self.model, out.finish_reason).inc()
        self._prompt.labels(self.model).inc(len(out.prompt_token_ids))
        self._generated.labels(self.model).inc(s.generated_tokens)
        queued = job.request.stats.arrival_s - job.submitted_s
        self._hist["clover_request_latency_seconds"].labels(self.model).observe(
            queued + s.total_s)
        if s.first_block_s is not None:
            self._hist["clover_time_to_first_block_seconds"].labels(self.model).observe(
                queued + s.first_block_s)

    # ---- exposition -----------------------------------------------------------------------------
    def render(self, load: dict[str, int], loop_busy_s: float = 0.0,
               prefix: dict[str, float] | None = None) -> bytes:
        """`prefix`: the engine's prefix-cache counters (`PrefixCache.as_dict`)."""
        prefix = prefix or {}
        with self._lock:
            values = {
                "clover_tokens_per_second": self.generated_tokens / self.busy_s
                if self.busy_s else 0.0,
                "clover_tokens_per_forward": self.generated_tokens / self.forwards
                if self.forwards else 0.0,
                "clover_batch_size": self.last_batch,
                "clover_batch_size_mean": self.rows_sum / self.steps if self.steps else 0.0,
                "clover_queue_depth": load["queued"],
                "clover_running_requests": load["running"],
                "clover_tokens_in_flight": load["tokens_in_flight"],
                "clover_engine_loop_busy_seconds": loop_busy_s,
                "clover_prefix_cache_hit_rate": prefix.get("prefix_cache_hit_rate", 0.0),
                "clover_prefix_cache_hit_tokens": prefix.get("prefix_cache_hit_tokens", 0),
                "clover_prefix_cache_megabytes": prefix.get("prefix_cache_mb", 0.0),
                "clover_spec_decode_acceptance_rate": self.accepted_tokens / self.draft_tokens
                if self.draft_tokens else 0.0}
        for name, value in values.items():
            self._gauges[name].labels(self.model).set(value)
        return generate_latest(self.registry)


_GAUGES = (
    ("clover_tokens_per_second", "TPS: generated tokens / engine busy seconds, over the "
     "server's life."),
    ("clover_tokens_per_forward", "TPF: generated tokens / forwards, averaged over finished "
     "requests."),
    ("clover_batch_size", "Rows in the last engine step."),
    ("clover_batch_size_mean", "Mean rows per engine step."),
    ("clover_queue_depth", "Requests waiting for a batch row."),
    ("clover_running_requests", "Requests in the running batch."),
    ("clover_tokens_in_flight", "Prompt + max_tokens of running requests."),
    ("clover_engine_loop_busy_seconds", "How long the engine loop has been in its current tick "
     "(large: a stalled loop)."),
    ("clover_prefix_cache_hit_rate", "Share of admitted prompt tokens whose keys and values came "
     "from the prefix cache."),
    ("clover_prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache."),
    ("clover_prefix_cache_megabytes", "Memory the prefix cache holds."),
    ("clover_spec_decode_acceptance_rate", "Self-speculative decoding: accepted / drafted "
     "tokens over the server's life (0 without a drafter)."),
)
_HISTOGRAMS = (
    ("clover_request_latency_seconds", "Submit to last token.", LATENCY_BUCKETS),
    ("clover_time_to_first_block_seconds", "Submit to the first committed block.",
     LATENCY_BUCKETS),
    ("clover_queue_wait_seconds", "Submit to admission.", LATENCY_BUCKETS),
    ("clover_step_seconds", "Engine step wall time.", STEP_BUCKETS),
    ("clover_grammar_compile_seconds", "Grammar compilation of one request (sandbox check and "
     "compile).", LATENCY_BUCKETS),
)
