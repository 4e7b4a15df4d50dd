"""`clover demo airspace`: the diffusion model and its AR twin on the same messages, side by side.

Loads both model directories, warms each up, and runs the agent (clover.tasks.airspace.agent) on
the same messages with each, in two regimes: `batch` (every message submitted at once, the
engine batches them) and `one-by-one` (an agent handling messages in turn: batch 1). Scores both
with the task's scorer, prints one table per regime with the measured speed ratio, and writes
`report.json` and the 3D map page. Models run one after the other in one process. With `draft`
(a drafter adapter: `clover demo` picks models/clover-smol-draft for the default baseline) a third
decoder runs too: the AR twin checking the drafter's tokens (self-speculative decoding,
clover/engine/spec_engine.py), whose answers are the twin's own, with its speed ratio.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from clover.bench.quant import cli_dtype
from clover.engine import LLM, SamplingParams
from clover.engine.stats import EngineStats
from clover.tasks.airspace import (
    ANSWER_MAX_TOKENS,
    load_messages_jsonl,
    score,
    split_examples,
)
from clover.tasks.airspace.agent import AgentRun, predictions, run_agent
from clover.tasks.airspace.contract import tool_constraint
from clover.tasks.airspace.scorer import match_zones
from clover.tasks.airspace.stats import compare, interval, message_counts

DEFAULT_MODEL = "models/clover-smol"
DEFAULT_BASELINE = "models/clover-smol-ar"
DEFAULT_DRAFT = "models/clover-smol-draft"  # the drafter trained for DEFAULT_BASELINE
SPEC = "AR + drafter"  # the self-speculative decoder's name in rows and ratios
REGIMES = ("batch", "one-by-one")

# progress(phase, done, total): phase is e.g. "diffusion, batch"; called at the start of a phase
# (done 0), after each message in one-by-one (batch runs all messages in one go), and at its end
Progress = Callable[[str, int, int], None]


@dataclass(kw_only=True)
class DemoConfig:
    model: str = DEFAULT_MODEL
    baseline: str = DEFAULT_BASELINE
    draft: str | None = None  # a drafter adapter for the baseline: a third, self-speculative run
    n: int = 20
    seed: int = 0
    split: str = "test"
    messages: str | None = None
    out: str = "runs/demo"
    # prefix over threshold at the same tau, chosen on the validation split: zone F1 0.261 vs
    # 0.207, 0.417 vs 0.286, 0.472 vs 0.418 for clover-smol's stages 5-7 (TPF 3.61 vs 3.65 and
    # 4.20 vs 4.00 for stages 6-7)
    policy: str = "prefix"
    tau: float = 0.9
    max_tokens: int = ANSWER_MAX_TOKENS
    max_turns: int = 2
    grammar: bool = False  # constrain each turn to text or calls that keep the task's contract
    device: str = "auto"
    dtype: str = "auto"
    map: bool = True
    regimes: tuple[str, ...] = REGIMES

    def __post_init__(self) -> None:
        bad = [r for r in self.regimes if r not in REGIMES]
        if bad or not self.regimes:
            raise ValueError(f"--regimes {bad or '(none)'}: choose from {', '.join(REGIMES)}")
        if self.draft and self.grammar:
            raise ValueError("--draft: self-speculative decoding has no grammar; drop --grammar "
                             "or pass --draft none")


def _examples(cfg: DemoConfig) -> list:
    if cfg.messages:
        return load_messages_jsonl(cfg.messages)[:cfg.n]
    return split_examples(cfg.split, cfg.n, cfg.seed)


def _has_truth(cfg: DemoConfig, examples: list) -> bool:
    return not cfg.messages or any(e.zones or e.cancels for e in examples)


def run_one(llm: LLM, examples: list, params: SamplingParams, max_turns: int,
            regime: str = "batch", on_message: Callable[[int], None] | None = None) -> AgentRun:
    """Warm up, then run the messages all at once (`batch`) or one after another (`one-by-one`);
    `on_message(k)` is told when k messages are done."""
    run_agent(llm, examples[:2], params.replace(max_tokens=min(params.max_tokens, 64)),
              max_turns=1)  # warm-up: allocations, kernels, caches
    if regime == "batch":
        run = run_agent(llm, examples, params, max_turns=max_turns)
        if on_message:
            on_message(len(examples))
        return run
    runs = []
    for e in examples:
        runs.append(run_agent(llm, [e], params, max_turns=max_turns))
        if on_message:
            on_message(len(runs))
    return sequential(runs)


def sequential(runs) -> AgentRun:
    """One-by-one runs as one: times add up; the first usable result is the first message's;
    the engine's totals add up, so its ratios (TPF, rows per step) cover all the runs and its peak
    memory is the process's, not a sum."""
    runs = list(runs)
    first, elapsed = None, 0.0
    for run in runs:
        if first is None and run.first_usable_s is not None:
            first = elapsed + run.first_usable_s
        elapsed += run.full_task_s
    totals = EngineStats.merged(r.totals for r in runs)
    return AgentRun([m for r in runs for m in r.messages], elapsed, first,
                    sum(r.generated_tokens for r in runs), sum(r.forwards for r in runs),
                    sum(r.request_forwards for r in runs), totals.as_dict(), totals)


def summarise(name: str, path: str, run: AgentRun, scores: dict | None) -> dict[str, Any]:
    row = {"model": name, "path": path, "full_task_s": round(run.full_task_s, 3),
           "first_usable_s": None if run.first_usable_s is None else round(run.first_usable_s, 3),
           "tps": round(run.tps, 1), "tpf": round(run.tpf, 3), "forwards": run.forwards,
           "request_forwards": run.request_forwards, "generated_tokens": run.generated_tokens,
           "engine": run.engine_stats}
    if scores is not None:
        row.update({k: scores[k] for k in ("zone_f1", "zone_f1_ci95", "zone_precision",
                                           "zone_recall", "field_accuracy",
                                           "exact_message_accuracy", "tool_call_validity")
                    if k in scores})
    return row


def run_demo(cfg: DemoConfig, progress: Progress | None = None) -> dict[str, Any]:
    cfg = replace(cfg, dtype=cli_dtype(cfg.dtype, cfg.device))
    for flag, path in (("--model", cfg.model), ("--baseline", cfg.baseline),
                       *((("--draft", cfg.draft),) if cfg.draft else ())):
        if not Path(path, "config.json").is_file():
            raise ValueError(f"{flag} {path}: not a model directory (no config.json); train one "
                             f"with `clover train` or pass another directory")
    examples = _examples(cfg)
    params = SamplingParams(policy=cfg.policy, tau=cfg.tau, max_tokens=cfg.max_tokens,
                            structured=tool_constraint() if cfg.grammar else None)
    rows, runs, counts = [], {}, {}
    decoders = [("diffusion", cfg.model, None), ("autoregressive", cfg.baseline, None)]
    for name, path, draft in decoders + ([(SPEC, cfg.baseline, cfg.draft)] if cfg.draft else []):
        llm = LLM(path, device=cfg.device, dtype=cfg.dtype, max_batch_size=max(len(examples), 1),
                  draft=draft)
        for regime in cfg.regimes:
            phase = f"{name}, {regime}"
            tell = (lambda k, phase=phase: progress(phase, k, len(examples))) if progress else None
            if tell:
                tell(0)
            run = run_one(llm, examples, params, cfg.max_turns, regime, on_message=tell)
            scores = _scores(run, examples, counts, name) if _has_truth(cfg, examples) else None
            rows.append({"regime": regime, **summarise(name, path, run, scores)})
            runs[name, regime] = run
        del llm
    report = _report(cfg, rows)
    if cfg.draft:
        report["speed_ratio_drafter"] = _ratios(rows, SPEC)
        report["drafter_same_answers"] = {
            regime: _same_answers(runs[SPEC, regime], runs["autoregressive", regime])
            for regime in cfg.regimes}
    if len(counts) == 2:  # the two models on the same messages (their first regime's answers)
        report["zone_f1_difference"] = compare(counts["diffusion"],
                                               counts["autoregressive"]).as_dict()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.map:
        report["map"] = str(_write_map(runs["diffusion", cfg.regimes[0]], out / "map.html",
                                       cfg.model))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    report["report"] = str(out / "report.json")
    return report


def _scores(run: AgentRun, examples: list, counts: dict, name: str) -> dict:
    """The scorer's figures and zone F1's message bootstrap interval; the first regime's
    per-message counts kept for the paired diffusion - AR comparison."""
    preds = predictions(run)
    mine = message_counts(preds, examples)
    counts.setdefault(name, mine)
    return score(preds, examples) | {"zone_f1_ci95": interval(mine).as_list()}


def _same_answers(run: AgentRun, ar: AgentRun) -> str:
    """How many messages got every turn's text exactly as the AR run wrote it."""
    same = sum(a.outputs == b.outputs for a, b in zip(run.messages, ar.messages, strict=True))
    return f"{same}/{len(ar.messages)}"


def _ratios(rows: list[dict], model: str = "diffusion") -> dict[str, float | None]:
    """Per regime: AR full task time / `model`'s full task time (> 1: `model` is faster)."""
    out = {}
    for regime in dict.fromkeys(r["regime"] for r in rows):
        dllm, ar = (next(r for r in rows if r["regime"] == regime and r["model"] == m)
                    for m in (model, "autoregressive"))
        out[regime] = round(ar["full_task_s"] / dllm["full_task_s"], 2) if dllm[
            "full_task_s"] else None
    return out


def _report(cfg: DemoConfig, rows: list[dict]) -> dict[str, Any]:
    ratios = _ratios(rows)
    return {"demo": "airspace", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "hardware": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "messages": cfg.messages or
            f"{cfg.split} split, n={cfg.n}, seed={cfg.seed}",
            "settings": {"policy": cfg.policy, "tau": cfg.tau, "max_tokens": cfg.max_tokens,
                         "max_turns": cfg.max_turns, "grammar": cfg.grammar, "draft": cfg.draft,
                         "device": cfg.device, "dtype": cfg.dtype},
            "rows": rows, "speed_ratio_full_task": ratios}


def _write_map(run: AgentRun, path: Path, model: str) -> Path | None:
    try:
        from clover.tasks.airspace.mappage import write_map
    except ImportError:
        return None
    return write_map(map_messages(run, model), path)


def map_messages(run: AgentRun, model: str) -> list[dict]:
    """Per message: truth zones, the model's zones, and which of the model's zones are right."""
    out = []
    for m in run.messages:
        preds = list(m.registry.zones.values())
        correct = [False] * len(preds)
        for i, _, errs in match_zones(preds, list(m.example.zones)):
            correct[i] = not errs
        out.append({"id": m.example.id, "text": m.example.text, "model": model,
                    "truth": [z.to_dict() for z in m.example.zones],
                    "pred": [z.to_dict() for z in preds], "pred_correct": correct})
    return out


def render_table(report: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    rows = report["rows"]
    settings = report["settings"]
    grammar = "on" if settings.get("grammar") else "off"
    table = Table(title=f"clover demo airspace ({report['messages']}; {settings.get('policy')} "
                        f"tau {settings.get('tau')}; grammar {grammar}; {settings.get('dtype')}; "
                        f"{report['hardware']}, {report['threads']} threads)")
    table.add_column("")
    for r in rows:
        table.add_column(f"{r['model']}\n{r['regime']}", justify="right")
    fields = [("full task time (s)", "full_task_s"), ("first usable result (s)", "first_usable_s"),
              ("TPS", "tps"), ("TPF", "tpf"), ("forwards (batched)", "forwards"),
              ("zone F1", "zone_f1"), ("zone F1, 95% interval", "zone_f1_ci95"),
              ("field accuracy", "field_accuracy"),
              ("exact-message accuracy", "exact_message_accuracy"),
              ("tool-call validity", "tool_call_validity")]
    for label, key in fields:
        table.add_row(label, *(_fmt(r.get(key)) for r in rows))
    console = Console(record=True, width=100)
    with console.capture() as cap:
        console.print(table)
    ratios = ", ".join(f"{k} {v}x" for k, v in report["speed_ratio_full_task"].items())
    text = cap.get() + f"speed ratio (AR full task time / diffusion): {ratios}\n"
    if report.get("speed_ratio_drafter"):
        spec = ", ".join(f"{k} {v}x (answers the same as AR: {report['drafter_same_answers'][k]})"
                         for k, v in report["speed_ratio_drafter"].items())
        text += f"speed ratio (AR full task time / {SPEC}): {spec}\n"
    diff = report.get("zone_f1_difference")
    if diff:
        lo, hi = diff["difference_ci"]
        text += (f"zone F1, diffusion - AR: {diff['difference']:+.3f} (95% interval {lo:+.3f} to "
                 f"{hi:+.3f}, paired bootstrap over the messages)\n")
    return text


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "-".join(f"{x:.2f}" for x in v)
    return f"{v:.3f}" if isinstance(v, float) else str(v)
