"""Clover's OpenAI-compatible HTTP server: `clover serve`, or `create_app(CloverServer.load(...))`.

One engine loop thread serves every request with continuous batching (`worker.py`); the HTTP
layer validates and plans (`planning.py`), runs requests (`service.py`), streams
(`streaming.py`) and reports errors the OpenAI way; `app.py` holds the routes, `guard.py` the
front door, `http.py` the uvicorn timeouts and graceful shutdown. Importing this
package is cheap: fastapi is imported only when `CloverServer` / `create_app` are first used.
"""

from clover.server.config import DEFAULT_MODEL, ServerConfig

__all__ = ["DEFAULT_MODEL", "CloverServer", "ServerConfig", "create_app"]


def __getattr__(name: str):
    if name in ("CloverServer", "create_app"):
        from clover.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'clover.server' has no attribute {name!r}")
