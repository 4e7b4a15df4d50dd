"""Self-speculative decoding (clover/engine/speculative.py): the AR model checks the diffusion
drafter's tokens, so the output must be the AR model's greedy output, token for token."""

from types import SimpleNamespace

import pytest
import torch

from clover.config import get_preset
from clover.engine.speculative import (
    LowRankRouted,
    RoutedFast,
    SelfSpeculative,
    _low_rank,
    fuse_pair,
    pair_models,
    visibility,
)
from clover.model import build_model
from clover.model.transformer import KVCache

DENSE = dict(qk_norm=False, num_experts=0, num_dense_layers=0)


def _pair(noise: float, seed: int = 0):
    ar = build_model(get_preset("tiny", attention="causal", block_size=1, **DENSE), seed=seed)
    draft = build_model(get_preset("tiny", shift_logits=True, **DENSE), seed=seed + 1)
    state = ar.state_dict()
    g = torch.Generator().manual_seed(seed)
    for name, p in state.items():  # one base: the draft differs only in its linears
        if p.ndim == 2 and "proj" in name:
            state[name] = p + noise * torch.randn(p.shape, generator=g)
    draft.load_state_dict(state)
    return ar.eval(), pair_models(draft.eval(), ar)


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_output_is_the_ar_models_greedy_output(noise):
    ar, pair = _pair(noise)
    dec = SelfSpeculative(pair)
    accepted = 0
    for seed in range(4):
        prompt = torch.randint(3, 500, (5 + 3 * seed,),
                               generator=torch.Generator().manual_seed(seed)).tolist()
        res = dec.generate(prompt, max_tokens=30, stop_ids=set())
        assert res.ids == _greedy(ar, prompt, 30)
        assert 1 <= res.forwards <= 30  # at least one token per forward
        accepted += sum(res.accepted_at.values())
        assert res.tpf == 30 / res.forwards
    if noise == 0.0:  # the same linears, other attention: some drafts hold, some do not
        assert accepted > 0


@pytest.mark.parametrize("fused", [False, True])
def test_a_batch_decodes_each_row_as_it_would_alone(fused):
    """generate_batch: prompts of different lengths, one stopping early, rows leaving the batch
    at different steps; each row's tokens and counts equal its own batch-1 decode. Unfused: a
    drafter with the AR model's linears (some drafts hold); fused: two adapters' low-rank pair
    on the fast paths."""
    if fused:
        models, factors, lora = _two_adapters()
        pair = pair_models(models["draft"], models["ar"])
        _low_rank(pair, (lora, factors["ar"]), (lora, factors["draft"]))
        fuse_pair(pair)
    else:
        pair = _pair(0.0)[1]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (6, 13, 9, 3)]
    alone = [SelfSpeculative(pair).generate(p, 24, set()) for p in prompts]
    stop = {alone[2].ids[5]}  # row 2 (and maybe others) stops early
    alone = [SelfSpeculative(pair).generate(p, 24, stop) for p in prompts]
    together = SelfSpeculative(pair).generate_batch(prompts, 24, stop)
    assert [r.ids for r in together] == [r.ids for r in alone]
    assert [r.forwards for r in together] == [r.forwards for r in alone]
    assert [r.accepted_at for r in together] == [r.accepted_at for r in alone]
    assert len({r.forwards for r in together}) > 1  # rows left the batch at different steps
    assert fused or sum(sum(r.accepted_at.values()) for r in together) > 0


def test_drafts_that_are_always_right_fill_the_block():
    # a zero head: every logit is 0, so every argmax (clean or mask row) is token 0
    ar, pair = _pair(0.0)
    for model in (ar, pair.model):
        torch.nn.init.zeros_(model.lm_head.weight if model.lm_head is not None
                             else model.embed.weight)
    res = SelfSpeculative(pair).generate([5, 6, 7], max_tokens=40, stop_ids=set())
    assert res.ids == [0] * 40
    assert res.drafted == sum(res.accepted_at.values())  # none rejected
    # block 4: the prefill writes position 3, the next forward position 4 (its block's first
    # draft-free token) and drafts 5-7; from then on each forward takes 3 drafts and the twin's
    # own next token: 2 + 4 * 10 >= 40 tokens in 12 forwards
    assert res.forwards == 12


def test_a_draft_cap_keeps_the_output_and_drafts_fewer():
    ar, pair = _pair(0.0)
    for model in (ar, pair.model):  # every draft right (see the test above)
        torch.nn.init.zeros_(model.lm_head.weight if model.lm_head is not None
                             else model.embed.weight)
    capped = SelfSpeculative(pair, max_drafts=1).generate([5, 6, 7], 40, set())
    assert capped.ids == [0] * 40
    assert set(capped.accepted_at) == {0}  # one draft a forward at most
    assert capped.forwards > 12  # the uncapped decode's count
    with pytest.raises(ValueError, match="max_drafts"):
        SelfSpeculative(pair, max_drafts=0)


def test_without_drafts_it_is_plain_ar_decoding():
    ar, pair = _pair(0.0)
    prompt = [5, 6, 7, 8, 9]
    res = SelfSpeculative(pair, drafts=False).generate(prompt, max_tokens=20, stop_ids=set())
    assert res.ids == _greedy(ar, prompt, 20)
    assert res.forwards == 20 and res.drafted == 0


def _two_adapters():
    """A causal and a block model over one base, each = base + its own LoRA adapter merged;
    (models, each one's LoRA factors, the adapters' config)."""
    base, _ = _pair(0.0)
    g = torch.Generator().manual_seed(3)
    factors = {"ar": {}, "draft": {}}
    models = {}
    for who, mode in (("ar", "causal"), ("draft", "block")):
        cfg = get_preset("tiny", attention=mode, block_size=1 if mode == "causal" else 4,
                         shift_logits=mode == "block", **DENSE)
        model = build_model(cfg, seed=0)
        state = base.state_dict()
        for name, w in list(state.items()):
            if "proj" in name:
                key = name.removesuffix(".weight")
                a = 0.1 * torch.randn(4, w.shape[1], generator=g)
                b = 0.1 * torch.randn(w.shape[0], 4, generator=g)
                factors[who][f"{key}.lora_A.weight"] = a
                factors[who][f"{key}.lora_B.weight"] = b
                state[name] = w + 2.0 * b @ a  # scale alpha / r = 8 / 4
        model.load_state_dict(state)
        models[who] = model.eval()
    return models, factors, SimpleNamespace(lora_alpha=8, r=4)


def test_low_rank_routing_equals_two_merged_weight_sets():
    """Two LoRA adapters over one base: the AR one merged plus the difference on mask rows
    (`LowRankRouted`) gives the logits of routing the two merged linears."""
    models, factors, lora = _two_adapters()
    full = pair_models(models["draft"], models["ar"])
    dec = SelfSpeculative(full)
    cache_args = (full.model.config, 1, 32)
    want = dec.forward(KVCache(*cache_args), [5, 6, 7, 8, 9], 3)
    _low_rank(full, (lora, factors["ar"]), (lora, factors["draft"]))
    assert all(isinstance(getattr(p, n), LowRankRouted) for p, n, _ in full.swapped)
    got = dec.forward(KVCache(*cache_args), [5, 6, 7, 8, 9], 3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_fused_pair_equals_its_reference_layers():
    """`fuse_pair`: the clean weights fused (and prepacked where the CPU allows) with the
    drafter's differences beside them give the unfused low-rank pair's logits, on clean and
    mask rows, and decode its tokens; the fast paths did run."""
    models, factors, lora = _two_adapters()
    pair = pair_models(models["draft"], models["ar"])
    _low_rank(pair, (lora, factors["ar"]), (lora, factors["draft"]))
    dec = SelfSpeculative(pair)
    cache_args = (pair.model.config, 1, 64)
    prompt = list(range(5, 17))
    want = dec.forward(KVCache(*cache_args), [5, 6, 7, 8, 9], 3)
    want_ids = dec.generate(prompt, 24, set()).ids
    assert not pair.fused
    fuse_pair(pair)
    assert pair.fused
    calls = []
    for layer in pair.model.layers:
        for fast in (layer.attn.qkv_fast, layer.attn.o_fast, layer.ffn.gate_up_fast,
                     layer.ffn.down_fast):
            assert isinstance(fast, RoutedFast)
            fast.both = _counting(fast.both, calls)
    got = dec.forward(KVCache(*cache_args), [5, 6, 7, 8, 9], 3)
    assert calls and all(out is not None for out in calls)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert dec.generate(prompt, 24, set()).ids == want_ids
    with pytest.raises(ValueError, match="low-rank"):
        fuse_pair(_pair(0.0)[1])


def test_fused_pair_packs_only_where_the_cpu_can(monkeypatch):
    """Where oneDNN cannot prepack the dtype (bf16 on an AVX2-only CPU), `fuse_pair` keeps plain
    fused weights, and the logits still equal the unfused pair's."""
    from clover.engine import speculative

    monkeypatch.setattr(speculative, "packing_supported", lambda dtype: False)
    models, factors, lora = _two_adapters()
    pair = pair_models(models["draft"], models["ar"])
    _low_rank(pair, (lora, factors["ar"]), (lora, factors["draft"]))
    dec = SelfSpeculative(pair)
    want = dec.forward(KVCache(pair.model.config, 1, 32), [5, 6, 7], 4)
    fuse_pair(pair)
    assert pair.model.layers[0].attn.qkv_fast.both.packed is None
    got = dec.forward(KVCache(pair.model.config, 1, 32), [5, 6, 7], 4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _counting:
    """A `FastLinear` that records what each call returned (`calls`), and which of its two
    entries ran (`kinds`: "all" rows or the "first" rows)."""

    def __init__(self, fast, calls: list, kinds: list | None = None) -> None:
        self.fast, self.calls, self.kinds = fast, calls, kinds if kinds is not None else []

    def __call__(self, x):
        self.calls.append(self.fast(x))
        self.kinds.append("all")
        return self.calls[-1]

    def first_rows(self, x, n):
        out = self.fast.first_rows(x, n)
        if out is not None:
            self.calls.append(out)
            self.kinds.append("first")
        return out


def test_a_prefill_reads_only_the_ar_rows_of_the_fused_weights(monkeypatch):
    """With no mask row (a prefill) and an input the prepacked weight would not take (here: no
    packing), each fused linear reads only the AR model's rows ([W; down]'s first rows, no down
    factors) and the logits are the unfused pair's; a forward with mask rows reads them all."""
    from clover.engine import speculative

    monkeypatch.setattr(speculative, "packing_supported", lambda dtype: False)
    models, factors, lora = _two_adapters()
    pair = pair_models(models["draft"], models["ar"])
    _low_rank(pair, (lora, factors["ar"]), (lora, factors["draft"]))
    dec = SelfSpeculative(pair)
    prompt = list(range(5, 19))
    want = [dec.forward(KVCache(pair.model.config, 1, 32), prompt, m) for m in (0, 3)]
    fuse_pair(pair)
    calls, kinds = [], []
    for layer in pair.model.layers:
        for name in ("qkv_fast", "o_fast"):
            fast = getattr(layer.attn, name)
            fast.both = _counting(fast.both, calls, kinds)
        for name in ("gate_up_fast", "down_fast"):
            fast = getattr(layer.ffn, name)
            fast.both = _counting(fast.both, calls, kinds)
    for m, w in zip((0, 3), want, strict=True):
        kinds.clear()
        got = dec.forward(KVCache(pair.model.config, 1, 32), prompt, m)
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-4)
        assert kinds == ["first" if m == 0 else "all"] * 4 * len(pair.model.layers)


def test_stops_at_a_stop_token():
    ar, pair = _pair(0.0)
    prompt = [5, 6, 7, 8]
    ref = _greedy(ar, prompt, 12)
    stop = ref[6]
    res = SelfSpeculative(pair).generate(prompt, max_tokens=12, stop_ids={stop})
    assert res.ids == ref[:ref.index(stop) + 1]


def test_visibility():
    # 2 cached slots, 2 clean rows, 2 mask rows, 7 slots (one stale past the forward)
    vis = visibility(2, 2, 2, 7).int().tolist()
    assert vis == [[1, 1, 1, 0, 0, 0, 0],  # clean at 2: itself and before
                   [1, 1, 1, 1, 0, 0, 0],  # clean at 3
                   [1, 1, 1, 1, 1, 1, 0],  # masks: every clean slot and both masks
                   [1, 1, 1, 1, 1, 1, 0]]


def test_pair_models_checks_the_pair():
    ar, _ = _pair(0.0)
    moe = build_model(get_preset("tiny", shift_logits=True), seed=1)
    with pytest.raises(ValueError, match="MoE"):
        pair_models(moe, ar)
    other = build_model(get_preset("tiny", shift_logits=True, **DENSE), seed=5)
    with pytest.raises(ValueError, match="embeddings differ"):
        pair_models(other, ar)
    with pytest.raises(ValueError, match="must be causal"):
        pair_models(other, other)
    if ar.lm_head is not None:
        head = build_model(get_preset("tiny", shift_logits=True, **DENSE), seed=1)
        head.load_state_dict({**ar.state_dict(), "lm_head.weight": -ar.lm_head.weight})
        with pytest.raises(ValueError, match="output heads differ"):
            pair_models(head, ar)


def test_benchmark_reads_draft_caps_and_compares_runs():
    import argparse

    from tests.test_bench import _load_script

    bench = _load_script("self_speculative")
    assert bench.caps("block,3,1") == [None, 3, 1]
    for bad in ("0", "x", "3,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.caps(bad)
    rows = [{"output": "a"}, {"output": "b"}]
    runs = [("spec", rows, {"seconds": 5.0}),
            ("ar", [{"output": "a"}, {"output": "c"}], {"seconds": 10.0})]
    bench.compare(runs, ["a", "b"], baseline=True)
    assert runs[0][2] == {"seconds": 5.0, "speedup": 2.0, "same_as_ar_loop": "1/2",
                          "same_as_twin_eval": "2/2"}
    assert runs[1][2]["speedup"] == 1.0 and runs[1][2]["same_as_twin_eval"] == "1/2"
    assert bench.positive("4") == 4
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.positive(bad)
    assert bench.row_shapes("1+0, 3+5") == [(1, 0), (3, 5)]
    for bad in ("0+3", "1", "1+x", "1+2+3"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.row_shapes(bad)
    costs = bench.forward_costs(SelfSpeculative(_pair(0.05)[1]), list(range(5, 20)),
                                [(1, 0), (2, 3)], repeats=2)
    assert list(costs) == ["1+0", "2+3"] and all(ms > 0 for ms in costs.values())


def test_benchmark_runs_a_batch_and_counts_its_forwards():
    from tests.test_bench import _load_script

    bench = _load_script("self_speculative")
    tok = SimpleNamespace(eos_token_id=-1, decode=lambda ids, **_: " ".join(map(str, ids)))
    dec = SelfSpeculative(_pair(0.0)[1])
    prompts = [list(range(5, 5 + n)) for n in (4, 9, 6)]
    rows, _ = bench.run(dec, prompts, tok, 12, "spec", batch=2)
    alone, _ = bench.run(dec, prompts, tok, 12, "spec")
    assert [r["output"] for r in rows] == [r["output"] for r in alone]
    assert [r["batch_forwards"] for r in rows] == [
        max(rows[0]["res"].forwards, rows[1]["res"].forwards), 0, rows[2]["res"].forwards]
    assert [r["batch_forwards"] for r in alone] == [r["res"].forwards for r in alone]
