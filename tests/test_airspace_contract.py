"""The strict tool schemas: every gold call matches them, and nothing that matches them is
rejected by the scorer's parsers (so a grammar built from them makes every call valid)."""


import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.grammar import compile_matcher
from clover.model import build_model
from clover.tasks.airspace import assistant_text, generate_examples, reference_calls
from clover.tasks.airspace.contract import (
    COORDINATES,
    TIME,
    place_names,
    strict_tools,
)
from clover.tasks.airspace.normalise import parse_centre, parse_time
from clover.tasks.airspace.places import SPLITS
from clover.tasks.airspace.tools import format_call, interpret_call, parse_tool_calls
from clover.tokenizer import render_chat, train_tokenizer

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in strict_tools()}
VALIDATORS = {name: jsonschema.Draft202012Validator(s) for name, s in SCHEMAS.items()}
GOOD = {"zone_id": "A0398/25", "centre": "1214.3N 12212.1E",
        "radius": {"value": 10, "unit": "NM"}, "upper": {"value": 300, "unit": "M", "ref": "AGL"},
        "start": "2025-02-14T04:00Z", "end": "2025-02-14T10:30Z"}


@pytest.mark.parametrize("split", SPLITS)
def test_every_gold_call_matches_the_strict_schemas(split):
    calls = [c for e in generate_examples(split, 300, seed=7)
             for c in e.calls + [c for _, cs in e.history for c in cs]]
    assert len(calls) > 250
    for call in calls:
        VALIDATORS[call["name"]].validate(call["arguments"])


_LOOSE = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@_LOOSE
@given(st.from_regex(COORDINATES, fullmatch=True))
def test_every_coordinate_the_pattern_allows_parses(text):
    lat, lon = parse_centre(text)
    assert -90 <= lat <= 90 and -180 <= lon <= 180


@_LOOSE
@given(st.from_regex(TIME, fullmatch=True))
def test_every_time_the_pattern_allows_parses(text):
    assert parse_time(text) is not None


def test_every_place_name_resolves():
    for name in place_names():
        parse_centre(name)


@pytest.mark.parametrize("key,value", [
    ("centre", "1294.3N 12212.1E"),  # 94 minutes
    ("centre", "ZZZZ"),  # not an airport
    ("centre", "1214.3N 12212.1E extra"),
    ("start", "2025-02-30T04:00Z"),
    ("start", "2025-02-14T04:00+15:00"),
    ("radius", {"value": 0, "unit": "NM"}),
    ("radius", {"value": 187052, "unit": "KM"}),  # a model wrote it; the limit is 2,000 km
    ("radius", {"value": 1080, "unit": "NM"}),
    ("upper", {"value": 300, "unit": "FT", "ref": "STD"}),
])
def test_the_schemas_reject_what_the_scorer_rejects(key, value):
    bad = {**GOOD, key: value}
    with pytest.raises(ValueError):
        interpret_call("set_no_fly_zone", bad)
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS["set_no_fly_zone"].validate(bad)


@pytest.fixture(scope="module")
def tiny_llm():
    examples = generate_examples("train", 300, 1)
    texts = [e.text for e in examples] + [assistant_text(reference_calls(e)) for e in examples]
    tok = train_tokenizer(texts, vocab_size=512)
    return LLM(build_model(get_preset("tiny", max_seq_len=2048), seed=0), tok)


def _accepts(llm, text: str) -> bool:
    cfg = llm.config
    matcher = compile_matcher({"tools": strict_tools(), "tool_choice": "required"},
                              llm.tokenizer, cfg.vocab_size, cfg.eos_id)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    return matcher.accept(ids) == len(ids)


def test_the_grammar_agrees_with_the_schemas(tiny_llm):
    assert _accepts(tiny_llm, format_call({"name": "set_no_fly_zone", "arguments": GOOD}))
    for centre in ("北纬31°08′36″、东经121°48′18″", "45°12'30\"N 6°15'10\"E", "ZBAA"):
        call = {"name": "set_no_fly_zone", "arguments": {**GOOD, "centre": centre}}
        assert _accepts(tiny_llm, format_call(call)), centre
    for key, value in [("centre", "1294.3N 12212.1E"), ("centre", "ZZZZ"),
                       ("start", "2025-02-30T04:00Z"), ("radius", {"value": 1e400, "unit": "M"}),
                       ("radius", {"value": 187052, "unit": "KM"})]:
        call = {"name": "set_no_fly_zone", "arguments": {**GOOD, key: value}}
        assert not _accepts(tiny_llm, format_call(call)), (key, value)
    polygon = {"zone_id": "Z1", "polygon": ["1214N12212E", "1215N12213E", "1213N12214E"],
               "start": "2502140400", "end": "2502141030", "schedule": "DAILY 0800-1600"}
    assert _accepts(tiny_llm, format_call({"name": "set_no_fly_zone", "arguments": polygon}))
    for bad in ({**polygon, "polygon": polygon["polygon"][:2]},
                {**polygon, "radius": GOOD["radius"]}, {"zone_id": "Z1", "start": "2502140400"}):
        assert not _accepts(tiny_llm, format_call({"name": "set_no_fly_zone", "arguments": bad}))


@pytest.mark.slow
def test_random_weights_under_the_strict_grammar_write_only_valid_calls(tiny_llm):
    """The guarantee itself: an untrained model, forced to call tools, writes calls that the
    scorer's `interpret_call` accepts, at every threshold."""
    prompts = [render_chat(tiny_llm.tokenizer, [{"role": "user", "content": e.text}],
                           add_generation_prompt=True)
               for e in generate_examples("test", 3, 0)]
    closed = 0
    for tau in (0.5, 1.0):
        params = SamplingParams(tau=tau, max_tokens=320,
                                structured={"tools": strict_tools(), "tool_choice": "required"})
        for out in tiny_llm.generate(prompts, params):
            parsed = parse_tool_calls(out.text)
            closed += len(parsed.calls)
            if out.finish_reason == "stop":  # not cut at max_tokens
                assert parsed.num_invalid == 0, out.text
            for call in parsed.calls:
                interpret_call(call["name"], call["arguments"])
    assert closed > 0
