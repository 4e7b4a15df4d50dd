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

    info = describe(resolve_config(args.model))
    print(json.dumps(info) if args.json else render_table(info))
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="parameters, active parameters, memory of a preset or model")
    p.add_argument("model", help="preset name (e.g. clover-35b-a3b) or model directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_inspect)


def _demo(args: argparse.Namespace) -> int:
    from clover.demo_core import run_core_demo

    return run_core_demo(args.out, preset=args.preset)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: build, save, reload and inspect a model")
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.add_argument("--preset", default="clover-tiny", help="preset to build")
    p.set_defaults(func=_demo)


def _add_tasks(sub: argparse._SubParsersAction) -> None:
    try:
        from clover.tasks.airspace.cli import register
    except ImportError:
        return
    register(sub)


COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "inspect": _add_inspect,
    "demo": _add_demo,
    "tasks": _add_tasks,  # data / score
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clover", description=__doc__.splitlines()[0])
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
