"""The model runner: the only engine code that touches the device.

It owns the model and the KV cache, turns a `ScheduledBatch` (plain lists) into padded tensors,
runs one forward with logits only where a masked position needs them, and commits each row's
exact cache prefix. Tensors in, logits out; it knows nothing about policies or tokenizers.
"""

# Shapes: B rows, L padded input length, N positions needing logits, V vocab

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from clover.engine.scheduler import ScheduledBatch
from clover.model import CloverModel, KVCache


@dataclass
class RunOutput:
    logits_NV: Tensor
    row_N: Tensor  # batch row of each logits position
    col_N: Tensor  # its index among that row's masked positions
    row_of: list[int]
    unique_experts: float  # mean over MoE layers of experts touched in this forward


class ModelRunner:
    def __init__(self, model: CloverModel, max_batch_size: int, capacity: int) -> None:
        self.model = model.fuse_projections()
        self.config = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_batch_size = max_batch_size
        self.cache = KVCache(self.config, max_batch_size, capacity, self.device, self.dtype)

    def ensure_capacity(self, capacity: int) -> None:
        """Grow every row's slot count to at least `capacity`, keeping what is cached."""
        if capacity <= self.cache.capacity:
            return
        old = self.cache
        new = KVCache(self.config, self.max_batch_size, capacity, self.device, self.dtype)
        for dst, src in ((new.k, old.k), (new.v, old.v), (new.h, old.h)):
            for d, s in zip(dst, src, strict=True):
                d[:, :, :old.capacity] = s
        new.pos_BS[:, :old.capacity] = old.pos_BS
        new.valid_BS[:, :old.capacity] = old.valid_BS
        new.length_B.copy_(old.length_B)
        new.end = old.end
        self.cache = new

    def release(self, rows: list[int]) -> None:
        if rows:
            self.cache.reset_rows(rows)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> RunOutput:
        ids_BL, pos_BL, valid_BL, need_BL = self._inputs(batch)
        slot_B = torch.tensor([p.start for p in batch.rows], device=self.device)
        rows = [p.request.row for p in batch.rows]
        out = self.model(ids_BL, pos_BL, cache=self.cache, slot_B=slot_B, cache_rows=rows,
                         valid_BL=valid_BL, logits_mask_BL=need_BL)
        self._commit(batch, rows)
        row_of = [b for b, p in enumerate(batch.rows) for _ in p.logits_at]
        col = [j for p in batch.rows for j in range(len(p.logits_at))]
        experts = float(out.moe.unique_experts.float().mean()) if out.moe is not None else 0.0
        return RunOutput(out.logits, torch.tensor(row_of, device=self.device),
                         torch.tensor(col, device=self.device), row_of, experts)

    def _inputs(self, batch: ScheduledBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        B, L = len(batch.rows), max(len(p.tokens) for p in batch.rows)
        ids = [[self.config.pad_id] * L for _ in range(B)]
        need = [[False] * L for _ in range(B)]
        valid = [[False] * L for _ in range(B)]
        for b, p in enumerate(batch.rows):
            n = len(p.tokens)
            ids[b][:n] = p.tokens
            valid[b][:n] = [True] * n
            for j in p.logits_at:
                need[b][j] = True
        start_B = torch.tensor([p.start for p in batch.rows], device=self.device)
        pos_BL = start_B[:, None] + torch.arange(L, device=self.device)
        as_t = lambda x, dt: torch.tensor(x, dtype=dt, device=self.device)
        return as_t(ids, torch.long), pos_BL, as_t(valid, torch.bool), as_t(need, torch.bool)

    def _commit(self, batch: ScheduledBatch, rows: list[int]) -> None:
        commits = [(r, p.commit_len) for r, p in zip(rows, batch.rows, strict=True)
                   if p.commit_len is not None]
        if commits:
            self.cache.set_length([r for r, _ in commits], [n for _, n in commits])
