"""The strict scorer: perfect on gold, each error costs what it should, garbage never crashes."""

import argparse
import copy
import json
import random

import pytest

from clover.tasks.airspace import assistant_text, generate_examples, score
from clover.tasks.airspace.cli import register
from clover.tasks.airspace.data import Example
from clover.tasks.airspace.normalise import parse_centre
from clover.tasks.airspace.tools import format_call, normalise_call


@pytest.fixture(scope="module")
def examples():
    return generate_examples("test", 120, seed=5)


@pytest.fixture(scope="module")
def single():
    """Ten one-circle examples (a plain SFC lower limit, no schedule) plus two negatives."""
    pool = generate_examples("validation", 400, seed=1)
    ones = [e for e in pool if len(e.calls) == 1 and e.zones and "lower" not in
            e.calls[0]["arguments"] and "upper" in e.calls[0]["arguments"]
            and "centre" in e.calls[0]["arguments"]
            and not {"schedule", "replaces"} & set(e.calls[0]["arguments"])][:10]  # fmt: skip
    return ones + [e for e in pool if e.is_negative][:2]


def _texts(examples, edit=None):
    out = []
    for k, ex in enumerate(examples):
        calls = copy.deepcopy(ex.calls)
        if edit is not None and k == 0:
            calls = edit(calls)
        out.append("\n".join(format_call(c) for c in calls))
    return out


def test_gold_scores_perfectly_in_every_input_form(examples):
    """Raw text, parsed calls, OpenAI tool_calls and normalised zones all score 1.0 on gold."""
    forms = [
        [assistant_text(e.calls) for e in examples],
        [e.calls for e in examples],
        [{"tool_calls": e.messages()[-1].get("tool_calls", [])} for e in examples],
        [{"zones": e.to_record()["zones"], "cancels": e.cancels} for e in examples],
    ]
    for preds in forms:
        r = score(preds, examples)
        assert (r["zone_f1"], r["exact_message_accuracy"], r["tool_call_validity"]) == (1, 1, 1)
        assert r["hallucinated_zones_on_negatives"] == 0 and not any(r["errors"].values())
        assert r["field_accuracy"] == 1.0
    records = [e.to_record() for e in examples]
    assert score([e.calls for e in examples], records)["zone_f1"] == 1.0


def _edit_args(fn):
    def edit(calls):
        fn(calls[0]["arguments"])
        return calls

    return edit


def _shift_centre(metres):
    """Move the centre `metres` north, rewritten as decimal degrees."""

    def fn(args):
        lat, lon = parse_centre(args["centre"])
        args["centre"] = f"{lat + metres / 111_195.0:.7f}, {lon:.7f}"

    return fn


@pytest.mark.parametrize(
    "name, fn, error",
    [
        ("centre 200 m", _shift_centre(200), "centre"),
        ("radius unit", lambda a: a["radius"].update(unit="KM" if a["radius"]["unit"] != "KM"
                                                     else "NM"), "radius"),
        ("AGL vs AMSL", lambda a: a["upper"].update(
            ref="AMSL" if a["upper"].get("ref") == "AGL" else "AGL"), "upper"),
        ("start time", lambda a: a.update(start="2019-01-01T00:00Z"), "start"),
        ("end dropped", lambda a: a.update(end="2019-01-02T00:00Z"), "end"),
    ],
)  # fmt: skip
def test_each_zone_error_costs_one_zone(single, name, fn, error):
    """One wrong attribute makes that zone wrong: precision and recall each lose exactly 1/n."""
    r = score(_texts(single, _edit_args(fn)), single)
    n = r["num_truth_zones"]
    assert r["zone_precision"] == pytest.approx((n - 1) / n), name
    assert r["zone_recall"] == pytest.approx((n - 1) / n), name
    assert r["errors"][error] == 1 and sum(r["errors"].values()) == 1, r["errors"]
    assert r["exact_message_accuracy"] == pytest.approx((len(single) - 1) / len(single))
    fields = 6 * n  # these zones have no `replaces`
    assert r["field_accuracy"] == pytest.approx((fields - 1) / fields), name


def test_small_centre_shift_is_tolerated(single):
    """A centre 50 m off (rounding in a foreign system) is still within the 100 m tolerance."""
    r = score(_texts(single, _edit_args(_shift_centre(50))), single)
    assert r["zone_f1"] == 1.0 and r["mean_centre_error_m"] > 0


def test_missing_zone_costs_recall_only(single):
    """Dropping a zone lowers recall by 1/n and leaves precision at 1."""
    r = score(_texts(single, lambda calls: []), single)
    n = r["num_truth_zones"]
    assert r["zone_precision"] == 1.0 and r["zone_recall"] == pytest.approx((n - 1) / n)
    assert r["errors"]["missing_zone"] == 1
    assert r["field_accuracy"] == pytest.approx((n - 1) / n)  # all six fields of one zone lost


def test_extra_zone_on_negative_is_hallucination(single):
    """A zone invented for a negative message counts as hallucinated and costs precision."""
    preds = _texts(single)
    preds[-1] = format_call(single[0].calls[0])
    r = score(preds, single)
    n = r["num_truth_zones"]
    assert r["hallucinated_zones_on_negatives"] == 1 and r["errors"]["extra_zone"] == 1
    assert r["zone_precision"] == pytest.approx(n / (n + 1)) and r["zone_recall"] == 1.0


def test_limits_compare_after_unit_conversion():
    """Truth in metres (200 M AGL) matches a prediction in feet (656 FT AGL)."""
    truth = [{"id": "x", "text": "...", "zones": [{
        "lat": 31.1433, "lon": 121.8050, "radius_m": 5000,
        "lower": {"value": 0, "unit": "FT", "ref": "SFC"},
        "upper": {"value": 200, "unit": "M", "ref": "AGL"},
        "start_utc": "2025-03-15T00:00Z", "end_utc": None}]}]  # fmt: skip
    call = {"name": "set_no_fly_zone", "arguments": {
        "zone_id": "Z1", "centre": "31.1433, 121.805", "radius": {"value": 5, "unit": "KM"},
        "upper": {"value": 656, "unit": "FT", "ref": "AGL"},
        "start": "2025-03-15T08:00+08:00", "end": None}}  # fmt: skip
    assert score([format_call(call)], truth)["zone_f1"] == 1.0


def test_cancellations_are_scored(examples):
    """A NOTAMC answered with no clear_zone is a missing cancel and not an exact message."""
    notamc = Example(id="c", text="A2/25 NOTAMC A1/25", cancels=["A1/25"])
    r = score(["No no-fly zone."], [notamc])
    assert r["errors"]["missing_cancel"] == 1 and r["exact_message_accuracy"] == 0.0
    r = score([[{"name": "clear_zone", "arguments": {"zone_id": "A1/25"}}]], [notamc])
    assert r["exact_message_accuracy"] == 1.0


def test_garbage_never_crashes(examples):
    """Anything a broken model or user might send is counted invalid, never raised."""
    gold = assistant_text(examples[0].calls)
    rng = random.Random(0)
    garbage = [
        None, 42, "", "<tool_call>", "<tool_call>{}</tool_call>", "<tool_call>[1]</tool_call>",
        '<tool_call>{"name": "set_no_fly_zone", "arguments": {"centre": 5}}</tool_call>',
        '<tool_call>{"name": "x", "arguments": "{bad"}</tool_call>', {"zones": "x"},
        {"zones": [{"lat": "a"}]}, [[1]], {"tool_calls": [{"function": 3}]},
        "<tool_call>" + "[" * 5000 + "</tool_call>", gold[: len(gold) // 2],
        '<tool_call>{"name": "set_no_fly_zone", "arguments": {"centre": "1N 2E", "radius": '
        '{"value": 1e400, "unit": "NM"}, "start": "2025-13-01T00:00Z"}}</tool_call>',
    ]  # fmt: skip
    for _ in range(200):  # random deletions and insertions in a gold answer
        chars = list(gold)
        for _ in range(rng.randint(1, 8)):
            k = rng.randrange(len(chars))
            chars[k] = rng.choice(['"', "{", "}", ",", "", "9", "N", ":", "]"])
        garbage.append("".join(chars))
    r = score(garbage, [examples[0]] * len(garbage))
    assert 0.0 <= r["tool_call_validity"] < 1.0 and r["num_invalid_calls"] > 10


def test_cli_data_then_score(tmp_path, capsys):
    """`clover data airspace` output answered with the gold calls scores 1.0 via `clover score`."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "test.jsonl"
    args = parser.parse_args(["data", "airspace", "--split", "test", "--n", "8", "--out", str(out)])
    assert args.func(args) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and all({"id", "text", "zones"} <= set(r) for r in records)
    examples = {e.id: e for e in generate_examples("test", 8, 0)}
    pred = tmp_path / "pred.jsonl"
    lines = [json.dumps({"id": r["id"], "output": assistant_text(examples[r["id"]].calls)})
             for r in reversed(records)]  # fmt: skip
    pred.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    args = parser.parse_args(["score", "airspace", str(pred), "--truth", str(out)])
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["zone_f1"] == 1.0 and result["num_messages"] == 8
    args = parser.parse_args(["data", "airspace", "--n", "2", "--format", "chat"])
    args.func(args)
    chat = json.loads(capsys.readouterr().out.splitlines()[0])
    assert chat["messages"][0]["role"] == "system" and chat["tools"]


POLYGON = {"zone_id": "Z1", "polygon": ["5130N00010W", "5131N00008W", "5129N00007W", "5128N00010W"],
           "start": "2502140400", "end": "2502141030", "schedule": "MON-FRI 0800-1600"}


def _polygon_truth():
    return [{"zones": [normalise_call(POLYGON).to_dict()]}]


@pytest.mark.parametrize("edit, ok", [
    (lambda a: a, True),
    (lambda a: a.update(polygon=a["polygon"][2:] + a["polygon"][:2]), True),  # other start
    (lambda a: a.update(polygon=a["polygon"][::-1]), True),  # other direction
    (lambda a: a.update(polygon=a["polygon"] + a["polygon"][:1]), True),  # closing repeat
    (lambda a: a.update(polygon=a["polygon"][:3]), False),  # a vertex dropped
    (lambda a: a.update(polygon=["5130N00011W"] + a["polygon"][1:]), False),  # one ~1 km off
    (lambda a: a.update(polygon=[a["polygon"][k] for k in (0, 2, 1, 3)]), False),  # crossed
])  # fmt: skip
def test_polygon_outline_is_one_field(edit, ok):
    """A polygon is right when its vertices are, whatever vertex it starts from or which way it
    runs; then the outline counts as one field (no radius), the schedule as another."""
    args = copy.deepcopy(POLYGON)
    edit(args)
    r = score([[{"name": "set_no_fly_zone", "arguments": args}]], _polygon_truth())
    assert (r["zone_f1"] == 1.0) is ok, args
    assert r["field_accuracy"] == pytest.approx(1.0 if ok else 5 / 6)


def test_schedule_is_scored_when_the_truth_has_one():
    """Case and spacing aside, a wrong or missing schedule costs the schedule field only."""
    for schedule, ok in (("mon-fri  0800-1600", True), ("DAILY 0800-1600", False), (None, False)):
        args = {**POLYGON, "schedule": schedule}
        r = score([[{"name": "set_no_fly_zone", "arguments": args}]], _polygon_truth())
        assert (r["errors"]["schedule"] == 0) is ok and (r["zone_f1"] == 1.0) is ok
    circle = {"zone_id": "Z1", "centre": "5130N00010W", "radius": {"value": 2, "unit": "NM"}}
    truth = [{"zones": [normalise_call(circle).to_dict()]}]
    r = score([[{"name": "set_no_fly_zone", "arguments": {**circle, "schedule": "H24"}}]], truth)
    assert r["zone_f1"] == 1.0
