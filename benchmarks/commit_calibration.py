"""Commit calibration of block-diffusion airspace models, teacher-forced on gold replies.

For each model: accuracy of its proposals by distance from the decoding frontier (d = 0 is the
next token), reliability of the parallel (d >= 1) proposals by confidence, and the prefix policy
replayed at each tau (TPF and wrong commits with the gold prefix in place of the model's own: a
ceiling on what that policy can keep). The method is in `clover/bench/calibration.py`. Replies are
formatted as the airspace-smol recipe trains them (chat template, tools, tool calls).

    python benchmarks/commit_calibration.py --models models/clover-smol [DIR ...] \
        [--split validation] [--n 40] [--taus 1.0,0.99,0.95,0.9,0.7,0.5] [--threads 2]

Prints a table per model, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from clover import checkpoint
from clover.bench.calibration import by_distance, probe, reliability, replay_prefix
from clover.bench.cli import comma_list
from clover.tasks.airspace.data import generate_examples
from clover.tasks.airspace.smol import smol_sft
from clover.train import default_collator


def measure(path: str, args: argparse.Namespace) -> dict:
    model, tokenizer = checkpoint.load(path, dtype=getattr(torch, args.dtype))
    model.eval()
    examples = smol_sft(tokenizer, generate_examples(args.split, args.n, seed=args.seed))
    t0 = time.perf_counter()
    p = probe(model, examples, default_collator(model.config), args.batch_size)
    return {"model": path, "split": args.split, "n": args.n, "records": len(p.conf),
            "probe_s": round(time.perf_counter() - t0, 1), "by_distance": by_distance(p),
            "reliability": reliability(p), "prefix": [replay_prefix(p, t) for t in args.taus]}


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(r: dict) -> str:
    lines = [f"## {r['model']} ({r['split']}, {r['n']} replies, {r['records']} proposals, "
             f"{r['probe_s']} s)", "", "| distance | n | accuracy | mean conf |",
             "|---|---|---|---|"]
    lines += [f"| {d['dist']} | {d['n']} | {_f(d['accuracy'])} | {_f(d['mean_conf'])} |"
              for d in r["by_distance"]]
    lines += ["", "| confidence (d >= 1) | n | accuracy | mean conf |", "|---|---|---|---|"]
    lines += [f"| {b['bin']} | {b['n']} | {_f(b['accuracy'])} | {_f(b['mean_conf'])} |"
              for b in r["reliability"]]
    lines += ["", "| prefix tau | TPF | wrong commits | replies all right |", "|---|---|---|---|"]
    lines += [f"| {x['tau']} | {x['tpf']:.2f} | {x['wrong_share']:.4f} | "
              f"{x['replies_all_right']:.3f} |" for x in r["prefix"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="block-diffusion model directories")
    p.add_argument("--split", default="validation",
                   choices=["train", "validation", "test", "heldout"])
    p.add_argument("--n", type=int, default=40, help="replies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--taus", type=comma_list(float), default=(1.0, 0.99, 0.95, 0.9, 0.7, 0.5))
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = [measure(path, args) for path in args.models]
    for r in results:
        print(render(r))
    print(json.dumps({"benchmark": "commit_calibration", "results": results}))


if __name__ == "__main__":
    main()
