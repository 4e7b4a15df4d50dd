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

This is a measurement (a plain Python loop over `clover.engine.speculative`; the
drafter's weights as a low-rank difference on the mask rows; the engine's fused and prepacked
linears, `fuse_pair`, unless --reference or int8), not the engine: it answers how many
tokens per forward the diffusion adapter's drafts are worth when the AR path checks them, and
what that buys against the same loop without drafts.

    python benchmarks/self_speculative.py [--ar models/clover-smol-ar] \
        [--draft models/clover-smol-draft] [--split validation] [--n 40] [--tau 0.0] \
        [--against runs/eval/TWIN.jsonl] [--out runs/eval/spec.jsonl] [--dtype float32] \
        [--threads 2] [--no-baseline] [--full-weights] [--reference] [--max-drafts block,3] \
        [--batch 1] [--forward-rows 1+0,1+7]

Runs the self-speculative decode (once per draft cap), then (unless --no-baseline) the AR
baseline through the same loop without drafts (one token per forward, the same outputs expected),
and prints each with its speed-up over the baseline, then one JSON line. Batch 1 by default, one
message after another: the agent's regime; `--batch N` decodes N messages together (a forward a
step over every unfinished one: `SelfSpeculative.generate_batch`). `--forward-rows` instead
times single forwards of given row counts (clean rows to check + mask rows) after the first
message's prompt: a forward's cost by rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

import torch

from clover.bench.quant import activation_dtype, quantize_int8
from clover.engine.speculative import SelfSpeculative, fuse_pair, load_pair
from clover.model.transformer import KVCache
from clover.tasks.airspace.agent import initial_conversation
from clover.tasks.airspace.data import ANSWER_MAX_TOKENS, split_examples
from clover.tasks.airspace.scorer import score
from clover.tasks.airspace.tools import TOOLS
from clover.tokenizer import render_chat


def run(dec: SelfSpeculative, prompts: list[list[int]], tok, max_tokens: int,
        label: str, batch: int = 1) -> tuple[list[dict], float]:
    """Decode every prompt, `batch` at a time (`generate_batch`); (rows with output text and
    result, seconds). A row's `batch_forwards` is set on the first row of each batch: the
    forwards the batch ran (its longest row's)."""
    rows, t0 = [], time.perf_counter()
    for at in range(0, len(prompts), batch):
        results = dec.generate_batch(prompts[at:at + batch], max_tokens, {tok.eos_token_id})
        for i, res in enumerate(results, start=at):
            ids = res.ids[:-1] if res.ids and res.ids[-1] == tok.eos_token_id else res.ids
            rows.append({"output": tok.decode(ids, skip_special_tokens=False), "res": res,
                         "batch_forwards": max(r.forwards for r in results) if i == at else 0})
            print(f"{label} {i + 1}/{len(prompts)} tokens {len(res.ids)} forwards "
                  f"{res.forwards} TPF {res.tpf:.2f}", flush=True)
    return rows, time.perf_counter() - t0


def summary(rows: list[dict], seconds: float, examples: list) -> dict:
    s = score([{"output": r["output"]} for r in rows], examples)
    tokens = sum(len(r["res"].ids) for r in rows)
    forwards = sum(r["res"].forwards for r in rows)
    acc = Counter()
    for r in rows:
        acc.update(r["res"].accepted_at)
    return {"zone_f1": round(s["zone_f1"], 4), "validity": round(s["tool_call_validity"], 4),
            "exact": round(s["exact_message_accuracy"], 4), "tokens": tokens,
            "forwards": forwards, "tpf": round(tokens / forwards, 3),
            "batch_forwards": sum(r["batch_forwards"] for r in rows),
            "drafted": sum(r["res"].drafted for r in rows),
            "accepted_by_place": {int(k): v for k, v in sorted(acc.items())},
            "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1)}


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an int >= 1")
    return int(text)


def caps(text: str) -> list[int | None]:
    """`--max-drafts`: comma-separated draft caps, `block` for none (drafts to the block's end)."""
    out = []
    for item in text.split(","):
        if item.strip() == "block":
            out.append(None)
        elif item.strip().isdigit() and int(item) >= 1:
            out.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"{item!r}: a draft cap is `block` or an int >= 1")
    return out


def row_shapes(text: str) -> list[tuple[int, int]]:
    """`--forward-rows`: comma-separated CLEAN+MASK row counts, e.g. `1+0,1+7`."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("+")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: rows are CLEAN+MASK, CLEAN >= 1")
        out.append((int(parts[0]), int(parts[1])))
    return out


def forward_costs(dec: SelfSpeculative, prompt: list[int], shapes: list[tuple[int, int]],
                  repeats: int = 7) -> dict[str, float]:
    """Median ms of one forward of each (clean, mask) row shape after `prompt` is cached; the
    shapes take turns within each repeat (machine noise hits all), one warm-up round first."""
    model = dec.pair.model
    device = next(model.parameters()).device
    cache = KVCache(model.config, 1, len(prompt) + 64, device, model.embed.weight.dtype)
    dec.forward(cache, prompt, 0)
    times: dict[str, list[float]] = {f"{c}+{m}": [] for c, m in shapes}
    for rep in range(repeats + 1):
        for c, m in shapes:
            cache.truncate(torch.tensor([len(prompt)], device=device))
            t0 = time.perf_counter()
            dec.forward(cache, [prompt[-1]] * c, m)
            if rep:
                times[f"{c}+{m}"].append(time.perf_counter() - t0)
    return {k: round(statistics.median(v) * 1e3, 1) for k, v in times.items()}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ar", default="models/clover-smol-ar")
    p.add_argument("--draft", default="models/clover-smol-draft")
    p.add_argument("--split", default="validation")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tau", type=float, default=0.0, help="draft only while confidence >= tau")
    p.add_argument("--max-drafts", type=caps, default=[None], metavar="CAPS",
                   help="draft caps to run, comma-separated (`block`: drafts to the block's "
                        "end; K: at most K a forward, fewer mask rows); default block")
    p.add_argument("--max-tokens", type=int, default=768)
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the AR baseline (the same loop without drafts)")
    p.add_argument("--full-weights", action="store_true",
                   help="route two merged weight sets instead of the low-rank difference")
    p.add_argument("--reference", action="store_true",
                   help="the unfused routed linears (no fused or prepacked matmuls)")
    p.add_argument("--against", help="the twin's eval outputs (JSONL) on the same messages")
    p.add_argument("--out", help="write the first self-speculative run's outputs as JSONL")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"],
                   help="int8: weight-only int8 on every linear (torchao; fp32 activations on "
                        "a CPU without native bf16), the drafter's low-rank difference in the "
                        "activations' dtype")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=positive, default=1,
                   help="decode this many messages together (one forward a step over every "
                        "unfinished one; default 1, the agent's regime)")
    p.add_argument("--forward-rows", type=row_shapes, metavar="ROWS",
                   help="only time single forwards of these CLEAN+MASK row counts (e.g. "
                        "1+0,1+7,3+5) after the first message's prompt, and exit")
    return p.parse_args()


def compare(runs: list[tuple], twin: list[str] | None, baseline: bool) -> None:
    """Add to each run's summary its speed-up over the AR loop (the last run) and how many of its
    answers equal the AR loop's and the twin eval's."""
    for _, rows, r in runs:
        if baseline:
            r["speedup"] = round(runs[-1][2]["seconds"] / r["seconds"], 3)
            same = sum(a["output"] == b["output"] for a, b in zip(rows, runs[-1][1],
                                                                  strict=True))
            r["same_as_ar_loop"] = f"{same}/{len(rows)}"
        if twin is not None:
            same = sum(a["output"] == b for a, b in zip(rows, twin, strict=False))
            r["same_as_twin_eval"] = f"{same}/{min(len(twin), len(rows))}"


def print_table(runs: list[tuple]) -> None:
    print("\n| decode | zone F1 | validity | exact | tokens | forwards | TPF | s | speed-up | "
          "same as AR loop | same as twin eval |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _, r in runs:
        print(f"| {name} | {r['zone_f1']:.3f} | {r['validity']:.3f} | {r['exact']:.3f} | "
              f"{r['tokens']} | {r['forwards']} | {r['tpf']:.2f} | {r['seconds']:.0f} | "
              f"{r.get('speedup', '-')} | {r.get('same_as_ar_loop', '-')} | "
              f"{r.get('same_as_twin_eval', '-')} |")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    dtype = activation_dtype("int8", torch.device("cpu")) if args.dtype == "int8" else getattr(
        torch, args.dtype)
    pair, tok = load_pair(args.ar, args.draft, dtype=dtype, low_rank=not args.full_weights)
    if args.dtype == "int8":
        quantize_int8(pair.model)
    elif pair.low_rank and not args.reference:
        fuse_pair(pair)
    max_tokens = min(args.max_tokens, ANSWER_MAX_TOKENS)
    examples = split_examples(args.split, args.n, args.seed)
    prompts = [tok.encode(render_chat(tok, initial_conversation(e), tools=TOOLS,
                                      fixed_task_prompt=True)) for e in examples]
    if args.forward_rows:
        costs = forward_costs(SelfSpeculative(pair), prompts[0], args.forward_rows)
        for rows, ms in costs.items():
            print(f"rows {rows} (clean+mask) after {len(prompts[0])} tokens: {ms} ms")
        print(json.dumps({"benchmark": "self_speculative_forward", "draft": args.draft,
                          "dtype": args.dtype, "fused": pair.fused, "threads": args.threads,
                          "context": len(prompts[0]), "median_ms": costs}))
        return
    twin = ([json.loads(line)["output"] for line in open(args.against, encoding="utf-8")]
            if args.against else None)
    runs = []
    for cap in args.max_drafts:
        label = "drafts to the block's end" if cap is None else f"at most {cap} drafts"
        rows, seconds = run(SelfSpeculative(pair, args.tau, max_drafts=cap), prompts, tok,
                            max_tokens, "spec", args.batch)
        runs.append((f"self-speculative, {label}", rows, summary(rows, seconds, examples)))
        runs[-1][2]["max_drafts"] = cap
    if not args.no_baseline:
        rows, seconds = run(SelfSpeculative(pair, drafts=False), prompts, tok, max_tokens, "ar",
                            args.batch)
        runs.append(("AR (the same loop, no drafts)", rows, summary(rows, seconds, examples)))
    compare(runs, twin, baseline=not args.no_baseline)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for e, r in zip(examples, runs[0][1], strict=True):
                f.write(json.dumps({"id": e.id, "output": r["output"]}, ensure_ascii=False)
                        + "\n")
    print_table(runs)
    print(json.dumps({"benchmark": "self_speculative", "ar": args.ar, "draft": args.draft,
                      "split": args.split, "n": args.n, "tau": args.tau, "dtype": args.dtype,
                      "low_rank": pair.low_rank, "threads": args.threads, "batch": args.batch,
                      "fused": pair.fused,
                      "runs": [dict(r, decode=name) for name, _, r in runs]}))


if __name__ == "__main__":
    main()
