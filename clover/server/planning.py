"""Request planning: a validated OpenAI request body -> a `Plan` the engine can run.

Checks the model name, the messages, tools and tool_choice, response_format (its schema checked
with jsonschema, nesting bounded), the context budget and every sampling field, renders the chat
template and tokenizes. Every problem is an `ApiError` (4xx, naming the parameter); `plan`
turns any other exception raised while validating into a 400 as well, so no body can produce a
500 here. Nothing here touches the engine loop or compiles a grammar (see service.py).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from clover.engine.params import SamplingParams
from clover.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    Message,
    parse_request,
)

log = logging.getLogger("clover.server")
_FULL_ONLY = ("block_size", "cache", "refresh_every")  # knobs of full-attention models


@dataclass
class Plan:
    """A validated request, ready for the engine."""

    kind: str  # chat | completion
    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    provisional: bool = False
    tools: bool = False  # parse tool calls out of the answer
    parallel: bool = True
    prefix: str = ""  # forced start of the answer (tool_choice without a grammar backend)
    # (schema, param) pairs for jsonschema's full check, run with the grammar compilation (it
    # takes seconds on a huge schema, which must not hold up other requests' planning)
    schema_checks: list[tuple[dict, str]] = field(default_factory=list)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


class Planner:
    """Plans requests for one `CloverServer` (reads its tokenizer, engine, config, grammar)."""

    def __init__(self, server: Any, tokenizer: Any) -> None:
        self.server = server
        self.tokenizer = tokenizer  # this planner's own copy (a fast tokenizer is one-thread)

    def plan(self, kind: str, body: bytes) -> Plan:
        """Parse and plan a body; every failure is an ApiError with a 4xx status."""
        try:
            if kind == "chat":
                return self.plan_chat(parse_request(ChatCompletionRequest, body))
            return self.plan_completion(parse_request(CompletionRequest, body))
        except ApiError:
            raise
        except RecursionError:
            raise ApiError(400, "the request is nested too deeply", code="invalid_value") from None
        except Exception as e:  # noqa: BLE001 - a body we failed to validate is still a 4xx
            log.warning("request validation failed unexpectedly", exc_info=True)
            raise ApiError(400, f"invalid request: {type(e).__name__}: {e}",
                           code="invalid_request") from None

    def plan_chat(self, req: ChatCompletionRequest) -> Plan:
        s = self.server
        self.check_model(req.model)
        if self.tokenizer is None:
            raise ApiError(400, f"model {s.model_name!r} has no tokenizer: chat needs a model "
                           "directory with tokenizer.json; use /v1/completions with token ids")
        for i, m in enumerate(req.messages):
            _check_message(m, i)
        tools, choice = self._tool_setup(req)
        structured, prefix = self._structure(req, tools, choice)
        checks = [(t["function"]["parameters"], f"tools[{i}].function.parameters")
                  for i, t in enumerate(tools) if "parameters" in t["function"]]
        if req.response_format is not None and req.response_format.json_schema is not None:
            checks.append((req.response_format.json_schema.schema_,
                           "response_format.json_schema.schema"))
        messages = [m.as_template_input() for m in req.messages]
        text = self._render(messages, tools if choice != "none" else None) + prefix
        ids = self.tokenizer.encode(text)
        max_tokens = req.max_completion_tokens or req.max_tokens
        params = self._params(req, len(ids), max_tokens, structured)
        return Plan("chat", ids, params, n=req.n, tools=bool(tools) and choice != "none",
                    parallel=req.parallel_tool_calls, prefix=prefix,
                    schema_checks=checks,
                    **_stream_flags(req))

    def plan_completion(self, req: CompletionRequest) -> Plan:
        self.check_model(req.model)
        ids = self._prompt_ids(req.prompt)
        params = self._params(req, len(ids), req.max_tokens, None)
        return Plan("completion", ids, params, n=req.n, **_stream_flags(req))

    def check_model(self, name: str) -> None:
        if name != self.server.model_name:
            raise ApiError(404, f"The model '{name}' does not exist; this server serves "
                           f"'{self.server.model_name}' (see GET /v1/models)", param="model",
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
                raise ApiError(400, f"model {self.server.model_name!r} has no tokenizer: send "
                               "the prompt as a list of token ids", param="prompt")
            return self.tokenizer.encode(prompt)
        vocab = self.server.engine.config.vocab_size
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
                quick_schema_check(params, f"tools[{i}].function.parameters", object_only=True)
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
        grammar = self.server.grammar
        if fmt is not None and grammar is None:
            raise ApiError(400, f"response_format {req.response_format.type!r} is not supported "
                           "yet: this server has no grammar backend (clover.grammar)",
                           param="response_format", code="unsupported_parameter")
        if choice == "none" or not tools:
            return fmt, ""
        if fmt is not None:
            raise ApiError(400, "response_format cannot be combined with tools (use "
                           'tool_choice "none")', param="response_format")
        if grammar is not None:
            named = {"name": choice} if choice not in ("auto", "required") else choice
            return {"tools": tools, "tool_choice": named,
                    "parallel_tool_calls": req.parallel_tool_calls}, ""
        strict = [i for i, t in enumerate(tools) if t["function"].get("strict")]
        if strict:
            raise ApiError(400, "strict tools need the grammar backend (clover.grammar), which "
                           "this server lacks", param=f"tools[{strict[0]}].function.strict",
                           code="unsupported_parameter")
        return None, _forced_prefix(choice)

    def _params(self, req: Any, prompt_len: int, max_tokens: int | None,
                structured: dict | None) -> SamplingParams:
        s = self.server
        room = s.capacity - prompt_len
        _check_room(req, s.capacity, prompt_len, max_tokens)
        if req.n > s.config.max_n:
            raise ApiError(400, f"n must be at most {s.config.max_n} (--max-n); got {req.n}",
                           param="n", code="invalid_value")
        self._check_full_only(req)
        temperature = req.temperature if req.temperature is not None else (
            s.config.default_temperature)
        fields = {"max_tokens": max_tokens or min(s.config.default_max_tokens, room),
                  "temperature": temperature, "top_p": req.top_p, "seed": req.seed,
                  "stop": req.stop, "structured": structured, "logprobs": req.logprobs_k(),
                  **req.diffusion_knobs()}
        try:
            params = SamplingParams(**fields)
        except ValueError as e:
            name = str(e).split(" ", 1)[0].removeprefix("SamplingParams.")
            raise ApiError(400, str(e).removeprefix("SamplingParams."), param=name,
                           code="invalid_value") from None
        _check_engine_serves(s.engine, params)
        vocab = s.engine.config.vocab_size
        if not all(0 <= t < vocab for t in params.stop_token_ids):
            raise ApiError(400, f"stop_token_ids must be in [0, {vocab})", param="stop_token_ids")
        return params

    def _check_full_only(self, req: Any) -> None:
        """block_size / cache / refresh_every steer full-attention models only; elsewhere the
        model's own blocks decide, so a request that sets them is told rather than ignored."""
        config = self.server.engine.config
        if config.attention == "full":
            return
        for name in _FULL_ONLY:
            value = getattr(req, name)
            if value is None or (name == "block_size" and value == config.decode_block_size):
                continue
            raise ApiError(400, f"{name} applies to full-attention models only; this model "
                           f"({config.attention} attention) decodes in blocks of "
                           f"{config.decode_block_size}", param=name,
                           code="unsupported_parameter")


# ---- helpers ------------------------------------------------------------------------------------
def _check_engine_serves(engine: Any, params: SamplingParams) -> None:
    """An engine with limits (`SpecEngine.refusal`: greedy, no grammar, no logprobs) refuses a
    request up front, naming the request's own parameter."""
    refusal = getattr(engine, "refusal", None)
    found = refusal(params) if refusal is not None else None
    if found is None:
        return
    field, why = found
    param = {"structured": "tools" if "tools" in (params.structured or {}) else
             "response_format"}.get(field, field)
    raise ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def _check_room(req: Any, capacity: int, prompt_len: int, max_tokens: int | None) -> None:
    room = capacity - prompt_len
    param = "messages" if hasattr(req, "messages") else "prompt"
    if room < 1:
        raise ApiError(400, f"This model's maximum context length is {capacity} tokens; the "
                       f"prompt has {prompt_len}", param=param, code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise ApiError(400, f"This model's maximum context length is {capacity} tokens; the "
                       f"prompt has {prompt_len}, so max_tokens can be at most {room} "
                       f"(got {max_tokens})", param="max_tokens",
                       code="context_length_exceeded")


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


def quick_schema_check(schema: Any, param: str, object_only: bool = False) -> None:
    """The cheap part of checking a JSON Schema: a dict (an object schema for tools), nested
    at most MAX_DEPTH levels. `full_schema_check` does the rest."""
    from clover.grammar.schema_rules import MAX_DEPTH, schema_depth

    if not isinstance(schema, dict):
        raise ApiError(400, "must be a JSON Schema object", param=param, code="invalid_schema")
    if object_only and schema.get("type", "object") != "object":
        raise ApiError(400, f'function parameters must be an object schema ("type": "object"), '
                       f"got type {schema.get('type')!r}", param=param, code="invalid_schema")
    if schema_depth(schema) > MAX_DEPTH:
        raise ApiError(400, f"the schema is nested deeper than {MAX_DEPTH} levels", param=param,
                       code="invalid_schema")


def full_schema_check(schema: dict, param: str, max_bytes: int) -> None:
    """jsonschema accepts the schema (a size budget first: the check is linear in its size)."""
    size = len(json.dumps(schema))
    if size > max_bytes:
        raise ApiError(400, f"the schema is {size} bytes, over the {max_bytes} byte budget "
                       "(--grammar-max-bytes)", param=param, code="grammar_size_budget_exceeded")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise ApiError(400, f"invalid JSON Schema: {e.message}", param=param,
                       code="invalid_schema") from None
    except RecursionError:
        raise ApiError(400, "the schema is nested too deeply", param=param,
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
    quick_schema_check(fmt.json_schema.schema_, "response_format.json_schema.schema")
    return {"json_schema": {"schema": fmt.json_schema.schema_,
                            "strict": bool(fmt.json_schema.strict)}}


def _forced_prefix(choice: str) -> str:
    """Without a grammar, `required` / a named function start the answer with the call's
    opening (as `format_tool_call` writes it); the model continues from there."""
    from clover.tokenizer import TOOL_CALL_OPEN

    if choice == "required":
        return TOOL_CALL_OPEN
    if choice == "auto":
        return ""
    return TOOL_CALL_OPEN + '{"name": ' + json.dumps(choice) + ', "arguments": '
