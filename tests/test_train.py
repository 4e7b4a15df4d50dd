"""Training: objectives vs hand-computed and reference forms, SFT masking, the loop, resume, DDP."""

import json
import math
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from clover.config import get_preset
from clover.model import ModelOutput, build_model
from clover.model.diffusion import noisy_clean_visibility
from clover.train import (
    Collator,
    TrainConfig,
    Trainer,
    batch_noise,
    block_diffusion,
    block_diffusion_reference,
    causal,
    default_collator,
    full_diffusion,
    lr_at,
    sft_example,
)
from clover.train.balance import load_stats, routers, update_expert_bias
from clover.train.data import step_indices
from clover.train.objectives import (
    Noise,
    ObjectiveModule,
    PrefixMemo,
    clean_noise,
    split_prefix,
)


def toy_examples(n: int, seed: int = 0, vocab: int = 40) -> list:
    """Copy task: prompt [3, p..., 4], response reversed(p) + EOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(3, 7, (1,), generator=g))
        p = torch.randint(10, vocab, (k,), generator=g).tolist()
        out.append(sft_example([3, *p, 4], [*p[::-1], 1]))
    return out


def tiny(mode: str = "block", **overrides):
    return get_preset("tiny", attention=mode, block_size=1 if mode == "causal" else 4, **overrides)


class TableModel(torch.nn.Module):
    """Stub model whose logits at (row, position) come from a fixed table, for hand computation."""

    def __init__(self, table_BLV: torch.Tensor) -> None:
        super().__init__()
        self.table_BLV = table_BLV

    def forward(self, ids_BL, pos_BL, *, cache=None, valid_BL=None, logits_mask_BL=None,
                attn_mask_BLS=None):
        assert cache is None
        rows = torch.arange(ids_BL.shape[0])[:, None].expand_as(pos_BL)
        logits = self.table_BLV[rows, pos_BL]
        return ModelOutput(logits if logits_mask_BL is None else logits[logits_mask_BL], None)


# ---- objectives ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [False, True])
def test_full_diffusion_matches_hand_computed(shift):
    """sum over masked i of CE(logits at i - shift, x0_i) / t_i, nothing else."""
    torch.manual_seed(0)
    cfg = tiny("full", shift_logits=shift)
    table = torch.randn(2, 5, cfg.vocab_size)
    batch = default_collator(cfg)([sft_example([5, 6], [7, 8, 1]), sft_example([9], [10, 1])],
                                  [0, 1])
    masked = torch.tensor([[0, 0, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    t = torch.tensor([[0.5] * 5, [0.25] * 5])
    noise = Noise(torch.where(masked, cfg.mask_id, batch.ids_BL), masked, t)
    expected = 0.0
    for b, i in masked.nonzero().tolist():
        logp = F.log_softmax(table[b, i - int(shift)], -1)
        expected += -float(logp[batch.ids_BL[b, i]]) / float(t[b, i])
    got = full_diffusion(TableModel(table), cfg, batch, noise).loss_sum
    assert math.isclose(float(got), expected, rel_tol=1e-5)


def test_causal_objective_matches_hand_computed():
    """sum over targets i of CE(logits at i - 1, x_i): the next-token loss, response only."""
    cfg = tiny("causal")
    table = torch.randn(2, 6, cfg.vocab_size)
    batch = default_collator(cfg)([sft_example([5, 6, 7], [8, 9, 1]), sft_example([9], [10, 1])],
                                  [0, 1])
    assert batch.target_BL.tolist() == [[False, False, False, True, True, True],
                                        [False, True, True, False, False, False]]
    expected = 0.0
    for b, i in batch.target_BL.nonzero().tolist():
        expected += -float(F.log_softmax(table[b, i - 1], -1)[batch.ids_BL[b, i]])
    got = causal(TableModel(table), cfg, batch, batch_noise(batch, cfg)).loss_sum
    assert math.isclose(float(got), expected, rel_tol=1e-5)


@pytest.mark.parametrize(("shift", "token_conv"), [(False, 0), (True, 0), (False, 3), (True, 3)])
def test_vectorised_block_loss_equals_per_block_loop(shift, token_conv):
    """One forward over [x_0, x_t] with the noisy/clean mask == one forward per block (with the
    token convolution too: a noisy block's first predecessors come from the clean block before)."""
    cfg = tiny("block", shift_logits=shift, token_conv=token_conv)
    model = build_model(cfg, seed=0)
    examples = toy_examples(6, seed=1) + [sft_example(list(range(10, 23)), [30, 31, 1])]
    batch = default_collator(cfg)(examples, list(range(7)))
    noise = batch_noise(batch, cfg)
    assert noise.masked_BL.sum() > 5
    fast = block_diffusion(model, cfg, batch, noise)
    slow = block_diffusion_reference(model, cfg, batch, noise)
    assert torch.allclose(fast.loss_sum, slow.loss_sum, rtol=1e-5)
    assert fast.moe is not None and fast.moe.counts_LE.sum() > 0


@pytest.mark.parametrize(("shift", "token_conv"), [(True, 0), (False, 3)])
def test_ar_term_of_a_block_model_is_its_causal_twins_loss(shift, token_conv):
    """The AR term (`ObjectiveModule(ar_coef=...)`) of a block model is exactly the next-token
    loss of the causal model with the same weights; the diffusion loss beside it is unchanged."""
    cfg = tiny("block", shift_logits=shift, token_conv=token_conv)
    model = build_model(cfg, seed=0)
    twin = build_model(tiny("causal", shift_logits=shift, token_conv=token_conv), seed=1)
    twin.load_state_dict(model.state_dict())
    batch = default_collator(cfg)(shared_prompt_examples(5, seed=2), list(range(5)))
    noise = batch_noise(batch, cfg)
    out = ObjectiveModule(model, block_diffusion, ar_coef=0.5)(batch, noise)
    want = causal(twin, twin.config, batch, batch_noise(batch, twin.config)).loss_sum
    assert torch.allclose(out.ar_sum, want, rtol=1e-5)
    assert torch.allclose(out.loss_sum, block_diffusion(model, cfg, batch, noise).loss_sum)
    assert ObjectiveModule(model, block_diffusion)(batch, noise).ar_sum is None


def test_ar_mix_trains_the_causal_reading_too():
    """Same data, seed and steps: with the AR term the block model's next-token loss under a
    causal mask ends lower than without it; a causal model refuses the option."""
    def run(coef: float) -> tuple[float, float]:
        model = build_model(tiny("block", shift_logits=True), seed=0)
        trainer = Trainer(model, toy_examples(128), _config(steps=40, batch_size=16, lr=1e-2,
                                                            ar_coef=coef))
        trainer.fit()
        batch = default_collator(model.config)(toy_examples(32, seed=9), list(range(32)))
        with torch.no_grad():
            ar = causal(model, model.config, batch, clean_noise(batch)).loss_sum
        return float(ar) / batch.num_targets, trainer.state.history[-1].get("ar_loss")

    (with_ar, logged), (without, none) = run(1.0), run(0.0)
    assert with_ar < 0.95 * without, (with_ar, without)  # measured: 2.32 vs 2.62
    assert logged is not None and none is None
    with pytest.raises(ValueError, match="ar_coef"):
        Trainer(build_model(tiny("causal"), seed=0), toy_examples(8), _config(ar_coef=1.0))


def shared_prompt_examples(n: int, seed: int = 0) -> list:
    """Toy examples behind a common 9-token system prompt (like the SFT system + tools block)."""
    system = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    return [sft_example(system + list(ex.ids[:ex.prompt_len]), ex.ids[ex.prompt_len:])
            for ex in toy_examples(n, seed)]


def _shared_equals_unshared(objective, model, cfg, batch, noise) -> list[torch.Tensor]:
    """The objective's loss and grads with the prompt prefix shared and recomputed per row are
    the same; returns the two losses."""
    losses, grads = [], []
    for share in (True, False):
        model.zero_grad()
        out = objective(model, cfg, batch, noise, share_prefix=share)
        out.loss_sum.backward()
        losses.append(out.loss_sum.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                if p.grad is not None]))
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    # float sums in another order: embed.weight grads (|g| up to ~6) differ by ~1e-6
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    return losses


@pytest.mark.parametrize("mode,shift,conv", [("block", False, 0), ("block", True, 0),
                                             ("causal", False, 0), ("block", False, 3),
                                             ("causal", False, 3)])
def test_shared_prefix_matches_unshared(mode, shift, conv):
    """Running the common prompt prefix once through a KV cache changes neither loss nor grads."""
    cfg = tiny(mode, shift_logits=shift, token_conv=conv)
    model = build_model(cfg, seed=0)
    batch = default_collator(cfg)(shared_prompt_examples(5), list(range(5)))
    noise = batch_noise(batch, cfg)
    from clover.train.objectives import shared_prefix_len

    assert shared_prefix_len(batch, cfg) == (8 if mode == "block" else 10)  # [system, 3]
    objective = block_diffusion if mode == "block" else causal
    losses = _shared_equals_unshared(objective, model, cfg, batch, noise)
    if mode == "block":
        ref = block_diffusion_reference(model, cfg, batch, noise).loss_sum
        assert torch.allclose(losses[0], ref, rtol=1e-5)


@pytest.mark.parametrize("shift,conv", [(False, 0), (True, 0), (True, 3)])
def test_block_models_causal_reading_shares_its_prefix_under_the_causal_mask(shift, conv):
    """The AR term of a block model (`causal` under a causal mask) runs the shared prompt prefix
    once, under the causal mask too: the loss and grads of recomputing it in every row. (Under
    the model's own block mask a prefix token would see the rest of its block: another loss.)"""
    from clover.train.objectives import shared_prefix_len

    cfg = tiny("block", shift_logits=shift, token_conv=conv)
    model = build_model(cfg, seed=0)
    batch = default_collator(cfg)(shared_prompt_examples(5), list(range(5)))
    assert shared_prefix_len(batch, cfg, first=1) == 8
    _shared_equals_unshared(causal, model, cfg, batch, clean_noise(batch))
    cache, *_ = split_prefix(model, cfg, batch, clean_noise(batch), 8, copies=1)
    own, *_ = split_prefix(model, cfg, batch, clean_noise(batch), 8, copies=1,
                           causal_prefix=True)
    assert not torch.allclose(cache.k[-1][:, :, :8], own.k[-1][:, :, :8])  # layer 0: the same


@pytest.mark.parametrize("mode", ["block", "causal", "block-ar"])
def test_gradient_free_prefix_runs_once_per_parameter_state(mode):
    """With `prefix_grad` off the shared prompt prefix runs once for the micro-batches of a step
    (`PrefixMemo`), with the losses of running it each time; after a parameter update it runs
    again (a stale prefix would give the old weights' loss)."""
    cfg = tiny("causal" if mode == "causal" else "block", shift_logits=True)
    model = build_model(cfg, seed=0)
    objective = block_diffusion if mode == "block" else causal
    examples = shared_prompt_examples(6)
    batches = [default_collator(cfg)(examples[i:i + 3], [i, i + 1, i + 2]) for i in (0, 3)]
    prefix_runs = []
    model.register_forward_pre_hook(lambda _, args: prefix_runs.append(args[0].shape[0] == 1))
    memo = PrefixMemo()

    def losses(memo):
        prefix_runs.clear()
        out = [objective(model, cfg, b, batch_noise(b, cfg), prefix_grad=False,
                         prefix_memo=memo).loss_sum for b in batches]
        return out, sum(prefix_runs)

    for _ in range(2):  # the second time: a parameter changed in place (an optimizer step)
        (got, runs), (want, every) = losses(memo), losses(None)
        assert runs == 1 and every == 2
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        sum(got).backward()
        with torch.no_grad():
            model.layers[-1].attn.q_proj.weight.mul_(1.5)


@pytest.mark.parametrize("mode", ["causal", "block"])
def test_a_frozen_base_stored_in_bf16_trains_as_autocast_did(mode):
    """bf16 training of a LoRA: the frozen linears stored in bf16 (`frozen_linears_to_bf16`, which
    a bf16 Trainer applies) give the loss and LoRA gradients of fp32 storage under autocast, bit
    for bit; norms, embeddings and the LoRA stay fp32."""
    from clover.checkpoint import adapter as ad
    from clover.train.parallel import frozen_linears_to_bf16

    cfg = tiny(mode, shift_logits=True, qk_norm=False, num_experts=0, num_dense_layers=0)
    batch = default_collator(cfg)(shared_prompt_examples(4), list(range(4)))
    objective = block_diffusion if mode == "block" else causal
    runs = []
    for cast in (False, True):
        model = build_model(cfg, seed=0)
        ad.inject_lora(model, ad.lora_config(4))
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: no gradient would reach A
                p.data = torch.randn(p.shape, generator=gen) * 0.1
        changed = frozen_linears_to_bf16(model) if cast else 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = objective(model, cfg, batch, batch_noise(batch, cfg))
        out.loss_sum.backward()
        runs.append((out.loss_sum.detach(), [p.grad for p in model.parameters()
                                             if p.requires_grad]))
    assert changed == 7 * cfg.num_layers + (model.lm_head is not None)  # q k v o gate up down
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["layers.0.attn.q_proj.base_layer.weight"] == torch.bfloat16
    assert {dtypes["embed.weight"], dtypes["layers.0.attn_norm.weight"],
            dtypes["layers.0.attn.q_proj.lora_A.default.weight"]} == {torch.float32}
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
    trainer = Trainer(build_model(cfg, seed=0), toy_examples(8), _config(bf16=True))
    assert trainer.model.layers[0].attn.q_proj.weight.dtype == torch.float32  # nothing frozen
    ad.inject_lora(lora := build_model(cfg, seed=0), ad.lora_config(4))
    trainer = Trainer(lora, toy_examples(8), _config(bf16=True))
    assert trainer.model.layers[0].attn.q_proj.base_layer.weight.dtype == torch.bfloat16


def test_noisy_clean_visibility_small_case():
    """Block size 2, L = 4: noisy block 1 sees clean block 0 and itself, never clean block 1."""
    pos = torch.arange(4)[None]
    m = noisy_clean_visibility(pos, pos[:, 2:], 2)[0].int()
    assert m.tolist() == [
        [1, 1, 0, 0, 0, 0],  # clean block 0
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # clean block 1
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1],  # noisy block 1
        [1, 1, 0, 0, 1, 1],
    ]


def test_block_noise_levels_are_per_block_and_batch_independent():
    """Same example + seed gives the same noise alone or in any batch; t is constant per block."""
    cfg = tiny("block")
    examples = toy_examples(5, seed=2)
    collate = default_collator(cfg)
    full = batch_noise(collate(examples, [11, 12, 13, 14, 15]), cfg)
    alone = batch_noise(collate(examples[2:3], [13]), cfg)
    n = alone.xt_BL.shape[1]
    assert torch.equal(full.xt_BL[2, :n], alone.xt_BL[0])
    assert torch.equal(full.t_BL[2, :n], alone.t_BL[0])
    t_blocks = full.t_BL.view(5, -1, cfg.block_size)
    assert torch.equal(t_blocks, t_blocks[..., :1].expand_as(t_blocks))


def _is_suffix(masked: list[bool]) -> bool:
    return masked == sorted(masked)  # False ... False True ... True


def test_suffix_masks_mask_the_last_tokens_of_each_block():
    """--suffix-masks 1: in every block the masked targets are the block's last targets, as many
    as the unordered draw masks where the whole block is a target, at the same levels t; alone or
    in a batch alike. At 0.5 some blocks are masked anywhere, some as a suffix."""
    cfg = tiny("block")
    examples = toy_examples(5, seed=2)
    batch = default_collator(cfg)(examples, [11, 12, 13, 14, 15])
    anywhere, ordered = batch_noise(batch, cfg), batch_noise(batch, cfg, suffix=1.0)
    assert torch.equal(anywhere.t_BL, ordered.t_BL)
    assert not (ordered.masked_BL & ~batch.target_BL).any()
    bs = cfg.block_size
    full_blocks = 0
    for b in range(5):
        for s in range(0, int(batch.length_B[b]), bs):
            target = batch.target_BL[b, s:s + bs]
            got = ordered.masked_BL[b, s:s + bs][target].tolist()
            assert _is_suffix(got)
            if target.all() and s + bs <= int(batch.length_B[b]):
                full_blocks += 1
                assert sum(got) == int(anywhere.masked_BL[b, s:s + bs].sum())
    assert full_blocks > 5
    alone = batch_noise(default_collator(cfg)(examples[2:3], [13]), cfg, suffix=1.0)
    n = alone.xt_BL.shape[1]
    assert torch.equal(ordered.xt_BL[2, :n], alone.xt_BL[0])
    half = batch_noise(batch, cfg, suffix=0.5)
    shapes = {_is_suffix(half.masked_BL[b, s:s + bs][batch.target_BL[b, s:s + bs]].tolist())
              for b in range(5) for s in range(0, int(batch.length_B[b]), bs)}
    assert shapes == {True, False}


def test_suffix_masks_shape_training_noise_only(monkeypatch):
    """The trainer's steps draw suffix-shaped noise at the configured share; validation keeps
    masks anywhere (comparable across runs); out-of-range shares are refused."""
    import clover.train.loop as loop

    seen, original = [], loop.batch_noise

    def spy(batch, config, eps=1e-3, suffix=0.0):
        seen.append(suffix)
        return original(batch, config, eps, suffix)

    monkeypatch.setattr(loop, "batch_noise", spy)
    model = build_model(tiny("block", shift_logits=True), seed=0)
    trainer = Trainer(model, toy_examples(16), _config(steps=2, batch_size=4, suffix_masks=0.5),
                      val_data=toy_examples(4, seed=9))
    trainer.fit()
    assert seen.count(0.5) == 2 and seen[-1] == 0.0
    with pytest.raises(ValueError, match="suffix_masks"):
        _config(suffix_masks=1.5)


def test_sft_never_masks_prompt_and_fills_eos_to_block_boundary():
    """Prompt tokens are never noised or scored; the response is followed by EOS up to a block
    boundary, and those EOS are targets (the model learns to stop by filling EOS)."""
    cfg = tiny("block")
    prompt, response = [5, 6, 7, 8, 9], [20, 21, 1]  # 8 tokens -> fill to 8: nothing to add
    batch = default_collator(cfg)([sft_example(prompt, response), sft_example([5], [20, 1])],
                                  [0, 1])
    assert batch.ids_BL[1, :4].tolist() == [5, 20, 1, 1] and not batch.valid_BL[1, 4:].any()
    assert batch.target_BL[1].tolist() == [False, True, True, True] + [False] * 4
    for seed in range(50):
        batch.seed_B[:] = torch.tensor([seed, seed + 1000])
        noise = batch_noise(batch, cfg, eps=0.9)  # t >= 0.9: almost everything masked
        assert not noise.masked_BL[0, :5].any() and not noise.masked_BL[1, :1].any()
        assert torch.equal(noise.xt_BL[0, :5], torch.tensor(prompt))
        assert not (noise.masked_BL & ~batch.target_BL).any()


def test_eos_fill_modes():
    ex = [sft_example([5, 6], [7, 1])]
    block = Collator(pad_id=0, eos_id=1, block_size=3, eos_fill="block", pad_multiple=3)(ex, [0])
    assert block.ids_BL.tolist() == [[5, 6, 7, 1, 1, 1]]
    length = Collator(pad_id=0, eos_id=1, eos_fill="length", pad_multiple=8)(ex, [0])
    assert length.ids_BL.tolist() == [[5, 6, 7, 1, 1, 1, 1, 1]] and length.valid_BL.all()
    none = Collator(pad_id=0, eos_id=1, first_target=1)(ex + [sft_example([5], [1])], [0, 1])
    assert none.ids_BL.tolist() == [[5, 6, 7, 1], [5, 1, 0, 0]]
    with pytest.raises(ValueError, match="eos_fill"):
        Collator(pad_id=0, eos_id=1, eos_fill="pad")


# ---- MoE balancing, schedule, data order --------------------------------------------------------

def test_expert_bias_moves_towards_mean_load():
    cfg = tiny("block", router="sigmoid")
    model = build_model(cfg, seed=0)
    counts = torch.tensor([[10.0, 0.0, 5.0, 5.0]])  # one MoE layer
    update_expert_bias(model, counts, rate=0.1)
    bias = routers(model)[0].expert_bias
    assert bias.tolist() == pytest.approx([-0.1, 0.1, 0.0, 0.0])
    assert load_stats(counts) == {"moe_max_over_mean": 2.0, "moe_idle_experts": 1}
    softmax = build_model(tiny("block"), seed=0)
    update_expert_bias(softmax, counts, rate=0.1)
    assert not routers(softmax)[0].expert_bias.any()


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_step_indices_are_epoch_permutations():
    first = [i for s in range(4) for i in step_indices(s, 5, 20, seed=3)]
    assert sorted(first) == list(range(20))
    assert step_indices(1, 5, 20, seed=3) == step_indices(1, 5, 20, seed=3)
    assert step_indices(0, 5, 20, seed=3) != step_indices(0, 5, 20, seed=4)


# ---- the loop -----------------------------------------------------------------------------------

def _config(**kw) -> TrainConfig:
    base = dict(steps=4, batch_size=8, lr=3e-3, warmup_steps=2, device="cpu", progress=False,
                log_every=1)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_tiny_model_learns_toy_task(mode):
    """Validation loss (fixed noise) drops clearly within a few seconds of training."""
    cfg = tiny(mode)
    trainer = Trainer(build_model(cfg, seed=0), toy_examples(128), _config(steps=25, batch_size=16),
                      val_data=toy_examples(16, seed=9))
    before = trainer.validate()
    after = trainer.fit()["val_loss"]
    assert after < 0.75 * before, (before, after)


def test_sharpening_lowers_entropy_on_the_same_budget():
    """Same data, seed and steps: the run with the sharpening term ends less uncertain where it
    is right (what lets more positions pass a commit threshold)."""
    def run(coef: float) -> float:
        trainer = Trainer(build_model(tiny("block"), seed=0), toy_examples(128),
                          _config(steps=20, batch_size=16, sharpen_coef=coef))
        trainer.fit()
        return sum(e["confident_entropy"] for e in trainer.state.history[-2:])

    assert run(1.0) < run(0.0)


def test_resume_continues_exactly(tmp_path):
    """Stop after a checkpoint, resume: same step count and bit-identical losses and weights."""
    cfg, data = tiny("block", router="sigmoid"), toy_examples(64)
    ref = Trainer(build_model(cfg, seed=0), data, _config())
    ref.fit()
    first = Trainer(build_model(cfg, seed=0), data, _config(work_dir=str(tmp_path),
                                                            stop_after=2))
    assert first.fit()["steps"] == 2
    resumed = Trainer(build_model(cfg, seed=1), data, _config(work_dir=str(tmp_path),
                                                              resume=True))
    assert resumed.state.step == 2
    summary = resumed.fit()
    assert summary["steps"] == 4 and resumed.state.losses == ref.state.losses
    for (name, a), b in zip(ref.model.state_dict().items(), resumed.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    state = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4 and (tmp_path / "checkpoint" / "optimizer.pt").is_file()


def test_resume_refuses_a_different_run(tmp_path):
    cfg, data = tiny("block"), toy_examples(16)
    Trainer(build_model(cfg, seed=0), data, _config(steps=1, work_dir=str(tmp_path))).fit()
    with pytest.raises(ValueError, match="seed"):
        Trainer(build_model(cfg, seed=0), data, _config(work_dir=str(tmp_path), resume=True,
                                                        seed=5))


def test_micro_batches_do_not_change_the_update():
    """Accumulating 4 micro-batches of 2 == one batch of 8 (global token normalisation)."""
    cfg, data = tiny("block"), toy_examples(32)
    one = Trainer(build_model(cfg, seed=0), data, _config(steps=2, aux_coef=0.0))
    four = Trainer(build_model(cfg, seed=0), data, _config(steps=2, aux_coef=0.0,
                                                           micro_batch_size=2))
    one.fit()
    four.fit()
    assert one.state.losses == pytest.approx(four.state.losses, rel=1e-5)
    # fp32 sums in another order per split: up to 1.2e-5 apart on an AVX2-only CPU after two
    # Adam steps of lr 3e-3; a wrong normalisation moves an update by a share of the lr
    for a, b in zip(one.model.parameters(), four.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)



def test_micro_batches_group_similar_lengths():
    """Micro-batches hold examples of similar length (less padding), each with its own noise seed:
    the padded width summed over micro-batches is the smallest a split into pairs can give."""
    cfg = tiny("block")
    data = [sft_example([3] * (4 + 7 * (i % 5)), [4, 5, 6]) for i in range(16)]
    trainer = Trainer(build_model(cfg, seed=0), data, _config(steps=1, batch_size=8,
                                                              micro_batch_size=2))
    batches = trainer.micro_batches(0)
    lengths = sorted(int(n) for b in batches for n in b.length_B)
    assert sum(b.ids_BL.shape[1] for b in batches) == sum(lengths[1::2])
    seeds = sorted(int(s) for b in batches for s in b.seed_B)
    assert len(set(seeds)) == 8

# ---- distributed --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    data = shared_prompt_examples(32)  # the shared-prefix path runs two model calls under DDP
    trainer = Trainer(build_model(tiny("block"), seed=0), data, _config(steps=3))
    trainer.fit()
    weights = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    Path(out_dir, f"{rank}.json").write_text(json.dumps([trainer.state.losses, weights]))
    trainer.close()
    os._exit(0)  # no interpreter finalization: torch's gloo teardown there has aborted done ranks


def test_two_process_gloo_matches_one_process():
    """DDP over 2 CPU processes == 1 process running the same global batch as 2 micro-batches."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_ddp_worker, args=(2, _free_port(), out), nprocs=2, join=True,
                           start_method="spawn")
        results = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(2)]
    single = Trainer(build_model(tiny("block"), seed=0), shared_prompt_examples(32),
                     _config(steps=3, micro_batch_size=4))
    single.fit()
    weights = sum(float(p.detach().double().sum()) for p in single.model.parameters())
    for losses, w in results:
        assert losses == pytest.approx(single.state.losses, abs=1e-5)
        assert w == pytest.approx(weights, rel=1e-5)


_CHILD = """
import sys
import torch
from clover.config import get_preset
from clover.model import build_model
from clover.train import Trainer, TrainConfig
from clover.train.throughput import synthetic
torch.set_num_threads(1)
cfg = get_preset("tiny")
config = TrainConfig(steps=30, batch_size=4, lr=3e-3, device="cpu", progress=False,
                     work_dir=sys.argv[1], save_every=1, resume=True)
Trainer(build_model(cfg, seed=0), synthetic(cfg, 64, 24, 12, 8), config).fit()
"""


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    """SIGKILL a training process mid-run (any moment, even mid-save), rerun with --resume:
    the finished run's per-step losses equal an uninterrupted run's exactly."""
    import subprocess
    import sys
    import time

    run = [sys.executable, "-c", _CHILD]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    subprocess.run([*run, str(tmp_path / "ref")], check=True, env=env, timeout=300)
    state = tmp_path / "killed" / "checkpoint" / "trainer_state.json"
    proc = subprocess.Popen([*run, str(tmp_path / "killed")], env=env)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        try:  # the checkpoint directory is swapped atomically while we look
            if json.loads(state.read_text())["step"] >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    killed_at = json.loads(state.read_text())["step"]
    assert 2 <= killed_at < 30, killed_at
    subprocess.run([*run, str(tmp_path / "killed")], check=True, env=env, timeout=300)
    ref = json.loads((tmp_path / "ref" / "checkpoint" / "trainer_state.json").read_text())
    resumed = json.loads(state.read_text())
    assert resumed["step"] == 30 and resumed["losses"] == ref["losses"]


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_prefix_without_grad_same_loss_truncated_gradient(mode):
    """prefix_grad=False: the loss is the same; the gradient no longer flows into the shared
    prefix's keys and values, so the last layer's key/value projections get a different one."""
    cfg = tiny(mode, shift_logits=mode == "block")
    model = build_model(cfg, seed=0)
    batch = default_collator(cfg)(shared_prompt_examples(4), list(range(4)))
    noise = batch_noise(batch, cfg)
    objective = block_diffusion if mode == "block" else causal

    def run(**kw):
        model.zero_grad()
        out = objective(model, cfg, batch, noise, **kw)
        out.loss_sum.backward()
        return out.loss_sum.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                       if p.grad is not None}

    (full_loss, full_g), (cut_loss, cut_g) = run(), run(prefix_grad=False)
    assert torch.allclose(full_loss, cut_loss, rtol=1e-5)
    last = f"layers.{cfg.num_layers - 1}.attn"
    changed = [n for n in full_g if n.startswith(last) and not torch.allclose(
        full_g[n], cut_g.get(n, torch.zeros_like(full_g[n])), atol=1e-7)]
    assert changed, "the prefix's gradient path was not cut"


@pytest.mark.parametrize(("shift", "share"), [(False, True), (True, True), (True, False)])
def test_complementary_views_equal_two_reference_passes(shift, share):
    """Complementary masks: every target is masked in exactly one of the two views, and the one
    forward over [x_0, view 1, view 2] gives the mean of the per-block reference loss of each
    view (the second at level 1 - t), with or without the shared prompt prefix."""
    from clover.model.diffusion import complementary_mask

    cfg = tiny("block", shift_logits=shift)
    model = build_model(cfg, seed=0)
    batch = default_collator(cfg)(shared_prompt_examples(5, seed=3), list(range(5)))
    noise = batch_noise(batch, cfg)
    second = Noise(*complementary_mask(batch.target_BL, noise.masked_BL, noise.t_BL,
                                       cfg.mask_id, batch.ids_BL))
    assert not bool((noise.masked_BL & second.masked_BL).any())
    assert torch.equal(noise.masked_BL | second.masked_BL, batch.target_BL)
    assert noise.masked_BL.sum() > 3 and second.masked_BL.sum() > 3
    got = block_diffusion(model, cfg, batch, noise, share_prefix=share, complementary=True)
    want = (block_diffusion_reference(model, cfg, batch, noise).loss_sum
            + block_diffusion_reference(model, cfg, batch, second).loss_sum) / 2
    assert torch.allclose(got.loss_sum, want, rtol=1e-5)
    one_view = block_diffusion(model, cfg, batch, noise, share_prefix=share).loss_sum
    assert not torch.allclose(got.loss_sum, one_view)


def test_complementary_masks_train_and_validate_one_view():
    """The trainer's step uses both views; its validation loss stays the single-view one (so runs
    with and without the option compare); a causal model refuses the option."""
    model = build_model(tiny("block", shift_logits=True), seed=0)
    trainer = Trainer(model, toy_examples(32), _config(steps=3, batch_size=8, complementary=True))
    assert trainer.train_objective.keywords["complementary"]
    assert trainer.objective is block_diffusion
    trainer.fit()
    assert math.isfinite(trainer.state.history[-1]["loss"])
    with pytest.raises(ValueError, match="complementary"):
        Trainer(build_model(tiny("causal"), seed=0), toy_examples(8),
                _config(complementary=True))
