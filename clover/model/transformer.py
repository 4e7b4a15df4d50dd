"""The one Clover model: embeddings, RMSNorm, RoPE, GQA attention in three modes, dense FFN, MoE.

Attention visibility is a function of token *positions*, never of tensor layout:
`causal` (key pos <= query pos), `block` (key block <= query block, block = pos // block_size) and
`full` (everything). That makes the KV cache exact for `causal` and `block`: keys are written into
per-row cache slots together with their positions, and a forward over new tokens attends to every
valid slot it is allowed to see. The model promises nothing about sampling or scheduling; the
engine decides which slots to write (`slot_B`) and when a row's cache grows (`KVCache.commit`).
"""

# Shapes: B batch, L new tokens, S key slots, D dim, H query heads, G kv heads, Dh head dim,
# V vocab, N selected positions

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.model.compiled import CompiledForward
from clover.model.fused import FastLinear, linear
from clover.model.layers import RMSNorm, Rotary, embed_tokens, tied_head
from clover.model.moe import MoE, MoEStats, SwiGLU


@dataclass
class CacheWrite:
    """Where one forward's valid tokens land in the cache: a (row, slot) per valid token.

    When every token is valid, rows and slots stay [B, L] and new keys are written in their
    [B, L, ...] layout as they are (no boolean selection); otherwise they are [N] and `values`
    selects the valid tokens."""

    rows_N: Tensor
    slots_N: Tensor
    valid_BL: Tensor | None  # None: every token is valid
    read: slice | Tensor  # the cache rows this forward's batch rows are (a view when contiguous)

    def values(self, x_BL_: Tensor) -> Tensor:
        """Per-token values (leading dims B, L) in the layout `rows_N`/`slots_N` index."""
        return x_BL_ if self.valid_BL is None else x_BL_[self.valid_BL]


class KVCache:
    """Keys and values per layer in fixed slots, with each slot's position and validity.

    Row b's committed prefix occupies slots [0, length_B[b]). A forward writes its new tokens at
    `slot_B[b] + j` (default: right after the committed prefix) so a block being denoised overwrites
    its own provisional entries step after step; `commit(n_B)` makes the first n new tokens of each
    row permanent. Slots beyond the committed prefix can also be filled on purpose (dual cache).
    """

    def __init__(self, config: ModelConfig, batch_size: int, capacity: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        shapes = [(batch_size, config.layer_kv_shape(i)[0], capacity, config.layer_kv_shape(i)[1])
                  for i in range(config.num_layers)]
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes]
        # token_conv models: each slot's attention input before the convolution (its source)
        conv_shape = (batch_size, 1, capacity, config.dim)
        self.h = [torch.zeros(conv_shape, device=device, dtype=dtype)
                  for _ in range(config.num_layers if config.token_conv else 0)]
        self.pos_BS = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)
        self.valid_BS = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.length_B = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.capacity = capacity
        self.end = 0  # one past the highest slot ever written: attention reads slots [0, end)

    @property
    def batch_size(self) -> int:
        return self.pos_BS.shape[0]

    def write_slots(self, slot_B: Tensor | None, pos_BL: Tensor, valid_BL: Tensor,
                    rows: list[int] | None = None) -> CacheWrite:
        """Record where this forward's valid tokens go (slot_B[b] + j) and their positions.

        rows: the cache row of each batch row (default 0..B-1). Padding tokens are never
        written, so they cannot clobber slots that hold real entries.
        """
        B, L = pos_BL.shape
        device = pos_BL.device
        read: slice | Tensor = slice(0, B)
        row_B = torch.arange(B, device=device)
        if rows is not None and rows != list(range(B)):
            row_B = torch.tensor(rows, device=device)
            read = row_B
        start_B = self.length_B[read] if slot_B is None else slot_B
        slots_BL = start_B[:, None] + torch.arange(L, device=device)
        if bool(valid_BL.all()):
            rows_N, slots_N, valid = row_B[:, None].expand(B, L), slots_BL, None
            top = int(start_B.max()) + L
        else:
            rows_N, slots_N = row_B[:, None].expand(B, L)[valid_BL], slots_BL[valid_BL]
            valid = valid_BL
            top = int(slots_N.max()) + 1 if slots_N.numel() else 0
        if top > self.capacity:
            raise ValueError(f"KV cache overflow: need {top} slots, capacity is {self.capacity}")
        self.end = max(self.end, top)
        write = CacheWrite(rows_N, slots_N, valid, read)
        self.pos_BS[rows_N, slots_N] = write.values(pos_BL)
        self.valid_BS[rows_N, slots_N] = True
        return write

    def write_read(self, layer: int, k_BLGD: Tensor, v_BLGD: Tensor,
                   write: CacheWrite) -> tuple[Tensor, Tensor]:
        """Store one layer's new keys/values in their slots; return every slot attention may read
        ([B, G, end, Dh] each, in the inputs' dtype)."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all[write.rows_N, :, write.slots_N] = write.values(k_BLGD).to(k_all.dtype)
        v_all[write.rows_N, :, write.slots_N] = write.values(v_BLGD).to(v_all.dtype)
        k_read, v_read = k_all[write.read, :, :self.end], v_all[write.read, :, :self.end]
        return k_read.to(k_BLGD.dtype), v_read.to(v_BLGD.dtype)

    def commit(self, num_B: Tensor) -> None:
        """Make the next num_B[b] written tokens of each row part of its permanent prefix."""
        self.length_B += num_B.to(self.length_B)

    def set_length(self, rows: list[int], lengths: list[int]) -> None:
        """Set the committed prefix length of some rows (the engine's commit after a step)."""
        index = torch.tensor(rows, device=self.length_B.device)
        self.length_B[index] = torch.tensor(lengths, device=self.length_B.device)

    def truncate(self, length_B: Tensor) -> None:
        """Forget everything from slot length_B[b] on (drop provisional or rejected entries)."""
        slot_S = torch.arange(self.capacity, device=self.pos_BS.device)
        self.valid_BS &= slot_S[None, :] < length_B[:, None]
        self.length_B = length_B.clone().to(self.length_B)

    def reset_rows(self, rows: list[int]) -> None:
        """Empty the given rows so new requests can use them (continuous batching)."""
        self.valid_BS[rows] = False
        self.length_B[rows] = 0
        used_S = self.valid_BS.any(0).nonzero()
        self.end = int(used_S.max()) + 1 if used_S.numel() else 0


@dataclass
class ModelOutput:
    logits: Tensor  # [B, L, V], or [N, V] for the positions selected by logits_mask_BL
    moe: MoEStats | None
    hidden_BLD: Tensor | None = None


def visibility(mode: str, block_size: int, q_pos_BL: Tensor, k_pos_BS: Tensor) -> Tensor:
    """Which keys each query may see, [B, L, S], from positions alone (before validity)."""
    q, k = q_pos_BL[:, :, None], k_pos_BS[:, None, :]
    if mode == "causal":
        return k <= q
    if mode == "block":
        return torch.div(k, block_size, rounding_mode="floor") <= torch.div(
            q, block_size, rounding_mode="floor")
    return torch.ones_like(k <= q)


class TokenConv(nn.Module):
    """h_p + sum_k w_k * h_(p-k), k = 0..width-1, per channel (a causal depthwise convolution).

    Like attention, it works on positions, not tensor layout: the h at position p - k is the one
    the query at p may *see* (its visibility row), from this forward or from the cache. So cached
    decoding equals a full forward, and in training's noisy+clean layout a noisy block takes its
    first predecessors from the clean block before it, as it will when decoding.
    """

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width, dim))  # [k, D]; init_weights fills it

    def forward(self, h_BLD: Tensor, src_BSD: Tensor, q_pos_BL: Tensor, k_pos_BS: Tensor,
                mask_BLS: Tensor) -> Tensor:
        w = self.weight.to(h_BLD.dtype)
        out = h_BLD * (1 + w[0])
        delta_BLS = q_pos_BL[:, :, None] - k_pos_BS[:, None, :]
        for k in range(1, w.shape[0]):
            pick_BLS = (mask_BLS & (delta_BLS == k)).to(h_BLD.dtype)
            # one visible slot per position; the sum keeps padding queries (see all) finite
            pick_BLS = pick_BLS / pick_BLS.sum(-1, keepdim=True).clamp(min=1)
            out = out + w[k] * (pick_BLS @ src_BSD.to(h_BLD.dtype))
        return out


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.dim, config.num_heads * self.head_dim, bias=config.qkv_bias)
        kv_out = config.num_kv_heads * self.head_dim
        self.k_proj = nn.Linear(config.dim, kv_out, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.dim, kv_out, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * self.head_dim, config.dim, bias=False)
        self.q_norm = self.k_norm = None
        self.qk_norm_all = config.qk_norm_scope == "all"  # one norm over all heads (OLMoE)
        if config.qk_norm:
            q_dim, k_dim = ((config.num_heads * self.head_dim, kv_out) if self.qk_norm_all
                            else (self.head_dim, self.head_dim))
            self.q_norm = RMSNorm(q_dim, config.norm_eps)
            self.k_norm = RMSNorm(k_dim, config.norm_eps)
        # set by `CloverModel.fuse_projections` (inference only; see clover/model/fused.py)
        self.qkv_fast: FastLinear | None = None
        self.o_fast: FastLinear | None = None

    def fuse(self, enabled: bool = True, pack: bool = False) -> None:
        qkv, o = ("q_proj", "k_proj", "v_proj"), ("o_proj",)
        self.qkv_fast = FastLinear.build(self, qkv, pack) if enabled else None
        self.o_fast = FastLinear.build(self, o, pack) if enabled else None

    def forward(self, x_BLD: Tensor, rope: tuple[Rotary, Tensor, Tensor], mask_BLS: Tensor,
                cache: KVCache | None, write: CacheWrite | None) -> Tensor:
        B, L, _ = x_BLD.shape
        q_BLHD, k_BLGD, v_BLGD = self._qkv_roped(x_BLD, rope)
        q, k, v = q_BLHD.transpose(1, 2), k_BLGD.transpose(1, 2), v_BLGD.transpose(1, 2)
        if cache is not None:
            k, v = cache.write_read(self.layer, k_BLGD, v_BLGD, write)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_BLS[:, None],
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return linear(self.o_fast, out.transpose(1, 2).reshape(B, L, -1), self.o_proj)

    def _qkv_roped(self, x_BLD: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """q, k (normed if configured, rotated) and v, each [B, L, heads, Dh].

        Fused path: one matmul for q, k and v, and one rotation for q and k together (they are
        adjacent in its output); the reference runs the three projections and rotations apart."""
        B, L, _ = x_BLD.shape
        H, G, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        rotary, cos, sin = rope
        qkv = self.qkv_fast(x_BLD) if self.qkv_fast is not None else None
        if qkv is None:
            q, k, v = self.q_proj(x_BLD), self.k_proj(x_BLD), self.v_proj(x_BLD)
        else:
            qkv_BLXD = qkv.view(B, L, H + 2 * G, Dh)
            if self.q_norm is None:
                qk_BLXD = rotary.apply(qkv_BLXD[:, :, :H + G], cos, sin)
                return qk_BLXD[:, :, :H], qk_BLXD[:, :, H:], qkv_BLXD[:, :, H + G:]
            q, k, v = qkv_BLXD.split((H, G, G), dim=2)
        if self.q_norm is not None and self.qk_norm_all:  # OLMoE: before splitting heads
            q, k = self.q_norm(q.reshape(B, L, H * Dh)), self.k_norm(k.reshape(B, L, G * Dh))
        q, k, v = q.reshape(B, L, H, Dh), k.reshape(B, L, G, Dh), v.reshape(B, L, G, Dh)
        if self.q_norm is not None and not self.qk_norm_all:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotary.apply(q, cos, sin), rotary.apply(k, cos, sin), v


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.token_conv = TokenConv(config.dim, config.token_conv) if config.token_conv else None
        self.attn = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.is_moe = config.layer_is_moe(layer)
        self.ffn = MoE(config) if self.is_moe else SwiGLU(config.dim, config.ffn_dim)

    @property
    def routed_experts(self) -> nn.Module | None:
        """The layer's routed experts (None for a dense layer); what `clover inspect` counts."""
        return self.ffn.experts if self.is_moe else None

    def forward(self, x_BLD: Tensor, rope, mask_BLS, cache, write, valid_N, stats: list,
                positions: tuple[Tensor, Tensor]):
        h_BLD = self.attn_norm(x_BLD)
        if self.token_conv is not None:
            h_BLD = self.token_conv(h_BLD, self._conv_sources(h_BLD, cache, write), *positions,
                                    mask_BLS)
        x_BLD = x_BLD + self.attn(h_BLD, rope, mask_BLS, cache, write)
        h_BLD = self.ffn_norm(x_BLD)
        if not self.is_moe:
            return x_BLD + self.ffn(h_BLD)
        B, L, D = h_BLD.shape
        out_ND, aux, counts_E = self.ffn(h_BLD.reshape(B * L, D), valid_N)
        stats.append((aux, counts_E))
        return x_BLD + out_ND.view(B, L, D)

    def _conv_sources(self, h_BLD: Tensor, cache: KVCache | None,
                      write: CacheWrite | None) -> Tensor:
        """The convolution's inputs at every key slot: this forward's own, or (with a cache)
        written into the cache first and read back with every slot attention may read."""
        if cache is None:
            return h_BLD
        h_all = cache.h[self.layer]
        h_all[write.rows_N, 0, write.slots_N] = write.values(h_BLD).to(h_all.dtype)
        return h_all[write.read, 0, :cache.end]


class CloverModel(nn.Module):
    """Token ids + positions (+ cache) in; logits for the requested positions and MoE stats out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.rotary = Rotary(config)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(
            config.dim, config.vocab_size, bias=False)
        self.head_fast: FastLinear | None = None  # set by `fuse_projections`
        self.compiled: CompiledForward | None = None  # set by `compile_forward`

    def forward(self, ids_BL: Tensor, pos_BL: Tensor | None = None, *, cache: KVCache | None = None,
                slot_B: Tensor | None = None, cache_rows: list[int] | None = None,
                valid_BL: Tensor | None = None,
                logits_mask_BL: Tensor | None = None, attn_mask_BLS: Tensor | None = None,
                return_hidden: bool = False) -> ModelOutput:
        """Run the model on new tokens.

        pos_BL: absolute positions (default: after the cached prefix, or 0..L-1).
        cache/slot_B: write the new keys into the cache at slot_B (default: after the prefix) and
            attend to every valid slot; the cache's length only grows on `cache.commit`.
        cache_rows: which cache row each batch row uses (default: row b is cache row b).
        valid_BL: False for padding tokens (they are neither attended to nor counted).
        logits_mask_BL: compute logits only where True; logits come back as [N, V].
        attn_mask_BLS: replace the mode's visibility (e.g. training's noisy+clean layout).
        """
        B, L = ids_BL.shape
        if pos_BL is None:
            start_B = ids_BL.new_zeros(B)
            if cache is not None:
                start_B = cache.length_B[cache_rows if cache_rows is not None else slice(0, B)]
            pos_BL = start_B[:, None] + torch.arange(L, device=ids_BL.device)
        valid_BL = torch.ones_like(ids_BL, dtype=torch.bool) if valid_BL is None else valid_BL
        write, mask_BLS, k_pos_BS = self._attention_mask(pos_BL, valid_BL, cache, slot_B,
                                                         cache_rows, attn_mask_BLS)
        if self.compiled is not None and self.compiled.applies(write, attn_mask_BLS,
                                                               return_hidden):
            return ModelOutput(self.compiled(ids_BL, pos_BL, mask_BLS, write, cache,
                                             logits_mask_BL), None)
        x_BLD = embed_tokens(self.embed, ids_BL)
        rope = (self.rotary, *self.rotary.cos_sin(pos_BL, x_BLD.dtype))
        stats: list = []
        valid_N = valid_BL.reshape(-1)
        for layer in self.layers:
            x_BLD = layer(x_BLD, rope, mask_BLS, cache, write, valid_N, stats, (pos_BL, k_pos_BS))
        h_BLD = self.norm(x_BLD)
        h_sel = h_BLD if logits_mask_BL is None else h_BLD[logits_mask_BL]
        logits = self.project(h_sel)
        return ModelOutput(logits, self._moe_stats(stats), h_BLD if return_hidden else None)

    def fuse_projections(self, enabled: bool = True, pack: bool = True) -> CloverModel:
        """Inference fast paths (clover/model/fused.py): q/k/v and gate/up as one matmul each
        (no copy, same state dict) and, with `pack` on a bf16 or fp32 CPU model, oneDNN-prepacked
        weights for small inputs. Layers that cannot fuse keep their separate projections;
        `enabled=False` goes back to the separate ones everywhere (the reference)."""
        for module in self.modules():
            if isinstance(module, (Attention, SwiGLU)):
                module.fuse(enabled, pack)
        head = ("embed",) if self.lm_head is None else ("lm_head",)
        self.head_fast = FastLinear.build(self, head, pack) if enabled else None
        return self

    def compile_forward(self, enabled: bool = True) -> bool:
        """Cached forwards through one compiled graph (clover/model/compiled.py) where the model
        allows it; False when it does not (eager stays)."""
        self.compiled = CompiledForward.build(self) if enabled else None
        return self.compiled is not None

    def project(self, h: Tensor) -> Tensor:
        """LM head (tied to the embedding when configured)."""
        out = self.head_fast(h) if self.head_fast is not None else None
        if out is not None:
            return out
        return tied_head(self.embed, h) if self.lm_head is None else self.lm_head(h)

    def _attention_mask(self, pos_BL, valid_BL, cache, slot_B, cache_rows, attn_mask_BLS):
        cfg = self.config
        if cache is None:
            k_pos_BS, k_valid_BS, write = pos_BL, valid_BL, None
        else:
            write = cache.write_slots(slot_B, pos_BL, valid_BL, cache_rows)
            k_pos_BS = cache.pos_BS[write.read, :cache.end]
            k_valid_BS = cache.valid_BS[write.read, :cache.end]
        if attn_mask_BLS is None:
            attn_mask_BLS = visibility(cfg.attention, cfg.block_size, pos_BL, k_pos_BS)
        mask_BLS = attn_mask_BLS & k_valid_BS[:, None, :]
        # Padding queries see every slot, so no softmax row is empty (their output is ignored).
        return write, mask_BLS | ~valid_BL[:, :, None], k_pos_BS

    def _moe_stats(self, stats: list) -> MoEStats | None:
        if not stats:
            return None
        aux = torch.stack([a for a, _ in stats]).sum()
        return MoEStats(aux_loss=aux, counts_LE=torch.stack([c for _, c in stats]))


def init_weights(model: CloverModel, std: float = 0.02) -> None:
    """Normal(0, std) for matrices, ones for norms, scaled-down output projections."""
    depth_scale = (2 * model.config.num_layers) ** -0.5
    for name, p in model.named_parameters():
        if name.endswith("token_conv.weight"):
            nn.init.normal_(p, std=0.1)  # as in benchmarks/copy_probe.py, where it was measured
        elif p.ndim == 1 and name.endswith("weight"):
            nn.init.ones_(p)
        elif p.ndim == 1:
            nn.init.zeros_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
            nn.init.normal_(p, std=std * depth_scale)
        else:
            nn.init.normal_(p, std=std)
