"""`clover serve --replicas N`: N engine replicas behind one OpenAI endpoint, on Ray Serve.

Each replica is a Ray Serve replica (an actor) that loads its own `CloverServer` (model, engine
loop thread, metrics) on its own device and serves the single-process server's FastAPI app,
mounted with `serve.ingress`; Ray Serve's HTTP proxy spreads requests over the replicas. So the
routes, streaming, error objects and back-pressure (429 from a replica whose queue is full) are
the single-process server's own. Every response names its replica in `x-clover-replica`.

Ray is an optional extra (`pip install 'clover-dlm[ray]'`); only this module imports it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from clover.server.config import ServerConfig

REPLICA_HEADER = "x-clover-replica"
APP_NAME = "clover"


@dataclass(kw_only=True)
class RayConfig:
    """How many replicas, on which Ray cluster, with which resources each."""

    replicas: int = 2
    address: str | None = None  # an existing Ray cluster; None: start one in this process
    num_cpus: int | None = None  # CPUs of the cluster started here (None: Ray counts them)
    cpus_per_replica: float = 1.0
    gpus_per_replica: float | None = None  # None: 1 when the server's device resolves to CUDA
    object_store_mb: int = 128  # object store of the cluster started here (Serve barely uses it)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1 (got {self.replicas})")
        if self.cpus_per_replica < 0 or (self.gpus_per_replica or 0) < 0:
            raise ValueError("--cpus-per-replica and --gpus-per-replica must be >= 0")
        if self.object_store_mb < 80:  # Ray refuses less than 75 MiB
            raise ValueError(f"object_store_mb must be >= 80 (got {self.object_store_mb})")


def _ray():
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise ValueError(f"--replicas needs the `ray` extra ({e.name} is missing): "
                         "pip install -e '.[serve,ray]'") from None
    return ray, serve


class ReplicaTag:
    """ASGI wrapper: add the replica's id to every HTTP response's headers."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER.encode(), self.value)]}
            await send(message)

        await self.app(scope, receive, tagged)


class CloverReplica:
    """One replica: a whole single-process server (model, engine thread, routes)."""

    def __init__(self, config: ServerConfig) -> None:
        from ray import serve

        from clover.server import CloverServer

        self.server = CloverServer.load(config)
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self):
        from clover.server import create_app

        # create_app's lifespan starts and stops this replica's engine loop thread.
        return ReplicaTag(create_app(self.server), self.replica)


def build_app(config: ServerConfig, ray_config: RayConfig):
    """The Serve application: `ray_config.replicas` copies of `CloverReplica(config)`."""
    _, serve = _ray()
    gpus = ray_config.gpus_per_replica
    if gpus is None:
        gpus = 1.0 if _wants_cuda(config.device) else 0.0
    deployment = serve.deployment(
        serve.ingress()(CloverReplica), name="CloverReplica",
        num_replicas=ray_config.replicas,
        # A replica takes as many requests as its engine holds (batch rows + queue), plus one:
        # the extra one meets the replica's own 429, so overflow is refused the way a single
        # server refuses it instead of waiting unseen in Ray's router.
        max_ongoing_requests=config.max_batch + config.max_queue + 1,
        ray_actor_options={"num_cpus": ray_config.cpus_per_replica, "num_gpus": gpus})
    return deployment.bind(config)


def _wants_cuda(device: str) -> bool:
    if device not in ("auto", "cuda") and not device.startswith("cuda"):
        return False
    import torch

    return torch.cuda.is_available()


def start(config: ServerConfig, ray_config: RayConfig) -> str:
    """Start (or join) Ray, run the replicas behind Serve's proxy on config.host:config.port,
    and return the base URL once every replica has loaded its model."""
    ray, serve = _ray()
    if not ray.is_initialized():
        local = {} if ray_config.address else dict(
            num_cpus=ray_config.num_cpus, object_store_memory=ray_config.object_store_mb * 2**20,
            _node_ip_address="127.0.0.1" if config.host in ("127.0.0.1", "localhost") else None)
        ray.init(address=ray_config.address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": _forwarded_env()}, **local)
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(build_app(config, ray_config), name=APP_NAME, route_prefix="/", blocking=False)
    return f"http://{config.host}:{config.port}"


def _forwarded_env() -> dict[str, str]:
    """Settings a replica needs from this process (import path, thread counts, offline hubs)."""
    names = ("PYTHONPATH", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return {k: os.environ[k] for k in names if k in os.environ}


def stop() -> None:
    """Tear down the Serve application and the Ray cluster this process started or joined."""
    ray, serve = _ray()
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


def serve_forever(config: ServerConfig, ray_config: RayConfig) -> int:
    """`clover serve --replicas N`: start, print where, wait for Ctrl-C, then shut Ray down."""
    t0 = time.perf_counter()
    url = start(config, ray_config)
    print(f"serving {config.model!r} on {url}/v1 with {ray_config.replicas} Ray Serve replicas "
          f"(ready in {time.perf_counter() - t0:.1f} s; Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop()
    return 0
