"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/models, /health,
/metrics.

Handlers validate and tokenize, then hand a `Job` to the one engine loop thread (`worker.py`) and
await its events; streams send settled text as the engine commits it (SSE, `data: [DONE]`). Every
bad input is a 4xx OpenAI error object; a failure inside generation fails only its own request.
A pure-ASGI guard in front checks the API key, caps the body size and counts responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clover.engine.llm import LLM
from clover.engine.params import SamplingParams
from clover.server import output as out_
from clover.server.config import DEFAULT_MODEL, ServerConfig
from clover.server.metrics import Metrics
from clover.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    Message,
    parse_request,
)
from clover.server.worker import (
    EngineWorker,
    Failed,
    Finished,
    Job,
    QueueFull,
    Started,
    Update,
    WorkerDead,
    context_length,
)

log = logging.getLogger("clover.server")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
CLIENT_CLOSED = 499  # nginx's status for "client closed the request"; never seen by the client


def grammar_backend():
    """`clover.grammar.build_constraint`, or None while the grammar backend is not installed."""
    try:
        from clover.grammar import build_constraint
    except ImportError:
        return None
    return build_constraint


@dataclass
class Plan:
    """A validated request, ready for the engine."""

    kind: str  # chat | completion
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    provisional: bool = False
    tools: bool = False  # parse tool calls out of the answer
    parallel: bool = True
    prefix: str = ""  # forced start of the answer (tool_choice without a grammar backend)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


class CloverServer:
    """The model, its engine loop and the request logic; `create_app` puts HTTP in front."""

    def __init__(self, llm: LLM, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.llm, self.engine = llm, llm.engine
        self.tokenizer = _own_copy(llm.tokenizer)
        self.model_name = self.config.served_model_name or _model_name(self.config.model)
        self.capacity = context_length(self.engine)
        self.metrics = Metrics()
        self.worker = EngineWorker(self.engine, max_queue=self.config.max_queue,
                                   max_tokens_in_flight=self.config.max_tokens_in_flight,
                                   metrics=self.metrics)
        self.grammar = grammar_backend()
        digest = json.dumps(self.engine.config.to_dict(), sort_keys=True).encode()
        self.fingerprint = "fp_clover_" + hashlib.sha256(digest).hexdigest()[:10]
        self.created = int(time.time())

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
                  max_batch_size=config.max_batch, max_model_len=config.max_model_len)
        return cls(llm, config)

    # ---- planning: body -> Plan (raises ApiError) -----------------------------------------------
    def plan_chat(self, req: ChatCompletionRequest) -> Plan:
        self._check_model(req.model)
        if self.tokenizer is None:
            raise ApiError(400, f"model {self.model_name!r} has no tokenizer: chat needs a model "
                           "directory with tokenizer.json; use /v1/completions with token ids")
        for i, m in enumerate(req.messages):
            _check_message(m, i)
        tools, choice = self._tool_setup(req)
        structured, prefix = self._structure(req, tools, choice)
        messages = [m.as_template_input() for m in req.messages]
        text = self._render(messages, tools if choice != "none" else None) + prefix
        ids = self.tokenizer.encode(text)
        max_tokens = req.max_completion_tokens or req.max_tokens
        params = self._params(req, len(ids), max_tokens, structured)
        return Plan("chat", ids, params, tools=bool(tools) and choice != "none",
                    parallel=req.parallel_tool_calls, prefix=prefix, **_stream_flags(req))

    def plan_completion(self, req: CompletionRequest) -> Plan:
        self._check_model(req.model)
        ids = self._prompt_ids(req.prompt)
        params = self._params(req, len(ids), req.max_tokens, None)
        return Plan("completion", ids, params, **_stream_flags(req))

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(404, f"The model '{name}' does not exist; this server serves "
                           f"'{self.model_name}' (see GET /v1/models)", param="model",
                           code="model_not_found")

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ApiError(400, "send one prompt per request (got a batch of "
                               f"{len(prompt)})", param="prompt", code="unsupported_parameter")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ApiError(400, f"model {self.model_name!r} has no tokenizer: send the "
                               "prompt as a list of token ids", param="prompt")
            return self.tokenizer.encode(prompt)
        vocab = self.engine.config.vocab_size
        if not all(0 <= t < vocab for t in prompt):
            raise ApiError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        return list(prompt)

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        from clover.tokenizer import render_chat

        try:
            return render_chat(self.tokenizer, messages, tools=tools)
        except Exception as e:  # noqa: BLE001 - jinja errors: the messages do not render
            raise ApiError(400, f"the messages cannot be rendered with the chat template: {e}",
                           param="messages") from None

    def _tool_setup(self, req: ChatCompletionRequest) -> tuple[list[dict], Any]:
        """(tools as dicts, tool_choice as "none"|"auto"|"required"|function name)."""
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        names = [t["function"]["name"] for t in tools]
        for i, t in enumerate(tools):
            if names.index(t["function"]["name"]) != i:
                raise ApiError(400, f"duplicate tool name {names[i]!r}",
                               param=f"tools[{i}].function.name")
            params = t["function"].get("parameters")
            if params is not None:
                check_schema(params, f"tools[{i}].function.parameters", object_only=True)
        choice = req.tool_choice
        if choice is None:
            return tools, "auto" if tools else "none"
        name = choice if isinstance(choice, str) else choice.function.name
        if name not in ("none", "auto") and not tools:
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        if not isinstance(choice, str) and name not in names:
            raise ApiError(400, f"tool_choice names {name!r}, which is not in tools "
                           f"({', '.join(names)})", param="tool_choice")
        return tools, name

    def _structure(self, req: ChatCompletionRequest, tools: list[dict],
                   choice: str) -> tuple[dict | None, str]:
        """(SamplingParams.structured, forced answer prefix) for response_format / tools."""
        fmt = _response_format(req)
        if fmt is not None and self.grammar is None:
            raise ApiError(400, f"response_format {req.response_format.type!r} is not supported "
                           "yet: this server has no grammar backend (clover.grammar)",
                           param="response_format", code="unsupported_parameter")
        if choice == "none" or not tools:
            return fmt, ""
        if fmt is not None:
            raise ApiError(400, "response_format cannot be combined with tools (use "
                           'tool_choice "none")', param="response_format")
        if self.grammar is not None:
            named = {"name": choice} if choice not in ("auto", "required") else choice
            return {"tools": tools, "tool_choice": named,
                    "parallel_tool_calls": req.parallel_tool_calls}, ""
        return None, _forced_prefix(choice)

    def _params(self, req: Any, prompt_len: int, max_tokens: int | None,
                structured: dict | None) -> SamplingParams:
        room = self.capacity - prompt_len
        if room < 1:
            raise ApiError(400, f"This model's maximum context length is {self.capacity} tokens; "
                           f"the prompt has {prompt_len}", param="messages" if hasattr(
                               req, "messages") else "prompt", code="context_length_exceeded")
        if max_tokens is not None and max_tokens > room:
            raise ApiError(400, f"This model's maximum context length is {self.capacity} tokens; "
                           f"the prompt has {prompt_len}, so max_tokens can be at most {room} "
                           f"(got {max_tokens})", param="max_tokens",
                           code="context_length_exceeded")
        fields = {"max_tokens": max_tokens or min(self.config.default_max_tokens, room),
                  "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
                  "stop": req.stop, "structured": structured, **req.diffusion_knobs()}
        try:
            params = SamplingParams(**fields)
        except ValueError as e:
            name = str(e).split(" ", 1)[0].removeprefix("SamplingParams.")
            raise ApiError(400, str(e).removeprefix("SamplingParams."), param=name,
                           code="invalid_value") from None
        vocab = self.engine.config.vocab_size
        if not all(0 <= t < vocab for t in params.stop_token_ids):
            raise ApiError(400, f"stop_token_ids must be in [0, {vocab})", param="stop_token_ids")
        return params

    # ---- execution ------------------------------------------------------------------------------
    async def execute(self, http: Request, plan: Plan) -> Response:
        """Submit the job; answer with its stream, its result, or its error."""
        job = Job(plan.request_id, plan.prompt_ids, plan.params, asyncio.get_running_loop(),
                  stream=plan.stream, provisional=plan.provisional)
        self._submit(job)
        watcher = asyncio.ensure_future(_wait_disconnect(http))
        handed_off = False  # the job has ended, or a stream now owns it
        try:
            event = await _next_event(job, watcher)  # Started once admitted, or Failed
            if plan.stream and isinstance(event, Started):
                watcher.cancel()  # from here on StreamingResponse watches the connection
                handed_off = True
                return StreamingResponse(self._stream(job, plan), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            while isinstance(event, Started | Update):
                event = await _next_event(job, watcher)
            handed_off = event is not None
            if event is None:
                return Response(status_code=CLIENT_CLOSED)
            if isinstance(event, Failed):
                raise ApiError(event.status, event.message, code=event.code)
            return JSONResponse(self._response(plan, event.output))
        finally:
            watcher.cancel()
            if not handed_off:
                self.worker.abort(job.request_id)

    def _submit(self, job: Job) -> None:
        try:
            self.worker.submit(job)
        except QueueFull as e:
            raise ApiError(429, f"{e}; retry shortly", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except WorkerDead as e:
            raise ApiError(503, str(e), code="engine_unavailable") from None
        except ValueError as e:
            raise ApiError(400, str(e), param="max_tokens", code="too_many_tokens") from None

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _stop_ids(self, params: SamplingParams) -> set[int]:
        return self.engine.stop_ids(params)

    # ---- non-streamed responses -----------------------------------------------------------------
    def _response(self, plan: Plan, output) -> dict[str, Any]:
        u = out_.usage(len(plan.prompt_ids), output.stats.generated_tokens)
        stats = output.stats.as_dict()
        if plan.kind == "completion":
            choice = {"index": 0, "text": output.text, "logprobs": None,
                      "finish_reason": output.finish_reason}
            return self._envelope(plan, "text_completion", [choice]) | {"usage": u,
                                                                       "clover": stats}
        deltas = out_.ChatDeltas(plan.tools, plan.parallel, plan.prefix)
        deltas.update(output.text, final=True)
        message = {"role": "assistant", "content": _content(deltas), "refusal": None}
        if deltas.calls:
            message["tool_calls"] = deltas.calls
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": out_.finish_reason(output.finish_reason, deltas.calls)}
        if deltas.errors:
            choice["clover_errors"] = deltas.errors
        return self._envelope(plan, "chat.completion", [choice]) | {"usage": u, "clover": stats}

    def _envelope(self, plan: Plan, obj: str, choices: list[dict]) -> dict[str, Any]:
        prefix = "chatcmpl-" if plan.kind == "chat" else "cmpl-"
        return {"id": prefix + plan.request_id, "object": obj, "created": plan.created,
                "model": self.model_name, "system_fingerprint": self.fingerprint,
                "choices": choices}

    # ---- streams --------------------------------------------------------------------------------
    async def _stream(self, job: Job, plan: Plan) -> AsyncIterator[str]:
        done = False
        state = _StreamState(plan, self)
        try:
            for chunk in state.opening():
                yield _sse(chunk)
            while not done:
                event = await job.events.get()
                done = isinstance(event, Finished | Failed)
                for chunk in state.chunks(event):
                    yield _sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            if not done:
                self.worker.abort(job.request_id)


class _StreamState:
    """What one stream has sent so far, and the chunks each engine event adds."""

    def __init__(self, plan: Plan, server: CloverServer) -> None:
        self.plan, self.server = plan, server
        self.chat = plan.kind == "chat"
        self.deltas = out_.ChatDeltas(plan.tools, plan.parallel, plan.prefix)
        self.text = out_.TextDeltas()
        self.stop_ids = server._stop_ids(plan.params)
        self.obj = "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, delta: dict | str | None = None, finish: str | None = None,
              **extra: Any) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        body = self.server._envelope(self.plan, self.obj, [choice]) | extra
        return body | ({"usage": None} if self.plan.include_usage else {})

    def opening(self) -> list[dict]:
        return [self.chunk({"role": "assistant", "content": ""})] if self.chat else []

    def chunks(self, event: Any) -> list[dict]:
        if isinstance(event, Update):
            text = out_.visible_text(self.server._decode, event.settled_ids, self.stop_ids,
                                     self.plan.params.stop, final=False)
            return self._deltas(text, final=False) + self._provisional(event)
        if isinstance(event, Finished):
            return self._closing(event.output)
        if isinstance(event, Failed):
            return [ApiError(event.status, event.message, code=event.code).body()]
        return []

    def _deltas(self, text: str, final: bool) -> list[dict]:
        if not self.chat:
            piece = self.text.update(text)
            return [self.chunk(piece)] if piece else []
        content, calls = self.deltas.update(text, final)
        out = [self.chunk({"content": content})] if content else []
        first = len(self.deltas.calls) - len(calls)
        out += [self.chunk({"tool_calls": [{"index": first + i, **c}]})
                for i, c in enumerate(calls)]
        return out

    def _provisional(self, event: Update) -> list[dict]:
        if not self.plan.provisional or event.block is None:
            return []
        draft = out_.provisional(self.server._decode, event.block, event.settled_in_block,
                                 self.server.engine.config.mask_id)
        return [self.chunk(clover_provisional=draft)]

    def _closing(self, output) -> list[dict]:
        out = self._deltas(output.text, final=True)
        calls = self.deltas.calls if self.chat else []
        extra = {"clover": output.stats.as_dict()}
        if self.chat and self.deltas.errors:
            extra["clover_errors"] = self.deltas.errors
        out.append(self.chunk(None, out_.finish_reason(output.finish_reason, calls), **extra))
        if self.plan.include_usage:
            u = out_.usage(len(self.plan.prompt_ids), output.stats.generated_tokens)
            out.append(self.server._envelope(self.plan, self.obj, []) | {"usage": u})
        return out


# ---- helpers ------------------------------------------------------------------------------------
def _own_copy(tokenizer: Any) -> Any:
    """A tokenizer for the HTTP thread alone: the engine thread decodes with its own (for stop
    strings), and a fast tokenizer must not be used by two threads at once."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - not copyable: share it (no known tokenizer gets here)
        return tokenizer


def _model_name(model: str) -> str:
    from pathlib import Path

    return Path(model).name or model


def _stream_flags(req: Any) -> dict[str, bool]:
    opts = req.stream_options
    if opts is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true",
                       param="stream_options")
    return {"stream": req.stream, "include_usage": bool(opts and opts.include_usage),
            "provisional": bool(opts and opts.provisional)}


def _check_message(m: Message, i: int) -> None:
    if m.role in ("system", "developer", "user", "tool") and m.content is None:
        raise ApiError(400, f"messages[{i}] ({m.role}) needs content",
                       param=f"messages[{i}].content")
    if m.role == "assistant" and m.content is None and not m.tool_calls:
        raise ApiError(400, f"messages[{i}] (assistant) needs content or tool_calls",
                       param=f"messages[{i}].content")
    if m.role == "tool" and not m.tool_call_id:
        raise ApiError(400, f"messages[{i}] (tool) needs tool_call_id",
                       param=f"messages[{i}].tool_call_id")
    if m.tool_calls and m.role != "assistant":
        raise ApiError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                       param=f"messages[{i}].tool_calls")


def check_schema(schema: Any, param: str, object_only: bool = False) -> None:
    """A JSON Schema the grammar and the client can use: a dict that jsonschema accepts."""
    if not isinstance(schema, dict):
        raise ApiError(400, "must be a JSON Schema object", param=param,
                       code="invalid_schema")
    if object_only and schema.get("type", "object") != "object":
        raise ApiError(400, f'function parameters must be an object schema ("type": "object"), '
                       f"got type {schema.get('type')!r}", param=param, code="invalid_schema")
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError
    except ImportError:
        return
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise ApiError(400, f"invalid JSON Schema: {e.message}", param=param,
                       code="invalid_schema") from None


def _response_format(req: ChatCompletionRequest) -> dict | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, 'response_format "json_schema" needs json_schema.schema',
                       param="response_format.json_schema")
    check_schema(fmt.json_schema.schema_, "response_format.json_schema.schema")
    return {"json_schema": fmt.json_schema.schema_}


def _forced_prefix(choice: str) -> str:
    """Without a grammar, `required` / a named function start the answer with the call's
    opening (as `format_tool_call` writes it); the model continues from there."""
    from clover.tokenizer import TOOL_CALL_OPEN

    if choice == "required":
        return TOOL_CALL_OPEN
    if choice == "auto":
        return ""
    return TOOL_CALL_OPEN + '{"name": ' + json.dumps(choice) + ', "arguments": '


def _content(deltas: out_.ChatDeltas) -> str | None:
    return None if deltas.tools and deltas.calls and not deltas.content else deltas.content


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _wait_disconnect(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _next_event(job: Job, watcher: asyncio.Future):
    """The job's next event, or None once the client has disconnected."""
    if watcher.done():
        return None
    get = asyncio.ensure_future(job.events.get())
    done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if get in done and not watcher.done():
        return get.result()
    get.cancel()
    return None


# ---- the ASGI app -------------------------------------------------------------------------------
class Guard:
    """Pure-ASGI front door: API key, body size limit, per-endpoint status counts."""

    def __init__(self, app: Any, server: CloverServer) -> None:
        self.app, self.server = app, server
        self.key = (server.config.api_key or "").encode()
        self.limit = server.config.max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        status = {"code": 0}

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            error = self._auth_error(scope)
            if error is None:
                receive, error = await self._limited_body(scope, receive)
            if error is not None:
                return await _error_response(error)(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        except Exception as e:  # noqa: BLE001 - a bug must cost one request, not the connection
            log.exception("unhandled error in %s %s", scope["method"], path)
            if not status["code"]:
                error = ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                 code="internal_error")
                await _error_response(error)(scope, receive, counting_send)
        finally:
            self.server.metrics.count_http(endpoint, status["code"])

    def _auth_error(self, scope: dict) -> ApiError | None:
        if not self.key or scope["path"] == "/health":
            return None
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"").removeprefix(b"Bearer ").strip()
        if hmac.compare_digest(given, self.key):
            return None
        return ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                        code="invalid_api_key")

    async def _limited_body(self, scope: dict, receive: Any) -> tuple[Any, ApiError | None]:
        """Read the whole body (at most `limit` bytes) up front; replay it to the app."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return receive, None
        too_big = ApiError(413, f"request body larger than {self.limit} bytes",
                           code="request_too_large")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            return receive, too_big
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return receive, ApiError(400, "client disconnected")
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                return receive, too_big
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, None


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(server: CloverServer) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        try:
            yield
        finally:
            server.worker.stop()

    app = FastAPI(title="Clover", summary="OpenAI-compatible API for Clover diffusion models",
                  lifespan=lifespan)
    app.state.server = server
    _routes(app, server)
    _error_handlers(app)
    app.add_middleware(Guard, server=server)
    return app


def _routes(app: FastAPI, server: CloverServer) -> None:
    @app.get("/health")
    async def health() -> Response:
        ok = server.worker.alive
        body = {"status": "ok" if ok else "engine loop not running", "model": server.model_name}
        return JSONResponse(body | server.worker.load(), status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(server.metrics.render(server.worker.load()),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(server)]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        server._check_model(name)
        return JSONResponse(_model_card(server))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req = parse_request(ChatCompletionRequest, await request.body())
        return await server.execute(request, server.plan_chat(req))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse_request(CompletionRequest, await request.body())
        return await server.execute(request, server.plan_completion(req))


def _model_card(server: CloverServer) -> dict[str, Any]:
    return {"id": server.model_name, "object": "model", "created": server.created,
            "owned_by": "clover", "max_model_len": server.capacity}


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = {404: f"no such endpoint: {request.method} {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}
        return _error_response(ApiError(e.status_code, message.get(e.status_code, str(e.detail)),
                                        code="not_found" if e.status_code == 404 else None))
