"""Model configuration: one typed, keyword-only dataclass and the named presets.

`ModelConfig` describes every model Clover can build: a block-diffusion MoE dLLM (`block`), its
autoregressive twin (`causal`) and LLaDA/Dream-shaped bidirectional models (`full`). It validates
itself (`ValueError` naming the field) and round-trips through `config.json`. Nothing here imports
torch, so the CLI can describe a 35B model without touching the device.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# `canvas`: causal over the fixed sequence, bidirectional over the canvas being drafted after it
# (DiffusionGemma's encoder/decoder roles in one forward; `arch="diffusion_gemma"` only).
ATTENTION_MODES = ("causal", "block", "full", "canvas")
ROUTERS = ("softmax", "sigmoid")
QK_NORM_SCOPES = ("head", "all")
ARCHS = ("clover", "diffusion_gemma")
LAYER_TYPES = ("sliding", "full")
# How a block's undecided positions look to the model: the mask id, or uniform random tokens
# redrawn for every position a step does not accept (DiffusionGemma).
CANVAS_MODES = ("mask", "uniform")

# Special-token ids shared by Clover's own tokenizer and its presets (see clover/tokenizer.py).
PAD_ID, EOS_ID, MASK_ID = 0, 1, 2


@dataclass(kw_only=True)
class ModelConfig:
    """Shape and behaviour of one model. Counts use the `num_` prefix; dims are per layer."""

    name: str = "custom"
    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means dim // num_heads
    rope_theta: float = 10000.0
    partial_rotary: float = 1.0  # fraction of head_dim that gets RoPE (LLaDA2.x uses 0.5)
    qk_norm: bool = False
    # RMSNorm of queries and keys over each head's head_dim (`head`: Qwen3, LLaDA-MoE) or over the
    # whole projection, all heads at once, before splitting into heads (`all`: OLMoE).
    qk_norm_scope: str = "head"
    # Width of a causal depthwise convolution over positions on each attention input (a "canon
    # layer"): every position also carries its width - 1 predecessors, so one attention layer can
    # match n-grams (copying among look-alike digits). 0: none.
    token_conv: int = 0
    norm_eps: float = 1e-6
    ffn_dim: int  # hidden size of dense SwiGLU layers
    num_dense_layers: int = 0  # leading dense layers before the MoE layers
    num_experts: int = 0  # 0: every layer is dense
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    expert_ffn_dim: int = 0
    router: str = "softmax"  # softmax top-k, or sigmoid scores + expert bias (LLaDA2.x/DeepSeek-V3)
    router_renorm: bool = True  # renormalise the top-k weights to sum to 1
    routed_scaling: float = 1.0
    # Group-limited routing (sigmoid router; LLaDA2.x / DeepSeek-V3): the experts form
    # num_expert_groups equal groups, each scored by the sum of its two best biased scores, and a
    # token picks its top-k experts only inside its topk_groups best groups. 1 / 1: no limit.
    num_expert_groups: int = 1
    topk_groups: int = 1
    tie_embeddings: bool = False
    qkv_bias: bool = False
    attention: str = "block"
    block_size: int = 32
    # Diffusion models: a masked position i is predicted by the logits at i - 1 (Dream's shift,
    # which reuses an AR head as is) instead of its own. Causal models always predict the next
    # token.
    shift_logits: bool = False
    max_seq_len: int = 4096
    pad_id: int = PAD_ID
    eos_id: int = EOS_ID
    mask_id: int = MASK_ID
    canvas: str = "mask"
    # The model class: `clover` (clover/model/transformer.py) or `diffusion_gemma`
    # (clover/model/gemma.py: Gemma-4 MoE stack with sandwich norms, a dense GELU MLP beside the
    # experts, sliding and global attention layers, self-conditioning, logit soft-capping).
    # The fields below only matter for `diffusion_gemma`; their defaults change nothing.
    arch: str = "clover"
    layer_types: list[str] = dataclasses.field(default_factory=list)  # "sliding" | "full" per layer
    sliding_window: int = 0  # sliding layers: a query sees the last `sliding_window` positions
    global_head_dim: int = 0  # full layers: head dim (0: head_dim)
    num_global_kv_heads: int = 0  # full layers: kv heads (0: num_kv_heads)
    global_rope_theta: float = 0.0  # full layers: RoPE base (0: rope_theta)
    global_partial_rotary: float = 1.0  # full layers: rotated fraction of each head
    logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap) (0: none)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // max(self.num_heads, 1)
        for field in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "ffn_dim", "block_size", "max_seq_len"):
            _require(getattr(self, field) > 0, field, "must be > 0")
        _require(self.attention in ATTENTION_MODES, "attention",
                 f"must be one of {ATTENTION_MODES}")
        _require(self.router in ROUTERS, "router", f"must be one of {ROUTERS}")
        _require(self.qk_norm_scope in QK_NORM_SCOPES, "qk_norm_scope",
                 f"must be one of {QK_NORM_SCOPES}")
        _require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
                 f"must divide num_heads={self.num_heads}")
        _require(0.0 < self.partial_rotary <= 1.0, "partial_rotary", "must be in (0, 1]")
        _require(self.rotary_dim % 2 == 0, "partial_rotary",
                 f"gives an odd rotary dim {self.rotary_dim}; it must be even")
        _require(self.rope_theta > 0, "rope_theta", "must be > 0")
        _require(self.norm_eps > 0, "norm_eps", "must be > 0")
        _require(0 <= self.token_conv <= 16, "token_conv", "must be in [0, 16] (0: none)")
        _require(self.routed_scaling > 0, "routed_scaling", "must be > 0")
        self._validate_moe()
        self._validate_token_ids()
        self._validate_arch()
        if self.attention == "causal" and self.block_size != 1:
            raise ValueError("ModelConfig.block_size: causal models decode one token per block, "
                             "so it must be 1 "
                             f"(got {self.block_size})")

    def _validate_moe(self) -> None:
        _require(self.num_experts >= 0, "num_experts", "must be >= 0")
        _require(0 <= self.num_dense_layers <= self.num_layers, "num_dense_layers",
                 f"must be in [0, num_layers={self.num_layers}]")
        if self.num_experts == 0:
            return
        _require(1 <= self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
                 f"must be in [1, num_experts={self.num_experts}]")
        _require(self.expert_ffn_dim > 0, "expert_ffn_dim", "must be > 0 when num_experts > 0")
        _require(self.num_shared_experts >= 0, "num_shared_experts", "must be >= 0")
        self._validate_groups()

    def _validate_groups(self) -> None:
        groups = self.num_expert_groups
        _require(groups >= 1 and self.num_experts % groups == 0, "num_expert_groups",
                 f"must be >= 1 and divide num_experts={self.num_experts}")
        _require(1 <= self.topk_groups <= groups, "topk_groups",
                 f"must be in [1, num_expert_groups={groups}]")
        if groups == 1:
            return
        _require(self.router == "sigmoid", "num_expert_groups",
                 "> 1 needs router='sigmoid' (group-limited routing is defined for it)")
        per_group = self.num_experts // groups
        _require(self.topk_groups * per_group >= self.num_experts_per_tok, "topk_groups",
                 f"leaves {self.topk_groups * per_group} eligible experts, fewer than "
                 f"num_experts_per_tok={self.num_experts_per_tok}")

    def _validate_token_ids(self) -> None:
        for field in ("pad_id", "eos_id", "mask_id"):
            value = getattr(self, field)
            _require(0 <= value < self.vocab_size, field,
                     f"must be a token id in [0, vocab_size={self.vocab_size})")
        _require(self.mask_id not in (self.eos_id, self.pad_id), "mask_id",
                 "must differ from eos_id and pad_id")

    def _validate_arch(self) -> None:
        _require(self.arch in ARCHS, "arch", f"must be one of {ARCHS}")
        _require(self.canvas in CANVAS_MODES, "canvas", f"must be one of {CANVAS_MODES}")
        _require((self.attention == "canvas") == (self.arch == "diffusion_gemma"), "attention",
                 f"{self.attention!r} with arch {self.arch!r}: `canvas` attention is the "
                 "diffusion_gemma model's, and that model has only it")
        _require(not self.layer_types or len(self.layer_types) == self.num_layers,
                 "layer_types", f"needs one entry per layer ({self.num_layers})")
        _require(all(t in LAYER_TYPES for t in self.layer_types), "layer_types",
                 f"entries must be one of {LAYER_TYPES}")
        _require(self.sliding_window > 0 or "sliding" not in self.layer_types, "sliding_window",
                 "must be > 0 when a layer is `sliding`")
        _require(0.0 < self.global_partial_rotary <= 1.0, "global_partial_rotary",
                 "must be in (0, 1]")
        _require(self.logit_softcap >= 0, "logit_softcap", "must be >= 0 (0: none)")

    # ---- derived shapes -------------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(round(self.head_dim * self.partial_rotary))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding"

    def layer_kv_shape(self, layer: int) -> tuple[int, int]:
        """(kv heads, head dim) of one layer's keys: full layers of diffusion_gemma differ."""
        if self.arch == "diffusion_gemma" and not self.layer_is_sliding(layer):
            return (self.num_global_kv_heads or self.num_kv_heads,
                    self.global_head_dim or self.head_dim)
        return self.num_kv_heads, self.head_dim

    def layer_is_moe(self, layer: int) -> bool:
        return self.is_moe and layer >= self.num_dense_layers

    @property
    def decode_block_size(self) -> int:
        """Tokens drafted per block when decoding: 1 for AR, `block_size` otherwise."""
        return 1 if self.attention == "causal" else self.block_size

    # ---- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config has unknown fields {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _require(ok: bool, field: str, why: str) -> None:
    if not ok:
        raise ValueError(f"ModelConfig.{field} {why}")


# ---- presets ------------------------------------------------------------------------------------
# Clover's own models use Clover's tokenizer (pad 0, eos 1, mask 2). Public shapes keep their own
# vocabularies and special ids, from the published config.json files, for importers.

def _tiny() -> ModelConfig:
    """< 1M parameters, for tests: block-diffusion MoE with every feature switched on."""
    return ModelConfig(name="tiny", vocab_size=512, dim=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, qk_norm=True, ffn_dim=128, num_dense_layers=1,
                       num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                       expert_ffn_dim=32, attention="block", block_size=4, max_seq_len=512)


def _clover_tiny() -> ModelConfig:
    """The shipped default: block-diffusion MoE, 8 experts top-2, ~1.9M total / ~1.1M active.

    Sized from measured training speed on a 2-core CPU: ~6,400 tokens/s (AR) and ~4,800 tokens/s
    (block diffusion) on one thread with the shared system-prompt prefix, against ~800 tokens/s
    for the earlier 11M-parameter shape, which had not learned to copy values after 3.8M tokens.
    No QK-norm: `benchmarks/copy_probe.py` copies a digit string slightly faster without it
    (per-digit accuracy 1.00 vs 0.95 at step 100); on the airspace task a QK-norm run of this
    shape followed the same loss curve, and neither had learned to copy by step 1,200.
    """
    return ModelConfig(name="clover-tiny", vocab_size=2048, dim=128, num_layers=4, num_heads=4,
                       num_kv_heads=2, qk_norm=False, ffn_dim=384, num_dense_layers=1,
                       num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                       expert_ffn_dim=128, tie_embeddings=True, attention="block",
                       block_size=32, max_seq_len=2048)


def _clover_tiny_ar() -> ModelConfig:
    """`clover-tiny` with causal attention: the AR baseline of the same architecture and size."""
    return _clover_tiny().replace(name="clover-tiny-ar", attention="causal", block_size=1)


def _clover_35b_a3b() -> ModelConfig:
    """The seed model's published size (~35B total, ~3B active), in the LLaDA2.x / Qwen3-MoE style.

    48 layers of dim 2048 (first one dense), 256 routed experts of width 448 with top-8 plus two
    shared experts, sigmoid router with expert bias, GQA 32/4 with head dim 128, QK-norm,
    half-rotary RoPE and a 157k vocabulary: 34.98B total, 2.90B active per token.
    """
    return ModelConfig(name="clover-35b-a3b", vocab_size=157184, dim=2048, num_layers=48,
                       num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=600000.0,
                       partial_rotary=0.5, qk_norm=True, ffn_dim=5120, num_dense_layers=1,
                       num_experts=256, num_experts_per_tok=8, num_shared_experts=2,
                       expert_ffn_dim=448, router="sigmoid", routed_scaling=2.5,
                       attention="block", block_size=32, max_seq_len=32768,
                       pad_id=156892, eos_id=156892, mask_id=156895)


def _llada_8b() -> ModelConfig:
    """GSAI-ML/LLaDA-8B: dense, bidirectional, LLaMA-style."""
    return ModelConfig(name="llada-8b", vocab_size=126464, dim=4096, num_layers=32, num_heads=32,
                       num_kv_heads=32, rope_theta=500000.0, norm_eps=1e-5, ffn_dim=12288,
                       attention="full", block_size=32, max_seq_len=4096,
                       pad_id=126081, eos_id=126081, mask_id=126336)


def _llada_moe_7b_a1b() -> ModelConfig:
    """inclusionAI/LLaDA-MoE-7B-A1B: 64 experts top-8, QK-norm, bidirectional."""
    return ModelConfig(name="llada-moe-7b-a1b", vocab_size=157184, dim=2048, num_layers=16,
                       num_heads=16, num_kv_heads=16, rope_theta=50000.0, qk_norm=True,
                       norm_eps=1e-5, ffn_dim=8192, num_experts=64, num_experts_per_tok=8,
                       expert_ffn_dim=1024, router_renorm=False, attention="full",
                       block_size=32, max_seq_len=8192,
                       pad_id=156892, eos_id=156892, mask_id=156895)


def _llada2_mini() -> ModelConfig:
    """inclusionAI/LLaDA2.0-mini (16B-A1.4B): block diffusion, 256 experts top-8, sigmoid router."""
    return ModelConfig(name="llada2.0-mini", vocab_size=157184, dim=2048, num_layers=20,
                       num_heads=16, num_kv_heads=4, head_dim=128, rope_theta=600000.0,
                       partial_rotary=0.5, qk_norm=True, ffn_dim=5120, num_dense_layers=1,
                       num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
                       expert_ffn_dim=512, router="sigmoid", routed_scaling=2.5,
                       attention="block", block_size=32, max_seq_len=32768,
                       pad_id=156892, eos_id=156892, mask_id=156895)


def _dream_7b() -> ModelConfig:
    """Dream-org/Dream-v0-Instruct-7B: Qwen2.5-7B shape, bidirectional, QKV bias."""
    return ModelConfig(name="dream-7b", vocab_size=152064, dim=3584, num_layers=28, num_heads=28,
                       num_kv_heads=4, rope_theta=1000000.0, ffn_dim=18944, qkv_bias=True,
                       attention="full", block_size=32, max_seq_len=32768,
                       pad_id=151643, eos_id=151643, mask_id=151666)


PRESETS = {
    "tiny": _tiny,
    "clover-tiny": _clover_tiny,
    "clover-tiny-ar": _clover_tiny_ar,
    "clover-35b-a3b": _clover_35b_a3b,
    "llada-8b": _llada_8b,
    "llada-moe-7b-a1b": _llada_moe_7b_a1b,
    "llada2.0-mini": _llada2_mini,
    "dream-7b": _dream_7b,
}


def get_preset(preset: str, /, **overrides: Any) -> ModelConfig:
    """A fresh config for a named preset, with optional field overrides (including `name`)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    config = PRESETS[preset]()
    return config.replace(**overrides) if overrides else config
