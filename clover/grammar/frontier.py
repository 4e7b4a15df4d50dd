"""Frontier decoding: a left-to-right grammar matcher driving a decoder that commits anywhere.

Implements `clover.engine.constraint.Constraint` for one request. The frontier is the first
generated position the matcher has not consumed. Before proposals, the frontier's logits are cut
to what the grammar allows there (if it is masked). After commits, the contiguous committed run
from the frontier is fed to the matcher: the first token it rejects is re-masked (with the EOS
padding after it, if it was a stop token) and the walk stops; where the grammar forces tokens
they are written in for free, into masked positions from the frontier and, once the block is
verified to its end, past it ("jump forward", at most to max_tokens); once the grammar is done
the rest is EOS.

Why it terminates: the frontier token is always drawn from the grammar's mask, so it is always
accepted; the walk re-masks only beyond it. A step therefore either advances the frontier or
lowers the number of masked positions in the block, and neither can go on forever.
Promise: every output that ends on a stop token is a complete match of the grammar; an output cut
by max_tokens is a valid prefix. Plain Python plus one bitmask tensor; no model, no device work
beyond moving that mask to the logits.
"""

# Shapes: V vocab, W bitmask words, M masked positions of the row's block

from __future__ import annotations

import torch
from torch import Tensor

from clover.engine.request import Request
from clover.grammar.backend import Matcher, bitmask_words, unpack_bitmask


class FrontierConstraint:
    def __init__(self, matcher: Matcher, *, prompt_len: int, eos_id: int, mask_id: int,
                 jump_forward: bool = True) -> None:
        self.matcher = matcher
        self.prompt_len, self.eos_id, self.mask_id = prompt_len, eos_id, mask_id
        self.jump_forward = jump_forward
        self.num_verified = 0  # generated positions behind the frontier
        self.done = False  # a stop token was accepted: the rest of the output is padding
        self.num_forced = 0  # tokens the grammar wrote in without the model
        self.num_rejected = 0  # committed tokens the grammar sent back to mask
        self._dead = False  # no token allowed (never with a checked grammar): let EOS end it
        self._bitmask_W = torch.zeros(bitmask_words(matcher.vocab_size), dtype=torch.int32)

    # ---- the Constraint contract ----------------------------------------------------------------
    def frontier(self, request: Request) -> int:
        return self.prompt_len + self.num_verified

    def mask_logits(self, request: Request, masked: list[int], logits_MV: Tensor) -> None:
        j = self.frontier(request) - len(request.seq)
        if j not in masked:
            return
        allowed_V = self.allowed_tokens(request).to(logits_MV.device)
        logits_MV[masked.index(j)].masked_fill_(~allowed_V, float("-inf"))

    def after_commit(self, request: Request) -> None:
        j = self.frontier(request) - len(request.seq)
        assert 0 <= j <= len(request.block), (j, len(request.block))
        j = self._pad(request, j) if self.done else self._advance(request, j)
        self.num_verified = len(request.seq) + j - self.prompt_len

    # ---- what may come next ---------------------------------------------------------------------
    def allowed_tokens(self, request: Request) -> Tensor:
        """allowed_V at the frontier: the grammar's mask, stop tokens only where the grammar is
        complete, never the mask token."""
        vocab = self.matcher.vocab_size
        if self.done:
            allowed_V = torch.zeros(vocab, dtype=torch.bool)
            allowed_V[self.eos_id] = True
            return allowed_V
        self.matcher.fill_bitmask(self._bitmask_W)
        allowed_V = unpack_bitmask(self._bitmask_W, vocab)
        stop_ok = self.matcher.is_accepting()
        for t in self._stop_ids(request):
            if 0 <= t < vocab:
                allowed_V[t] = stop_ok
        allowed_V[self.mask_id] = False
        if not allowed_V.any():
            self._dead = True
            allowed_V[self.eos_id] = True
        return allowed_V

    def _forced(self) -> list[int]:
        if self._dead or self.matcher.is_stopped():
            return [self.eos_id]
        forced = self.matcher.forced_tokens()
        return forced[:forced.index(self.mask_id)] if self.mask_id in forced else forced

    # ---- the walk -------------------------------------------------------------------------------
    def _advance(self, r: Request, j: int) -> int:
        """Verify from block index j, filling forced tokens, until a mask or the block end."""
        j = self._walk(r, j)
        while not self.done and self._fill(r, j, self._forced()):
            walked = self._walk(r, j)
            if walked == j:  # a forced token rejected: impossible, but never loop on it
                break
            j = walked
        return j

    def _walk(self, r: Request, j: int) -> int:
        """Feed the committed run from j to the matcher; returns the new frontier index."""
        block, stops = r.block, self._stop_ids(r)
        end = j
        while end < len(block) and block[end] != self.mask_id:
            end += 1
        run = block[j:end]
        cut = next((i for i, t in enumerate(run) if t in stops), len(run))
        taken = self.matcher.accept(run[:cut])
        j += taken
        if taken < cut:
            self._reject(r, j, stops)
        elif cut < len(run):  # a stop token right at the frontier
            if self.matcher.is_accepting() or self._dead:
                return self._finish(r, j)
            self._reject(r, j, stops)
        return j

    def _fill(self, r: Request, j: int, forced: list[int]) -> int:
        """Write forced tokens into the masked positions from j (and past the block end once it
        is reached); returns how many were written."""
        block, n = r.block, 0
        while n < len(forced) and j + n < len(block) and block[j + n] == self.mask_id:
            block[j + n] = forced[n]
            n += 1
        if self.jump_forward and j + n == len(block) and n < len(forced):
            room = self.prompt_len + r.params.max_tokens - (len(r.seq) + len(block))
            extra = forced[n:n + max(room, 0)]
            block.extend(extra)
            n += len(extra)
        self.num_forced += n
        return n

    def _reject(self, r: Request, j: int, stops: set[int]) -> None:
        """Send block[j] back to mask; a rejected stop token takes its EOS padding with it."""
        block = r.block
        was_stop = block[j] in stops
        block[j] = self.mask_id
        self.num_rejected += 1
        if was_stop:
            for k in range(j + 1, len(block)):
                if block[k] in stops:
                    block[k] = self.mask_id
            r.eos_seen = any(t in stops for t in block)

    def _finish(self, r: Request, j: int) -> int:
        """The stop token at j is accepted: everything after it is EOS padding."""
        self.done = True
        return self._pad(r, j + 1)

    def _pad(self, r: Request, j: int) -> int:
        for k in range(j, len(r.block)):
            r.block[k] = self.eos_id
        r.eos_seen = True
        return len(r.block)

    def _stop_ids(self, r: Request) -> set[int]:
        return {self.eos_id, *r.params.stop_token_ids}
