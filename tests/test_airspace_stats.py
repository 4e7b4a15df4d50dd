"""Bootstrap intervals and paired comparisons of task scores: they agree with the scorer, cover
what they should, and tell a real difference from none."""

import argparse
import json

import pytest
import torch

from clover.tasks.airspace import assistant_text, generate_examples, score
from clover.tasks.airspace.cli import register
from clover.tasks.airspace.stats import METRICS, compare, interval, message_counts


@pytest.fixture(scope="module")
def examples():
    return generate_examples("test", 60, seed=3)


def _answers(examples, wrong_every: int = 0):
    """Gold answers; every `wrong_every`-th zone-setting message answered with nothing."""
    out = []
    for k, ex in enumerate(examples):
        broken = wrong_every and k % wrong_every == 0 and ex.zones
        out.append("No no-fly zone." if broken else assistant_text(ex.calls))
    return out


def test_counts_reproduce_the_scorers_metrics(examples):
    """Each metric computed from the per-message counts equals `score`'s figure on the same run
    (so the intervals are about the numbers the scorer reports, not a look-alike)."""
    preds = _answers(examples, wrong_every=3)
    preds[1] = preds[1][: len(preds[1]) // 2]  # a broken call: validity below 1
    result, counts = score(preds, examples), message_counts(preds, examples)
    for name, fn in METRICS.items():
        assert fn(counts.sum(0), len(examples)).item() == pytest.approx(result[name], abs=1e-12)
    assert result["tool_call_validity"] < 1.0 and 0.0 < result["zone_f1"] < 1.0


def test_interval_brackets_the_value_and_narrows_with_more_messages(examples):
    """The full-data value lies in its interval; four times the messages roughly halve it."""
    counts = message_counts(_answers(examples, wrong_every=3), examples)
    small = interval(counts[:15], "zone_f1", resamples=1000)
    large = interval(counts.repeat(4, 1)[:240], "zone_f1", resamples=1000)
    assert small.low <= small.value <= small.high and small.high > small.low
    assert (large.high - large.low) < 0.7 * (small.high - small.low)
    chunked = interval(counts, "zone_f1", resamples=2500)  # more draws than one chunk holds
    assert chunked == interval(counts, "zone_f1", resamples=2500)  # seeded: the same each time
    assert chunked.low <= chunked.value <= chunked.high


def test_perfect_run_has_a_degenerate_interval(examples):
    """No error anywhere: every resample scores 1.0, so the interval is [1, 1]."""
    counts = message_counts(_answers(examples), examples)
    for name in METRICS:
        assert interval(counts, name, resamples=200).as_list() == [1.0, 1.0]


def test_paired_comparison_separates_a_real_gap_from_none(examples):
    """Gold against a run missing a third of the zones: A is ahead in every resample and the
    interval excludes 0; a run against itself differs by exactly 0."""
    gold = message_counts(_answers(examples), examples)
    worse = message_counts(_answers(examples, wrong_every=3), examples)
    c = compare(gold, worse, "zone_f1", resamples=500)
    assert c.difference.value > 0 and c.difference.low > 0 and c.share_a_better == 1.0
    same = compare(worse, worse, "zone_f1", resamples=500)
    assert same.difference.as_list() == [0.0, 0.0] and same.share_a_better == 0.0


def test_paired_interval_is_narrower_than_unpaired(examples):
    """B breaks A's messages and a few more: pairing cancels the messages both get wrong or right,
    so the paired interval of the difference is far narrower than one from independent draws."""
    a = message_counts(_answers(examples, wrong_every=3), examples)
    b = a.clone()
    more = examples[1::10]  # B answers these with nothing too
    b[1::10] = message_counts(["No no-fly zone."] * len(more), more)
    paired = compare(a, b, "zone_f1", resamples=1000).difference
    gen = torch.Generator().manual_seed(1)
    draws = [torch.randint(len(examples), (1000, len(examples)), generator=gen) for _ in "ab"]
    diff = (METRICS["zone_f1"](a[draws[0]].sum(1), len(examples))
            - METRICS["zone_f1"](b[draws[1]].sum(1), len(examples)))
    unpaired = torch.quantile(diff, torch.tensor([0.025, 0.975], dtype=diff.dtype)).tolist()
    assert paired.low > 0 and unpaired[0] < 0  # only pairing sees that A is ahead
    assert paired.high - paired.low < 0.6 * (unpaired[1] - unpaired[0])


def test_bad_inputs_are_named(examples):
    counts = message_counts(_answers(examples), examples)
    with pytest.raises(ValueError, match="different messages"):
        compare(counts, counts[:10])
    with pytest.raises(ValueError, match="resamples"):
        interval(counts, resamples=0)
    with pytest.raises(ValueError, match="predictions for"):
        message_counts(["x"], examples[:2])
    assert torch.equal(message_counts([], []), torch.zeros(0, 6, dtype=torch.float64))


def test_cli_score_prints_intervals_and_the_paired_comparison(tmp_path, capsys, examples):
    """`clover score airspace A --against B`: intervals beside each metric and a comparison whose
    figures are the ones `compare` gives; a bad --resamples names the flag."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    truth = tmp_path / "truth.jsonl"
    args = parser.parse_args(["data", "airspace", "--split", "test", "--n", "60", "--seed", "3",
                              "--out", str(truth)])  # fmt: skip
    args.func(args)
    paths = {}
    for name, every in (("a", 0), ("b", 3)):
        paths[name] = tmp_path / f"{name}.jsonl"
        rows = zip(examples, _answers(examples, every), strict=True)
        paths[name].write_text("".join(json.dumps({"id": e.id, "output": t}) + "\n"
                                       for e, t in rows))
    capsys.readouterr()
    args = parser.parse_args(["score", "airspace", str(paths["a"]), "--truth", str(truth),
                              "--against", str(paths["b"]), "--resamples", "300"])  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert "95% interval" in out and result["zone_f1_ci95"] == [1.0, 1.0]
    first = result["comparison"]["comparisons"][0]
    expected = compare(message_counts(_answers(examples), examples),
                       message_counts(_answers(examples, 3), examples), "zone_f1", 300)
    assert first == expected.as_dict() and first["difference_ci"][0] > 0
    with pytest.raises(SystemExit):
        parser.parse_args(["score", "airspace", str(paths["a"]), "--resamples", "many"])
    assert "--resamples" in capsys.readouterr().err
