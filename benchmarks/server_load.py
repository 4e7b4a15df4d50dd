"""Load test for `clover serve`: many concurrent clients on loopback, checked answer by answer,
with and without a hostile client sending schemas that stall grammar compilers.

Starts the server as a subprocess on 127.0.0.1 (a free port), asks every distinct prompt once from
a single client (the solo answers and the single-client figures), then sends `--requests` requests
from `--concurrency` clients (chat and text completions, a quarter of them streamed), twice: once
alone, once while a hostile client sends stalling schemas back to back, one sender per class in
flight at once (an allOf of 24 patterns varied per request so no cache helps, 20,000 properties,
a 2,000-member anyOf, `(a{1000}){1000}`, a schema nested 98 levels). Passes when no normal
request is lost, no request at all gets a 5xx, every temperature-0 answer equals its solo answer,
and the normal requests' p99 latency with the hostile client is within `--max-p99-ratio` (2x)
of the run without it. Bounded in count and time (`--time-limit`). Prints a table, then one JSON
line.

    python benchmarks/server_load.py                       # a tiny random model, built in a tmp dir
    python benchmarks/server_load.py --model models/clover-smol --requests 1000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

HOST = "127.0.0.1"  # loopback only, always
WORDS = ("weather drone zone airport radius altitude Paris Oslo sunny wind north runway tower "
         "notice restricted hello help quick brown fox lazy dog").split()


@dataclass
class Result:
    key: tuple[int, str]  # (prompt index, kind)
    status: int
    latency_s: float
    text: str | None
    tokens: int
    retries: int = 0


def _prompts(n: int) -> list[str]:
    """n distinct prompts of varied length (so rows sit at different block offsets)."""
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 11)) + f" #{i}"
            for i in range(n)]


def _body(model: str, prompt: str, kind: str, max_tokens: int) -> tuple[str, dict]:
    common = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if kind.startswith("chat"):
        return "/v1/chat/completions", common | {"messages": [{"role": "user",
                                                               "content": prompt}]}
    return "/v1/completions", common | {"prompt": prompt}


async def _ask(client: httpx.AsyncClient, model: str, prompts: list[str], key: tuple[int, str],
               max_tokens: int, stream: bool) -> Result:
    """One request; retried on 429 after Retry-After (back-pressure is not a loss)."""
    path, body = _body(model, prompts[key[0]], key[1], max_tokens)
    t0, retries = time.perf_counter(), 0
    while True:
        if stream:
            status, text, tokens = await _stream(client, path, body | {
                "stream": True, "stream_options": {"include_usage": True}})
        else:
            r = await client.post(path, json=body)
            status = r.status_code
            text, tokens = _text(r.json()) if status == 200 else (None, 0)
        if status != 429:
            return Result(key, status, time.perf_counter() - t0, text, tokens, retries)
        retries += 1
        await asyncio.sleep(1.0)


def _text(obj: dict) -> tuple[str, int]:
    choice = obj["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return text, obj["usage"]["completion_tokens"]


async def _stream(client: httpx.AsyncClient, path: str, body: dict) -> tuple[int, str | None, int]:
    pieces, tokens = [], 0
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                return 500, None, 0
            for c in obj["choices"]:
                pieces.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
            tokens = (obj.get("usage") or {}).get("completion_tokens", tokens)
    return 200, "".join(pieces), tokens


async def _run_all(url: str, model: str, prompts: list[str], keys: list[tuple[int, str]],
                   concurrency: int, max_tokens: int) -> tuple[list[Result], float]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, key in enumerate(keys):
        queue.put_nowait((i, key))
    results: list[Result | None] = [None] * len(keys)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                i, key = queue.get_nowait()
                stream = concurrency > 1 and i % 4 == 3
                try:
                    results[i] = await _ask(client, model, prompts, key, max_tokens, stream)
                except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
                    print(f"request {i} lost: {type(e).__name__}: {e}", file=sys.stderr)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


# ---- the server subprocess -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _start_server(args: argparse.Namespace, model: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "clover.cli", "serve", "--model", model, "--host", HOST,
           "--default-temperature", "0",
           "--port", str(port), "--max-batch", str(args.max_batch), "--max-queue", "4096",
           "--device", args.device, "--log-level", "warning",
           "--torch-threads", str(args.torch_threads)]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(f"http://{HOST}:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become healthy within 120 s")


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    want = ("clover_tokens_per_forward", "clover_batch_size_mean", "clover_tokens_per_second",
            "clover_requests_aborted_total")
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(\w+)(?:\{[^}]*\})? ([\d.e+-]+)$", text, re.M)
            if m.group(1) in want}


# ---- figures -------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


def _figures(results: list[Result], wall: float) -> dict[str, float]:
    ok = [r for r in results if r.status == 200]
    lat = [r.latency_s for r in ok]
    return {"requests": len(results), "wall_s": round(wall, 3),
            "req_per_s": round(len(ok) / wall, 2),
            "tokens_per_s": round(sum(r.tokens for r in ok) / wall, 1),
            "p50_ms": round(1000 * _pct(lat, 0.5), 1), "p99_ms": round(1000 * _pct(lat, 0.99), 1)}


def _table(rows: list[tuple[str, dict]]) -> str:
    cols = ("requests", "wall_s", "req_per_s", "tokens_per_s", "p50_ms", "p99_ms")
    lines = [f"{'run':<22}" + "".join(f"{c:>14}" for c in cols)]
    for name, f in rows:
        lines.append(f"{name:<22}" + "".join(f"{f[c]:>14}" for c in cols))
    return "\n".join(lines)


# ---- the hostile client --------------------------------------------------------------------------
HOSTILE_KINDS = 5  # the schema classes below; one sender per class runs during the load
def _hostile_schemas(i: int) -> dict:
    """The i-th stalling schema (the audit's classes), varied so no verdict cache helps."""
    kind = i % 5
    if kind == 0:
        return {"type": "string", "allOf": [{"pattern": f"a{j}x{i}"} for j in range(24)]}
    if kind == 1:
        return {"type": "object", "properties": {f"p{j}_{i}": {"type": "integer"}
                                                 for j in range(20_000)}}
    if kind == 2:
        return {"anyOf": [{"const": f"v{j}_{i}"} for j in range(2000)]}
    if kind == 3:
        return {"type": "string", "pattern": f"^(a{{1000}}){{1000}}{i}$"}
    schema: dict = {"type": "string"}
    for _ in range(98):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def _hostile(url: str, model: str, stop: asyncio.Event, kind: int) -> dict[str, int]:
    """Send stalling schemas of one class (`kind` of `_hostile_schemas`) one after another until
    `stop`; count statuses."""
    counts: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        i = kind
        while not stop.is_set():
            body = {"model": model, "max_tokens": 8, "messages": [
                {"role": "user", "content": "hi"}], "response_format": {
                "type": "json_schema", "json_schema": {"name": "x",
                                                       "schema": _hostile_schemas(i)}}}
            try:
                status = str((await client.post("/v1/chat/completions", json=body)).status_code)
            except httpx.HTTPError as e:
                status = type(e).__name__
            counts[status] = counts.get(status, 0) + 1
            i += HOSTILE_KINDS
    return counts


async def _with_hostile(url: str, model: str, prompts: list[str], keys: list,
                        args: argparse.Namespace) -> tuple[list[Result], float, dict]:
    stop = asyncio.Event()
    hostile = [asyncio.ensure_future(_hostile(url, model, stop, kind))
               for kind in range(HOSTILE_KINDS)]  # every class in flight at once
    await asyncio.sleep(0.5)  # the first stalling schemas are compiling when the load starts
    results, wall = await _run_all(url, model, prompts, keys, args.concurrency, args.max_tokens)
    stop.set()
    counts: dict[str, int] = {}
    for one in await asyncio.gather(*hostile):
        for status, n in one.items():
            counts[status] = counts.get(status, 0) + n
    return results, wall, counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: build a tiny one)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--no-hostile", action="store_true", help="skip the hostile-client run")
    p.add_argument("--max-p99-ratio", type=float, default=2.0,
                   help="pass only if p99 with the hostile client <= this x p99 without")
    p.add_argument("--prompts", type=int, default=48, help="distinct prompts (solo answers)")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=1800.0, help="give up after this many s")
    args = p.parse_args()
    if not (1 <= args.concurrency <= 256 and 1 <= args.requests <= 100_000):
        p.error("--concurrency must be in [1, 256] and --requests in [1, 100000]")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from clover.server.testing import build_tiny_model_dir

            model = str(build_tiny_model_dir(Path(tmp) / "tiny-chat"))
        name = Path(model).name
        port = _free_port()
        url = f"http://{HOST}:{port}"
        proc = _start_server(args, model, port)
        try:
            return asyncio.run(asyncio.wait_for(_bench(args, url, name, model),
                                                args.time_limit))
        except TimeoutError:
            print(f"FAILED: time limit of {args.time_limit} s reached", file=sys.stderr)
            return 1
        finally:
            proc.terminate()
            proc.wait(30)


def _check(results: list[Result], solo: dict, requests: int) -> dict[str, int]:
    return {"lost": requests - sum(r.status == 200 for r in results),
            "errors_5xx": sum(r.status >= 500 for r in results),
            "mismatched": sum(r.status == 200 and r.text != solo.get(r.key) for r in results),
            "retries_429": sum(r.retries for r in results)}


async def _bench(args: argparse.Namespace, url: str, name: str, model: str) -> int:
    prompts = _prompts(args.prompts)
    kinds = ("chat", "completion")
    distinct = [(i, k) for i in range(len(prompts)) for k in kinds]
    solo_results, solo_wall = await _run_all(url, name, prompts, distinct, 1, args.max_tokens)
    solo = {r.key: r.text for r in solo_results if r.status == 200}
    keys = [distinct[i % len(distinct)] for i in range(args.requests)]
    load_results, load_wall = await _run_all(url, name, prompts, keys, args.concurrency,
                                             args.max_tokens)
    solo_f, load_f = _figures(solo_results, solo_wall), _figures(load_results, load_wall)
    checks = {"concurrent": _check(load_results, solo, args.requests)}
    rows = [("single client", solo_f), ("concurrent", load_f)]
    hostile: dict = {}
    if not args.no_hostile:
        h_results, h_wall, h_counts = await _with_hostile(url, name, prompts, keys, args)
        h_f = _figures(h_results, h_wall)
        rows.append(("concurrent + hostile", h_f))
        checks["with_hostile"] = _check(h_results, solo, args.requests)
        ratio = h_f["p99_ms"] / max(load_f["p99_ms"], 1e-9)
        hostile = {"figures": h_f, "p99_ratio": round(ratio, 3), "hostile_statuses": h_counts}
    print(_table(rows))
    hostile_5xx = sum(n for s, n in hostile.get("hostile_statuses", {}).items()
                      if s.isdigit() and int(s) >= 500)
    ok = (all(c["lost"] == c["errors_5xx"] == c["mismatched"] == 0 for c in checks.values())
          and len(solo) == len(distinct) and hostile_5xx == 0
          and hostile.get("p99_ratio", 0.0) <= args.max_p99_ratio)
    for run, c in checks.items():
        print(f"{run}: lost {c['lost']}, 5xx {c['errors_5xx']}, answers differing from solo "
              f"{c['mismatched']}, 429 retries {c['retries_429']}")
    if hostile:
        print(f"hostile client: {hostile['hostile_statuses']}; p99 with / without "
              f"{hostile['p99_ratio']}x (limit {args.max_p99_ratio}x)")
    print("PASS" if ok else "FAIL")
    print(json.dumps({
        "benchmark": "server_load", "ok": ok,
        "hardware": {"platform": platform.platform(), "cpus": os.cpu_count(),
                     "device": args.device, "torch_threads": args.torch_threads},
        "model": model, "settings": {k: getattr(args, k) for k in (
            "requests", "concurrency", "prompts", "max_tokens", "max_batch", "max_p99_ratio")},
        "single_client": solo_f, "concurrent": load_f, "hostile": hostile,
        "speedup_req_per_s": round(load_f["req_per_s"] / max(solo_f["req_per_s"], 1e-9), 2),
        "checks": checks, "hostile_5xx": hostile_5xx, "server": _metrics(url)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
