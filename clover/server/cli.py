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
from dataclasses import fields

from clover.server.config import DEFAULT_MODEL, ServerConfig

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


_COMPILE_HELP = ("run cached forwards of a dense model as one compiled graph (torch.compile): "
                 "~2x faster decoding of SmolLM2 in bf16 on a CPU after 3-5 minutes of "
                 "compiling per batch-shape class (docs/bench.md)")


def _serve(args: argparse.Namespace) -> int:
    try:
        from clover.bench.quant import cli_dtype
        from clover.server.app import CloverServer, create_app
        from clover.server.http import build_uvicorn
    except ImportError as e:
        raise ValueError(f"clover serve needs the `serve` extra ({e.name} is missing): "
                         "pip install -e '.[serve]'") from None

    values = {f.name: getattr(args, f.name) for f in fields(ServerConfig)
              if hasattr(args, f.name)}
    values["api_key"] = args.api_key or os.environ.get("CLOVER_API_KEY") or None
    values["dtype"] = cli_dtype(args.dtype, args.device)
    config = ServerConfig(**values)
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
          f"(max batch {config.max_batch}, context {server.capacity}, {config.dtype})",
          file=sys.stderr)
    build_uvicorn(create_app(server), server, host=config.host, port=config.port,
                  log_level=args.log_level).run()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat, completions, tools)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model directory or preset name (default: {DEFAULT_MODEL})")
    p.add_argument("--draft", default=None,
                   help="a drafter adapter directory (e.g. models/clover-smol-draft, with "
                        "--model models/clover-smol-ar): self-speculative decoding, the model's "
                        "own answers in fewer forwards (greedy, or sampled by speculative "
                        "sampling; a request for a grammar gets a 400)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as `model` (default: the directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-batch", type=int, default=32, help="rows in the running batch")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests that may wait (beyond the free rows) before a 429")
    p.add_argument("--max-tokens-in-flight", type=int, default=None,
                   help="cap on prompt + max_tokens over running requests (default: no cap "
                        "beyond the KV cache)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's max_seq_len)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory for the keys and values of prompt heads shared by requests "
                        "(a system prompt with tools), reused instead of recomputed; 0 turns "
                        "prefix caching off (default: 256)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens for requests that give none (capped by the context)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 on CUDA and on CPUs with AVX-512 BF16 or AMX, else float32) "
                        "| float32 | bfloat16 (default: auto)")
    p.add_argument("--compile", action="store_true", help=_COMPILE_HELP)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $CLOVER_API_KEY, or none)")
    p.add_argument("--max-body-bytes", type=int, default=2 * 2**20,
                   help="largest request body accepted (default: 2 MiB)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 is often fastest "
                        "for tiny models)")
    p.add_argument("--default-temperature", type=float, default=1.0,
                   help="temperature of a request that names none (default: 1.0, as OpenAI "
                        "and vLLM; 0 makes such requests greedy)")
    p.add_argument("--max-n", type=int, default=8, help="most choices (n) per request")
    _add_grammar_flags(p)
    _add_lifecycle_flags(p)
    _add_replica_flags(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)


def _add_grammar_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured output (grammar compilation, per request)")
    g.add_argument("--grammar-time-budget", type=float, default=5.0,
                   help="seconds one grammar may take to compile before a 400 (default: 5)")
    g.add_argument("--grammar-memory-budget", type=int, default=1024,
                   help="MiB one grammar compilation may use before a 400 (default: 1024)")
    g.add_argument("--grammar-max-bytes", type=int, default=256 * 1024,
                   help="largest schema / grammar source accepted (default: 256 KiB)")
    g.add_argument("--grammar-workers", type=int, default=1,
                   help="sandbox processes compiling grammars in parallel (default: 1)")


def _add_lifecycle_flags(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("connections and lifecycle")
    t.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="close an idle keep-alive connection after this many s (default: 5)")
    t.add_argument("--timeout-headers", type=float, default=10.0,
                   help="a request's line and headers must arrive within this many s "
                        "(default: 10)")
    t.add_argument("--timeout-body", type=float, default=30.0,
                   help="a request's body must arrive within this many s (default: 30)")
    t.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="on SIGTERM, running requests may finish within this many s; then "
                        "they end with an error event (default: 10)")
    t.add_argument("--stall-after", type=float, default=60.0,
                   help="/health answers 503 once the engine loop is stuck this long "
                        "(default: 60)")


def _add_replica_flags(p: argparse.ArgumentParser) -> None:
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
