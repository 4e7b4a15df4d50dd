"""A compiled cached forward: the whole layer stack of a dense model as one inductor graph.

Eager PyTorch spends about as long launching a decode step's ~800 small ops (norms, rotations,
cache writes, views) as it does streaming the weights through its matrix-vector products: on
SmolLM2-135M in bf16 at batch 1, 26.5 ms per step of which the matmuls are ~13.5 ms. Compiling
the layers, the final norm and the LM head into one graph (`torch.compile`, inductor, weights
frozen as constants so oneDNN prepacks them, a C++ wrapper) takes 23.8 against 29.5 ms per step
there (docs/bench.md). Most of what is left beyond the matmuls is the RMSNorm and silu calls,
which go back through Python to ATen's kernels to keep eager's bits (see `_silu_mul`).

`CompiledForward.build(model)` returns None for what it does not cover (MoE layers, token
convolution, q/k norms, partial rotation, canvas models, logit soft-capping); `CloverModel.forward`
uses it only for cached, unpadded, no-grad forwards with the mode's own visibility, and runs the
eager layers (the reference) otherwise. The cache write, the visibility mask and the choice of
positions needing logits stay in eager code shared with the reference, so both read the same
slots. The results are eager's bit for bit (`emulate_precision_casts`, cos/sin from eager,
`_residual`, `_norm`, `_silu_mul`); tests/test_compiled.py checks logits, keys and tokens.

Weights are baked in at compile time: `CompiledForward` records each parameter's storage and
version, and refuses to run (eager takes over) once any has changed (a merged adapter, `.to`).
Compiling takes about a minute for SmolLM2's 30 layers on two cores, paid on the first forward of
each batch shape class; `--compile` turns it on (off by default: a short job does not earn it back).
"""

# Shapes: B batch, L new tokens, S key slots, D dim, H query heads, G kv heads, Dh head dim,
# N positions needing logits, V vocab

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.model.fused import PACKED_MAX_TOKENS
from clover.model.layers import rms_norm
from clover.model.moe import SwiGLU

# Freezing is read before `torch.compile`'s options apply, so it is patched in around each call.
OPTIONS = {"cpp_wrapper": True, "emulate_precision_casts": True,
           # parameters are checked by `applies` (cheaper than dynamo's per-module guards);
           # each stack has its own forward code, so its graphs are its own (`_own_class`)
           "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


def _residual(x: Tensor, y: Tensor) -> Tensor:
    """x + y, written x - (-y) (the same number: negation is exact). Freezing folds an add that
    is a matmul's only user into the oneDNN matmul as a post-op, which adds before the matmul's
    bf16 rounding where eager adds after it, and greedy tokens drift. With the negation as the
    matmul's user the fold does not happen; an opaque custom op did the same 2.6 ms per step
    slower (a call back into Python each). tests/test_compiled.py checks the bits."""
    return x - -y


@torch.library.custom_op("clover::rms_norm", mutates_args=())
def _norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`rms_norm` through ATen's kernels, opaque to inductor (see `_silu_mul`)."""
    return rms_norm(x, weight, eps)


@_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("clover::silu_mul", mutates_args=())
def _silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up through ATen's kernels, opaque to inductor. Inductor's own norm and
    silu kernels differ from ATen's in the last fp32 bit now and then, and in bf16 that
    sometimes flips a rounding: on clover-smol-ar's second test message the logits left eager's
    at the 76th new token (layer 28's keys first), and the greedy tokens at the 103rd. With
    both as ATen calls the 120 steps checked were bit for bit eager's."""
    return F.silu(gate) * up


@_silu_mul.register_fake
def _(gate: Tensor, up: Tensor) -> Tensor:
    return torch.empty_like(gate)


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
            h_BLD = _norm(x_BLD, layer.attn_norm.weight, cfg.norm_eps)
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
            h_BLD = _norm(x_BLD, layer.ffn_norm.weight, cfg.norm_eps)
            gate, up = F.linear(h_BLD, getattr(self, f"gate_up{i}")).chunk(2, dim=-1)
            x_BLD = _residual(x_BLD, F.linear(_silu_mul(gate, up), f.down_proj.weight))
        h_ND = _norm(x_BLD, m.norm.weight, cfg.norm_eps).reshape(B * L, -1)[sel_N]
        head = m.embed.weight if m.lm_head is None else m.lm_head.weight
        return F.linear(h_ND, head)


def _own_class(cls: type) -> type:
    """A subclass whose forward has a code object of its own. Dynamo files compiled graphs
    under the code object, and with the module guards filtered out (OPTIONS) two models'
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
        self.fn = torch.compile(self.stack, dynamic=True, options=OPTIONS)
        self._params = list(model.parameters())
        self._state = self._identity()

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
        visibility, no grad, and every parameter still the one compiled in."""
        return (write is not None and write.valid_BL is None and attn_mask_BLS is None
                and write.rows_N.numel() <= PACKED_MAX_TOKENS
                and not return_hidden and not torch.is_grad_enabled()
                and self._identity() == self._state)

    def _identity(self) -> list[tuple[int, int]]:
        """Each parameter's storage and version (a new dtype or device is new storage)."""
        return [(p.data_ptr(), p._version) for p in self._params]

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
        with torch._inductor.config.patch(freezing=True):
            logits = self.fn(ids_BL, cos, sin, mask_BLS[:, None], write.rows_N, write.slots_N,
                             read_B, sel_N, cache.k, cache.v)
        return logits.view(B, L, -1) if logits_mask_BL is None else logits


