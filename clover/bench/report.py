"""What a bench run leaves behind: the human table, results.json, plots, report.md, the JSON line.

Everything here is a function of the results document that `harness.run_bench` returns; nothing
measures or decodes. `write_outputs` writes the files into the run's directory and returns their
paths; `render_table` and `json_line` are what the command prints (table first, JSON line last).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clover.bench.plots import write_plots

COLUMNS = ("point", "F1", "exact", "TPF", "TPS", "fwd", "full s", "first s", "peak MB",
           "model/policy/grammar/other", "% peak", "x AR", "x AR predicted")
PLOT_TITLES = {"quality_vs_tpf": "Quality vs tokens per forward",
               "quality_vs_time": "Quality vs full task time (AR marked)",
               "tps_vs_batch": "Throughput vs batch size", "first_usable":
               "Time to first usable result", "time_split": "Where the time went"}


def _num(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _spread(p: dict, key: str, fmt: str = ".2f") -> str:
    """`median (min-max)` when repeats differ, else the median."""
    lo_hi = p["spread"].get(key)
    if p.get(key) is None:
        return "-"
    if not lo_hi or lo_hi[0] == lo_hi[1]:
        return format(p[key], fmt)
    return f"{p[key]:{fmt}} ({lo_hi[0]:{fmt}}-{lo_hi[1]:{fmt}})"


def _split(p: dict) -> str:
    total = p["full_task_s"] or 1.0
    parts = (p.get(k) or 0.0 for k in ("model_s", "policy_s", "grammar_s", "other_s"))
    return "/".join(f"{100 * v / total:.0f}" for v in parts) + " %"


def row(p: dict) -> list[str]:
    """One point as table cells, in `COLUMNS` order."""
    name = f"{p['role']} {p['precision']} {p['setting']}"
    if p["role"] == "dllm":
        name += f" block {p['block_size']}"
    return [f"{name} batch {p['batch_size']}", _num(p.get("zone_f1")),
            _num(p.get("exact_message_accuracy")), _num(p["tpf"], ".2f"), _num(p["tps"], ".1f"),
            str(int(p["forwards"])), _spread(p, "full_task_s"), _spread(p, "first_usable_s"),
            _num(p["peak_memory_bytes"] / 1e6, ".0f"), _split(p),
            _num(None if p["peak_fraction"] is None else 100 * p["peak_fraction"], ".1f"),
            _spread(p, "speedup_vs_ar") if p.get("speedup_vs_ar") else "-",
            _num(p.get("predicted_speedup_vs_ar"), ".2f")]


def headline(results: dict[str, Any]) -> str:
    """The run in one line: where it ran, on what, and how long it took."""
    hw = results["hardware"]
    where = hw.get("device_name") or hw.get("processor") or hw["machine"]
    return (f"clover bench {results['task']}: {results['messages']}; {where}, "
            f"{hw['threads']} threads, {hw['device']}; {len(results['points'])} points, "
            f"{results['settings']['repeats']} repeats, {results['wall_s']:.0f} s")


def render_table(results: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "point" else "right")
    for p in results["points"]:
        table.add_row(*row(p), style="bold" if p["role"] == "ar" else None)
    console = Console(record=True, width=200)
    with console.capture() as cap:
        console.print(table)
    peak = ", ".join(f"{k.removeprefix('torch.')} {v / 1e9:.1f} GFLOP/s"
                     for k, v in results["matmul_peak_flops_per_s"].items())
    compiled_in_run = [p["key"] for p in results["points"] if p.get("graphs_compiled_in_run")]
    warn = (f"compiled inside the timed run (a shape the warm-up did not meet; its times include "
            f"compiling): {', '.join(compiled_in_run)}\n" if compiled_in_run else "")
    return (headline(results) + "\n" + cap.get()
            + f"matmul peak: {peak}; split = model/policy/grammar/other share of the full task "
              f"time; x AR = AR full task time / this point's, per repeat; x AR predicted = "
              f"the forward cost model's (tokens / AR's x TPF / AR's TPF x t(1) / the block "
              f"layout's mean forward cost, forwards timed in this run)\n" + warn
            + _llama_line(results))


def _llama_line(results: dict[str, Any]) -> str:
    """llama.cpp's decode rate (given --llama-bench) and each point's TPS against it."""
    llama = results.get("llama_cpp")
    if not llama:
        return ""
    ratios = "; ".join(f"{p['key']} {p['tps_vs_llama_cpp']:.2f}x" for p in results["points"]
                       if p.get("tps_vs_llama_cpp") is not None)
    return (f"llama.cpp (llama-bench tg32, batch 1, {llama['threads']} threads, {llama['gguf']}): "
            f"{llama['llama_cpp_tok_s']} tok/s; task TPS / llama.cpp: {ratios}\n")


def markdown_table(points: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(p)) + " |" for p in points]
    return "\n".join(lines)


def _best(points: list[dict]) -> list[str]:
    """Per (precision, batch): the fastest dLLM point against AR, and the AR twin with its
    drafter (`--draft`), each with both qualities."""
    out = []
    for ar in (p for p in points if p["role"] == "ar"):
        mates = [p for p in points if p["precision"] == ar["precision"]
                 and p["batch_size"] == ar["batch_size"] and p.get("speedup_vs_ar")]
        dllm = [p for p in mates if p["role"] == "dllm"]
        best = [max(dllm, key=lambda p: p["speedup_vs_ar"])] if dllm else []
        for p in best + [p for p in mates if p["role"] == "spec"]:
            what = (f"{p['setting']} (block {p['block_size']})" if p["role"] == "dllm"
                    else f"{p['setting']} (TPF {p['tpf']:.2f})")
            out.append(f"- {ar['precision']}, batch {ar['batch_size']}: {what} is "
                       f"{p['speedup_vs_ar']:.2f}x AR's full task time ({p['full_task_s']:.1f} s "
                       f"vs {ar['full_task_s']:.1f} s), zone F1 {_num(p.get('zone_f1'))} vs AR "
                       f"{_num(ar.get('zone_f1'))}")
    return out


def _grammar(settings: dict[str, Any]) -> str:
    return "on" if settings["grammar"] else "off"


def markdown(results: dict[str, Any], plots: dict[str, str]) -> str:
    s, hw = results["settings"], results["hardware"]
    models = "; ".join(f"{role}: `{m['path']}` ({m['attention']}, {m['total_params'] / 1e6:.1f}M "
                       f"params, {m['active_params'] / 1e6:.1f}M active)"
                       for role, m in results["models"].items())
    weights = "; ".join(f"{k}: {v['quantized_fraction']:.1%} of parameters quantized, "
                        f"{v['weights_bytes'] / 1e6:.1f} MB of weights"
                        for k, v in results["weights"].items())
    peak = ", ".join(f"{k.removeprefix('torch.')} {v / 1e9:.1f} GFLOP/s"
                     for k, v in results["matmul_peak_flops_per_s"].items())
    parts = [
        f"# clover bench: {results['task']}", "", f"{headline(results)}.", "",
        f"- Models: {models}", f"- Messages: {results['messages']}; max_tokens "
        f"{s['max_tokens']}, max_turns {s['max_turns']}, grammar {_grammar(s)}",
        f"- Hardware: {hw.get('processor') or hw['machine']}, {hw['cpus']} CPUs, "
        f"{hw['threads']} torch threads, device {hw['device']}, torch {hw['torch']}, "
        f"torchao {hw['torchao']}",
        f"- Matmul peak measured in this run: {peak}",
        f"- Weights: {weights}", f"- int8: {results['quantization']['int8']}",
        f"- {results['quantization']['int4']}", "", "## Headline", "",
        *(_best(results["points"]) or ["- no AR twin in this run"]), "", "## All points", "",
        markdown_table(results["points"]), "",
    ]
    for name, path in plots.items():
        parts += [f"## {PLOT_TITLES[name]}", "", f"![{name}]({Path(path).name})", ""]
    return "\n".join(parts + [NOTES])


NOTES = """## How to read this

- Every figure is the median over repeats; `(a-b)` is the min-max over repeats. Points ran in
  groups of one precision and batch size, the AR point beside its diffusion points, each group
  reversed on odd repeats; `x AR` is the AR/dLLM full-task-time ratio taken within each repeat.
- `x AR predicted`: what the forward cost model says the ratio should be, work x TPF / AR's
  TPF x t(1) / c, work = the AR's generated tokens / the point's (the two may write answers of
  different lengths). A step within a block feeds b + shift tokens and the step that starts
  a block 2b + shift (the block just completed is fed again so its keys are cached with their
  final tokens); TPF / b of the forwards start a block, so c = (TPF / b) t(2b + shift) +
  (1 - TPF / b) t(b + shift). The forwards are cached ones after the median prompt, timed
  after the sweep on the diffusion model's weights at the point's precision and batch size
  (`clover bench forward`). What it leaves out: prefill, sampling, policy, grammar and the
  engine's other per-step costs (they weigh most on the AR, which takes the most steps).
- Full task time: the agent from the first request to the last tool call executed, tool
  results fed back (`max_turns`). First usable result: the first valid tool call executed.
- TPS: generated tokens / full task time. TPF: generated tokens / request forwards (does not
  depend on hardware or batch). `fwd`: batched forward passes of the engine.
- Time split: model, policy (sampler + commit policy) and grammar from the engine's stats;
  other = the rest of the full task time (scheduling, tokenization, tool execution).
- % peak: useful FLOPs (2 x active matmul parameters x tokens fed, LM head at the positions
  that need logits, attention over visible keys) / model time, against the matmul peak above.
- Peak memory: on CPU the largest resident set size sampled after each forward (process-wide,
  so it includes both models and allocator caches); on CUDA `torch.cuda.max_memory_allocated`.
- Block sizes other than the model's own change its attention blocks as well: a model trained
  at one block size may lose quality at another.
"""


def write_outputs(results: dict[str, Any], out: Path, plots: bool = True) -> dict[str, str]:
    """results.json, the plots and report.md in `out`; returns {name: path}."""
    out.mkdir(parents=True, exist_ok=True)
    files = write_plots(results, out) if plots else {}
    (out / "report.md").write_text(markdown(results, files))
    files["report"] = str(out / "report.md")
    files["results"] = str(out / "results.json")
    results["files"] = files
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return files


def json_line(results: dict[str, Any]) -> str:
    """The whole results document on one line (the last line the command prints)."""
    return json.dumps(results, separators=(",", ":"))
