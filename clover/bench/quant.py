"""Load a model directory at a precision: fp32, bf16, or int8 weight-only (torchao).

int8 covers every matmul weight, the routed experts included: `Experts` keeps its weights as
stacked [E, F, D] tensors that no quantization library recognises, so they are first split into
per-expert `nn.Linear`s (`LinearExperts`, the same function, checked against `Experts` by a test),
then torchao's `Int8WeightOnlyConfig` (per-row scales) quantizes every linear except the routers
(they choose experts; a few thousand weights). The tied embedding / LM head stays in float.
`quantized_fraction` reports how much of the model that is. Nothing here runs a forward pass.

int4 is not offered: torchao's only CPU int4 path is a prototype (`Int4OpaqueTensor`), measured
10-80x slower than fp32 for these shapes with the torch 2.13 CPU wheel.
"""

# Shapes: N tokens, D dim, F expert hidden, E experts

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.model import CloverModel
from clover.model.moe import Experts

PRECISIONS = ("fp32", "bf16", "int8")
INT4_NOTE = ("int4 not offered: torchao's only CPU int4 path (Int4OpaqueTensor) is a prototype, "
             "and it ran 10-80x slower than fp32 on these shapes with the torch 2.13 CPU wheel")


class LinearExperts(nn.Module):
    """`Experts` as 3 x E `nn.Linear`s, so a quantization library can see every expert weight."""

    def __init__(self, experts: Experts) -> None:
        super().__init__()
        self.num_experts = experts.gate_proj.shape[0]
        self.gate = nn.ModuleList(_linear(w) for w in experts.gate_proj.detach())
        self.up = nn.ModuleList(_linear(w) for w in experts.up_proj.detach())
        self.down = nn.ModuleList(_linear(w) for w in experts.down_proj.detach())
        # grouped_experts reads the expert count from gate_proj's leading dim; an empty stand-in
        self.gate_proj = torch.empty(self.num_experts, 0, 0)

    def one(self, e: int, x_ND: Tensor) -> Tensor:
        return self.down[e](F.silu(self.gate[e](x_ND)) * self.up[e](x_ND))


def _linear(weight_OI: Tensor) -> nn.Linear:
    layer = nn.Linear(weight_OI.shape[1], weight_OI.shape[0], bias=False,
                      device=weight_OI.device, dtype=weight_OI.dtype)
    layer.weight = nn.Parameter(weight_OI.clone(), requires_grad=False)
    return layer


def split_experts(model: CloverModel) -> CloverModel:
    """Replace every stacked `Experts` by `LinearExperts` (in place; same outputs)."""
    for block in model.layers:
        if block.is_moe:
            block.ffn.experts = LinearExperts(block.ffn.experts)
    return model


@contextlib.contextmanager
def _quiet(*names: str):
    """torchao logs warnings at import about CUDA kernels a CPU build cannot load."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def torchao_version() -> str | None:
    try:
        with _quiet("torchao", "torch.utils._pytree"):
            import torchao
    except ImportError:
        return None
    return torchao.__version__


def require_torchao(flag: str) -> None:
    if torchao_version() is None:
        raise ValueError(f"{flag} int8 needs torchao: pip install -e '.[bench]'")


def quantize_int8(model: CloverModel) -> CloverModel:
    """int8 weight-only (per-row scales) on every linear but the routers; experts split first."""
    with _quiet("torchao", "torch.utils._pytree"):
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

    split_experts(model)
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False),
              filter_fn=lambda m, name: isinstance(m, nn.Linear) and "router" not in name)
    return model


def load_at(path: str, precision: str, device: torch.device) -> tuple[CloverModel, Any]:
    """(model, tokenizer) from a model directory at fp32 | bf16 | int8."""
    from clover.checkpoint import load

    _check_precision(precision)
    model, tok = load(path, device=device, dtype=activation_dtype(precision, device))
    if precision == "int8":
        quantize_int8(model)
    return model.eval(), tok


def load_model_at(path: str, precision: str, device: torch.device) -> CloverModel:
    """The model alone (no tokenizer needed) at fp32 | bf16 | int8."""
    from clover.checkpoint import load_model

    _check_precision(precision)
    model = load_model(path, device=device, dtype=activation_dtype(precision, device))
    if precision == "int8":
        quantize_int8(model)
    return model.eval()


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"--precisions: unknown precision {precision!r} "
                         f"(choose from {', '.join(PRECISIONS)}; {INT4_NOTE})")


def activation_dtype(precision: str, device: torch.device) -> torch.dtype:
    """bf16 -> bfloat16; fp32 -> float32; int8 computes in bfloat16 on CUDA and on CPUs with
    native bf16 (AVX-512 BF16 / AMX), else in float32. Measured on an AVX-512 BF16 CPU with
    torch 2.13: the int8 matmul with fp32 activations ran ~6x slower than with bf16 ones."""
    if precision == "bf16" or (precision == "int8" and native_bf16(device)):
        return torch.bfloat16
    return torch.float32


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 natively: CUDA, or a CPU with AVX-512 BF16 or AMX."""
    if device.type != "cpu":
        return device.type == "cuda"
    from clover.bench.machine import cpu_features

    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_features()["flags"]))


def native_precision(device: torch.device) -> str:
    """The precision the command-line tools take for `auto` (docs/bench.md, "CPU defaults"):
    bf16 where the hardware runs it natively (CUDA; a CPU with AVX-512 BF16 or AMX, where the
    cost table measured it 1.5x fp32 at batch 1 and 1.8x at batch 8), else fp32 (bf16 is
    emulated on AVX2-only CPUs). The Python API (`LLM`) keeps fp32 for `auto` on a CPU."""
    return "bf16" if native_bf16(device) else "fp32"


def warn_emulated_bf16(flag: str, device: str) -> None:
    """Warn on stderr that `flag` asked for bf16 on a CPU that emulates it (none where native)."""
    from clover.engine.llm import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cpu" and not native_bf16(resolved):
        print(f"warning: {flag}: bf16 is emulated on this CPU (no AVX-512 BF16 or AMX): its "
              "matrix products run several times slower than float32 (7x on a 2-vCPU AVX2-only "
              "AMD EPYC, docs/bench.md); float32 is the faster choice here", file=sys.stderr)


def cli_dtype(dtype: str, device: str) -> str:
    """`--dtype` of `clover generate / chat / serve / demo / eval`: `auto` -> `native_precision`'s
    bfloat16 or float32 on the resolved device; any other value as given (bfloat16 on a CPU
    that emulates it with a warning on stderr)."""
    from clover.engine.llm import resolve_device

    if dtype != "auto":
        if dtype in ("bfloat16", "bf16"):
            warn_emulated_bf16(f"--dtype {dtype}", device)
        return dtype
    return {"bf16": "bfloat16", "fp32": "float32"}[native_precision(resolve_device(device))]


@dataclass
class WeightReport:
    total_params: int
    quantized_params: int
    weights_bytes: int

    @property
    def quantized_fraction(self) -> float:
        return self.quantized_params / max(self.total_params, 1)

    def as_dict(self) -> dict[str, Any]:
        return {"total_params": self.total_params, "quantized_params": self.quantized_params,
                "quantized_fraction": round(self.quantized_fraction, 4),
                "weights_bytes": self.weights_bytes}


def weight_report(model: nn.Module) -> WeightReport:
    """Parameters (counted once if tied), how many are stored quantized, and their bytes."""
    total = quantized = nbytes = 0
    for p in model.parameters():
        numel, stored, is_quantized = _storage(p)
        total += numel
        nbytes += stored
        quantized += numel if is_quantized else 0
    return WeightReport(total, quantized, nbytes)


def _storage(t: Tensor) -> tuple[int, int, bool]:
    """(logical elements, bytes actually stored, stored as a quantized subclass?)."""
    data = t.data if isinstance(t, nn.Parameter) else t
    if type(data) is torch.Tensor or not hasattr(data, "__tensor_flatten__"):
        return data.numel(), data.numel() * data.element_size(), False
    names, _ = data.__tensor_flatten__()
    inner = [getattr(data, n) for n in names]
    return data.numel(), sum(_storage(i)[1] for i in inner if i is not None), True
