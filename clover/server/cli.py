"""`clover serve`: run the OpenAI-compatible server (uvicorn) on one model; `--replicas N` runs N
engine replicas of it behind one endpoint on Ray Serve (`ray_serve.py`).

Flags map one to one onto `ServerConfig` fields. The server binds 127.0.0.1 unless told otherwise;
the API key comes from --api-key or the CLOVER_API_KEY environment variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from clover.server.config import DEFAULT_MODEL, ServerConfig

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from clover.server.app import CloverServer, create_app
    except ImportError as e:
        raise ValueError(f"clover serve needs the `serve` extra ({e.name} is missing): "
                         "pip install -e '.[serve]'") from None

    config = ServerConfig(
        model=args.model, served_model_name=args.served_model_name, host=args.host,
        port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
        max_tokens_in_flight=args.max_tokens_in_flight, max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens, device=args.device, dtype=args.dtype,
        api_key=args.api_key or os.environ.get("CLOVER_API_KEY") or None,
        max_body_bytes=args.max_body_bytes, torch_threads=args.torch_threads)
    if config.host not in _LOOPBACK:
        note = "" if config.api_key else " without an API key (set --api-key or CLOVER_API_KEY)"
        print(f"warning: listening on {config.host}, reachable from other machines{note}",
              file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.replicas > 1:
        from clover.server import ray_serve

        return ray_serve.serve_forever(config, ray_serve.RayConfig(
            replicas=args.replicas, address=args.ray_address,
            cpus_per_replica=args.cpus_per_replica, gpus_per_replica=args.gpus_per_replica))
    server = CloverServer.load(config)
    print(f"serving {server.model_name!r} on http://{config.host}:{config.port}/v1 "
          f"(max batch {config.max_batch}, context {server.capacity})", file=sys.stderr)
    uvicorn.run(create_app(server), host=config.host, port=config.port,
                log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat, completions, tools)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model directory or preset name (default: {DEFAULT_MODEL})")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as `model` (default: the directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-batch", type=int, default=32, help="rows in the running batch")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests that may wait for a row before the server answers 429")
    p.add_argument("--max-tokens-in-flight", type=int, default=None,
                   help="cap on prompt + max_tokens over running requests (default: no cap "
                        "beyond the KV cache)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's max_seq_len)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens for requests that give none (capped by the context)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 (default: auto)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $CLOVER_API_KEY, or none)")
    p.add_argument("--max-body-bytes", type=int, default=2 * 2**20,
                   help="largest request body accepted (default: 2 MiB)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 is often fastest "
                        "for tiny models)")
    p.add_argument("--replicas", type=int, default=1,
                   help="engine replicas behind one endpoint; > 1 runs them on Ray Serve "
                        "(needs the `ray` extra; default: 1, one process)")
    p.add_argument("--ray-address", default=None,
                   help="with --replicas: join this Ray cluster (default: start one here)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0,
                   help="with --replicas: Ray CPUs reserved per replica (default: 1)")
    p.add_argument("--gpus-per-replica", type=float, default=None,
                   help="with --replicas: GPUs per replica (default: 1 when the device is "
                        "CUDA, else 0)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)
