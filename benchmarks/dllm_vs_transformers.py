"""Clover's engine against LLaDA's own generate on transformers, on a converted tiny LLaDA.

A random `LlamaForCausalLM` run bidirectionally (LLaDA's math) is written in LLaDA's published key
layout and converted with `clover convert`. The reference is LLaDA's generate algorithm (greedy,
low-confidence remasking, whole canvas every step) over transformers' model; Clover decodes the
same prompts with its engine: `topk` policy without a cache (the same algorithm: must give the same
tokens), and with the prefix / dual caches (approximate for bidirectional models: token agreement is
reported). Batch 1 and 8, best of `--repeats`. Prints a table, then one JSON line.

(The issue asks for this on a tiny DiffusionGemma; Clover cannot import DiffusionGemma yet, see
docs/models.md, so the comparison runs on the family it can.)

    python benchmarks/dllm_vs_transformers.py [--batch 1 8] [--gen 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from clover.bench.llada_reference import llada_generate, llama_as_llada
from clover.bench.versus import (
    best_of,
    hardware,
    parse_args,
    print_report,
    token_agreement,
)
from clover.checkpoint import load_model
from clover.checkpoint.convert import convert
from clover.checkpoint.hf_files import write_hf_dir
from clover.engine import LLM, SamplingParams

MASK_ID, EOS_ID = 3, 2


def reference_model(args) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=3 * args.dim,
                      num_hidden_layers=args.layers, num_attention_heads=args.dim // 32,
                      num_key_value_heads=args.dim // 32, rope_theta=500000.0,
                      rms_norm_eps=1e-5, max_position_embeddings=1024,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.config.is_causal = False
    for layer in model.model.layers:
        layer.self_attn.is_causal = False
    with torch.no_grad():  # larger weights, so greedy decoding writes varied tokens
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 1.0 if "embed" in name else 0.25)
        model.lm_head.weight[[EOS_ID, MASK_ID]] = 0.0  # never an argmax, as in a trained model
    return model


def as_llada_dir(model: LlamaForCausalLM, path: Path) -> Path:
    config, tensors = llama_as_llada(model, eos_id=EOS_ID, mask_id=MASK_ID)
    return write_hf_dir(path, config, tensors, shards=2)


def run(args) -> dict:
    ref = reference_model(args)
    with tempfile.TemporaryDirectory() as tmp:
        clover_dir = convert(as_llada_dir(ref, Path(tmp) / "hf"), Path(tmp) / "clover")
        llm = LLM(load_model(clover_dir), device="cpu", dtype="float32", max_batch_size=8)
    steps = args.steps_per_block * args.gen // args.block
    rows = []
    for batch in args.batch:
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(4, args.vocab, (args.prompt,), generator=g).tolist()
                   for _ in range(batch)]
        want, t_ref = best_of(lambda p=prompts: llada_generate(
            lambda ids: ref(ids).logits, p, mask_id=MASK_ID, gen_length=args.gen,
            block_length=args.block, steps=steps), args.repeats)
        for cache in ("none", "prefix", "dual"):
            params = SamplingParams(policy="topk", steps_per_block=args.steps_per_block,
                                    block_size=args.block, max_tokens=args.gen, cache=cache,
                                    ignore_eos=True)
            llm.generate(prompts[:1], params.replace(max_tokens=args.block))  # warm-up
            outs, t_clover = best_of(lambda p=prompts, q=params: llm.generate(p, q), args.repeats)
            got = [o.token_ids for o in outs]
            agree = token_agreement(got, want)
            rows.append({"batch": batch, "cache": cache, "transformers_s": round(t_ref, 4),
                         "clover_s": round(t_clover, 4), "speedup": round(t_ref / t_clover, 3),
                         "same_tokens": got == want, "token_agreement": round(agree, 4)})
    return {"benchmark": "dllm_vs_transformers", "family": "llada",
            "hardware": hardware(),
            "model": {"dim": args.dim, "layers": args.layers, "vocab": args.vocab},
            "settings": {"prompt": args.prompt, "gen": args.gen, "block": args.block,
                         "steps_per_block": args.steps_per_block, "repeats": args.repeats},
            "results": rows}


def show(report: dict) -> None:
    cells = [[str(r["batch"]), r["cache"], f"{r['transformers_s']:.3f}", f"{r['clover_s']:.3f}",
              f"{r['speedup']:.2f}x", str(r["same_tokens"]), f"{r['token_agreement']:.3f}"]
             for r in report["results"]]
    print_report("Clover engine vs LLaDA generate on transformers (tiny LLaDA, CPU)",
                 ("batch", "cache", "transformers s", "clover s", "speedup", "same tokens",
                  "agreement"), cells, report)


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--steps-per-block", type=int, default=16)


def main() -> None:
    show(run(parse_args(__doc__, flags, dim=256)))


if __name__ == "__main__":
    main()
