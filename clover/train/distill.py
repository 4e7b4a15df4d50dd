"""Next-token distillation from an AR teacher into a block-diffusion student.

Decoding a block left to right, the first masked position of a block has all of its left context
decided: there the student answers the AR question, p(x_i | x_<i). A causal teacher (the AR twin
the student was adapted from) answers it too, and better (`clover.bench.calibration` measures the
gap: the twin's next-token accuracy against the diffusion model's at distance 0). `Teacher.kl`
adds KL(teacher || student) at exactly those positions, where teacher and student read the same
context; further masked positions are left to the diffusion loss, since the teacher would see
tokens the student cannot. Positions whose target the teacher gets wrong are left out, so the
student is not taught the teacher's mistakes (nor its reading of the EOS fill after the reply).
"""

# Shapes: B batch, L length, N selected positions, V vocab, K teacher targets

from __future__ import annotations

import torch
from torch import Tensor, nn

from clover.config import ModelConfig
from clover.train.data import Batch
from clover.train.objectives import Noise, PrefixMemo, causal_forward, clean_noise


def first_masked_in_block(masked_BL: Tensor, pos_BL: Tensor, block_size: int) -> Tensor:
    """True at each masked position with no masked position before it in its block (its block's
    tokens before it, and all earlier blocks, are clean)."""
    m = masked_BL.long()
    before_BL = m.cumsum(1) - m  # masked positions before each column of the row
    start_BL = pos_BL % block_size == 0
    start_BL[:, 0] = True
    at_start_BL = torch.where(start_BL, before_BL, torch.zeros_like(before_BL))
    base_BL = at_start_BL.cummax(1).values  # the count at the start of the column's block
    return masked_BL & (before_BL == base_BL)


class Teacher:
    """A frozen causal model whose next-token distributions a block-diffusion student learns
    (`block_diffusion(..., teacher=Teacher(model))`). Its shared prompt prefix is run once and
    kept (`PrefixMemo`: its weights never change)."""

    def __init__(self, model: nn.Module, only_right: bool = True) -> None:
        if model.config.attention != "causal":
            raise ValueError(f"a distillation teacher is a causal (AR) model, not attention "
                             f"{model.config.attention!r}")
        self.model = model.eval().requires_grad_(False)
        self.memo = PrefixMemo()
        self.only_right = only_right  # False: every first masked position (tests compare)

    def next_token(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """(the logits of p(x_i | x_<i) for every target [K, V], index_BP: the row of (batch row,
        absolute position) in them, -1 where none)."""
        with torch.no_grad():
            out, src_BL, cut, _ = causal_forward(self.model, self.model.config, batch,
                                                 clean_noise(batch), prefix_grad=False,
                                                 prefix_memo=self.memo)
            L = cut.ids_BL.shape[1]
            flat_K = src_BL[src_BL >= 0]
            b_K, i_K = flat_K // L, flat_K % L
            index_BP = torch.full((batch.ids_BL.shape[0], int(batch.pos_BL.max()) + 1), -1,
                                  dtype=torch.long, device=batch.ids_BL.device)
            index_BP[b_K, cut.pos_BL[b_K, i_K]] = torch.arange(flat_K.numel(),
                                                               device=flat_K.device)
            return out.logits, index_BP

    def kl(self, logits_NV: Tensor, src_BS: Tensor, cut: Batch, views: list[Noise],
           config: ModelConfig, batch: Batch) -> Tensor:
        """Sum of KL(teacher || student) over each view's first masked position per block where
        the teacher's argmax is the target, averaged over the views like the diffusion loss.
        `logits_NV`, `src_BS`, `cut`, `views`: the student's block forward (`_block_forward`);
        `batch`: the whole batch, prompt included, for the teacher."""
        teacher_KV, index_BP = self.next_token(batch)
        B, L = cut.ids_BL.shape
        flat_N = src_BS[src_BS >= 0]
        v_N, rest_N = flat_N // (B * L), flat_N % (B * L)
        b_N, i_N = rest_N // L, rest_N % L
        first_VBL = torch.stack([first_masked_in_block(view.masked_BL, cut.pos_BL,
                                                       config.block_size) for view in views])
        row_N = index_BP[b_N, cut.pos_BL[b_N, i_N]]
        keep_N = first_VBL[v_N, b_N, i_N] & (row_N >= 0)
        teacher_MV, student_MV = teacher_KV[row_N[keep_N]], logits_NV[keep_N]
        if self.only_right:
            right_M = teacher_MV.argmax(-1) == cut.ids_BL[b_N[keep_N], i_N[keep_N]]
            teacher_MV, student_MV = teacher_MV[right_M], student_MV[right_M]
        lp_MV = teacher_MV.float().log_softmax(-1)
        student_MV = student_MV.float().log_softmax(-1)[:, :lp_MV.shape[1]]
        return (lp_MV.exp() * (lp_MV - student_MV)).sum() / len(views)
