"""Adapter model directories (LoRA over the embedded base): exact reload, the documented mask row,
and a clear error naming the set-up command when the base is missing."""

import json

import pytest
import torch
import torch.nn.functional as F

from clover.checkpoint import CheckpointError, load, load_model, save
from clover.checkpoint import adapter as ad
from clover.checkpoint.base import GGUF_SHA256, STAMP
from clover.config import ModelConfig
from clover.model import build_model
from clover.tasks.airspace.smol import adapted_config
from clover.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"WI {i}.5NM RADIUS 5121{i:02d}N 00036{i:02d}W SFC-400FT AGL" for i in range(200)]
    return train_tokenizer(texts, vocab_size=300)


def _llama_like() -> ModelConfig:
    return ModelConfig(name="base", vocab_size=300, dim=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, ffn_dim=128, tie_embeddings=True, attention="causal",
                       block_size=1, eos_id=1, pad_id=1, mask_id=2)


@pytest.fixture
def base_cache(tmp_path, monkeypatch, tokenizer):
    """A tiny stand-in for the converted base in a private cache (same stamp as the real one)."""
    monkeypatch.setenv("CLOVER_CACHE", str(tmp_path / "cache"))
    from clover.checkpoint.base import base_dir

    model = build_model(_llama_like(), seed=1)
    save(model, tokenizer, base_dir())
    (base_dir() / STAMP).write_text(json.dumps({"gguf_sha256": GGUF_SHA256}))
    return model


def _random_lora(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.05


@pytest.mark.parametrize("attention", ["causal", "block"])
def test_adapter_reloads_to_the_trained_function(base_cache, tokenizer, tmp_path, attention):
    """Base + LoRA saved as an adapter and merged at load gives the injected model's logits
    (fp32 storage): catches a wrong merge scale, a lost target module or a misplaced mask row."""
    config = adapted_config(base_cache.config, attention, 4, True, "adapted")
    model = ad.base_model_for(config)
    peft_config = ad.lora_config(8, alpha=16)
    ad.inject_lora(model, peft_config)
    _random_lora(model)
    ids = torch.randint(0, config.vocab_size, (2, 9))
    with torch.no_grad():
        want = model.eval()(ids).logits
    out = ad.save_adapter(model, config, peft_config, tokenizer, tmp_path / "a",
                          base={"base": "test"}, dtype=torch.float32)
    loaded, _ = load(out)
    assert not any("lora" in k for k in loaded.state_dict())
    torch.testing.assert_close(loaded(ids).logits, want, atol=1e-5, rtol=0)


def test_adapter_directory_stays_small(base_cache, tokenizer, tmp_path):
    """Only the LoRA matrices are stored, never a copy of the base weights."""
    config = adapted_config(base_cache.config, "block", 4, True, "adapted")
    model = ad.base_model_for(config)
    peft_config = ad.lora_config(4)
    ad.inject_lora(model, peft_config)
    out = ad.save_adapter(model, config, peft_config, tokenizer, tmp_path / "a", base={})
    from safetensors.torch import load_file

    stored = load_file(str(out / ad.ADAPTER_WEIGHTS))
    assert stored and all("lora_" in k for k in stored)
    assert not (out / "model.safetensors").exists()


def test_mask_row_is_the_mean_embedding(base_cache):
    """The diffusion model's extra vocabulary row is the documented initialisation."""
    config = adapted_config(base_cache.config, "block", 4, True, "adapted")
    model = ad.base_model_for(config)
    embed = base_cache.embed.weight
    assert config.mask_id == embed.shape[0] == config.vocab_size - 1
    torch.testing.assert_close(model.embed.weight[-1], embed.mean(0))
    torch.testing.assert_close(model.embed.weight[:-1], embed)


def test_random_mask_row_is_a_seeded_draw_at_the_embedding_scale(base_cache):
    """--mask-init random: the same row every time, of the embedding entries' scale, not the
    mean; the base rows untouched; an unknown choice names the flag."""
    config = adapted_config(base_cache.config, "block", 4, True, "adapted")
    a = ad.base_model_for(config, mask_init="random").embed.weight
    b = ad.base_model_for(config, mask_init="random").embed.weight
    embed = base_cache.embed.weight
    assert torch.equal(a[-1], b[-1]) and torch.equal(a[:-1], embed)
    assert (a[-1] - embed.mean(0)).abs().max() > 10 * embed.mean(0).abs().max()
    assert 0.8 < (a[-1].float().std() / embed.float().std()).item() < 1.2
    with pytest.raises(ValueError, match="--mask-init"):
        ad.with_mask_row({"embed.weight": embed}, "zeros")


def test_missing_base_names_the_setup_command(base_cache, tokenizer, tmp_path, monkeypatch):
    config = adapted_config(base_cache.config, "causal", 1, False, "adapted")
    model = ad.base_model_for(config)
    peft_config = ad.lora_config(4)
    ad.inject_lora(model, peft_config)
    out = ad.save_adapter(model, config, peft_config, tokenizer, tmp_path / "a", base={})
    monkeypatch.setenv("CLOVER_CACHE", str(tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="make setup"):
        load_model(out)


def test_init_adapter_starts_from_the_saved_lora_and_checks_it(base_cache, tokenizer, tmp_path):
    """`--init-adapter`: the diffusion run's LoRA starts as the AR twin's; a wrong rank or a
    directory without adapter files is a clear error naming the flag."""
    from clover.tasks.airspace.smol import smol_model

    causal = adapted_config(base_cache.config, "causal", 1, False, "ar")
    model = ad.base_model_for(causal)
    peft_config = ad.lora_config(4)
    ad.inject_lora(model, peft_config)
    _random_lora(model, seed=3)
    saved = ad.save_adapter(model, causal, peft_config, tokenizer, tmp_path / "ar", base={},
                            dtype=torch.float32)
    block = adapted_config(base_cache.config, "block", 4, True, "dl")
    started, _ = smol_model(block, 4, str(saved))
    want = {k: v for k, v in ad.lora_state(model).items()}
    got = ad.lora_state(started)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(ValueError, match="--init-adapter .*rank 4 != --lora-rank 8"):
        smol_model(block, 8, str(saved))
    with pytest.raises(ValueError, match="--init-adapter .*adapter_config.json: missing"):
        smol_model(block, 4, str(tmp_path))


def test_training_record_pins_the_adapters_it_started_from(tmp_path):
    """`--init-adapter` / `--distill-from` name directories that later stages replace: the
    record keeps the SHA-256 of the weights as read, and only for the flags given."""
    import argparse
    import hashlib

    from clover.tasks.airspace.smol import _adapter_digests

    for name, data in (("init", b"student weights"), ("teacher", b"teacher weights"),
                       ("verifier", b"verifier weights")):
        (tmp_path / name).mkdir()
        (tmp_path / name / ad.ADAPTER_WEIGHTS).write_bytes(data)
    args = argparse.Namespace(init_adapter=str(tmp_path / "init"),
                              distill_from=str(tmp_path / "teacher"),
                              verifier=str(tmp_path / "verifier"))
    assert _adapter_digests(args) == {
        "init_adapter_sha256": hashlib.sha256(b"student weights").hexdigest(),
        "distill_from_sha256": hashlib.sha256(b"teacher weights").hexdigest(),
        "verifier_sha256": hashlib.sha256(b"verifier weights").hexdigest()}
    assert _adapter_digests(argparse.Namespace(init_adapter=None, distill_from=None,
                                               verifier=None)) == {}


def test_trained_mask_row_is_stored_alone_and_merged_at_load(base_cache, tokenizer, tmp_path):
    """`--train-mask-row`: the <|mask|> embedding row trains beside the LoRA (and nothing else of
    the embedding), is stored as that one row, and the merged model reloads to the same logits;
    a causal model has no mask row to train."""
    from safetensors.torch import load_file

    from clover.tasks.airspace.smol import smol_model

    config = adapted_config(base_cache.config, "block", 4, True, "dl")
    model, peft_config = smol_model(config, 4, None, train_mask_row=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("trainable_tokens" in n for n in trainable)
    assert all("lora_" in n or "trainable_tokens" in n for n in trainable)
    _random_lora(model)
    row = next(p for n, p in model.named_parameters() if "trainable_tokens" in n)
    with torch.no_grad():
        row.add_(torch.randn(row.shape, generator=torch.Generator().manual_seed(5)))
    ids = torch.tensor([[5, 6, config.mask_id, config.mask_id, 7, 8, 9, config.mask_id]])
    with torch.no_grad():
        want = model.eval()(ids).logits
    out = ad.save_adapter(model, config, peft_config, tokenizer, tmp_path / "a",
                          base={"base": "test"}, dtype=torch.float32)
    stored = load_file(str(out / ad.ADAPTER_WEIGHTS))
    rows = [v for k, v in stored.items() if "lora_" not in k]
    assert [tuple(v.shape) for v in rows] == [(1, config.dim)]
    loaded, _ = load(out)
    assert not any("lora" in k or "token" in k for k in loaded.state_dict())
    torch.testing.assert_close(loaded.embed.weight[config.mask_id], row.detach()[0])
    torch.testing.assert_close(loaded.embed.weight[:-1], base_cache.embed.weight)
    # rtol: the unmerged model computes the mask row's logit column on its own (`tied_head`)
    torch.testing.assert_close(loaded(ids).logits, want, atol=1e-5, rtol=1e-6)
    causal = adapted_config(base_cache.config, "causal", 1, False, "ar")
    with pytest.raises(ValueError, match="--train-mask-row"):
        smol_model(causal, 4, None, train_mask_row=True)


def test_mask_row_training_can_start_from_an_adapter_without_one(base_cache, tokenizer,
                                                                 tmp_path):
    """`--init-adapter` saved without a trained mask row + `--train-mask-row`: the LoRA comes
    from the adapter, the row starts where the base has it (the mean embedding) and trains."""
    from clover.tasks.airspace.smol import smol_model

    config = adapted_config(base_cache.config, "block", 4, True, "dl")
    plain, peft_config = smol_model(config, 4, None)
    _random_lora(plain)
    saved = ad.save_adapter(plain, config, peft_config, tokenizer, tmp_path / "a",
                            base={"base": "test"}, dtype=torch.float32)
    model, _ = smol_model(config, 4, str(saved), train_mask_row=True)
    lora = {k: v for k, v in ad.lora_state(model).items() if "lora_" in k}
    torch.testing.assert_close(lora, {k: v for k, v in ad.lora_state(plain).items()})
    row = next(p for n, p in model.named_parameters() if "trainable_tokens" in n)
    assert row.requires_grad
    torch.testing.assert_close(row.detach()[0], plain.embed.weight[config.mask_id].detach())


def test_trained_mask_row_trains_as_in_peft_without_the_full_table(base_cache, monkeypatch):
    """The embedding lookup and tied head of a model training its mask row (`embed_tokens`,
    `tied_head`) give PEFT's merged-table logits and the same gradients for the LoRA and the
    row, without copying the [V, D] table or building its gradient: fewer copies of it."""
    from clover.model import layers
    from clover.tasks.airspace.smol import smol_model

    config = adapted_config(base_cache.config, "block", 4, True, "dl")
    model, _ = smol_model(config, 4, None, train_mask_row=True)
    assert config.tie_embeddings and model.lm_head is None
    _random_lora(model)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        params[-1].add_(torch.randn(params[-1].shape, generator=torch.Generator().manual_seed(5)))
    ids = torch.tensor([[5, 6, config.mask_id, config.mask_id, 7, 8, 9, config.mask_id]])
    targets = torch.randint(0, config.vocab_size, (8,), generator=torch.Generator().manual_seed(6))
    runs, copies, peft_path = [], [], [False]
    index_copy = torch.Tensor.index_copy
    monkeypatch.setattr(torch.Tensor, "index_copy", lambda t, *a, **k: copies.append(
        (peft_path[0], tuple(t.shape))) or index_copy(t, *a, **k))
    for peft in (False, True):
        if peft:
            peft_path[0] = True
            monkeypatch.setattr(layers, "_trained_rows", lambda embed: None)
        logits = model.train()(ids).logits[0]
        loss = F.cross_entropy(logits, targets)
        runs.append((logits.detach(), torch.autograd.grad(loss, params)))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=1e-5)
    for fast, peft in zip(runs[0][1], runs[1][1], strict=True):
        torch.testing.assert_close(fast, peft, atol=1e-6, rtol=1e-4)
    assert runs[0][1][-1].abs().sum() > 0  # the row gets a gradient (lookup and head)
    table_copies = [peft for peft, shape in copies if shape == (config.vocab_size, config.dim)]
    assert table_copies and all(table_copies)  # PEFT's path copies the table; ours never
