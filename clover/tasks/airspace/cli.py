"""`clover data|score|eval <task>`: write a split as JSONL, score predictions, decode and score.

`register(subparsers)` adds the three commands; each takes a positional task chosen from `TASKS`
(today only `airspace`), so another task plugs in by adding one entry. Handlers return an exit
status; user mistakes raise ValueError / FileNotFoundError for `clover.cli` to report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

from clover.tasks.airspace.data import ANSWER_MAX_TOKENS


@dataclass(frozen=True)
class TaskCommands:
    """The two CLI hooks a task provides."""

    data: Callable[[argparse.Namespace], int]
    score: Callable[[argparse.Namespace], int]
    evaluate: Callable[[argparse.Namespace], int]


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


SUMMARY_KEYS = ("num_messages", "zone_precision", "zone_recall", "zone_f1", "field_accuracy",
                "exact_message_accuracy", "tool_call_validity", "hallucinated_zones_on_negatives")


def _print_summary(result: dict) -> None:
    for key in SUMMARY_KEYS:
        value, ci = result[key], result.get(f"{key}_ci95")
        line = f"{key:34s} {value:.4f}" if isinstance(value, float) else f"{key:34s} {value}"
        print(line + (f"  (95% interval {ci[0]:.4f}-{ci[1]:.4f})" if ci else ""))


def _intervals(preds: list, truths: list, resamples: int) -> dict:
    """{metric}_ci95 for each of stats.METRICS: message-level bootstrap, seed 0."""
    from clover.tasks.airspace.stats import METRICS, interval, message_counts

    if resamples == 0 or not truths:
        return {}
    counts = message_counts(preds, truths)
    return {f"{m}_ci95": interval(counts, m, resamples).as_list() for m in METRICS}


def _compare(args: argparse.Namespace, preds: list, truths: list) -> dict:
    """Paired bootstrap of `pred` (A) against `--against` (B) on the same messages."""
    from clover.tasks.airspace.stats import DEFAULT_RESAMPLES, METRICS, compare, message_counts

    resamples = args.resamples or DEFAULT_RESAMPLES  # 0 turns off intervals, not the comparison
    other = _align(_read_jsonl(args.against), truths)
    counts_a, counts_b = message_counts(preds, truths), message_counts(other, truths)
    rows = [compare(counts_a, counts_b, m, resamples) for m in METRICS]
    print(f"A {args.pred}  B {args.against}  ({len(truths)} messages, "
          f"{resamples} paired resamples)")
    print(f"{'metric':26s} {'A':>7s} {'B':>7s} {'A - B':>8s}  {'95% interval':>18s}  A above B")
    for r in rows:
        lo, hi = r.difference.as_list()
        print(f"{r.metric:26s} {r.a:7.4f} {r.b:7.4f} {r.difference.value:+8.4f}  "
              f"[{lo:+.4f}, {hi:+.4f}]  {100 * r.share_a_better:5.1f}%")
    return {"against": args.against, "resamples": resamples,
            "comparisons": [r.as_dict() for r in rows]}


def _airspace_score(args: argparse.Namespace) -> int:
    from clover.tasks.airspace.data import load_messages_jsonl, split_examples
    from clover.tasks.airspace.scorer import score

    if args.truth:
        truths = load_messages_jsonl(args.truth)
    else:
        truths = split_examples(args.split, args.n, args.seed)
    preds = _align(_read_jsonl(args.pred), truths)
    result = score(preds, truths) | _intervals(preds, truths, args.resamples)
    _print_summary(result)
    print("errors", " ".join(f"{k}={v}" for k, v in result["errors"].items() if v) or "none")
    if args.against:
        result["comparison"] = _compare(args, preds, truths)
    print(json.dumps(result))
    return 0


def _airspace_evaluate(args: argparse.Namespace) -> int:
    """Decode a split with a model through the agent loop, score it, break it down by format."""
    from clover.engine import LLM, SamplingParams
    from clover.tasks.airspace.agent import predictions, run_agent
    from clover.tasks.airspace.contract import tool_constraint
    from clover.tasks.airspace.data import load_messages_jsonl, split_examples
    from clover.tasks.airspace.scorer import score

    examples = (load_messages_jsonl(args.messages)[:args.n] if args.messages
                else split_examples(args.split, args.n, args.seed))
    from clover.bench.quant import cli_dtype

    llm = LLM(args.model, device=args.device, dtype=cli_dtype(args.dtype, args.device),
              max_batch_size=args.batch_size, draft=args.draft)
    params = SamplingParams(policy=args.policy, tau=args.tau, gamma=args.gamma,
                            max_tokens=args.max_tokens,
                            structured=tool_constraint() if args.grammar else None)
    run = run_agent(llm, examples, params, max_turns=args.max_turns)
    preds = predictions(run)
    result = {k: score(preds, examples)[k] for k in (*SUMMARY_KEYS, "errors")}
    result |= _intervals(preds, examples, args.resamples)
    result["by_format"] = {}
    for kind in sorted({e.kind.split("+")[0] for e in examples}):
        idx = [i for i, e in enumerate(examples) if e.kind.split("+")[0] == kind]
        part = score([preds[i] for i in idx], [examples[i] for i in idx])
        result["by_format"][kind] = {"n": len(idx), "zone_f1": round(part["zone_f1"], 4),
                                     "fields": round(part["field_accuracy"], 4),
                                     "exact": round(part["exact_message_accuracy"], 4)}
    result.update(model=args.model, draft=args.draft, split=args.messages or args.split,
                  seed=args.seed,
                  policy=args.policy, tau=args.tau, gamma=args.gamma, grammar=args.grammar,
                  grammar_s=run.engine_stats["grammar_s"], model_s=run.engine_stats["model_s"],
                  full_task_s=round(run.full_task_s, 1),
                  tps=round(run.tps, 1), tpf=round(run.tpf, 3), forwards=run.forwards,
                  **{k: run.engine_stats[k] for k in ("draft_tokens", "accepted_tokens",
                                                      "acceptance_rate") if k in run.engine_stats})
    _print_summary(result)
    for kind, part in result["by_format"].items():
        print(f"  {kind:32s} n={part['n']:4d} zone_f1={part['zone_f1']:.4f} "
              f"fields={part['fields']:.4f} exact={part['exact']:.4f}")
    accepted = (f", drafts accepted {result['accepted_tokens']}/{result['draft_tokens']}"
                if "draft_tokens" in result else "")
    print(f"time {run.full_task_s:.1f} s, TPS {run.tps:.1f}, TPF {run.tpf:.3f}, "
          f"{run.forwards} forwards{accepted}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for e, p in zip(examples, preds, strict=True):
                f.write(json.dumps({"id": e.id, **p}, ensure_ascii=False) + "\n")
    print(json.dumps(result))
    return 0


TASKS: dict[str, TaskCommands] = {
    "airspace": TaskCommands(_airspace_data, _airspace_score, _airspace_evaluate)}


def _dispatch(kind: str) -> Callable[[argparse.Namespace], int]:
    return lambda args: getattr(TASKS[args.task], kind)(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `data`, `score` and `eval` to the `clover` command line."""
    from clover.tasks.airspace.data import EVAL_SPLITS
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
    s.add_argument("--split", choices=EVAL_SPLITS, default="test")
    s.add_argument("--n", type=int, default=20)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--against", default=None, metavar="PRED_B",
                   help="a second run's JSONL on the same messages: paired bootstrap of A - B")
    _add_resamples(s)
    s.set_defaults(func=_dispatch("score"))

    _add_eval(subparsers)


def _add_eval(subparsers: argparse._SubParsersAction) -> None:
    from clover.tasks.airspace.contract import add_grammar_flag
    from clover.tasks.airspace.data import EVAL_SPLITS

    e = subparsers.add_parser("eval", help="decode a split with a model and score it")
    e.add_argument("task", choices=sorted(TASKS))
    e.add_argument("--model", required=True, help="model directory")
    e.add_argument("--draft", default=None,
                   help="a drafter adapter (e.g. models/clover-smol-draft): self-speculative "
                        "decoding, --model (the AR twin) checking its drafts; greedy, the "
                        "model's own answers (policy, tau and --grammar do not apply)")
    e.add_argument("--split", choices=EVAL_SPLITS, default="test",
                   help="a generated split, or real-dev: the hand-labelled real messages")
    e.add_argument("--n", type=int, default=500, help="number of examples")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--messages", default=None, help="JSONL {id, text, zones} instead of a split")
    e.add_argument("--policy", default="threshold",
                   help="threshold (--tau) | prefix (--tau, left to right) | spaced (--tau, "
                        "never two neighbours in one step) | topk | entropy (--gamma): "
                        "clover.engine.policies")
    e.add_argument("--tau", type=float, default=0.9)
    e.add_argument("--gamma", type=float, default=0.5,
                   help="entropy policy: summed-entropy budget per step (nats)")
    e.add_argument("--max-tokens", dest="max_tokens", type=int, default=ANSWER_MAX_TOKENS,
                   help=f"per turn (default {ANSWER_MAX_TOKENS}: the longest gold answer fits)")
    e.add_argument("--max-turns", dest="max_turns", type=int, default=2)
    add_grammar_flag(e)
    e.add_argument("--batch-size", dest="batch_size", type=int, default=32)
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto",
                   help="auto (bf16 on CUDA and on CPUs with AVX-512 BF16 or AMX, else float32) "
                        "| float32 | bfloat16 | int8")
    e.add_argument("--out", default=None, help="write the predictions (JSONL) here")
    _add_resamples(e)
    e.set_defaults(func=_dispatch("evaluate"))


def _add_resamples(p: argparse.ArgumentParser) -> None:
    from clover.tasks.airspace.stats import DEFAULT_RESAMPLES

    p.add_argument("--resamples", type=_resamples, default=DEFAULT_RESAMPLES,
                   help="message-level bootstrap resamples for the 95%% intervals "
                        f"(default {DEFAULT_RESAMPLES}; 0: no intervals)")


def _resamples(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value
