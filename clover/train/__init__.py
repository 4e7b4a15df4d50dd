"""Training: data and collation, objectives per attention mode, the loop (resume, DDP).

`Trainer(model, examples, TrainConfig(...)).fit()` is the library entry point. This package knows
no task: the recipes that train the shipped models live with their task
(`clover.tasks.airspace.recipes`, `clover train --recipe airspace-smol`).
"""

from clover.train.data import Batch, Collator, TokenExample, sft_example
from clover.train.loop import TrainConfig, Trainer, default_collator, lr_at
from clover.train.objectives import (
    OBJECTIVES,
    batch_noise,
    block_diffusion,
    block_diffusion_reference,
    causal,
    full_diffusion,
)

__all__ = ["OBJECTIVES", "Batch", "Collator", "TokenExample", "TrainConfig", "Trainer",
           "batch_noise", "block_diffusion", "block_diffusion_reference", "causal",
           "default_collator", "full_diffusion", "lr_at", "sft_example"]
