"""uvicorn, configured for a server that must not be held open or cut off.

`build_uvicorn(app, server, ...)` returns a `uvicorn.Server` with Clover's connection timeouts
and graceful shutdown:
- idle keep-alive connections close after `timeout_keep_alive` (uvicorn's own timer);
- a connection that has not finished its request line and headers within `timeout_headers`
  (counted from the connection, or from the previous response) gets a 408 and is closed;
  uvicorn has no such timer, so idle and half-sent connections would otherwise stay forever;
- the body has `timeout_body` (enforced by the Guard, guard.py);
- on SIGTERM / SIGINT the server first drains (`CloverServer.drain`: refuse new requests, let
  running ones finish within `shutdown_grace`, then end each with an error event and `[DONE]`),
  and only then lets uvicorn close the connections.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

_REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    b"connection: close\r\ncontent-length: 120\r\n\r\n")
_TIMEOUT_BODY = (b'{"error": {"message": "request headers not received in time", "type": '
                 b'"invalid_request_error", "param": null, "code": "request_timeout"}}')


def _base_protocol() -> type:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # httptools is optional in uvicorn
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def header_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's HTTP protocol with a deadline for each request's line and headers."""
    base = _base_protocol()

    class HeaderTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        header_timeout_s = timeout_s

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late,
                                                      self.cycle)

        def _headers_late(self, cycle_then: Any) -> None:
            """No new request has started since the timer was armed: answer 408 and close."""
            if self.cycle is not cycle_then or self.transport.is_closing():
                return
            self.transport.write(_REQUEST_TIMEOUT.replace(
                b"120", str(len(_TIMEOUT_BODY)).encode()) + _TIMEOUT_BODY)
            self.transport.close()

    return HeaderTimeoutProtocol


class CloverUvicorn(uvicorn.Server):
    """uvicorn.Server whose shutdown drains the Clover server first."""

    def __init__(self, config: uvicorn.Config, clover: Any) -> None:
        super().__init__(config)
        self.clover = clover

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.clover.drain(self.clover.config.shutdown_grace)
        await super().shutdown(sockets)


def build_uvicorn(app: Any, server: Any, **kwargs: Any) -> CloverUvicorn:
    """A uvicorn server for `app` (create_app(server)) with the server's timeouts."""
    c = server.config
    config = uvicorn.Config(app, http=header_timeout_protocol(c.timeout_headers),
                            timeout_keep_alive=c.timeout_keep_alive,
                            timeout_graceful_shutdown=max(1, round(c.shutdown_grace + 5)),
                            **kwargs)
    return CloverUvicorn(config, server)
