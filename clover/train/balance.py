"""MoE load balancing outside the loss: expert-bias updates for sigmoid routers, and load stats.

The sigmoid router (LLaDA2.x / DeepSeek-V3) selects experts by score + bias; the bias is not
learned by gradients but nudged after every optimizer step towards the mean load:
bias_e += rate * sign(mean_load - load_e). Softmax routers use the auxiliary loss instead.
"""

# Shapes: L MoE layers, E experts

from __future__ import annotations

import torch
from torch import Tensor, nn

from clover.model.moe import Router


def routers(model: nn.Module) -> list[Router]:
    """The routers of the MoE layers, in layer order (the row order of MoEStats.counts_LE)."""
    return [m for m in model.modules() if isinstance(m, Router)]


@torch.no_grad()
def update_expert_bias(model: nn.Module, counts_LE: Tensor, rate: float) -> None:
    """bias += rate * sign(mean load - load) for every sigmoid router (others are left alone)."""
    for router, counts_E in zip(routers(model), counts_LE, strict=True):
        if router.kind != "sigmoid":
            continue
        load_E = counts_E.float().to(router.expert_bias.device)
        router.expert_bias += rate * torch.sign(load_E.mean() - load_E)


def load_stats(counts_LE: Tensor) -> dict[str, float]:
    """Collapse at a glance: worst max/mean load over layers (1 = uniform), and idle experts."""
    load_LE = counts_LE.float()
    mean_L = load_LE.mean(-1).clamp_min(1e-9)
    return {
        "moe_max_over_mean": round(float((load_LE.max(-1).values / mean_L).max()), 3),
        "moe_idle_experts": int((load_LE == 0).sum()),
    }


def load_fractions(counts_LE: Tensor) -> list[list[float]]:
    """Per-layer share of routed tokens per expert, rounded for logs."""
    frac_LE = counts_LE.float() / counts_LE.sum(-1, keepdim=True).clamp_min(1)
    return [[round(x, 4) for x in row] for row in frac_LE.tolist()]
