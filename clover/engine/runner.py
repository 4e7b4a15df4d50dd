"""The model runner: the only engine code that touches the device.

It owns the model and the KV cache, turns a `ScheduledBatch` (plain lists) into padded tensors,
runs one forward with logits only where a masked position needs them, and commits each row's
exact cache prefix. Tensors in, logits out; it knows nothing about policies or tokenizers. It also
builds the few other device tensors a step needs: per-position values laid out by row
(`RunOutput.by_row`) and per-row values (`per_row`).
"""

# Shapes: B rows, L padded input length, N positions needing logits, M masked positions per row
# (padded), V vocab

from __future__ import annotations

import warnings
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
    masked_BM: Tensor  # True where (row, column) is a real masked position

    def by_row(self, x_N: Tensor, fill: float | int) -> Tensor:
        """Per-position values laid out [B, M] by row; `fill` where a row has fewer positions."""
        out_BM = torch.full(self.masked_BM.shape, fill, dtype=x_N.dtype, device=x_N.device)
        return out_BM.index_put_((self.row_N, self.col_N), x_N)


class ModelRunner:
    def __init__(self, model: CloverModel, max_batch_size: int, capacity: int,
                 compile: bool = False) -> None:
        self.model = model.fuse_projections()
        if compile and not (hasattr(model, "compile_forward") and model.compile_forward()):
            warnings.warn(f"--compile: {type(model).__name__} ({model.config.arch}) has parts the "
                          "compiled forward does not cover; running eager", stacklevel=2)
        self.config = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_batch_size = max_batch_size
        self.cache = KVCache(self.config, max_batch_size, capacity, self.device, self.dtype)
        # canvas models: each cache row's self-conditioning input for its next step, [C, D]
        self.soft: dict[int, Tensor] = {}

    @property
    def compiled(self) -> bool:
        """Whether the model's cached forwards run as one compiled graph."""
        return getattr(self.model, "compiled", None) is not None

    def ensure_capacity(self, capacity: int) -> None:
        """Grow every row's slot count to at least `capacity`, keeping what is cached."""
        if capacity > self.cache.capacity:
            self.cache = grown(self.cache, self.config, capacity)

    def release(self, rows: list[int]) -> None:
        if rows:
            self.cache.reset_rows(rows)
        for row in rows:
            self.soft.pop(row, None)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> RunOutput:
        ids_BL, pos_BL, valid_BL, need_BL = self._inputs(batch)
        slot_B = torch.tensor([p.start for p in batch.rows], device=self.device)
        rows = [p.request.row for p in batch.rows]
        extra = self._canvas_inputs(batch, ids_BL.shape[1]) \
            if self.config.attention == "canvas" else {}
        out = self.model(ids_BL, pos_BL, cache=self.cache, slot_B=slot_B, cache_rows=rows,
                         valid_BL=valid_BL, logits_mask_BL=need_BL, **extra)
        self._commit(batch, rows)
        row_of = [b for b, p in enumerate(batch.rows) for _ in p.logits_at]
        col = [j for p in batch.rows for j in range(len(p.logits_at))]
        experts = float(out.moe.unique_experts.float().mean()) if out.moe is not None else 0.0
        M = max(len(p.masked) for p in batch.rows)
        masked = [[j < len(p.masked) for j in range(M)] for p in batch.rows]
        return RunOutput(out.logits, torch.tensor(row_of, device=self.device),
                         torch.tensor(col, device=self.device), row_of, experts,
                         self.per_row(masked, torch.bool))

    def _canvas_inputs(self, batch: ScheduledBatch, L: int) -> dict[str, Tensor]:
        """Where each row's canvas starts (its last len(masked) tokens) and the canvas tokens'
        self-conditioning input (zero at a block's first step)."""
        start = [p.start + len(p.tokens) - len(p.masked) for p in batch.rows]
        soft_BLD = torch.zeros(len(batch.rows), L, self.config.dim, device=self.device,
                               dtype=self.dtype)
        for b, p in enumerate(batch.rows):
            soft = self.soft.get(p.request.row)
            if soft is not None and p.request.steps_in_block > 0:
                soft_BLD[b, len(p.tokens) - len(p.masked):len(p.tokens)] = soft
        return {"canvas_start_B": self.per_row(start, torch.long), "soft_BLD": soft_BLD}

    def set_soft(self, batch: ScheduledBatch, processed_NV: Tensor) -> None:
        """Keep each row's self-conditioning input for its next step, from this step's
        temperature-processed logits (rows in batch order, one per canvas position)."""
        soft_ND = self.model.soft_embedding(processed_NV.to(self.dtype))
        start = 0
        for p in batch.rows:
            n = len(p.masked)
            self.soft[p.request.row] = soft_ND[start:start + n]
            start += n

    def per_row(self, values: list, dtype: torch.dtype) -> Tensor:
        """Plain values (one per row, or one list per row) as a tensor on the model's device."""
        return torch.tensor(values, dtype=dtype, device=self.device)

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
        return (self.per_row(ids, torch.long), pos_BL, self.per_row(valid, torch.bool),
                self.per_row(need, torch.bool))

    def _commit(self, batch: ScheduledBatch, rows: list[int]) -> None:
        commits = [(r, p.commit_len) for r, p in zip(rows, batch.rows, strict=True)
                   if p.commit_len is not None]
        if commits:
            self.cache.set_length([r for r, _ in commits], [n for _, n in commits])


def grown(old: KVCache, config, capacity: int) -> KVCache:
    """A copy of `old` with `capacity` slots a row, keeping what is cached."""
    new = KVCache(config, old.batch_size, capacity, old.k[0].device, old.k[0].dtype)
    for dst, src in ((new.k, old.k), (new.v, old.v), (new.h, old.h)):
        for d, s in zip(dst, src, strict=True):
            d[:, :, :old.capacity] = s
    new.pos_BS[:, :old.capacity] = old.pos_BS
    new.valid_BS[:, :old.capacity] = old.valid_BS
    new.length_B.copy_(old.length_B)
    new.end = old.end
    return new
