"""The Clover model: one transformer with three attention modes, dense or MoE feed-forward; and
the DiffusionGemma model (clover/model/gemma.py) that `config.arch` selects."""

from __future__ import annotations

import torch

from clover.config import ModelConfig
from clover.model.moe import MoEStats
from clover.model.transformer import CloverModel, KVCache, ModelOutput, init_weights

__all__ = ["CloverModel", "KVCache", "ModelOutput", "MoEStats", "build_model"]


def build_model(config: ModelConfig, *, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, seed: int | None = 0) -> CloverModel:
    """A freshly initialised model (seeded), or an empty shell when device is 'meta'.
    `config.arch` picks the class: Clover's own, or DiffusionGemma's (clover/model/gemma.py)."""
    init = init_weights
    with torch.device(device):
        if config.arch == "diffusion_gemma":
            from clover.model import gemma

            model, init = gemma.DiffusionGemmaModel(config), gemma.init_weights
        else:
            model = CloverModel(config)
    if str(device) != "meta":
        if seed is not None:
            torch.manual_seed(seed)
        init(model)
    return model.to(dtype=dtype)
