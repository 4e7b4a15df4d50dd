"""Masked-diffusion math: forward process, weighted loss, SFT masking, AR loss."""

import math

import torch
import torch.nn.functional as F

from clover.model.diffusion import ar_loss, mask_tokens, masked_diffusion_loss, response_mask


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
    maskable = response_mask(torch.tensor([10, 20, 30, 40]), 5000)
    _, masked = mask_tokens(x0, torch.ones(4), 2, maskable_BL=maskable, gen=gen)
    assert not masked[0, :10].any() and masked[0, 10:].all()


def test_masked_loss_is_weighted_ce_over_token_count():
    """Hand-computed: sum over masked positions of CE / t, divided by the token count."""
    logits = torch.randn(2, 3, 7)
    x0 = torch.randint(0, 7, (2, 3))
    masked = torch.tensor([[True, False, True], [False, False, True]])
    t = torch.tensor([0.5, 0.25])
    expected = 0.0
    for b in range(2):
        for i in range(3):
            if masked[b, i]:
                ce = -F.log_softmax(logits[b, i], -1)[x0[b, i]]
                expected += float(ce) / float(t[b])
    got = masked_diffusion_loss(logits, x0, masked, t, num_tokens=6)
    assert math.isclose(float(got), expected / 6, rel_tol=1e-5)


def test_response_mask():
    m = response_mask(torch.tensor([2, 0]), 4)
    assert m.tolist() == [[False, False, True, True], [True, True, True, True]]


def test_ar_loss_shifts_targets():
    """Position i predicts token i+1; with a perfect predictor the loss is ~0."""
    ids = torch.tensor([[4, 5, 6, 7]])
    logits = torch.full((1, 4, 10), -50.0)
    for i in range(3):
        logits[0, i, ids[0, i + 1]] = 50.0
    assert float(ar_loss(logits, ids)) < 1e-6
    logits[0, 2] = 0.0  # position 2 now uniform: only counts if target 3 is in the mask
    keep = torch.tensor([[False, True, True, False]])
    assert float(ar_loss(logits, ids, keep)) < 1e-6
    assert math.isclose(float(ar_loss(logits, ids)), math.log(10) / 3, rel_tol=1e-4)
