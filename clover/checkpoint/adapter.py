"""Adapter model directories: a LoRA delta over the embedded base, merged at load.

A shipped model that starts from SmolLM2-135M-Instruct stores only what differs from the base:
`config.json` (the adapted model: attention mode, block size, one extra vocabulary row for the
mask token), `adapter_config.json` (peft's `LoraConfig`), `adapter_model.safetensors` (the LoRA
matrices), `base.json` (which base, its checksum, how the mask row is made) and the tokenizer.
`load_adapter_model` rebuilds the base, adds the mask row the documented way
(`convert.add_mask_token`: the mean embedding), injects the LoRA layers with peft and merges them
into plain weights, so the engine sees an ordinary `CloverModel`. LoRA injection for training
(`inject_lora`) lives here too, so the same target modules are used both ways.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from clover.checkpoint.keymap import CheckpointError
from clover.config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "base.json"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def lora_config(rank: int, alpha: float | None = None, dropout: float = 0.0,
                mask_row: int | None = None):
    """peft's LoraConfig on Clover's linears; `mask_row` also trains that one embedding row (the
    diffusion model's `<|mask|>`) through peft's trainable tokens, stored as that row alone."""
    from peft import LoraConfig

    if rank < 1:
        raise ValueError(f"--lora-rank must be >= 1 (got {rank})")
    tokens = {"embed": [mask_row]} if mask_row is not None else None
    return LoraConfig(r=rank, lora_alpha=alpha or rank, lora_dropout=dropout,
                      target_modules=list(LORA_TARGETS), bias="none",
                      trainable_token_indices=tokens)


def inject_lora(model: nn.Module, config) -> nn.Module:
    """Freeze every base weight and add trainable LoRA matrices to the target linears."""
    from peft import inject_adapter_in_model

    for p in model.parameters():
        p.requires_grad_(False)
    return inject_adapter_in_model(config, model)


def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_lora_state(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Set the injected LoRA matrices from a saved adapter; every key must land."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    lora_missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or lora_missing:
        bad = (result.unexpected_keys or lora_missing)[0]
        raise CheckpointError(f"{where}: adapter key {bad!r} does not fit this model")


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA layer into its base linear and every trained embedding row into its
    embedding, and put the plain modules back."""
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import TrainableTokensWrapper

    for name, module in list(model.named_modules()):
        parent_name, _, child = name.rpartition(".")
        if isinstance(module, LoraLayer):
            module.merge()
            setattr(model.get_submodule(parent_name), child, module.get_base_layer())
        elif isinstance(module, TrainableTokensWrapper):
            plain = module.unload_and_optionally_merge_module(merge=True, safe_merge=False,
                                                              adapter_names=None)
            setattr(model.get_submodule(parent_name), child, plain)
    return model


def save_adapter(model: nn.Module, config: ModelConfig, peft_config, tokenizer, path: str | Path,
                 base: dict[str, Any], extra: dict[str, str] | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write an adapter model directory (atomically, like `checkpoint.save`)."""
    from clover.checkpoint import atomic_dir, write_extras

    with atomic_dir(path) as tmp:
        config.save(tmp / "config.json")
        state = {k: v.detach().cpu().to(dtype).contiguous() for k, v in lora_state(model).items()}
        save_file(state, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(peft_config.to_dict(), indent=2,
                                                     default=list) + "\n")
        (tmp / BASE_FILE).write_text(json.dumps(base, indent=2) + "\n")
        write_extras(tmp, tokenizer, extra)
    return Path(path)


MASK_INITS = ("mean", "random")


def base_model_for(config: ModelConfig, device="cpu", dtype: torch.dtype | None = None,
                   mask_init: str = "mean"):
    """The converted base reshaped for `config`: mask row added (`with_mask_row`) and attention
    mode set."""
    from clover.checkpoint import load_config, read_state
    from clover.checkpoint.base import require_base
    from clover.model import build_model

    base = require_base()
    base_config = load_config(base)
    state = read_state(base)
    if config.vocab_size == base_config.vocab_size + 1:
        state = with_mask_row(state, mask_init)
    elif config.vocab_size != base_config.vocab_size:
        raise CheckpointError(f"config.json: vocab_size {config.vocab_size} fits neither the base "
                              f"({base_config.vocab_size}) nor the base plus a mask token")
    model = build_model(config, device="meta")
    model.load_state_dict(state, assign=True, strict=True)
    return model.to(device=device, dtype=dtype) if dtype else model.to(device)


def with_mask_row(state: dict[str, torch.Tensor], init: str = "mean") -> dict[str, torch.Tensor]:
    """The base state with one more embedding row: the mean embedding (see add_mask_token), or
    `random`: drawn from N(0, s^2), s the standard deviation of the embedding's entries (seed 0)."""
    if init not in MASK_INITS:
        raise ValueError(f"--mask-init {init!r}: choose from {', '.join(MASK_INITS)}")

    def row(weight: torch.Tensor) -> torch.Tensor:
        if init == "mean":
            return weight.mean(0, keepdim=True)
        g = torch.Generator().manual_seed(0)
        draw = torch.randn((1, weight.shape[1]), generator=g, dtype=torch.float32)
        return (draw * weight.float().std()).to(weight.dtype)

    out = {**state, "embed.weight": torch.cat([state["embed.weight"], row(state["embed.weight"])])}
    if "lm_head.weight" in state:
        out["lm_head.weight"] = torch.cat([state["lm_head.weight"], row(state["lm_head.weight"])])
    return out


def read_adapter(path: str | Path):
    """(peft `LoraConfig`, fp32 LoRA matrices) of an adapter directory; a missing file is a
    CheckpointError naming it."""
    from peft import LoraConfig

    path = Path(path)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            raise CheckpointError(f"{path / name}: missing (not an adapter directory)")
    peft_config = LoraConfig(**{k: v for k, v in json.loads(
        (path / ADAPTER_CONFIG).read_text()).items() if k in LoraConfig.__dataclass_fields__})
    state = {k: v.float() for k, v in load_file(str(path / ADAPTER_WEIGHTS)).items()}
    return peft_config, state


def load_adapter_model(path: str | Path, device="cpu", dtype: torch.dtype | None = None):
    """Base + adapter -> a merged `CloverModel` (eval mode)."""
    from clover.checkpoint import load_config

    path = Path(path)
    config = load_config(path)
    model = base_model_for(config)
    peft_config, state = read_adapter(path)
    inject_lora(model, peft_config)
    load_lora_state(model, state, str(path / ADAPTER_WEIGHTS))
    model = merge_lora(model)
    for p in model.parameters():
        p.requires_grad_(True)
    model = model.to(device=device, dtype=dtype) if dtype else model.to(device)
    return model.eval()
