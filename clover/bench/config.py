"""`BenchConfig` (what `clover bench` sweeps, validated up front) and the grid of points it runs.

A point is one decoding setting of one model: (model, precision, policy + knob, block size,
batch size). The diffusion model gets the full product; its AR twin gets one point per
(precision, batch size), since policy, knob and block size mean nothing at one token per block;
so does the twin with a drafter (`--draft`: self-speculative, the twin's own greedy answers).
Points run grouped by (precision, batch size), the AR point beside its diffusion points, so each
speed ratio compares runs made moments apart. Flags map one-to-one to fields; errors name the flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from clover.bench.quant import INT4_NOTE, PRECISIONS, native_precision
from clover.engine import SamplingParams
from clover.engine.llm import resolve_device
from clover.tasks.airspace import ANSWER_MAX_TOKENS, EVAL_SPLITS

DEFAULT_MODEL = "models/clover-smol"
DEFAULT_AR_MODEL = "models/clover-smol-ar"
# policy -> its knob
KNOBS = {"threshold": "tau", "prefix": "tau", "topk": "steps_per_block", "entropy": "gamma"}
KNOB_LABEL = {"tau": "tau", "steps_per_block": "steps", "gamma": "gamma"}
KNOB_FIELD = {"tau": "taus", "steps_per_block": "steps", "gamma": "gammas"}  # its BenchConfig list
TASKS = ("airspace",)

# `--quick`: 12 runs on 16 messages (the native precision and int8, tau 0.7 / 0.9, batch 1 / 8);
# one run per point, so no spreads
QUICK: dict[str, Any] = {"n": 16, "policies": ("threshold",), "taus": (0.7, 0.9),
                         "block_sizes": (0,), "batch_sizes": (1, 8), "repeats": 1}


@dataclass(kw_only=True)
class BenchConfig:
    task: str = "airspace"
    model: str = DEFAULT_MODEL
    ar_model: str = DEFAULT_AR_MODEL  # "": no AR twin
    draft: str = ""  # a drafter adapter for the AR twin: a self-speculative point beside AR's
    messages: str | None = None  # a JSONL prompt file (airspace external form) instead of a split
    n: int = 32
    split: str = "test"
    seed: int = 0
    policies: tuple[str, ...] = ("threshold", "topk", "entropy")
    taus: tuple[float, ...] = (0.5, 0.7, 0.9)
    steps: tuple[int, ...] = (8,)  # topk: denoising steps per block
    gammas: tuple[float, ...] = (0.5,)
    block_sizes: tuple[int, ...] = (0, 16)  # 0: the model's own
    batch_sizes: tuple[int, ...] = (1, 8)
    precisions: tuple[str, ...] = ("fp32", "int8")
    repeats: int = 3
    max_tokens: int = ANSWER_MAX_TOKENS
    max_turns: int = 2
    grammar: bool = False  # every turn under the task's strict tool contract (contract.py)
    compile: bool = False  # cached forwards as one compiled graph (LLM(compile=True))
    llama_bench: str = ""  # llama.cpp's llama-bench binary: its decode rate beside the points
    device: str = "auto"
    threads: int = 0  # torch threads (0: leave torch's default)
    out: str | None = None  # default runs/bench/<name or timestamp>
    name: str | None = None
    quick: bool = False

    def __post_init__(self) -> None:
        for name in ("policies", "taus", "steps", "gammas", "block_sizes", "batch_sizes",
                     "precisions"):
            setattr(self, name, tuple(getattr(self, name)))
        checks = [
            (self.task in TASKS, "task", f"must be one of {', '.join(TASKS)}"),
            (self.n >= 1, "n", "must be >= 1"),
            (self.split in EVAL_SPLITS, "split", f"must be one of {', '.join(EVAL_SPLITS)}"),
            (self.policies and all(p in KNOBS for p in self.policies), "policies",
             f"must be a non-empty list from {', '.join(KNOBS)}"),
            (all(0 < t <= 1 for t in self.taus), "taus", "must be in (0, 1]"),
            (all(s >= 1 for s in self.steps), "steps", "must be >= 1"),
            (all(g >= 0 for g in self.gammas), "gammas", "must be >= 0"),
            (all(b >= 0 for b in self.block_sizes) and self.block_sizes, "block_sizes",
             "must be >= 1 (or 0 for the model's own)"),
            (all(b >= 1 for b in self.batch_sizes) and self.batch_sizes, "batch_sizes",
             "must be >= 1"),
            (all(p in PRECISIONS for p in self.precisions) and self.precisions, "precisions",
             f"must be from {', '.join(PRECISIONS)} ({INT4_NOTE})"),
            (self.repeats >= 1, "repeats", "must be >= 1"),
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.max_turns >= 1, "max_turns", "must be >= 1"),
            (self.threads >= 0, "threads", "must be >= 0"),
            (not self.draft or bool(self.ar_model), "draft", "needs --ar-model (the drafter "
             "drafts for the AR twin)"),
            (not self.draft or not self.grammar, "draft", "self-speculative decoding has no "
             "grammar: drop --grammar"),
            (not self.draft or not self.compile, "draft", "is not supported with --compile"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{flag(name)} {why} (got {_show(getattr(self, name))})")
        for policy in self.policies:
            name = KNOB_FIELD[KNOBS[policy]]
            if not getattr(self, name):
                raise ValueError(f"{flag(name)} is empty but --policies includes {policy}")

    def replace(self, **changes: Any) -> BenchConfig:
        return dataclasses.replace(self, **changes)


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)


def make_config(quick: bool = False, **given: Any) -> BenchConfig:
    """Defaults (full sweep, or `QUICK`), overridden by whatever the caller set (None: unset)."""
    base = dict(QUICK) if quick else {}
    base.update({k: v for k, v in given.items() if v is not None})
    if "precisions" not in base:  # the device's native precision (bf16 or fp32), then int8
        base["precisions"] = (native_precision(resolve_device(base.get("device", "auto"))),
                              "int8")
    return BenchConfig(quick=quick, **base)


@dataclass(frozen=True)
class Point:
    role: str  # "dllm" | "ar" | "spec" (the AR twin checking a drafter's tokens)
    precision: str
    batch_size: int
    policy: str = "ar"
    knob: str = ""  # the policy's knob: tau | steps_per_block | gamma ("" for AR)
    value: float = 0.0
    block_size: int = 1

    @property
    def setting(self) -> str:
        """The decoding setting in words, e.g. `threshold tau=0.9`."""
        if self.role != "dllm":
            return {"ar": "AR", "spec": "AR + drafter"}[self.role]
        value = int(self.value) if self.knob == "steps_per_block" else self.value
        return f"{self.policy} {KNOB_LABEL[self.knob]}={value}"

    @property
    def key(self) -> str:
        block = "" if self.role != "dllm" else f" block={self.block_size}"
        return f"{self.role} {self.precision} {self.setting}{block} batch={self.batch_size}"

    def params(self, cfg: BenchConfig, full_attention: bool) -> SamplingParams:
        knobs: dict[str, Any] = {}
        if self.role == "dllm":
            value = int(self.value) if self.knob == "steps_per_block" else self.value
            knobs = {"policy": self.policy, self.knob: value}
            if full_attention:
                knobs["block_size"] = self.block_size
        return SamplingParams(max_tokens=cfg.max_tokens, temperature=0.0, **knobs)


def knob_values(cfg: BenchConfig, policy: str) -> tuple[float, ...]:
    return getattr(cfg, KNOB_FIELD[KNOBS[policy]])


def grid(cfg: BenchConfig, model_block: int, with_ar: bool) -> list[list[Point]]:
    """Groups of points, one per (precision, batch size): the AR point first, then the
    self-speculative one (with `draft`), then the dLLM's."""
    blocks = list(dict.fromkeys(b or model_block for b in cfg.block_sizes))
    groups = []
    for precision in cfg.precisions:
        for batch in cfg.batch_sizes:
            group = [Point("ar", precision, batch)] if with_ar else []
            if with_ar and cfg.draft:
                group.append(Point("spec", precision, batch, policy="drafter"))
            group += [Point("dllm", precision, batch, policy, KNOBS[policy], float(v), block)
                      for policy in cfg.policies for v in knob_values(cfg, policy)
                      for block in blocks]
            groups.append(group)
    return groups


def run_order(groups: list[list[Point]], repeats: int) -> list[tuple[int, Point]]:
    """Every point once per repeat, group by group; odd repeats run each group backwards, so a
    slow drift of the machine does not always land on the same side of a comparison."""
    order = []
    for r in range(repeats):
        for group in groups:
            order += [(r, p) for p in (group if r % 2 == 0 else group[::-1])]
    return order
