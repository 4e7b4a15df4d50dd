"""DiffusionGemma's model (`arch="diffusion_gemma"`): a Gemma-4 MoE stack in Clover's interface.

transformers' DiffusionGemma runs one set of weights in two roles: an encoder that reads the
fixed sequence causally into a KV cache, and a decoder that reads the canvas bidirectionally
against that cache without writing it. Here both roles are one forward over
`fixed tokens + canvas` with `canvas` attention (a query before `canvas_start_B` sees keys at or
before its own position; a canvas query sees the fixed sequence and the whole canvas), so the
engine's cache and slots work as for Clover's own model: the fixed tokens' keys become exact
cache, the canvas' keys are provisional and rewritten every step. Sliding layers see the last
`sliding_window` positions (a canvas query: the last `sliding_window - 1` before the canvas, as
transformers' sliding cache keeps them, plus the canvas). Canvas tokens also take the
self-conditioning input: the previous step's soft embedding through a gated MLP.
Nothing here samples or schedules; `CloverModel`'s forward contract holds (logits, MoE stats).
"""

# Shapes: B batch, L new tokens, S key slots, D dim, H query heads, G kv heads, Dh head dim,
# V vocab, N tokens (flattened), K experts per token, E experts

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.model.layers import _rotate_half
from clover.model.moe import Experts, MoEStats, grouped_experts
from clover.model.transformer import KVCache, ModelOutput


def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


class GemmaNorm(nn.Module):
    """RMSNorm in fp32, scaled by a learned weight (Gemma 4 keeps it as is, not 1 + weight), or
    unscaled when `scale=False` (the value norm, the router's input norm)."""

    def __init__(self, dim: int, eps: float, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: Tensor) -> Tensor:
        out = x.float() * torch.pow(x.float().pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            out = out * self.weight.float()
        return out.to(x.dtype)


class GemmaRotary:
    """RoPE for one layer type. Full layers use "proportional" RoPE: only the first
    `partial * head_dim / 2` frequencies rotate, computed over the whole head dim; the rest
    have frequency 0 (cos 1, sin 0), so every head dim is still laid out rotate-half."""

    def __init__(self, head_dim: int, theta: float, partial: float) -> None:
        angles = int(partial * head_dim // 2)
        # on the CPU even when the model is built on the meta device; moved when used
        exponent = torch.arange(0, 2 * angles, 2, dtype=torch.float, device="cpu") / head_dim
        inv_freq = 1.0 / theta ** exponent
        self.inv_freq = torch.cat([inv_freq, torch.zeros(head_dim // 2 - angles, device="cpu")])

    def cos_sin(self, pos_BL: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles_BLR = pos_BL[..., None].float() * self.inv_freq.to(pos_BL.device)
        angles_BLR = torch.cat([angles_BLR, angles_BLR], -1)[:, :, None]
        return angles_BLR.cos().to(dtype), angles_BLR.sin().to(dtype)


def _rope(x_BLHD: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x_BLHD * cos + _rotate_half(x_BLHD) * sin


class GemmaAttention(nn.Module):
    """Q/K RMSNorm (scaled), an unscaled value norm, attention scale 1. Full layers have no
    value projection: the key projection doubles as the value (`attention_k_eq_v`)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.sliding = config.layer_is_sliding(layer)
        G, Dh = config.layer_kv_shape(layer)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, G, Dh
        self.q_proj = nn.Linear(config.dim, config.num_heads * Dh, bias=False)
        self.k_proj = nn.Linear(config.dim, G * Dh, bias=False)
        self.v_proj = nn.Linear(config.dim, G * Dh, bias=False) if self.sliding else None
        self.o_proj = nn.Linear(config.num_heads * Dh, config.dim, bias=False)
        self.q_norm = GemmaNorm(Dh, config.norm_eps)
        self.k_norm = GemmaNorm(Dh, config.norm_eps)
        self.v_norm = GemmaNorm(Dh, config.norm_eps, scale=False)

    def forward(self, x_BLD: Tensor, cos_sin: tuple[Tensor, Tensor], mask_BLS: Tensor,
                cache: KVCache | None, write) -> Tensor:
        B, L, _ = x_BLD.shape
        H, G, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = _rope(self.q_norm(self.q_proj(x_BLD).view(B, L, H, Dh)), *cos_sin)
        k_raw = self.k_proj(x_BLD).view(B, L, G, Dh)
        v = self.v_norm(k_raw if self.v_proj is None else self.v_proj(x_BLD).view(B, L, G, Dh))
        k = _rope(self.k_norm(k_raw), *cos_sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.write_read(self.layer, k.transpose(1, 2), v.transpose(1, 2), write)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask_BLS[:, None],
                                             scale=1.0, enable_gqa=G != H)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, H * Dh))


class GatedMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)): the dense MLP and the self-conditioning MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class GemmaExperts(Experts):
    """Clover's stacked experts [E, F, D] with Gemma's GELU-tanh gate instead of SiLU."""

    def one(self, e: int, x_ND: Tensor) -> Tensor:
        h_NF = gelu_tanh(x_ND @ self.gate_proj[e].T) * (x_ND @ self.up_proj[e].T)
        return h_NF @ self.down_proj[e].T


class GemmaRouter(nn.Module):
    """Softmax top-k over experts from an unscaled RMSNorm of the residual times a learned input
    scale and 1/sqrt(D); top-k weights renormalised, then times a learned per-expert scale."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm = GemmaNorm(config.dim, config.norm_eps, scale=False)
        self.proj = nn.Linear(config.dim, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.dim))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))

    def forward(self, x_ND: Tensor) -> tuple[Tensor, Tensor]:
        h_ND = self.norm(x_ND) * self.scale * x_ND.shape[-1] ** -0.5
        probs_NE = self.proj(h_ND).softmax(-1, dtype=torch.float32)
        weights_NK, experts_NK = probs_NE.topk(self.top_k, dim=-1)
        weights_NK = weights_NK / weights_NK.sum(-1, keepdim=True)
        return experts_NK, weights_NK * self.per_expert_scale[experts_NK]


class GemmaLayer(nn.Module):
    """Sandwich norms around attention; a dense MLP and the experts in parallel, each with its
    own norms, summed, normed again, added to the residual; the layer output times a scalar."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        D, eps = config.dim, config.norm_eps
        self.sliding = config.layer_is_sliding(layer)
        self.self_attn = GemmaAttention(config, layer)
        self.input_layernorm = GemmaNorm(D, eps)
        self.post_attention_layernorm = GemmaNorm(D, eps)
        self.pre_feedforward_layernorm = GemmaNorm(D, eps)
        self.mlp = GatedMLP(D, config.ffn_dim)
        self.post_feedforward_layernorm_1 = GemmaNorm(D, eps)
        self.router = GemmaRouter(config)
        self.pre_feedforward_layernorm_2 = GemmaNorm(D, eps)
        self.experts = GemmaExperts(config.num_experts, D, config.expert_ffn_dim)
        self.post_feedforward_layernorm_2 = GemmaNorm(D, eps)
        self.post_feedforward_layernorm = GemmaNorm(D, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    @property
    def routed_experts(self) -> nn.Module:
        """The experts beside the dense MLP (every layer has them); what `clover inspect` counts."""
        return self.experts

    def forward(self, x_BLD: Tensor, cos_sin, mask_BLS, cache, write, valid_N, stats: list):
        h_BLD = self.self_attn(self.input_layernorm(x_BLD), cos_sin, mask_BLS, cache, write)
        x_BLD = x_BLD + self.post_attention_layernorm(h_BLD)
        dense_BLD = self.mlp(self.pre_feedforward_layernorm(x_BLD))
        dense_BLD = self.post_feedforward_layernorm_1(dense_BLD)
        B, L, D = x_BLD.shape
        x_ND = x_BLD.reshape(B * L, D)
        experts_NK, weights_NK = self.router(x_ND)
        moe_ND = grouped_experts(self.experts, self.pre_feedforward_layernorm_2(x_ND), experts_NK,
                                 weights_NK)
        moe_BLD = self.post_feedforward_layernorm_2(moe_ND.view(B, L, D))
        stats.append(torch.bincount(experts_NK[valid_N].reshape(-1),
                                    minlength=self.experts.gate_proj.shape[0]))
        x_BLD = x_BLD + self.post_feedforward_layernorm(dense_BLD + moe_BLD)
        return x_BLD * self.layer_scalar


class SelfConditioning(nn.Module):
    """post_norm(embedding + MLP(pre_norm(soft embedding of the previous step's logits)));
    with no previous step the soft embedding is zero, and so is the MLP's output."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = GemmaNorm(config.dim, config.norm_eps)
        self.post_norm = GemmaNorm(config.dim, config.norm_eps, scale=False)
        self.mlp = GatedMLP(config.dim, config.ffn_dim)

    def forward(self, emb_ND: Tensor, soft_ND: Tensor) -> Tensor:
        return self.post_norm(emb_ND + self.mlp(self.pre_norm(soft_ND)))


def canvas_visibility(q_pos_BL: Tensor, k_pos_BS: Tensor, canvas_start_B: Tensor,
                      window: int = 0) -> Tensor:
    """[B, L, S]: causal before the canvas, everything from a canvas query; with a window, a
    query sees keys after min(its position, canvas start) - window."""
    q, k = q_pos_BL[:, :, None], k_pos_BS[:, None, :]
    start = canvas_start_B[:, None, None]
    see = (k <= q) | (q >= start)
    if window:
        see = see & (k > torch.minimum(q, start) - window)
    return see


class DiffusionGemmaModel(nn.Module):
    """Token ids + positions (+ cache, canvas start, self-conditioning) in; logits out.

    The forward takes `CloverModel.forward`'s arguments plus `canvas_start_B` (the first canvas
    position of each row; None: no canvas, every token is fixed and attends causally) and
    `soft_BLD` (the self-conditioning input of canvas tokens; None or zeros at a first step)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.embed_scale = math.sqrt(config.dim)
        self.layers = nn.ModuleList(GemmaLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaNorm(config.dim, config.norm_eps)
        self.self_conditioning = SelfConditioning(config)
        full_dim = config.layer_kv_shape(config.layer_types.index("full"))[1] \
            if "full" in config.layer_types or not config.layer_types else config.head_dim
        self.rotary = {
            "sliding": GemmaRotary(config.head_dim, config.rope_theta, config.partial_rotary),
            "full": GemmaRotary(full_dim, config.global_rope_theta or config.rope_theta,
                                config.global_partial_rotary)}

    def forward(self, ids_BL: Tensor, pos_BL: Tensor | None = None, *,
                cache: KVCache | None = None, slot_B: Tensor | None = None,
                cache_rows: list[int] | None = None, valid_BL: Tensor | None = None,
                logits_mask_BL: Tensor | None = None, attn_mask_BLS: Tensor | None = None,
                return_hidden: bool = False, canvas_start_B: Tensor | None = None,
                soft_BLD: Tensor | None = None) -> ModelOutput:
        B, L = ids_BL.shape
        if pos_BL is None:
            start_B = ids_BL.new_zeros(B) if cache is None else cache.length_B[
                cache_rows if cache_rows is not None else slice(0, B)]
            pos_BL = start_B[:, None] + torch.arange(L, device=ids_BL.device)
        valid_BL = torch.ones_like(ids_BL, dtype=torch.bool) if valid_BL is None else valid_BL
        if canvas_start_B is None:  # no canvas: every token is fixed
            canvas_start_B = pos_BL.max(-1).values + 1
        x_BLD = self._embed(ids_BL, pos_BL >= canvas_start_B[:, None], soft_BLD)
        write, k_pos_BS, k_valid_BS = self._slots(pos_BL, valid_BL, cache, slot_B, cache_rows)
        masks = self._masks(pos_BL, k_pos_BS, k_valid_BS, valid_BL, canvas_start_B, attn_mask_BLS)
        cos_sin = {kind: rot.cos_sin(pos_BL, x_BLD.dtype) for kind, rot in self.rotary.items()}
        stats: list = []
        valid_N = valid_BL.reshape(-1)
        for layer in self.layers:
            kind = "sliding" if layer.sliding else "full"
            x_BLD = layer(x_BLD, cos_sin[kind], masks[kind], cache, write, valid_N, stats)
        h_BLD = self.norm(x_BLD)
        logits = self.project(h_BLD if logits_mask_BL is None else h_BLD[logits_mask_BL])
        moe = MoEStats(aux_loss=x_BLD.new_zeros(()), counts_LE=torch.stack(stats))
        return ModelOutput(logits, moe, h_BLD if return_hidden else None)

    def project(self, h: Tensor) -> Tensor:
        """Tied head in fp32, soft-capped: cap * tanh(logits / cap)."""
        logits = (h @ self.embed.weight.T).float()
        cap = self.config.logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def soft_embedding(self, logits_NV: Tensor) -> Tensor:
        """The self-conditioning input from (temperature-processed) logits: the softmax-weighted
        mean of the token embeddings, scaled as embeddings are."""
        probs_NV = logits_NV.softmax(-1, dtype=torch.float32).to(self.embed.weight.dtype)
        return (probs_NV @ self.embed.weight) * self.embed_scale

    def fuse_projections(self, enabled: bool = True, pack: bool = True) -> DiffusionGemmaModel:
        """No fused fast paths for this model (the engine calls this on every model)."""
        return self

    def _embed(self, ids_BL: Tensor, canvas_BL: Tensor, soft_BLD: Tensor | None) -> Tensor:
        x_BLD = self.embed(ids_BL) * self.embed_scale
        if not bool(canvas_BL.any()):
            return x_BLD
        soft = torch.zeros_like(x_BLD[canvas_BL]) if soft_BLD is None else soft_BLD[canvas_BL]
        x_BLD = x_BLD.clone()
        x_BLD[canvas_BL] = self.self_conditioning(x_BLD[canvas_BL], soft.to(x_BLD.dtype))
        return x_BLD

    def _slots(self, pos_BL, valid_BL, cache, slot_B, cache_rows):
        if cache is None:
            return None, pos_BL, valid_BL
        write = cache.write_slots(slot_B, pos_BL, valid_BL, cache_rows)
        return (write, cache.pos_BS[write.read, :cache.end],
                cache.valid_BS[write.read, :cache.end])

    def _masks(self, pos_BL, k_pos_BS, k_valid_BS, valid_BL, canvas_start_B, attn_mask_BLS):
        """The visibility of full and sliding layers, [B, L, S] each (padding queries see all,
        so no softmax row is empty; their outputs are ignored)."""
        out = {}
        for kind, window in (("full", 0), ("sliding", self.config.sliding_window)):
            see = attn_mask_BLS if attn_mask_BLS is not None else canvas_visibility(
                pos_BL, k_pos_BS, canvas_start_B, window)
            out[kind] = (see & k_valid_BS[:, None, :]) | ~valid_BL[:, :, None]
        return out


def init_weights(model: DiffusionGemmaModel, std: float = 0.02) -> None:
    """Normal(0, std) for matrices and stacked experts, ones for norms and learned scales."""
    for _, p in model.named_parameters():
        if p.ndim == 1:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, std=std)
