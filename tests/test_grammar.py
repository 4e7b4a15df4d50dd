"""Grammar-constrained decoding: the llguidance backend, the frontier walk, and the engine with it.

Tiny random models (lm_head sharpened so proposals are confident and varied) and a byte-level
tokenizer trained in-process on JSON-ish text. Outputs must validate against their schemas at
every policy and threshold, forced tokens must come without forwards, and a rejected token must
leave the matcher exactly where a fresh one fed the accepted prefix would be.
"""

import json
import random

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.engine.policies import POLICIES, UNIFORM_POLICIES, Proposal
from clover.engine.request import Request
from clover.grammar import build_constraint, compile_matcher, get_backend, unpack_bitmask
from clover.grammar.backend import bitmask_words
from clover.model import build_model
from clover.tokenizer import format_tool_call, train_tokenizer

pytest.importorskip("llguidance")

EOS, MASK, VOCAB = 1, 2, 512
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]


# ---- fixtures ------------------------------------------------------------------------------------

def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["name", "value", "zone", "centre", "radius", "unit", "label", "start", "end", "ok",
             "true", "false", "null", "hello", "world", "NOTAM", "tags", "items", "arguments"]
    texts = []
    for _ in range(n):
        obj = {rng.choice(words): rng.choice([rng.randint(-99, 999), rng.choice(words),
                                              rng.random() < 0.5, None, [rng.randint(0, 9)]])
               for _ in range(rng.randint(1, 4))}
        texts.append(json.dumps(obj))
        texts.append(format_tool_call(rng.choice(words), obj))
        texts.append(" ".join(rng.choices(words, k=6)) + ".")
    return texts


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(corpus(), vocab_size=VOCAB)


def tiny_llm(tok, mode: str = "block", seed: int = 0, scale: float = 6.0) -> LLM:
    block_size = 1 if mode == "causal" else 4
    model = build_model(get_preset("tiny", attention=mode, block_size=block_size), seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # near-uniform random models: sharpen the proposals
    return LLM(model.eval(), tokenizer=tok, device="cpu")


@pytest.fixture(scope="module")
def llms(tok):
    return {mode: tiny_llm(tok, mode) for mode in ("block", "causal")}


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# ---- random bounded schemas ----------------------------------------------------------------------
# Every schema's language is finite, with a known byte bound, so max_tokens = bound + 1 always
# leaves room to finish: a "length" finish would be a bug, not bad luck.

_LEAVES = st.one_of(
    st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}]),
    st.lists(st.sampled_from(["x", "yy", "zone", "A1/24"]), min_size=1, max_size=3,
             unique=True).map(lambda v: {"enum": v}),
    st.integers(0, 5).map(lambda n: {"type": "string", "maxLength": n}),
    st.sampled_from(["^[a-z]{1,4}$", "^[0-9]{2}[A-Z]$"]).map(
        lambda p: {"type": "string", "pattern": p}),
    st.sampled_from(["hello world", "NOTAM A1234/24"]).map(lambda c: {"const": c}),
)


def _object(children):
    def build(items):
        props = {f"k{i}": s for i, (s, _) in enumerate(items)}
        required = [f"k{i}" for i, (_, req) in enumerate(items) if req]
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}
    return st.lists(st.tuples(children, st.booleans()), min_size=1, max_size=3).map(build)


def _extend(children):
    return st.one_of(
        _object(children),
        st.tuples(children, st.integers(0, 3)).map(
            lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}),
        st.tuples(children, children).map(lambda t: {"anyOf": list(t)}),
    )


SCHEMAS = st.recursive(_LEAVES, _extend, max_leaves=5)


def max_bytes(s: dict) -> int:
    """An upper bound on the serialised size of any instance (12 bytes per escaped char)."""
    if "const" in s or "enum" in s:
        return max(len(json.dumps(v)) for v in s.get("enum", [s.get("const")]))
    if "anyOf" in s:
        return max(max_bytes(c) for c in s["anyOf"])
    kind = s["type"]
    if kind == "integer":
        return max(len(str(s["minimum"])), len(str(s["maximum"])))
    if kind in ("boolean", "null"):
        return 5
    if kind == "string":
        return 2 + 12 * s.get("maxLength", 4)
    if kind == "array":
        return 2 + s["maxItems"] * (max_bytes(s["items"]) + 2)
    return 2 + sum(len(k) + 6 + max_bytes(v) for k, v in s["properties"].items())


def check_valid(out, schema) -> None:
    assert out.finish_reason == "stop", (out.finish_reason, out.text)
    jsonschema.validate(json.loads(out.text), schema)


# ---- the engine under a grammar ------------------------------------------------------------------

@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS)
@example(schema={"type": "object", "additionalProperties": False, "required": ["id", "r"],
                 "properties": {"id": {"type": "string", "pattern": "^[A-Z][0-9]{4}/2[45]$"},
                                "r": {"type": "object", "additionalProperties": False,
                                      "required": ["unit"],
                                      "properties": {"v": {"type": "integer", "minimum": 1,
                                                           "maximum": 250},
                                                     "unit": {"enum": ["NM", "KM", "M"]}}},
                                "on": {"type": "array", "maxItems": 2,
                                       "items": {"type": "boolean"}}}})
@example(schema={"anyOf": [{"const": "NOTAM A1234/24"}, {"type": "array", "maxItems": 3,
                                                          "items": {"type": "null"}}]})
def test_every_output_validates_at_every_policy_and_threshold(llms, schema):
    """Whatever the model proposes and whichever positions the policy commits first, every
    finished output parses and validates against its schema (block and causal models)."""
    bound = max_bytes(schema)
    assume(bound < 200)
    structured = {"json_schema": schema}
    for llm in llms.values():
        for policy in sorted(set(POLICIES) - set(UNIFORM_POLICIES)):
            params = [SamplingParams(max_tokens=bound + 1, policy=policy, tau=tau,
                                     steps_per_block=2, gamma=0.5, temperature=temp, seed=7,
                                     structured=structured)
                      for tau, temp in ((0.5, 0.0), (0.9, 1.0), (1.0, 0.0))]
            outs = llm.generate(PROMPTS, params)
            for out in outs:
                check_valid(out, schema)


def test_forced_tokens_cost_no_forwards(llms, tok):
    """A long const string is forced by the grammar: it is written in without forwards."""
    text = "the quick brown fox jumps over the lazy dog, twice: the quick brown fox"
    schema = {"type": "object", "properties": {"note": {"const": text}, "n": {"type": "integer",
              "minimum": 0, "maximum": 9}}, "required": ["note", "n"],
              "additionalProperties": False}
    for mode, llm in llms.items():
        out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=160, tau=0.9,
                                                       structured={"json_schema": schema}))[0]
        check_valid(out, schema)
        assert out.stats.forwards < len(out.token_ids) // 4, (mode, out.stats.forwards)


def test_full_attention_model_under_a_grammar(tok):
    """`full` models decode a fixed canvas with approximate caches; outputs still validate."""
    model = build_model(get_preset("tiny", attention="full", block_size=4), seed=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    llm = LLM(model.eval(), tokenizer=tok, device="cpu")
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
              "maxItems": 5}
    for cache in ("dual", "none"):
        params = SamplingParams(max_tokens=40, tau=0.5, block_size=4, cache=cache,
                                structured={"json_schema": schema})
        for out in llm.generate(PROMPTS, params):
            check_valid(out, schema)


def test_forced_tokens_within_blocks_only(tok):
    """Without jump-forward, forced tokens still fill the rest of each block for free."""
    llm = tiny_llm(tok, "block")
    original = llm.engine._constraint

    def no_jump(structured, prompt_len):
        c = original(structured, prompt_len)
        c.jump_forward = False
        return c

    llm.engine._constraint = no_jump
    out = llm.generate(PROMPTS[:1], SamplingParams(
        max_tokens=60, structured={"json_schema": {"const": "a rather long constant string"}}))[0]
    assert json.loads(out.text) == "a rather long constant string"
    assert out.stats.forwards <= -(-len(out.token_ids) // 4) + 1  # about one per block


class LastPolicy:
    """Adversarial: commit only the last masked position of each row, never the frontier
    unless it is the only masked one left."""

    def select(self, p: Proposal) -> torch.Tensor:
        idx_BM = torch.arange(p.masked_BM.shape[1]).expand_as(p.masked_BM)
        last_B = torch.where(p.masked_BM, idx_BM, -1).max(-1).values
        return (idx_BM == last_B[:, None]) & p.masked_BM


@pytest.mark.parametrize("mode", ["block", "causal"])
def test_progress_when_the_policy_never_picks_the_frontier(monkeypatch, tok, mode):
    """Commits land beyond the frontier first and are re-masked when rejected; decoding still
    ends, with a valid output, within a bounded number of steps."""
    monkeypatch.setitem(POLICIES, "last", LastPolicy)
    llm = tiny_llm(tok, mode, seed=1)
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
              "maximum": 999}, "b": {"type": "string", "maxLength": 4}, "c": {"enum": ["x", "yy"]}},
              "required": ["a", "b", "c"], "additionalProperties": False}
    params = SamplingParams(max_tokens=64, policy="last", structured={"json_schema": schema})
    outs = llm.generate(PROMPTS, params)
    for out in outs:
        check_valid(out, schema)
        assert out.stats.forwards <= 64 * 4
    assert llm.engine.stats.steps < 64 * 4 * len(PROMPTS)


def test_frontier_invariants_hold_after_every_step(monkeypatch, tok):
    """After every update: everything behind the frontier is a valid prefix (a fresh matcher
    accepts it), the frontier never falls behind the finished blocks, and never moves back."""
    llm = tiny_llm(tok, "block", seed=2)
    sched = llm.engine.scheduler
    original, last = sched.update, {}
    structured = {"json_schema": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                             "maximum": 99}, "maxItems": 6}}
    rejected = []

    def checked(batch, tokens, commits, experts=0.0, canvas=None):
        done = original(batch, tokens, commits, experts, canvas)
        for plan in batch.rows:
            r, c = plan.request, plan.request.constraint
            f = c.frontier(r)
            assert f >= len(r.seq) and f >= last.get(r.request_id, 0)
            last[r.request_id] = f
            verified = (r.seq + r.block)[len(r.prompt):f]
            verified = verified[:verified.index(EOS)] if EOS in verified else verified
            fresh = compile_matcher(structured, tok, VOCAB, EOS)
            assert fresh.accept(verified) == len(verified)
            rejected.append(c.num_rejected)
        return done

    monkeypatch.setattr(sched, "update", checked)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, policy="topk", steps_per_block=1,
                                                temperature=1.0, seed=3, structured=structured))
    for out in outs:
        check_valid(out, structured["json_schema"])
    assert max(rejected) > 0  # the walk really did send tokens back


def test_constrained_output_does_not_depend_on_the_batch(llms):
    """At temperature 0 a constrained request decodes the same alone or beside others."""
    schema = {"type": "array", "items": {"enum": ["x", "yy", "zone"]}, "maxItems": 4}
    params = SamplingParams(max_tokens=40, tau=0.7, structured={"json_schema": schema})
    llm = llms["block"]
    batch = llm.generate(PROMPTS, [params, SamplingParams(max_tokens=20, tau=0.7), params])
    alone = llm.generate(PROMPTS[:1], params)
    assert batch[0].token_ids == alone[0].token_ids


def test_regex_lark_choice_and_json_object(llms):
    llm = llms["block"]
    cases = [({"regex": r"[A-Z]\d{4}/2[45]"}, lambda t: len(t) == 8 and t[0].isupper()),
             ({"choice": ["north", "south", "east"]}, lambda t: t in ("north", "south", "east")),
             ({"lark": 'start: "id=" D D D\nD: /[0-9]/'}, lambda t: t[:3] == "id=" and len(t) == 6)]
    for structured, ok in cases:
        out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=20, structured=structured))[0]
        assert out.finish_reason == "stop" and ok(out.text), (structured, out.text)
    m = compile_matcher({"json_object": True}, llm.tokenizer, VOCAB, EOS)
    good, bad = ids_of(llm.tokenizer, '{"a": [1, 2]}'), ids_of(llm.tokenizer, "[1]")
    assert m.accept(good) == len(good) and m.is_accepting()
    assert compile_matcher({"json_object": True}, llm.tokenizer, VOCAB, EOS).accept(bad) == 0


# ---- the frontier walk, by hand ------------------------------------------------------------------

def _request(tok, structured, block, max_tokens=8, prompt=(5, 6)):
    cfg = get_preset("tiny")
    r = Request("r", list(prompt), SamplingParams(max_tokens=max_tokens), MASK)
    r.constraint = build_constraint(structured, tok, cfg, len(prompt))
    r.block = list(block)
    return r


def test_walk_rejects_first_bad_token_and_keeps_the_rest(tok):
    a, b, c, x = (ids_of(tok, ch)[0] for ch in "abcx")
    r = _request(tok, {"regex": "a(b|c)+"}, [a, x, b, MASK])
    r.constraint.after_commit(r)
    assert r.block == [a, MASK, b, MASK]  # x re-masked, b beyond it kept (unverified)
    assert r.constraint.frontier(r) == 2 + 1


def test_rejected_eos_takes_its_padding_with_it(tok):
    """EOS where the grammar is incomplete is re-masked with the EOS fill after it, and the
    request no longer counts as having seen EOS (so the block cannot finish the request)."""
    a = ids_of(tok, "a")[0]
    r = _request(tok, {"regex": "a(b|c)+"}, [a, EOS, EOS, EOS])
    r.eos_seen = True  # as the scheduler's EOS fill left it
    r.constraint.after_commit(r)
    assert r.block == [a, MASK, MASK, MASK] and not r.eos_seen


def test_accepted_eos_finishes_and_pads(tok):
    a, b = ids_of(tok, "a")[0], ids_of(tok, "b")[0]
    r = _request(tok, {"regex": "a(b|c)+"}, [a, b, EOS, MASK])
    r.constraint.after_commit(r)
    assert r.block == [a, b, EOS, EOS] and r.eos_seen and r.constraint.done


def test_forced_tokens_fill_the_block_then_jump_past_it(tok):
    text = "abcdefgh"
    r = _request(tok, {"regex": text}, [MASK] * 4, max_tokens=16)
    r.constraint.after_commit(r)
    assert tok.decode(r.block[:-1]) == text and r.block[-1] == EOS and r.eos_seen
    r = _request(tok, {"regex": text}, [MASK] * 4, max_tokens=4)
    r.constraint.after_commit(r)  # no room past max_tokens: the block stays its size
    assert len(r.block) == 4 and MASK not in r.block and text.startswith(tok.decode(r.block))


def test_frontier_mask_allows_only_grammar_tokens_never_mask(tok):
    r = _request(tok, {"json_schema": {"type": "integer", "minimum": 0, "maximum": 5}},
                 [MASK] * 4)
    allowed = r.constraint.allowed_tokens(r)
    digits = {ids_of(tok, str(d))[0] for d in range(6)}
    assert set(allowed.nonzero().flatten().tolist()) == digits
    logits = torch.zeros(4, VOCAB)
    r.constraint.mask_logits(r, [0, 1, 2, 3], logits)
    assert torch.isfinite(logits[0]).sum() == 6 and torch.isfinite(logits[1:]).all()
    r.block = [ids_of(tok, "3")[0], MASK, MASK, MASK]
    r.constraint.after_commit(r)
    assert r.block[1:] == [EOS] * 3 and r.constraint.done  # 3 ends the grammar: EOS padding


# ---- backend -------------------------------------------------------------------------------------

def _bits(m) -> torch.Tensor:
    b = torch.zeros(bitmask_words(VOCAB), dtype=torch.int32)
    m.fill_bitmask(b)
    return unpack_bitmask(b, VOCAB)


def test_rejected_token_and_rollback_leave_the_matcher_consistent(tok):
    """accept stops at the first bad token without breaking the matcher; rollback returns it
    to exactly the state of a fresh matcher fed the shorter prefix."""
    structured = {"json_schema": {"type": "object", "properties": {"k": {"type": "integer"}}}}
    good = ids_of(tok, '{"k": 12')
    m = compile_matcher(structured, tok, VOCAB, EOS)
    assert m.accept(good + [ids_of(tok, "x")[0], *good]) == len(good)
    fresh = compile_matcher(structured, tok, VOCAB, EOS)
    fresh.accept(good)
    assert torch.equal(_bits(m), _bits(fresh))
    m.rollback(2)
    fresh = compile_matcher(structured, tok, VOCAB, EOS)
    fresh.accept(good[:-2])
    assert torch.equal(_bits(m), _bits(fresh))
    assert m.accept(good[-2:]) == 2


def test_eos_is_the_stop_token_and_tokens_past_the_tokenizer_are_never_allowed(tok):
    m = compile_matcher({"regex": "ab?"}, tok, VOCAB, EOS)
    m.accept(ids_of(tok, "a"))
    allowed = _bits(m)
    assert allowed[EOS] and not allowed[MASK] and not allowed[len(tok):].any()
    m.accept(ids_of(tok, "b"))
    assert m.is_stopped() and _bits(m).nonzero().flatten().tolist() == [EOS]


def test_compiled_grammars_are_cached(tok):
    backend = get_backend(tok, VOCAB, EOS)
    structured = {"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 77}}
    before = backend.cache_info()
    compile_matcher(structured, tok, VOCAB, EOS)
    compile_matcher(structured, tok, VOCAB, EOS)
    after = backend.cache_info()
    assert after.misses == before.misses + 1 and after.hits == before.hits + 1


# ---- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("structured, message", [
    ({"json_schema": {"type": "foo"}}, "invalid JSON schema: Invalid type"),
    ({"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "Unsatisfiable"),
    ({"json_schema": {"type": "object", "properties": {}, "required": ["a"],
                      "additionalProperties": False}}, "Unsatisfiable"),
    ({"json_schema": False}, "matches nothing"),
    ({"json_schema": "not a schema"}, "must be a JSON Schema object"),
    ({"regex": "(ab"}, "invalid regex"),
    ({"regex": ""}, "non-empty string"),
    ({"lark": "start: foo"}, "invalid Lark grammar"),
    ({"lark": "start: A\nA: /a/ & /b/"}, "unsatisfiable Lark grammar"),
    ({"json_object": "yes"}, "must be True"),
    ({"xml": "<a/>"}, "exactly one of the keys"),
    ({"regex": "a", "lark": "start: a"}, "exactly one of the keys"),
    ({"regex": "a", "tool_choice": "auto"}, "only goes with"),
])
def test_bad_specs_raise_clear_value_errors(tok, structured, message):
    with pytest.raises(ValueError, match=message):
        compile_matcher(structured, tok, VOCAB, EOS)


def test_engine_rejects_a_bad_spec_at_add_request(llms):
    with pytest.raises(ValueError, match="Unsatisfiable"):
        llms["block"].generate(PROMPTS[:1], SamplingParams(structured={"json_schema": {
            "type": "string", "minLength": 5, "maxLength": 2}}))
    assert not llms["block"].engine.has_unfinished()
