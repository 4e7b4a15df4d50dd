"""Training checkpoints in `work_dir/checkpoint`, written atomically, in one of two formats:

- full (DDP): a model directory (config.json, model.safetensors, tokenizer) plus `optimizer.pt`,
  written by the main process; it loads as a model (`--init-from`) as it is.
- sharded (FSDP2): config.json, tokenizer and the trainer state beside `sharded/`, a
  torch.distributed.checkpoint directory that every rank writes its shards into; it loads at any
  world size (DCP reshards on load), sharded or not.

Both hold `trainer_state.json` (step, tokens, losses, log history). This module moves bytes; the
loop decides when.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clover import checkpoint
from clover.model import CloverModel
from clover.train.distributed import DistEnv, barrier

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SHARDED_DIR = "sharded"
RNG_FILE = "rng.pt"


@dataclass
class TrainState:
    """What a checkpoint restores beside weights and optimizer (JSON, in the model directory)."""

    step: int = 0
    tokens_seen: int = 0
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)  # training loss of every step so far
    history: list[dict] = field(default_factory=list)  # logged metrics (log.jsonl lines)


def write(work_dir: Path, model: CloverModel, optimizer: torch.optim.Optimizer, tokenizer: Any,
          state_json: str, env: DistEnv, *, sharded: bool) -> Path:
    """Write work_dir/checkpoint (every rank calls this; the swap into place is atomic)."""
    path, tmp = work_dir / CHECKPOINT_DIR, work_dir / f".{CHECKPOINT_DIR}.tmp"
    if sharded:
        _write_sharded(tmp, model, optimizer, tokenizer, state_json, env)
    elif env.is_main:
        checkpoint.save(model, tokenizer, tmp, extra={STATE_FILE: state_json})
        torch.save({"optimizer": optimizer.state_dict(), "rng_cpu": torch.get_rng_state()},
                   tmp / OPTIMIZER_FILE)
    if env.is_main:
        checkpoint.replace_dir(tmp, path)
    barrier(env)
    return path


def _write_sharded(tmp: Path, model: CloverModel, optimizer: torch.optim.Optimizer,
                   tokenizer: Any, state_json: str, env: DistEnv) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(env)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _one_process_quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp / SHARDED_DIR)
    if env.is_main:
        model.config.save(tmp / checkpoint.CONFIG_FILE)
        if tokenizer is not None:
            from clover.tokenizer import save_tokenizer
            save_tokenizer(tokenizer, tmp)
        (tmp / STATE_FILE).write_text(state_json)
        torch.save({"rng_cpu": torch.get_rng_state()}, tmp / RNG_FILE)


def saved_state(path: Path) -> dict[str, Any] | None:
    """The trainer_state.json of a checkpoint directory, or None when there is none."""
    file = path / STATE_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def read(path: Path, model: CloverModel, optimizer: torch.optim.Optimizer,
         device: torch.device, *, sharded: bool) -> None:
    """Load weights, optimizer state and the RNG from `path` into the (sharded or plain) model."""
    if (path / SHARDED_DIR).is_dir():
        return _read_sharded(path, model, optimizer)
    if sharded:
        raise ValueError(f"--resume: {path} is a full (--parallel ddp) checkpoint; resume it with "
                         "--parallel ddp, or start a new work directory")
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / checkpoint.WEIGHTS_FILE), device=str(device)),
                          strict=True)
    opt = torch.load(path / OPTIMIZER_FILE, map_location=device, weights_only=True)
    optimizer.load_state_dict(opt["optimizer"])
    torch.set_rng_state(opt["rng_cpu"])


def _read_sharded(path: Path, model: CloverModel, optimizer: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=path / SHARDED_DIR)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    rng = torch.load(path / RNG_FILE, weights_only=True)
    torch.set_rng_state(rng["rng_cpu"])


@contextlib.contextmanager
def _one_process_quiet():
    """DCP warns on every save and load without a process group; one process is a supported
    case here (a sharded checkpoint resumed at world size 1), so say nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
