"""Prefix caching: the keys and values of prompt heads that earlier requests computed, reused.

Requests that share a prompt head (an agent's system prompt and tools, a few-shot preamble) need
its keys and values computed once. After a request's prompt is in its cache row, each whole chunk
of `chunk` prompt tokens is copied out, keyed by the chunk's tokens and the key of the chunk
before it (so a chunk matches only behind the same head, as vLLM's automatic prefix caching
does). A new request takes the longest run of stored chunks that its prompt starts with into its
cache row and feeds the model only the rest. Chunks are kept in least-recently-used order within
a byte budget; a head is used more recently than its tails, so tails go first.

Exact for `causal` attention, and for `block` attention because chunks end on block boundaries
(a finished block's keys depend on it and earlier blocks only). `full` attention models (every
key sees the whole canvas) are never cached. At least the prompt's last token is always fed, so
the logits the first step reads are computed as without the cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from clover.config import ModelConfig
from clover.model import KVCache

ChunkKey = tuple[int, tuple[int, ...]]  # (hash of the previous chunk's key, this chunk's tokens)


class PrefixCache:
    def __init__(self, config: ModelConfig, budget_mb: float, chunk: int = 16) -> None:
        if budget_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (got {budget_mb})")
        self.enabled = budget_mb > 0 and config.attention != "full"
        self.chunk = math.lcm(chunk, config.block_size if config.attention == "block" else 1)
        self.budget = int(budget_mb * 2**20)
        self.entries: OrderedDict[ChunkKey, list[torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.queried_tokens = 0  # prompt tokens of admitted requests
        self.hit_tokens = 0  # of those, the ones taken from the cache

    def _keys(self, prompt: list[int], n: int) -> list[ChunkKey]:
        keys, parent = [], 0
        for i in range(n):
            key = (parent, tuple(prompt[i * self.chunk:(i + 1) * self.chunk]))
            keys.append(key)
            parent = hash(key)
        return keys

    def load(self, prompt: list[int], cache: KVCache, row: int) -> int:
        """Copy the longest cached head of `prompt` (leaving at least its last token to feed)
        into cache row `row`; return its length (0 when nothing matches)."""
        if not self.enabled:
            return 0
        self.queried_tokens += len(prompt)
        hits = []
        for key in self._keys(prompt, (len(prompt) - 1) // self.chunk):
            entry = self.entries.get(key)
            if entry is None:
                break
            hits.append((key, entry))
        if not hits:
            return 0
        for key, _ in reversed(hits):  # the head ends most recently used: tails evict first
            self.entries.move_to_end(key)
        n = len(hits) * self.chunk
        layers = cache.k + cache.v + cache.h
        for i, store in enumerate(layers):
            store[row, :, :n] = torch.cat([entry[i] for _, entry in hits], 1)
        cache.pos_BS[row, :n] = torch.arange(n, device=cache.pos_BS.device)
        cache.valid_BS[row, :n] = True
        cache.length_B[row] = n
        cache.end = max(cache.end, n)
        self.hit_tokens += n
        return n

    def store(self, prompt: list[int], cache: KVCache, row: int, cached: int) -> None:
        """Keep the whole prompt chunks among the first `cached` exact cache slots of `row`."""
        if not self.enabled:
            return
        n = min(cached, len(prompt)) // self.chunk
        layers = cache.k + cache.v + cache.h
        for i, key in enumerate(self._keys(prompt, n)):
            if key in self.entries:
                continue
            a, b = i * self.chunk, (i + 1) * self.chunk
            entry = [store[row, :, a:b].clone() for store in layers]
            size = _nbytes(entry)
            if size > self.budget:
                return
            while self.bytes + size > self.budget:
                _, old = self.entries.popitem(last=False)
                self.bytes -= _nbytes(old)
            self.entries[key] = entry
            self.bytes += size

    def as_dict(self) -> dict[str, float | int]:
        return {"prefix_cache_hit_tokens": self.hit_tokens,
                "prefix_cache_queried_tokens": self.queried_tokens,
                "prefix_cache_hit_rate": round(self.hit_tokens / max(self.queried_tokens, 1), 4),
                "prefix_cache_mb": round(self.bytes / 2**20, 2)}


def _nbytes(entry: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in entry)
