"""`clover train`: run a named recipe (flags map one-to-one to `RunArgs` fields).

Works the same under `torchrun --nproc-per-node N -m clover.cli train ...` (DDP, or FSDP2 with
`--parallel fsdp`; rank 0 writes files).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from clover.tasks.airspace.recipes import RECIPES, RunArgs, run_recipe
from clover.train import DistEnv


def _train(args: argparse.Namespace) -> int:
    if args.bf16:
        from clover.bench.quant import warn_emulated_bf16

        warn_emulated_bf16("--bf16", args.device)
    summary = run_recipe(RunArgs(
        recipe=args.recipe, attention=args.attention, init_from=args.init_from, out=args.out,
        work_dir=args.work_dir, steps=args.steps, batch_size=args.batch_size, resume=args.resume,
        stop_after=args.stop_after, device=args.device, parallel=args.parallel, seed=args.seed,
        bf16=args.bf16,
        eval_examples=args.eval_examples,
        progress=not args.no_progress, lr=args.lr, shift_logits=args.shift_logits,
        own_token=args.own_token,
        sharpen=args.sharpen, ar_mix=args.ar_mix, save_dtype=args.save_dtype,
        copy_mix=args.copy_mix,
        prompt_format=args.prompt_format, prompt_loss=args.prompt_loss,
        lora_rank=args.lora_rank, block_size=args.block_size, init_adapter=args.init_adapter,
        save_every=args.save_every, micro_batch_size=args.micro_batch_size,
        prefix_grad=not args.no_prefix_grad, complementary=args.complementary_masks,
        suffix_masks=args.suffix_masks, eval_every=args.eval_every,
        calibration_examples=args.calibration_examples,
        train_mask_row=args.train_mask_row, mask_init=args.mask_init,
        distill_from=args.distill_from,
        distill_coef=args.distill_coef, ack_share=args.ack_share, verifier=args.verifier,
        config_overrides=parse_overrides(args.set)))
    if DistEnv.from_environ().is_main:
        print(json.dumps(summary))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a model with a named recipe (resumable, DDP)")
    p.add_argument("--recipe", default="airspace-tiny", choices=sorted(RECIPES))
    p.add_argument("--attention", default="block", choices=["block", "causal", "full"],
                   help="block: the dLLM; causal: its AR twin")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from this model directory's weights (e.g. the AR model)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="final model directory (default models/<preset name>)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="checkpoints, tokenizer and log.jsonl (default runs/train/<out name>)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: recipe's)")
    p.add_argument("--batch-size", type=int, default=None, help="global examples per step")
    p.add_argument("--resume", action="store_true", help="continue from the work dir checkpoint")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="checkpoint at this step and stop (the schedule stays that of --steps; "
                        "WORK/checkpoint is then a model directory for --init-from, and --resume "
                        "finishes the run)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"],
                   help="under torchrun: ddp keeps the whole model on every process; fsdp shards "
                        "parameters, gradients and optimizer state per transformer block (FSDP2) "
                        "and checkpoints through torch.distributed.checkpoint (resumable at "
                        "another process count)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast: faster on CUDA and on CPUs with AVX-512 BF16 or AMX, "
                        "several times slower where bf16 is emulated (AVX2-only CPUs: a warning)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: recipe's)")
    p.add_argument("--shift-logits", action="store_true",
                   help="diffusion: position i is predicted at i - 1 (Dream; reuses an AR head)")
    p.add_argument("--own-token", action="store_true",
                   help="airspace-smol diffusion: predict a masked position from its own logits "
                        "(LLaDA, SDAR) instead of the base recipe's shifted prediction")
    p.add_argument("--sharpen", type=float, default=0.0,
                   help="confidence-sharpening weight (entropy where already right)")
    p.add_argument("--ar-mix", type=float, default=0.0, metavar="W",
                   help="diffusion models: add W x the next-token loss under a causal mask (a "
                        "second forward; keeps what an AR --init-from model knew)")
    p.add_argument("--save-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the final model's stored weights (bfloat16: half the size)")
    p.add_argument("--copy-mix", type=float, default=0.0, metavar="F",
                   help="share of examples that are a repeat-the-message task (teaches copying; "
                        "1 for a copy-only warm-up run to --init-from)")
    p.add_argument("--prompt-format", default="chat", choices=["chat", "message"],
                   help="message: prompts are the conversation alone, no system turn or tool "
                        "schemas (for single-task models too small to read them)")
    p.add_argument("--prompt-loss", action="store_true",
                   help="train on the prompt tokens too (language-model loss on the message), "
                        "not only on the response")
    _add_mask_flags(p)
    _add_eval_flags(p)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the recipe's model config, e.g. --set "
                        "num_dense_layers=4 (repeatable; values are JSON or text)")
    _add_base_recipe_flags(p)
    p.add_argument("--no-progress", action="store_true", help="log lines only, no progress bar")
    p.set_defaults(func=_train)


def _add_eval_flags(p: argparse.ArgumentParser) -> None:
    """What a run evaluates, and when."""
    p.add_argument("--eval-examples", type=int, default=None,
                   help="validation examples decoded and scored at each evaluation (the end, "
                        "or every --eval-every steps; 0: skip)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="evaluate every N steps: validation loss, decoded examples, calibration "
                        "(default 0: at the end only)")
    p.add_argument("--calibration-examples", type=int, default=0, metavar="N",
                   help="validation replies probed teacher-forced at each "
                        "evaluation (clover.bench.calibration): next-token accuracy, and the "
                        "prefix policy's TPF and replies all right at tau 1.0 and 0.9 (AR: "
                        "the accuracy only)")


def _add_mask_flags(p: argparse.ArgumentParser) -> None:
    """Block diffusion: which masked views a training step sees."""
    p.add_argument("--complementary-masks", action="store_true",
                   help="block diffusion: each example also trains a second view masked exactly "
                        "where the first is not, so every response token gets a loss "
                        "(Fast-dLLM v2); about 1.3x the step cost")
    p.add_argument("--suffix-masks", type=float, default=0.0, metavar="F",
                   help="block diffusion: share of blocks whose masked tokens are the block's "
                        "last ones (the state left-to-right decoding, --policy prefix, meets) "
                        "instead of anywhere in it; as many tokens masked either way")


def _add_base_recipe_flags(p: argparse.ArgumentParser) -> None:
    """Flags of recipes that adapt the embedded pretrained base (airspace-smol)."""
    p.add_argument("--lora-rank", type=int, default=32,
                   help="base recipes (airspace-smol): rank of the LoRA adapter")
    p.add_argument("--block-size", type=int, default=None,
                   help="base recipes, diffusion: block size (default: the recipe's)")
    p.add_argument("--init-adapter", default=None, metavar="DIR",
                   help="base recipes: start the LoRA matrices from this adapter directory "
                        "(e.g. the AR twin, for its diffusion adaptation)")
    p.add_argument("--train-mask-row", action="store_true",
                   help="base recipes, diffusion: train the <|mask|> embedding row too (it "
                        "starts as --mask-init says; stored in the adapter as one row)")
    p.add_argument("--mask-init", default="mean", choices=["mean", "random"],
                   help="base recipes, diffusion: the <|mask|> row's start: the mean embedding "
                        "(default), or a draw from N(0, s^2) with s the embedding's standard "
                        "deviation (needs --train-mask-row)")
    p.add_argument("--distill-from", default=None, metavar="DIR",
                   help="base recipes, diffusion: an AR adapter directory (the twin) whose "
                        "next-token distribution each block's first masked position learns "
                        "(clover.train.distill); needs --distill-coef")
    p.add_argument("--distill-coef", type=float, default=0.0, metavar="W",
                   help="weight of that KL term (per target, like the diffusion loss)")
    p.add_argument("--verifier", default=None, metavar="DIR",
                   help="airspace-smol, block: train the adapter as the drafter of "
                        "self-speculative decoding, reading this AR model's clean keys "
                        "(needs --suffix-masks 1; benchmarks/self_speculative.py decodes)")
    p.add_argument("--ack-share", type=float, default=0.0, metavar="F",
                   help="base recipes: this share of the examples that make calls also trains "
                        "the agent's second turn (gold calls and their tool results in, the "
                        "short closing reply out), so the model ends the conversation instead "
                        "of calling again")
    p.add_argument("--save-every", type=int, default=None,
                   help="checkpoint every N steps (default: the recipe's)")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="examples per forward (default: the recipe's); the global batch is "
                        "accumulated, so only memory and speed change")
    p.add_argument("--no-prefix-grad", action="store_true",
                   help="run the prompt prefix shared by a micro-batch (system prompt and "
                        "tools) without gradient, once per optimizer step: cheaper steps (a "
                        "truncated gradient)")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items -> {key: value}; values are JSON (numbers, true, null) or text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_experts=0")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out
