"""`clover data <task>` and `clover score <task>`: write a split as JSONL, score predictions.

`register(subparsers)` adds the two commands; each takes a positional task chosen from `TASKS`
(today only `airspace`), so another task plugs in by adding one entry. Handlers return an exit
status; user mistakes raise ValueError / FileNotFoundError for `clover.cli` to report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskCommands:
    """The two CLI hooks a task provides."""

    data: Callable[[argparse.Namespace], int]
    score: Callable[[argparse.Namespace], int]


def _airspace_data(args: argparse.Namespace) -> int:
    from clover.tasks.airspace.data import generate_examples, write_jsonl

    examples = generate_examples(args.split, args.n, args.seed)
    if args.format == "chat":
        records = [{"id": e.id, **e.chat()} for e in examples]
    else:
        records = [e.to_record() for e in examples]
    text = write_jsonl(records, args.out)
    if args.out is None:
        sys.stdout.write(text)
    else:
        print(f"wrote {len(records)} {args.split} examples to {args.out}", file=sys.stderr)
    return 0


def _read_jsonl(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        rows = []
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise ValueError(f"{path}: line {i} is not valid JSON") from None
    return rows


def _align(preds: list, truths: list) -> list:
    """Order predictions like the truths: by id when every prediction has a known id."""
    by_id = {p.get("id"): p for p in preds if isinstance(p, dict) and "id" in p}
    if len(by_id) == len(preds) and all(t.id in by_id for t in truths):
        return [by_id[t.id] for t in truths]
    return preds


def _airspace_score(args: argparse.Namespace) -> int:
    from clover.tasks.airspace.data import generate_examples, load_messages_jsonl
    from clover.tasks.airspace.scorer import score

    if args.truth:
        truths = load_messages_jsonl(args.truth)
    else:
        truths = generate_examples(args.split, args.n, args.seed)
    result = score(_align(_read_jsonl(args.pred), truths), truths)
    for key in (
        "num_messages",
        "zone_precision",
        "zone_recall",
        "zone_f1",
        "exact_message_accuracy",
        "tool_call_validity",
        "hallucinated_zones_on_negatives",
    ):
        value = result[key]
        print(f"{key:34s} {value:.4f}" if isinstance(value, float) else f"{key:34s} {value}")
    print("errors", " ".join(f"{k}={v}" for k, v in result["errors"].items() if v) or "none")
    print(json.dumps(result))
    return 0


TASKS: dict[str, TaskCommands] = {"airspace": TaskCommands(_airspace_data, _airspace_score)}


def _dispatch(kind: str) -> Callable[[argparse.Namespace], int]:
    return lambda args: getattr(TASKS[args.task], kind)(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `data` and `score` to the `clover` command line."""
    from clover.tasks.airspace.places import SPLITS

    p = subparsers.add_parser("data", help="generate task messages with ground truth (JSONL)")
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--n", type=int, default=20, help="number of examples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write to this file instead of stdout")
    p.add_argument(
        "--format",
        choices=("messages", "chat"),
        default="messages",
        help="messages: {id, text, zones}; chat: {id, messages, tools} (OpenAI)",
    )
    p.set_defaults(func=_dispatch("data"))

    s = subparsers.add_parser("score", help="score predictions (JSONL) against ground truth")
    s.add_argument("task", choices=sorted(TASKS))
    s.add_argument("pred", help="JSONL: {id, output | tool_calls | zones} per line")
    s.add_argument("--truth", default=None, help="JSONL with {id, text, zones}; default: a split")
    s.add_argument("--split", choices=SPLITS, default="test")
    s.add_argument("--n", type=int, default=20)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_dispatch("score"))
