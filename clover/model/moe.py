"""Mixture-of-Experts feed-forward: router, grouped experts, and a slow reference.

`MoE.forward` routes each token to `num_experts_per_tok` experts (softmax top-k, or sigmoid scores
plus a non-learned expert bias as in LLaDA2.x / DeepSeek-V3), runs the experts on contiguous
groups of tokens sorted by expert, adds the shared experts, and returns routing statistics.
`reference_moe` computes the same function with a plain loop over experts and tokens; a test keeps
the two in agreement. Nothing here knows about attention, caching or diffusion.
"""

# Shapes: N tokens, D dim, F expert hidden, E experts, K experts per token

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.model.fused import FastLinear, linear


@dataclass
class RouterOutput:
    experts_NK: Tensor  # chosen expert ids
    weights_NK: Tensor  # combine weights (after renorm and routed scaling)
    probs_NE: Tensor  # router scores used for the load-balance loss
    sigmoid: bool = False  # scores are independent sigmoids, not a distribution over experts


@dataclass
class MoEStats:
    """Per-forward routing statistics, one entry per MoE layer (stacked by the model)."""

    aux_loss: Tensor  # scalar: sum over MoE layers of E * sum_e f_e * P_e (Switch-style)
    counts_LE: Tensor  # tokens routed to each expert, per MoE layer (valid tokens only)

    @property
    def unique_experts(self) -> Tensor:
        """Experts touched by at least one token in this forward, per MoE layer."""
        return (self.counts_LE > 0).sum(-1)


class SwiGLU(nn.Module):
    """Dense gated FFN: down(silu(gate(x)) * up(x)); gate and up as one matmul once fused."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        # set by `fuse` (inference only; see clover/model/fused.py)
        self.gate_up_fast: FastLinear | None = None
        self.down_fast: FastLinear | None = None

    def fuse(self, enabled: bool = True, pack: bool = False) -> None:
        self.gate_up_fast = FastLinear.build(self, ("gate_proj", "up_proj"), pack) if enabled \
            else None
        self.down_fast = FastLinear.build(self, ("down_proj",), pack) if enabled else None

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_fast(x) if self.gate_up_fast is not None else None
        if gate_up is None:  # the reference
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = gate_up.chunk(2, dim=-1)  # no autograd here: in place is safe
        return linear(self.down_fast, F.silu(gate, inplace=True).mul_(up), self.down_proj)


class Router(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.router
        self.top_k = config.num_experts_per_tok
        self.renorm = config.router_renorm
        self.scaling = config.routed_scaling
        self.gate = nn.Linear(config.dim, config.num_experts, bias=False)
        # Load-balancing bias for the sigmoid router: shifts selection only, never the weights.
        # Updated by the training loop (not by gradients), saved with the model.
        self.register_buffer("expert_bias", torch.zeros(config.num_experts), persistent=True)

    def forward(self, x_ND: Tensor) -> RouterOutput:
        logits_NE = self.gate(x_ND).float()
        if self.kind == "sigmoid":
            probs_NE = torch.sigmoid(logits_NE)
            chosen_NK = torch.topk(probs_NE + self.expert_bias, self.top_k, dim=-1).indices
        else:
            probs_NE = torch.softmax(logits_NE, dim=-1)
            chosen_NK = torch.topk(probs_NE, self.top_k, dim=-1).indices
        weights_NK = probs_NE.gather(-1, chosen_NK)
        if self.renorm:
            weights_NK = weights_NK / weights_NK.sum(-1, keepdim=True).clamp_min(1e-20)
        return RouterOutput(chosen_NK, weights_NK * self.scaling, probs_NE, self.kind == "sigmoid")


class Experts(nn.Module):
    """E SwiGLU experts stored as stacked weights, so they can be grouped or sharded."""

    def __init__(self, num_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.up_proj = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, hidden))

    def one(self, e: int, x_ND: Tensor) -> Tensor:
        h_NF = F.silu(x_ND @ self.gate_proj[e].T) * (x_ND @ self.up_proj[e].T)
        return h_NF @ self.down_proj[e].T


class MoE(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.router = Router(config)
        self.experts = Experts(config.num_experts, config.dim, config.expert_ffn_dim)
        self.shared = None
        if config.num_shared_experts:
            hidden = config.expert_ffn_dim * config.num_shared_experts
            self.shared = SwiGLU(config.dim, hidden)

    def forward(self, x_ND: Tensor, valid_N: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(output_ND, aux_loss, counts_E); padding tokens (valid_N False) are not counted."""
        route = self.router(x_ND)
        out_ND = grouped_experts(self.experts, x_ND, route.experts_NK, route.weights_NK)
        if self.shared is not None:
            out_ND = out_ND + self.shared(x_ND)
        aux, counts_E = load_balance(route, self.num_experts, valid_N)
        return out_ND, aux, counts_E


def grouped_experts(experts: Experts, x_ND: Tensor, experts_NK: Tensor,
                    weights_NK: Tensor) -> Tensor:
    """Sort the N*K (token, expert) pairs by expert and run each expert once on its group."""
    top_k = experts_NK.shape[1]
    flat_expert = experts_NK.reshape(-1)
    order = torch.argsort(flat_expert, stable=True)
    token_of = order // top_k  # which token each sorted pair belongs to
    counts = torch.bincount(flat_expert, minlength=experts.gate_proj.shape[0]).tolist()
    x_sorted = x_ND[token_of]
    outs, start = [], 0
    for e, count in enumerate(counts):
        if count:
            outs.append(experts.one(e, x_sorted[start:start + count]))
        start += count
    y_sorted = torch.cat(outs) if outs else x_sorted[:0]
    y_sorted = y_sorted * weights_NK.reshape(-1)[order, None].to(y_sorted.dtype)
    out_ND = torch.zeros_like(x_ND)
    return out_ND.index_add_(0, token_of, y_sorted.to(out_ND.dtype))


def load_balance(route: RouterOutput, num_experts: int,
                 valid_N: Tensor | None) -> tuple[Tensor, Tensor]:
    """Switch-Transformer auxiliary loss E * sum_e f_e * P_e and per-expert token counts.

    f_e is the fraction of routed (token, slot) pairs sent to expert e, P_e the mean router
    probability of e; both over valid tokens. The loss is 1 for perfectly uniform routing.
    """
    experts_NK, probs_NE = route.experts_NK, route.probs_NE
    if valid_N is not None:
        experts_NK, probs_NE = experts_NK[valid_N], probs_NE[valid_N]
    counts_E = torch.bincount(experts_NK.reshape(-1), minlength=num_experts)
    if experts_NK.numel() == 0 or not torch.is_grad_enabled():  # the loss is for training only
        return probs_NE.new_zeros(()), counts_E
    frac_E = counts_E.float() / experts_NK.numel()
    mean_prob_E = probs_NE.mean(0)
    if route.sigmoid:  # make the scores a distribution over experts first
        mean_prob_E = mean_prob_E / mean_prob_E.sum().clamp_min(1e-20)
    return num_experts * (frac_E * mean_prob_E).sum(), counts_E


def reference_moe(moe: MoE, x_ND: Tensor) -> Tensor:
    """Obviously correct MoE: for every token, loop over its chosen experts and sum."""
    route = moe.router(x_ND)
    out_ND = torch.zeros_like(x_ND)
    for n in range(x_ND.shape[0]):
        for slot in range(route.experts_NK.shape[1]):
            e = int(route.experts_NK[n, slot])
            y = moe.experts.one(e, x_ND[n:n + 1])[0]
            out_ND[n] += route.weights_NK[n, slot].to(y.dtype) * y
    if moe.shared is not None:
        out_ND = out_ND + moe.shared(x_ND)
    return out_ND
