"""Clover's OpenAI-compatible HTTP server: `clover serve`, or `create_app(CloverServer.load(...))`.

One engine loop thread serves every request with continuous batching (`worker.py`); the HTTP
layer (`app.py`) validates, tokenizes, streams and reports errors the OpenAI way. Importing this
package is cheap: fastapi is imported only when `CloverServer` / `create_app` are first used.
"""

from clover.server.config import DEFAULT_MODEL, ServerConfig

__all__ = ["DEFAULT_MODEL", "CloverServer", "ServerConfig", "create_app"]


def __getattr__(name: str):
    if name in ("CloverServer", "create_app"):
        from clover.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'clover.server' has no attribute {name!r}")
