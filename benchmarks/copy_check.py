"""Copy check: does a trained airspace model copy from the message? Teacher-forced, no decoding.

For a model (or training checkpoint) directory, runs one forward per validation example with the
gold answer in place and reports the share of answer tokens predicted right (argmax), over all
tokens and over digit tokens (coordinates, radii and times are digits), then the same on the
repeat task (`clover.tasks.airspace.recipes.copy_task`: repeat the start of the message),
broken down by position in the copy. A model that copies gets digits right; one that guesses
gets the digits a format makes likely. Prompts are rendered with the model's own chat template.
Prints a table, then one JSON line. Takes seconds, so it can follow a training run checkpoint by
checkpoint.

    python benchmarks/copy_check.py MODEL_DIR [MODEL_DIR ...] [--n 48]
"""

from __future__ import annotations

import argparse
import json

import torch
from rich.console import Console
from rich.table import Table

from clover import checkpoint
from clover.tasks.airspace import generate_examples
from clover.tasks.airspace.recipes import airspace_sft, copy_task

POSITIONS = (0, 1, 2, 5, 10, 30, 60)


@torch.no_grad()
def answer_hits(model, examples) -> list[torch.Tensor]:
    """Per example, a bool per answer token: is the argmax at the position before it that token?"""
    hits = []
    for ex in examples:
        ids = torch.tensor([list(ex.ids)])
        logits = model(ids).logits.view(1, ids.shape[1], -1)[0, ex.prompt_len - 1:-1]
        hits.append(logits.argmax(-1) == ids[0, ex.prompt_len:])
    return hits


def check(path: str, n: int) -> dict:
    model, tok = checkpoint.load(path)
    model.eval()
    if model.config.attention != "causal":
        raise SystemExit(f"{path}: {model.config.attention} attention; teacher forcing needs a "
                         "causal model (the AR twin, or its checkpoints)")
    examples = generate_examples("validation", n, seed=0)
    digit = torch.tensor([tok.decode([i]).strip().isdigit() for i in range(len(tok))])
    task = airspace_sft(tok, examples)
    hits = answer_hits(model, task)
    all_hits = torch.cat(hits)
    digits = torch.cat([digit[torch.tensor(ex.ids[ex.prompt_len:])] for ex in task])
    copy_hits = answer_hits(model, copy_task(tok, examples))
    by_pos = {p: [h[p].item() for h in copy_hits if len(h) > p] for p in POSITIONS}
    return {"model": path, "examples": n, "answer_acc": round(all_hits.float().mean().item(), 4),
            "digit_acc": round(all_hits[digits].float().mean().item(), 4),
            "digit_tokens": int(digits.sum()),
            "copy_acc": round(torch.cat(copy_hits).float().mean().item(), 4),
            "copy_acc_by_position": {p: round(sum(v) / len(v), 3) for p, v in by_pos.items() if v}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="model or checkpoint directories")
    ap.add_argument("--n", type=int, default=48, help="validation examples")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = [check(m, args.n) for m in args.models]
    table = Table(title=f"teacher-forced copy check, {args.n} validation examples")
    for col in ("model", "answer acc", "digit acc", "repeat-task acc",
                *(f"repeat @{p}" for p in POSITIONS)):
        table.add_column(col, justify="right")
    for r in results:
        pos = r["copy_acc_by_position"]
        table.add_row(r["model"], f"{r['answer_acc']:.3f}", f"{r['digit_acc']:.3f}",
                      f"{r['copy_acc']:.3f}",
                      *(f"{pos.get(p, float('nan')):.2f}" for p in POSITIONS))
    Console(width=160).print(table)
    print(json.dumps({"bench": "copy_check", "results": results}))


if __name__ == "__main__":
    main()
