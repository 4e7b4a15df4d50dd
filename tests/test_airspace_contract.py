"""The strict tool schemas: every gold call matches them, and nothing that matches them is
rejected by the scorer's parsers (so a grammar built from them makes every call valid)."""

import json
import os
import subprocess
import sys

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clover.config import get_preset
from clover.engine import LLM, SamplingParams
from clover.grammar import compile_matcher
from clover.model import build_model
from clover.tasks.airspace import assistant_text, generate_examples, reference_calls
from clover.tasks.airspace.agent import initial_conversation
from clover.tasks.airspace.contract import (
    COORDINATES,
    TIME,
    centre_candidates,
    grounded_constraint,
    grounded_tools,
    height_candidates,
    height_mentions,
    place_names,
    radius_candidates,
    strict_tools,
    time_candidates,
    turn_slots,
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


# one NOTAM the grounded tests share, and its gold arguments
NOTAM = ("A1234/25 NOTAMN\nA) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 1214.3N "
         "12212.1E RADIUS 10NM.\nF) SFC G) 300M AGL")
NOTAM_CALL = {**GOOD, "start": "2502140400", "end": "2502141030"}


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


# ---- grounded: the contract narrowed to one turn's messages --------------------------------------


def _grounded_validator(texts: list[str], name: str = "set_no_fly_zone"):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in grounded_tools(texts)}
    return jsonschema.Draft202012Validator(schemas[name]) if name in schemas else None


@pytest.mark.parametrize("split", SPLITS)
def test_every_gold_call_matches_its_grounded_schemas(split):
    """The candidates come from the message text alone, and they always hold the gold values:
    every gold call of every split validates against the schemas grounded in its own turn."""
    checked = 0
    for e in generate_examples(split, 300, seed=11):
        texts = [text for text, _ in e.history] + [e.text]
        for call in e.calls:
            _grounded_validator(texts, call["name"]).validate(call["arguments"])
            checked += call["name"] == "set_no_fly_zone"
    assert checked > 250


def _turn_accepts(tok, conversation: list[dict], text: str) -> bool:
    m = compile_matcher(grounded_constraint(conversation), tok, len(tok), tok.eos_token_id)
    ids = tok.encode(text, add_special_tokens=False)
    return m.accept(ids) == len(ids) and m.is_accepting()


@pytest.mark.parametrize("split", SPLITS)
def test_every_gold_turn_is_in_its_turn_grammar(tiny_llm, split):
    """The turn grammar (`grounded_constraint`: the last user message's centres in the order
    written, each once) accepts every gold assistant turn of every split, history or not."""
    examples = generate_examples(split, 400, seed=13)
    examples = [e for e in examples if e.history][:20] + examples[:40]
    assert len(examples) > 50
    for e in examples:
        text = assistant_text(e.calls)
        assert _turn_accepts(tiny_llm.tokenizer, initial_conversation(e), text), (e.id, text)


def test_turn_grammar_takes_each_written_centre_once_in_order(tiny_llm):
    """Two zones of one message: in the order written, each once; a zone of an earlier turn's
    message is refused; after a turn's first call (before the tool results) only the later
    centre is left."""
    tok = tiny_llm.tokenizer
    first = ("(A0001/25 NOTAMN\nA) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 5NM RADIUS "
             "OF 5130N 00030W.\nF) SFC G) 400FT AGL)")
    second = ("!FDC 5/5151 ZDC NC..AIRSPACE HATTERAS, NC..TEMPORARY FLIGHT RESTRICTIONS "
              "2501171400-2501171600. WI AN AREA DEFINED AS 3NM RADIUS OF 351531N0752645W "
              "SFC-17999FT MSL, AND WI AN AREA DEFINED AS 30NM RADIUS OF 352000N0750000W "
              "SFC-17999FT MSL.")
    assert [s["properties"]["centre"]["const"] for _, s in turn_slots(second)] == [
        "351531N0752645W", "352000N0750000W"]

    def zone(centre, radius):
        return format_call({"name": "set_no_fly_zone", "arguments": {
            "zone_id": "Z1", "centre": centre, "radius": {"value": radius, "unit": "NM"},
            "start": "2501171400", "end": "2501171600"}})

    near, far = zone("351531N0752645W", 3), zone("352000N0750000W", 30)
    old = zone("5130N 00030W", 5).replace("2501171400", "2502140400").replace(
        "2501171600", "2502141030")
    turn = [{"role": "user", "content": first}, {"role": "assistant", "content": old},
            {"role": "user", "content": second}]
    assert _turn_accepts(tok, turn, f"{near}\n{far}")
    # each ring writes its radius, so each is owed
    for bad in (near, far, f"{far}\n{near}", f"{near}\n{near}", old, zone("351531N0752645W", 5),
                "Done."):
        assert not _turn_accepts(tok, turn, bad), bad
    assert _turn_accepts(tok, turn[:1], old)
    called = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "set_no_fly_zone", "arguments": json.loads(near[11:-12])["arguments"]}}]}
    after = [*turn, called, {"role": "tool", "content": "{\"ok\": true}"}]
    assert _turn_accepts(tok, after, far) and not _turn_accepts(tok, after, near)
    assert not _turn_accepts(tok, after, "Done.")  # the far ring is still owed
    far_call = {"type": "function", "function": {
        "name": "set_no_fly_zone", "arguments": json.loads(far[11:-12])["arguments"]}}
    both = [*turn, {**called, "tool_calls": [*called["tool_calls"], far_call]}]
    assert _turn_accepts(tok, both, "Done.") and not _turn_accepts(tok, both, "0" * 201)
    assert not _turn_accepts(tok, both, far)


def test_a_listed_zone_takes_the_radius_and_limits_of_its_own_item():
    """In a message listing several zones (lines, `；`-clauses, `, AND`), a zone's radius is the
    one written in its own item, and its limits are written in its item or outside all items."""
    def slot(text, centre):
        props = next(s["properties"] for _, s in turn_slots(text)
                     if s["properties"]["centre"]["const"] == centre)
        radii = {(b["properties"]["unit"]["const"], v) for b in props["radius"]["anyOf"]
                 for v in b["properties"]["value"]["enum"]}
        uppers = {(b["properties"]["unit"].get("const"), v) for b in props["upper"]["anyOf"]
                  for v in b["properties"].get("value", {}).get("enum", [None])}
        return radii, uppers

    notam = ("B2641/26 NOTAMN\nA) CYBC B) 2602111600 C) 2602161600\nE) UAS OPS WI FLW AREAS:\n"
             "1. 3KM RADIUS 491218N 0675403W\n2. 200M RADIUS 490939N 0675149W\n"
             "F) SFC G) 1500FT AMSL")
    assert slot(notam, "491218N 0675403W") == ({("KM", 3)}, {("FT", 1500)})
    assert slot(notam, "490939N 0675149W")[0] == {("M", 200)}
    cn = ("管控时间：2025年12月25日6时至2025年12月26日24时。\n管控区域：（一）以北纬38°57′27″、东经"
          "117°11′05″为中心，半径2.5公里范围内真高120米以下空域；（二）以北纬39°04′25″、东经117°16′01″"
          "为中心，半径1500米范围内空域。")
    one, two = "北纬38°57′27″、东经117°11′05″", "北纬39°04′25″、东经117°16′01″"
    assert slot(cn, one) == ({("KM", 2.5)}, {("M", 120)})
    assert slot(cn, two) == ({("M", 1500)}, {("UNL", None)})
    fdc = ("WI AN AREA DEFINED AS 3NM RADIUS OF 351531N0752645W SFC-17999FT MSL, AND WI AN AREA "
           "DEFINED AS 30NM RADIUS OF 351531N0752645W SFC-17999FT MSL. 2501171400-2501171600")
    assert [{(b["properties"]["unit"]["const"], v) for b in p["properties"]["radius"]["anyOf"]
             for v in b["properties"]["value"]["enum"]} for _, p in turn_slots(fdc)] == [
        {("NM", 3)}, {("NM", 30)}]


def test_a_zone_reaches_up_to_the_last_height_written():
    """The upper limit is the last height written (UNL when none is, or also when UNL is
    written); the lower is SFC or a height written before it."""
    def limits(lines):
        text = ("A1234/25 NOTAMN\nA) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 1214.3N "
                f"12212.1E RADIUS 10NM.\n{lines}")
        props = turn_slots(text)[-1][1]["properties"]
        def refs(b):
            ref = b["properties"].get("ref", {})
            return tuple(ref["enum"]) if "enum" in ref else (ref["const"],) if ref else ()

        return [{(b["properties"]["unit"].get("const"), v, refs(b)) for b in props[k]["anyOf"]
                 for v in b["properties"].get("value", {}).get("enum", [None])}
                for k in ("lower", "upper")]

    sfc = {("FT", 0, ("SFC", "AMSL", "AGL")), ("M", 0, ("SFC", "AMSL", "AGL")), ("UNL", None, ())}
    lower, upper = limits("F) 1000FT AMSL G) FL095")  # two heights: a raised lower, required
    assert upper == {("FL", 95, ("STD",))} and lower == {("FT", 1000, ("AMSL",))}
    assert "lower" in turn_slots("A) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 1214.3N "
                                 "12212.1E RADIUS 10NM.\nF) 1000FT AMSL G) FL095")[0][1][
        "required"]
    assert limits("inside a 300 metres radius of X from the surface to 1200 feet AGL") == [
        sfc, {("FT", 1200, ("AGL",))}]  # `300 metres radius` is a radius
    assert limits("F) SFC G) 400FT AGL") == [sfc, {("FT", 400, ("AGL",))}]
    assert limits("F) SFC G) UNL") == [sfc, {("UNL", None, ())}]
    assert limits("")[1] == {("UNL", None, ())}
    lower, upper = limits("F) 1000FT AMSL G) UNL")
    assert upper == {("FT", 1000, ("AMSL",)), ("UNL", None, ())}
    assert ("FT", 1000, ("AMSL",)) in lower


def test_a_message_with_a_centre_and_a_radius_orders_a_zone(tiny_llm):
    """A message that writes a centre and a radius with its unit orders at least one zone: the
    turn may not skip it; a message that writes no radius (an obstacle light, with a distance
    and bearing from a navaid) offers no zone at all."""
    tok = tiny_llm.tokenizer
    obst = ("!VLD 08/461 VLD OBST TOWER LGT (ASR 1133468) 304919N/0832609W (8.6NM WNW VLD) "
            "1295FT (1092FT AGL) U/S 2408201430-2408231430")
    zone = NOTAM
    call = format_call({"name": "set_no_fly_zone", "arguments": {
        "zone_id": "A1234/25", "centre": "1214.3N 12212.1E", "radius": {"value": 10, "unit": "NM"},
        "upper": {"value": 300, "unit": "M", "ref": "AGL"}, "start": "2502140400",
        "end": "2502141030"}})
    assert turn_slots(obst) == [] and [t["function"]["name"] for t in grounded_tools([obst])] == [
        "clear_zone"]
    assert _turn_accepts(tok, [{"role": "user", "content": obst}], "No no-fly zone.")
    for text, ok, bad in ((zone, call, "No no-fly zone."), (f"{obst}\n\n{zone}", call, "Done.")):
        turn = [{"role": "user", "content": text}]
        assert _turn_accepts(tok, turn, ok) and not _turn_accepts(tok, turn, bad)


def test_turn_grammar_clears_only_the_id_a_message_cancels(tiny_llm):
    tok = tiny_llm.tokenizer
    text = ("B8359/25 NOTAMC B8336/25\nQ) LIMM/QRRXX/IV/BO/W/000/040/4530N00910E005\n"
            "A) LIMM B) 2506011200\nE) REF NOTAM B8336/25 CANCELLED.")
    turn = [{"role": "user", "content": text}]

    def clear(zone_id):
        return format_call({"name": "clear_zone", "arguments": {"zone_id": zone_id}})

    assert _turn_accepts(tok, turn, clear("B8336/25"))
    for bad in (clear("B8359/25"), clear("A0001/25"), f'{clear("B8336/25")}\n{clear("B8336/25")}'):
        assert not _turn_accepts(tok, turn, bad), bad


def test_grounded_schemas_reject_values_the_message_does_not_write():
    text = NOTAM
    good = NOTAM_CALL
    check = _grounded_validator([text])
    check.validate(good)
    for key, value in [("centre", "1214.4N 12212.1E"),  # valid, but not the message's
                       ("centre", "EGKK"), ("start", "2025-02-14T04:00Z"),  # same time, ISO
                       ("end", "2502141031"), ("radius", {"value": 11, "unit": "NM"}),
                       ("upper", {"value": 400, "unit": "M", "ref": "AGL"}),
                       # digits of the centre or a time are not a radius or a limit
                       ("radius", {"value": 1214.3, "unit": "M"}),
                       ("upper", {"value": 12212.1, "unit": "FT", "ref": "AMSL"}),
                       ("radius", {"value": 10, "unit": "KM"}),  # written as 10NM
                       ("upper", {"value": 300, "unit": "FT", "ref": "AGL"}),  # 300M
                       ("upper", {"value": 10, "unit": "FL", "ref": "STD"})]:  # no FL written
        with pytest.raises(jsonschema.ValidationError):
            check.validate({**good, key: value})
    check.validate({**good, "centre": "EGLL"})  # a place the message names


def test_a_grounded_zone_gives_its_times_and_replaces_only_what_its_message_replaces():
    text = NOTAM
    good = NOTAM_CALL
    check = _grounded_validator([text])
    check.validate(good)
    for bad in ({k: v for k, v in good.items() if k != "start"},
                {k: v for k, v in good.items() if k != "end"},
                {**good, "action": "replace", "replaces": "A1233/25"},
                {**good, "action": "create"}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)
    check = _grounded_validator([text.replace("A1234/25 NOTAMN", "A1234/25 NOTAMR A1233/25")])
    check.validate({**good, "action": "replace", "replaces": "A1233/25"})
    for bad in (good, {**good, "action": "replace", "replaces": "A1234/25"}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)


def test_grounded_zone_values_come_from_one_message():
    """With two messages (two user turns, or one turn holding a feed of two), each message's
    own values pass, and a call that mixes in a value of the other is refused."""
    first = NOTAM
    second = ("A2000/25 NOTAMN\nA) EGKK B) 2503010600 C) 2503011800\nE) UAS OPS WI 5130.0N "
              "00010.0W RADIUS 2NM.\nF) SFC G) 120M AGL")
    one = {**GOOD, "start": "2502140400", "end": "2502141030"}
    two = {**GOOD, "zone_id": "A2000/25", "centre": "5130.0N 00010.0W",
           "radius": {"value": 2, "unit": "NM"}, "upper": {"value": 120, "unit": "M", "ref": "AGL"},
           "start": "2503010600", "end": "2503011800"}
    for texts in ([first, second], [f"{first}\n\n{second}"]):  # two turns, or one feed
        check = _grounded_validator(texts)
        check.validate(one)
        check.validate(two)
        for key in ("centre", "start", "end", "radius", "upper"):
            with pytest.raises(jsonschema.ValidationError):
                check.validate({**one, key: two[key]})
    assert _grounded_validator([first, first]).schema == _grounded_validator([first]).schema


def test_grounded_zone_ends_after_it_starts():
    """A grounded zone ends after it starts, in time and in the text; it has no end only when
    its message writes one time; a missing start goes with any end."""
    text = NOTAM
    good = NOTAM_CALL
    check = _grounded_validator([text])
    for start, end in [("2502140400", "2502141030"), (None, "2502140400"), (None, None)]:
        check.validate({**good, "start": start, "end": end})
    for start, end in [("2502140400", "2502140400"), ("2502141030", "2502140400"),
                       ("2502141030", "2502141030"), ("2502141030", None),
                       ("2502140400", None)]:
        with pytest.raises(jsonschema.ValidationError):
            check.validate({**good, "start": start, "end": end})
    one = _grounded_validator([text.replace(" C) 2502141030", "")])
    one.validate({**good, "end": None})
    backwards = _grounded_validator([text.replace("B) 2502140400 C) 2502141030",
                                                  "C) 2502141030 B) 2502140400")])
    with pytest.raises(jsonschema.ValidationError):
        backwards.validate(good)


def test_radius_candidates_pair_each_number_with_the_unit_written_after_it():
    # `9.6NM WSW ALO` is a distance and bearing from a navaid, not a radius
    assert radius_candidates("WI 10NM RADIUS, 3NMR OF X (9.6NM WSW ALO) SFC-1200FT AGL") == {
        "NM": [3, 10]}
    assert radius_candidates("within 0.25 nautical miles of; Radius: 2 km; 2000MTR") == {
        "NM": [0.25], "KM": [2], "M": [2000]}
    # a number written as a height is not a radius
    assert radius_candidates("半径1.5公里范围内真高300米以下") == {"KM": [1.5]}
    assert radius_candidates("Radius: 300 m; up to 150 m AGL, 200 m above mean sea level") == {
        "M": [300]}
    assert radius_candidates("FL095 2507220730") == {}


def test_height_candidates_pair_each_number_with_its_unit():
    assert height_candidates("F) 1500FT AMSL G) FL125; SFC-1200FT AGL; FL 095") == {
        "FT": [1200, 1500], "FL": [95, 125]}
    assert height_candidates("up to 150 m above ground level; 真高300米以下; 600M AMSL") == {
        "M": [150, 300, 600]}
    assert height_candidates("WI 10NM RADIUS 2507220730") == {}
    # a number written as a radius is not a height
    assert height_candidates("以北纬39°06′58″为圆心，半径100米范围内真高1000米以下空域") == {
        "M": [1000]}
    assert height_candidates("WI 250M RADIUS; RADIUS 2000MTR; within 300 m of; SFC-400FT AGL") \
        == {"FT": [400]}


def test_height_mentions_read_the_reference_from_the_words():
    assert height_mentions("SFC-3000FT MSL; 500 ft above ground level; 真高120米以下; FL095; "
                           "1,200 feet; 600M AMSL") == [
        ("FT", 3000, "AMSL"), ("FT", 500, "AGL"), ("M", 120, "AGL"), ("FL", 95, "STD"),
        ("FT", 1200, None), ("M", 600, "AMSL")]
    text = ("A1234/25 NOTAMN\nA) EGLL B) 2502140400 C) 2502141030\nE) UAS OPS WI 1214.3N "
            "12212.1E RADIUS 10NM.\nF) 500FT AGL G) 3000FT AMSL")
    good = {**GOOD, "start": "2502140400", "end": "2502141030",
            "lower": {"value": 500, "unit": "FT", "ref": "AGL"},
            "upper": {"value": 3000, "unit": "FT", "ref": "AMSL"}}
    check = _grounded_validator([text])
    check.validate(good)
    check.validate({**good, "lower": {"value": 0, "unit": "FT", "ref": "SFC"}})
    for key, value in [("upper", {"value": 3000, "unit": "FT", "ref": "AGL"}),
                       ("lower", {"value": 500, "unit": "FT", "ref": "AMSL"})]:
        with pytest.raises(jsonschema.ValidationError):
            check.validate({**good, key: value})


def test_a_centre_stands_alone():
    """A coordinate glued to other digits or letters (the Q-line's `4912N06754W002`) is part
    of something else, not a centre."""
    text = ("B2641/26 NOTAMN\nQ) CZEG/QRRCA/IV/BO/W/000/015/4912N06754W002\nA) CYBC "
            "B) 2602111600 C) 2602161600\nE) UAS OPS WI 3KM RADIUS 491218N 0675403W.")
    assert centre_candidates(text) == ["491218N 0675403W", "CYBC"]
    assert centre_candidates("X4912N06754W and (4912N06754W)") == ["4912N06754W"]


def test_grounded_tools_drop_the_zone_tool_when_nothing_is_a_centre():
    tools = grounded_tools(["!SVC 07/502 SVC NAV ILS RWY 01R LOC U/S 2507290030-2507310100"])
    assert [t["function"]["name"] for t in tools] == ["clear_zone"]


def test_grounded_candidates_complete_a_chinese_end_and_a_stated_offset():
    cn = "管控时间：2024年12月30日14时至1月2日16时；2024年4月3日9时30分至18时。"
    en = "from 20:00 on 15 May 2025 to 01:00 on 16 May 2025 local time (UTC+01:00)."
    allowed = time_candidates(f"{cn}\n{en}")
    for t in ("2024年12月30日14时", "2025年1月2日16时", "2024年4月3日9时30分", "2024年4月3日18时",
              "20:00 on 15 May 2025 UTC+01:00", "01:00 on 16 May 2025 UTC+01:00"):
        assert t in allowed, t
        assert parse_time(t) is not None
    assert parse_time("2024年4月3日18时") == "2024-04-03T10:00Z"


@pytest.mark.slow
def test_random_weights_under_the_grounded_grammar_copy_only_the_messages_values(tiny_llm):
    """An untrained model under the grounded grammar: every closed call is valid, and its centre
    is a span of the message it answers."""
    examples = [e for e in generate_examples("test", 6, 3) if e.zones][:3]
    closed = 0
    for e in examples:
        conversation = [{"role": "user", "content": e.text}]
        tools = grounded_tools([e.text])  # the zone tool only: random weights
        structured = {"tools": tools[:1], "tool_choice": "required"}  # pick clear_zone else
        prompt = render_chat(tiny_llm.tokenizer, conversation, add_generation_prompt=True)
        out = tiny_llm.generate([prompt], SamplingParams(tau=0.5, max_tokens=320,
                                                         structured=structured))[0]
        parsed = parse_tool_calls(out.text)
        if out.finish_reason == "stop":
            assert parsed.num_invalid == 0, out.text
        for call in parsed.calls:
            interpret_call(call["name"], call["arguments"])
            if call["name"] == "set_no_fly_zone":
                closed += 1
                assert call["arguments"]["centre"] in e.text
    assert closed > 0


def test_the_turn_grammar_does_not_depend_on_string_hashing():
    """The same conversation gives the same grammar in any process (grammars are cached and
    compared by their text; set order must not leak into it)."""
    code = ("import json, hashlib; from clover.tasks.airspace import generate_examples; "
            "from clover.tasks.airspace.agent import initial_conversation; "
            "from clover.tasks.airspace.contract import grounded_constraint; "
            "print(hashlib.sha256(json.dumps([grounded_constraint(initial_conversation(e)) "
            "for e in generate_examples('test', 40, 0)]).encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(digests) == 1
