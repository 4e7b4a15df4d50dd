"""Model directories: bit-exact round-trip, and a clear CheckpointError for every kind of damage."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from clover.checkpoint import CheckpointError, load, load_model, save
from clover.config import get_preset
from clover.model import build_model
from clover.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"WI {i}.5NM RADIUS 5121{i:02d}N 00036{i:02d}W SFC-400FT AGL" for i in range(200)]
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture
def saved(tmp_path, tokenizer):
    model = build_model(get_preset("tiny"), seed=3)
    model.layers[1].ffn.router.expert_bias.normal_()  # buffers are saved too
    return model, save(model, tokenizer, tmp_path / "m")


def test_round_trip_is_bit_exact(saved):
    model, path = saved
    loaded, tok = load(path)
    for (name, a), (name_b, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                                      strict=True):
        assert name == name_b and torch.equal(a, b), name
    assert tok.mask_token_id == model.config.mask_id
    ids = torch.randint(3, 512, (1, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_load_converts_dtype(saved):
    _, path = saved
    model = load_model(path, dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16


def test_save_in_bfloat16_halves_the_file_and_loads_back_to_float32(saved, tokenizer, tmp_path):
    model, path = saved
    small = save(model, tokenizer, tmp_path / "bf16", dtype=torch.bfloat16)
    stored = load_file(str(small / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in stored.values() if t.is_floating_point())
    size = (path / "model.safetensors").stat().st_size
    assert (small / "model.safetensors").stat().st_size < 0.55 * size
    back = load_model(small, dtype=torch.float32)
    for name, t in model.state_dict().items():
        want = t.to(torch.bfloat16).to(torch.float32)
        assert torch.equal(back.state_dict()[name], want), name


def test_save_replaces_existing_directory(saved, tokenizer):
    model, path = saved
    (path / "stale.txt").write_text("x")
    save(model, tokenizer, path, extra={"README.md": "hi"})
    assert not (path / "stale.txt").exists() and (path / "README.md").read_text() == "hi"


def test_missing_files(saved, tmp_path):
    _, path = saved
    with pytest.raises(CheckpointError, match="not a model directory"):
        load(tmp_path / "nope")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: missing"):
        load(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load(path)


def test_bad_config(saved):
    _, path = saved
    data = json.loads((path / "config.json").read_text())
    data["attention"] = "sideways"
    (path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="config.json: invalid config.*attention"):
        load(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: invalid config"):
        load(path)


def _rewrite(path, edit):
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))


def test_unknown_key(saved):
    _, path = saved
    _rewrite(path, lambda s: s.__setitem__("layers.9.extra", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"model.safetensors: unknown key 'layers.9.extra'"):
        load(path)


def test_missing_key(saved):
    _, path = saved
    _rewrite(path, lambda s: s.pop("norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing key 'norm.weight'"):
        load(path)


def test_wrong_shape(saved):
    _, path = saved
    _rewrite(path, lambda s: s.__setitem__("norm.weight", torch.ones(7)))
    with pytest.raises(CheckpointError, match=r"key 'norm.weight' has shape \(7,\)"):
        load(path)


def test_truncated_file(saved):
    _, path = saved
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load(path)


def test_missing_tokenizer(saved):
    _, path = saved
    (path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json: missing"):
        load(path)
    assert load_model(path) is not None  # the weights alone still load


def test_sharded_directory_loads(saved):
    """An index + shards (as large models are stored) loads to the same weights."""
    model, path = saved
    state = load_file(str(path / "model.safetensors"))
    keys = sorted(state)
    half = len(keys) // 2
    shards = {"model-1.safetensors": keys[:half], "model-2.safetensors": keys[half:]}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(path / name))
    (path / "model.safetensors").unlink()
    weight_map = {k: name for name, ks in shards.items() for k in ks}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_model(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values(), strict=True))
    (path / "model-2.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-2.safetensors: missing"):
        load_model(path)
