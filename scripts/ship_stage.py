"""Ship a finished training stage into a shipped model directory (maintainers' tool).

    python scripts/ship_stage.py runs/smol-dl4 models/clover-smol --planned 150 \
        --command "OMP_NUM_THREADS=2 clover train ... (the exact command)" \
        test=runs/eval/test.json heldout=runs/eval/heldout.json ...

Copies the stage's adapter files (adapter weights and config, base.json, config.json, tokenizer)
over the model's, appends the stage's training.json to the model's `stages`, adds the command,
updates the task example / token / wall-time totals and `stopped_early`, and replaces
`evaluation` with the given `clover eval airspace` results (each file's last line is the summary
JSON; `bash scripts/evaluate_stage.sh` writes them and applies the shipping rule first), keeping
the old one as `previous_evaluation`. Then regenerate the shipped-model record
(`python tests/test_shipped_models.py NAME`) and rewrite the model's README tables by hand.

A stage that was not shipped but that a later stage trains on (`--init-adapter` from its output)
goes in first with `--ancestor "why it was not shipped"` and no evaluations: its record, command
and totals are added, the model's files and evaluation are left as they are.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", type=Path, help="the stage's output directory (clover train --out)")
    p.add_argument("model", type=Path, help="the shipped model directory to update")
    p.add_argument("--planned", type=int, required=True, help="the stage's planned steps")
    p.add_argument("--command", required=True, help="the exact training command")
    p.add_argument("--ancestor", metavar="WHY", help="an unshipped stage a later one builds on")
    p.add_argument("evals", nargs="*", metavar="TAG=PATH", help="clover eval airspace outputs")
    args = p.parse_intermixed_args()  # TAG=PATH items may follow the options
    if bool(args.evals) == bool(args.ancestor):
        p.error("give evaluations (TAG=PATH ...) for a shipped stage, or --ancestor WHY alone")
    evals = {}
    for item in args.evals:
        tag, _, path = item.partition("=")
        evals[tag] = json.loads(Path(path).read_text().strip().splitlines()[-1])
    record = json.loads((args.model / "training.json").read_text())
    stage = json.loads((args.stage / "training.json").read_text())
    for f in args.stage.iterdir():
        if f.name != "training.json" and not args.ancestor:
            shutil.copy2(f, args.model / f.name)
    stage["planned_steps"] = args.planned
    if args.ancestor:
        stage["shipped"] = False
        stage["not_shipped_because"] = args.ancestor
    record["stages"].append(stage)
    record["commands"].append(args.command)
    record["task_examples"] += stage["examples_seen"]
    record["task_tokens"] += stage["tokens_seen"]
    record["wall_time_s"] = round(record["wall_time_s"] + stage["wall_time_s"], 1)
    record["stopped_early"] = None if stage["steps"] >= args.planned else {
        "planned_steps": args.planned, "steps": stage["steps"],
        "why": "session time; the checkpoint at the last finished step was exported"}
    if not args.ancestor:
        record["previous_evaluation"] = record.get("evaluation")
        record["evaluation"] = evals
    (args.model / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({tag: (e["zone_f1"], e["tool_call_validity"], e["tpf"])
                      for tag, e in evals.items()}))


if __name__ == "__main__":
    main()
