"""Fused projections for inference: linear layers that read the same input, run as one matmul.

`FusedLinears.fuse(owner, names)` copies the weights (and biases) of `owner.<name>` into one
[sum of outputs, in] tensor and re-points each layer's parameters at its rows. Memory stays the
same, the state dict (keys and values) is unchanged, and in-place updates (`load_state_dict`,
an optimizer step) reach the fused tensor too. `weight()` hands the fused tensor out only while
every layer is still the same module viewing it; `.to(dtype)`, assigning new parameters, a
quantized weight or a wrapper (LoRA) break the link and callers fall back to the separate
layers, which stay the reference. Only plain `nn.Linear`s with plain tensors fuse, and the fused
path is for inference: under autograd the separate layers run (gradients reach them directly).
"""

# Shapes: O fused outputs, I inputs

from __future__ import annotations

import torch
from torch import Tensor, nn


class FusedLinears:
    """One [O, I] weight (and [O] bias) whose row blocks are several `nn.Linear`s' parameters."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], weight_OI: Tensor,
                 bias_O: Tensor | None) -> None:
        self.owner, self.names = owner, names
        self.linears = [getattr(owner, n) for n in names]
        self.weight_OI, self.bias_O = weight_OI, bias_O
        self.sizes = [lin.out_features for lin in self.linears]
        self._ptrs = self._pointers()

    @classmethod
    def fuse(cls, owner: nn.Module, names: tuple[str, ...]) -> FusedLinears | None:
        """Fuse owner's linears in place (None when they cannot be fused)."""
        linears = [getattr(owner, n) for n in names]
        if not all(_plain(lin) for lin in linears):
            return None
        if len({(lin.bias is None) for lin in linears}) != 1:
            return None
        weight_OI = _stack_into([lin.weight for lin in linears])
        bias_O = None if linears[0].bias is None else _stack_into([lin.bias for lin in linears])
        return cls(owner, names, weight_OI, bias_O)

    def weight(self) -> tuple[Tensor, Tensor | None] | None:
        """(weight_OI, bias_O) while every layer still views them, and autograd is off."""
        if torch.is_grad_enabled() or self._pointers() != self._ptrs:
            return None
        return self.weight_OI, self.bias_O

    def _pointers(self) -> tuple | None:
        if any(getattr(self.owner, n) is not lin
               for n, lin in zip(self.names, self.linears, strict=True)):
            return None
        try:
            return tuple((lin.weight.data_ptr(), None if lin.bias is None else lin.bias.data_ptr())
                         for lin in self.linears)
        except RuntimeError:  # a weight without storage (a quantized tensor subclass)
            return None


def _plain(lin: nn.Module) -> bool:
    params = [lin.weight] if getattr(lin, "bias", None) is None else [lin.weight, lin.bias]
    return type(lin) is nn.Linear and all(type(p.data) is Tensor for p in params)


@torch.no_grad()
def _stack_into(params: list[nn.Parameter]) -> Tensor:
    """Concatenate along dim 0 and make each parameter a view of its block of the result."""
    fused = torch.cat([p.data for p in params])
    start = 0
    for p in params:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused
