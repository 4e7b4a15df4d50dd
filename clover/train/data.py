"""Training data: token examples, deterministic batch order, and collation into padded batches.

An example is a token sequence plus the length of its prompt (0 for plain text). Which examples a
step uses, and the noise seed of each, are pure functions of (seed, step, slot in the global batch),
so a run resumed at step s, or split over N processes, sees exactly the data of an uninterrupted
single-process run. Collation pads to a common length; rows always start at position 0, so blocks
(pos // block_size) line up across rows. Nothing here touches a model.
"""

# Shapes: B batch, L length

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

EOS_FILLS = ("none", "block", "length")


@dataclass(frozen=True)
class TokenExample:
    """One training sequence. The first `prompt_len` tokens are context only: never noised,
    never a target (SFT); the rest (response, ending in EOS) is what the model learns."""

    ids: tuple[int, ...]
    prompt_len: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.prompt_len < len(self.ids):
            raise ValueError(f"TokenExample.prompt_len={self.prompt_len} must be in "
                             f"[0, {len(self.ids)}): every example needs a target token")


def sft_example(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> TokenExample:
    """Prompt (context) + response (targets; it should end with EOS)."""
    return TokenExample(tuple(prompt_ids) + tuple(response_ids), len(prompt_ids))


@dataclass
class Batch:
    ids_BL: Tensor  # x_0: prompt + response + EOS fill, then padding
    pos_BL: Tensor  # absolute positions, 0..L-1 in every row
    valid_BL: Tensor  # False on padding
    target_BL: Tensor  # positions the loss is over (diffusion: maskable; causal: predicted)
    seed_B: Tensor  # per-row noise seed (int64)
    length_B: Tensor  # valid tokens per row

    @property
    def num_tokens(self) -> int:
        return int(self.length_B.sum())

    @property
    def num_targets(self) -> int:
        return int(self.target_BL.sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    def from_position(self, start: int) -> Batch:
        """The batch without its first `start` positions (a shared prefix run apart)."""
        return Batch(self.ids_BL[:, start:], self.pos_BL[:, start:], self.valid_BL[:, start:],
                     self.target_BL[:, start:], self.seed_B, self.length_B - start)


@dataclass(kw_only=True)
class Collator:
    """Pads examples into a `Batch` for one attention mode.

    eos_fill: `block` appends EOS up to the next block boundary (block models decode whole blocks,
    so they learn to stop by filling the last one with EOS); `length` fills to the batch length
    (LLaDA-style SFT for `full` models); `none` leaves the response as it is (causal).
    first_target: the earliest position that can be a target: 1 when position i is predicted from
    i - 1 (causal, or shifted diffusion logits), else 0.
    """

    pad_id: int
    eos_id: int
    block_size: int = 1
    eos_fill: str = "none"
    pad_multiple: int = 1
    first_target: int = 0

    def __post_init__(self) -> None:
        if self.eos_fill not in EOS_FILLS:
            raise ValueError(f"Collator.eos_fill must be one of {EOS_FILLS}, got {self.eos_fill!r}")

    def __call__(self, examples: Sequence[TokenExample], seeds: Sequence[int]) -> Batch:
        rows = [self._filled(ex) for ex in examples]
        L = _round_up(max(len(r) for r in rows), max(self.pad_multiple, 1))
        if self.eos_fill == "length":
            rows = [r + [self.eos_id] * (L - len(r)) for r in rows]
        ids_BL = torch.full((len(rows), L), self.pad_id, dtype=torch.long)
        length_B = torch.tensor([len(r) for r in rows])
        for b, r in enumerate(rows):
            ids_BL[b, :len(r)] = torch.tensor(r)
        pos_BL = torch.arange(L).expand(len(rows), L).contiguous()
        valid_BL = pos_BL < length_B[:, None]
        prompt_B = torch.tensor([max(ex.prompt_len, self.first_target) for ex in examples])
        target_BL = valid_BL & (pos_BL >= prompt_B[:, None])
        return Batch(ids_BL, pos_BL, valid_BL, target_BL, torch.tensor(list(seeds)), length_B)

    def _filled(self, ex: TokenExample) -> list[int]:
        ids = list(ex.ids)
        if self.eos_fill == "block":
            ids += [self.eos_id] * (_round_up(len(ids), self.block_size) - len(ids))
        return ids


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---- deterministic order ------------------------------------------------------------------------

@lru_cache(maxsize=4)
def _epoch_order(num_examples: int, seed: int, epoch: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(mix_seed(seed, epoch, 0x5EED))
    return tuple(torch.randperm(num_examples, generator=gen).tolist())


def step_indices(step: int, global_batch: int, num_examples: int, seed: int) -> list[int]:
    """Example indices of the global batch at `step` (0-based): epochs of seeded permutations."""
    out = []
    for k in range(step * global_batch, (step + 1) * global_batch):
        epoch, i = divmod(k, num_examples)
        out.append(_epoch_order(num_examples, seed, epoch)[i])
    return out


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and Python runs, unlike hash())."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3 + 0x9E3779B97F4A7C15) % (1 << 64)
        h ^= h >> 29
    return h % (1 << 63)


def noise_seeds(seed: int, step: int, slots: Sequence[int]) -> list[int]:
    """Noise seed of each slot of the global batch at `step` (step -1: validation)."""
    return [mix_seed(seed, step, k) for k in slots]


def shard(items: Sequence, rank: int, world: int) -> list:
    """This rank's contiguous share of a global batch (which must divide evenly)."""
    if len(items) % world:
        raise ValueError(f"batch of {len(items)} does not split over {world} processes")
    per = len(items) // world
    return list(items[rank * per:(rank + 1) * per])


def chunks(items: Sequence, size: int) -> list[list]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]
