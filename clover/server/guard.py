"""The pure-ASGI front door: API key, content type, body size and body time, drain, counting.

In order: `Authorization: Bearer KEY` (scheme case-insensitive, a bare key refused, 401 with
`WWW-Authenticate: Bearer`; /health needs no key); while the server drains, 503 for new
generation requests; a POST body must be JSON (`Content-Type: application/json`, or none) or
415; the body is read up front, at most `max_body_bytes` (413) within `timeout_body` seconds of
the headers (408, and the connection closes), then replayed to the app. Every response is
counted per endpoint and status. An exception that escapes the app costs its request a 500,
never the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

from fastapi.responses import JSONResponse

from clover.server.protocol import ApiError

log = logging.getLogger("clover.server")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
_GENERATE = ("/v1/chat/completions", "/v1/completions")


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Guard:
    def __init__(self, app: Any, server: Any) -> None:
        self.app, self.server = app, server
        self.key = (server.config.api_key or "").encode()
        self.limit = server.config.max_body_bytes
        self.body_timeout = server.config.timeout_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = {"code": 0}

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            error = self._front_error(scope)
            if error is None:
                receive, error = await self._limited_body(scope, receive)
            if error is not None:
                return await error_response(error)(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        except Exception as e:  # noqa: BLE001 - a bug must cost one request, not the connection
            log.exception("unhandled error in %s %s", scope["method"], path)
            if not status["code"]:
                error = ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                 code="internal_error")
                await error_response(error)(scope, receive, counting_send)
        finally:
            self.server.metrics.count_http(path if path in ENDPOINTS else "other", status["code"])

    def _front_error(self, scope: dict) -> ApiError | None:
        """What is wrong before the body is read: key, draining, content type."""
        headers = dict(scope["headers"])
        error = self._auth_error(scope["path"], headers)
        if error is None and self.server.draining and scope["path"] in _GENERATE:
            error = ApiError(503, "the server is shutting down; retry on another replica",
                             code="shutting_down", headers={"Connection": "close"})
        if error is None and scope["method"] == "POST":
            error = _content_type_error(headers.get(b"content-type"))
        return error

    def _auth_error(self, path: str, headers: dict) -> ApiError | None:
        if not self.key or path == "/health":
            return None
        scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key):
            return None
        return ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _limited_body(self, scope: dict, receive: Any) -> tuple[Any, ApiError | None]:
        """Read the whole body (at most `limit` bytes, within the body timeout); replay it."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return receive, None
        too_big = ApiError(413, f"request body larger than {self.limit} bytes",
                           code="request_too_large")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            return receive, too_big
        chunks, size, more = [], 0, True
        deadline = time.monotonic() + self.body_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                return receive, ApiError(408, f"the request body did not arrive within "
                                         f"{self.body_timeout:g} s (--timeout-body)",
                                         code="request_timeout", headers={"Connection": "close"})
            if message["type"] == "http.disconnect":
                return receive, ApiError(400, "client disconnected")
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                return receive, too_big
        return _replay(b"".join(chunks), receive), None


def _content_type_error(content_type: bytes | None) -> ApiError | None:
    """None for JSON (`application/json`, `*+json`) or no type at all; else a 415."""
    if content_type is None:
        return None
    media = content_type.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or media.endswith(b"+json"):
        return None
    return ApiError(415, f"Content-Type must be application/json (got "
                    f"{content_type.decode('latin-1')!r})", code="unsupported_media_type")


def _replay(body: bytes, receive: Any) -> Any:
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
