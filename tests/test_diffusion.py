"""Masked-diffusion math: noise levels, forward process, the weighted loss, the sharpening term."""

import math

import torch
import torch.nn.functional as F

from clover.model.diffusion import (
    confident_entropy_sum,
    loss_and_confident_entropy,
    mask_tokens,
    masked_diffusion_loss_sum,
    sample_block_t,
)


def test_mask_rate_follows_t_and_respects_maskable():
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randint(3, 100, (4, 5000))
    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    xt, masked = mask_tokens(x0, t, mask_id=2, gen=gen)
    rates = masked.float().mean(1)
    assert rates[0] == 0 and rates[3] == 1
    assert abs(rates[1] - 0.25) < 0.03 and abs(rates[2] - 0.5) < 0.03
    assert torch.equal(xt[masked], torch.full_like(xt[masked], 2))
    assert torch.equal(xt[~masked], x0[~masked])
    maskable = torch.arange(5000)[None, :] >= torch.tensor([10, 20, 30, 40])[:, None]
    _, masked = mask_tokens(x0, torch.ones(4), 2, maskable_BL=maskable, gen=gen)
    assert not masked[0, :10].any() and masked[0, 10:].all()


def test_mask_tokens_with_given_draws_masks_exactly_where_u_below_t():
    """Training draws u per row from the row's own seed: u < t masks, u >= t keeps."""
    x0 = torch.tensor([[5, 6, 7, 8]])
    u = torch.tensor([[0.1, 0.6, 0.4, 0.9]])
    xt, masked = mask_tokens(x0, torch.tensor([[0.5, 0.5, 0.3, 1.0]]), 2, u_BL=u)
    assert masked.tolist() == [[True, False, False, True]]
    assert xt.tolist() == [[2, 6, 7, 2]]


def test_block_levels_are_constant_per_block():
    t = sample_block_t(7, 4, gen=torch.Generator().manual_seed(0))
    assert t.shape == (8,) and ((t >= 1e-3) & (t <= 1)).all()
    assert (t[:4] == t[0]).all() and (t[4:] == t[4]).all() and t[0] != t[4]
    one = sample_block_t(7, 7, gen=torch.Generator().manual_seed(0))
    assert one.shape == (7,) and (one == one[0]).all()


def test_masked_loss_is_ce_over_t_summed():
    """Hand-computed: sum over masked positions of CE / t."""
    logits = torch.randn(2, 3, 7)
    x0 = torch.randint(0, 7, (2, 3))
    masked = torch.tensor([[True, False, True], [False, False, True]])
    t = torch.tensor([[0.5] * 3, [0.25] * 3])
    expected = 0.0
    for b in range(2):
        for i in range(3):
            if masked[b, i]:
                ce = -F.log_softmax(logits[b, i], -1)[x0[b, i]]
                expected += float(ce) / float(t[b, i])
    got = masked_diffusion_loss_sum(logits[masked], x0[masked], t[masked])
    assert math.isclose(float(got), expected, rel_tol=1e-5)


def test_confident_entropy_counts_only_positions_already_right():
    logits_NV = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 3.0]])
    targets_N = torch.tensor([0, 2, 2])  # right, wrong, right
    p0 = torch.softmax(logits_NV[0], 0)
    p2 = torch.softmax(logits_NV[2], 0)
    want = -(p0 * p0.log()).sum() - (p2 * p2.log()).sum()
    assert torch.allclose(confident_entropy_sum(logits_NV, targets_N), want)


def test_one_log_softmax_gives_the_loss_and_the_entropy_of_two():
    """`loss_and_confident_entropy` (one fp32 log-softmax) = the two separate functions, bf16
    logits as in training: the same loss bits, and the gradient of loss + 0.1 x entropy to
    within one bf16 rounding (the two terms' gradients meet before the cast back to bf16)."""
    gen = torch.Generator().manual_seed(0)
    base = (torch.randn(64, 500, generator=gen) * 4).bfloat16()
    targets = torch.randint(0, 500, (64,), generator=gen)
    targets[:20] = base[:20].float().argmax(-1)  # some positions already right
    t = torch.rand(64, generator=gen).clamp_min(0.05)

    def run(fn):
        logits = base.clone().requires_grad_(True)
        loss, ent = fn(logits)
        return loss, ent, torch.autograd.grad(loss + 0.1 * ent, logits)[0].float()

    one = run(lambda x: loss_and_confident_entropy(x, targets, t))
    two = run(lambda x: (masked_diffusion_loss_sum(x, targets, t),
                         confident_entropy_sum(x, targets)))
    assert torch.equal(one[0], two[0])
    assert torch.allclose(one[1], two[1]) and float(one[1]) > 0
    torch.testing.assert_close(one[2], two[2], atol=1e-6, rtol=2 ** -7)
