"""Drafter training for self-speculative decoding (clover.train.draft): the loss scores exactly
what the decoder's mask rows draft (`SelfSpeculative.forward`), only the drafter learns, and the
Trainer takes a verifier only where it fits."""

import pytest
import torch
import torch.nn.functional as F

from clover.engine.speculative import SelfSpeculative, pair_models
from clover.model import build_model
from clover.model.transformer import KVCache
from clover.train import Trainer
from clover.train.draft import Verifier, draft_block
from clover.train.loop import default_collator
from clover.train.objectives import batch_noise
from tests.test_train import _config, shared_prompt_examples, tiny

DENSE = dict(qk_norm=False, num_experts=0, num_dense_layers=0)


def _pair_of_models():
    """An AR model and a drafter over one base: the drafter's own linears, the rest shared."""
    ar = build_model(tiny("causal", **DENSE), seed=0).eval()
    draft = build_model(tiny("block", shift_logits=True, **DENSE), seed=1).eval()
    own = draft.state_dict()
    draft.load_state_dict({k: own[k] if "proj" in k else v for k, v in ar.state_dict().items()})
    return ar, draft


def _reference(ar, draft, batch, noise) -> torch.Tensor:
    """Per row and block with masks: the decoder's forward on the clean tokens before the block's
    first masked position and masks to the block's end; each mask row's draft of the next one."""
    dec = SelfSpeculative(pair_models(draft, ar))
    bs = draft.config.block_size
    total = torch.zeros(())
    for b in range(batch.ids_BL.shape[0]):
        ids = batch.ids_BL[b].tolist()
        for start in range(0, len(ids), bs):
            cols = noise.masked_BL[b, start:start + bs].nonzero().flatten().tolist()
            if not cols:
                continue
            f = start + cols[0]
            assert [start + c for c in cols] == list(range(f, start + bs))  # a suffix
            logits = dec.forward(KVCache(draft.config, 1, len(ids) + bs), ids[:f], len(cols))
            for j, q in enumerate(range(f, start + bs - 1)):
                total = total + F.cross_entropy(logits[f + j], torch.tensor(ids[q + 1]),
                                                reduction="sum")
    return total


def test_loss_equals_the_decoders_drafts():
    ar, draft = _pair_of_models()
    cfg = draft.config
    batch = default_collator(cfg)(shared_prompt_examples(5, seed=3), list(range(5)))
    noise = batch_noise(batch, cfg, suffix=1.0)
    out = draft_block(draft, cfg, batch, noise, verifier=Verifier(ar))
    with torch.no_grad():
        ref = _reference(ar, draft, batch, noise)
    assert ref > 0
    torch.testing.assert_close(out.loss_sum.detach(), ref, rtol=1e-4, atol=1e-4)


def test_only_the_drafter_learns():
    ar, draft = _pair_of_models()
    cfg = draft.config
    batch = default_collator(cfg)(shared_prompt_examples(4, seed=1), list(range(4)))
    draft_block(draft, cfg, batch, batch_noise(batch, cfg, suffix=1.0),
                verifier=Verifier(ar)).loss_sum.backward()
    assert all(p.grad is None for p in ar.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in draft.named_parameters() if "proj" in n)


def test_training_a_drafter_lowers_its_loss_and_misuse_is_refused():
    ar, draft = _pair_of_models()
    cfg = draft.config
    data = shared_prompt_examples(64, seed=0)
    val = default_collator(cfg)(shared_prompt_examples(16, seed=9), list(range(16)))
    noise = batch_noise(val, cfg, suffix=1.0)

    def val_loss() -> float:
        with torch.no_grad():
            return float(draft_block(draft, cfg, val, noise, verifier=Verifier(ar)).loss_sum)

    before = val_loss()
    Trainer(draft.train(), data, _config(steps=12, batch_size=8, suffix_masks=1.0),
            verifier=ar).fit()
    assert val_loss() < 0.7 * before
    for bad in (dict(suffix_masks=0.5), dict(suffix_masks=1.0, complementary=True)):
        with pytest.raises(ValueError, match="verifier"):
            Trainer(draft, data, _config(**bad), verifier=ar)
    with pytest.raises(ValueError, match="causal"):
        Verifier(draft)


def test_smol_verifier_flags_are_checked_before_loading():
    from types import SimpleNamespace

    from clover.tasks.airspace.smol import smol_verifier

    def args(**kw):
        return SimpleNamespace(**{**dict(verifier="/nowhere", distill_from=None,
                                         complementary=False, suffix_masks=1.0), **kw})

    assert smol_verifier(args(verifier=None), tiny("block")) is None
    for bad in (dict(suffix_masks=0.5), dict(complementary=True), dict(distill_from="x")):
        with pytest.raises(ValueError, match="suffix-masks 1"):
            smol_verifier(args(**bad), tiny("block"))
    with pytest.raises(ValueError, match="block-diffusion"):
        smol_verifier(args(), tiny("causal"))
    with pytest.raises(ValueError, match="--verifier /nowhere"):
        smol_verifier(args(), tiny("block"))
