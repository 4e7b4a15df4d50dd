"""Small layers every Clover model shares: RMSNorm, rotary position embeddings (RoPE), and the
embedding / tied head of a model training a few embedding rows (PEFT trainable tokens)."""

# Shapes: B batch, L tokens, H heads, Dh head dim, R rotary frequencies

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.config import ModelConfig


def rms_norm(x: Tensor, weight: Tensor, eps: float, row_sum=None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, normalised in fp32 (one fused op when x is fp32).

    In a low-precision model the normalised x is rounded to its dtype before the weight scales
    it, as transformers' Llama / Qwen norms do, so bf16 greedy decodes match theirs.
    `row_sum`: sums the fp32 squares over the last dim in place of ATen's mean (the compiled
    graph's `aten_row_sum`, which adds in ATen's order: the same bits)."""
    if row_sum is None:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight.float(), eps)
        return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight.to(x.dtype)
    h = x.float()
    h = h * torch.rsqrt(row_sum(h.pow(2))[..., None] / h.shape[-1] + eps)
    return h * weight.float() if x.dtype == torch.float32 else h.to(x.dtype) * weight.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rotary(nn.Module):
    """RoPE on the first `rotary_dim` dims of each head (rotate-half layout, as in LLaMA/Qwen)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.rotary_dim = config.rotary_dim
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64, device="cpu")
        # Kept out of the state dict and out of .to(dtype): frequencies stay fp32 in bf16 models.
        self._inv_freq = (config.rope_theta ** -(exponent / self.rotary_dim)).float()
        self._on_device: dict[torch.device, Tensor] = {}

    def inv_freq(self, device: torch.device) -> Tensor:
        if device not in self._on_device:
            self._on_device[device] = self._inv_freq.to(device)
        return self._on_device[device]

    def cos_sin(self, pos_BL: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of every position's angles, [B, L, 1, rotary] (broadcast over heads)."""
        # R = rotary_dim / 2 frequencies
        angles_BLR = pos_BL[..., None].float() * self.inv_freq(pos_BL.device)
        angles_BLR = torch.cat([angles_BLR, angles_BLR], dim=-1)[:, :, None]
        return angles_BLR.cos().to(dtype), angles_BLR.sin().to(dtype)

    def apply(self, x_BLHD: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x * cos + rotate_half(x) * sin on the first rotary_dim dims of each head."""
        if self.rotary_dim == x_BLHD.shape[-1]:
            return x_BLHD * cos + _rotate_half(x_BLHD) * sin
        rot, rest = x_BLHD[..., :self.rotary_dim], x_BLHD[..., self.rotary_dim:]
        return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _trained_rows(embed: nn.Module) -> tuple[Tensor, list[int], Tensor] | None:
    """(the frozen base embedding [V, D], the trained rows' token ids, those rows [n, D]) when
    `embed` is PEFT's trainable-tokens wrapper with one active adapter, unmerged (a LoRA run
    that trains the mask row); else None."""
    adapter = getattr(embed, "token_adapter", None)
    if (adapter is None or adapter.merged or adapter.disable_adapters
            or len(adapter.active_adapters) != 1):
        return None
    name = adapter.active_adapters[0]
    return (adapter.base_layer.weight, adapter.token_indices[name],
            adapter.trainable_tokens_delta[name])


def embed_tokens(embed: nn.Module, ids_BL: Tensor) -> Tensor:
    """`embed(ids_BL)`. With trained rows (`_trained_rows`): the frozen table's rows, and the
    trained ones where their tokens are, the same values as PEFT's lookup in its merged table
    without copying the [V, D] table (nor building its gradient) each forward."""
    rows = _trained_rows(embed)
    if rows is None:
        return embed(ids_BL)
    base, tokens, delta = rows
    x_BLD = F.embedding(ids_BL, base)
    for j, token in enumerate(tokens):
        x_BLD = torch.where((ids_BL == token)[..., None], delta[j].to(x_BLD.dtype), x_BLD)
    return x_BLD


def tied_head(embed: nn.Module, h: Tensor) -> Tensor:
    """Logits of a head tied to `embed`: h @ weight.T. With trained rows: the frozen table's
    logits with the trained rows' columns put in (h @ rows.T), as PEFT's merged table gives,
    so backward makes no [V, D] gradient for a table only n rows of which train."""
    rows = _trained_rows(embed)
    if rows is None:
        return h @ embed.weight.T
    base, tokens, delta = rows
    logits = h @ base.T
    index = torch.tensor(tokens, device=logits.device)
    return logits.index_copy(-1, index, (h @ delta.T).to(logits.dtype))
