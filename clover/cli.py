"""One entry point: `clover <command>`. Each command parses flags and calls library code.

Commands register themselves in `COMMANDS` (name -> function adding the subparser); nothing is
discovered by import scanning. Errors a user can fix (bad flag values, bad model directories) are
printed as one line naming what was wrong, with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _inspect(args: argparse.Namespace) -> int:
    from clover.inspect import describe, render_table, resolve_config

    config = resolve_config(args.model)
    if args.plan:
        from clover.plan import PlanConfig, make_plan, render_plan

        plan = make_plan(config, PlanConfig(gpus=args.gpus, gpu_mem_gib=args.gpu_mem,
                                            seq_len=args.seq_len, micro_batch=args.micro_batch))
        print(json.dumps(plan) if args.json else render_plan(plan))
        return 0
    info = describe(config)
    print(json.dumps(info) if args.json else render_table(info))
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="parameters, active parameters, memory of a preset or model")
    p.add_argument("model", help="preset name (e.g. clover-35b-a3b), model directory, or a "
                                 "Hugging Face config.json of an importable family")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plan", action="store_true",
                   help="memory plan: FSDP2 training and replica / tensor / expert-parallel "
                        "serving over --gpus GPUs of --gpu-mem GiB (from the config alone)")
    p.add_argument("--gpus", type=int, default=8, help="with --plan: number of GPUs")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="with --plan: GiB per GPU")
    p.add_argument("--seq-len", type=int, default=4096,
                   help="with --plan: tokens per training sequence")
    p.add_argument("--micro-batch", type=int, default=1,
                   help="with --plan: training sequences per GPU per forward")
    p.set_defaults(func=_inspect)


def _demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clover.demo import DEFAULT_BASELINE, DEFAULT_DRAFT, DemoConfig, render_table, run_demo

    if args.which == "core":
        from clover.demo_core import run_core_demo
        return run_core_demo(args.out, preset="clover-tiny")
    fields = {k: v for k, v in vars(args).items() if k in DemoConfig.__dataclass_fields__}
    fields["regimes"] = tuple(fields.get("regimes", ()))
    if fields.get("draft") == "auto":
        fields["draft"] = DEFAULT_DRAFT if (args.baseline == DEFAULT_BASELINE and not args.grammar
                                           and Path(DEFAULT_DRAFT).is_dir()) else None
    elif fields.get("draft") == "none":
        fields["draft"] = None
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
             TimeElapsedColumn(), transient=False) as bar:
        tasks: dict = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"{phase} (messages)", total=total)
            bar.update(tasks[phase], completed=done)

        report = run_demo(DemoConfig(**fields), progress=progress)
    print(render_table(report))
    print(f"report: {report['report']}" + (f"; map: {report['map']}" if report.get("map") else ""))
    if args.serve and report.get("map"):
        _serve_file(report["map"], args.port)
    return 0


def _serve_file(path: str, port: int) -> None:
    import functools
    import http.server
    from pathlib import Path

    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(Path(path).parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"map at http://127.0.0.1:{port}/{Path(path).name} (Ctrl-C to stop)")
        httpd.serve_forever()


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from clover.demo import DEFAULT_DRAFT, DemoConfig
    from clover.tasks.airspace.contract import add_grammar_flag
    from clover.tasks.airspace.data import EVAL_SPLITS

    d = DemoConfig()
    p = sub.add_parser("demo", help="the airspace agent demo: diffusion vs AR on the same messages")
    p.add_argument("which", nargs="?", default="airspace", choices=["airspace", "core"],
                   help="airspace (default) or core (build, save, reload and inspect a model)")
    p.add_argument("--model", default=d.model, help="diffusion model directory")
    p.add_argument("--baseline", default=d.baseline, help="AR baseline model directory")
    p.add_argument("--draft", default="auto",
                   help="a drafter adapter for the baseline: a third run, the baseline checking "
                        "its drafts (self-speculative: the baseline's answers in fewer "
                        f"forwards). auto (default): {DEFAULT_DRAFT} with the default baseline "
                        "and no --grammar; none: skip it")
    p.add_argument("--n", type=int, default=d.n, help="number of messages")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--split", default=d.split, choices=EVAL_SPLITS,
                   help="airspace split to draw messages from (real-dev: hand-labelled real ones)")
    p.add_argument("--messages", default=None, help="your own messages (JSONL: id, text, zones?)")
    p.add_argument("--out", default=d.out, help="output directory (report.json, map.html)")
    p.add_argument("--policy", default=d.policy,
                   help=f"the diffusion model's commit policy (default {d.policy}): threshold | "
                        "prefix | spaced | topk | entropy (clover.engine.policies)")
    p.add_argument("--tau", type=float, default=d.tau,
                   help=f"threshold / prefix policies: confidence threshold (default {d.tau})")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=d.max_tokens)
    p.add_argument("--max-turns", dest="max_turns", type=int, default=d.max_turns)
    add_grammar_flag(p)
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda")
    p.add_argument("--dtype", default=d.dtype,
                   help="auto (bf16 on CUDA and on CPUs with AVX-512 BF16 or AMX, else float32) "
                        "| float32 | bfloat16")
    p.add_argument("--regimes", nargs="+", default=list(d.regimes),
                   help="batch: every message at once; one-by-one: an agent's batch 1")
    p.add_argument("--no-map", dest="map", action="store_false", help="skip the map page")
    p.add_argument("--serve", action="store_true", help="serve the map page on 127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=_demo)


def _add_tasks(sub: argparse._SubParsersAction) -> None:
    try:
        from clover.tasks.airspace.cli import register
    except ImportError:
        return
    register(sub)


def _add_engine(sub: argparse._SubParsersAction) -> None:
    from clover.engine.cli import register

    register(sub)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    try:
        from clover.server.cli import register
    except ImportError:  # the `serve` extra (fastapi, uvicorn) is not installed
        return
    register(sub)


def _add_train(sub: argparse._SubParsersAction) -> None:
    from clover.tasks.airspace.train_cli import register

    register(sub)


def _add_convert(sub: argparse._SubParsersAction) -> None:
    from clover.checkpoint.cli import register

    register(sub)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from clover.bench.cli import register

    register(sub)


COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "inspect": _add_inspect,
    "demo": _add_demo,
    "tasks": _add_tasks,  # data / score
    "engine": _add_engine,  # generate / chat
    "serve": _add_serve,  # OpenAI-compatible HTTP server
    "train": _add_train,
    "bench": _add_bench,  # sweep dLLM vs AR: quality, speed, memory, plots, report
    "convert": _add_convert,  # foreign checkpoints in (HF, GGUF) and out (HF)
}


def build_parser() -> argparse.ArgumentParser:
    from clover import __version__

    parser = argparse.ArgumentParser(prog="clover", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"clover {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"clover {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
