"""Server metrics in the Prometheus text format (written here; no client library needed).

Counters, gauges and histograms are updated by the HTTP layer and the engine loop thread under one
lock; `render` writes the exposition text for `GET /metrics`. Names follow Prometheus habits
(`_total` counters, `_seconds` units) and Clover's metric words (TPS, TPF; see DESIGN.md).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, x: float) -> None:
        self.n += 1
        self.total += x
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts,
                                                               strict=True)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total:.6f}",
                      f"{name}_count {self.n}"]


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.http = defaultdict(int)  # (endpoint, status) -> count
        self.finished = defaultdict(int)  # finish_reason -> count
        self.aborted = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.forwards = 0  # summed over requests: sum of each request's forwards
        self.steps = 0
        self.busy_s = 0.0
        self.last_batch = 0
        self.rows_sum = 0
        self.latency = Histogram(LATENCY_BUCKETS)
        self.first_block = Histogram(LATENCY_BUCKETS)
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        self.step_time = Histogram(STEP_BUCKETS)

    # ---- updates --------------------------------------------------------------------------------
    def count_http(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.http[(endpoint, status)] += 1

    def count_abort(self) -> None:
        with self._lock:
            self.aborted += 1

    def observe_step(self, seconds: float, rows: int) -> None:
        with self._lock:
            self.steps += 1
            self.busy_s += seconds
            self.last_batch = rows
            self.rows_sum += rows
            self.step_time.observe(seconds)

    def observe_queue(self, seconds: float) -> None:
        with self._lock:
            self.queue_wait.observe(seconds)

    def observe_finished(self, job: Any, out: Any) -> None:
        """A request finished in the engine: `job` a worker Job, `out` its RequestOutput."""
        s = out.stats
        with self._lock:
            self.finished[out.finish_reason] += 1
            self.prompt_tokens += len(out.prompt_token_ids)
            self.generated_tokens += s.generated_tokens
            self.forwards += s.forwards
            queued = job.request.stats.arrival_s - job.submitted_s
            self.latency.observe(queued + s.total_s)
            if s.first_block_s is not None:
                self.first_block.observe(queued + s.first_block_s)

    # ---- exposition -----------------------------------------------------------------------------
    def render(self, load: dict[str, int]) -> str:
        with self._lock:
            return "\n".join(self._lines(load)) + "\n"

    def _lines(self, load: dict[str, int]) -> list[str]:
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, Any]]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
            out.extend(f"{name}{labels} {value}" for labels, value in samples)

        metric("clover_http_requests_total", "counter", "HTTP requests answered.",
               [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in sorted(self.http.items())])
        metric("clover_requests_finished_total", "counter", "Generations finished, by reason.",
               [(f'{{finish_reason="{r}"}}', n) for r, n in sorted(self.finished.items())])
        metric("clover_requests_aborted_total", "counter",
               "Generations aborted (client disconnected).", [("", self.aborted)])
        metric("clover_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               [("", self.prompt_tokens)])
        metric("clover_generation_tokens_total", "counter",
               "Generated tokens (up to and including EOS) of finished requests.",
               [("", self.generated_tokens)])
        metric("clover_engine_steps_total", "counter", "Engine steps (batched forward passes).",
               [("", self.steps)])
        metric("clover_engine_busy_seconds_total", "counter", "Wall time spent in engine steps.",
               [("", round(self.busy_s, 6))])
        tps = self.generated_tokens / self.busy_s if self.busy_s else 0.0
        metric("clover_tokens_per_second", "gauge",
               "TPS: generated tokens / engine busy seconds, over the server's life.",
               [("", round(tps, 3))])
        tpf = self.generated_tokens / self.forwards if self.forwards else 0.0
        metric("clover_tokens_per_forward", "gauge",
               "TPF: generated tokens / forwards, averaged over finished requests.",
               [("", round(tpf, 4))])
        metric("clover_queue_depth", "gauge", "Requests waiting for a batch row.",
               [("", load["queued"])])
        metric("clover_running_requests", "gauge", "Requests in the running batch.",
               [("", load["running"])])
        metric("clover_tokens_in_flight", "gauge", "Prompt + max_tokens of running requests.",
               [("", load["tokens_in_flight"])])
        metric("clover_batch_size", "gauge", "Rows in the last engine step.",
               [("", self.last_batch)])
        mean = self.rows_sum / self.steps if self.steps else 0.0
        metric("clover_batch_size_mean", "gauge", "Mean rows per engine step.",
               [("", round(mean, 3))])
        for name, hist, help_ in (
                ("clover_request_latency_seconds", self.latency, "Submit to last token."),
                ("clover_time_to_first_block_seconds", self.first_block,
                 "Submit to the first committed block."),
                ("clover_queue_wait_seconds", self.queue_wait, "Submit to admission."),
                ("clover_step_seconds", self.step_time, "Engine step wall time.")):
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} histogram"])
            out.extend(hist.lines(name))
        return out
