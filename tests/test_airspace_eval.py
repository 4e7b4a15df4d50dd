"""`clover eval airspace`: decode a split with a model directory, score it, break it down."""

import json

import pytest

from clover.checkpoint import save
from clover.cli import main
from clover.config import get_preset
from clover.model import build_model
from clover.tasks.airspace import (
    assistant_text,
    generate_examples,
    reference_calls,
    split_examples,
)
from clover.tasks.airspace.tools import interpret_call
from clover.tasks.airspace.tools import parse_tool_calls as parse_calls
from clover.tokenizer import parse_tool_calls, train_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    examples = generate_examples("train", 300, 1)
    texts = [e.text for e in examples] + [assistant_text(reference_calls(e)) for e in examples]
    path = tmp_path_factory.mktemp("eval") / "tiny-airspace"
    save(build_model(get_preset("tiny", max_seq_len=4096), seed=0),
         train_tokenizer(texts, vocab_size=512), path)
    return str(path)


def test_eval_prints_metrics_per_format_and_writes_predictions(capsys, model_dir, tmp_path):
    out = tmp_path / "preds.jsonl"
    rc = main(["eval", "airspace", "--model", model_dir, "--n", "3", "--max-tokens", "8",
               "--max-turns", "1", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["num_messages"] == 3 and 0.0 <= result["zone_f1"] <= 1.0
    assert sum(p["n"] for p in result["by_format"].values()) == 3
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [e.id for e in generate_examples("test", 3, 0)]
    low, high = result["zone_f1_ci95"]  # the message bootstrap, from the same predictions
    assert low - 1e-4 <= result["zone_f1"] <= high + 1e-4
    capsys.readouterr()
    assert main(["score", "airspace", str(out), "--n", "3", "--resamples", "500"]) == 0
    rescored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rescored["zone_f1"] == pytest.approx(result["zone_f1"])


def _constrained_eval(capsys, model_dir, tmp_path, flag: str):
    """4 test messages decoded by random weights under `flag`, tau 0.5: (result, predictions)."""
    out = tmp_path / "preds.jsonl"
    rc = main(["eval", "airspace", "--model", model_dir, "--n", "4", "--max-tokens", "192",
               "--max-turns", "1", "--device", "cpu", flag, "--tau", "0.5", "--out", str(out)])
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1]), out


def test_eval_with_grammar_makes_only_calls_that_parse(capsys, model_dir, tmp_path):
    """Random weights, constrained: every closed `<tool_call>` block the model wrote parses."""
    result, out = _constrained_eval(capsys, model_dir, tmp_path, "--grammar")
    assert result["grammar"] is True and result["grammar_s"] > 0
    for line in out.read_text().splitlines():
        text = json.loads(line)["output"]
        if text.count("<tool_call>") == text.count("</tool_call>"):  # not cut at max_tokens
            assert parse_tool_calls(text).errors == []
            for call in parse_calls(text).calls:  # and the scorer accepts every argument
                interpret_call(call["name"], call["arguments"])


def test_eval_scores_the_real_dev_split(capsys, model_dir):
    """`--split real-dev` decodes the hand-labelled real messages, in file order, and reports
    them beside the generated splits' figures (by kind of source)."""
    rc = main(["eval", "airspace", "--model", model_dir, "--split", "real-dev", "--n", "3",
               "--max-tokens", "8", "--max-turns", "1", "--device", "cpu"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["split"] == "real-dev" and result["num_messages"] == 3
    kinds = [e.kind.split("+")[0] for e in split_examples("real-dev", 3)]
    assert sorted(result["by_format"]) == sorted(set(kinds))


def test_eval_names_a_missing_model_directory(capsys, tmp_path):
    rc = main(["eval", "airspace", "--model", str(tmp_path / "nope"), "--n", "1"])
    assert rc == 2
    assert "nope" in capsys.readouterr().err
