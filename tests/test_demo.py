"""`clover demo airspace`, the main job: two models on the same messages, two regimes, one report.

The demo's machinery is tested on tiny random models built in-process (the shipped models'
quality is tests/test_shipped_models.py's job): one row per model and regime with measured
figures, ratios computed from those rows, the report and the map page written."""

import json

import pytest

from clover.bench.quant import cli_dtype
from clover.checkpoint import save
from clover.config import get_preset
from clover.demo import DemoConfig, render_table, run_demo
from clover.engine.stats import peak_memory
from clover.model import build_model
from clover.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from clover.tasks.airspace import generate_examples

    texts = [e.text for e in generate_examples("train", 60, seed=3)]
    tok = train_tokenizer(texts, vocab_size=512)
    root = tmp_path_factory.mktemp("models")
    dllm = build_model(get_preset("tiny", max_seq_len=4096), seed=0)
    ar = build_model(get_preset("tiny", attention="causal", block_size=1, max_seq_len=4096),
                     seed=0)
    return str(save(dllm, tok, root / "dllm")), str(save(ar, tok, root / "ar"))


def test_demo_runs_both_models_in_both_regimes(tmp_path, tiny_pair):
    cfg = DemoConfig(model=tiny_pair[0], baseline=tiny_pair[1], n=2, out=str(tmp_path),
                     device="cpu", max_turns=1, max_tokens=16)
    told = []
    report = run_demo(cfg, progress=lambda phase, done, total: told.append((phase, done, total)))
    rows = report["rows"]
    # progress: each phase starts at 0; one-by-one reports every message, batch all at once
    assert told == [("diffusion, batch", 0, 2), ("diffusion, batch", 2, 2),
                    ("diffusion, one-by-one", 0, 2), ("diffusion, one-by-one", 1, 2),
                    ("diffusion, one-by-one", 2, 2), ("autoregressive, batch", 0, 2),
                    ("autoregressive, batch", 2, 2), ("autoregressive, one-by-one", 0, 2),
                    ("autoregressive, one-by-one", 1, 2), ("autoregressive, one-by-one", 2, 2)]
    assert [(r["model"], r["regime"]) for r in rows] == [
        ("diffusion", "batch"), ("diffusion", "one-by-one"),
        ("autoregressive", "batch"), ("autoregressive", "one-by-one")]
    for row in rows:
        assert row["generated_tokens"] > 0 and row["forwards"] > 0 and row["full_task_s"] > 0
    by = {(r["model"], r["regime"]): r for r in rows}
    for regime in ("batch", "one-by-one"):
        want = round(by["autoregressive", regime]["full_task_s"]
                     / by["diffusion", regime]["full_task_s"], 2)
        assert report["speed_ratio_full_task"][regime] == want
    # one by one, each message is its own batch: as many batched forwards as request forwards
    single = by["autoregressive", "one-by-one"]
    assert single["forwards"] == single["request_forwards"]
    # the engine's figures over the message-by-message runs are ratios of their totals, not sums
    # of each run's ratios: one row per step, the TPF of all the tokens, one process's memory
    engine = single["engine"]
    assert engine["mean_batch_rows"] == 1.0 and engine["forwards"] == single["forwards"]
    assert engine["tpf"] == pytest.approx(engine["generated_tokens"] / engine["forwards"], abs=1e-4)
    assert engine["peak_memory_bytes"] <= peak_memory()  # a high-water mark, never a sum
    assert by["autoregressive", "batch"]["forwards"] < by["autoregressive", "batch"][
        "request_forwards"]
    # the report names the precision the models ran in, not "auto"
    assert report["settings"]["dtype"] == cli_dtype("auto", "cpu")
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["rows"][0]["generated_tokens"] == rows[0]["generated_tokens"]
    assert (tmp_path / "map.html").is_file()
    table = " ".join(render_table(report).split())
    assert "one-by-one" in table and "tool-call validity" in table
    # zone F1's interval brackets it; the paired difference is the two models' F1 apart
    for row in rows:
        assert row["zone_f1_ci95"][0] - 1e-4 <= row["zone_f1"] <= row["zone_f1_ci95"][1] + 1e-4
    diff = report["zone_f1_difference"]
    want = by["diffusion", "batch"]["zone_f1"] - by["autoregressive", "batch"]["zone_f1"]
    assert diff["difference"] == pytest.approx(want, abs=1e-4)
    assert "diffusion - AR" in table and "95% interval" in table


def test_demo_names_a_missing_model_directory(tmp_path, tiny_pair):
    with pytest.raises(ValueError, match="--baseline .*not a model directory"):
        run_demo(DemoConfig(n=1, out=str(tmp_path), model=tiny_pair[0],
                            baseline=str(tmp_path / "nowhere")))


def test_demo_refuses_an_unknown_regime():
    with pytest.raises(ValueError, match="--regimes"):
        DemoConfig(regimes=("sideways",))


def test_demo_with_a_drafter_runs_the_twin_checking_its_drafts(tmp_path, tiny_pair):
    """`draft`: a third decoder, the baseline checking the drafter's tokens (here the tiny
    shifted-prediction diffusion model over the AR one's weights): its answers are the AR
    run's, and its speed ratio and sameness are reported per regime."""
    from clover.checkpoint import load

    _, tok = load(tiny_pair[1])
    dense = dict(qk_norm=False, num_experts=0, num_dense_layers=0, max_seq_len=4096)
    baseline = str(save(build_model(get_preset("tiny", attention="causal", block_size=1, **dense),
                                    seed=0), tok, tmp_path / "ar"))
    drafter = str(save(build_model(get_preset("tiny", shift_logits=True, **dense), seed=0), tok,
                       tmp_path / "draft"))
    cfg = DemoConfig(model=tiny_pair[0], baseline=baseline, draft=drafter, n=2,
                     out=str(tmp_path / "demo"), device="cpu", max_turns=1, max_tokens=16,
                     map=False)
    report = run_demo(cfg)
    by = {(r["model"], r["regime"]): r for r in report["rows"]}
    assert {m for m, _ in by} == {"diffusion", "autoregressive", "AR + drafter"}
    for regime in ("batch", "one-by-one"):
        spec, ar = by["AR + drafter", regime], by["autoregressive", regime]
        assert report["drafter_same_answers"][regime] == "2/2"
        assert spec["generated_tokens"] == ar["generated_tokens"]
        assert report["speed_ratio_drafter"][regime] == round(
            ar["full_task_s"] / spec["full_task_s"], 2)
    assert report["settings"]["draft"] == drafter
    assert "AR + drafter" in render_table(report)
    with pytest.raises(ValueError, match="--draft .*not a model directory"):
        run_demo(DemoConfig(n=1, out=str(tmp_path), model=tiny_pair[0], baseline=baseline,
                            draft=str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="--draft: self-speculative decoding has no grammar"):
        DemoConfig(draft=tiny_pair[0], grammar=True)
