"""What scaling out costs on one machine: FSDP2 vs DDP training, Ray Serve replicas vs one server.

Training: 2 gloo processes train the same model on the same global batch with `--parallel ddp`
and `--parallel fsdp`; per process it reports the bytes of weights + gradients + AdamW state it
holds (exact, from the local tensors), peak RSS, time to a ready trainer (process group, sharding)
and mean step time. Serving: `clover serve` and `clover serve --replicas 2` as subprocesses on a
tiny model; time from launch until /health answers, RSS of the whole process tree (Ray's own
processes included) once ready and after 50 concurrent requests, and the time those took.
Prints a table, then one JSON line.

    python benchmarks/scale_overheads.py [--steps 8] [--requests 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MODEL = dict(dim=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_dim=512,
             expert_ffn_dim=128, num_experts=8, num_experts_per_tok=2, vocab_size=2048)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- training -----------------------------------------------------------------------------------

def _held_bytes(trainer) -> int:
    """Bytes of parameters, gradients-to-be and AdamW state this process holds (local shards)."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    params = sum(local(p).numel() * p.element_size() for p in trainer.model.parameters())
    state = sum(local(v).numel() * v.element_size() for s in trainer.optimizer.state.values()
                for v in s.values() if torch.is_tensor(v) and v.ndim > 0)
    return 2 * params + state  # a gradient per parameter, same size


def _train_worker(rank: int, world: int, port: int, parallel: str, steps: int, out: str) -> None:
    from clover.config import get_preset
    from clover.model import build_model
    from clover.train import TrainConfig, Trainer, close_distributed
    from clover.train.throughput import synthetic

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    cfg = get_preset("tiny", **MODEL)
    data = synthetic(cfg, 64, 96, 32, 0)
    t0 = time.perf_counter()
    trainer = Trainer(build_model(cfg, seed=0), data, TrainConfig(
        steps=steps, batch_size=8, device="cpu", progress=False, parallel=parallel,
        log_every=steps))
    ready_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        trainer.train_step()
        trainer.state.step += 1
        times.append(time.perf_counter() - t)
    result = {"ready_s": ready_s, "step_s": sum(times[1:]) / (steps - 1),
              "held_bytes": _held_bytes(trainer),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    Path(out, f"{parallel}-{rank}.json").write_text(json.dumps(result))
    close_distributed()


def train_overheads(steps: int) -> dict:
    import torch.multiprocessing as mp

    results = {}
    with tempfile.TemporaryDirectory() as out:
        for parallel in ("ddp", "fsdp"):
            mp.start_processes(_train_worker, args=(2, _free_port(), parallel, steps, out),
                               nprocs=2, join=True, start_method="spawn")
            ranks = [json.loads(Path(out, f"{parallel}-{r}.json").read_text()) for r in range(2)]
            results[parallel] = {k: max(r[k] for r in ranks) for k in ranks[0]}
    return results


# ---- serving ------------------------------------------------------------------------------------

def _tree_rss(pid: int) -> int:
    import psutil

    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready in time")


async def _load(url: str, n: int) -> float:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=300)
    t0 = time.perf_counter()
    await asyncio.gather(*[client.completions.create(
        model="tiny-bench", prompt=f"The quick brown fox {i}", temperature=0, max_tokens=16)
        for i in range(n)])
    return time.perf_counter() - t0


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (the CLI's Ctrl-C path, which shuts Ray down), then wait for the whole tree."""
    import psutil

    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    _, alive = psutil.wait_procs([psutil.Process(p) for p in tree if psutil.pid_exists(p)],
                                 timeout=30)
    for p in alive:  # only processes this benchmark started
        p.kill()


def serve_overheads(model_dir: Path, replicas: int, requests: int) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "clover.cli", "serve", "--model", str(model_dir), "--port",
           str(port), "--device", "cpu", "--torch-threads", "1", "--log-level", "warning"]
    if replicas > 1:
        cmd += ["--replicas", str(replicas)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        ready_s = time.perf_counter() - t0
        rss_ready = _tree_rss(proc.pid)
        load_s = asyncio.run(_load(url, requests))
        return {"ready_s": ready_s, "rss_ready_bytes": rss_ready,
                "rss_after_load_bytes": _tree_rss(proc.pid), "load_s": load_s}
    finally:
        _stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args()
    from clover.server.testing import build_tiny_model_dir

    train = train_overheads(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model_dir(Path(tmp) / "tiny-bench")
        serve = {"single": serve_overheads(model_dir, 1, args.requests),
                 "ray_2_replicas": serve_overheads(model_dir, 2, args.requests)}
    _print(train, serve, args)


def _print(train: dict, serve: dict, args: argparse.Namespace) -> None:
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    print(f"training, 2 gloo processes, {args.steps} steps (per process, worst rank)")
    print(f"{'':6} {'ready s':>8} {'step s':>8} {'held MiB':>9} {'peak RSS MiB':>13}")
    for k, r in train.items():
        print(f"{k:6} {r['ready_s']:8.2f} {r['step_s']:8.3f} {mib(r['held_bytes']):>9} "
              f"{mib(r['peak_rss_bytes']):>13}")
    print(f"\nserving the tiny model, {args.requests} concurrent completions")
    print(f"{'':16} {'ready s':>8} {'RSS ready MiB':>14} {'RSS loaded MiB':>15} {'load s':>7}")
    for k, r in serve.items():
        print(f"{k:16} {r['ready_s']:8.1f} {mib(r['rss_ready_bytes']):>14} "
              f"{mib(r['rss_after_load_bytes']):>15} {r['load_s']:7.2f}")
    print(json.dumps({"bench": "scale_overheads", "machine": platform.machine(),
                      "cpus": os.cpu_count(), "torch": torch.__version__, "model": MODEL,
                      "steps": args.steps, "requests": args.requests, "training": train,
                      "serving": serve}))


if __name__ == "__main__":
    main()
