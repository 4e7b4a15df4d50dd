"""Commit policies: given proposals for the masked positions of each row, choose which to commit.

Every policy keeps the same invariants, which tests check: it commits at least one masked
position in every row that has one, and never a position that is not masked. Rows are laid out
as [B, M] with M the most masked positions any row has; `masked_BM` marks the real ones.
"""

# Shapes: B rows, M masked positions per row (padded)

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass
class Proposal:
    tokens_BM: Tensor  # proposed token per masked position
    conf_BM: Tensor  # probability of the proposed token
    entropy_BM: Tensor  # entropy of the position's distribution (nats); NaN unless a row's
    # policy reads it (ENTROPY_POLICIES): the rest of a greedy step is cheaper than computing it
    masked_BM: Tensor  # True where the slot is a real masked position
    # per-row knobs, from each request's SamplingParams
    tau_B: Tensor
    gamma_B: Tensor
    steps_left_B: Tensor  # denoising steps left in the block (topk schedule), >= 1
    argmax_BM: Tensor | None = None  # uniform canvases: the most likely token per position
    # True where the position just left of the slot's is masked too (the previous column is
    # its left neighbour); set for the NEIGHBOUR_POLICIES only.
    left_masked_BM: Tensor | None = None

    def take(self, rows: list[int]) -> Proposal:
        """The proposal of some rows only (for the policy those rows asked for)."""
        left = None if self.left_masked_BM is None else self.left_masked_BM[rows]
        return Proposal(self.tokens_BM[rows], self.conf_BM[rows], self.entropy_BM[rows],
                        self.masked_BM[rows], self.tau_B[rows], self.gamma_B[rows],
                        self.steps_left_B[rows], left_masked_BM=left)

    @staticmethod
    def left_masked(policies: list[str], masked: list[list[int]],
                    M: int) -> list[list[bool]] | None:
        """Per row, per column (padded to M): whether that masked position's left neighbour
        (block index one less) is masked too; None unless a row's policy reads it
        (NEIGHBOUR_POLICIES). `masked` lists each row's masked block indexes in ascending
        order, the engine's column layout."""
        if not any(name in NEIGHBOUR_POLICIES for name in policies):
            return None
        return [[k > 0 and js[k - 1] == js[k] - 1 for k in range(len(js))]
                + [False] * (M - len(js)) for js in masked]


class Policy(Protocol):
    def select(self, p: Proposal) -> Tensor:
        """commit_BM: which masked positions to commit this step."""
        ...


def _at_least_one(choice_BM: Tensor, p: Proposal) -> Tensor:
    """Add each row's most confident position if the rule chose none there."""
    conf_BM = p.conf_BM.masked_fill(~p.masked_BM, -1.0)
    best_BM = torch.zeros_like(choice_BM)
    best_BM.scatter_(1, conf_BM.argmax(-1, keepdim=True), True)
    choice_BM = choice_BM & p.masked_BM
    none_B = ~choice_BM.any(-1, keepdim=True)
    return (choice_BM | (best_BM & none_B)) & p.masked_BM


class ThresholdPolicy:
    """Commit every masked position whose confidence >= tau; at least one (Fast-dLLM, LLaDA2)."""

    def select(self, p: Proposal) -> Tensor:
        return _at_least_one(p.conf_BM >= p.tau_B[:, None], p)


class PrefixPolicy:
    """Left to right: commit the leading masked positions while each is confident >= tau, the
    first masked one always. The block fills as a growing prefix, several tokens per forward
    where the model is sure of each in turn (semi-autoregressive threshold decoding, the
    longest-accepted-prefix rule of speculative decoding); at tau 1.0 it is AR decoding. A
    shifted-prediction model adapted from an AR model reads its most AR-like state this way:
    every proposal it commits has all of its left context decided, where the plain threshold
    may commit a later position while the one before it is still masked.

    Columns of a row are its masked positions in ascending order (the engine's layout)."""

    def select(self, p: Proposal) -> Tensor:
        first_BM = p.masked_BM & (p.masked_BM.cumsum(-1) == 1)
        # a column keeps the run going if it is sure, the first masked one, or not masked at all
        go_on_BM = (p.conf_BM >= p.tau_B[:, None]) | first_BM | ~p.masked_BM
        return go_on_BM.long().cumprod(-1).bool() & p.masked_BM


class TopKPolicy:
    """LLaDA low-confidence remasking: a fixed number of steps per block, the k most confident.

    k = ceil(masked / steps_left), so the block is finished in exactly steps_per_block steps.
    """

    def select(self, p: Proposal) -> Tensor:
        num_masked_B = p.masked_BM.sum(-1)
        k_B = torch.div(num_masked_B + p.steps_left_B - 1, p.steps_left_B, rounding_mode="floor")
        return _top_by(p.conf_BM.masked_fill(~p.masked_BM, -1.0), k_B, p)


class EntropyPolicy:
    """EB-sampler: commit the most certain positions while their summed entropy <= gamma."""

    def select(self, p: Proposal) -> Tensor:
        ent_BM = p.entropy_BM.masked_fill(~p.masked_BM, float("inf"))
        sorted_BM, order_BM = ent_BM.sort(-1)
        # position j of the sorted order is taken if the entropy of everything before it, plus
        # its own, fits the budget; the first is always taken
        keep_sorted = sorted_BM.cumsum(-1) <= p.gamma_B[:, None]
        keep_sorted[:, 0] = True
        choice_BM = torch.zeros_like(p.masked_BM).scatter_(1, order_BM, keep_sorted)
        return _at_least_one(choice_BM, p)


class EntropyBoundPolicy:
    """DiffusionGemma's entropy-bound sampler (uniform canvases): accept the lowest-entropy
    positions while their summed entropy minus the largest of them stays <= gamma.

    Nothing it accepts is final: the scheduler keeps the accepted tokens as the next step's draft,
    redraws every other position uniformly, and appends the argmax canvas when the block stops.
    The lowest-entropy position is always accepted (its own term is zero)."""

    def select(self, p: Proposal) -> Tensor:
        ent_BM = p.entropy_BM.masked_fill(~p.masked_BM, float("inf"))
        sorted_BM, order_BM = ent_BM.sort(-1)
        keep_sorted = sorted_BM.cumsum(-1) - sorted_BM <= p.gamma_B[:, None]
        return torch.zeros_like(p.masked_BM).scatter_(1, order_BM, keep_sorted) & p.masked_BM


class SpacedPolicy:
    """Threshold, but never two neighbouring positions in one step (after dilated scheduling,
    DUS: tokens far apart depend on each other least). Among the masked positions with
    confidence >= tau, the most confident is taken first, then each next most confident unless
    a position next to it was taken this step; at least one. Two neighbours proposed in the same
    forward are each read without the other (a shifted-prediction model reads position j from
    position j-1's state, masked while j-1 is), so the pair can come out inconsistent: the same
    token twice, or the halves of two different words. Spaced, the second is proposed again in
    the next step with its neighbour known. A full block takes at least two steps. Measured on
    clover-smol it halves TPF and mends none of its broken calls, which come from commits to the
    right of a masked gap (docs/bench.md); `prefix` is the policy that avoids those."""

    def select(self, p: Proposal) -> Tensor:
        B, M = p.masked_BM.shape
        sure_BM = (p.conf_BM >= p.tau_B[:, None]) & p.masked_BM
        left_BM = p.left_masked_BM
        if left_BM is None:
            raise ValueError("the spaced policy needs Proposal.left_masked_BM")
        # a slot's right neighbour is the next column when that column's left one is masked
        right_BM = torch.cat([left_BM[:, 1:], left_BM.new_zeros(B, 1)], 1)
        # most confident first; a tie goes to the leftmost (stable), however the row is padded
        order_BM = p.conf_BM.masked_fill(~sure_BM, -1.0).argsort(dim=-1, descending=True,
                                                               stable=True)
        taken = torch.zeros(B, M + 2, dtype=torch.bool, device=p.masked_BM.device)  # padded
        rows = torch.arange(B, device=p.masked_BM.device)
        for r in range(int(sure_BM.sum(-1).max()) if B else 0):  # the sure ones come first
            c_B = order_BM[:, r]
            clash_B = (left_BM[rows, c_B] & taken[rows, c_B]) \
                | (right_BM[rows, c_B] & taken[rows, c_B + 2])
            taken[rows, c_B + 1] = sure_BM[rows, c_B] & ~clash_B
        return _at_least_one(taken[:, 1:-1], p)


def _top_by(score_BM: Tensor, k_B: Tensor, p: Proposal) -> Tensor:
    rank_BM = score_BM.argsort(-1, descending=True).argsort(-1)
    return _at_least_one(rank_BM < k_B[:, None], p)


POLICIES: dict[str, type] = {
    "threshold": ThresholdPolicy,
    "prefix": PrefixPolicy,
    "topk": TopKPolicy,
    "entropy": EntropyPolicy,
    "entropy_bound": EntropyBoundPolicy,
    "spaced": SpacedPolicy,
}
# policies that read the proposals' entropy (the others get NaN there)
ENTROPY_POLICIES = ("entropy", "entropy_bound")
# policies that read Proposal.left_masked_BM (the others get None there)
NEIGHBOUR_POLICIES = ("spaced",)
# policies for uniform canvases (no mask ids; nothing committed before the block ends)
UNIFORM_POLICIES = ("entropy_bound",)
