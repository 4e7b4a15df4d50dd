"""Self-speculative decoding of the airspace task: the AR twin's weights on committed tokens and the
block-diffusion adapter's weights on masked ones, in one forward (after Set Block Decoding, Gat et
al. 2025, and self-speculative decoding).

Each forward runs two kinds of rows over one KV cache:
- **clean rows** (tokens already written, and last forward's drafts) through the AR twin
  (`--ar`), causally: they see only earlier clean tokens, never a mask, so their logits are the
  twin's next-token predictions, exactly as in plain AR decoding;
- **mask rows** (the rest of the current block) through the diffusion model (`--draft`), which
  see every clean token and each other, as in block diffusion, and draft the block's later tokens
  (shifted prediction: position q from row q - 1).
A draft is kept only if the next forward's clean rows predict the same token at its position
(greedy verification); at the first mismatch the twin's own token is taken instead and the rest
is dropped. So the output is the twin's greedy output, token for token (up to floating-point
ties), and every forward commits at least one token: the quality is the twin's, and the drafts
decide the speed (TPF: tokens per forward, the prefill's first token included, as the engine
counts it for AR).

This is a measurement (batch 1, plain Python loop, both weight sets applied per row), not the
engine: it answers how many tokens per forward the diffusion adapter's drafts are worth when the
AR path checks them.

    python benchmarks/self_speculative.py --ar models/clover-smol-ar --draft models/clover-smol \
        [--split validation] [--n 40] [--tau 0.0] [--against runs/eval/TWIN.jsonl] \
        [--out runs/eval/spec.jsonl] [--dtype float32] [--threads 2]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch

from clover.engine.speculative import SelfSpeculative, load_pair
from clover.tasks.airspace.agent import initial_conversation
from clover.tasks.airspace.data import ANSWER_MAX_TOKENS, split_examples
from clover.tasks.airspace.scorer import score
from clover.tasks.airspace.tools import TOOLS
from clover.tokenizer import render_chat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ar", default="models/clover-smol-ar")
    p.add_argument("--draft", default="models/clover-smol")
    p.add_argument("--split", default="validation")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tau", type=float, default=0.0, help="draft only while confidence >= tau")
    p.add_argument("--max-tokens", type=int, default=768)
    p.add_argument("--against", help="the twin's eval outputs (JSONL) on the same messages")
    p.add_argument("--out", help="write the outputs as JSONL (the eval's format)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pair, tok = load_pair(args.ar, args.draft, dtype=getattr(torch, args.dtype))
    dec = SelfSpeculative(pair, args.tau)
    max_tokens = min(args.max_tokens, ANSWER_MAX_TOKENS)
    examples = split_examples(args.split, args.n, args.seed)
    rows, t0 = [], time.perf_counter()
    for i, e in enumerate(examples):
        prompt = tok.encode(render_chat(tok, initial_conversation(e), tools=TOOLS,
                                        fixed_task_prompt=True))
        res = dec.generate(prompt, max_tokens, {tok.eos_token_id})
        ids = res.ids[:-1] if res.ids and res.ids[-1] == tok.eos_token_id else res.ids
        rows.append({"output": tok.decode(ids, skip_special_tokens=False), "res": res})
        print(f"{i + 1}/{len(examples)} tokens {len(res.ids)} forwards {res.forwards} "
              f"TPF {res.tpf:.2f}", flush=True)
    wall = time.perf_counter() - t0
    preds = [{"output": r["output"]} for r in rows]
    s = score(preds, examples)
    tokens = sum(len(r["res"].ids) for r in rows)
    forwards = sum(r["res"].forwards for r in rows)
    acc = Counter()
    for r in rows:
        acc.update(r["res"].accepted_at)
    result = {"benchmark": "self_speculative", "ar": args.ar, "draft": args.draft,
              "split": args.split, "n": args.n, "tau": args.tau, "dtype": args.dtype,
              "zone_f1": round(s["zone_f1"], 4), "validity": round(s["tool_call_validity"], 4),
              "exact": round(s["exact_message_accuracy"], 4), "tokens": tokens,
              "forwards": forwards, "tpf": round(tokens / forwards, 3),
              "drafted": sum(r["res"].drafted for r in rows),
              "accepted_by_distance": {int(k): v for k, v in sorted(acc.items())},
              "wall_s": round(wall, 1)}
    if args.against:
        twin = [json.loads(line)["output"] for line in open(args.against, encoding="utf-8")]
        same = sum(a["output"] == b for a, b in zip(preds, twin, strict=False))
        result["same_as_twin"] = f"{same}/{min(len(twin), len(preds))}"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for e, pr in zip(examples, preds, strict=True):
                f.write(json.dumps({"id": e.id, **pr}, ensure_ascii=False) + "\n")
    print(f"\n| zone F1 | validity | exact | tokens | forwards | TPF | same as twin | s |\n"
          f"|---|---|---|---|---|---|---|---|\n| {result['zone_f1']:.3f} | "
          f"{result['validity']:.3f} | {result['exact']:.3f} | {tokens} | {forwards} | "
          f"{result['tpf']:.2f} | {result.get('same_as_twin', '-')} | {wall:.0f} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
