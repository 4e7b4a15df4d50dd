"""Engine benchmark: a random-weight block-diffusion model and its causal twin, side by side.

Same architecture and size (`clover-tiny` vs `clover-tiny-ar` shapes, random weights), same
prompts, same engine. Reports NFE, TPF, TPS, the time split (model / policy / other) and the
engine overhead share, plus the AR path's per-token cost against a bare cached forward pass.
Random weights say nothing about quality, so this measures the machinery only; the ratios and
the overhead share matter, not the absolute numbers. Prints a table, then one JSON line.

    python benchmarks/engine_bench.py [--batch 1 8] [--max-tokens 128] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from rich.console import Console
from rich.table import Table

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.model import KVCache, build_model


def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def _run(llm: LLM, prompts, params, repeats: int) -> dict:
    llm.generate(prompts[:1], params.replace(max_tokens=8))  # warm-up
    best = None
    for _ in range(repeats):
        llm.engine.stats = type(llm.engine.stats)()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        tokens = sum(o.stats.generated_tokens for o in outs)
        row = {**llm.engine.stats.as_dict(), "wall_s": round(wall, 4),
               "tps": round(tokens / wall, 1), "tokens": tokens}
        if best is None or row["wall_s"] < best["wall_s"]:
            best = row
    return best


@torch.inference_mode()
def bare_forward_ms(model, prompt_len: int, repeats: int = 50) -> float:
    """One cached single-token forward (the floor for an AR step), median over repeats."""
    cache = KVCache(model.config, 1, prompt_len + repeats + 2)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len))
    model(ids, cache=cache)
    cache.commit(torch.tensor([prompt_len]))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(ids[:, -1:], cache=cache)
        cache.commit(torch.tensor([1]))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dllm = build_model(get_preset("clover-tiny"), seed=0)
    ar = build_model(get_preset("clover-tiny-ar"), seed=0)
    ar.load_state_dict(dllm.state_dict())  # identical weights: only the attention mode differs
    llms = {"block": LLM(dllm, device=args.device), "causal": LLM(ar, device=args.device)}
    bs = dllm.config.block_size
    settings = {  # random weights are never confident: topk fixes the tokens per step
        "block topk 4/step": ("block", SamplingParams(policy="topk", steps_per_block=bs // 4)),
        "block topk 8/step": ("block", SamplingParams(policy="topk", steps_per_block=bs // 8)),
        "block threshold 0.9": ("block", SamplingParams(policy="threshold", tau=0.9)),
        "causal (AR)": ("causal", SamplingParams()),
    }
    results = []
    for batch in args.batch:
        prompts = _prompts(batch, args.prompt_len, dllm.config.vocab_size)
        for name, (mode, params) in settings.items():
            params = params.replace(max_tokens=args.max_tokens, ignore_eos=True)
            row = _run(llms[mode], prompts, params, args.repeats)
            results.append({"setting": name, "batch": batch, **row})
    floor_ms = bare_forward_ms(ar, args.prompt_len)
    _print(results, floor_ms)
    device = str(llms["block"].engine.runner.device)
    print(json.dumps({"bench": "engine", "hardware": platform.processor() or platform.machine(),
                      "threads": torch.get_num_threads(), "device": device,
                      "model": "clover-tiny (random weights)", "max_tokens": args.max_tokens,
                      "prompt_len": args.prompt_len, "ar_bare_forward_ms": round(floor_ms, 3),
                      "results": results}))


def _print(results: list[dict], floor_ms: float) -> None:
    table = Table(title="engine benchmark (random-weight clover-tiny shapes; ratios matter)")
    for col in ("setting", "batch", "NFE", "TPF", "TPS", "wall s", "model s", "policy s",
                "other s", "overhead"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["setting"], str(r["batch"]), str(r["forwards"]), f"{r['tpf']:.2f}",
                      f"{r['tps']:.0f}", f"{r['wall_s']:.3f}", f"{r['model_s']:.3f}",
                      f"{r['policy_s']:.3f}", f"{r['other_s']:.3f}",
                      f"{100 * r['overhead_share']:.1f}%")
    Console().print(table)
    ar1 = next((r for r in results if r["setting"] == "causal (AR)" and r["batch"] == 1), None)
    if ar1:
        per_token = 1000 * ar1["wall_s"] / ar1["tokens"]
        print(f"AR at batch 1: {per_token:.2f} ms per token vs a bare cached forward of "
              f"{floor_ms:.2f} ms ({per_token / floor_ms:.2f}x)")


if __name__ == "__main__":
    main()
