"""The training loop: AdamW with warmup + cosine, accumulation, clipping, DDP, checkpoints, resume.

`Trainer(model, examples, TrainConfig(...)).fit()` trains any Clover model with the objective of
its attention mode. Promises: the update of a step depends only on (weights, optimizer state,
seed, step), never on how the global batch is split into micro-batches or processes (losses are
normalised by the global target count); a run stopped after a checkpoint and resumed continues
with exactly the losses of an uninterrupted run. Under `torchrun` it uses torch.distributed
(gloo on CPU, NCCL on GPU); rank 0 alone writes files and prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from clover import checkpoint
from clover.engine.llm import resolve_device as engine_device
from clover.model import CloverModel
from clover.train.balance import load_fractions, load_stats, update_expert_bias
from clover.train.data import (
    Batch,
    Collator,
    TokenExample,
    chunks,
    noise_seeds,
    shard,
    step_indices,
)
from clover.train.objectives import OBJECTIVES, ObjectiveModule, batch_noise, first_target

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
LOG_FILE = "log.jsonl"

Evaluate = Callable[[CloverModel, int], dict[str, Any]]


@dataclass(kw_only=True)
class TrainConfig:
    """One training run. `batch_size` is global: examples per optimizer step over all processes."""

    steps: int = 1000
    batch_size: int = 16
    micro_batch_size: int = 0  # examples per forward per process; 0: the process's whole share
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    bf16: bool = False  # autocast matmuls to bfloat16 (weights and optimizer stay fp32)
    seed: int = 0
    aux_coef: float = 0.01  # MoE load-balance loss weight (softmax routers)
    bias_rate: float = 1e-3  # expert-bias step per update (sigmoid routers)
    noise_eps: float = 1e-3  # t ~ U[eps, 1]
    sharpen_coef: float = 0.0  # weight of the entropy on already-right targets (confidence)
    ar_coef: float = 0.0  # diffusion models: weight of a next-token loss under a causal mask
    eval_every: int = 0  # validation loss (and the evaluate hook) every N steps; 0: at the end
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    log_every: int = 10
    device: str = "auto"
    work_dir: str | None = None  # checkpoints and log.jsonl; None: keep nothing on disk
    resume: bool = False  # continue from work_dir/checkpoint if it exists
    stop_after: int | None = None  # checkpoint and stop after this step (a planned interruption)
    progress: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.steps >= 1, "steps", "must be >= 1"),
            (self.batch_size >= 1, "batch_size", "must be >= 1"),
            (self.micro_batch_size >= 0, "micro_batch_size", "must be >= 0"),
            (self.lr > 0, "lr", "must be > 0"),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]"),
            (self.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
            (self.grad_clip >= 0, "grad_clip", "must be >= 0"),
            (self.ar_coef >= 0, "ar_coef", "must be >= 0"),
            (self.log_every >= 1, "log_every", "must be >= 1"),
            (not self.resume or self.work_dir, "resume", "needs work_dir"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"TrainConfig.{name} {why} (got {getattr(self, name)!r})")


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio at `steps`."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(config.steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not norms, biases, 1-d parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2))


def default_collator(model_config, eos_fill: str | None = None) -> Collator:
    """Padding and EOS fill that match how the model decodes (blocks are filled with EOS)."""
    mode = model_config.attention
    fill = eos_fill or {"block": "block", "full": "length", "causal": "none"}[mode]
    return Collator(pad_id=model_config.pad_id, eos_id=model_config.eos_id,
                    block_size=model_config.block_size, eos_fill=fill,
                    pad_multiple=model_config.block_size if mode == "block" else 1,
                    first_target=first_target(model_config))


# ---- distributed --------------------------------------------------------------------------------

@dataclass
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK (a single process when unset)."""
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                   int(env.get("LOCAL_RANK", 0)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, env: DistEnv) -> torch.device:
    """The engine's device rule, with each process of a distributed run on its own GPU."""
    device = engine_device(name)
    return torch.device(f"cuda:{env.local_rank}") if device.type == "cuda" else device


def init_distributed(env: DistEnv, device: torch.device) -> None:
    if env.world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def close_distributed() -> None:
    """Leave the process group cleanly: wait for every rank, then destroy it.

    A rank that tears gloo down while a peer still talks to it can abort the peer
    ("terminate called without an active exception"), so all ranks meet first."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# ---- the trainer --------------------------------------------------------------------------------

@dataclass
class StepResult:
    loss: float
    aux: float
    grad_norm: float
    lr: float
    tokens: int
    counts_LE: torch.Tensor | None
    confident_entropy: float = 0.0  # mean over all targets of the sharpening term
    ar_loss: float | None = None  # mean next-token loss of the AR term (ar_coef > 0)


@dataclass
class TrainState:
    """What a checkpoint restores beside weights and optimizer (JSON, in the model directory)."""

    step: int = 0
    tokens_seen: int = 0
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)  # training loss of every step so far
    history: list[dict] = field(default_factory=list)  # logged metrics (log.jsonl lines)


class Trainer:
    def __init__(self, model: CloverModel, train_data: Sequence[TokenExample],
                 config: TrainConfig, *, val_data: Sequence[TokenExample] = (),
                 collator: Collator | None = None, tokenizer: Any | None = None,
                 evaluate: Evaluate | None = None) -> None:
        if not train_data:
            raise ValueError("no training examples")
        self.config, self.train_data, self.val_data = config, train_data, val_data
        self.env = DistEnv.from_environ()
        self.device = resolve_device(config.device, self.env)
        init_distributed(self.env, self.device)
        torch.manual_seed(config.seed)
        self.model = model.to(self.device).train()
        self.model_config = model.config
        self.collator = collator or default_collator(model.config)
        self.objective = OBJECTIVES[model.config.attention]
        self.tokenizer, self.evaluate = tokenizer, evaluate
        self.optimizer = make_optimizer(self.model, config)
        self.state = TrainState()
        self.work_dir = Path(config.work_dir) if config.work_dir else None
        if config.resume:
            self._resume()
        if config.ar_coef and model.config.attention == "causal":
            raise ValueError("ar_coef adds a next-token loss to a diffusion objective; this "
                             "model is causal already")
        self.net = self._wrap(ObjectiveModule(self.model, self.objective, config.ar_coef))

    def _wrap(self, module: ObjectiveModule) -> nn.Module:
        if self.env.world == 1:
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        # Experts that get no token on one rank have no gradient there: DDP must look for them.
        return nn.parallel.DistributedDataParallel(
            module, device_ids=ids, find_unused_parameters=self.model_config.is_moe)

    @property
    def per_rank(self) -> int:
        if self.config.batch_size % self.env.world:
            raise ValueError(f"batch_size={self.config.batch_size} must be divisible by the "
                             f"number of processes ({self.env.world})")
        return self.config.batch_size // self.env.world

    # ---- one step ----
    def micro_batches(self, step: int) -> list[Batch]:
        """This process's micro-batches of the global batch at `step` (data and noise seeds)."""
        cfg = self.config
        idx = step_indices(step, cfg.batch_size, len(self.train_data), cfg.seed)
        slots = shard(range(cfg.batch_size), self.env.rank, self.env.world)
        size = cfg.micro_batch_size or self.per_rank
        return [self.collator([self.train_data[idx[k]] for k in m],
                              noise_seeds(cfg.seed, step, m)).to(self.device)
                for m in chunks(slots, size)]

    def train_step(self) -> StepResult:
        cfg, env = self.config, self.env
        batches = self.micro_batches(self.state.step)
        totals = torch.tensor([sum(b.num_targets for b in batches),
                               sum(b.num_tokens for b in batches)], dtype=torch.float64)
        num_targets, num_tokens = all_reduce_sum(totals, env).tolist()
        lr = lr_at(self.state.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum, aux_sum, ent_sum, ar_sum, counts = self._accumulate(batches, num_targets)
        grad_norm = self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums = all_reduce_sum(torch.tensor([loss_sum, aux_sum, ent_sum, ar_sum],
                                           dtype=torch.float64), env)
        if counts is not None:
            counts = all_reduce_sum(counts, env)
            if cfg.bias_rate:
                update_expert_bias(self.model, counts, cfg.bias_rate)
        return StepResult(float(sums[0]) / num_targets, float(sums[1]) / (env.world * len(batches)),
                          grad_norm, lr, int(num_tokens), counts, float(sums[2]) / num_targets,
                          float(sums[3]) / num_targets if cfg.ar_coef else None)

    def _accumulate(self, batches: list[Batch], num_targets: float):
        """Forward + backward every micro-batch; gradients add up to d(global mean loss)."""
        cfg, world = self.config, self.env.world
        loss_sum = aux_sum = ent_sum = ar_sum = 0.0
        counts = None
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or world == 1 else self.net.no_sync()
            with sync:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                    noise = batch_noise(batch, self.model_config, cfg.noise_eps)
                    out = self.net(batch, noise)
                # DDP averages gradients over processes: scale by world to get their sum.
                loss = out.loss_sum * (world / num_targets)
                if out.confident_entropy_sum is not None:
                    ent_sum += float(out.confident_entropy_sum.detach())
                    if cfg.sharpen_coef:
                        loss = loss + cfg.sharpen_coef * out.confident_entropy_sum * (
                            world / num_targets)
                if out.ar_sum is not None:
                    ar_sum += float(out.ar_sum.detach())
                    loss = loss + cfg.ar_coef * out.ar_sum * (world / num_targets)
                if out.moe is not None:
                    aux = out.moe.aux_loss
                    loss = loss + cfg.aux_coef * aux / len(batches)
                    aux_sum += float(aux.detach())
                    c = out.moe.counts_LE.detach().to("cpu", torch.float64)
                    counts = c if counts is None else counts + c
                loss.backward()
            loss_sum += float(out.loss_sum.detach())
        return loss_sum, aux_sum, ent_sum, ar_sum, counts

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.grad_clip or float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    # ---- validation ----
    @torch.no_grad()
    def validate(self) -> float | None:
        """Mean target loss over the validation set, with fixed noise (comparable across steps)."""
        if not self.val_data:
            return None
        cfg, env = self.config, self.env
        slots = list(range(env.rank, len(self.val_data), env.world))
        size = cfg.micro_batch_size or self.per_rank
        sums = torch.zeros(2, dtype=torch.float64)
        for m in chunks(slots, size):
            batch = self.collator([self.val_data[k] for k in m],
                                  noise_seeds(cfg.seed, -1, m)).to(self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                out = self.objective(self.model, self.model_config, batch,
                                     batch_noise(batch, self.model_config, cfg.noise_eps))
            sums += torch.tensor([float(out.loss_sum), batch.num_targets], dtype=torch.float64)
        sums = all_reduce_sum(sums, env)
        return float(sums[0] / sums[1].clamp_min(1))

    def run_evaluation(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        val = self.validate()
        if val is not None:
            metrics["val_loss"] = round(val, 5)
        if self.evaluate is not None and self.env.is_main:
            self.model.eval()
            with torch.no_grad():
                metrics.update(self.evaluate(self.model, self.state.step))
            self.model.train()
        return metrics

    # ---- the run ----
    def fit(self) -> dict[str, Any]:
        """Train to config.steps (or stop_after); checkpoint; return the final metrics."""
        cfg, st = self.config, self.state
        display = _Display(cfg, self.env.is_main, start_step=st.step)
        t0, tokens0, last_eval = time.perf_counter(), st.tokens_seen, {}
        mark = t0  # wall time up to `mark` is already in st.wall_s
        with display:
            while st.step < cfg.steps:
                result = self.train_step()
                st.step += 1
                st.tokens_seen += result.tokens
                st.losses.append(result.loss)
                tok_s = (st.tokens_seen - tokens0) / max(time.perf_counter() - t0, 1e-9)
                display.update(st.step, result.loss, tok_s)
                entry = None
                if st.step % cfg.log_every == 0 or st.step == cfg.steps:
                    entry = self._log_entry(result, tok_s)
                if cfg.eval_every and st.step % cfg.eval_every == 0:
                    last_eval = self.run_evaluation()
                    entry = {**(entry or self._log_entry(result, tok_s)), **last_eval}
                if entry is not None:
                    self._log(entry, display)
                stop = cfg.stop_after is not None and st.step >= cfg.stop_after
                if (cfg.save_every and st.step % cfg.save_every == 0) or stop:
                    self.save(elapsed_since=mark)
                    mark = time.perf_counter()
                if stop:
                    return self.summary(last_eval)
        if not cfg.eval_every or st.step % cfg.eval_every:
            last_eval = self.run_evaluation()
            if last_eval:
                self._log({"step": st.step, **last_eval}, display)
        self.save(elapsed_since=mark)
        return self.summary(last_eval)

    def _log_entry(self, r: StepResult, tok_s: float) -> dict[str, Any]:
        entry = {"step": self.state.step, "loss": round(r.loss, 5), "lr": r.lr,
                 "grad_norm": round(r.grad_norm, 4), "tok_s": round(tok_s, 1),
                 "tokens_seen": self.state.tokens_seen,
                 "confident_entropy": round(r.confident_entropy, 5)}
        if r.ar_loss is not None:
            entry["ar_loss"] = round(r.ar_loss, 5)
        if r.counts_LE is not None:
            entry.update(aux=round(r.aux, 4), **load_stats(r.counts_LE),
                         moe_load=load_fractions(r.counts_LE))
        return entry

    def _log(self, entry: dict[str, Any], display: _Display) -> None:
        self.state.history.append(entry)
        display.log(entry)
        if self.work_dir is not None and self.env.is_main:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            with open(self.work_dir / LOG_FILE, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def summary(self, last_eval: dict[str, Any]) -> dict[str, Any]:
        st = self.state
        tail = st.losses[-10:]
        return {"steps": st.step, "tokens_seen": st.tokens_seen, "wall_s": round(st.wall_s, 1),
                "train_loss": round(sum(tail) / len(tail), 5) if tail else None,
                "tok_s": round(st.tokens_seen / max(st.wall_s, 1e-9), 1), **last_eval}

    # ---- checkpoints ----
    def save(self, elapsed_since: float | None = None) -> Path | None:
        """Write work_dir/checkpoint atomically: model directory + trainer state + optimizer."""
        if elapsed_since is not None:
            self.state.wall_s += time.perf_counter() - elapsed_since
        if self.work_dir is None:
            return None
        path = self.work_dir / CHECKPOINT_DIR
        if self.env.is_main:
            tmp = self.work_dir / f".{CHECKPOINT_DIR}.tmp"
            extra = {STATE_FILE: json.dumps({"train_config": asdict(self.config),
                                             **asdict(self.state)}, indent=1)}
            checkpoint.save(self.model, self.tokenizer, tmp, extra=extra)
            torch.save({"optimizer": self.optimizer.state_dict(),
                        "rng_cpu": torch.get_rng_state()}, tmp / OPTIMIZER_FILE)
            checkpoint.replace_dir(tmp, path)
        if self.env.world > 1:
            dist.barrier()
        return path

    def _resume(self) -> None:
        path = self.work_dir / CHECKPOINT_DIR
        if not (path / STATE_FILE).is_file():
            if self.env.is_main:
                print(f"resume: no checkpoint in {path}; starting from step 0")
            return
        saved = json.loads((path / STATE_FILE).read_text())
        self._check_compatible(saved["train_config"], checkpoint.load_config(path))
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(str(path / checkpoint.WEIGHTS_FILE),
                                             device=str(self.device)), strict=True)
        opt = torch.load(path / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(opt["optimizer"])
        torch.set_rng_state(opt["rng_cpu"])
        self.state = TrainState(**{k: saved[k] for k in asdict(TrainState())})
        if self.env.is_main:  # drop log lines written after the checkpoint (the killed tail)
            lines = "".join(json.dumps(e) + "\n" for e in self.state.history)
            (self.work_dir / LOG_FILE).write_text(lines)

    def _check_compatible(self, saved: dict[str, Any], model_config) -> None:
        """Data order and the model must match, or the resumed run is a different run."""
        for name in ("seed", "batch_size"):
            if saved[name] != getattr(self.config, name):
                raise ValueError(f"--resume: checkpoint has {name}={saved[name]}, this run "
                                 f"{getattr(self.config, name)}; use the same value or a new "
                                 "work directory")
        if model_config.to_dict() != self.model_config.to_dict():
            raise ValueError("--resume: the checkpoint's config.json differs from this model's "
                             "config; use a new work directory")


class _Display:
    """Log lines on the main process; plus a rich progress bar (loss, tokens/s, ETA) when stderr
    is a terminal and config.progress is set."""

    def __init__(self, config: TrainConfig, enabled: bool, start_step: int) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = Console(stderr=True)
        self.progress = None
        if enabled and config.progress and self.console.is_terminal:
            self.progress = _rich_progress(self.console)
            self.task = self.progress.add_task("train", total=config.steps, completed=start_step,
                                               loss=float("nan"), tok_s=0.0)

    def __enter__(self) -> _Display:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, tok_s: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=loss, tok_s=tok_s)

    def log(self, entry: dict[str, Any]) -> None:
        if not self.enabled:
            return
        shown = {k: v for k, v in entry.items() if k not in ("moe_load", "lr", "tokens_seen")}
        self.console.print(" ".join(f"{k}={v}" for k, v in shown.items()), highlight=False,
                           soft_wrap=True)


def _rich_progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"),
                    TextColumn("{task.fields[tok_s]:,.0f} tok/s"), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console)
