"""Measurements beside the engine's own stats: FLOPs per forward, peak memory, matmul peak.

`ForwardProbe` wraps one engine's `runner.run` (the only code that touches the device; a
`SpecEngine`'s `decoder.forward_rows`) to count
the useful FLOPs of every forward (2 x active matmul parameters x tokens, the LM head at the
positions that need logits, attention over the keys each token may see) and to sample resident
memory after it. `matmul_peak` measures this machine's dense matmul FLOP/s in a given dtype, so a
forward's achieved FLOP/s can be read as a fraction of what the hardware does at best.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from clover.config import ModelConfig
from clover.engine import Engine
from clover.engine.stats import max_rss
from clover.model import CloverModel


def active_matmul_params(model: CloverModel) -> int:
    """Weights one token multiplies through: attention, dense FFNs, routers, shared experts and
    its top-k routed experts. Excludes the embedding (a lookup) and the LM head (counted apart)."""
    cfg = model.config
    total = 0
    for block in model.layers:
        ffn = block.ffn
        total += sum(p.numel() for p in block.attn.parameters() if p.ndim == 2)
        if not block.is_moe:
            total += sum(p.numel() for p in ffn.parameters() if p.ndim == 2)
            continue
        total += ffn.router.gate.weight.numel()
        total += 3 * cfg.dim * cfg.expert_ffn_dim * cfg.num_experts_per_tok
        if ffn.shared is not None:
            total += sum(p.numel() for p in ffn.shared.parameters() if p.ndim == 2)
    return total


@dataclass
class ForwardCount:
    forwards: int = 0
    tokens: int = 0  # input tokens over all forwards (padding excluded)
    logits: int = 0  # positions that got logits
    attended: int = 0  # sum over tokens of the keys each may see (causal / block bound)
    peak_rss_bytes: int = 0

    def flops(self, config: ModelConfig, matmul_params: int) -> float:
        attention = 4 * config.num_layers * config.num_heads * config.head_dim * self.attended
        return (2.0 * matmul_params * self.tokens + 2.0 * config.dim * config.vocab_size
                * self.logits + attention)


class ForwardProbe:
    """Counts what each forward of one engine computes; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.count = ForwardCount()
        decoder = getattr(engine, "decoder", None)  # a SpecEngine: the pair's forwards
        if decoder is not None:
            self._rows = decoder.forward_rows
            decoder.forward_rows = self._counted_rows
            return
        self._run = engine.runner.run
        engine.runner.run = self._counted

    def _counted_rows(self, cache, rows, clean, n_mask, last_only=False):
        """A self-speculative forward: each row's clean tokens then its masks (every position
        gets logits unless `last_only`); a token sees the row's cache and the row's input."""
        starts = cache.length_B[rows].tolist()
        out = self._rows(cache, rows, clean, n_mask, last_only)
        c = self.count
        c.forwards += 1
        for start, tokens, m in zip(starts, clean, n_mask, strict=True):
            n = len(tokens) + m
            c.tokens += n
            c.logits += 1 if last_only else n
            c.attended += n * (start + n)
        c.peak_rss_bytes = max(c.peak_rss_bytes, current_rss())
        return out

    def _counted(self, batch):
        out = self._run(batch)
        c = self.count
        c.forwards += 1
        for p in batch.rows:
            n = len(p.tokens)
            c.tokens += n
            c.logits += len(p.logits_at)
            # keys a token may see: the row's cached prefix plus its own input (exact for block
            # attention; an upper bound for causal; a `full` canvas's cached suffix is left out)
            c.attended += n * (p.start + n)
        c.peak_rss_bytes = max(c.peak_rss_bytes, current_rss())
        return out


def current_rss() -> int:
    """Resident set size now (Linux /proc), else the process high-water mark."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return max_rss()


# a square matmul and a transformer-sized [tokens x dim] @ [hidden x dim].T (F.linear's layout): a
# CPU kernel can be far faster on one (bf16 emulated on an AVX2-only EPYC, 2 threads: 0.8 GFLOP/s
# square, 18 on the second)
CPU_PEAK_SHAPES = ((1024, 1024, 1024), (2048, 576, 1536))


@torch.inference_mode()
def matmul_peak(dtype: torch.dtype, device: torch.device, seconds: float = 1.0,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Best FLOP/s of dense matmuls in `dtype` on `device`, over about `seconds`: a 2048-square one
    on CUDA, the best of CPU_PEAK_SHAPES on a CPU (`clock`: time.process_time for this process's
    CPU time, steadier on a shared machine)."""
    cuda = device.type == "cuda"
    shapes = ((2048, 2048, 2048),) if cuda else CPU_PEAK_SHAPES
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rate = 0.0
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(n, k, device=device).to(dtype).T  # F.linear's layout: weight [out, in]
        (a @ b).sum().item()  # warm-up
        best, spent = float("inf"), 0.0
        while spent < seconds / len(shapes):
            sync()
            t0 = clock()
            for _ in range(4):
                a @ b
            sync()
            took = (clock() - t0) / 4
            best, spent = min(best, took), spent + 4 * took
        rate = max(rate, 2.0 * m * k * n / best)
    return rate
