"""DiffusionGemma: import, model math against transformers' own classes, and decoding.

A tiny random `DiffusionGemmaForBlockDiffusion` (every weight, norm, scale and layer scalar
randomised; a sliding layer with a window shorter than the prompt, and full layers with their
own head dim and kv heads) is saved with `save_pretrained`, converted, and run both ways.
"""

# Shapes: B batch, L length, C canvas, V vocab

from __future__ import annotations

import pytest
import torch

from clover.checkpoint import load_model
from clover.checkpoint.convert import convert
from clover.checkpoint.keymap import CheckpointError
from clover.config import ModelConfig
from clover.model import KVCache, build_model
from clover.model.gemma import DiffusionGemmaModel, canvas_visibility

transformers = pytest.importorskip("transformers")
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: E402

VOCAB, CANVAS, WINDOW = 300, 8, 4


def hf_config(**text_overrides) -> DiffusionGemmaConfig:
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, sliding_window=WINDOW, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32,
                layer_types=["sliding_attention", "full_attention", "full_attention"])
    text.update(text_overrides)
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS)


def randomise(model: DiffusionGemmaForBlockDiffusion, seed: int = 0, std: float = 0.1) -> None:
    """Every text weight random (norms and scales around 1), encoder layer scalars = decoder's."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            one_d = p.ndim == 1 or name.endswith("per_expert_scale")
            p.copy_(1 + 2 * std * noise if one_d else std * noise)
        decoder = model.model.decoder.layers
        encoder = model.model.encoder.language_model.layers
        for dec, enc in zip(decoder, encoder, strict=True):
            dec.layer_scalar.copy_(0.5 + torch.rand(1, generator=gen))
            enc.layer_scalar.copy_(dec.layer_scalar)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers model, converted Clover model)."""
    root = tmp_path_factory.mktemp("dg")
    torch.manual_seed(0)
    ref = DiffusionGemmaForBlockDiffusion(hf_config()).eval()
    randomise(ref)
    ref.save_pretrained(root / "hf")
    ours = load_model(convert(root / "hf", root / "clover"))
    return ref, ours


@pytest.fixture(scope="module")
def gen_pair(tmp_path_factory):
    """The pair for decoding: smaller random weights (std 0.03), so the self-conditioning loop
    damps float-level differences between the two implementations; with std 0.1 it amplifies
    them about 5x per step, and after ~6 steps the two sample different tokens."""
    root = tmp_path_factory.mktemp("dg_gen")
    torch.manual_seed(0)
    ref = DiffusionGemmaForBlockDiffusion(hf_config()).eval()
    randomise(ref, std=0.03)
    ref.save_pretrained(root / "hf")
    return ref, load_model(convert(root / "hf", root / "clover"))


def ref_logits(ref, hidden):
    """transformers' head on hidden states: tied lm_head, fp32, soft-capped."""
    cap = ref.config.text_config.final_logit_softcapping
    return torch.tanh(ref.lm_head(hidden).float() / cap) * cap


def test_config_maps_every_feature(pair):
    """The converted config carries the features the math needs (catches a silently dropped
    field: window, per-layer shapes, proportional RoPE, soft-cap, canvas)."""
    cfg = pair[1].config
    assert (cfg.arch, cfg.attention, cfg.canvas) == ("diffusion_gemma", "canvas", "uniform")
    assert cfg.layer_types == ["sliding", "full", "full"] and cfg.sliding_window == WINDOW
    assert cfg.layer_kv_shape(0) == (2, 16) and cfg.layer_kv_shape(1) == (1, 32)
    assert (cfg.global_partial_rotary, cfg.logit_softcap, cfg.block_size) == (0.25, 30.0, CANVAS)


def test_encoder_logits_match(pair):
    """A prompt run causally (the encoder role) gives transformers' encoder hidden states through
    the shared head; the prompt is longer than the sliding window."""
    ref, ours = pair
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref_logits(ref, ref.model.encoder(input_ids=ids).last_hidden_state)
        got = ours(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_decoder_logits_match(pair):
    """A canvas after a prompt (the decoder role: bidirectional over the cached prompt and the
    canvas, self-conditioned on previous logits) gives transformers' logits, with and without a
    self-conditioning signal."""
    ref, ours = pair
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (2, 9), generator=gen)
    canvas = torch.randint(0, VOCAB, (2, CANVAS), generator=gen)
    for sc_logits in (None, 3 * torch.randn(2, CANVAS, VOCAB, generator=gen)):
        with torch.no_grad():
            want = ref(input_ids=prompt, decoder_input_ids=canvas,
                       self_conditioning_logits=sc_logits).logits
            soft = None
            if sc_logits is not None:
                soft = torch.zeros(2, 9 + CANVAS, 64)
                soft[:, 9:] = ours.soft_embedding(sc_logits)
            out = ours(torch.cat([prompt, canvas], 1), canvas_start_B=torch.tensor([9, 9]),
                       soft_BLD=soft)
        torch.testing.assert_close(out.logits[:, 9:], want, atol=1e-4, rtol=0)


def test_second_canvas_through_cache_matches(pair):
    """After a first canvas is appended, transformers encodes it into its cache and decodes the
    next canvas; Clover's cached forwards (fixed tokens committed, canvas provisional) give the
    same logits, including a sliding layer that by then sees only part of the prefix."""
    ref, ours = pair
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, VOCAB, (1, 5), generator=gen)
    first, second = (torch.randint(0, VOCAB, (1, CANVAS), generator=gen) for _ in range(2))
    with torch.no_grad():
        cache = ref.model.encoder(input_ids=prompt, use_cache=True).cache
        cache = ref.model.encoder(input_ids=first, cache=cache, use_cache=True).cache
        want = ref(cache=cache, decoder_input_ids=second).logits
        kv = KVCache(ours.config, 1, 64)
        a = prompt.shape[1] + CANVAS
        ours(torch.cat([prompt, first], 1), cache=kv, slot_B=torch.tensor([0]),
             canvas_start_B=torch.tensor([a]))
        kv.set_length([0], [a])
        got = ours(second, cache=kv, slot_B=torch.tensor([a]), canvas_start_B=torch.tensor([a]))
    torch.testing.assert_close(got.logits, want, atol=1e-4, rtol=0)


def test_canvas_visibility_rule():
    """Causal before the canvas, everything from the canvas; the window counts back from the
    query, or from the canvas start for a canvas query (transformers' sliding cache)."""
    pos = torch.arange(8)[None]
    see = canvas_visibility(pos, pos, torch.tensor([5]), window=3)[0].int()
    assert see[2].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # fixed: causal
    assert see[4].tolist() == [0, 0, 1, 1, 1, 0, 0, 0]  # fixed: last 3 positions
    assert see[6].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]  # canvas: 2 before it, whole canvas
    assert canvas_visibility(pos, pos, torch.tensor([5]))[0, 6].all()


def test_self_conditioning_changes_only_canvas():
    """The self-conditioning input reaches canvas tokens only, and the fixed tokens' logits do
    not depend on the canvas (causal prefix)."""
    cfg = tiny_config()
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 10))
    start = torch.tensor([6])
    soft = torch.randn(1, 10, cfg.dim)
    with torch.no_grad():
        base = model(ids, canvas_start_B=start).logits
        conditioned = model(ids, canvas_start_B=start, soft_BLD=soft).logits
        other = model(torch.cat([ids[:, :6], ids[:, 6:].flip(1)], 1), canvas_start_B=start).logits
    torch.testing.assert_close(conditioned[:, :6], base[:, :6])
    assert not torch.allclose(conditioned[:, 6:], base[:, 6:])
    torch.testing.assert_close(other[:, :6], base[:, :6])


def test_logit_softcap_bounds_logits():
    """Soft-capping is cap * tanh(logits / cap): bounded by cap, while the same weights
    uncapped exceed it."""
    cfg = tiny_config()
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.embed.weight.mul_(200)
        ids = torch.randint(0, cfg.vocab_size, (1, 6))
        capped = model(ids).logits
        model.config = cfg.replace(logit_softcap=0.0)
        raw = model(ids).logits
    assert capped.abs().max() <= cfg.logit_softcap < raw.abs().max()
    torch.testing.assert_close(capped, torch.tanh(raw / 5.0) * 5.0)


def tiny_config(**changes) -> ModelConfig:
    base = dict(name="dg-tiny", arch="diffusion_gemma", attention="canvas", canvas="uniform",
                vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                layer_types=["sliding", "full"], sliding_window=4, global_head_dim=16,
                num_global_kv_heads=1, global_rope_theta=1e6, global_partial_rotary=0.25,
                ffn_dim=48, num_experts=4, num_experts_per_tok=2, expert_ffn_dim=16,
                tie_embeddings=True, logit_softcap=5.0, block_size=4, max_seq_len=128, mask_id=4)
    return ModelConfig(**{**base, **changes})


def test_config_validation_names_fields():
    """`canvas` attention belongs to the diffusion_gemma model and back; bad layer types fail."""
    with pytest.raises(ValueError, match="attention"):
        tiny_config(arch="clover")
    with pytest.raises(ValueError, match="layer_types"):
        tiny_config(layer_types=["sliding"])
    with pytest.raises(ValueError, match="sliding_window"):
        tiny_config(sliding_window=0)
    assert isinstance(build_model(tiny_config(), device="meta"), DiffusionGemmaModel)


def test_import_refuses_what_it_cannot_compute(tmp_path):
    """Unsupported config values and encoder/decoder layer scalars that differ are refused."""
    ref = DiffusionGemmaForBlockDiffusion(hf_config()).eval()
    randomise(ref)
    with torch.no_grad():
        ref.model.encoder.language_model.layers[1].layer_scalar.add_(1)
    ref.save_pretrained(tmp_path / "hf")
    with pytest.raises(CheckpointError, match="layer_scalar"):
        convert(tmp_path / "hf", tmp_path / "out")
    from clover.checkpoint.diffusion_gemma import config_from_hf
    with pytest.raises(CheckpointError, match="hidden_activation"):
        config_from_hf({"text_config": {"hidden_activation": "gelu", "num_experts": 4}})


# ---- decoding: Clover's engine against transformers' own `generate` ---------------------------

def hf_generate(ref, prompts: torch.Tensor, seed: int, *, steps: int, bound: float,
                t_max: float, t_min: float, stable: int, stop_entropy: float, eos: int | None,
                max_new: int) -> list[list[int]]:
    """transformers' DiffusionGemma `generate` (global RNG seeded), each row cut at EOS."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSamplerConfig,
    )

    torch.manual_seed(seed)
    out = ref.generate(prompts, max_new_tokens=max_new, max_denoising_steps=steps,
                       sampler_config=EntropyBoundSamplerConfig(entropy_bound=bound),
                       t_min=t_min, t_max=t_max, stability_threshold=stable,
                       confidence_threshold=stop_entropy, eos_token_id=eos, pad_token_id=0)
    rows = out.sequences[:, prompts.shape[1]:].tolist()
    return [row[:row.index(1)] if 1 in row else row for row in rows]


def clover_generate(model, prompts: torch.Tensor, seed: int | None, *, steps: int, bound: float,
                    t_max: float, t_min: float, stable: int, stop_entropy: float,
                    ignore_eos: bool, max_new: int):
    from clover.engine import LLM, SamplingParams

    llm = LLM(model, device="cpu", dtype="float32", prefix_cache_mb=0)
    params = SamplingParams(max_tokens=max_new, temperature=t_max, min_temperature=t_min,
                            steps_per_block=steps, gamma=bound, stable_steps=stable,
                            stop_entropy=stop_entropy, policy="entropy_bound", seed=seed,
                            ignore_eos=ignore_eos)
    if seed is None:
        torch.manual_seed(1234)
    return llm.generate(prompts.tolist(), params)


# (settings, prompt length and seed, sampling seeds, forwards per canvas: (min, max) or None)
SEEDED_CASES = {
    # the entropy bound, the temperature schedule (1.0 -> 0.01), self-conditioning, renoising and
    # the confidence stop in play: the mean entropy falls under 5.4 at the 7th of 8 steps, so
    # each canvas stops one step early
    "adaptive_stop": (dict(steps=8, bound=2.0, t_max=1.0, t_min=0.01, stable=0,
                           stop_entropy=5.4), (7, 5), (0, 1), (2, 15)),
    # a stability window of 2 that never holds: every canvas runs the whole step schedule, with
    # a tight entropy bound (most positions renoised every step)
    "fixed_steps": (dict(steps=6, bound=0.5, t_max=0.9, t_min=0.3, stable=2, stop_entropy=10.0),
                    (5, 6), (7, 8), None),
}


@pytest.mark.parametrize("case", sorted(SEEDED_CASES))
def test_seeded_generate_matches_transformers(gen_pair, case):
    """Batch 1, seeded: the same tokens as transformers' `generate` over two canvases."""
    ref, ours = gen_pair
    settings, (length, prompt_seed), seeds, forwards = SEEDED_CASES[case]
    prompt = torch.randint(2, VOCAB, (1, length),
                           generator=torch.Generator().manual_seed(prompt_seed))
    for seed in seeds:
        want = hf_generate(ref, prompt, seed, eos=1, max_new=2 * CANVAS, **settings)
        out = clover_generate(ours, prompt, seed, ignore_eos=False, max_new=2 * CANVAS,
                              **settings)[0]
        assert out.token_ids == want[0]
        if forwards is not None:
            assert forwards[0] <= out.stats.forwards <= forwards[1]


def test_batched_generate_matches_transformers_batch(gen_pair):
    """Batch 4 on torch's default generator: Clover draws the batch's canvases, samples and
    renoising in transformers' order, so the rows match its batched `generate` row for row
    (rows in lockstep: no early stop, no EOS stop)."""
    ref, ours = gen_pair
    settings = dict(steps=3, bound=1.0, t_max=0.8, t_min=0.4, stable=1, stop_entropy=1e-9)
    prompts = torch.randint(2, VOCAB, (4, 6), generator=torch.Generator().manual_seed(8))
    want = hf_generate(ref, prompts, 1234, eos=None, max_new=2 * CANVAS, **settings)
    outs = clover_generate(ours, prompts, None, ignore_eos=True, max_new=2 * CANVAS, **settings)
    assert [o.token_ids for o in outs] == want


def test_entropy_bound_policy_matches_plain_rule():
    """The policy accepts exactly the positions a sort-and-sum loop accepts: lowest entropies
    first, while their sum minus the largest of them is <= gamma; never a padded slot."""
    from clover.engine.policies import EntropyBoundPolicy, Proposal

    gen = torch.Generator().manual_seed(0)
    ent = torch.rand(3, 7, generator=gen) * 2
    masked = torch.ones(3, 7, dtype=torch.bool)
    masked[2, 5:] = False
    gamma = torch.tensor([0.5, 2.0, 1.0])
    ones = torch.ones(3, 7)
    p = Proposal(ones.long(), ones, ent, masked, gamma, gamma, torch.ones(3, dtype=torch.long))
    got = EntropyBoundPolicy().select(p)
    for b in range(3):
        order = sorted((float(ent[b, j]), j) for j in range(7) if masked[b, j])
        want, total = set(), 0.0
        for e, j in order:
            total += e
            if total - e <= float(gamma[b]):
                want.add(j)
        assert {j for j in range(7) if got[b, j]} == want
    assert got[0].sum() < got[1].sum()


def test_uniform_canvas_rows_never_show_drafts(pair):
    """A drafting row settles nothing (its canvas is noise until the block ends), a masking
    policy is replaced by entropy_bound, and entropy_bound is refused on a masking model."""
    from clover.engine import LLM, SamplingParams
    from clover.engine.llm import Engine

    ours = pair[1]
    engine = Engine(ours)
    r = engine.add_request([5, 6, 7], SamplingParams(max_tokens=CANVAS, temperature=0.5,
                                                     steps_per_block=3, seed=0))
    assert r.params.policy == "entropy_bound"
    engine.step()
    assert len(r.block) == CANVAS and r.settled_ids() == []
    while engine.has_unfinished():
        engine.step()
    assert len(r.output_ids(set())) == CANVAS
    with pytest.raises(ValueError, match="uniform-canvas"):
        LLM("tiny", device="cpu").generate([[5, 6]], SamplingParams(policy="entropy_bound"))


@pytest.mark.slow
def test_served_over_http_with_the_openai_client(tmp_path):
    """A converted DiffusionGemma (with a tokenizer) behind `clover serve`'s app: a chat answer
    and a streamed one with the canvas knobs as extra fields; a tool call under the tool grammar
    is a 400 that says why (a uniform canvas settles no token before its block ends)."""
    import openai

    from clover.server import CloverServer, ServerConfig
    from clover.server.testing import SAMPLE_TEXTS, serving
    from clover.tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(SAMPLE_TEXTS * 20, vocab_size=512)
    torch.manual_seed(0)
    ref = DiffusionGemmaForBlockDiffusion(hf_config(
        vocab_size=512, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()
    randomise(ref, std=0.03)
    ref.save_pretrained(tmp_path / "hf")
    save_tokenizer(tok, tmp_path / "hf")
    model_dir = convert(tmp_path / "hf", tmp_path / "clover")
    server = CloverServer.load(ServerConfig(model=str(model_dir), device="cpu"))
    knobs = {"min_temperature": 0.2, "steps_per_block": 4, "gamma": 1.0, "stable_steps": 1}
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with serving(server) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        out = client.chat.completions.create(model="clover", messages=messages,
                                             max_tokens=2 * CANVAS, temperature=0.8, seed=1,
                                             extra_body=knobs)
        assert out.choices[0].finish_reason in ("stop", "length")
        assert 0 < out.usage.completion_tokens <= 2 * CANVAS
        chunks = client.chat.completions.create(model="clover", messages=messages,
                                                stream=True,
                                                max_tokens=2 * CANVAS, temperature=0.8, seed=1,
                                                extra_body=knobs)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == out.choices[0].message.content
        tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}}}}
        with pytest.raises(openai.BadRequestError, match="uniform-canvas"):
            client.chat.completions.create(model="clover", messages=messages, tools=[tool],
                                           tool_choice="required", max_tokens=CANVAS)
