"""Clover's AR decode against transformers `generate` on the same real weights, side by side.

SmolLM2-135M-Instruct (the embedded base: Clover's converted directory, and transformers loading
the very GGUF it was converted from), greedy, the same prompts, the same number of new tokens, for
each dtype and batch size. Every repeat runs Clover and transformers back to back (interleaved),
so machine noise hits both alike; medians are reported, and the ratio is transformers' wall time
over Clover's. The benchmark asserts both produced the same tokens (greedy, no EOS stop: both
decode exactly --max-tokens). It also reports each rate against the weight-bandwidth roofline
(every weight streamed once per step, at the read bandwidth measured just before each timed run)
and, with --llama-bench PATH, llama.cpp's batch-1 decode rate on the same GGUF. Prints a table,
then one JSON line.

    python benchmarks/engine_vs_transformers.py [--batch 1 8] [--dtypes fp32 bf16 int8]
        [--engines eager compiled] [--max-tokens 32] [--repeats 3] [--threads 2]
        [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from clover.bench.machine import (
    features_line,
    llama_bench,
    machine_peaks,
    memory_bandwidth,
    streamed_weight_bytes,
)
from clover.engine import LLM, SamplingParams

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a map in a bottle.",
    "Explain, step by step and in detail, how a bicycle gear system works.",
    "Describe the history of the printing press and why it changed Europe.",
    "List the things a new gardener should know before planting tomatoes.",
    "Tell me about the water cycle as if I were ten years old, with examples.",
    "Compare trains and aeroplanes for travelling across a large country.",
    "Give a detailed recipe for bread, including how to knead the dough.",
    "Explain what a compiler does, from source text to machine code.",
]


def prompt_ids(tokenizer, batch: int, length: int) -> list[list[int]]:
    """`batch` chat prompts cut to the same token length (no padding on either side)."""
    from clover.tokenizer import render_chat

    out = []
    for i in range(batch):
        text = render_chat(tokenizer, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        ids = tokenizer.encode(text)
        out.append(ids[-length:] if len(ids) >= length else ids[:1] * (length - len(ids)) + ids)
    return out


def load_clover(path: str, dtype: str, batch: int, compile: bool = False) -> LLM:
    from clover.bench.quant import load_at

    model, tok = load_at(path, dtype, torch.device("cpu"))
    return LLM(model, tokenizer=tok, device="cpu", dtype=next(model.parameters()).dtype,
               max_batch_size=batch, compile=compile)


def clover_decode(llm: LLM, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy decode of exactly `new` tokens per prompt (EOS does not stop it)."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    reqs = [llm.engine.add_request(p, params) for p in prompts]
    while llm.engine.has_unfinished():
        llm.engine.step()
    return [r.seq[len(r.prompt):len(r.prompt) + new] for r in reqs]


def load_hf(gguf: Path, dtype: str):
    from transformers import AutoModelForCausalLM

    if dtype == "int8":
        return None  # transformers has no CPU int8 weight-only path to compare with
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch_dtype)
    model.generation_config.eos_token_id = None  # decode exactly max_new_tokens, as Clover does
    return model.eval()


@torch.inference_mode()
def hf_decode(model, prompts: list[list[int]], new: int) -> list[list[int]]:
    ids = torch.tensor(prompts)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call. On a shared machine the CPU time
    is the steadier figure: it leaves out the time the process waited to be scheduled."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0


def first_mismatch(ours: list[list[int]], theirs: list[list[int]] | None) -> int | None:
    """The first new-token index where any row differs (None: identical or nothing to compare)."""
    if theirs is None or ours == theirs:
        return None
    pairs = list(zip(ours, theirs, strict=True))
    return next(j for j in range(len(ours[0])) if any(a[j] != b[j] for a, b in pairs))


def compare(llm: LLM, hf, prompts, new: int, repeats: int, allow_mismatch: bool) -> dict:
    """Warm up both, then `repeats` interleaved runs; medians, and the tokens checked equal.
    Before each of Clover's runs the read bandwidth is measured again (`bandwidth_runs`): on a
    shared machine it drifts within a run, and each run is set against the bandwidth of its
    moment (`row`'s roofline_share)."""
    ours = clover_decode(llm, prompts, new)
    theirs = hf_decode(hf, prompts, new) if hf is not None else None
    mismatch = first_mismatch(ours, theirs)
    if mismatch is not None and not allow_mismatch:
        raise AssertionError(f"Clover and transformers disagree from new token {mismatch} "
                             "(--allow-mismatch reports it instead)")
    t_ours, t_theirs, bandwidth = [], [], []
    for _ in range(repeats):
        bandwidth.append(memory_bandwidth(seconds=0.5))
        t_ours.append(timed(clover_decode, llm, prompts, new))
        if hf is not None:
            t_theirs.append(timed(hf_decode, hf, prompts, new))
    med = lambda ts, i: statistics.median(t[i] for t in ts) if ts else None
    return {"clover_s": med(t_ours, 0), "clover_best_s": min(t[0] for t in t_ours),
            "clover_cpu_s": med(t_ours, 1), "hf_cpu_s": med(t_theirs, 1),
            "hf_s": med(t_theirs, 0),
            "hf_best_s": min(t[0] for t in t_theirs) if t_theirs else None,
            "same_tokens": None if theirs is None else mismatch is None,
            "first_mismatch": mismatch, "clover_runs_s": [t[0] for t in t_ours],
            "bandwidth_runs": bandwidth}


def row(dtype: str, batch: int, new: int, res: dict, weight_bytes: int, bandwidth: float,
        bandwidth_cpu: float) -> dict:
    """One table row. roofline_share: the median over runs of (every weight streamed once at the
    bandwidth measured just before the run) / (the run's time per step); roofline_share_start:
    the median time per step against the bandwidth measured at the start of the benchmark;
    roofline_share_cpu: CPU time per step against the bandwidth timed by CPU time."""
    tokens = batch * new
    shares = [weight_bytes / bw / (t / new)
              for bw, t in zip(res["bandwidth_runs"], res["clover_runs_s"], strict=True)]
    out = {"dtype": dtype, "batch": batch, "new_tokens": new,
           "clover_tok_s": round(tokens / res["clover_s"], 2),
           "clover_ms_per_step": round(1000 * res["clover_s"] / new, 2),
           "roofline_share": round(statistics.median(shares), 3),
           "roofline_share_runs": [round(x, 3) for x in shares],
           "bandwidth_runs_gbs": [round(bw / 1e9, 2) for bw in res["bandwidth_runs"]],
           "roofline_share_start": round(weight_bytes / bandwidth / (res["clover_s"] / new), 3),
           "clover_best_ms_per_step": round(1000 * res["clover_best_s"] / new, 2),
           "clover_cpu_ms_per_step": round(1000 * res["clover_cpu_s"] / new, 2),
           "roofline_share_cpu": round(weight_bytes / bandwidth_cpu / (res["clover_cpu_s"] / new),
                                       3),
           "weight_mb": round(weight_bytes / 1e6, 1), "same_tokens": res["same_tokens"],
           "first_mismatch": res["first_mismatch"]}
    if res["hf_s"] is not None:
        out |= {"hf_tok_s": round(tokens / res["hf_s"], 2),
                "hf_ms_per_step": round(1000 * res["hf_s"] / new, 2),
                "hf_best_ms_per_step": round(1000 * res["hf_best_s"] / new, 2),
                "hf_cpu_ms_per_step": round(1000 * res["hf_cpu_s"] / new, 2),
                "speedup_vs_hf": round(res["hf_s"] / res["clover_s"], 2),
                "speedup_vs_hf_cpu": round(res["hf_cpu_s"] / res["clover_cpu_s"], 2)}
    return out


def run(args: argparse.Namespace) -> dict:
    from clover.checkpoint.base import ensure_base, gguf_path

    model_dir, gguf = args.model or str(ensure_base()), Path(args.gguf or gguf_path())
    peaks = machine_peaks()
    peaks["bandwidth_cpu_clock_gbs"] = round(memory_bandwidth(cpu_clock=True) / 1e9, 2)
    results = []
    for dtype in args.dtypes:
        hf = load_hf(gguf, dtype)
        for batch, engine in ((b, e) for b in args.batch for e in args.engines):
            llm = load_clover(model_dir, dtype, batch, compile=engine == "compiled")
            prompts = prompt_ids(llm.tokenizer, batch, args.prompt_tokens)
            t0 = time.perf_counter()
            clover_decode(llm, prompts, args.max_tokens)  # compiles every shape the run meets
            clover_decode(llm, prompts, args.max_tokens)  # (the second: a cached prompt head)
            warm_s = time.perf_counter() - t0
            res = compare(llm, hf, prompts, args.max_tokens, args.repeats, args.allow_mismatch)
            results.append(row(dtype, batch, args.max_tokens, res,
                               streamed_weight_bytes(llm.engine.model),
                               peaks["bandwidth_gbs"] * 1e9,
                               peaks["bandwidth_cpu_clock_gbs"] * 1e9)
                           | {"engine": engine, "warmup_s": round(warm_s, 1)})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # progress
            del llm
        del hf
    out = {"bench": "engine_vs_transformers", "model": Path(model_dir).name, "gguf": gguf.name,
           "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "machine": peaks,
           "results": results}
    if args.llama_bench:
        out["llama_cpp"] = llama_bench(args.llama_bench, gguf, torch.get_num_threads())
    return out


def print_table(out: dict) -> None:
    print(f"machine: {features_line(out['machine'])}; bandwidth "
          f"{out['machine']['bandwidth_gbs']} GB/s; matmul peak {out['machine']['matmul_gflops']}"
          " GFLOP/s")
    head = ("dtype", "batch", "engine", "clover tok/s", "ms/step (best)", "cpu ms/step",
            "roofline (start, cpu)", "hf tok/s", "hf ms/step (best)", "hf cpu ms/step",
            "x hf (cpu)", "same tokens")
    print(" | ".join(head))
    for r in out["results"]:
        hf_ms = f"{r['hf_ms_per_step']} ({r['hf_best_ms_per_step']})" if "hf_tok_s" in r else "-"
        ratio = f"{r['speedup_vs_hf']} ({r['speedup_vs_hf_cpu']})" if "hf_tok_s" in r else "-"
        cells = (r["dtype"], r["batch"], r["engine"], r["clover_tok_s"],
                 f"{r['clover_ms_per_step']} ({r['clover_best_ms_per_step']})",
                 r["clover_cpu_ms_per_step"],
                 f"{100 * r['roofline_share']:.0f}% ({100 * r['roofline_share_start']:.0f}%, "
                 f"{100 * r['roofline_share_cpu']:.0f}%)",
                 r.get("hf_tok_s", "-"), hf_ms, r.get("hf_cpu_ms_per_step", "-"), ratio,
                 r["same_tokens"])
        print(" | ".join(str(c) for c in cells))
    if "llama_cpp" in out:
        print(f"llama.cpp (llama-bench tg32, batch 1, {out['llama_cpp']['threads']} threads): "
              f"{out['llama_cpp']['llama_cpp_tok_s']} tok/s on {out['gguf']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="Clover model dir (default: the embedded base)")
    ap.add_argument("--gguf", default=None, help="the GGUF it came from (default: the base's)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"],
                    choices=["fp32", "bf16", "int8"])
    ap.add_argument("--engines", nargs="+", default=["eager"], choices=["eager", "compiled"],
                    help="Clover's forward: eager, and/or one compiled graph (LLM(compile=True));"
                         " the compile time is reported as warmup_s, outside the timed runs")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--allow-mismatch", action="store_true",
                    help="report differing tokens (first differing index) instead of failing")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--llama-bench", default=None, metavar="PATH",
                    help="llama.cpp's llama-bench binary: adds its batch-1 decode rate")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = run(args)
    print_table(out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
