"""LLaDA2.x (BailingMoeV2) import against the published math, written out plainly.

No transformers class exists for BailingMoeV2, so a synthetic checkpoint in the exact published
layout (config.json field names, fused `query_key_value`, per-expert keys, sharded safetensors +
index) is converted and compared with `llada2_layout.reference_logits`, a step-by-step forward over
the original tensors; the new routing math (group-limited top-k) is checked token by token against
a plain loop; import + export must give back the same bytes.
"""

import pytest
import torch
from llada2_layout import random_llada2_tensors, reference_logits, route_one, tiny_llada2_config

from clover.checkpoint import load_model
from clover.checkpoint.convert import convert, export_hf, read_hf_dir
from clover.checkpoint.hf_files import write_hf_dir
from clover.checkpoint.keymap import CheckpointError
from clover.checkpoint.llada2 import config_from_hf
from clover.config import get_preset
from clover.model.moe import Router


def router_for(config: dict) -> Router:
    torch.manual_seed(0)
    router = Router(config_from_hf(config))
    with torch.no_grad():
        router.gate.weight.normal_(std=0.5)
        router.expert_bias.normal_(std=0.3)
    return router


def test_group_limited_routing_matches_a_plain_loop():
    """Each token's experts and weights equal the published rule computed one token at a time:
    group score = sum of the two best biased scores, keep topk_group groups, top-k inside them,
    weights = unbiased sigmoid scores renormalised, times routed_scaling_factor."""
    config = tiny_llada2_config()
    router = router_for(config)
    x_ND = torch.randn(64, config["hidden_size"])
    with torch.no_grad():
        out = router(x_ND)
        scores_NE = torch.sigmoid(router.gate(x_ND))
    for n in range(x_ND.shape[0]):
        chosen, weights = route_one(scores_NE[n], router.expert_bias, config)
        order = torch.argsort(out.experts_NK[n])
        assert sorted(chosen) == out.experts_NK[n][order].tolist()
        want = dict(zip(chosen, weights.tolist(), strict=True))
        got = dict(zip(out.experts_NK[n].tolist(), out.weights_NK[n].tolist(), strict=True))
        assert got == pytest.approx(want, abs=1e-6)


def test_group_limit_changes_the_choice():
    """Without the limit some tokens would pick experts outside their best groups (so the test
    above would fail if the limit were ignored)."""
    limited = router_for(tiny_llada2_config())
    free = router_for(tiny_llada2_config(n_group=1, topk_group=1))
    x_ND = torch.randn(64, 64)
    with torch.no_grad():
        a, b = limited(x_ND).experts_NK.sort(-1).values, free(x_ND).experts_NK.sort(-1).values
    assert not torch.equal(a, b)
    groups_touched = (a // 2)[:, :, None] == torch.arange(4)
    assert (groups_touched.any(1).sum(-1) <= 2).all()  # never more than topk_group groups


def test_group_config_is_validated():
    with pytest.raises(ValueError, match="num_expert_groups"):
        get_preset("tiny", router="sigmoid", num_expert_groups=3)
    with pytest.raises(ValueError, match="router='sigmoid'"):
        get_preset("tiny", num_expert_groups=2)
    with pytest.raises(ValueError, match="topk_groups"):
        get_preset("tiny", router="sigmoid", num_expert_groups=4, topk_groups=5)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_llada2_logits_match_the_published_math(tmp_path, qkv_bias):
    """Converted synthetic LLaDA2 checkpoint == BailingMoeV2 forward over the original tensors
    (fused QKV split in the right order, partial RoPE, QK-norm, dense first layer, grouped
    sigmoid routing with bias and scaling, shared expert, block-causal attention)."""
    config = tiny_llada2_config(use_qkv_bias=qkv_bias)
    tensors = random_llada2_tensors(config)
    src = write_hf_dir(tmp_path / "llada2", config, tensors, shards=3)
    model = load_model(convert(src, tmp_path / "clover"))
    cfg = model.config
    assert (cfg.attention, cfg.block_size, cfg.mask_id, cfg.partial_rotary) == ("block", 4, 302, .5)
    assert (cfg.num_expert_groups, cfg.topk_groups, cfg.num_dense_layers) == (4, 2, 1)
    ids_BL = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        got = model(ids_BL).logits
        for b in range(2):
            torch.testing.assert_close(got[b], reference_logits(ids_BL[b], tensors, config),
                                       atol=2e-4, rtol=0)


def test_llada2_round_trip_is_bit_exact(tmp_path):
    config = tiny_llada2_config(use_qkv_bias=True)
    tensors = random_llada2_tensors(config)
    src = write_hf_dir(tmp_path / "llada2", config, tensors, shards=2)
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back", family="llada2_moe")
    exported_config, exported = read_hf_dir(back)
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)
    assert config_from_hf(exported_config) == config_from_hf(config).replace(name="llada2")


def test_llada2_missing_expert_is_named(tmp_path):
    config = tiny_llada2_config()
    tensors = random_llada2_tensors(config)
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    src = write_hf_dir(tmp_path / "llada2", config, tensors)
    with pytest.raises(CheckpointError, match=r"layers\.2\.ffn\.experts\.up_proj\[5\]"):
        convert(src, tmp_path / "out")


def test_llada2_refuses_softmax_scores(tmp_path):
    config = tiny_llada2_config(score_function="softmax")
    src = write_hf_dir(tmp_path / "llada2", config, random_llada2_tensors(config))
    with pytest.raises(CheckpointError, match="score_function"):
        convert(src, tmp_path / "out")


def test_export_picks_the_dllm_family_from_the_config(tmp_path):
    """`clover convert --to hf` without --family writes a diffusion model as its own family,
    not as the AR family with the same tensors."""
    config = tiny_llada2_config()
    src = write_hf_dir(tmp_path / "llada2", config, random_llada2_tensors(config))
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back")
    assert read_hf_dir(back)[0]["model_type"] == "llada2_moe"
