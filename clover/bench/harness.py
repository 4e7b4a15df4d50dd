"""The sweep: every point of the grid, `repeats` times, interleaved, measured and summarised.

Each model is loaded once per precision. Each run builds a fresh engine for its point (batch size
= the engine's rows), warms it up on two short requests, then runs the airspace agent
(`clover.tasks.airspace.agent.run_agent`, the demo's code) on every message and scores the tool
calls it executed. A point's figures are medians over its repeats, with (min, max) spreads; the
diffusion model's speed-up over its AR twin is the median of ratios taken within each repeat,
between runs made moments apart. Returns one plain dict; printing and files are `report.py`'s.
"""

from __future__ import annotations

import copy
import gc
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from clover.bench.config import BenchConfig, Point, flag, grid, run_order
from clover.bench.forward import time_forwards
from clover.bench.machine import llama_bench
from clover.bench.probe import ForwardProbe, active_matmul_params, matmul_peak
from clover.bench.quant import (
    INT4_NOTE,
    WeightReport,
    activation_dtype,
    load_at,
    require_torchao,
    torchao_version,
    weight_report,
)
from clover.checkpoint.base import gguf_path
from clover.engine import LLM
from clover.engine.llm import resolve_device
from clover.engine.stats import max_rss
from clover.model import CloverModel
from clover.tasks.airspace import TOOLS, load_messages_jsonl, score, split_examples
from clover.tasks.airspace.agent import AgentRun, initial_conversation, predictions, run_agent
from clover.tasks.airspace.contract import tool_constraint
from clover.tasks.airspace.stats import interval, message_counts
from clover.tokenizer import render_chat

QUALITY = ("zone_f1", "zone_precision", "zone_recall", "field_accuracy",
           "exact_message_accuracy", "tool_call_validity")
SPREAD = ("full_task_s", "first_usable_s", "tps", "model_s", "peak_memory_bytes",
          "achieved_flops_per_s")


# ---- inputs -------------------------------------------------------------------------------------

def check_inputs(cfg: BenchConfig) -> None:
    """Fail before any work: missing model directories, wrong attention modes, missing files."""
    from clover.checkpoint import load_config

    roles = [("model", cfg.model)] + ([("ar_model", cfg.ar_model)] if cfg.ar_model else [])
    for name, path in roles:
        if not Path(path, "config.json").is_file():
            raise ValueError(f"{flag(name)} {path}: not a model directory (no config.json); "
                             f"train it with `clover train` or pass another directory")
    if load_config(cfg.model).attention == "causal":
        raise ValueError(f"--model {cfg.model}: causal attention; pass the diffusion model as "
                         f"--model and its AR twin as --ar-model")
    if cfg.ar_model and load_config(cfg.ar_model).attention != "causal":
        raise ValueError(f"--ar-model {cfg.ar_model}: not a causal (AR) model")
    if cfg.messages and not Path(cfg.messages).is_file():
        raise ValueError(f"--messages {cfg.messages}: no such file")
    if "int8" in cfg.precisions:
        require_torchao("--precisions")
    if cfg.llama_bench and not os.access(cfg.llama_bench, os.X_OK):
        raise ValueError(f"--llama-bench {cfg.llama_bench}: not an executable file")
    if cfg.draft:
        _check_draft(cfg)


def _check_draft(cfg: BenchConfig) -> None:
    """The drafter: a block-diffusion model directory (over the AR twin's base)."""
    from clover.checkpoint import load_config

    if not Path(cfg.draft, "config.json").is_file():
        raise ValueError(f"--draft {cfg.draft}: not a model directory (no config.json)")
    if load_config(cfg.draft).attention != "block":
        raise ValueError(f"--draft {cfg.draft}: not a block-diffusion model (a drafter drafts "
                         f"a block at a time)")


def load_examples(cfg: BenchConfig) -> list:
    if cfg.messages:
        examples = load_messages_jsonl(cfg.messages)[:cfg.n]
        if not examples:
            raise ValueError(f"--messages {cfg.messages}: no messages in the file")
        return examples
    return split_examples(cfg.split, cfg.n, cfg.seed)


@dataclass
class Loaded:
    model: CloverModel
    tokenizer: Any
    weights: WeightReport
    pair: Any = None  # role "spec": the RoutedPair (the AR twin routing the drafter's rows)


class Models:
    """Each (role, precision) loaded once, when first needed ("spec": the AR twin and the
    drafter as one pair, as `LLM(draft=)` loads them)."""

    def __init__(self, paths: dict[str, str], device: torch.device) -> None:
        self.paths, self.device = paths, device
        self.loaded: dict[tuple[str, str], Loaded] = {}

    def get(self, role: str, precision: str) -> Loaded:
        key = (role, precision)
        if key in self.loaded:
            return self.loaded[key]
        if role == "spec":
            from clover.engine.spec_engine import spec_pair

            pair, tok = spec_pair(self.paths["ar"], self.paths["spec"], self.device,
                                  activation_dtype(precision, self.device), precision == "int8")
            self.loaded[key] = Loaded(pair.model, tok, weight_report(pair.model), pair)
        else:
            model, tok = load_at(self.paths[role], precision, self.device)
            self.loaded[key] = Loaded(model, tok, weight_report(model))
        return self.loaded[key]


def with_block_size(model: CloverModel, block_size: int) -> CloverModel:
    """The same weights decoding with another block size (a shallow copy with its own config).

    For `block` models this changes the attention blocks too, as decoding and the exact cache
    require; a model trained at one block size may lose quality at another.
    """
    if model.config.attention != "block" or block_size == model.config.block_size:
        return model
    view = copy.copy(model)
    view.config = model.config.replace(block_size=block_size)
    return view


# ---- one run ------------------------------------------------------------------------------------

def measure(point: Point, loaded: Loaded, examples: list, cfg: BenchConfig,
            device: torch.device, scored: bool) -> dict[str, Any]:
    """One run of one point: fresh engine, warm-up, the agent on every message, figures."""
    model = loaded.model
    if point.role == "dllm":
        model = with_block_size(model, point.block_size)
    need = min(context_need(loaded.tokenizer, examples, cfg), model.config.max_seq_len)
    llm = LLM(cfg.ar_model if loaded.pair else model, tokenizer=loaded.tokenizer,
              device=str(device), dtype=activation_dtype(point.precision, device),
              max_batch_size=point.batch_size, compile=cfg.compile, draft=loaded.pair)
    params = point.params(cfg, model.config.attention == "full")
    if cfg.grammar:
        params = params.replace(structured=tool_constraint())
    llm.engine.runner.ensure_capacity(need)  # growing the KV cache mid-run would copy it
    # warm-up (kernels, allocator, grammar compile, compiled graphs) on training-split messages:
    # none of the timed prompts is in the prefix cache before its turn
    run_agent(llm, split_examples("train", 2, cfg.seed),
              params.replace(max_tokens=min(cfg.max_tokens, 16)), max_turns=1)
    probe = ForwardProbe(llm.engine)
    graphs = counters["stats"]["unique_graphs"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run = run_agent(llm, examples, params, max_turns=cfg.max_turns)
    row = _figures(run, probe, model, device)
    # a shape the warm-up did not meet is compiled inside the timed run (minutes): say so
    row["graphs_compiled_in_run"] = counters["stats"]["unique_graphs"] - graphs
    if scored:
        preds = predictions(run)
        scores = score(preds, examples)
        row.update({k: scores[k] for k in QUALITY})
        row["zone_f1_ci95"] = interval(message_counts(preds, examples)).as_list()
    del llm
    gc.collect()
    return row


def context_need(tok, examples: list, cfg: BenchConfig) -> int:
    """Token slots the longest conversation can reach: its first prompt, then per turn the
    answer (max_tokens) and the tool results fed back (a few hundred tokens at most).

    The KV cache is sized for it up front (capped at the model's context length; the agent
    caps each turn's max_tokens to the room left).
    """
    longest = max(_prompt_len(tok, e) for e in examples)
    return longest + cfg.max_turns * (cfg.max_tokens + 256)


def _prompt_len(tok, example) -> int:
    """Tokens of an example's first-turn prompt (system prompt, tools, message)."""
    return len(tok.encode(render_chat(tok, initial_conversation(example), tools=TOOLS,
                                      fixed_task_prompt=True)))


def _figures(run: AgentRun, probe: ForwardProbe, model: CloverModel,
             device: torch.device) -> dict[str, Any]:
    e = run.engine_stats
    flops = probe.count.flops(model.config, active_matmul_params(model))
    memory = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
              else probe.count.peak_rss_bytes)
    split = {k: e[k] for k in ("model_s", "policy_s", "grammar_s")}
    return {"full_task_s": run.full_task_s, "first_usable_s": run.first_usable_s,
            "tps": run.tps, "tpf": run.tpf, "forwards": run.forwards,
            "request_forwards": run.request_forwards, "generated_tokens": run.generated_tokens,
            **split, "other_s": max(run.full_task_s - sum(split.values()), 0.0),
            "tokens_per_forward": probe.count.tokens / max(probe.count.forwards, 1),
            "unique_experts_per_forward": e["unique_experts_per_forward"],
            "acceptance_rate": e.get("acceptance_rate"),  # self-speculative points only
            "peak_memory_bytes": memory, "flops": flops,
            "achieved_flops_per_s": flops / e["model_s"] if e["model_s"] else None}


# ---- the sweep ----------------------------------------------------------------------------------

def run_bench(cfg: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Run the whole sweep; returns the results document (see docs/bench.md)."""
    check_inputs(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    examples = load_examples(cfg)
    scored = not cfg.messages or any(e.zones or e.cancels for e in examples)
    paths = {"dllm": cfg.model, **({"ar": cfg.ar_model} if cfg.ar_model else {}),
             **({"spec": cfg.draft} if cfg.ar_model and cfg.draft else {})}
    models = Models(paths, device)
    from clover.checkpoint import load_config

    groups = grid(cfg, load_config(cfg.model).block_size, with_ar=bool(cfg.ar_model))
    t0 = time.perf_counter()
    peaks = {str(dt): matmul_peak(dt, device)
             for dt in {activation_dtype(p, device) for p in cfg.precisions}}
    runs: dict[Point, list[dict]] = {}
    order = run_order(groups, cfg.repeats)
    with _Progress(len(order), progress) as bar:
        for rep, point in order:
            bar.show(f"repeat {rep + 1}/{cfg.repeats}: {point.key}")
            loaded = models.get(point.role, point.precision)
            runs.setdefault(point, []).append(measure(point, loaded, examples, cfg, device,
                                                      scored))
            bar.advance()
    points = [summarise(p, runs[p], peaks[str(activation_dtype(p.precision, device))])
              for group in groups for p in group]
    _add_ratios(points, groups, runs)
    _add_predicted(points, groups, models, prompt_tokens(models, examples))
    doc = _document(cfg, device, examples, models, peaks, points, time.perf_counter() - t0)
    if cfg.llama_bench:
        add_llama_cpp(doc, llama_bench(cfg.llama_bench, gguf_path(), torch.get_num_threads()))
    return doc


def add_llama_cpp(doc: dict[str, Any], llama: dict) -> None:
    """llama.cpp's batch-1 decode rate on the base's GGUF (its own benchmark, run after the
    sweep on the same machine) and each point's task rate against it: committed tokens per
    second over llama.cpp's decoded tokens per second."""
    doc["llama_cpp"] = llama
    for p in doc["points"]:
        tps = p.get("tps")
        p["tps_vs_llama_cpp"] = None if tps is None else tps / llama["llama_cpp_tok_s"]


def summarise(point: Point, rows: list[dict], peak_flops: float) -> dict[str, Any]:
    """Medians over repeats, (min, max) spreads, and the share of the matmul peak."""
    out: dict[str, Any] = {"key": point.key, "role": point.role, "precision": point.precision,
                           "setting": point.setting, "policy": point.policy, "knob": point.knob,
                           "value": point.value, "block_size": point.block_size,
                           "batch_size": point.batch_size, "repeats": len(rows)}
    for k in rows[0]:
        values = [r[k] for r in rows if r[k] is not None]
        if values and isinstance(values[0], list):  # an interval: the first repeat's (greedy
            out[k] = values[0]  # answers repeat; `same_output_every_repeat` checks it)
        else:
            out[k] = statistics.median(values) if values else None
    out["spread"] = {k: [min(v), max(v)] for k in SPREAD
                     if (v := [r[k] for r in rows if r.get(k) is not None])}
    out["graphs_compiled_in_run"] = max(r.get("graphs_compiled_in_run", 0) for r in rows)
    achieved = out.get("achieved_flops_per_s")
    out["peak_fraction"] = achieved / peak_flops if achieved and peak_flops else None
    # temperature 0: the same tokens whatever the batch or the repeat
    out["same_output_every_repeat"] = len({(r.get("zone_f1"), r["generated_tokens"])
                                           for r in rows}) == 1
    return out


def _add_ratios(points: list[dict], groups: list[list[Point]],
                runs: dict[Point, list[dict]]) -> None:
    """Per dLLM point: AR full task time / its own, taken within each repeat, then the median."""
    by_key = {p["key"]: p for p in points}
    for group in groups:
        ar = next((p for p in group if p.role == "ar"), None)
        for p in group:
            if ar is None or p.role == "ar":
                continue
            ratios = [a["full_task_s"] / d["full_task_s"]
                      for a, d in zip(runs[ar], runs[p], strict=True) if d["full_task_s"]]
            if ratios:
                by_key[p.key]["speedup_vs_ar"] = statistics.median(ratios)
                by_key[p.key]["spread"]["speedup_vs_ar"] = [min(ratios), max(ratios)]


def prompt_tokens(models: Models, examples: list) -> int:
    """The median first-turn prompt length in tokens: the context the cost model times after."""
    tok = next(v for (r, _), v in models.loaded.items() if r == "dllm").tokenizer
    return int(statistics.median(_prompt_len(tok, e) for e in examples))


def _add_predicted(points: list[dict], groups: list[list[Point]], models: Models, context: int,
                   repeats: int = 5) -> None:
    """Per dLLM point with an AR mate: what the forward cost model predicts for its x AR, beside
    the measured one. The engine's block layout (`clover/engine/scheduler.py`) feeds b + shift
    tokens per step of a block of b, and 2b + shift on the step that starts a block (the block
    just completed is fed again, so its keys are cached with their final tokens); a share
    TPF / b of the forwards start a block. So a forward costs c = (TPF / b) t(2b + shift) +
    (1 - TPF / b) t(b + shift), and x AR = work x TPF / AR's TPF x t(1) / c, where work = the
    AR's generated tokens / the point's (the same work: 1; the two may write different
    answers), with t timed in this run on the dLLM's weights at the point's precision and batch
    size, after `context` cached tokens (`clover bench forward`). Prefill, sampling and the
    engine's per-step overhead are left out."""
    by_key = {p["key"]: p for p in points}
    cost: dict[tuple, dict[str, float]] = {}
    for group in groups:
        ar = next((by_key[p.key] for p in group if p.role == "ar"), None)
        for p in group:
            d = by_key[p.key]
            if ar is None or p.role != "dllm" or not (d.get("tpf") and ar.get("tpf")
                                                    and ar.get("generated_tokens")):
                continue
            key = (p.precision, p.batch_size, p.block_size)
            if key not in cost:
                cost[key] = _block_costs(models.get("dllm", p.precision).model, p.block_size,
                                         p.batch_size, context, repeats)
            t = cost[key]
            start = min(d["tpf"] / p.block_size, 1.0)
            per_forward = start * t["block_start"] + (1 - start) * t["block"]
            d["forward_ms"] = t
            d["block_cost_vs_one_token"] = per_forward / t["one"]
            work = ar["generated_tokens"] / max(d["generated_tokens"], 1)
            d["predicted_speedup_vs_ar"] = work * d["tpf"] / ar["tpf"] * t["one"] / per_forward


def _block_costs(model: CloverModel, block: int, batch: int, context: int,
                 repeats: int) -> dict[str, float]:
    """Median ms of the three forwards the cost model prices: one token (AR), a step within a
    block (b + shift tokens), a step that starts one (2b + shift)."""
    model = with_block_size(model, block)
    shift = int(model.config.shift_logits)
    lengths = (1, block + shift, 2 * block + shift)
    ctx = min(context, model.config.max_seq_len - lengths[-1])
    ms = time_forwards(model, batch, lengths, ctx, repeats)
    return {name: statistics.median(ms[n])
            for name, n in zip(("one", "block", "block_start"), lengths, strict=True)}


def _document(cfg: BenchConfig, device: torch.device, examples: list, models: Models,
              peaks: dict[str, float], points: list[dict], wall_s: float) -> dict[str, Any]:
    from clover.inspect import describe

    described = {}
    for role, path in models.paths.items():
        loaded = next(v for (r, _), v in models.loaded.items() if r == role)
        described[role] = {"path": path, **describe(loaded.model.config)}
    weights = {f"{r} {p}": v.weights.as_dict() for (r, p), v in models.loaded.items()}
    return {"bench": "clover", "task": cfg.task,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_s": round(wall_s, 2),
            "hardware": hardware(device), "messages": _messages(cfg, examples),
            "models": described, "settings": asdict(cfg),
            "matmul_peak_flops_per_s": peaks, "weights": weights,
            "quantization": {"int8": f"torchao {torchao_version()} Int8WeightOnlyConfig "
                                     f"(per-row scales; routers and tied embedding kept float)",
                             "int4": INT4_NOTE},
            "first_usable_result": "first valid tool call executed by the agent, from the start",
            "points": points}


def _messages(cfg: BenchConfig, examples: list) -> str:
    if cfg.messages:
        return f"{cfg.messages} ({len(examples)} messages)"
    return f"airspace {cfg.split} split, n={cfg.n}, seed={cfg.seed}"




def hardware(device: torch.device) -> dict[str, Any]:
    info = {"machine": platform.machine(), "processor": cpu_name(),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "device": str(device),
            "torch": torch.__version__, "torchao": torchao_version(),
            "process_max_rss_bytes": max_rss()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info


def cpu_name() -> str | None:
    """The CPU model from /proc/cpuinfo (Linux), else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or None


class _Progress:
    """Progress on stderr: a rich bar on a terminal, else one line per run (nothing if disabled)."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.console import Console

        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.console = Console(stderr=True) if enabled else None
        self.bar = self.task = None

    def __enter__(self) -> _Progress:
        if self.console is not None and self.console.is_terminal:
            from rich import progress as rp

            self.bar = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                                   rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                                   rp.TimeRemainingColumn(), console=self.console)
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=self.total)
        return self

    def show(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)
        elif self.console is not None:
            elapsed = time.perf_counter() - self.t0
            self.console.print(f"[{self.done + 1}/{self.total}] {text} ({elapsed:.0f} s)",
                               highlight=False, soft_wrap=True)

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
