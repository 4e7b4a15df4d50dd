"""`clover bench forward`: the cost table's arithmetic and a small sweep on a saved tiny model."""

import json

import pytest

from clover.bench.forward import ForwardConfig, Point, plot, predicted_ratios, render, sweep
from clover.checkpoint import save
from clover.config import get_preset
from clover.model import build_model
from clover.model.fused import PACKED_MAX_TOKENS


def test_predicted_ratio_is_tpf_times_one_token_cost_over_block_cost():
    """A block of L costing 1.5x one token, committing 6 tokens per forward: 6 / 1.5 = 4x."""
    points = [Point("bf16", 1, 1, 10.0, 5.0, "memory"), Point("bf16", 1, 32, 15.0, 6.0, "memory")]
    (row,) = predicted_ratios(points, (6.0, 1.5))
    assert row["cost_vs_one_token"] == 1.5
    assert row["ratio_at_tpf"] == {"6.0": 4.0, "1.5": 1.0}


def test_bad_flags_name_themselves():
    with pytest.raises(ValueError, match="--precisions"):
        ForwardConfig(precisions=("fp8",))
    with pytest.raises(ValueError, match="--lengths"):
        ForwardConfig(lengths=(0,))


def test_sweep_times_every_point_against_a_measured_roofline(tmp_path):
    """Every (precision, batch, L) gets a time, a floor below it and a bound; the JSON is
    plain data, the table renders and the plot is written."""
    path = save(build_model(get_preset("tiny", attention="causal", block_size=1)), None,
                tmp_path / "m")
    cfg = ForwardConfig(model=str(path), precisions=("fp32", "bf16"), batch_sizes=(1, 2),
                        lengths=(1, 4), context=8, repeats=1)
    results = sweep(cfg, progress=lambda _: None)
    assert len(results["points"]) == 8
    assert all(p["ms"] > 0 and p["floor_ms"] > 0 and p["bound"] in ("memory", "compute")
               and p["bandwidth_gbs"] > 0 for p in results["points"])
    assert results["machine"]["bandwidth_gbs"] > 0 and len(results["predicted_dllm_over_ar"]) == 4
    json.dumps(results)
    assert "predicted dLLM/AR" in render(results)
    pytest.importorskip("matplotlib")
    assert plot(results, tmp_path / "f.png").stat().st_size > 0


@pytest.mark.slow
def test_compiled_rows_sit_beside_the_eager_ones(tmp_path, monkeypatch):
    """`--compile`: a dense model gets compiled points for the lengths the graph takes (L <= 16)
    beside eager ones for every length; longer blocks stay eager only; a model the graph does
    not cover is a clear error. (One graph class, L = 1, to keep the compile short.)"""
    from clover.model import compiled

    monkeypatch.setattr(compiled, "INDUCTOR_OPTIONS",  # oneDNN untimed: a shorter compile
                        {**compiled.INDUCTOR_OPTIONS, "max_autotune": False})
    dense = dict(qk_norm=False, num_experts=0, num_dense_layers=0)
    path = save(build_model(get_preset("tiny", attention="block", block_size=4, **dense)), None,
                tmp_path / "m")
    over = PACKED_MAX_TOKENS + 1  # eager only; so is the prefill of a longer context
    cfg = ForwardConfig(model=str(path), precisions=("bf16",), batch_sizes=(1,),
                        lengths=(1, over), context=over + 8, repeats=1,
                        engines=("eager", "compiled"))
    results = sweep(cfg, progress=lambda _: None)
    assert [(p["engine"], p["length"]) for p in results["points"]] == [
        ("eager", 1), ("eager", over), ("compiled", 1)]
    assert [(r["engine"], r["length"]) for r in results["predicted_dllm_over_ar"]] == [
        ("eager", over)]
    assert results["compile_s"]["bf16"] > 0 and "| compiled |" in render(results)
    moe = save(build_model(get_preset("tiny")), None, tmp_path / "moe")
    with pytest.raises(ValueError, match="--compile"):
        sweep(ForwardConfig(model=str(moe), precisions=("bf16",), batch_sizes=(1,), lengths=(1,),
                            context=8, repeats=1, engines=("compiled",)), progress=lambda _: None)
    with pytest.raises(ValueError, match="--engines"):
        ForwardConfig(engines=("fast",))
