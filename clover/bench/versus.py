"""Shared pieces of the "Clover's engine against a reference implementation" benchmarks
(benchmarks/dllm_vs_transformers.py, benchmarks/diffusion_gemma_vs_transformers.py): best-of-N
timing, token agreement between two decodes, and the printed table followed by one JSON line."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table


def best_of(fn: Callable[[], Any], repeats: int, seed: int | None = None) -> tuple[Any, float]:
    """(the last run's output, the best wall time of `repeats` runs); with `seed`, torch's default
    generator is seeded before every run, so each run draws the same random numbers."""
    best, out = float("inf"), None
    for _ in range(repeats):
        if seed is not None:
            torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def token_agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """Share of the reference's tokens that Clover reproduced at the same index."""
    same = sum(a == b for x, y in zip(got, want, strict=True) for a, b in zip(x, y, strict=False))
    return same / max(sum(map(len, want)), 1)


def hardware() -> dict[str, Any]:
    return {"machine": platform.machine(), "cpus": torch.get_num_threads(),
            "torch": torch.__version__, "shared_machine": True}


def print_report(title: str, columns: Sequence[str], cells: list[list[str]],
                 report: dict) -> None:
    """The human table, then the whole report as one JSON line."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in cells:
        table.add_row(*row)
    Console().print(table)
    print(json.dumps(report))


def parse_args(doc: str, add_flags: Callable[[argparse.ArgumentParser], None],
               dim: int) -> argparse.Namespace:
    """The flags every such benchmark takes (batch sizes, prompt and generation lengths, the tiny
    model's width, depth and vocabulary, repeats, threads) plus its own; sets the thread count."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    add_flags(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    return args
