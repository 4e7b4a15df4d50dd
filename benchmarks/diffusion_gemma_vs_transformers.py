"""Clover's engine against transformers' own DiffusionGemma `generate`, on a converted tiny model.

A random `DiffusionGemmaForBlockDiffusion` (sliding and full layers, MoE, self-conditioning; every
weight randomised with std 0.03) is saved with `save_pretrained` and converted with
`clover convert`. Both decode the same prompts with the entropy-bound sampler, the same
temperature schedule and step budget, on torch's default generator seeded alike before every
run: transformers with `generate`, Clover with `LLM.generate` (uniform canvas, `entropy_bound`
policy). Rows run in lockstep (no early stop, no EOS stop), which is when a batched run draws its
random numbers in the same order on both sides, so the tokens must be identical. Batch 1 and 8,
best of `--repeats`. Prints a table, then one JSON line.

    python benchmarks/diffusion_gemma_vs_transformers.py [--batch 1 8] [--gen 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSamplerConfig,
)

from clover.bench.versus import (
    best_of,
    hardware,
    parse_args,
    print_report,
    token_agreement,
)
from clover.checkpoint import load_model
from clover.checkpoint.convert import convert
from clover.engine import LLM, SamplingParams

EOS_ID = 1  # DiffusionGemmaTextConfig's default eos, which the converted config keeps


def reference_model(args) -> DiffusionGemmaForBlockDiffusion:
    heads = args.dim // 32
    text = dict(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=2 * args.dim,
                num_hidden_layers=args.layers, num_attention_heads=heads,
                num_key_value_heads=max(heads // 2, 1), head_dim=32, global_head_dim=64,
                num_global_key_value_heads=1, sliding_window=args.window,
                num_experts=args.experts, top_k_experts=2, moe_intermediate_size=args.dim // 2,
                layer_types=["sliding_attention"] * (args.layers - 1) + ["full_attention"])
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision,
                                  canvas_length=args.canvas)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # small weights: the self-conditioning loop damps float noise
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            scale = p.ndim == 1 or name.endswith("per_expert_scale")
            p.copy_(1 + 0.06 * noise if scale else 0.03 * noise)
        for dec, enc in zip(model.model.decoder.layers, model.model.encoder.language_model.layers,
                            strict=True):
            enc.layer_scalar.copy_(dec.layer_scalar)
    return model


def hf_run(ref, prompts: list[list[int]], args) -> list[list[int]]:
    out = ref.generate(torch.tensor(prompts), max_new_tokens=args.gen,
                       max_denoising_steps=args.steps,
                       sampler_config=EntropyBoundSamplerConfig(entropy_bound=args.bound),
                       t_min=args.t_min, t_max=args.t_max, stability_threshold=1,
                       confidence_threshold=1e-9, eos_token_id=None, pad_token_id=0)
    return out.sequences[:, len(prompts[0]):].tolist()


def run(args) -> dict:
    ref = reference_model(args)
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(Path(tmp) / "hf")
        model = load_model(convert(Path(tmp) / "hf", Path(tmp) / "clover"))
    llm = LLM(model, device="cpu", dtype="float32", max_batch_size=max(args.batch),
              prefix_cache_mb=0)
    params = SamplingParams(policy="entropy_bound", max_tokens=args.gen, temperature=args.t_max,
                            min_temperature=args.t_min, steps_per_block=args.steps,
                            gamma=args.bound, stable_steps=1, stop_entropy=1e-9,
                            ignore_eos=True)
    rows = []
    for batch in args.batch:
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(2, args.vocab, (args.prompt,), generator=g).tolist()
                   for _ in range(batch)]
        with torch.no_grad():
            want, t_ref = best_of(lambda p=prompts: hf_run(ref, p, args), args.repeats, batch)
        outs, t_clover = best_of(lambda p=prompts: llm.generate(p, params), args.repeats, batch)
        got = [o.token_ids for o in outs]  # up to the first EOS, as Clover returns them
        want = [w[:w.index(EOS_ID)] if EOS_ID in w else w for w in want]
        agree = token_agreement(got, want)
        rows.append({"batch": batch, "transformers_s": round(t_ref, 4),
                     "clover_s": round(t_clover, 4), "speedup": round(t_ref / t_clover, 3),
                     "same_tokens": got == want, "token_agreement": round(agree, 4),
                     "forwards_per_row": outs[0].stats.forwards})
    return {"benchmark": "diffusion_gemma_vs_transformers", "family": "diffusion_gemma",
            "hardware": hardware(),
            "model": {"dim": args.dim, "layers": args.layers, "vocab": args.vocab,
                      "experts": args.experts, "canvas": args.canvas, "window": args.window},
            "settings": {"prompt": args.prompt, "gen": args.gen, "steps": args.steps,
                         "entropy_bound": args.bound, "t_max": args.t_max, "t_min": args.t_min,
                         "early_stop": False, "repeats": args.repeats},
            "results": rows}


def show(report: dict) -> None:
    cells = [[str(r["batch"]), f"{r['transformers_s']:.3f}", f"{r['clover_s']:.3f}",
              f"{r['speedup']:.2f}x", str(r["same_tokens"]), f"{r['token_agreement']:.3f}",
              str(r["forwards_per_row"])] for r in report["results"]]
    print_report("Clover engine vs transformers' DiffusionGemma generate (tiny, CPU)",
                 ("batch", "transformers s", "clover s", "speedup", "same tokens", "agreement",
                  "forwards / row"), cells, report)


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--canvas", type=int, default=32)
    p.add_argument("--steps", type=int, default=8, help="denoising steps per canvas")
    p.add_argument("--bound", type=float, default=1.0, help="entropy bound (nats)")
    p.add_argument("--t-max", type=float, default=0.8)
    p.add_argument("--t-min", type=float, default=0.4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--window", type=int, default=16)


def main() -> None:
    show(run(parse_args(__doc__, flags, dim=128)))


if __name__ == "__main__":
    main()
