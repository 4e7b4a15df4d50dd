"""The OpenAI request schema as strict pydantic models, and the errors the API answers with.

Requests are validated strictly (a string is not a number, unknown fields are rejected as the
OpenAI API does) so every bad input becomes an `ApiError`: a status code plus the OpenAI error
object `{"error": {"message", "type", "param", "code"}}`. Clover's diffusion knobs (policy, tau,
steps_per_block, gamma, block_size, ...) are extra top-level fields, sent by the official client
through `extra_body`. This module knows nothing about models or the engine.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOP_STRINGS = 4  # as the OpenAI API
_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none"}


class ApiError(Exception):
    """An error answered to the client as an OpenAI error object with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _default_type(status)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


# ---- messages and tools -------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str | dict


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    def as_template_input(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(p.text for p in self.content)
        return out


class FunctionDef(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    provisional: bool = False  # Clover: also stream the active block's draft (clover_provisional)


# ---- requests -----------------------------------------------------------------------------------
class _Request(_Strict):
    """Fields shared by chat and text completions: OpenAI's, then Clover's diffusion knobs."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None  # None: the server default
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: Annotated[int, Field(ge=1)] = 1
    stop: Annotated[str | list[str] | None, Field(validate_default=True)] = None
    seed: Annotated[int, Field(ge=-2**63, lt=2**64)] | None = None  # torch.Generator's range
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # Clover (diffusion) extras
    top_k: Annotated[int, Field(ge=0)] = 0
    policy: str | None = None
    tau: float | None = None
    steps_per_block: int | None = None
    gamma: float | None = None
    min_temperature: float | None = None  # uniform-canvas models (DiffusionGemma)
    stable_steps: int | None = None
    stop_entropy: float | None = None
    block_size: int | None = None
    cache: str | None = None
    refresh_every: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, why) for OpenAI features this server does not implement."""
        out = []
        if self.presence_penalty or self.frequency_penalty:
            name = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            out.append((name, "penalties are not supported by a diffusion decoder (use 0)"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        return out

    def diffusion_knobs(self) -> dict[str, Any]:
        """The Clover extras that were given, as SamplingParams fields."""
        names = ("policy", "tau", "steps_per_block", "gamma", "min_temperature", "stable_steps",
                 "stop_entropy", "block_size", "cache", "refresh_every", "stop_token_ids")
        knobs = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        return knobs | {"top_k": self.top_k, "ignore_eos": self.ignore_eos}


class ChatCompletionRequest(_Request):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        return out

    def logprobs_k(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # as the OpenAI API: at most 5
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo is not supported"))
        if self.best_of not in (None, 1, self.n):
            out.append(("best_of", "best_of must equal n (or be left out)"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        return out

    def logprobs_k(self) -> int | None:
        return self.logprobs


# ---- parsing ------------------------------------------------------------------------------------
R = TypeVar("R", bound=_Request)


def parse_request(cls: type[R], body: bytes) -> R:
    """Validate a JSON body; every problem becomes a 400 ApiError naming the parameter."""
    try:
        req = cls.model_validate_json(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    for param, why in req.unsupported():
        raise ApiError(400, why, param=param, code="unsupported_parameter")
    return req


def _validation_error(e: ValidationError) -> ApiError:
    err = e.errors(include_url=False)[0]
    kind, param = err["type"], _param(err["loc"])
    if kind == "json_invalid" and "recursion limit" in str(err["msg"]):
        return ApiError(400, "the request body is nested too deeply", code="invalid_json")
    if kind == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON ({err['msg']})",
                        code="invalid_json")
    if kind == "model_type" and not param:
        return ApiError(400, "the request body must be a JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unrecognized_argument")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param=param,
                        code="missing_required_parameter")
    message = str(err["msg"]).removeprefix("Value error, ")
    shown = json.dumps(err.get("input"), default=str)[:80] if "input" in err else ""
    return ApiError(400, f"Invalid value for '{param}': {message}" + (
        f" (got {shown})" if shown and kind != "too_short" else ""), param=param,
        code="invalid_value")


def _param(loc: tuple) -> str:
    """('messages', 0, 'content', 'str') -> 'messages[0].content' (union branch names dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_]\w*", part) and part not in _TYPE_NAMES:
            out += f".{part}" if out else part
    return out
