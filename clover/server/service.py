"""`CloverServer`: the model, its engine loop, the grammar compiler, and running one request.

`execute` takes a `Plan` (planning.py): compiles its grammar in a thread (time / memory / size
budgets, in sandbox processes; cancelled when the client leaves), submits its n jobs to the
engine loop (`worker.py`), then answers with a stream (streaming.py), the finished body
(responses.py) or an error. A failure inside generation fails only its own request. `drain`
is the graceful shutdown: refuse new requests, let running ones finish within a grace period,
then end the rest with an error. HTTP routing lives in app.py, the front door in guard.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import hashlib
import json
import logging
import threading
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from clover.engine.llm import LLM
from clover.server.config import DEFAULT_MODEL, ServerConfig
from clover.server.metrics import Metrics
from clover.server.planning import Plan, Planner, full_schema_check
from clover.server.protocol import ApiError
from clover.server.responses import Responder
from clover.server.streaming import sse_events
from clover.server.worker import (
    EngineWorker,
    Failed,
    Finished,
    Job,
    QueueFull,
    Started,
    WorkerDead,
    context_length,
)

log = logging.getLogger("clover.server")
CLIENT_CLOSED = 499  # nginx's status for "client closed the request"; never seen by the client


def grammar_compiler(tokenizer: Any, config: Any, server_config: ServerConfig) -> Any:
    """A `GrammarCompiler` with the configured budgets, or None without the grammar backend."""
    if tokenizer is None:
        return None
    try:
        from clover.grammar.compiler import CompileBudget, GrammarCompiler
    except ImportError:
        return None
    budget = CompileBudget(time_s=server_config.grammar_time_budget,
                           memory_mb=server_config.grammar_memory_budget,
                           max_bytes=server_config.grammar_max_bytes,
                           workers=server_config.grammar_workers)
    try:
        return GrammarCompiler(tokenizer, config, budget)
    except ValueError as e:  # e.g. a tokenizer llguidance cannot use: serve without grammars
        log.warning("structured output disabled: %s", e)
        return None


class CloverServer:
    """The model, its engine loop and the request logic; `create_app` puts HTTP in front."""

    def __init__(self, llm: LLM, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.llm, self.engine = llm, llm.engine
        self.tokenizer = _own_copy(llm.tokenizer)
        self.model_name = self.config.served_model_name or _model_name(self.config.model)
        self.capacity = context_length(self.engine)
        self.metrics = Metrics(self.model_name)
        self.worker = EngineWorker(self.engine, max_queue=self.config.max_queue,
                                   max_tokens_in_flight=self.config.max_tokens_in_flight,
                                   metrics=self.metrics)
        self.grammar = grammar_compiler(_own_copy(llm.tokenizer), self.engine.config, self.config)
        digest = json.dumps(self.engine.config.to_dict(), sort_keys=True).encode()
        self.fingerprint = "fp_clover_" + hashlib.sha256(digest).hexdigest()[:10]
        self.created = int(time.time())
        self.planner = Planner(self, _own_copy(llm.tokenizer))
        self.responder = Responder(self.model_name, self.fingerprint, self.decode)
        # one planning thread (the tokenizer is not thread-safe), one per grammar compilation
        self.plan_pool = concurrent.futures.ThreadPoolExecutor(1, "clover-plan")
        self.compile_pool = concurrent.futures.ThreadPoolExecutor(
            self.config.grammar_workers, "clover-grammar")
        self.draining = False

    @classmethod
    def load(cls, config: ServerConfig) -> CloverServer:
        from pathlib import Path

        from clover.config import PRESETS

        if config.model not in PRESETS and not Path(config.model).is_dir():
            hint = (" (the default model is not built yet)" if config.model == DEFAULT_MODEL
                    else "")
            raise ValueError(f"--model {config.model!r}: no such model directory{hint}; pass "
                             "a model directory, or a preset such as `tiny` for random weights")
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        llm = LLM(config.model, device=config.device, dtype=config.dtype,
                  max_batch_size=config.max_batch, max_model_len=config.max_model_len,
                  prefix_cache_mb=config.prefix_cache_mb, compile=config.compile,
                  draft=config.draft)
        return cls(llm, config)

    def close(self) -> None:
        self.worker.stop()
        if self.grammar is not None:
            self.grammar.close()
        self.plan_pool.shutdown(wait=False, cancel_futures=True)
        self.compile_pool.shutdown(wait=False, cancel_futures=True)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def plan(self, kind: str, body: bytes) -> Plan:
        """Validate and plan off the event loop (large schemas take a while to check)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.plan_pool, self.planner.plan, kind, body)

    # ---- execution ------------------------------------------------------------------------------
    async def execute(self, http: Request, plan: Plan) -> Response:
        """Compile, submit the n jobs; answer with their stream, their result, or an error."""
        watcher = asyncio.ensure_future(_wait_disconnect(http))
        jobs: list[Job] = []
        handed_off = False  # the jobs have ended, or a stream now owns them
        try:
            constraints = await self._compile(plan, watcher)
            if constraints is None:
                return Response(status_code=CLIENT_CLOSED)
            queue: asyncio.Queue = asyncio.Queue()
            jobs = self._jobs(plan, constraints, queue)
            self._submit(jobs)
            first = await self._admitted(jobs, queue, watcher)
            if first is None:
                return Response(status_code=CLIENT_CLOSED)
            if isinstance(first, Failed):  # the finally clause aborts the other choices
                raise ApiError(first.status, first.message, code=first.code)
            if plan.stream:
                watcher.cancel()  # from here on StreamingResponse watches the connection
                handed_off = True
                return StreamingResponse(sse_events(self, plan, jobs, queue),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            outputs = await self._finished(jobs, queue, watcher)
            handed_off = outputs is not None
            if outputs is None:
                return Response(status_code=CLIENT_CLOSED)
            return JSONResponse(self.responder.body(plan, outputs))
        finally:
            watcher.cancel()
            if not handed_off:
                for job in jobs:
                    self.worker.abort(job.request_id)

    def _jobs(self, plan: Plan, constraints: list, queue: asyncio.Queue) -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs = []
        for i in range(plan.n):
            params = plan.params
            if i and params.seed is not None:
                params = params.replace(seed=(params.seed + i) % 2**64)
            jobs.append(Job(f"{plan.request_id}-{i}", plan.prompt_ids, params, loop,
                            stream=plan.stream, provisional=plan.provisional, index=i,
                            constraint=constraints[i], events=queue))
        return jobs

    async def _compile(self, plan: Plan, watcher: asyncio.Future) -> list | None:
        """One grammar constraint per choice ([None] * n without structured output); None if
        the client left while compiling."""
        if plan.params.structured is None and not plan.schema_checks:
            return [None] * plan.n
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self.compile_pool, self._build_all, plan, cancel)
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            cancel.set()
            return None
        try:
            return work.result()
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - a grammar that will not compile is a 4xx
            raise _grammar_error(e, plan) from None

    def _build_all(self, plan: Plan, cancel: threading.Event) -> list:
        """The plan's schemas checked with jsonschema, then one constraint per choice."""
        from clover.grammar.compiler import Cancelled

        t0 = time.perf_counter()
        try:
            for schema, param in plan.schema_checks:
                full_schema_check(schema, param, self.config.grammar_max_bytes)
            structured, prompt_len = plan.params.structured, len(plan.prompt_ids)
            if structured is None:
                return [None] * plan.n
            return [self.grammar.build(structured, prompt_len, cancel) for _ in range(plan.n)]
        except Cancelled:
            return [None] * plan.n  # the client is gone; nobody reads this
        finally:
            self.metrics.observe_compile(time.perf_counter() - t0)

    def _submit(self, jobs: list[Job]) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        try:
            self.worker.submit(*jobs)
        except QueueFull as e:
            raise ApiError(429, f"{e}; retry shortly", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except WorkerDead as e:
            raise ApiError(503, str(e), code="engine_unavailable") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="max_tokens", code="too_many_tokens") from None

    async def _admitted(self, jobs: list[Job], queue: asyncio.Queue,
                        watcher: asyncio.Future) -> Any:
        """Started once every job is admitted (other events are put back in order), the first
        Failed, or None if the client left."""
        waiting, held = {job.index for job in jobs}, []
        while waiting:
            item = await _next_event(queue, watcher)
            if item is None:
                return None
            index, event = item
            if isinstance(event, Failed):
                return event
            if isinstance(event, Started):
                waiting.discard(index)
            else:
                held.append(item)
        later = []
        while not queue.empty():
            later.append(queue.get_nowait())
        for item in held + later:  # in the order they were posted
            queue.put_nowait(item)
        return Started(0.0)

    async def _finished(self, jobs: list[Job], queue: asyncio.Queue,
                        watcher: asyncio.Future) -> list | None:
        outputs: dict[int, Any] = {}
        while len(outputs) < len(jobs):
            item = await _next_event(queue, watcher)
            if item is None:
                return None
            index, event = item
            if isinstance(event, Failed):
                for job in jobs:
                    self.worker.abort(job.request_id)
                raise ApiError(event.status, event.message, code=event.code)
            if isinstance(event, Finished):
                outputs[index] = event.output
        return [outputs[i] for i in range(len(jobs))]

    # ---- lifecycle ------------------------------------------------------------------------------
    async def drain(self, grace_s: float) -> None:
        """Graceful shutdown: refuse new requests, wait up to grace_s for running ones, then
        end every remaining one with an error event (streams still get `[DONE]`)."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            load = self.worker.load()
            if not load["queued"] and not load["running"]:
                return
            await asyncio.sleep(0.05)
        log.warning("shutdown grace period of %s s over: ending running requests", grace_s)
        self.worker.evict(503, f"the server is shutting down (grace period of {grace_s:g} s "
                          "over)", "shutting_down")
        await asyncio.sleep(0.2)  # let the loop post the errors before connections close

    def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) for GET /health: 503 when the loop is dead, stalled or draining."""
        age = self.worker.heartbeat()
        body = {"model": self.model_name, "loop_busy_s": round(age, 3),
                "stall_after_s": self.config.stall_after} | self.worker.load()
        if not self.worker.alive:
            return 503, body | {"status": "engine loop not running"}
        if age > self.config.stall_after:
            return 503, body | {"status": f"engine loop stalled: busy for {age:.1f} s"}
        if self.draining:
            return 503, body | {"status": "shutting down"}
        return 200, body | {"status": "ok"}


def _grammar_error(e: Exception, plan: Plan) -> ApiError:
    param = "tools" if "tools" in (plan.params.structured or {}) else "response_format"
    limit = getattr(e, "limit", None)
    if limit is not None:
        return ApiError(400, f"{e}; simplify the schema", param=param,
                        code=f"grammar_{limit}_budget_exceeded")
    if isinstance(e, ValueError):
        return ApiError(400, str(e), param=param, code="invalid_grammar")
    log.warning("grammar compilation failed unexpectedly", exc_info=True)
    return ApiError(400, f"the grammar cannot be compiled: {type(e).__name__}: {e}",
                    param=param, code="invalid_grammar")


def _own_copy(tokenizer: Any) -> Any:
    """A tokenizer for one thread alone: the engine thread decodes with its own (for stop
    strings), and a fast tokenizer must not be used by two threads at once."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - not copyable: share it (no known tokenizer gets here)
        return tokenizer


def _model_name(model: str) -> str:
    from pathlib import Path

    return Path(model).name or model


async def _wait_disconnect(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _next_event(queue: asyncio.Queue, watcher: asyncio.Future) -> Any:
    """The next (index, event), or None once the client has disconnected."""
    if watcher.done():
        return None
    get = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if get in done and not watcher.done():
        return get.result()
    get.cancel()
    return None
