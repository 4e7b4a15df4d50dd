"""The Clover model: one transformer with three attention modes, dense or MoE feed-forward."""

from clover.model.moe import MoEStats
from clover.model.transformer import CloverModel, KVCache, ModelOutput, build_model

__all__ = ["CloverModel", "KVCache", "ModelOutput", "MoEStats", "build_model"]
