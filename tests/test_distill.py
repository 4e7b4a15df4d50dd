"""Next-token distillation (clover.train.distill): the positions it reads, the KL against a slow
per-block reference, its training effect, and the flags that refuse misuse."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from clover.model import build_model
from clover.model.diffusion import complementary_mask
from clover.train import Trainer
from clover.train.distill import Teacher, first_masked_in_block
from clover.train.loop import default_collator
from clover.train.objectives import Noise, batch_noise, block_diffusion
from tests.test_train import _config, shared_prompt_examples, tiny, toy_examples


def test_first_masked_in_block_by_hand():
    """Blocks of 4 (positions 4..15): the first masked position of each block, whatever came
    before the block."""
    masked = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1],
                           [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    pos = torch.arange(4, 16).expand(2, -1)
    want = torch.tensor([[0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1],
                         [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(first_masked_in_block(masked, pos, 4), want)


def _reference_kl(student, teacher, batch, views, bs: int) -> torch.Tensor:
    """Per block k and view: the student on [x_0 of blocks < k, x_t of block k] with its own
    block mask, the teacher on the clean row; KL(teacher || student) at the block's first masked
    position j, both read at j - 1 (shifted logits). Mean over views."""
    teacher_BLV = teacher(batch.ids_BL, batch.pos_BL, valid_BL=batch.valid_BL).logits
    total = torch.zeros(())
    for view in views:
        for start in range(0, batch.ids_BL.shape[1], bs):
            end = start + bs
            ids = torch.cat([batch.ids_BL[:, :start], view.xt_BL[:, start:end]], 1)
            student_BLV = student(ids, batch.pos_BL[:, :end],
                                  valid_BL=batch.valid_BL[:, :end]).logits
            for b in range(ids.shape[0]):
                cols = view.masked_BL[b, start:end].nonzero()
                if cols.numel() == 0:
                    continue
                j = start + int(cols[0])
                lp_t = F.log_softmax(teacher_BLV[b, j - 1].float(), -1)
                lp_s = F.log_softmax(student_BLV[b, j - 1].float(), -1)
                total = total + (lp_t.exp() * (lp_t - lp_s)).sum()
    return total / len(views)


@pytest.mark.parametrize("complementary", [False, True])
def test_kl_equals_the_per_block_reference(complementary):
    """`block_diffusion(teacher=...)`'s distill_sum (one forward for all blocks, the shared prompt
    run once for student and teacher) equals the per-block loop, one view or two."""
    cfg = tiny("block", shift_logits=True)
    student = build_model(cfg, seed=0)
    teacher = build_model(tiny("causal"), seed=1)
    batch = default_collator(cfg)(shared_prompt_examples(5, seed=3), list(range(5)))
    noise = batch_noise(batch, cfg)
    views = [noise]
    if complementary:
        views.append(Noise(*complementary_mask(batch.target_BL, noise.masked_BL, noise.t_BL,
                                               cfg.mask_id, batch.ids_BL)))
    with torch.no_grad():
        out = block_diffusion(student, cfg, batch, noise, complementary=complementary,
                              teacher=Teacher(teacher, only_right=False))
        want = _reference_kl(student, teacher, batch, views, cfg.block_size)
    assert float(want) > 0
    assert torch.allclose(out.distill_sum, want, rtol=1e-4), (out.distill_sum, want)
    plain = block_diffusion(student, cfg, batch, noise, complementary=complementary)
    assert plain.distill_sum is None and torch.allclose(plain.loss_sum, out.loss_sum)


def test_only_positions_the_teacher_gets_right_count():
    """A teacher whose next token is always the target gives the same KL gated or not; one that
    is never right gives none."""
    cfg = tiny("block", shift_logits=True)
    student = build_model(cfg, seed=0)
    batch = default_collator(cfg)(shared_prompt_examples(4, seed=5), list(range(4)))
    noise = batch_noise(batch, cfg)
    teacher = build_model(tiny("causal"), seed=1)
    right, wrong = Teacher(teacher), Teacher(teacher)
    lp_KV, index_BP = Teacher(teacher).next_token(batch)
    targets = batch.ids_BL[:, 1:][batch.target_BL[:, 1:]]  # in the teacher's row order
    onehot = F.one_hot(targets, lp_KV.shape[1]).float()
    right.next_token = lambda _: (torch.log(onehot * 0.9 + 0.1 / lp_KV.shape[1]), index_BP)
    wrong.next_token = lambda _: (torch.log((1 - onehot) / (lp_KV.shape[1] - 1)), index_BP)
    with torch.no_grad():
        gated = block_diffusion(student, cfg, batch, noise, teacher=right).distill_sum
        right.only_right = False
        assert torch.equal(gated, block_diffusion(student, cfg, batch, noise,
                                                  teacher=right).distill_sum)
        assert float(block_diffusion(student, cfg, batch, noise, teacher=wrong).distill_sum) == 0
    assert float(gated) > 0


def _first_position_kl(student, teacher, examples) -> float:
    cfg = student.config
    batch = default_collator(cfg)(examples, list(range(len(examples))))
    with torch.no_grad():
        return float(block_diffusion(student, cfg, batch, batch_noise(batch, cfg),
                                     teacher=Teacher(teacher, only_right=False)).distill_sum)


def test_distillation_pulls_the_student_toward_the_teacher():
    """Same data, seed and steps: with the distillation term the student's next-token
    distribution at the first masked positions ends closer to the teacher's; it is logged."""
    teacher = build_model(tiny("causal"), seed=1)
    Trainer(teacher, toy_examples(128), _config(steps=15, batch_size=16)).fit()

    def run(coef: float):
        student = build_model(tiny("block", shift_logits=True), seed=0)
        trainer = Trainer(student, toy_examples(128), _config(steps=15, batch_size=16,
                                                              distill_coef=coef),
                          teacher=teacher if coef else None)
        trainer.fit()
        return _first_position_kl(student, teacher, toy_examples(32, seed=9)), trainer

    (with_kl, trainer), (without_kl, plain) = run(4.0), run(0.0)
    assert with_kl < 0.8 * without_kl, (with_kl, without_kl)  # measured: 1.65 vs 2.53
    assert "distill_kl" in trainer.state.history[-1] and "distill_kl" not in plain.state.history[-1]


def test_misuse_is_refused():
    student = build_model(tiny("block"), seed=0)
    teacher = build_model(tiny("causal"), seed=1)
    with pytest.raises(ValueError, match="distill_coef"):
        Trainer(student, toy_examples(8), _config(distill_coef=1.0))
    with pytest.raises(ValueError, match="distill_coef"):
        Trainer(student, toy_examples(8), _config(), teacher=teacher)
    with pytest.raises(ValueError, match="block diffusion"):
        Trainer(build_model(tiny("causal"), seed=0), toy_examples(8),
                _config(distill_coef=1.0), teacher=teacher)
    with pytest.raises(ValueError, match="causal"):
        Teacher(student)


def test_smol_flags_are_checked_before_loading():
    from clover.tasks.airspace.smol import smol_teacher

    block = tiny("block")
    none = SimpleNamespace(distill_from=None, distill_coef=0.0)
    assert smol_teacher(none, block) is None
    for args in (SimpleNamespace(distill_from="x", distill_coef=0.0),
                 SimpleNamespace(distill_from=None, distill_coef=1.0)):
        with pytest.raises(ValueError, match="give both"):
            smol_teacher(args, block)
    with pytest.raises(ValueError, match="block-diffusion"):
        smol_teacher(SimpleNamespace(distill_from="x", distill_coef=1.0), tiny("causal"))
    with pytest.raises(ValueError, match="--distill-from /nowhere"):
        smol_teacher(SimpleNamespace(distill_from="/nowhere", distill_coef=1.0), block)
