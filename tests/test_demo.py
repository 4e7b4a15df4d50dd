"""`clover demo airspace`, the main job: both shipped models on the same messages, one report."""

import json

import pytest

from clover.demo import DemoConfig, render_table, run_demo


def test_demo_runs_both_models_under_the_grammar(tmp_path):
    """Two test messages through the real agent loop with the shipped models: the report holds
    one row per model with measured figures, the ratio is computed from them, the map page is
    written, and under the grammar every call either model makes is valid."""
    cfg = DemoConfig(n=2, out=str(tmp_path), device="cpu", max_turns=1, grammar=True)
    report = run_demo(cfg)
    dllm, ar = report["rows"]
    assert (dllm["model"], ar["model"]) == ("diffusion", "autoregressive")
    assert report["settings"]["grammar"] is True
    for row in (dllm, ar):
        assert row["tool_call_validity"] == 1.0, row
        assert row["generated_tokens"] > 0 and row["forwards"] > 0
        assert row["full_task_s"] > 0
    assert ar["request_forwards"] >= ar["generated_tokens"] / 2  # AR: ~1 token per forward,
    # plus what the grammar forces
    assert report["speed_ratio_full_task"] == round(ar["full_task_s"] / dllm["full_task_s"], 2)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["rows"][0]["generated_tokens"] == dllm["generated_tokens"]
    assert (tmp_path / "map.html").is_file()
    table = " ".join(render_table(report).split())  # the title wraps
    assert "grammar on" in table and "tool-call validity" in table


def test_demo_names_a_missing_model_directory(tmp_path):
    with pytest.raises(ValueError, match="--baseline .*not a model directory"):
        run_demo(DemoConfig(n=1, out=str(tmp_path), baseline=str(tmp_path / "nowhere")))
