"""ModelConfig validation, presets and the config.json round-trip."""

import pytest

from clover.config import PRESETS, ModelConfig, get_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_round_trips(name, tmp_path):
    """Presets are valid configs and survive config.json unchanged."""
    config = get_preset(name)
    config.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == config


@pytest.mark.parametrize("field, value, needle", [
    ("attention", "sliding", "ModelConfig.attention"),
    ("router", "hash", "ModelConfig.router"),
    ("num_kv_heads", 3, "ModelConfig.num_kv_heads"),
    ("num_experts_per_tok", 9, "ModelConfig.num_experts_per_tok"),
    ("mask_id", 1, "ModelConfig.mask_id"),
    ("mask_id", 10_000, "ModelConfig.mask_id"),
    ("dim", 0, "ModelConfig.dim"),
    ("partial_rotary", 0.0, "ModelConfig.partial_rotary"),
    ("num_dense_layers", 5, "ModelConfig.num_dense_layers"),
    ("expert_ffn_dim", 0, "ModelConfig.expert_ffn_dim"),
])
def test_bad_values_name_the_field(field, value, needle):
    """A bad value raises ValueError whose message names the offending field."""
    with pytest.raises(ValueError, match=needle):
        get_preset("tiny", **{field: value})


def test_causal_requires_block_size_one():
    with pytest.raises(ValueError, match="block_size"):
        get_preset("tiny", attention="causal", block_size=4)


def test_unknown_field_and_preset_are_reported():
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict({**get_preset("tiny").to_dict(), "n_layer": 3})
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("gpt-5")


def test_ar_twin_differs_only_in_attention():
    """The AR baseline must be the same architecture and size as the shipped dLLM."""
    dllm, ar = get_preset("clover-tiny").to_dict(), get_preset("clover-tiny-ar").to_dict()
    diff = {k for k in dllm if dllm[k] != ar[k]}
    assert diff == {"name", "attention", "block_size"}


def test_preset_override_may_rename():
    """Recipes derive named variants (e.g. the AR twin) from a preset."""
    config = get_preset("clover-tiny", name="clover-tiny-x", attention="causal", block_size=1)
    assert config.name == "clover-tiny-x" and config.attention == "causal"
