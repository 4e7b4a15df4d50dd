"""Training: data and collation, objectives per attention mode, the loop (resume), DDP and FSDP2
(`parallel`), checkpoints (`checkpointing`).

`Trainer(model, examples, TrainConfig(...)).fit()` is the library entry point. This package knows
no task: the recipes that train the shipped models live with their task
(`clover.tasks.airspace.recipes`, `clover train --recipe airspace-smol`).
"""

from clover.train.config import TrainConfig, lr_at
from clover.train.data import Batch, Collator, TokenExample, sft_example
from clover.train.distributed import DistEnv, close_distributed
from clover.train.loop import Trainer, default_collator
from clover.train.objectives import (
    OBJECTIVES,
    batch_noise,
    block_diffusion,
    block_diffusion_reference,
    causal,
    full_diffusion,
)

__all__ = ["OBJECTIVES", "Batch", "Collator", "DistEnv", "TokenExample", "TrainConfig", "Trainer",
           "batch_noise", "block_diffusion", "block_diffusion_reference", "causal",
           "close_distributed", "default_collator", "full_diffusion", "lr_at", "sft_example"]
