"""The teacher-forced commit-calibration probe (clover.bench.calibration)."""

from __future__ import annotations

import pytest
import torch

from clover.bench.calibration import Probe, by_distance, probe, reliability, replay_prefix
from clover.config import get_preset
from clover.model import build_model
from clover.train import batch_noise, default_collator, sft_example
from clover.train.objectives import masked_predictions

SYSTEM = [5, 6, 7, 8, 9, 10, 11, 12, 13]


def _examples(n: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randint(14, 40, (int(torch.randint(3, 7, (1,), generator=g)),),
                          generator=g).tolist()
        reply = torch.randint(14, 40, (int(torch.randint(5, 12, (1,), generator=g)),),
                              generator=g).tolist()
        out.append(sft_example(SYSTEM + [3, *p, 4], [*reply, 1]))
    return out


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny", attention="block", block_size=4, shift_logits=True)
    return build_model(cfg, seed=0).eval()


def test_masked_predictions_equal_a_forward_per_block(model):
    """The one-forward logits (shared prompt, noisy copies) are, target by target, those of the
    model run on [clean earlier blocks, the noisy block] with its own block-causal mask."""
    cfg = model.config
    batch = default_collator(cfg)(_examples(3), [0, 1, 2])
    noise = batch_noise(batch, cfg)
    with torch.no_grad():
        logits, row, pos, gold = masked_predictions(model, cfg, batch, noise)
        assert len(row) == int(noise.masked_BL.sum())
        for n, (b, i) in enumerate(zip(row.tolist(), pos.tolist(), strict=True)):
            end = (i // 4 + 1) * 4
            ids = torch.cat([batch.ids_BL[b, :i // 4 * 4], noise.xt_BL[b, i // 4 * 4:end]])
            ref = model(ids[None], batch.pos_BL[b:b + 1, :end],
                        valid_BL=batch.valid_BL[b:b + 1, :end]).logits[0, i - 1]
            assert torch.allclose(logits[n], ref, atol=1e-4), (b, i)
            assert gold[n] == batch.ids_BL[b, i]


def test_probe_records_every_frontier_state_once(model):
    """Per example and block: frontiers from the block's first target to its end, and at each
    one a record for every target at or after it."""
    examples = _examples(5, seed=1)
    collate = default_collator(model.config)
    p = probe(model, examples, collate, batch_size=2)
    want = 0
    for ex in examples:
        target = collate([ex], [0]).target_BL[0]
        for start in range(0, len(target), 4):
            offsets = [j for j in range(4) if target[start + j]]
            want += sum(len([j for j in offsets if j >= k]) for k in offsets)
    assert len(p.conf) == want
    assert min(p.dist) == 0 and max(p.dist) <= 3
    assert all(0 < c <= 1 for c in p.conf)
    assert sorted(set(p.example)) == list(range(5))
    assert [d["dist"] for d in by_distance(p)] == [0, 1, 2, 3]


def _hand_probe() -> Probe:
    """One example, one block of 4 targets: (frontier, dist, conf, correct)."""
    rows = [(0, 0, .5, True), (0, 1, .95, True), (0, 2, .8, False), (0, 3, .99, True),
            (1, 0, .9, True), (1, 1, .3, True), (1, 2, .99, True),
            (2, 0, .6, False), (2, 1, .999, True),
            (3, 0, .7, True)]
    return Probe([0] * len(rows), [0] * len(rows), [r[0] for r in rows], [r[1] for r in rows],
                 [r[2] for r in rows], [r[3] for r in rows])


def test_prefix_replay_by_hand():
    p = _hand_probe()
    # tau 0.9: frontier 0 commits d0, d1 (0.95), stops at 0.8 -> frontier 2 commits d0 (wrong), d1
    assert replay_prefix(p, 0.9) == {"tau": 0.9, "tpf": 2.0, "tokens": 4, "forwards": 2,
                                     "wrong_share": 0.25, "replies_all_right": 0.0}
    # tau 1.0: one token per forward, the next token at each frontier (k = 2's is wrong)
    assert replay_prefix(p, 1.0)["forwards"] == 4 and replay_prefix(p, 1.0)["tokens"] == 4
    assert replay_prefix(p, 1.0)["wrong_share"] == 0.25
    # tau 0.5: frontier 0 commits all four (one wrong)
    assert replay_prefix(p, 0.5)["tpf"] == 4.0


def test_reliability_bins_hold_the_parallel_proposals():
    rows = reliability(_hand_probe())
    assert sum(r["n"] for r in rows) == 6  # the d >= 1 records
    top = rows[-1]
    assert top["bin"] == "[0.99, 1.0]" and top["n"] == 3 and top["accuracy"] == 1.0
    assert rows[2]["n"] == 1 and rows[2]["accuracy"] == 0.0  # 0.8, wrong


def test_an_ar_model_is_probed_at_the_next_token_only():
    """Causal: one record per target, d = 0, right where the argmax of the logits one position
    back (a forward per example, no batching) is the target."""
    model = build_model(get_preset("tiny", attention="causal", block_size=1), seed=0).eval()
    examples = _examples(3, seed=2)
    collate = default_collator(model.config)
    p = probe(model, examples, collate, batch_size=2)
    want = []
    with torch.no_grad():
        for ex in examples:
            batch = collate([ex], [0])
            logits = model(batch.ids_BL, batch.pos_BL, valid_BL=batch.valid_BL).logits[0]
            for i in batch.target_BL[0].nonzero()[:, 0].tolist():
                want.append(bool(logits[i - 1].argmax() == batch.ids_BL[0, i]))
    assert p.correct == want and set(p.dist) == {0}
    assert replay_prefix(p, 0.5)["tpf"] == 1.0


def test_the_evaluate_hook_runs_on_a_bf16_training_model():
    """A --bf16 run's model: frozen linears in bf16, trained ones in fp32 (run under autocast)."""
    from clover.bench.calibration import calibration_evaluator
    from clover.train.parallel import frozen_linears_to_bf16

    model = build_model(get_preset("tiny", attention="block", block_size=4, shift_logits=True),
                        seed=0)
    for name, q in model.named_parameters():
        q.requires_grad_("attn" not in name)
    assert frozen_linears_to_bf16(model) > 0
    got = calibration_evaluator(_examples(3), default_collator(model.config))(model.eval(), 1)
    assert 0 <= got["cal_next_token_acc"] <= 1 and got["cal_tpf_1.0"] == 1.0


def test_the_engine_decodes_what_the_training_forward_predicts(model):
    """Training and inference see the same states: the engine's greedy left-to-right decode (the
    prefix policy at tau 1.0, one token per forward) of prompts ending at every offset in a
    block is, token by token, the argmax the training forward gives at d = 0 along that reply
    (same block alignment, same cached context). Else a model right at every d = 0 state could
    still decode wrong."""
    from clover.engine import LLM, SamplingParams

    bs = model.config.block_size
    prompts = [SYSTEM + [3, *range(14, 14 + n), 4] for n in range(3, 3 + bs)]
    assert len({len(p) % bs for p in prompts}) == bs  # every offset in a block
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, policy="prefix",
                            tau=1.0)
    outs = LLM(model, device="cpu", dtype="float32").generate(prompts, params)
    examples = [sft_example(p, o.token_ids) for p, o in zip(prompts, outs, strict=True)]
    assert all(len(o.token_ids) == 10 for o in outs)
    p = probe(model, examples, default_collator(model.config), batch_size=2)
    ends = [len(ex.ids) for ex in examples]  # the EOS fill after each reply is a target too
    d0 = [(e, ok) for e, b, k, d, ok in zip(p.example, p.block, p.frontier, p.dist, p.correct,
                                             strict=True) if d == 0 and bs * b + k < ends[e]]
    assert len(d0) == 10 * len(prompts)
    assert all(ok for _, ok in d0), [e for e, ok in d0 if not ok]
