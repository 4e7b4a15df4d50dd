"""The airspace task's recipes: named, reproducible training runs that end in a model directory.

`airspace-smol` (clover.tasks.airspace.smol) adapts the embedded SmolLM2 base with LoRA: the
shipped pair. `airspace-tiny` trains a from-scratch `clover-tiny` (block diffusion) or
`clover-tiny-ar` (causal): a tokenizer from the task's training text (vocab = the preset's), SFT
examples from the task's generator (prompt = chat template with tools, never masked; response =
the assistant's tool calls + EOS), the loop in `clover.train.loop`, then `training.json` +
README.md beside the weights. `--init-from` starts from another model directory's weights.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from clover import checkpoint
from clover.config import ModelConfig, get_preset
from clover.model import CloverModel, build_model
from clover.tasks.airspace.data import ANSWER_MAX_TOKENS
from clover.tasks.airspace.evaluators import task_evaluator
from clover.tokenizer import PROMPT_FORMATS
from clover.train import DistEnv, TrainConfig, Trainer
from clover.train.data import TokenExample, sft_example

SPECIAL_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|eos|>")


@dataclass(kw_only=True)
class Recipe:
    name: str
    preset: str
    steps: int
    batch_size: int
    micro_batch_size: int = 0
    lr: float = 2e-3
    warmup_steps: int = 30
    num_val: int = 48  # validation examples (loss with fixed noise)
    num_eval: int = 16  # examples decoded and scored at the end (needs clover.engine)
    eval_max_tokens: int = ANSWER_MAX_TOKENS  # no right answer is cut
    tokenizer_examples: int = 3000  # training examples the tokenizer is trained on
    base: str | None = None  # adapt the embedded pretrained base with LoRA (no tokenizer training)
    block_size: int = 8  # diffusion block size for base recipes
    description: str = ""


RECIPES: dict[str, Recipe] = {
    "airspace-tiny": Recipe(
        name="airspace-tiny", preset="clover-tiny", steps=1600, batch_size=8,
        description="clover-tiny on the airspace task: the AR twin in ~45 min on 2 CPU cores "
                    "(torchrun, 2 processes); the diffusion model adapts its step-1400 checkpoint "
                    "with --init-from, --steps 200"),
    "airspace-smol": Recipe(
        name="airspace-smol", preset="smollm2-135m-instruct", base="smollm2-135m-instruct",
        steps=150, batch_size=8, micro_batch_size=2, lr=1e-3, warmup_steps=10, num_val=16,
        num_eval=0,
        eval_max_tokens=320,
        description="SmolLM2-135M-Instruct + LoRA on the airspace task: --attention causal is "
                    "clover-smol-ar, --attention block (shifted, block 8, --init-adapter the AR "
                    "twin) is clover-smol"),
}


# ---- data ---------------------------------------------------------------------------------------

def chat_texts(examples: list) -> list[str]:
    """Full rendered-conversation text for tokenizer training, role markers removed."""
    from clover.tasks.airspace import SYSTEM_PROMPT, TOOLS, assistant_text

    tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS)
    texts = [SYSTEM_PROMPT + "\n<tools>\n" + tools + "\n</tools>"]
    for ex in examples:
        texts += [text for text, _ in ex.history] + [ex.text, assistant_text(ex.calls)]
    return texts


def build_tokenizer(vocab_size: int, num_examples: int, seed: int):
    """Byte-level BPE trained on the task's training split (messages, tool calls, tools)."""
    from clover.tasks.airspace import generate_examples
    from clover.tokenizer import train_tokenizer

    texts = chat_texts(generate_examples("train", num_examples, seed=10_000 + seed))
    return train_tokenizer(texts, vocab_size=vocab_size)


def airspace_sft(tokenizer, examples: list) -> list[TokenExample]:
    """Prompt = chat template (system, tools, history, user) + `<|assistant|>`; response = the
    assistant turn exactly as the template renders it (tool calls, then EOS)."""
    from clover.tasks.airspace import TOOLS
    from clover.tokenizer import render_chat

    out = []
    for ex in examples:
        messages = ex.messages(tools=True)
        prompt = render_chat(tokenizer, messages[:-1], TOOLS, add_generation_prompt=True,
                             fixed_task_prompt=True)
        full = render_chat(tokenizer, messages, TOOLS, add_generation_prompt=False,
                           fixed_task_prompt=True)
        assert full.startswith(prompt), "chat template: prompt is not a prefix of the chat"
        out.append(sft_example(tokenizer.encode(prompt), tokenizer.encode(full[len(prompt):])))
    return out


def with_prompt_loss(example: TokenExample) -> TokenExample:
    """The same sequence with every token a target: the prompt gets a language-model loss too.

    SFT spends the forward over the prompt on no target at all. With the message as a target the
    model also learns from the repeats inside messages (dates, times and numbers written twice),
    which is where induction (copy) heads come from in language-model training.
    """
    return TokenExample(example.ids, 0)


COPY_INSTRUCTION = "Repeat the start of this message word for word.\n"


def copy_task(tokenizer, examples: list, max_tokens: int = 64) -> list[TokenExample]:
    """Repeat examples that teach copying (induction heads) on the task's own text.

    Rendered like the task's prompts (same system turn and tools where the template shows them, so
    the shared-prefix speed-up still applies); the user turn is `COPY_INSTRUCTION` + a message;
    the response is the message's first `max_tokens` tokens + EOS. Every target is a copy from
    the context, against ~25 copied digits in a tool call.
    """
    from clover.tasks.airspace import SYSTEM_PROMPT, TOOLS
    from clover.tokenizer import render_chat

    out = []
    for ex in examples:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": COPY_INSTRUCTION + ex.text}]
        prompt = render_chat(tokenizer, messages, TOOLS, add_generation_prompt=True,
                             fixed_task_prompt=True)
        answer = tokenizer.encode(ex.text)[:max_tokens] + [tokenizer.eos_token_id]
        out.append(sft_example(tokenizer.encode(prompt), answer))
    return out


def copy_consistency(tokenizer, examples: list) -> dict[str, Any]:
    """Does each copied value (centre, zone id) tokenize the same in the message and in the JSON?

    A value that splits differently in the two places forces the model to learn two spellings of
    every copy. A value counts as the same when the tool call has token edges exactly at the
    value's ends and that token run also occurs in the message's tokens.
    """
    checked = same = 0
    bad: list[str] = []
    for ex in examples:
        message_ids = tokenizer.encode(ex.text)
        for call in ex.calls:
            for key in ("centre", "zone_id"):
                value = call["arguments"].get(key)
                if not isinstance(value, str) or value not in ex.text:
                    continue
                checked += 1
                body = json.dumps(call["arguments"], ensure_ascii=False)
                quoted = json.dumps(value, ensure_ascii=False)[1:-1]  # as spelled in the JSON
                run = _token_run(tokenizer, body, body.index(quoted), len(quoted))
                if run is not None and _contains(message_ids, run):
                    same += 1
                elif len(bad) < 5:
                    bad.append(value)
    return {"values_checked": checked, "same_tokens": same, "examples_differing": bad}


def _token_run(tokenizer, text: str, start: int, length: int) -> list[int] | None:
    """Token ids covering text[start:start + length] exactly, or None if no token edge is there."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    first = [i for i, (a, _) in enumerate(spans) if a == start]
    last = [i for i, (_, b) in enumerate(spans) if b == start + length]
    if not first or not last or last[0] < first[0]:
        return None
    return ids[first[0]:last[0] + 1]


def _contains(seq: list[int], sub: list[int]) -> bool:
    n = len(sub)
    return any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


# ---- model --------------------------------------------------------------------------------------

def recipe_config(recipe: Recipe, attention: str, shift_logits: bool = False,
                  overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The recipe's preset for this attention, with `--set` overrides of its fields."""
    if attention == "causal":
        config = get_preset(recipe.preset, name=f"{recipe.preset}-ar", attention="causal",
                            block_size=1)
    else:
        config = get_preset(recipe.preset, attention=attention, shift_logits=shift_logits)
    if not overrides:
        return config
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    fixed = {"attention", "shift_logits"}  # the --attention and --shift-logits flags own these
    for key in overrides:
        if key not in known or key in fixed:
            raise ValueError(f"--set {key}=...: not a model config field you can set here; "
                             f"choose from {sorted(known - fixed)}")
    try:
        return config.replace(**overrides)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--set {overrides}: {e}") from e


def init_model(config: ModelConfig, init_from: str | None, seed: int) -> CloverModel:
    """Fresh weights, or another model directory's (shapes must match; attention may differ)."""
    model = build_model(config, seed=seed)
    if init_from:
        source = checkpoint.load_model(init_from)
        mismatched = [k for k, v in source.state_dict().items()
                      if model.state_dict()[k].shape != v.shape]
        if mismatched:
            raise ValueError(f"--init-from {init_from}: shapes differ from {config.name} "
                             f"(first: {mismatched[0]}); initialise from the same preset")
        model.load_state_dict(source.state_dict(), strict=True)
    return model


# ---- the run ------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class RunArgs:
    recipe: str = "airspace-tiny"
    attention: str = "block"
    init_from: str | None = None
    out: str | None = None
    work_dir: str | None = None
    steps: int | None = None
    batch_size: int | None = None
    resume: bool = False
    stop_after: int | None = None  # checkpoint and stop here (a planned split of the run)
    device: str = "auto"
    parallel: str = "ddp"  # ddp | fsdp (FSDP2, sharded checkpoints)
    seed: int = 0
    bf16: bool = False
    eval_examples: int | None = None
    progress: bool = True
    lr: float | None = None
    shift_logits: bool = False
    own_token: bool = False  # base recipes, diffusion: predict a position from its own logits
    sharpen: float = 0.0
    ar_mix: float = 0.0  # diffusion: weight of the next-token loss under a causal mask
    save_dtype: str = "float32"  # dtype of the final model directory's weights
    copy_mix: float = 0.0  # share of training examples that are the repeat task (`copy_task`)
    prompt_loss: bool = False  # the prompt is a target too (language-model loss on the message)
    prompt_format: str = "chat"  # chat: system turn + tools; message: the conversation alone
    config_overrides: dict[str, Any] = field(default_factory=dict)  # --set KEY=VALUE
    lora_rank: int = 32  # base recipes: LoRA rank
    block_size: int | None = None  # base recipes: diffusion block size (default: the recipe's)
    init_adapter: str | None = None  # base recipes: start the LoRA from this adapter directory
    train_mask_row: bool = False  # base recipes, diffusion: the <|mask|> row trains too
    mask_init: str = "mean"  # base recipes, diffusion: the <|mask|> row's start (mean | random)
    save_every: int | None = None  # checkpoint every N steps (default: the recipe's)
    micro_batch_size: int | None = None  # examples per forward (default: the recipe's)
    prefix_grad: bool = True  # False: the shared prompt prefix runs without gradient
    complementary: bool = False  # block diffusion: add the complementary masked view
    suffix_masks: float = 0.0  # block diffusion: share of blocks masked as a suffix
    eval_every: int = 0  # evaluate every N steps (0: at the end only)
    calibration_examples: int = 0  # validation replies probed teacher-forced at each evaluation
    distill_from: str | None = None  # base recipes, diffusion: the AR teacher's adapter directory
    distill_coef: float = 0.0  # weight of the KL to the teacher's next-token distribution
    verifier: str | None = None  # base recipes, block: train a drafter on this AR model's keys
    ack_share: float = 0.0  # base recipes: share of calling examples that add a second-turn row


def _check_args(args: RunArgs, recipe: Recipe) -> None:
    """Flag values a from-scratch recipe cannot use; the error names the flag."""
    if args.prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format={args.prompt_format!r}: use one of "
                         f"{', '.join(PROMPT_FORMATS)}")
    if args.ar_mix < 0 or (args.ar_mix and args.attention == "causal"):
        raise ValueError(f"--ar-mix={args.ar_mix}: must be >= 0, and only for diffusion "
                         f"models (--attention block or full; got {args.attention})")
    if args.distill_from or args.distill_coef or args.verifier:
        raise ValueError("--distill-from / --distill-coef / --verifier: only base recipes "
                         "(airspace-smol)")
    if args.ack_share:
        raise ValueError("--ack-share: only base recipes (airspace-smol)")
    if args.mask_init != "mean":
        raise ValueError("--mask-init: only base recipes (airspace-smol)")
    if args.own_token:
        raise ValueError("--own-token: only base recipes (airspace-smol; from-scratch recipes "
                         "predict their own token unless --shift-logits)")
    if not 0.0 <= args.copy_mix <= 1.0:
        raise ValueError(f"--copy-mix={args.copy_mix} must be in [0, 1]")
    if args.eval_every < 0 or args.calibration_examples < 0:
        raise ValueError(f"--eval-every={args.eval_every}, --calibration-examples="
                         f"{args.calibration_examples}: must be >= 0")
    steps = args.steps or recipe.steps
    if args.stop_after is not None and not 0 < args.stop_after < steps:
        raise ValueError(f"--stop-after={args.stop_after} must be a step in 1..{steps - 1} "
                         f"(--steps is {steps})")


def run_recipe(args: RunArgs) -> dict[str, Any]:
    """Tokenizer, data, model, training, and the final model directory (rank 0 writes it)."""
    from clover.tasks.airspace import generate_examples

    if args.recipe not in RECIPES:
        raise ValueError(f"unknown recipe {args.recipe!r}; choose one of {sorted(RECIPES)}")
    recipe = RECIPES[args.recipe]
    for flag, value in (("--complementary-masks", args.complementary),
                        ("--suffix-masks", args.suffix_masks)):
        if value and args.attention != "block" or not 0 <= value <= 1:
            raise ValueError(f"{flag}={value}: only for --attention block ({args.attention}), "
                             "in [0, 1]")
    if recipe.base and args.parallel != "ddp":
        raise ValueError(f"--parallel {args.parallel}: the LoRA recipe {recipe.name} trains with "
                         "--parallel ddp only")
    if recipe.base:
        from clover.tasks.airspace.smol import run_smol

        return run_smol(args, recipe)
    _check_args(args, recipe)
    config = recipe_config(recipe, args.attention, args.shift_logits, args.config_overrides)
    out = Path(args.out or f"models/{config.name}")
    work = Path(args.work_dir or f"runs/train/{out.name}")
    train_cfg = TrainConfig(
        steps=args.steps or recipe.steps, batch_size=args.batch_size or recipe.batch_size,
        micro_batch_size=args.micro_batch_size or recipe.micro_batch_size, lr=args.lr or recipe.lr,
        warmup_steps=min(recipe.warmup_steps, (args.steps or recipe.steps) // 10),
        seed=args.seed, device=args.device, parallel=args.parallel, bf16=args.bf16,
        prefix_grad=args.prefix_grad, complementary=args.complementary, work_dir=str(work),
        suffix_masks=args.suffix_masks, sharpen_coef=args.sharpen, ar_coef=args.ar_mix,
        resume=args.resume, stop_after=args.stop_after, eval_every=args.eval_every, save_every=25,
        log_every=5, progress=args.progress)
    tokenizer = _tokenizer(args, config, recipe, work)
    num_train = train_cfg.steps * train_cfg.batch_size
    drawn = generate_examples("train", num_train, seed=args.seed)
    num_copy = round(args.copy_mix * num_train)
    train = (airspace_sft(tokenizer, drawn[:num_train - num_copy])
             + copy_task(tokenizer, drawn[num_train - num_copy:]))
    if args.prompt_loss:
        train = [with_prompt_loss(ex) for ex in train]
    val_examples = generate_examples("validation", recipe.num_val, seed=args.seed)
    num_eval = recipe.num_eval if args.eval_examples is None else args.eval_examples
    val_data = airspace_sft(tokenizer, val_examples)
    evaluate = task_evaluator(tokenizer, val_examples[:num_eval], val_data, args, recipe, config)
    model = init_model(config, args.init_from, args.seed)
    trainer = Trainer(model, train, train_cfg, val_data=val_data, tokenizer=tokenizer,
                      evaluate=evaluate)
    summary = trainer.fit()
    if trainer.state.step >= train_cfg.steps:  # every rank exports (FSDP2 gathers the weights)
        info = _training_info(args, recipe, train_cfg, trainer, summary, tokenizer)
        trainer.export(out, extra={
            "training.json": json.dumps(info, indent=2) + "\n",
            "README.md": _readme(config, info)}, dtype=getattr(torch, args.save_dtype))
        summary["out"] = str(out)
    trainer.close()
    return summary


def _tokenizer(args: RunArgs, config: ModelConfig, recipe: Recipe, work: Path):
    """The init model's tokenizer, the one saved in the work dir (resume), or a new one."""
    from clover.tokenizer import load_tokenizer, save_tokenizer

    if args.init_from:  # the prompt format travels with the model's chat template
        return load_tokenizer(args.init_from)
    saved = work / "tokenizer"
    if args.resume and (saved / "tokenizer.json").is_file():
        return load_tokenizer(saved)  # (building is deterministic too; this is just faster)
    tok = build_tokenizer(config.vocab_size, recipe.tokenizer_examples, args.seed)
    tok.chat_template = PROMPT_FORMATS[args.prompt_format]
    if DistEnv.from_environ().is_main:
        save_tokenizer(tok, saved)
    return tok


def prompt_format(tokenizer) -> str:
    """Which of `PROMPT_FORMATS` a tokenizer's chat template is ("custom" if none)."""
    return next((k for k, v in PROMPT_FORMATS.items() if v == tokenizer.chat_template), "custom")


def _training_info(args: RunArgs, recipe: Recipe, cfg: TrainConfig, trainer: Trainer,
                   summary: dict, tokenizer) -> dict[str, Any]:
    from clover.tasks.airspace import generate_examples

    sample = generate_examples("validation", 200, seed=args.seed)
    return {
        "recipe": recipe.name, "attention": args.attention, "init_from": args.init_from,
        "seed": args.seed, "lr": cfg.lr, "shift_logits": args.shift_logits,
        "sharpen": args.sharpen, "ar_mix": args.ar_mix, "copy_mix": args.copy_mix,
        "prompt_loss": args.prompt_loss, "complementary_masks": args.complementary,
        "suffix_masks": args.suffix_masks, "config_overrides": args.config_overrides,
        "prompt_format": prompt_format(tokenizer), "save_dtype": args.save_dtype,
        "steps": trainer.state.step, "batch_size": cfg.batch_size,
        "tokens_seen": trainer.state.tokens_seen, "wall_time_s": round(trainer.state.wall_s, 1),
        "device": str(trainer.device), "processes": trainer.env.world,
        "torch": torch.__version__, "machine": platform.machine(),
        "threads": torch.get_num_threads(), "final_metrics": summary,
        "train_config": asdict(cfg), "copy_consistency": copy_consistency(tokenizer, sample),
        "date": time.strftime("%Y-%m-%d"),
    }


def _readme(config: ModelConfig, info: dict[str, Any]) -> str:
    m = info["final_metrics"]
    rows = "\n".join(f"| {k} | {v} |" for k, v in m.items() if not isinstance(v, dict))
    loss = ("loss on the prompt and the response = tool calls + EOS" if info.get("prompt_loss")
            else "SFT: prompt never masked, response = tool calls + EOS")
    about = (f"Clover {config.attention}-attention MoE ({config.num_experts} experts, "
             f"top-{config.num_experts_per_tok}, dim {config.dim}, {config.num_layers} layers, "
             f"block size {config.block_size}"
             + (f", token conv {config.token_conv}" if config.token_conv else "")
             + f") trained with the `{info['recipe']}` recipe on the airspace-restriction task "
             + f"({loss}).")
    return f"""# {config.name}

{about}

    clover train --recipe {info['recipe']} --attention {config.attention} --seed {info['seed']}

{info['steps']} steps x {info['batch_size']} examples, {info['tokens_seen']:,} tokens,
{info['wall_time_s']} s on {info['device']} ({info['threads']} threads, torch {info['torch']}).

| metric | value |
|---|---|
{rows}
"""
