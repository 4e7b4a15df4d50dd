"""The engine loop: one thread owns the `Engine`; HTTP handlers talk to it through queues.

Handlers `submit` jobs (a bounded queue: `QueueFull` when more than `max_queue` jobs would wait
beyond the free batch rows) and `abort` them; both are thread-safe and never touch the engine.
A job arrives with its grammar constraint already compiled (off this thread), so the loop never
waits on a compiler. The loop thread admits waiting jobs between steps while a
batch row and the tokens-in-flight budget allow, steps the engine, and posts events back to each
job's asyncio queue with `loop.call_soon_threadsafe`: `Started`, then (streams) `Update`s of the
settled ids, then `Finished` or `Failed`. A failure is reported to its own request only: a grammar
error aborts that request, a failed step fails the requests in that batch, and the loop lives on.
`heartbeat` tells /health how long the loop has been busy with one tick (a stall shows there);
`evict` ends every job with an error (graceful shutdown, once the grace period is over).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from clover.engine.llm import Engine
from clover.engine.logprobs import TokenLogprob
from clover.engine.params import SamplingParams
from clover.engine.request import Request, RequestOutput
from clover.server.metrics import Metrics

log = logging.getLogger("clover.server")


# ---- events -------------------------------------------------------------------------------------
@dataclass
class Started:
    queued_s: float


@dataclass
class Update:
    settled_ids: list[int]  # every generated id that can no longer change, in order
    block: list[int] | None = None  # the active block (mask id where masked), if asked for
    settled_in_block: int = 0
    logprobs: list | None = None  # TokenLogprob of each settled id, if asked for


@dataclass
class Finished:
    output: RequestOutput


@dataclass
class Failed:
    status: int  # 400: the request could not be admitted; 500: generation failed
    message: str
    code: str | None = None


Event = Started | Update | Finished | Failed


def context_length(engine: Engine) -> int:
    """Most tokens (prompt + generated) one request may hold."""
    return getattr(engine, "max_model_len", None) or engine.runner.cache.capacity


def settled_logprobs(r: Request, settled: list[int]) -> list[TokenLogprob]:
    """The recorded logprob of each settled id (0.0 for one the grammar forced)."""
    start, out = len(r.prompt), []
    for i, token in enumerate(settled):
        entry = r.token_logprobs.get(start + i)
        out.append(entry if entry is not None and entry.token_id == token else
                   TokenLogprob(token, 0.0, [(token, 0.0)] if r.params.logprobs else []))
    return out


class QueueFull(Exception):
    """The waiting queue is full; answer 429 and let the client retry."""


class WorkerDead(Exception):
    """The loop thread is not running."""


@dataclass(eq=False)
class Job:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    stream: bool = False
    provisional: bool = False
    index: int = 0  # which of the request's n choices (events are posted as (index, event))
    constraint: Any = None  # compiled grammar constraint for params.structured, if any
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted_s: float = field(default_factory=time.perf_counter)
    # owned by the loop thread
    request: Request | None = None
    sent: int = 0
    sent_block: list[int] | None = None

    @property
    def tokens(self) -> int:
        """KV-cache slots the job may need: prompt + max_tokens."""
        return len(self.prompt_ids) + self.params.max_tokens

    def post(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class GuardedConstraint:
    """Wraps a request's grammar constraint so an exception in it fails only that request."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.error = inner, None

    def _call(self, name: str, *args: Any) -> Any:
        if self.error is None:
            try:
                return getattr(self.inner, name)(*args)
            except Exception as e:  # noqa: BLE001 - reported to the request, see Worker._failed
                self.error = f"{type(e).__name__}: {e}"
                log.error("grammar error in one request:\n%s", traceback.format_exc())
        return None

    def __getattr__(self, name: str) -> Any:  # anything else the grammar offers
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def frontier(self, request: Request) -> int:
        value = self._call("frontier", request)
        return len(request.seq) if value is None else value

    def mask_logits(self, request: Request, masked: list[int], logits_MV: Any) -> None:
        self._call("mask_logits", request, masked, logits_MV)

    def after_commit(self, request: Request) -> None:
        self._call("after_commit", request)


# ---- the loop -----------------------------------------------------------------------------------
class EngineWorker:
    def __init__(self, engine: Engine, *, max_queue: int = 256,
                 max_tokens_in_flight: int | None = None, metrics: Metrics | None = None,
                 idle_wait_s: float = 0.5) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (got {max_queue})")
        self.engine = engine
        self.max_batch = engine.runner.max_batch_size
        self.capacity = context_length(engine)
        self.max_tokens_in_flight = max_tokens_in_flight or self.max_batch * self.capacity
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.idle_wait_s = idle_wait_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: deque[Job] = deque()
        self._aborts: set[str] = set()
        self._running: dict[str, Job] = {}
        self._tokens_in_flight = 0
        self._evict: tuple[int, str, str] | None = None
        self._beat = time.monotonic()  # when the loop last started a tick
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- called from the event loop (any thread) -------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="clover-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, *jobs: Job) -> None:
        """Queue jobs (all or none: the n choices of one request go together)."""
        if not self.alive:
            raise WorkerDead("the engine loop is not running")
        for job in jobs:
            if job.tokens > self.max_tokens_in_flight:
                raise ValueError(f"prompt + max_tokens = {job.tokens} tokens exceeds the "
                                 f"server's max tokens in flight ({self.max_tokens_in_flight})")
        with self._lock:
            # jobs that would wait: queued or new, beyond the rows free now
            free = self.max_batch - len(self._running)
            if len(self._pending) + len(jobs) - free > self.max_queue:
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting)")
            self._pending.extend(jobs)
        self._wake.set()

    def evict(self, status: int, message: str, code: str) -> None:
        """End every queued and running job with this error (from any thread)."""
        with self._lock:
            self._evict = (status, message, code)
        self._wake.set()

    def heartbeat(self) -> float:
        """Seconds since the loop last began a tick (small unless a step or admission hangs)."""
        return time.monotonic() - self._beat

    def abort(self, request_id: str) -> None:
        """Drop a job (the client went away); frees its batch row before the next step."""
        with self._lock:
            for job in self._pending:
                if job.request_id == request_id:
                    self._pending.remove(job)
                    self.metrics.count_abort()
                    return
            self._aborts.add(request_id)
        self._wake.set()

    def load(self) -> dict[str, int]:
        """Queue depth, running requests and tokens in flight (for /health and /metrics)."""
        with self._lock:
            return {"queued": len(self._pending), "running": len(self._running),
                    "tokens_in_flight": self._tokens_in_flight}

    # ---- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.error("engine loop error:\n%s", traceback.format_exc())
                self._fail_running("internal error in the engine loop")
        self._fail_running("the server is shutting down", status=503, code="shutting_down")

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self._apply_evict()
        self._apply_aborts()
        self._admit()
        if not self._running:
            self._wake.wait(self.idle_wait_s)
            self._wake.clear()
            return
        if not self.engine.has_unfinished():  # cannot happen; never spin on an empty batch
            self._fail_running("internal error: the engine lost track of these requests")
            return
        t0 = time.perf_counter()
        try:
            done = self.engine.step()
        except Exception as e:  # noqa: BLE001 - reported to the requests of this batch
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._fail_running(f"generation failed: {type(e).__name__}: {e}")
            return
        self.metrics.observe_step(time.perf_counter() - t0, len(self._running))
        self._publish(done)

    def _apply_evict(self) -> None:
        with self._lock:
            evict, self._evict = self._evict, None
            pending = list(self._pending) if evict else []
            if evict:
                self._pending.clear()
        if evict is None:
            return
        status, message, code = evict
        for job in pending:
            job.post(Failed(status, message, code))
        self._fail_running(message, status=status, code=code)

    def _apply_aborts(self) -> None:
        with self._lock:
            aborts, self._aborts = self._aborts, set()
        for rid in aborts:
            job = self._running.get(rid)
            if job is not None:
                self.engine.abort(rid)
                self._release(job)
                self.metrics.count_abort()

    def _admit(self) -> None:
        while True:
            with self._lock:
                if not self._pending or not self._has_room(self._pending[0]):
                    return
                job = self._pending.popleft()
            self._start(job)

    def _has_room(self, job: Job) -> bool:
        if len(self._running) >= self.max_batch:
            return False
        return not self._running or (self._tokens_in_flight + job.tokens
                                     <= self.max_tokens_in_flight)

    def _start(self, job: Job) -> None:
        try:
            r = self.engine.add_request(job.prompt_ids, job.params, job.request_id,
                                        constraint=job.constraint)
        except Exception as e:  # noqa: BLE001 - a request the engine refuses is a client error
            job.post(Failed(400, str(e), "invalid_request"))
            return
        if r.constraint is not None:
            r.constraint = GuardedConstraint(r.constraint)
        job.request = r
        with self._lock:
            self._running[job.request_id] = job
            self._tokens_in_flight += job.tokens
        queued = time.perf_counter() - job.submitted_s
        self.metrics.observe_queue(queued)
        job.post(Started(queued))

    def _release(self, job: Job) -> None:
        with self._lock:
            if self._running.pop(job.request_id, None) is not None:
                self._tokens_in_flight -= job.tokens

    def _publish(self, done: list[Request]) -> None:
        finished = {r.request_id for r in done}
        for job in list(self._running.values()):
            r = job.request
            guard = r.constraint if isinstance(r.constraint, GuardedConstraint) else None
            if guard is not None and guard.error is not None:
                if r.request_id not in finished:
                    self.engine.abort(r.request_id)
                self._release(job)
                job.post(Failed(500, f"structured output failed: {guard.error}",
                                "grammar_error"))
            elif r.request_id in finished:
                self._release(job)
                out = self._output(r)
                self.metrics.observe_finished(job, out)
                job.post(Finished(out))
            elif job.stream:
                self._post_update(job)

    def _post_update(self, job: Job) -> None:
        r = job.request
        settled = r.settled_ids()
        block = list(r.block) if job.provisional else None
        if len(settled) == job.sent and block == job.sent_block:
            return
        job.sent, job.sent_block = len(settled), block
        in_block = len(settled) - r.num_generated
        logprobs = settled_logprobs(r, settled) if r.params.logprobs is not None else None
        job.post(Update(settled, block, in_block, logprobs))

    def _output(self, r: Request) -> RequestOutput:
        return self.engine.output(r)

    def _fail_running(self, message: str, status: int = 500,
                      code: str = "generation_error") -> None:
        for job in list(self._running.values()):
            try:
                self.engine.abort(job.request_id)
            except Exception:  # noqa: BLE001 - the engine is already in trouble
                log.error("abort failed:\n%s", traceback.format_exc())
            self._release(job)
            job.post(Failed(status, message, code))
        if self._stopping:
            with self._lock:
                pending, self._pending = list(self._pending), deque()
            for job in pending:
                job.post(Failed(status, message, "shutting_down"))
