"""`clover bench airspace`: flags -> `BenchConfig` -> sweep -> table, files, one JSON line.

List flags take comma-separated values (`--taus 0.5,0.9`). Flags left unset take the full
sweep's defaults, or `--quick`'s. Errors name the flag and exit with status 2 (clover/cli.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from clover.bench.config import DEFAULT_AR_MODEL, DEFAULT_MODEL, TASKS, BenchConfig, make_config
from clover.bench.quant import PRECISIONS, native_precision
from clover.engine.llm import resolve_device
from clover.tasks.airspace.contract import add_grammar_flag


def comma_list(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__} values, got {text!r}") from None
    parse.__name__ = f"{kind.__name__} list"
    return parse


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    precisions = args.precisions
    if args.quantize is not None:
        if precisions is not None:
            raise ValueError("--quantize and --precisions both given: use one (--quantize int8 "
                             "is --precisions int8)")
        precisions = ("int8",) if args.quantize == "int8" else (
            native_precision(resolve_device(args.device or "auto")),)
    fields = {k: getattr(args, k) for k in (
        "model", "messages", "n", "split", "seed", "policies", "taus", "steps", "gammas",
        "block_sizes", "batch_sizes", "repeats", "max_tokens", "max_turns", "device", "threads",
        "out", "name", "llama_bench", "draft")}
    fields["ar_model"] = "" if args.no_ar else args.ar_model
    return make_config(args.quick, task=args.task, precisions=precisions,
                       grammar=args.grammar, compile=args.compile, **fields)


def out_dir(cfg: BenchConfig) -> Path:
    if cfg.out:
        return Path(cfg.out)
    return Path("runs/bench") / (cfg.name or time.strftime("%Y%m%d-%H%M%S"))


def _forward(args: argparse.Namespace) -> int:
    """`clover bench forward`: the cost table of one cached forward (clover/bench/forward.py)."""
    import json

    from clover.bench.forward import ForwardConfig, plot, render, sweep

    given = {k: getattr(args, k) for k in ("precisions", "batch_sizes", "lengths", "context",
                                           "repeats", "tpf", "clock")
             if getattr(args, k) is not None}
    engines = ("eager", "compiled") if args.compile else ("eager",)
    cfg = ForwardConfig(model=args.model or "", out=args.out or "", engines=engines, **given)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda _: None) if args.no_progress else (lambda m: print(m, file=sys.stderr))
    results = sweep(cfg, progress=log)
    out = Path(cfg.out or f"runs/bench/forward-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    results["files"] = {"results": str(out / "forward.json")}
    if not args.no_plots:
        results["files"]["plot"] = str(plot(results, out / "forward.png"))
    (out / "forward.json").write_text(json.dumps(results, indent=1) + "\n")
    print(render(results), end="")
    print(json.dumps(results))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from clover.bench.harness import run_bench

    if args.task == "forward":
        return _forward(args)
    from clover.bench.report import json_line, render_table, write_outputs

    cfg = config_from_args(args)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("clover bench draws its plots with matplotlib: pip install -e "
                             "'.[bench]', or pass --no-plots") from None
    results = run_bench(cfg, progress=not args.no_progress)
    write_outputs(results, out_dir(cfg), plots=not args.no_plots)
    print(render_table(results), end="")
    print(f"report: {results['files']['report']}; results: {results['files']['results']}")
    print(json_line(results))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `bench` to the `clover` subcommands."""
    d = BenchConfig()
    p = sub.add_parser("bench", help="sweep decoding settings of a dLLM and its AR twin on a task: "
                                     "quality, speed, memory, plots, report; `bench forward`: "
                                     "the cost of one cached forward against the roofline")
    p.add_argument("task", nargs="?", default="airspace", choices=(*TASKS, "forward"))
    p.add_argument("--quick", action="store_true",
                   help="a few points on 24 messages (under 10 minutes on 2 CPU cores)")
    _model_flags(p)
    p.add_argument("--messages", default=None, metavar="JSONL",
                   help="prompt file instead of the split (one {id, text, zones?} per line)")
    p.add_argument("--n", type=int, default=None, help=f"messages (full {d.n}, quick 16)")
    p.add_argument("--split", default=None,
                   help="airspace split: train, validation, test, heldout or real-dev (the "
                        "hand-labelled real messages); default test")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--policies", type=comma_list(str), default=None,
                   help=f"commit policies (default {','.join(d.policies)})")
    p.add_argument("--taus", type=comma_list(float), default=None,
                   help=f"threshold / prefix policies: confidence thresholds (default "
                        f"{_csv(d.taus)})")
    p.add_argument("--steps", type=comma_list(int), default=None,
                   help=f"topk policy: denoising steps per block (default {_csv(d.steps)})")
    p.add_argument("--gammas", type=comma_list(float), default=None,
                   help=f"entropy policy: entropy budgets per step (default {_csv(d.gammas)})")
    p.add_argument("--block-sizes", type=comma_list(int), default=None,
                   help="dLLM block sizes; 0 = the model's own (default 0,16; quick 0)")
    p.add_argument("--batch-sizes", type=comma_list(int), default=None,
                   help=f"engine batch sizes (default {_csv(d.batch_sizes)})")
    p.add_argument("--precisions", type=comma_list(str), default=None,
                   help=f"from {','.join(PRECISIONS)} (default: the native precision, bf16 on "
                        "CUDA and on CPUs with AVX-512 BF16 or AMX, else fp32; then int8)")
    p.add_argument("--quantize", default=None, choices=["none", "int8"],
                   help="load both models at one precision: int8 = torchao weight-only, "
                        "none = the native precision (see --precisions)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"runs per point; medians and spreads (default {d.repeats}, quick 1)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"per turn (default {d.max_tokens})")
    p.add_argument("--max-turns", type=int, default=None,
                   help=f"agent turns per message (default {d.max_turns})")
    add_grammar_flag(p)
    p.add_argument("--device", default=None, help="auto | cpu | cuda (default auto)")
    p.add_argument("--compile", action="store_true", help="compiled forwards (LLM(compile="
                   "True)); forward: the compiled rows beside the eager ones")
    p.add_argument("--threads", type=int, default=None, help="torch threads (0: torch's default)")
    p.add_argument("--llama-bench", default=None, metavar="PATH", help="llama.cpp's llama-bench:"
                   " its batch-1 decode rate on the base's GGUF beside each point's")
    p.add_argument("--out", default=None, help="output directory (default runs/bench/<name>)")
    p.add_argument("--name", default=None, help="run name (default: a timestamp)")
    _forward_flags(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_bench)


def _model_flags(p: argparse.ArgumentParser) -> None:
    """Which models run: the diffusion model, its AR twin, the twin's drafter."""
    p.add_argument("--model", default=None, help=f"diffusion model directory ({DEFAULT_MODEL})")
    p.add_argument("--ar-model", default=None,
                   help=f"its AR twin, decoded under the same conditions ({DEFAULT_AR_MODEL})")
    p.add_argument("--no-ar", action="store_true", help="skip the AR twin")
    p.add_argument("--draft", default=None, metavar="DIR",
                   help="a drafter adapter for the AR twin (e.g. models/clover-smol-draft): a "
                        "self-speculative point (the twin's greedy answers, fewer forwards) "
                        "beside AR's at each precision and batch size")


def _forward_flags(p: argparse.ArgumentParser) -> None:
    """The flags only `bench forward` reads."""
    p.add_argument("--lengths", type=comma_list(int), default=None,
                   help="forward: new tokens per row, L (default 1,8,32,64)")
    p.add_argument("--context", type=int, default=None,
                   help="forward: cached tokens per row before the L new ones (default 256)")
    p.add_argument("--tpf", type=comma_list(float), default=None,
                   help="forward: TPFs for the predicted dLLM/AR ratio (default 2,4,8,12)")
    p.add_argument("--clock", default=None, choices=["wall", "cpu"],
                   help="forward: time by wall clock (default) or this process's CPU time "
                        "(steadier on a shared machine)")


def _csv(values: tuple) -> str:
    return ",".join(map(str, values))
