"""`clover inspect`: parameter and memory figures from the meta device, and the CLI output."""

import json

import pytest

from clover.cli import main
from clover.config import get_preset
from clover.inspect import count_params, describe
from clover.model import build_model


def test_counts_match_a_real_model():
    """Meta-device counting equals counting a materialised model's parameters."""
    config = get_preset("tiny")
    total, active = count_params(config)
    assert total == sum(p.numel() for p in build_model(config).parameters())
    moe_layer = build_model(config).layers[1].ffn
    per_expert = sum(p.numel() for p in moe_layer.experts.parameters()) // config.num_experts
    unused = (config.num_experts - config.num_experts_per_tok) * per_expert
    assert total - active == unused * (config.num_layers - config.num_dense_layers)


def test_35b_a3b_is_35b_total_3b_active():
    info = describe(get_preset("clover-35b-a3b"))
    assert abs(info["total_params"] / 35e9 - 1) < 0.05
    assert abs(info["active_params"] / 3e9 - 1) < 0.05
    assert abs(info["weights_bytes_bf16"] / 70e9 - 1) < 0.05


def test_dense_model_is_all_active():
    info = describe(get_preset("llada-8b"))
    assert info["total_params"] == info["active_params"]
    assert 7.5e9 < info["total_params"] < 8.5e9


def test_cli_json(capsys):
    assert main(["inspect", "clover-35b-a3b", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    keys = ("total_params", "active_params", "weights_bytes_bf16", "kv_cache_bytes_per_token_bf16")
    for key in keys:
        assert key in info


def test_cli_table_and_bad_name(capsys):
    assert main(["inspect", "tiny"]) == 0
    assert "active params" in capsys.readouterr().out
    assert main(["inspect", "no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--jsn"])
def test_cli_bad_flag_names_it(flag, capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "tiny", flag])
    assert flag in capsys.readouterr().err
