"""Grammar benchmark: the airspace test split as chat with tools, with and without the grammar.

For each threshold tau, decodes every test prompt twice (free, and constrained) and reports
validity, parse errors, zone F1,
TPF (per request: tokens over the forwards it took part in; the batch-level figure beside it)
and where the time went (model / policy / grammar / other, from `Engine.stats`). With
`--model DIR` it loads a trained model directory; if DIR is missing it falls back to a random
`tiny` model (with clover-tiny's vocabulary and block size) and a tokenizer trained in-process,
which measures the grammar's cost only: quality numbers from random weights mean nothing.
Prints a table, then one JSON line.

Two tasks (`--task`):
- `tools`: chat with tools; the constraint is the tool-call grammar. Validity is the scorer's
  tool-call validity; parse errors come from `parse_tool_calls`.
- `extract`: the same prompts with `json_schema` set to {"zones": [set_no_fly_zone arguments]}
  (the strict argument schema). Valid = the whole output is JSON that matches the schema and
  every zone passes the scorer's `interpret_call`; zone F1 scores the zones as calls. The
  shipped models were trained to write tool calls, not this object, so free-running outputs are
  rarely valid here: this task measures what the constraint costs on a JSON-schema workload.

    python benchmarks/grammar_bench.py [--model models/clover-smol] [--n 20] [--tau 0.5 0.7 0.9]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jsonschema
import torch
from rich.console import Console
from rich.table import Table

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.engine.llm import EngineStats
from clover.model import build_model
from clover.tasks.airspace import (
    ANSWER_MAX_TOKENS,
    SYSTEM_PROMPT,
    TOOLS,
    assistant_text,
    generate_examples,
    score,
)
from clover.tasks.airspace.contract import strict_tools
from clover.tasks.airspace.tools import interpret_call
from clover.tokenizer import parse_tool_calls, train_tokenizer


def load_llm(model: str | None, device: str) -> tuple[LLM, str]:
    if model and Path(model).is_dir():
        return LLM(model, device=device), model
    train = generate_examples("train", 400, seed=1)
    texts = [e.text for e in train] + [assistant_text(e.calls) for e in train]
    tok = train_tokenizer(texts + [SYSTEM_PROMPT, json.dumps(TOOLS)], vocab_size=2048)
    cfg = get_preset("tiny", vocab_size=2048, max_seq_len=2048, block_size=32)
    return LLM(build_model(cfg, seed=0), tokenizer=tok, device=device), "tiny (random weights)"


def extraction_schema() -> dict:
    """The `extract` task's JSON Schema: every zone of the message, as strict call arguments."""
    zone = next(t for t in strict_tools() if t["function"]["name"] == "set_no_fly_zone")
    return {"type": "object", "additionalProperties": False, "required": ["zones"],
            "properties": {"zones": {"type": "array", "maxItems": 8,
                                     "items": zone["function"]["parameters"]}}}


def read_extraction(text: str, validator) -> tuple[list[dict], bool]:
    """Output of the `extract` task -> (calls for the scorer, whether it is fully valid)."""
    try:
        obj = json.loads(text)
        validator.validate(obj)
        calls = [{"name": "set_no_fly_zone", "arguments": z} for z in obj["zones"]]
        for call in calls:
            interpret_call(call["name"], call["arguments"])
        return calls, True
    except (ValueError, jsonschema.ValidationError):
        return [], False


def run(llm: LLM, examples, params: SamplingParams, task: str = "tools") -> dict:
    convs = [e.messages(tools=True)[:-1] for e in examples]  # drop the gold assistant turn
    llm.engine.stats = EngineStats()
    t0 = time.perf_counter()
    outs = llm.chat(convs, params, tools=TOOLS)
    wall = time.perf_counter() - t0
    stats = llm.engine.stats.as_dict()
    if task == "extract":
        validator = jsonschema.Draft202012Validator(extraction_schema())
        read = [read_extraction(o.text, validator) for o in outs]
        s = score([calls for calls, _ in read], examples)
        valid, parse_errors = sum(ok for _, ok in read), sum(not ok for _, ok in read)
        validity = valid / max(len(outs), 1)
    else:
        s = score([o.text for o in outs], examples)
        parse_errors = sum(len(parse_tool_calls(o.text).errors) for o in outs)
        validity = s["tool_call_validity"]
    spent = stats["model_s"] + stats["policy_s"] + stats["grammar_s"] + stats["other_s"]
    # per request (tokens / forwards it took part in), the dLLM literature's TPF; "batch_tpf" counts
    # one batched forward once, so it also moves with how requests overlap in the batch
    request_tpf = (sum(o.stats.generated_tokens for o in outs)
                   / max(sum(o.stats.forwards for o in outs), 1))
    return {"tpf": round(request_tpf, 4), "batch_tpf": stats["tpf"], "forwards": stats["forwards"],
            "tokens": stats["generated_tokens"], "wall_s": round(wall, 3),
            "model_s": stats["model_s"], "policy_s": stats["policy_s"],
            "grammar_s": stats["grammar_s"], "other_s": stats["other_s"],
            "grammar_share": round(stats["grammar_s"] / spent, 4) if spent else 0.0,
            "grammar_ms_per_step": round(1000 * stats["grammar_s"] / max(stats["steps"], 1), 3),
            "validity": round(validity, 4),
            "num_calls": s["num_calls"], "num_invalid_calls": s["num_invalid_calls"],
            "parse_errors": parse_errors, "zone_f1": round(s["zone_f1"], 4),
            "finished_stop": sum(o.finish_reason in ("stop", "tool_calls") for o in outs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/clover-smol",
                    help="trained model directory (falls back to random weights if missing)")
    ap.add_argument("--n", type=int, default=20, help="test-split examples")
    ap.add_argument("--tau", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    ap.add_argument("--task", default="both", choices=["tools", "extract", "both"])
    ap.add_argument("--tool-choice", default="auto", choices=["auto", "required"])
    ap.add_argument("--schemas", default="strict", choices=["strict", "shown"],
                    help="strict: the argument contract (clover.tasks.airspace.contract), so "
                         "every call is valid; shown: the plain schemas the model is shown")
    ap.add_argument("--max-tokens", type=int, default=ANSWER_MAX_TOKENS)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm, name = load_llm(args.model, args.device)
    examples = generate_examples("test", args.n)
    tools = strict_tools() if args.schemas == "strict" else TOOLS
    constraints = {"tools": {"tools": tools, "tool_choice": args.tool_choice},
                   "extract": {"json_schema": extraction_schema()}}
    tasks = list(constraints) if args.task == "both" else [args.task]
    for warm in (None, *(constraints[t] for t in tasks)):  # warm-up; grammars compile once
        run(llm, examples, SamplingParams(max_tokens=32, structured=warm))
    results = []
    runs = [(task, tau, grammar) for task in tasks for tau in args.tau for grammar in (False, True)]
    for k, (task, tau, grammar) in enumerate(runs, 1):
        params = SamplingParams(max_tokens=args.max_tokens, policy="threshold", tau=tau,
                                structured=constraints[task] if grammar else None)
        results.append({"task": task, "tau": tau, "grammar": grammar,
                        **run(llm, examples, params, task)})
        # progress on stderr, one line per run (a constrained extraction row can take minutes)
        r = results[-1]
        print(f"[{k}/{len(runs)}] {task} tau {tau} grammar {'yes' if grammar else 'no'}: "
              f"validity {r['validity']:.0%}, TPF {r['tpf']:.2f}, {r['wall_s']:.1f} s",
              file=sys.stderr, flush=True)
    _print(results, name)
    print(json.dumps({"bench": "grammar", "hardware": platform.processor() or platform.machine(),
                      "threads": torch.get_num_threads(),
                      "device": str(llm.engine.runner.device), "model": name,
                      "examples": args.n, "split": "test", "tool_choice": args.tool_choice,
                      "schemas": args.schemas,
                      "max_tokens": args.max_tokens, "results": results}))


def _print(results: list[dict], name: str) -> None:
    table = Table(title=f"grammar benchmark: airspace test split, {name}")
    for col in ("task", "tau", "grammar", "valid", "calls", "parse err", "zone F1", "TPF",
                "batch TPF", "done", "wall s", "model s", "policy s", "grammar s",
                "grammar ms/step", "grammar share"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["task"], f"{r['tau']:.1f}", "yes" if r["grammar"] else "no",
                      f"{100 * r['validity']:.0f}%", str(r["num_calls"]),
                      str(r["parse_errors"]), f"{r['zone_f1']:.3f}", f"{r['tpf']:.2f}",
                      f"{r['batch_tpf']:.2f}",
                      str(r["finished_stop"]), f"{r['wall_s']:.2f}", f"{r['model_s']:.2f}",
                      f"{r['policy_s']:.2f}", f"{r['grammar_s']:.3f}",
                      f"{r['grammar_ms_per_step']:.2f}",
                      f"{100 * r['grammar_share']:.1f}%")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
