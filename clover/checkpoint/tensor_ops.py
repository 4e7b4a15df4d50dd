"""Tensor reshaping that a key map cannot express: fused QKV and per-expert weights.

Some families store what Clover keeps apart (BailingMoeV2's fused `query_key_value`), or apart
what Clover keeps stacked (one `experts.E.*_proj` matrix per expert where Clover holds one
[E, ...] tensor). These functions rewrite a HF-named state dict into an equivalent one with
*intermediate* names that the family's declarative key map then renames, and back for export.
Every function is exact (pure slicing / stacking) and raises CheckpointError naming the key when
a part is missing. Shapes: H query heads, G kv heads, Dh head dim, D dim, E experts.
"""

from __future__ import annotations

import re

import torch

from clover.checkpoint.keymap import CheckpointError

Tensors = dict[str, torch.Tensor]


def split_qkv(tensors: Tensors, fused: str, parts: tuple[str, str, str],
              heads: tuple[int, int], head_dim: int) -> Tensors:
    """Split every `fused` key (a pattern with `{}` for the layer) into q, k, v keys.

    The fused rows are [H*Dh | G*Dh | G*Dh] (weights and biases alike), as BailingMoeV2's
    `query_key_value` views its output as H + 2G heads and splits them in that order.
    """
    H, G = heads
    sizes = [H * head_dim, G * head_dim, G * head_dim]
    regex = _regex(fused)
    out: Tensors = {}
    for key, tensor in tensors.items():
        match = regex.match(key)
        if match is None:
            out[key] = tensor
            continue
        if tensor.shape[0] != sum(sizes):
            raise CheckpointError(f"key {key!r} has {tensor.shape[0]} rows; (H + 2G) * Dh = "
                                  f"{sum(sizes)} expected")
        for part, piece in zip(parts, torch.split(tensor, sizes, dim=0), strict=True):
            out[part.format(*match.groups())] = piece.contiguous()
    return out


def fuse_qkv(tensors: Tensors, fused: str, parts: tuple[str, str, str]) -> Tensors:
    """Inverse of `split_qkv`: concatenate each layer's q, k, v rows into the `fused` key."""
    regex = _regex(parts[0])
    out = dict(tensors)
    for key in [k for k in tensors if regex.match(k)]:
        groups = regex.match(key).groups()
        names = [p.format(*groups) for p in parts]
        out[fused.format(*groups)] = torch.cat([out.pop(n) for n in names], dim=0)
    return out


def stack_experts(tensors: Tensors, per_expert: str, stacked: str, num_experts: int) -> Tensors:
    """Stack `per_expert` keys (pattern with `{}` for layer then expert) into one [E, ...] key per
    layer named `stacked` (pattern with `{}` for the layer). Every expert 0..E-1 must be present."""
    regex = _regex(per_expert)
    found: dict[str, dict[int, torch.Tensor]] = {}
    out: Tensors = {}
    for key, tensor in tensors.items():
        match = regex.match(key)
        if match is None:
            out[key] = tensor
            continue
        layer, expert = match.groups()
        found.setdefault(layer, {})[int(expert)] = tensor
    for layer, experts in found.items():
        missing = sorted(set(range(num_experts)) - set(experts))
        if missing or len(experts) != num_experts:
            name = per_expert.format(layer, missing[0] if missing else max(experts))
            raise CheckpointError(f"key {name!r}: expected experts 0..{num_experts - 1} "
                                  f"(config num_experts={num_experts})")
        out[stacked.format(layer)] = torch.stack([experts[e] for e in range(num_experts)])
    return out


def unstack_experts(tensors: Tensors, stacked: str, per_expert: str) -> Tensors:
    """Inverse of `stack_experts`: one key per expert from each stacked [E, ...] tensor."""
    regex = _regex(stacked)
    out: Tensors = {}
    for key, tensor in tensors.items():
        match = regex.match(key)
        if match is None:
            out[key] = tensor
            continue
        for e in range(tensor.shape[0]):
            out[per_expert.format(*match.groups(), e)] = tensor[e].contiguous()
    return out


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(r"\{\}", r"(\d+)") + "$")
