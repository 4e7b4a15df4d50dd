"""A compiled cached forward: the whole layer stack of a dense model as one inductor graph.

Eager PyTorch spends about as long launching a decode step's ~800 small ops (norms, rotations,
cache writes, views) as it does streaming the weights through its matrix-vector products. On
SmolLM2-135M in bf16 at batch 1 (2 threads, AMX), compiling the embedding, the layers, the final
norm and the LM head into one graph takes a decode step from 31.4 to 15.3 ms, 63% of the
weight-bandwidth roofline (docs/bench.md). What the graph does:
- weights frozen in as constants; each matmul shape runs inductor's C++ GEMM template (AMX
  micro-kernels) or oneDNN's prepacked matmul, whichever was faster when timed at compile time;
- a C++ wrapper runs the kernels, with no Python between them;
- the RMSNorm's mean of squares is summed in ATen's order with plain adds (`aten_row_sum`), so it
  rounds as eager's does with no call out of the graph (ATen's mean, called from the wrapper,
  where that order does not hold: `_inductor`); silu is inductor's exact-eager decomposition.

`CompiledForward.build(model)` returns None for what it does not cover (MoE layers, token
convolution, q/k norms, partial rotation, canvas models, logit soft-capping); `CloverModel.forward`
uses it only for cached, unpadded, no-grad forwards with the mode's own visibility, and runs the
eager layers (the reference) otherwise. The cache write, the visibility mask and the choice of
positions needing logits stay in eager code shared with the reference, so both read the same
slots. The results are eager's bit for bit on this machine (`emulate_precision_casts`, cos/sin
from eager, `_residual`, `aten_row_sum`; the AMX GEMM template gave oneDNN's bits in every check);
tests/test_compiled.py checks logits, keys and tokens.

Weights are baked in at compile time: `CompiledForward` records each parameter's storage and
version, and refuses to run (eager takes over) once any has changed (a merged adapter, `.to`).
Compiling and timing the GEMM choices takes three to five minutes for SmolLM2's 30 layers on
two cores (286 s the first time the unrolled sums' kernels went through the C++ compiler, 176 s
for the graph before them, whose kernels inductor had on disk), paid on the first forward of each
batch shape class; `--compile` turns it on (off by default: a short job does not earn it back).
"""

# Shapes: B batch, L new tokens, S key slots, D dim, H query heads, G kv heads, Dh head dim,
# N positions needing logits, V vocab

from __future__ import annotations

import functools
import logging
import operator
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.model.fused import PACKED_MAX_TOKENS, bf16_packing_supported
from clover.model.layers import rms_norm
from clover.model.moe import SwiGLU

# Freezing (weights as constants, prepacked) must be on while dynamo traces, before the backend
# runs (patched inside `_inductor` no GEMM template was chosen): it is patched around each call
# (`CompiledForward._freezing`, one patch object reused).
INDUCTOR_OPTIONS = {
    "cpp_wrapper": True, "emulate_precision_casts": True,
    # each matmul shape: inductor's C++ GEMM template (AMX micro-kernels here) or oneDNN's,
    # whichever is faster when timed at compile time
    "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
    # no timing table, nor a stats line, per matmul shape on stderr
    "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False,
    # the cache's key does not see the lowerings replaced below (`_inductor`)
    "fx_graph_cache": False}
# Inductor's own mean kernel sums in another order than ATen's: on 8192 rows of SmolLM2's width
# 2945 fp32 means differed in the last bit, and 3 of the bf16 norms after them. Such a flip
# once made clover-smol-ar's logits leave eager's at the 76th new token of a test message
# (layer 28's keys first), its greedy tokens at the 103rd. The graph sums in ATen's order
# (`aten_row_sum`, below); where that order does not hold, inductor calls ATen's mean from its
# C++ wrapper instead (a boxed call, ~10 us each), as eager does. (Silu was also called until
# inductor's own decomposition, x / (1 + exp(-x)), was checked to give eager's bits.)
ATEN_KERNELS = (torch.ops.aten.mean.dim,)
# ATen's fp32 row sum (SumKernel.cpp, `cascade_sum`; its AVX2 kernel, which AVX-512 machines
# also run): 8-lane vectors, four interleaved vector sums chunked in levels of 16, the four
# added in turn, then the 8 lanes one by one. `aten_row_sum` writes that order as plain adds, so
# the graph's norms sum as eager's do with no ATen call (one cost ~10 us per norm, 61 per step);
# `CompiledForward.build` checks the order against torch.sum first and calls ATen's mean when
# it does not hold.
SUM_LANES, SUM_ILP, SUM_LEVELS = 8, 4, 4


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return b if a is None else a if b is None else a + b


def _chunked(rows: list[Tensor]) -> Tensor:
    """The sum of `rows` in `multi_row_sum`'s order: running sums of 16, added into a running
    sum of those (and of 256 ... when there are that many), the sums of levels added last."""
    power = max(4, (len(rows) - 1).bit_length() // SUM_LEVELS if len(rows) > 2 else 0)
    step, mask = 1 << power, (1 << power) - 1
    acc: list[Tensor | None] = [None] * SUM_LEVELS
    i = 0
    while i + step <= len(rows):
        for _ in range(step):
            acc[0] = _add(acc[0], rows[i])
            i += 1
        for j in range(1, SUM_LEVELS):
            acc[j], acc[j - 1] = _add(acc[j], acc[j - 1]), None
            if i & (mask << (j * power)):
                break
    for row in rows[i:]:
        acc[0] = _add(acc[0], row)
    return functools.reduce(_add, acc)


def aten_row_sum(x_RD: Tensor) -> Tensor:
    """x.sum(-1) for fp32 rows of at least 8, added in ATen's order (same bits): the row as
    vectors of SUM_LANES, vector i into running sum i % SUM_ILP (`_chunked`, the SUM_ILP sums
    side by side as one tensor), the SUM_ILP sums added in turn, leftover vectors into the
    first, leftover elements, then the lanes one by one."""
    D = x_RD.shape[-1]
    n_vec, width = D // SUM_LANES, SUM_ILP * SUM_LANES
    ilp = n_vec // SUM_ILP
    groups = x_RD[..., :ilp * width].unflatten(-1, (ilp, SUM_ILP, SUM_LANES))
    part = _chunked([groups[..., i, :, :] for i in range(ilp)])
    parts = [None if part is None else part[..., k, :] for k in range(SUM_ILP)]
    for i in range(ilp * SUM_ILP, n_vec):
        parts[0] = _add(parts[0], x_RD[..., i * SUM_LANES:(i + 1) * SUM_LANES])
    vec_sum = functools.reduce(_add, parts)
    out = None
    for k in range(n_vec * SUM_LANES, D):
        out = _add(out, x_RD[..., k])
    for k in range(SUM_LANES):
        out = _add(out, vec_sum[..., k])
    return out


def _aten_order_holds(dim: int) -> bool:
    """Whether `aten_row_sum` gives torch.sum's bits on rows of `dim` here (256 random rows)."""
    if dim < SUM_LANES:
        return False
    x = torch.randn(256, dim, generator=torch.Generator().manual_seed(0)).pow(2)
    return torch.equal(aten_row_sum(x), x.sum(-1))


def _inductor(gm, example_inputs):
    """Inductor with INDUCTOR_OPTIONS, running ATEN_KERNELS as ATen calls: their
    decompositions left out, and (for the graph compiled here only) their lowerings replaced
    by inductor's fallback to the ATen kernel."""
    from torch._inductor import lowering
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    decompositions = {op: fn for op, fn in select_decomp_table().items()
                      if op not in ATEN_KERNELS}
    saved = {op: lowering.lowerings.get(op) for op in ATEN_KERNELS}
    lowering.lowerings.update({op: lowering.fallback_handler(op, add_to_fallback_set=False)
                               for op in ATEN_KERNELS})
    quiet = logging.getLogger("torch._inductor.ir")  # "missing a c-shim" per fallback call:
    level = quiet.level  # cpp_wrapper calls them through the C++ dispatcher
    quiet.setLevel(logging.ERROR)
    try:
        return compile_fx(gm, example_inputs, config_patches=INDUCTOR_OPTIONS,
                          decompositions=decompositions)
    finally:
        quiet.setLevel(level)
        for op, fn in saved.items():
            if fn is None:
                lowering.lowerings.pop(op, None)
            else:
                lowering.lowerings[op] = fn


_VERSION = operator.attrgetter("_version")


def _residual(x: Tensor, y: Tensor) -> Tensor:
    """x + y, written x - (-y) (the same number: negation is exact). Freezing folds an add that
    is a matmul's only user into the oneDNN matmul as a post-op, which adds before the matmul's
    bf16 rounding where eager adds after it, and greedy tokens drift. With the negation as the
    matmul's user the fold does not happen; an opaque custom op did the same 2.6 ms per step
    slower (a call back into Python each). tests/test_compiled.py checks the bits."""
    return x - -y


class _Stack(nn.Module):
    """Embedding, layers, final norm and LM head of a dense CloverModel, as tensors in and out
    (no cache object, no Python control flow that depends on values)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model  # its parameters become the graph's constants
        # q/k/v and gate/up as one weight each: the fused weight when the model has one (no
        # copy), else concatenated here. Plain tensors, so freezing prepacks them as they are.
        for i, layer in enumerate(model.layers):
            a, f = layer.attn, layer.ffn
            self.register_buffer(f"qkv{i}", _fused(a.qkv_fast, a.q_proj, a.k_proj, a.v_proj),
                                 persistent=False)
            self.register_buffer(f"gate_up{i}", _fused(f.gate_up_fast, f.gate_proj, f.up_proj),
                                 persistent=False)
        self.eps = model.config.norm_eps
        self.aten_sum = _aten_order_holds(model.config.dim)  # else ATen's mean, called

    def _norm(self, x_BLD: Tensor, weight: Tensor) -> Tensor:
        """`rms_norm`, its mean of squares summed in ATen's order (`aten_row_sum`) where that
        order holds."""
        return rms_norm(x_BLD, weight, self.eps, aten_row_sum if self.aten_sum else None)

    def forward(self, ids_BL: Tensor, cos: Tensor, sin: Tensor, mask_B1LS: Tensor, rows_BL: Tensor,
                slots_BL: Tensor, read_B: Tensor | None, sel_N: Tensor, k_caches: list[Tensor],
                v_caches: list[Tensor]) -> Tensor:
        m, cfg = self.model, self.model.config
        B, L = ids_BL.shape
        S = mask_B1LS.shape[-1]
        H, G, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x_BLD = m.embed(ids_BL)
        for i, layer in enumerate(m.layers):
            a, f = layer.attn, layer.ffn
            h_BLD = self._norm(x_BLD, layer.attn_norm.weight)
            qkv_BLXD = F.linear(h_BLD, getattr(self, f"qkv{i}"),
                                _cat_bias(a.q_proj, a.k_proj, a.v_proj)).view(B, L, H + 2 * G, Dh)
            qk_BLXD = m.rotary.apply(qkv_BLXD[:, :, :H + G], cos, sin)
            q_BLHD, k_BLGD, v_BLGD = qk_BLXD[:, :, :H], qk_BLXD[:, :, H:], qkv_BLXD[:, :, H + G:]
            k_all, v_all = k_caches[i], v_caches[i]
            k_all[rows_BL, :, slots_BL] = k_BLGD
            v_all[rows_BL, :, slots_BL] = v_BLGD
            k_read, v_read = ((k_all[:B, :, :S], v_all[:B, :, :S]) if read_B is None
                              else (k_all[read_B, :, :S], v_all[read_B, :, :S]))
            out = F.scaled_dot_product_attention(q_BLHD.transpose(1, 2), k_read, v_read,
                                                 attn_mask=mask_B1LS, enable_gqa=G != H)
            x_BLD = _residual(x_BLD, F.linear(out.transpose(1, 2).reshape(B, L, H * Dh),
                                                  a.o_proj.weight))
            h_BLD = self._norm(x_BLD, layer.ffn_norm.weight)
            gate, up = F.linear(h_BLD, getattr(self, f"gate_up{i}")).chunk(2, dim=-1)
            x_BLD = _residual(x_BLD, F.linear(F.silu(gate) * up, f.down_proj.weight))
        h_ND = self._norm(x_BLD, m.norm.weight).reshape(B * L, -1)[sel_N]
        head = m.embed.weight if m.lm_head is None else m.lm_head.weight
        return F.linear(h_ND, head)


def _own_class(cls: type) -> type:
    """A subclass whose forward has a code object of its own. Dynamo files compiled graphs
    under the code object, and with the module guards filtered out (`guard_filter_fn`) two models'
    stacks would otherwise share one graph, and with it the first model's frozen weights."""
    fn = cls.forward
    forward = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                                 fn.__defaults__, fn.__closure__)
    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


def _fused(fast, *layers: nn.Linear) -> Tensor:
    """The layers' weights as one [sum of outputs, in] tensor (`fast`'s, when fused)."""
    return fast.weight_OI if fast is not None else torch.cat([m.weight.detach() for m in layers])


def _cat_bias(*layers: nn.Linear) -> Tensor | None:
    return None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])


class CompiledForward:
    """The compiled stack of one model, and the parameter state it was compiled from."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack = _own_class(_Stack)(model)
        # parameters are checked by `applies` (cheaper than dynamo's per-module guards); each
        # stack has its own forward code, so its graphs are its own (`_own_class`)
        self.fn = torch.compile(self.stack, backend=_inductor, dynamic=True, options={
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        self._params = list(model.parameters())
        self._state = self._identity()
        # bf16 on a CPU that emulates it (a new dtype later is new storage: `_identity` refuses)
        w = self._params[0]
        self._emulated = (w.dtype == torch.bfloat16 and w.device.type == "cpu"
                          and not bf16_packing_supported())
        self._freezing = torch._inductor.config.patch(freezing=True)  # made once: off the step

    @classmethod
    def build(cls, model: nn.Module) -> CompiledForward | None:
        """The compiled forward, or None when the model has a part it does not cover."""
        cfg = model.config
        plain = (cfg.arch == "clover" and cfg.canvas == "mask" and not cfg.token_conv
                 and not cfg.qk_norm and cfg.partial_rotary == 1.0 and not cfg.logit_softcap
                 and all(isinstance(layer.ffn, SwiGLU) and layer.token_conv is None
                         for layer in model.layers))
        return cls(model) if plain else None

    def applies(self, write, attn_mask_BLS: Tensor | None, return_hidden: bool) -> bool:
        """A cached forward of at most PACKED_MAX_TOKENS tokens (above it eager's matmul is a
        different kernel, and so would its roundings be), every token valid, the mode's own
        visibility, no grad, and every parameter still the one compiled in; not bf16 on a CPU
        where oneDNN cannot prepack it (AVX2 only: bf16 is emulated and eager runs plain
        matmuls, whose bits the graph's GEMMs did not give: a 4-token block's logits differed)."""
        return (not self._emulated and write is not None and write.valid_BL is None
                and attn_mask_BLS is None
                and write.rows_N.numel() <= PACKED_MAX_TOKENS
                and not return_hidden and not torch.is_grad_enabled()
                and self._identity() == self._state)

    def _identity(self) -> tuple[list[int], list[int]]:
        """Each parameter's storage and version (a new dtype or device is new storage)."""
        return list(map(Tensor.data_ptr, self._params)), list(map(_VERSION, self._params))

    def __call__(self, ids_BL: Tensor, pos_BL: Tensor, mask_BLS: Tensor, write, cache,
                 logits_mask_BL: Tensor | None) -> Tensor:
        """Logits at the selected positions ([N, V]), or at every position ([B, L, V]).
        `write` is the eager `CacheWrite` of this forward (every token valid)."""
        B, L = ids_BL.shape
        read_B = write.read if isinstance(write.read, Tensor) else None  # None: rows 0..B-1
        sel_N = (torch.arange(B * L, device=ids_BL.device) if logits_mask_BL is None
                 else logits_mask_BL.reshape(-1).nonzero().squeeze(1))
        # the angles' cos and sin in eager: inductor's own cos / sin round differently
        cos, sin = self.model.rotary.cos_sin(pos_BL, self.model.embed.weight.dtype)
        with self._freezing:
            logits = self.fn(ids_BL, cos, sin, mask_BLS[:, None], write.rows_N, write.slots_N,
                             read_B, sel_N, cache.k, cache.v)
        return logits.view(B, L, -1) if logits_mask_BL is None else logits


