"""`TrainConfig`: one training run's settings (typed, validated), the LR schedule and the optimizer.

No torch.distributed and no model code here: the loop, the parallel strategies and the recipes all
read these fields, and `clover train` flags map onto them through `RunArgs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

PARALLEL_MODES = ("ddp", "fsdp")


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
    distill_coef: float = 0.0  # block diffusion: weight of the KL to a teacher's next token
    prefix_grad: bool = True  # False: the shared prompt prefix runs under no_grad (cheaper)
    complementary: bool = False  # block diffusion: a second view masked where the first is not
    suffix_masks: float = 0.0  # block diffusion: share of blocks masked as a suffix (training
    # only; validation keeps masks anywhere in the block, comparable across runs)
    eval_every: int = 0  # validation loss (and the evaluate hook) every N steps; 0: at the end
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    log_every: int = 10
    device: str = "auto"
    parallel: str = "ddp"  # ddp: whole model per process; fsdp: FSDP2, sharded per block
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
            (self.distill_coef >= 0, "distill_coef", "must be >= 0"),
            (0 <= self.suffix_masks <= 1, "suffix_masks", "must be in [0, 1]"),
            (self.log_every >= 1, "log_every", "must be >= 1"),
            (self.parallel in PARALLEL_MODES, "parallel", f"must be one of {PARALLEL_MODES}"),
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
