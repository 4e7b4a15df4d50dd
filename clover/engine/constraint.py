"""The contract between the engine and a structured-output constraint (a grammar matcher).

A constraint follows one request. The engine calls `mask_logits` after the forward (before
proposals are drawn) and the scheduler calls `after_commit` after the policy's commits and the
EOS fill, before deciding whether the block is complete. The frontier is the first generated
position not yet verified; only the contiguous committed run starting there is checked. A block
completes (and enters the exact KV cache) only when it has no masks left, so every token that
reaches the cache has been verified. `after_commit` may append forced tokens past the block's
aligned end (jump-forward, never beyond prompt + max_tokens); the scheduler handles an unaligned
sequence end as it does for prompts.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from clover.engine.request import Request


class Constraint(Protocol):
    def frontier(self, request: Request) -> int:
        """Absolute position of the first generated token not yet verified."""
        ...

    def mask_logits(self, request: Request, masked: list[int], logits_MV: Tensor) -> None:
        """In place: forbid tokens the grammar rejects at the frontier (if it is masked).

        masked[i] is the block index whose logits are logits_MV[i].
        """
        ...

    def after_commit(self, request: Request) -> None:
        """Feed the committed run from the frontier to the matcher; re-mask (set to mask id) the
        first rejected position, and fill tokens the grammar forces."""
        ...
