"""`clover bench forward`: what one cached forward of L new tokens costs, against the hardware.

For each precision (fp32, bf16, int8 weight-only), batch size B and block length L, the model
first caches a context of `--context` tokens per row, then times forwards that write L new tokens
after it (logits at all L positions, as a dLLM's first step of a block needs; L = 1 is an AR
step). Each forward is read against the roofline of this machine, measured in the same run: it
must stream every weight once (bytes / the read bandwidth measured just before that batch size's
timings) and do 2 x params x tokens FLOPs (/ matmul peak); the slower of the two is its floor.
From the table, the predicted dLLM/AR speed ratio at a given TPF (tokens committed per forward)
is TPF x t(1) / t(L). Prints a table and one JSON line; writes forward.json and forward.png. It
times the model only (no engine, no sampling).

`--compile` adds the compiled forward (clover/model/compiled.py) beside the eager one, for the
fp32 and bf16 points of L <= PACKED_MAX_TOKENS (above it, and for int8 weights, forwards run
eager anyway). `compile_s` is the compiled points' wall time: compiling (in the warm-up round)
and the timed forwards, which are a few seconds of it.
"""

# Shapes: B batch, L new tokens, C context

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from clover.bench.machine import (
    features_line,
    machine_peaks,
    memory_bandwidth,
    streamed_weight_bytes,
)
from clover.bench.quant import PRECISIONS, load_model_at
from clover.model import CloverModel, KVCache
from clover.model.fused import PACKED_MAX_TOKENS

ENGINES = ("eager", "compiled")
COMPILED_PRECISIONS = ("fp32", "bf16")  # the graph takes plain weights (no int8 tensors)


@dataclass(kw_only=True)
class ForwardConfig:
    model: str = ""  # default: the embedded SmolLM2 base
    precisions: tuple[str, ...] = PRECISIONS
    batch_sizes: tuple[int, ...] = (1, 8)
    lengths: tuple[int, ...] = (1, 8, 32, 64)
    context: int = 256
    repeats: int = 5
    tpf: tuple[float, ...] = (2.0, 4.0, 8.0, 12.0)
    clock: str = "wall"  # wall | cpu (this process's CPU time; see time_forwards)
    engines: tuple[str, ...] = ("eager",)  # and/or "compiled" (`--compile`: both)
    out: str = ""

    def __post_init__(self) -> None:
        bad = [p for p in self.precisions if p not in PRECISIONS]
        checks = [(not bad, "--precisions", f"unknown {bad}; choose from {PRECISIONS}"),
                  (all(b >= 1 for b in self.batch_sizes), "--batch-sizes", "must be >= 1"),
                  (all(n >= 1 for n in self.lengths), "--lengths", "must be >= 1"),
                  (self.context >= 1, "--context", "must be >= 1"),
                  (self.repeats >= 1, "--repeats", "must be >= 1"),
                  (all(t > 0 for t in self.tpf), "--tpf", "must be > 0"),
                  (self.clock in ("wall", "cpu"), "--clock", "must be wall or cpu"),
                  (bool(self.engines) and set(self.engines) <= set(ENGINES), "--engines",
                   f"choose from {ENGINES}")]
        for ok, flag, why in checks:
            if not ok:
                raise ValueError(f"{flag} {why}")


@dataclass
class Point:
    precision: str
    batch: int
    length: int
    ms: float
    floor_ms: float  # roofline: max(weight bytes / bandwidth, FLOPs / matmul peak)
    bound: str  # memory | compute: which side of the roofline the floor is on
    extra: dict = field(default_factory=dict)
    engine: str = "eager"

    def as_dict(self) -> dict:
        return {"precision": self.precision, "engine": self.engine, "batch": self.batch,
                "length": self.length,
                "ms": round(self.ms, 3), "floor_ms": round(self.floor_ms, 3),
                "roofline_share": round(self.floor_ms / self.ms, 3), "bound": self.bound,
                **self.extra}


@torch.inference_mode()
def time_forwards(model: CloverModel, batch: int, lengths: tuple[int, ...], context: int,
                  repeats: int, cpu_clock: bool = False) -> dict[int, list[float]]:
    """ms of forwards writing L new tokens after a cached `context` per row, for every L.

    The lengths take turns within each repeat (after one warm-up round), so a burst of load
    from elsewhere on the machine hits every L alike. `cpu_clock`: this process's CPU time
    instead of wall time (steadier on a shared machine: waiting to be scheduled is left out;
    with several threads it counts every thread's time)."""
    vocab, device = model.config.vocab_size, next(model.parameters()).device
    cache = KVCache(model.config, batch, context + max(lengths),
                    device=device, dtype=_float_dtype(model))
    ids_BC = torch.randint(3, vocab, (batch, context), device=device)
    model(ids_BC, cache=cache, logits_mask_BL=torch.zeros_like(ids_BC, dtype=torch.bool))
    cache.commit(torch.full((batch,), context, device=device))
    ids = {n: torch.randint(3, vocab, (batch, n), device=device) for n in lengths}
    times: dict[int, list[float]] = {n: [] for n in lengths}
    clock = time.process_time if cpu_clock else time.perf_counter
    for _ in range(repeats + 1):  # the first round is a warm-up
        for n in lengths:
            t0 = clock()
            model(ids[n], cache=cache)  # writes the same slots each time: the cache never grows
            times[n].append(1000 * (clock() - t0))
    return {n: ts[1:] for n, ts in times.items()}


def _float_dtype(model: CloverModel) -> torch.dtype:
    return model.embed.weight.dtype


def matmul_params(model: CloverModel) -> int:
    from clover.bench.probe import active_matmul_params

    return active_matmul_params(model) + model.config.dim * model.config.vocab_size


def sweep(cfg: ForwardConfig, progress=print) -> dict:
    """Every (precision, engine, batch, length) point, with the machine's peaks measured first."""
    from clover.checkpoint.base import ensure_base

    path = cfg.model or str(ensure_base())
    peaks = machine_peaks(cpu_clock=cfg.clock == "cpu")
    points, compile_s = [], {}
    for precision in cfg.precisions:
        for engine in cfg.engines:
            lengths = cfg.lengths if engine == "eager" else tuple(
                n for n in cfg.lengths if n <= PACKED_MAX_TOKENS)
            if engine == "compiled" and (precision not in COMPILED_PRECISIONS or not lengths):
                continue
            model = load_model_at(path, precision, torch.device("cpu"))
            model.fuse_projections()
            if engine == "compiled" and not model.compile_forward():
                raise ValueError(f"--compile: {path} has parts the compiled forward does not "
                                 "cover (MoE layers, q/k norms, ...)")
            t0 = time.perf_counter()
            points += _points(model, precision, engine, lengths, cfg, peaks, progress)
            if engine == "compiled":  # compiling each shape class, and the timings
                compile_s[precision] = round(time.perf_counter() - t0, 1)
            del model
    return {"bench": "forward", "model": Path(path).name, "context": cfg.context,
            "repeats": cfg.repeats, "clock": cfg.clock, "machine": peaks,
            "engines": list(cfg.engines), "compile_s": compile_s,
            "points": [p.as_dict() for p in points],
            "predicted_dllm_over_ar": predicted_ratios(points, cfg.tpf)}


def _points(model: CloverModel, precision: str, engine: str, lengths: tuple[int, ...],
            cfg: ForwardConfig, peaks: dict, progress) -> list[Point]:
    """The timed points of one loaded model, every batch size and length."""
    weight_bytes, params = streamed_weight_bytes(model), matmul_params(model)
    peak = peaks["matmul_gflops"][str(_float_dtype(model)).removeprefix("torch.")] * 1e9
    points = []
    for batch in cfg.batch_sizes:
        # the read bandwidth of this moment: on a shared machine it drifts within a run
        bandwidth = memory_bandwidth(seconds=0.5, cpu_clock=cfg.clock == "cpu")
        runs = time_forwards(model, batch, lengths, cfg.context, cfg.repeats, cfg.clock == "cpu")
        for length, ms in runs.items():
            mem_ms = 1000 * weight_bytes / bandwidth
            flop_ms = 1000 * 2 * params * batch * length / peak
            points.append(Point(precision, batch, length, statistics.median(ms),
                                max(mem_ms, flop_ms), "memory" if mem_ms >= flop_ms else "compute",
                                {"best_ms": round(min(ms), 3),
                                 "bandwidth_gbs": round(bandwidth / 1e9, 2)}, engine))
            progress(f"{precision} {engine} B={batch} L={length}: median {points[-1].ms:.1f} ms")
    return points


def predicted_ratios(points: list[Point], tpfs: tuple[float, ...]) -> list[dict]:
    """dLLM/AR speed at each TPF: a block of L costs t(L) for TPF tokens, AR t(1) per token."""
    one = {(p.precision, p.engine, p.batch): p.ms for p in points if p.length == 1}
    rows = []
    for p in points:
        key = (p.precision, p.engine, p.batch)
        if p.length > 1 and key in one:
            ratio = {str(t): round(t * one[key] / p.ms, 2) for t in tpfs}
            rows.append({"precision": p.precision, "engine": p.engine, "batch": p.batch,
                         "length": p.length, "cost_vs_one_token": round(p.ms / one[key], 2),
                         "ratio_at_tpf": ratio})
    return rows


def render(results: dict) -> str:
    m = results["machine"]
    lines = [f"machine: {features_line(m)}; bandwidth {m['bandwidth_gbs']} GB/s; matmul peak "
             f"{m['matmul_gflops']} GFLOP/s; context {results['context']} tokens; "
             f"{results['clock']} clock",
             "precision | engine | batch | L | median ms | best ms | floor ms | roofline | bound"]
    for p in results["points"]:
        lines.append(f"{p['precision']} | {p.get('engine', 'eager')} | {p['batch']} | "
                     f"{p['length']} | {p['ms']} | {p['best_ms']} | "
                     f"{p['floor_ms']} | {100 * p['roofline_share']:.0f}% | {p['bound']}")
    lines.append("predicted dLLM/AR speed (TPF x t(1) / t(L)):")
    for r in results["predicted_dllm_over_ar"]:
        ratios = ", ".join(f"TPF {t}: {v}x" for t, v in r["ratio_at_tpf"].items())
        lines.append(f"  {r['precision']} {r.get('engine', 'eager')} B={r['batch']} "
                     f"L={r['length']} (block costs "
                     f"{r['cost_vs_one_token']}x one token): {ratios}")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> Path:
    """ms per forward against L (left) and share of the roofline (right), a line per
    precision and batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple, list[dict]] = {}
    for p in results["points"]:
        series.setdefault((p["precision"], p.get("engine", "eager"), p["batch"]), []).append(p)
    for (precision, engine, batch), pts in series.items():
        xs = [p["length"] for p in pts]
        ax_t.plot(xs, [p["ms"] for p in pts], marker="o", label=f"{precision} {engine}, batch "
                  f"{batch}", linestyle="--" if engine == "compiled" else "-")
        ax_r.plot(xs, [100 * p["roofline_share"] for p in pts], marker="o")
    for ax, label in ((ax_t, "ms per cached forward"), (ax_r, "% of roofline")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens per row (L)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"{results['model']}: {features_line(results['machine'])}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
