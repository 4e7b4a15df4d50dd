"""The shipped airspace models: SmolLM2-135M-Instruct adapted with a LoRA adapter.

`clover train --recipe airspace-smol --attention causal` fine-tunes the embedded base on the task
(`clover-smol-ar`); `--attention block` adapts it to block diffusion (`clover-smol`): one new
`<|mask|>` row (mean embedding), block-causal attention, Dream-style shifted prediction so the AR
head is reused, optionally starting its LoRA from the AR twin's adapter (`--init-adapter`). Prompt
= the base's ChatML template with the task's system prompt and tools; response = the tool calls as
the template renders them, ending at `<|im_end|>` (the base's EOS). Only the LoRA matrices train;
the result is an adapter directory (`clover.checkpoint.adapter`) of a few MB.
"""

from __future__ import annotations

import json
import platform
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from clover.checkpoint import adapter
from clover.checkpoint.base import BASE_NAME, GGUF_SHA256, require_base, sha256
from clover.config import ModelConfig
from clover.train import DistEnv, TrainConfig, Trainer
from clover.train.data import TokenExample, sft_example


def smol_sft(tokenizer, examples: list, ack_share: float = 0.0,
             seed: int = 0) -> list[TokenExample]:
    """Prompt = template up to `<|im_start|>assistant\\n`; response = calls + `<|im_end|>`.

    `ack_share`: that share of the examples that make calls (drawn with `seed`) also gives a
    second-turn row, appended after the first-turn rows: the conversation with the gold calls and
    their tool results as the prompt, the short closing reply (`ACK_REPLY`) as the response, which
    is what the agent's second turn should say. A training run of a fixed number of steps draws
    from all rows, so these rows take the place of as many first-turn rows."""
    rows = [_sft_row(tokenizer, ex.messages(tools=True)) for ex in examples]
    if ack_share:
        rng = random.Random(seed)
        rows += [_sft_row(tokenizer, ex.messages(tools=True, ack=True)) for ex in examples
                 if rng.random() < ack_share and ex.calls]
    return rows


def _sft_row(tokenizer, messages: list[dict]) -> TokenExample:
    """The conversation up to its last (assistant) message as the prompt, that message as the
    response, both as the chat template renders them."""
    from clover.tasks.airspace import TOOLS
    from clover.tokenizer import render_chat

    prompt = render_chat(tokenizer, messages[:-1], TOOLS, add_generation_prompt=True)
    full = render_chat(tokenizer, messages, TOOLS, add_generation_prompt=False)
    assert full.startswith(prompt), "chat template: prompt is not a prefix of the chat"
    reply = full[len(prompt):].rstrip("\n")
    return sft_example(tokenizer.encode(prompt), tokenizer.encode(reply))


def adapted_config(base: ModelConfig, attention: str, block_size: int, shift_logits: bool,
                   name: str) -> ModelConfig:
    """The base's config for causal SFT, or with a mask row and block attention for diffusion."""
    if attention == "causal":
        return base.replace(name=name)
    if attention != "block":
        raise ValueError(f"--attention {attention!r}: airspace-smol trains causal or block")
    return base.replace(name=name, vocab_size=base.vocab_size + 1, mask_id=base.vocab_size,
                        attention="block", block_size=block_size, shift_logits=shift_logits)


def smol_tokenizer(config: ModelConfig):
    """The base tokenizer (ChatML with tools), plus `<|mask|>` for diffusion models."""
    from clover.checkpoint.convert import MASK_TOKEN
    from clover.tokenizer import load_tokenizer

    tok = load_tokenizer(require_base())
    if config.attention != "causal":
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
        assert tok.mask_token_id == config.mask_id, (tok.mask_token_id, config.mask_id)
    return tok


def smol_model(config: ModelConfig, rank: int, init_adapter: str | None,
               train_mask_row: bool = False, mask_init: str = "mean"):
    """Base (+ mask row, initialised as `mask_init` says) with LoRA injected (and the mask row
    trainable with `train_mask_row`); LoRA matrices (and a trained mask row) from `init_adapter`
    when given."""
    if train_mask_row and config.attention == "causal":
        raise ValueError("--train-mask-row: only diffusion models have a mask row")
    model = adapter.base_model_for(config, mask_init=mask_init)
    peft_config = adapter.lora_config(rank, mask_row=config.mask_id if train_mask_row else None)
    adapter.inject_lora(model, peft_config)
    if init_adapter:
        try:
            saved, state = adapter.read_adapter(init_adapter)
        except adapter.CheckpointError as e:
            raise ValueError(f"--init-adapter {init_adapter}: {e}") from e
        if saved.r != rank:
            raise ValueError(f"--init-adapter {init_adapter}: rank {saved.r} != "
                             f"--lora-rank {rank}")
        if train_mask_row:  # an adapter saved without a trained mask row: it starts at the base's
            state = {**{k: v for k, v in adapter.lora_state(model).items()
                        if "trainable_tokens" in k}, **state}
        adapter.load_lora_state(model, state, str(Path(init_adapter) / adapter.ADAPTER_WEIGHTS))
    return model, peft_config


def run_smol(args, recipe) -> dict[str, Any]:
    """Train one airspace-smol model (AR twin or diffusion) and write its adapter directory."""
    from clover.checkpoint import load_config
    from clover.tasks.airspace import generate_examples
    from clover.tasks.airspace.evaluators import task_evaluator

    if not 0.0 <= args.ack_share <= 1.0:
        raise ValueError(f"--ack-share={args.ack_share} must be in [0, 1]")
    if args.own_token and (args.attention != "block" or args.shift_logits):
        raise ValueError("--own-token: only for a diffusion model (--attention block), and not "
                         "with --shift-logits")
    if args.mask_init != "mean" and not args.train_mask_row:  # loading rebuilds it as the mean
        raise ValueError(f"--mask-init {args.mask_init}: needs --train-mask-row (the adapter "
                         "then stores the row)")
    base_config = load_config(require_base())
    name = "clover-smol-ar" if args.attention == "causal" else "clover-smol"
    config = adapted_config(base_config, args.attention, args.block_size or recipe.block_size,
                            args.attention == "block" and not args.own_token, name)
    teacher = smol_teacher(args, config)  # flags checked before the data is made
    verifier = smol_verifier(args, config)
    sources = _adapter_digests(args)  # read now: the named directories may be replaced later
    out = Path(args.out or f"models/{name}")
    work = Path(args.work_dir or f"runs/train/{out.name}")
    steps = args.steps or recipe.steps
    train_cfg = TrainConfig(
        steps=steps, batch_size=args.batch_size or recipe.batch_size,
        micro_batch_size=args.micro_batch_size or recipe.micro_batch_size, lr=args.lr or recipe.lr,
        warmup_steps=min(recipe.warmup_steps, steps // 10), weight_decay=0.0,
        prefix_grad=args.prefix_grad, complementary=args.complementary,
        suffix_masks=args.suffix_masks, seed=args.seed, device=args.device, bf16=args.bf16,
        work_dir=str(work), sharpen_coef=args.sharpen, ar_coef=args.ar_mix, resume=args.resume,
        distill_coef=args.distill_coef,
        stop_after=args.stop_after, eval_every=args.eval_every, save_every=args.save_every or 20,
        log_every=1,
        progress=args.progress)
    tokenizer = smol_tokenizer(config)
    num_train = train_cfg.steps * train_cfg.batch_size
    train = smol_sft(tokenizer, generate_examples("train", num_train, seed=args.seed),
                     ack_share=args.ack_share, seed=args.seed)
    val_examples = generate_examples("validation", recipe.num_val, seed=args.seed)
    num_eval = recipe.num_eval if args.eval_examples is None else args.eval_examples
    val_data = smol_sft(tokenizer, val_examples)
    evaluate = task_evaluator(tokenizer, val_examples[:num_eval], val_data, args, recipe, config)
    model, peft_config = smol_model(config, args.lora_rank, args.init_adapter,
                                    args.train_mask_row, args.mask_init)
    trainer = Trainer(model, train, train_cfg, val_data=val_data, tokenizer=tokenizer,
                      evaluate=evaluate, teacher=teacher, verifier=verifier)
    summary = trainer.fit()
    if DistEnv.from_environ().is_main and trainer.state.step >= train_cfg.steps:
        info = (_info(args, recipe, config, train_cfg, trainer, summary) | sources
                | {"ack_rows_seen": _ack_rows_seen(train_cfg, trainer, num_train)})
        adapter.save_adapter(trainer.model.cpu(), config, peft_config, tokenizer, out,
                             base={"base": BASE_NAME, "gguf_sha256": GGUF_SHA256,
                                   "mask_token": _mask_row_note(config, args.train_mask_row)},
                             extra={"training.json": json.dumps(info, indent=2) + "\n"})
        summary["out"] = str(out)
    trainer.close()
    return summary


def smol_teacher(args, config: ModelConfig):
    """The AR adapter named by --distill-from, merged (None without it); flags checked."""
    if bool(args.distill_from) != bool(args.distill_coef):
        raise ValueError(f"--distill-from {args.distill_from} --distill-coef "
                         f"{args.distill_coef}: give both")
    return _ar_model("--distill-from", args.distill_from, config)


def smol_verifier(args, config: ModelConfig):
    """The AR adapter named by --verifier (the drafter of self-speculative decoding reads its
    clean keys: `clover.train.draft`), merged; None without it."""
    if args.verifier and (args.distill_from or args.complementary or args.suffix_masks != 1):
        raise ValueError(f"--verifier {args.verifier}: drafts train on suffix masks "
                         "(--suffix-masks 1), without --distill-from or --complementary-masks")
    return _ar_model("--verifier", args.verifier, config)


def _ar_model(flag: str, path: str | None, config: ModelConfig):
    """A causal adapter model of the base vocabulary, merged, for a block-diffusion model."""
    if not path:
        return None
    if config.attention != "block":
        raise ValueError(f"{flag}: the model trained must be a block-diffusion model")
    try:
        model = adapter.load_adapter_model(path)
    except (adapter.CheckpointError, FileNotFoundError) as e:
        raise ValueError(f"{flag} {path}: {e}") from e
    if model.config.attention != "causal" or model.config.vocab_size != config.mask_id:
        raise ValueError(f"{flag} {path}: not a causal model of the base vocabulary "
                         f"({model.config.attention}, {model.config.vocab_size} tokens)")
    return model


def _mask_row_note(config: ModelConfig, trained: bool) -> str | None:
    if config.attention == "causal":
        return None
    return ("appended row = mean of the base embeddings" + (
        ", then trained (stored in the adapter as trainable tokens)" if trained else ""))


def _adapter_digests(args) -> dict[str, str]:
    """SHA-256 of the adapter weights that --init-adapter, --distill-from and --verifier name, as
    this process read them: the directories (`models/...`) are replaced when a new stage ships."""
    out = {}
    for key, path in (("init_adapter", args.init_adapter), ("distill_from", args.distill_from),
                      ("verifier", args.verifier)):
        if path:
            out[f"{key}_sha256"] = sha256(Path(path) / adapter.ADAPTER_WEIGHTS)
    return out


def _ack_rows_seen(cfg: TrainConfig, trainer: Trainer, first_rows: int) -> int:
    """How many of the rows the run drew were second-turn rows (`smol_sft` appends them after
    the `first_rows` first-turn rows)."""
    from clover.train.data import step_indices

    rows = len(trainer.train_data)
    return sum(i >= first_rows for step in range(trainer.state.step)
               for i in step_indices(step, cfg.batch_size, rows, cfg.seed))


def _info(args, recipe, config: ModelConfig, cfg: TrainConfig, trainer: Trainer,
          summary: dict) -> dict[str, Any]:
    return {
        "recipe": recipe.name, "base": BASE_NAME, "attention": config.attention,
        "block_size": config.block_size, "shift_logits": config.shift_logits,
        "lora_rank": args.lora_rank, "init_adapter": args.init_adapter, "seed": args.seed,
        "lr": cfg.lr, "sharpen": args.sharpen, "ar_mix": args.ar_mix,
        "distill_from": args.distill_from, "distill_coef": args.distill_coef,
        "verifier": args.verifier,
        "micro_batch_size": cfg.micro_batch_size, "prefix_grad": cfg.prefix_grad,
        "complementary_masks": cfg.complementary, "suffix_masks": cfg.suffix_masks,
        "train_mask_row": args.train_mask_row, "mask_init": args.mask_init,
        "ack_share": args.ack_share,
        "train_rows": len(trainer.train_data),
        "steps": trainer.state.step, "batch_size": cfg.batch_size,
        "examples_seen": trainer.state.step * cfg.batch_size,
        "tokens_seen": trainer.state.tokens_seen, "wall_time_s": round(trainer.state.wall_s, 1),
        "device": str(trainer.device), "processes": trainer.env.world,
        "torch": torch.__version__, "machine": platform.machine(),
        "threads": torch.get_num_threads(), "final_metrics": summary,
        "train_config": asdict(cfg), "date": time.strftime("%Y-%m-%d"),
    }
