"""The OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models, /health,
/metrics, and the FastAPI app that puts them in front of a `CloverServer`.

Handlers only read the body, plan it (planning.py) and hand the plan to the server
(service.py); the pure-ASGI Guard (guard.py) sits in front. Every error, including FastAPI's
own 404 / 405, is an OpenAI error object. `create_app` starts the engine loop on startup and
stops it (and the grammar sandbox) on shutdown.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from clover.server.guard import ENDPOINTS, Guard, error_response
from clover.server.metrics import CONTENT_TYPE
from clover.server.protocol import ApiError
from clover.server.service import CloverServer

__all__ = ["ENDPOINTS", "CloverServer", "create_app"]


def create_app(server: CloverServer) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        try:
            yield
        finally:
            server.close()

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
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = server.metrics.render(server.worker.load(), server.worker.heartbeat(),
                                     server.engine.prefix_cache.as_dict())
        return Response(text, media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(server)]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        server.planner.check_model(name)
        return JSONResponse(_model_card(server))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        plan = await server.plan("chat", await request.body())
        return await server.execute(request, plan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        plan = await server.plan("completion", await request.body())
        return await server.execute(request, plan)


def _model_card(server: CloverServer) -> dict[str, Any]:
    return {"id": server.model_name, "object": "model", "created": server.created,
            "owned_by": "clover", "max_model_len": server.capacity}


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = {404: f"no such endpoint: {request.method} {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}
        return error_response(ApiError(e.status_code, message.get(e.status_code, str(e.detail)),
                                       code="not_found" if e.status_code == 404 else None))
