"""Fast linear layers for inference: fused projections and oneDNN-prepacked weights (bf16, fp32).

`FastLinear.build(owner, names)` takes linear layers that read the same input (q/k/v, gate/up,
or one layer alone), copies their weights (and biases) into one [sum of outputs, in] tensor and
re-points each layer's parameters at its rows: memory stays the same, the state dict (keys and
values) is unchanged, and in-place updates reach the fused tensor too. With `pack=True` (CPU,
bf16 or fp32) it also keeps a oneDNN-prepacked copy of that weight, used for inputs of at most
`PACKED_MAX_TOKENS` tokens in bf16 (over the whole batch): 1.4-2.9x faster than `F.linear` (same
result) for the bf16 matrix-vector products of 30 SmolLM2 layers on an AVX-512 BF16 CPU without
AMX, on a noisy shared machine. The threshold was 16 until a quiet run on the same kind of CPU
(session 40, 2 threads, SmolLM2's 30 layers of linears, median of 7) measured the packed call
faster at every size from 1 to 128 tokens (17 tokens: 9.7-10.1 against 13.4-16.6 ms; 32: 13.4-14.0
against 17.4-21.7; 64: 23.0 against 35.0), bit for bit the same result; 32 covers the 17-token
forward that starts each 8-token block of a shifted block-diffusion decode (it re-feeds the block
just completed) and a batch of 2-3 such rows, which cost 42.5 ms per forward of clover-smol at
16 and 33.8 ms at 32. An earlier run once measured 64 tokens slower packed, so it stops at 32.
The packed copy costs the weight's memory once more. oneDNN packs bf16 only on CPUs with
AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT (`bf16_packing_supported`); elsewhere (an AVX2-only CPU)
the fused plain weights serve every bf16 size.
fp32 CPU weights are prepacked too (session 45, a 2-vCPU AMD EPYC with AVX2 only, 2 threads,
SmolLM2's 30 layers of linears and its head, median of 5): 1.20x `F.linear` at 1 token, 1.5-1.9x
at 2-64 tokens (8 tokens: 124.5 against 219.6 ms), 1.2-1.5x at 128-512; results within 4e-6 of
`F.linear` (not bit for bit: another summation order); used up to 512 tokens, the largest size
measured.

`__call__` returns None, and callers run the separate layers (the reference), unless every
layer is still the same plain module with the same, unmodified parameters, and autograd is off:
`.to(dtype)`, assigned parameters, an in-place update (for the packed copy), a quantized weight
or a wrapper (LoRA) all fall back. The tied LM head is an `nn.Embedding`'s weight used as one.
"""

# Shapes: O fused outputs, I inputs

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACKED_MAX_TOKENS = 32  # bf16
FP32_PACKED_MAX_TOKENS = 512


@functools.cache
def bf16_packing_supported() -> bool:
    """Whether oneDNN can prepack a bf16 weight on this CPU (its reorder raises otherwise)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def fp32_packing_supported() -> bool:
    """Whether this torch build has oneDNN's fp32 linear (it does on x86 CPUs)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), 1)
    except RuntimeError:
        return False
    return True


def packing_supported(dtype: torch.dtype) -> bool:
    """Whether a CPU weight of `dtype` gets a oneDNN-prepacked copy."""
    if dtype == torch.bfloat16:
        return bf16_packing_supported()
    return dtype == torch.float32 and fp32_packing_supported()


class FastLinear:
    """One [O, I] weight (and [O] bias) whose row blocks are several layers' parameters."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...], weight_OI: Tensor,
                 bias_O: Tensor | None, pack: bool) -> None:
        self.owner, self.names = owner, names
        self.layers = [getattr(owner, n) for n in names]
        self.weight_OI, self.bias_O = weight_OI, bias_O
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight_OI, 1) if pack else None
        self.max_packed = weight_OI.shape[1] * (
            FP32_PACKED_MAX_TOKENS if weight_OI.dtype == torch.float32 else PACKED_MAX_TOKENS)
        self._state = self._identity()

    @classmethod
    def build(cls, owner: nn.Module, names: tuple[str, ...], pack: bool = False
              ) -> FastLinear | None:
        """Fuse owner's layers in place (None when they cannot be fused)."""
        layers = [getattr(owner, n) for n in names]
        if not all(_plain(m) for m in layers) or len({_bias(m) is None for m in layers}) != 1:
            return None
        if len(layers) == 1:
            weight_OI, bias_O = layers[0].weight.data, _bias(layers[0])
        else:
            weight_OI = _stack_into([m.weight for m in layers])
            bias_O = None if _bias(layers[0]) is None else _stack_into([m.bias for m in layers])
        pack = pack and weight_OI.device.type == "cpu" and packing_supported(weight_OI.dtype)
        fast = cls(owner, names, weight_OI, None if bias_O is None else bias_O.data, pack)
        return fast if fast._state is not None else None

    def __call__(self, x: Tensor) -> Tensor | None:
        """x @ weight.T + bias, or None when the reference layers must run instead."""
        if torch.is_grad_enabled() or self._identity() != self._state:
            return None  # (_state is never None: `build` checks it)
        if self.packed is not None and x.numel() <= self.max_packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias_O, "none", [], "")
        return F.linear(x, self.weight_OI, self.bias_O)

    def first_rows(self, x: Tensor, n: int) -> Tensor | None:
        """Only the first `n` outputs, x @ weight[:n].T + bias[:n], from the plain weight's first
        rows (a view: no copy), where the prepacked weight would not be used anyway (an input
        over `max_packed`, or none kept); else, or when the reference layers must run, None."""
        if self.packed is not None and x.numel() <= self.max_packed:
            return None
        if torch.is_grad_enabled() or self._identity() != self._state:
            return None
        return F.linear(x, self.weight_OI[:n], None if self.bias_O is None else self.bias_O[:n])

    def _identity(self) -> tuple | None:
        """Which modules and parameter versions the fused (and packed) weights were built from."""
        if any(getattr(self.owner, n) is not m
               for n, m in zip(self.names, self.layers, strict=True)):
            return None
        try:
            return tuple((p.data_ptr(), p._version) for m in self.layers
                         for p in (m.weight, _bias(m)) if p is not None)
        except RuntimeError:  # a weight without storage (a quantized tensor subclass)
            return None


def _bias(module: nn.Module) -> Tensor | None:
    return getattr(module, "bias", None)


def _plain(module: nn.Module) -> bool:
    if type(module) not in (nn.Linear, nn.Embedding):
        return False  # a wrapper (LoRA, a routed linear)
    return all(type(p.data) is Tensor for p in (module.weight, _bias(module)) if p is not None)


@torch.no_grad()
def _stack_into(params: list[nn.Parameter]) -> Tensor:
    """Concatenate along dim 0 and make each parameter a view of its block of the result."""
    fused = torch.cat([p.data for p in params])
    start = 0
    for p in params:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


def linear(fast: FastLinear | None, x: Tensor, reference: nn.Module) -> Tensor:
    """The fast layer's output when it can run, else the reference layer's."""
    out = fast(x) if fast is not None else None
    return reference(x) if out is None else out
