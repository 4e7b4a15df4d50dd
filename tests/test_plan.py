"""`clover inspect --plan`: the memory plan's arithmetic against the model's own parameters."""

import json

import pytest

from clover.cli import main
from clover.config import get_preset
from clover.model import build_model
from clover.plan import GIB, PlanConfig, activation_bytes_per_token, counts, make_plan


def test_counts_split_the_real_model():
    """Routed-expert, embedding and largest-FSDP-unit (the MoE) counts equal a materialised
    model's."""
    config = get_preset("tiny")
    model = build_model(config)
    n = counts(config)
    assert n.total == sum(p.numel() for p in model.parameters())
    assert n.routed == sum(p.numel() for p in model.layers[1].ffn.experts.parameters())
    assert n.embed == model.embed.weight.numel() + model.lm_head.weight.numel()
    assert n.largest_unit == sum(p.numel() for p in model.layers[1].ffn.parameters())


def test_fsdp_shards_states_and_expert_parallel_splits_experts():
    """16 bytes per parameter split over the GPUs; expert parallel divides only routed experts."""
    config = get_preset("clover-35b-a3b")
    n = counts(config)
    p8 = make_plan(config, PlanConfig(gpus=8))
    p16 = make_plan(config, PlanConfig(gpus=16))
    assert p8["training_fsdp"]["sharded_states"] * 8 == pytest.approx(16 * n.total)
    assert p16["training_fsdp"]["sharded_states"] == pytest.approx(
        p8["training_fsdp"]["sharded_states"] / 2)
    expert = p8["serving"]["expert"]["weights"]
    assert expert == pytest.approx(2 * (n.total - n.routed + n.routed / 8))
    assert p8["serving"]["replicas"]["weights"] == 2 * n.total
    assert p8["serving"]["tensor"]["kv_bytes_per_token"] * 4 == \
        p8["serving"]["replicas"]["kv_bytes_per_token"]  # 4 KV heads over 8 GPUs: one each


def test_min_gpus_is_the_boundary():
    """The reported fewest GPUs fit, one fewer does not (with and without checkpointing)."""
    config = get_preset("clover-35b-a3b")
    plan = make_plan(config, PlanConfig(gpus=8, gpu_mem_gib=80))
    for key, fits in (("min_gpus_fsdp", "fits"), ("min_gpus_fsdp_checkpointed",
                                                  "fits_checkpointed")):
        g = plan[key]
        assert make_plan(config, PlanConfig(gpus=g))["training_fsdp"][fits]
        assert not make_plan(config, PlanConfig(gpus=g - 1))["training_fsdp"][fits]
    assert plan["min_gpus_fsdp_checkpointed"] < plan["min_gpus_fsdp"]


def test_activation_bytes_by_hand():
    """tiny: MoE layer = norms + q, o (4 heads x 16) + k, v (2 x 16) + top-2 + 1 shared experts
    of width 32 (gate, up, product) + 4 fp32 router scores, in bf16."""
    config = get_preset("tiny")
    attn = 2 * 64 + 2 * 64 + 2 * 2 * 16
    ffn = 64 + 3 * 3 * 32 + 4 * 2
    assert activation_bytes_per_token(config) == 2 * (attn + ffn)


def test_cli_plan(capsys):
    assert main(["inspect", "clover-35b-a3b", "--plan", "--gpus", "8", "--gpu-mem", "80",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["usable_bytes"] == pytest.approx(0.9 * 80 * GIB)
    assert set(plan["serving"]) == {"replicas", "tensor", "expert"}
    assert main(["inspect", "clover-35b-a3b", "--plan"]) == 0
    assert "FSDP2" in capsys.readouterr().out
    assert main(["inspect", "tiny", "--plan", "--gpus", "0"]) == 2
    assert "--gpus" in capsys.readouterr().err
