"""SpecEngine (clover/engine/spec_engine.py): self-speculative decoding behind the engine's request
API, with continuous batching. Each request's output must be what the reference decoder
(`SelfSpeculative.generate`) gives it alone, and so the AR model's greedy output."""

import pytest
import torch

from clover.checkpoint import adapter as ad
from clover.engine import LLM, SamplingParams
from clover.engine.spec_engine import SpecEngine
from clover.engine.speculative import SelfSpeculative, fuse_pair, load_pair
from clover.tasks.airspace.smol import adapted_config
from tests.test_adapter import _random_lora, base_cache, tokenizer  # noqa: F401 (fixtures)
from tests.test_speculative import _greedy, _pair


def _drain(engine) -> tuple[list, int]:
    done, most = [], 0
    while engine.has_unfinished():
        done += engine.step()
        most = max(most, len(engine.running))
    return done, most


def _prompts(lengths, seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def test_each_request_decodes_as_it_would_alone_with_rows_reused():
    ar, pair = _pair(0.0)
    prompts = _prompts((5, 11, 8, 3, 14))
    budgets = [6, 20, 16, 1, 12]  # the first finishes first: rows and batch order part
    ref = SelfSpeculative(pair)
    alone = [ref.generate(p, n, {ar.config.eos_id}) for p, n in zip(prompts, budgets, strict=True)]
    stop = alone[2].ids[4]  # a stop token id for request 2 only
    alone[2] = ref.generate(prompts[2], budgets[2], {ar.config.eos_id, stop})
    engine = SpecEngine(pair, max_batch_size=2)
    reqs = [engine.add_request(p, SamplingParams(max_tokens=n, stop_token_ids=[stop] if i == 2
                                                 else []))
            for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))]
    done, most = _drain(engine)
    assert most == 2 and sorted(r.request_id for r in done) == sorted(r.request_id for r in reqs)
    for r, want in zip(reqs, alone, strict=True):
        out = engine.output(r)
        assert out.token_ids == [t for t in want.ids if t not in (ar.config.eos_id, stop)]
        assert r.stats.forwards == want.forwards and r.stats.generated_tokens == len(want.ids)
    assert engine.output(reqs[2]).finish_reason == "stop"
    assert engine.output(reqs[3]).token_ids == _greedy(ar, prompts[3], 1)
    assert engine.output(reqs[1]).finish_reason == "length"
    assert engine.stats.forwards < sum(r.stats.forwards for r in reqs)  # batched
    assert engine.stats.generated_tokens == sum(len(w.ids) for w in alone)
    assert sorted(engine.free) == [0, 1] and not engine.running


def test_a_shared_prompt_head_comes_from_the_prefix_cache_and_changes_nothing():
    _, pair = _pair(0.0)
    head = _prompts((40,), seed=5)[0]
    prompts = [head + tail for tail in _prompts((3, 7, 5), seed=6)]
    ref = SelfSpeculative(pair)
    engine = SpecEngine(pair, max_batch_size=1)  # one at a time: each finds the last one's head
    reqs = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True))
            for p in prompts]
    _drain(engine)
    assert [engine.output(r).token_ids for r in reqs] == [ref.generate(p, 12, set()).ids
                                                          for p in prompts]
    assert engine.prefix_cache.hit_tokens == 2 * 32  # two whole 16-token chunks, twice
    assert reqs[1].stats.tokens_processed < reqs[0].stats.tokens_processed
    off = SpecEngine(pair, max_batch_size=1, prefix_cache_mb=0)
    r = off.add_request(prompts[1], SamplingParams(max_tokens=12, ignore_eos=True))
    _drain(off)
    assert off.output(r).token_ids == engine.output(reqs[1]).token_ids
    assert off.prefix_cache.hit_tokens == 0


def test_logprobs_are_the_ar_engines():
    """logprobs=k: each token's log-probability and top k are the AR model's, as the AR engine
    reports them for the same greedy tokens, whether the token was written by the prefill, as
    an accepted draft or as the AR model's own token (the drafter shares the AR weights, so some
    drafts pass)."""
    ar, pair = _pair(0.0)
    prompts = [torch.randint(3, 500, (5 + 3 * seed,), generator=torch.Generator().manual_seed(
        seed)).tolist() for seed in range(4)]  # test_speculative's: some drafts hold
    params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=3)
    want = LLM(ar, device="cpu", dtype="float32").generate(prompts, params)
    engine = SpecEngine(pair, max_batch_size=2)
    reqs = [engine.add_request(p, params) for p in prompts]
    _drain(engine)
    assert sum(r.stats.accepted_tokens for r in reqs) > 0
    for r, w in zip(reqs, want, strict=True):
        got = engine.output(r)
        assert got.token_ids == w.token_ids and len(got.logprobs) == 30
        for g, e in zip(got.logprobs, w.logprobs, strict=True):
            assert g.token_id == e.token_id and g.logprob == pytest.approx(e.logprob, abs=1e-4)
            assert [t for t, _ in g.top] == [t for t, _ in e.top] and len(g.top) == 3
    plain = engine.add_request(prompts[0], params.replace(logprobs=None))
    _drain(engine)
    assert engine.output(plain).logprobs is None


def test_speculative_sampling_writes_what_the_ar_model_would_sample():
    """The acceptance rule alone, on made-up distributions far apart (total variation 0.5): a
    draft x drawn from q, kept with probability min(1, p(x) / q(x)), else replaced from
    max(0, p - q): the written token is distributed as p (20,000 draws), not as q."""
    from clover.engine import spec_sampling as sampled
    from clover.engine.sampler import RowSampling

    p = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    q = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.3])
    s = RowSampling(1.0, 1.0, 0, torch.Generator().manual_seed(0))
    rows = torch.log(torch.stack([p, torch.full((5,), 0.2)]))  # the place, then the next one
    counts = torch.zeros(5)
    for x in torch.multinomial(q, 20000, replacement=True, generator=torch.Generator(
            ).manual_seed(1)).tolist():
        ok, own = sampled.check(rows, [x], q[None], s)
        counts[x if ok else own] += 1
    assert (counts / counts.sum() - p).abs().sum() / 2 < 0.02
    assert sampled.check(rows, [], None, None) == (0, 0)  # greedy: the argmax


def test_sampled_requests_repeat_with_a_seed_and_top_k_1_is_greedy():
    """temperature > 0 through the engine: the same seed writes the same tokens (drafts and
    checks draw from the request's generator), another seed others; top_k 1 leaves one token
    to draw, so the output is the AR model's greedy one."""
    ar, pair = _pair(0.0)
    prompt = _prompts((9,), seed=5)[0]

    def run(**knobs):
        engine = SpecEngine(pair, max_batch_size=1)
        r = engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True, **knobs))
        _drain(engine)
        return engine.output(r).token_ids

    a, b = run(temperature=1.0, seed=7), run(temperature=1.0, seed=7)
    assert a == b and len(a) == 20 and run(temperature=1.0, seed=8) != a
    assert run(temperature=0.8, top_k=1, seed=3) == _greedy(ar, prompt, 20)


def test_a_grammar_is_refused_naming_the_parameter_and_abort_frees_the_row():
    _, pair = _pair(0.0)
    engine = SpecEngine(pair, max_batch_size=1, max_model_len=64)
    with pytest.raises(ValueError, match="SamplingParams.structured"):
        engine.add_request([5, 6, 7], SamplingParams(structured={"regex": "a+"}))
    with pytest.raises(ValueError, match="exceeds the context length 64"):
        engine.add_request([5] * 60, SamplingParams(max_tokens=8))
    a = engine.add_request([5, 6, 7], SamplingParams(max_tokens=30))
    b = engine.add_request([8, 9], SamplingParams(max_tokens=5))
    engine.step()
    assert list(engine.running) == [a.request_id] and list(engine.waiting) == [b]
    assert engine.abort(a.request_id) is a and a.finish_reason == "abort"
    assert engine.free == [0]
    done, _ = _drain(engine)
    assert done == [b] and engine.output(b).token_ids == SelfSpeculative(pair).generate(
        [8, 9], 5, set()).ids


def _adapter_dirs(base, tok, tmp_path):
    """An AR adapter and a block-diffusion drafter adapter over the tiny stand-in base."""
    dirs = []
    for seed, (mode, block, shift, tag) in enumerate((("causal", 1, False, "ar"),
                                                      ("block", 4, True, "dl"))):
        config = adapted_config(base.config, mode, block, shift, tag)
        model = ad.base_model_for(config)
        peft_config = ad.lora_config(4)
        ad.inject_lora(model, peft_config)
        _random_lora(model, seed=seed)
        dirs.append(str(ad.save_adapter(model, config, peft_config, tok, tmp_path / tag,
                                        base={}, dtype=torch.float32)))
    return dirs


def test_llm_with_a_draft_runs_the_pair(base_cache, tokenizer, tmp_path):  # noqa: F811
    ar_dir, draft_dir = _adapter_dirs(base_cache, tokenizer, tmp_path)
    llm = LLM(ar_dir, draft=draft_dir, device="cpu", dtype="float32", max_batch_size=2)
    assert isinstance(llm.engine, SpecEngine) and llm.engine.pair.fused
    prompts = _prompts((6, 9, 4), seed=1, vocab=290)
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    pair, _ = load_pair(ar_dir, draft_dir, dtype=torch.float32)
    ref = SelfSpeculative(fuse_pair(pair))
    assert [o.token_ids for o in outs] == [ref.generate(p, 10, set()).ids for p in prompts]
    assert all(o.finish_reason == "length" and o.stats.forwards >= 1 for o in outs)
    stats = llm.engine.stats.as_dict()  # the requests' drafts, summed (eval and bench read it)
    assert stats["draft_tokens"] == sum(o.stats.draft_tokens for o in outs) > 0
    assert stats["accepted_tokens"] == sum(o.stats.accepted_tokens for o in outs)
    with pytest.raises(ValueError, match="draft=.*no such model directory"):
        LLM(ar_dir, draft=str(tmp_path / "nope"), device="cpu")


def test_server_with_a_draft_answers_and_refuses_a_grammar(base_cache, tokenizer,  # noqa: F811
                                                           tmp_path):
    """`clover serve --model AR --draft DRAFTER` through the real openai client: a greedy
    request gets the pair's answer, streamed or not, with log-probabilities when asked; a seeded
    sampled one repeats, and one naming no temperature samples (OpenAI's default 1.0); one that
    asks for a grammar gets a 400 naming the request's parameter; /metrics counts the drafts."""
    import openai

    from clover.server import CloverServer, ServerConfig
    from clover.server.testing import serving

    ar_dir, draft_dir = _adapter_dirs(base_cache, tokenizer, tmp_path)
    prompt = "WI 3.5NM RADIUS 512103N"
    want = LLM(ar_dir, draft=draft_dir, device="cpu", dtype="float32").generate(
        prompt, SamplingParams(max_tokens=8, ignore_eos=True))[0].text
    server = CloverServer.load(ServerConfig(model=ar_dir, draft=draft_dir, device="cpu",
                                            dtype="float32"))
    assert isinstance(server.engine, SpecEngine)
    try:
        with serving(server) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            extra = {"ignore_eos": True}
            got = client.completions.create(model="ar", prompt=prompt, max_tokens=8,
                                            temperature=0, extra_body=extra)
            assert got.choices[0].text == want and got.usage.completion_tokens == 8
            chunks = client.completions.create(model="ar", prompt=prompt, max_tokens=8,
                                               temperature=0, stream=True, extra_body=extra)
            assert "".join(c.choices[0].text for c in chunks if c.choices) == want
            sampled = [client.completions.create(model="ar", prompt=prompt, max_tokens=8,
                                                 extra_body=extra, **knobs).choices[0].text
                       for knobs in ({"temperature": 0.8, "seed": 5}, {"temperature": 0.8,
                                     "seed": 5}, {})]  # the last: OpenAI's default, 1.0
            assert sampled[0] == sampled[1] and all(t for t in sampled)
            with pytest.raises(openai.BadRequestError, match="response_format: .*no grammar"):
                client.chat.completions.create(
                    model="ar", messages=[{"role": "user", "content": prompt}], max_tokens=4,
                    response_format={"type": "json_object"})
            scored = client.completions.create(model="ar", prompt=prompt, max_tokens=8,
                                               temperature=0, logprobs=2, extra_body=extra)
            lp = scored.choices[0].logprobs
            assert scored.choices[0].text == want and len(lp.token_logprobs) == 8
            assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 2
                                                                 for t in lp.top_logprobs)
            metrics = _metrics(url)
    finally:
        server.close()
    # the finished requests' drafts as the engine counted them (vLLM's spec_decode counters;
    # these random adapters rarely agree, so few or none are accepted)
    m = server.metrics
    assert m.draft_tokens > 0 and m.draft_tokens >= m.accepted_tokens
    assert metrics["clover_spec_decode_draft_tokens_total"] == m.draft_tokens
    assert metrics["clover_spec_decode_accepted_tokens_total"] == m.accepted_tokens
    assert metrics["clover_spec_decode_acceptance_rate"] == pytest.approx(
        m.accepted_tokens / m.draft_tokens)


def _metrics(url: str) -> dict[str, float]:
    """/metrics' samples of the served model, by name."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("model")}
