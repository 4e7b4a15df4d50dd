"""Small layers every Clover model shares: RMSNorm and rotary position embeddings (RoPE)."""

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
