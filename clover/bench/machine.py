"""What this machine can do at best, measured: memory bandwidth, matmul peak, CPU features.

Every speed figure Clover reports is read against these: a decode step at batch 1 must at least
stream every weight once, so `weight_bytes / bandwidth` is its floor (the bandwidth roofline),
and a large block forward is bounded by the matmul peak. Nothing is assumed from a spec sheet:
`memory_bandwidth` streams a buffer far larger than the caches, `matmul_peak` (clover.bench.probe)
times square matmuls. Nothing here touches a model's forward.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch
from torch import nn

from clover.bench.probe import matmul_peak

# lscpu flags that decide which CPU kernels run (bf16 dot products, AMX tiles, int8 VNNI)
FEATURE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8",
                 "amx_tile")


def cpu_features() -> dict[str, object]:
    """Model name, logical CPUs, torch threads and the vector-ISA flags present (Linux)."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name":
                model = value.strip()
    except OSError:
        pass
    return {"cpu": model, "logical_cpus": _cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "flags": [f for f in FEATURE_FLAGS if f in flags]}


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def features_line(features: dict[str, object]) -> str:
    flags = ",".join(features["flags"]) or "none of " + ",".join(FEATURE_FLAGS)
    return (f"{features['cpu']}, {features['logical_cpus']} CPUs, {features['torch_threads']} "
            f"torch threads, ISA {features['torch_capability']}, flags {flags}")


@torch.inference_mode()
def memory_bandwidth(mib: int = 256, seconds: float = 1.0, cpu_clock: bool = False) -> float:
    """Best read bandwidth (bytes/s) of summing a `mib`-MiB fp32 buffer (>> last-level cache).

    cpu_clock: time by this process's CPU time (on a shared machine, comparable with forwards
    timed the same way; see clover.bench.forward)."""
    clock = time.process_time if cpu_clock else time.perf_counter
    buf = torch.ones(mib * 2**20 // 4)
    buf.sum()  # fault the pages in
    best, spent = float("inf"), 0.0
    while spent < seconds:
        t0 = clock()
        buf.sum()
        took = clock() - t0
        best, spent = min(best, took), spent + took
    return buf.numel() * 4 / best


@torch.inference_mode()
def matmul_peak_cpu(dtype: torch.dtype, seconds: float = 1.0, cpu_clock: bool = False) -> float:
    """Best CPU matmul FLOP/s in `dtype` (probe.matmul_peak; `cpu_clock`: as memory_bandwidth)."""
    clock = time.process_time if cpu_clock else time.perf_counter
    return matmul_peak(dtype, torch.device("cpu"), seconds, clock)


def machine_peaks(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
                  cpu_clock: bool = False) -> dict:
    """Bandwidth (GB/s) and matmul peak (GFLOP/s per dtype), measured now, plus CPU features."""
    return {"bandwidth_gbs": round(memory_bandwidth(cpu_clock=cpu_clock) / 1e9, 2),
            "matmul_gflops": {str(d).removeprefix("torch."):
                              round(matmul_peak_cpu(d, cpu_clock=cpu_clock) / 1e9, 1)
                              for d in dtypes},
            "clock": "cpu" if cpu_clock else "wall", **cpu_features()}


def streamed_weight_bytes(model: nn.Module) -> int:
    """Bytes one forward must read: every stored weight once (quantized ones at their packed
    size), except the embedding table when it is only looked up (an untied LM head is its own
    weight; a tied one reads the table in full as the head)."""
    from clover.bench.quant import _storage

    total = 0
    embed = getattr(model, "embed", None)
    for p in model.parameters():  # a tied weight comes once
        if embed is not None and p is embed.weight and model.lm_head is not None:
            continue  # untied: the table is looked up, a few rows per forward
        total += _storage(p)[1]
    return total


def llama_bench(binary: str, gguf: Path, threads: int) -> dict:
    """llama.cpp's own benchmark on a GGUF: batch-1 decode of 32 tokens (tg32), 3 repetitions.
    `binary` is llama.cpp's llama-bench (docs/bench.md says how to build it); nothing in Clover
    needs it."""
    cmd = [binary, "-m", str(gguf), "-p", "0", "-n", "32", "-r", "3", "-t", str(threads),
           "-o", "json"]
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        runs = json.loads(done.stdout)
        tg = next(r for r in runs if r.get("n_gen", 0) > 0)
    except (OSError, subprocess.CalledProcessError, ValueError, StopIteration) as e:
        raise ValueError(f"--llama-bench {binary}: no decode rate from it ({e})") from e
    return {"llama_cpp_tok_s": round(tg["avg_ts"], 2), "llama_cpp_build": tg.get("build_commit"),
            "llama_cpp_model": tg.get("model_type"), "threads": threads, "gguf": Path(gguf).name}
