"""The engine against its references: exact cache, policies' invariants, EOS, batching, sampling."""

import time

import pytest
import torch

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.engine.policies import POLICIES, UNIFORM_POLICIES, Proposal
from clover.engine.reference import reference_generate
from clover.model import build_model

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 33)), [40, 41, 42, 43, 44, 45, 46, 47]]


def _model(mode="block", seed=0, **kw):
    block_size = 1 if mode == "causal" else kw.pop("block_size", 4)
    return build_model(get_preset("tiny", attention=mode, block_size=block_size, **kw),
                       seed=seed).eval()


def _sharpen(model, scale=6.0):
    """Random tiny models are nearly uniform; scaling the head gives confident, varied proposals."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.mark.parametrize("mode", ["block", "causal"])
@pytest.mark.parametrize("policy", ["threshold", "prefix", "topk", "entropy", "spaced"])
def test_cached_engine_equals_uncached_reference(mode, policy):
    """block/causal caches are exact: the engine reproduces the no-cache decoder token for token."""
    model = _sharpen(_model(mode))
    params = SamplingParams(max_tokens=14, policy=policy, tau=0.5, steps_per_block=2, gamma=1.0)
    outs = LLM(model, device="cpu").generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == reference_generate(model, prompt, params)


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_token_conv_model_engine_equals_reference(mode):
    """A token_conv model decodes exactly through the cache, batched (padding rows), as the
    no-cache reference does, including a cache that grows mid-request."""
    model = _sharpen(_model(mode, token_conv=4))
    llm = LLM(model, device="cpu", max_batch_size=4)
    long = list(range(3, 243))  # 240 prompt tokens + 30 new > the initial 256 slots
    params = SamplingParams(max_tokens=30, tau=0.5, ignore_eos=True)
    outs = llm.generate([*PROMPTS, long], params)
    for prompt, out in zip([*PROMPTS, long], outs, strict=True):
        assert out.token_ids == reference_generate(model, prompt, params)


def test_shifted_block_model_equals_reference():
    """With Dream-style shifted logits the engine re-reads the previous position and stays exact."""
    model = _sharpen(_model("block", shift_logits=True))
    params = SamplingParams(max_tokens=13, tau=0.5)
    outs = LLM(model, device="cpu").generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == reference_generate(model, prompt, params)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_full_model_caches_with_per_step_refresh_equal_no_cache(cache):
    """Prefix/dual caches are approximate, but refreshed every step they equal no cache."""
    model = _sharpen(_model("full"))
    base = SamplingParams(max_tokens=12, tau=0.5, block_size=4)
    llm = LLM(model, device="cpu")
    none = llm.generate(PROMPTS, base.replace(cache="none"))
    cached = llm.generate(PROMPTS, base.replace(cache=cache, refresh_every=1))
    assert [o.token_ids for o in cached] == [o.token_ids for o in none]
    assert none[0].token_ids == reference_generate(model, PROMPTS[0], base.replace(cache="none"))


def test_full_model_approximate_caches_run_and_save_work():
    """Without per-step refresh the dual cache feeds fewer tokens per forward than no cache."""
    model = _sharpen(_model("full"))
    llm = LLM(model, device="cpu")
    base = SamplingParams(max_tokens=12, tau=0.5, block_size=4)
    none = llm.generate(PROMPTS[:1], base.replace(cache="none"))[0]
    dual = llm.generate(PROMPTS[:1], base.replace(cache="dual"))[0]
    assert len(dual.token_ids) == len(none.token_ids) == 12
    assert dual.stats.tokens_processed < none.stats.tokens_processed


@pytest.mark.parametrize("mode", ["block", "full"])
def test_threshold_tau_one_commits_one_token_per_step(mode):
    model = _model(mode)
    params = SamplingParams(max_tokens=12, tau=1.0, ignore_eos=True)
    for out in LLM(model, device="cpu").generate(PROMPTS, params):
        assert out.stats.forwards == 12 == len(out.token_ids)


def _random_proposal(seed, B=6, M=9):
    g = torch.Generator().manual_seed(seed)
    masked = torch.rand(B, M, generator=g) < 0.6
    masked[0] = False  # a row with nothing masked must get no commit
    masked[1, :] = False
    masked[1, 3] = True  # a row with one masked position must commit it
    left = masked & (torch.rand(B, M, generator=g) < 0.7)
    left[:, 0] = False
    return Proposal(torch.randint(0, 50, (B, M), generator=g), torch.rand(B, M, generator=g),
                    torch.rand(B, M, generator=g) * 3, masked,
                    torch.rand(B, generator=g), torch.rand(B, generator=g) * 2,
                    torch.randint(1, 5, (B,), generator=g), left_masked_BM=left)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_commits_at_least_one_and_only_masked(name):
    for seed in range(50):
        p = _random_proposal(seed)
        commit = POLICIES[name]().select(p)
        assert not (commit & ~p.masked_BM).any()
        has_masked = p.masked_BM.any(-1)
        assert (commit.any(-1) == has_masked).all()


def test_threshold_and_topk_semantics():
    p = _random_proposal(3)
    commit = POLICIES["threshold"]().select(p)
    above = (p.conf_BM >= p.tau_B[:, None]) & p.masked_BM
    rows = above.any(-1)
    assert torch.equal(commit[rows], above[rows])
    commit = POLICIES["topk"]().select(p)
    k = (p.masked_BM.sum(-1) + p.steps_left_B - 1) // p.steps_left_B
    assert torch.equal(commit.sum(-1), k)


def test_prefix_policy_commits_the_leading_sure_run():
    """prefix: the first masked column, then each following masked column while every one up to
    it is >= tau (a loop over each row as the reference); at tau 1.0 only the first."""
    for seed in range(30):
        p = _random_proposal(seed)
        commit = POLICIES["prefix"]().select(p)
        for b in range(p.masked_BM.shape[0]):
            want, first = [], True
            for j in p.masked_BM[b].nonzero().flatten().tolist():
                if not first and p.conf_BM[b, j] < p.tau_B[b]:
                    break
                want.append(j)
                first = False
            assert commit[b].nonzero().flatten().tolist() == want
        p.tau_B.fill_(1.0)
        first_B = p.masked_BM.long().argmax(-1)
        assert torch.equal(POLICIES["prefix"]().select(p).sum(-1), p.masked_BM.any(-1).long())
        rows = p.masked_BM.any(-1)
        assert POLICIES["prefix"]().select(p)[rows].long().argmax(-1).equal(first_B[rows])


def _spaced_by_hand(conf, masked, left, tau):
    """One row of the spaced policy as a plain loop: the sure ones most confident first (ties to
    the left), each taken unless a neighbour was; else the most confident masked one."""
    M = len(conf)
    sure = sorted((j for j in range(M) if masked[j] and conf[j] >= tau), key=lambda j: -conf[j])
    taken: set[int] = set()
    for j in sure:
        if not ((left[j] and j - 1 in taken) or (j + 1 < M and left[j + 1] and j + 1 in taken)):
            taken.add(j)
    if not taken and any(masked):
        taken.add(max((j for j in range(M) if masked[j]), key=lambda j: (conf[j], -j)))
    return sorted(taken)


def test_spaced_policy_never_commits_two_neighbours():
    """spaced: the plain loop's choice; never two neighbouring positions (a column and the one
    before it when that is its left neighbour); a fully masked row of 8 at tau 0 gets 4,
    alternating; with no masked neighbours it is the threshold policy; no neighbour map: an
    error."""
    for seed in range(40):
        p = _random_proposal(seed)
        commit = POLICIES["spaced"]().select(p)
        for b in range(p.masked_BM.shape[0]):
            want = _spaced_by_hand(p.conf_BM[b].tolist(), p.masked_BM[b].tolist(),
                                   p.left_masked_BM[b].tolist(), float(p.tau_B[b]))
            assert commit[b].nonzero().flatten().tolist() == want
        pairs = commit[:, 1:] & commit[:, :-1] & p.left_masked_BM[:, 1:]
        assert not pairs.any()
    M = 8
    conf = torch.tensor([[0.5, 0.9, 0.6, 0.95, 0.7, 0.8, 0.55, 0.99]])
    p = Proposal(torch.zeros(1, M, dtype=torch.long), conf, conf,
                 torch.ones(1, M, dtype=torch.bool), torch.tensor([0.0]), torch.tensor([1.0]),
                 torch.tensor([1]), left_masked_BM=torch.arange(M)[None] > 0)
    assert POLICIES["spaced"]().select(p)[0].nonzero().flatten().tolist() == [1, 3, 5, 7]
    p.left_masked_BM[:] = False  # nothing next to anything: it is the threshold policy
    assert POLICIES["spaced"]().select(p).equal(POLICIES["threshold"]().select(p))
    with pytest.raises(ValueError, match="left_masked_BM"):
        POLICIES["spaced"]().select(Proposal(*[getattr(p, f) for f in (
            "tokens_BM", "conf_BM", "entropy_BM", "masked_BM", "tau_B", "gamma_B",
            "steps_left_B")]))


def test_spaced_policy_fills_a_block_in_two_steps_at_least():
    """Decoding through the engine at a tau every position passes: threshold fills each block
    of 4 in one forward, spaced in two or three (never two neighbours at once), and still
    equals its reference."""
    model = _sharpen(_model("block"))
    llm = LLM(model, device="cpu")
    base = SamplingParams(max_tokens=12, tau=1e-6, ignore_eos=True)
    fast = llm.generate(PROMPTS, base)
    spaced = llm.generate(PROMPTS, base.replace(policy="spaced"))
    for prompt, f, s in zip(PROMPTS, fast, spaced, strict=True):
        a = len(prompt)  # blocks are aligned to multiples of 4: the first may be partial
        starts = [j for j in range(a, a + 12) if j == a or j % 4 == 0]
        sizes = [min((j // 4 + 1) * 4, a + 12) - j for j in starts]
        assert f.stats.forwards == len(sizes)
        # a block of n > 1 positions takes 2 steps at least and at most 3 (n = 4: greedy may
        # take its two ends first); a single position 1
        assert sum(1 if n == 1 else 2 for n in sizes) <= s.stats.forwards
        assert s.stats.forwards <= sum(3 if n == 4 else min(n, 2) for n in sizes)
        assert s.token_ids == reference_generate(model, prompt, base.replace(policy="spaced"))


def test_engine_never_rewrites_a_committed_position(monkeypatch):
    """Around every update: a position that held a token before holds the same token after
    (it never changes or returns to mask); only masked positions get commits."""
    model = _sharpen(_model("block"))
    llm = LLM(model, device="cpu")
    sched = llm.engine.scheduler
    original = sched.update
    filled = []

    def checked(batch, tokens, commits, experts=0.0, canvas=None):
        before = {p.request.request_id: p.request.seq + p.request.block for p in batch.rows}
        done = original(batch, tokens, commits, experts, canvas)
        for plan in batch.rows:
            r = plan.request
            old, new = before[r.request_id], r.seq + r.block
            assert all(t == r.mask_id or new[i] == t for i, t in enumerate(old))
            filled.append(sum(t == r.mask_id and new[i] != t for i, t in enumerate(old)))
        return done

    monkeypatch.setattr(sched, "update", checked)
    for policy in sorted(set(POLICIES) - set(UNIFORM_POLICIES)):  # a masking model
        llm.generate(PROMPTS, SamplingParams(max_tokens=16, policy=policy, tau=0.6))
    assert len(filled) > 20 and sum(filled) > 0


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_eos_stop_is_prefix_preserving(mode):
    """Stopping at EOS gives exactly the prefix of the run that keeps going past it."""
    model = _sharpen(_model(mode))
    llm = LLM(model, device="cpu")
    free = llm.generate(PROMPTS, SamplingParams(max_tokens=20, tau=0.5))
    stop_tok = free[0].token_ids[5]  # a token the model really produces, treated as EOS
    params = SamplingParams(max_tokens=20, tau=0.5, stop_token_ids=[stop_tok])
    going = llm.generate(PROMPTS, params.replace(ignore_eos=True))
    stopped = llm.generate(PROMPTS, params)
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) <= 5
    for s, g in zip(stopped, going, strict=True):
        cut = g.token_ids.index(stop_tok) if stop_tok in g.token_ids else len(g.token_ids)
        assert s.token_ids == g.token_ids[:cut]
        assert stop_tok not in s.token_ids
    assert stopped[0].stats.forwards < going[0].stats.forwards


@pytest.mark.parametrize("mode", ["block", "causal", "full"])
def test_batch_invariance_at_temperature_zero(mode):
    """A request's output does not depend on what else is in the batch (sizes 1, 3, 8)."""
    model = _sharpen(_model(mode))
    llm = LLM(model, device="cpu", max_batch_size=8)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 500, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 19, (8,), generator=g)]
    params = SamplingParams(max_tokens=10, tau=0.6, block_size=4)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in llm.generate(prompts[:3], params)] == alone[:3]
    assert [o.token_ids for o in llm.generate(prompts, params)] == alone


def test_a_batch_mixing_entropy_and_threshold_rows_decodes_each_as_alone():
    """The entropy is computed only when a row's policy reads it (a greedy threshold step skips
    it); a batch mixing such rows gives each row the tokens it gets alone."""
    model = _sharpen(_model("block"))
    llm = LLM(model, device="cpu", max_batch_size=4)
    params = [SamplingParams(max_tokens=12, policy=policy, tau=0.5, gamma=1.0)
              for policy in ("entropy", "threshold", "entropy", "threshold")]
    alone = [llm.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == alone
    for prompt, q, out in zip(PROMPTS, params, alone, strict=True):
        assert out == reference_generate(model, prompt, q)


def test_batch_larger_than_rows_queues_and_reuses_rows():
    """More requests than cache rows: they wait, then take freed rows, with the same answers."""
    model = _sharpen(_model("block"))
    params = SamplingParams(max_tokens=9, tau=0.6)
    many = (PROMPTS * 3)[:10]
    small = LLM(model, device="cpu", max_batch_size=3).generate(many, params)
    big = LLM(model, device="cpu", max_batch_size=16).generate(many, params)
    assert [o.token_ids for o in small] == [o.token_ids for o in big]


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_a_new_long_prompt_is_prefilled_on_its_own_step(mode):
    """Decoding rows are not padded to a newcomer's prompt length: the step that prefills a long
    prompt holds only prefilling rows; the next step holds everyone again. Answers unchanged."""
    model = _sharpen(_model(mode))
    params = SamplingParams(max_tokens=12, tau=0.6)
    llm = LLM(model, device="cpu", max_batch_size=4)
    engine = llm.engine
    short = engine.add_request([5, 6, 7], params)
    engine.step()
    long_prompt = list(range(3, 203))  # 200 tokens
    engine.add_request(long_prompt, params)
    batch = engine.scheduler.schedule()
    assert [len(p.request.prompt) for p in batch.rows] == [200]
    while engine.has_unfinished():
        engine.step()
    alone = LLM(model, device="cpu").generate([[5, 6, 7], long_prompt], params)
    assert engine.output(short).token_ids == alone[0].token_ids


def test_seeded_sampling_is_reproducible_and_batch_independent():
    model = _sharpen(_model("block"), scale=2.0)
    llm = LLM(model, device="cpu")
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=7)
    a = [o.token_ids for o in llm.generate(PROMPTS, params)]
    b = [o.token_ids for o in llm.generate(PROMPTS, params)]
    alone = llm.generate(PROMPTS[2:3], params)[0].token_ids
    assert a == b and a[2] == alone
    other = [o.token_ids for o in llm.generate(PROMPTS, params.replace(seed=8))]
    assert other != a


def test_causal_engine_equals_plain_greedy_loop():
    model = _sharpen(_model("causal"))
    out = LLM(model, device="cpu").generate(PROMPTS, SamplingParams(max_tokens=10,
                                                                    ignore_eos=True))
    for prompt, o in zip(PROMPTS, out, strict=True):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(10):
                logits = model(torch.tensor([ids])).logits[0, -1]
                logits[model.config.mask_id] = float("-inf")
                ids.append(int(logits.argmax()))
        assert o.token_ids == ids[len(prompt):]
        assert o.stats.forwards == 10


def test_mask_token_is_never_proposed():
    model = _model("block")
    with torch.no_grad():  # make the mask token overwhelmingly likely
        model.lm_head.weight[model.config.mask_id] = model.lm_head.weight.sum(0) * 100
    out = LLM(model, device="cpu").generate(PROMPTS, SamplingParams(max_tokens=8))
    assert all(model.config.mask_id not in o.token_ids for o in out)


def test_max_tokens_and_stats():
    model = _sharpen(_model("block"))
    llm = LLM(model, device="cpu")
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=7, tau=0.5, ignore_eos=True))
    for o in outs:
        assert len(o.token_ids) == 7 and o.finish_reason == "length"
        s = o.stats
        assert s.generated_tokens == 7 and s.tpf == 7 / s.forwards and s.first_block_s > 0
    stats = llm.engine.stats.as_dict()
    assert stats["model_s"] > 0 and 0 <= stats["overhead_share"] < 1


def test_step_time_split_covers_each_step():
    """model + policy + grammar + other is the steps' own wall time (the laps leave no gap and
    count nothing twice); no grammar time at all without a constraint."""
    llm = LLM(_sharpen(_model("block")), device="cpu")
    engine = llm.engine
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(max_tokens=12, tau=0.5))
    stepped = 0.0
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        stepped += time.perf_counter() - t0
    s = engine.stats
    assert min(s.model_s, s.policy_s, s.other_s) > 0 and s.grammar_s == 0
    assert 0.9 * stepped < s.wall_s <= stepped


def test_bad_requests_are_clear_errors():
    llm = LLM(_model("block"), device="cpu")
    with pytest.raises(ValueError, match="SamplingParams.tau"):
        SamplingParams(tau=0)
    with pytest.raises(ValueError, match="SamplingParams.policy"):
        SamplingParams(policy="greedy-ish")
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="context length"):
        llm.engine.add_request([5] * 10, SamplingParams(max_tokens=10_000))
    with pytest.raises(ValueError, match="--device"):
        LLM(_model("block"), device="tpu")


def test_context_length_is_enforced_and_cache_grows_keeping_contents():
    """max_model_len bounds a request; the cache grows (with its contents) beyond its start size."""
    model = _sharpen(_model("block"))
    llm = LLM(model, device="cpu", max_model_len=300)
    with pytest.raises(ValueError, match="context length 300"):
        llm.generate([PROMPTS[0]], SamplingParams(max_tokens=296))
    long = list(range(3, 203))  # 200-token prompt + 90 new tokens > the initial 256 slots
    params = SamplingParams(max_tokens=90, tau=0.5, ignore_eos=True)
    out = llm.generate([PROMPTS[0], long], params)
    assert out[1].token_ids == reference_generate(model, long, params)
    assert llm.engine.runner.cache.capacity >= 290
