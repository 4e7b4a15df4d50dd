"""`clover inspect` on each dLLM family's published config.json (copies in tests/data/hf_configs).

The figures must agree with what the model cards publish (total / active parameters) and the
configs must come out with the right decoding shape (attention mode, block size, mask id), all
from config.json alone: nothing is downloaded, no weight is read.
"""

import json
from pathlib import Path

import pytest

from clover.cli import main
from clover.inspect import describe, resolve_config

CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# file: (published total, published active, attention, block size, mask id)
PUBLISHED = {
    "llada-8b-instruct.json": (8.0e9, 8.0e9, "full", 32, 126336),
    "dream-v0-instruct-7b.json": (7.6e9, 7.6e9, "full", 32, 151666),
    "llada2.0-mini.json": (16e9, 1.4e9, "block", 32, 156895),
    "llada2.0-flash.json": (100e9, 6.1e9, "block", 32, 156895),
    "sdar-4b-chat.json": (4.0e9, 4.0e9, "block", 4, 151669),
    "sdar-30b-a3b-chat.json": (30.5e9, 3.3e9, "block", 4, 151669),
    # Gemma 4 26B-A4B's text stack: 25.2 B total, 3.8 B active (its model card); canvas 256
    "diffusiongemma-26b-a4b-it.json": (25.2e9, 3.8e9, "canvas", 256, 4),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_inspect_matches_the_model_card(name):
    total, active, attention, block, mask = PUBLISHED[name]
    info = describe(resolve_config(str(CONFIGS / name)))
    assert info["total_params"] == pytest.approx(total, rel=0.05)
    assert info["active_params"] == pytest.approx(active, rel=0.05)
    assert (info["attention"], info["block_size"]) == (attention, block)
    assert resolve_config(str(CONFIGS / name)).mask_id == mask
    assert info["weights_bytes_bf16"] == 2 * info["total_params"]


def test_llada_moe_counts_64_experts_top_8():
    """LLaDA-MoE-7B-A1B: ~7B total; active = total minus the 56 unused experts of each of its
    16 MoE layers (3 matrices of 2048 x 1024 each)."""
    info = describe(resolve_config(str(CONFIGS / "llada-moe-7b-a1b-instruct.json")))
    assert info["total_params"] == pytest.approx(7.0e9, rel=0.06)
    assert info["total_params"] - info["active_params"] == 16 * 56 * 3 * 2048 * 1024
    assert (info["experts"], info["experts_per_token"], info["attention"]) == (64, 8, "full")


def test_cli_reads_a_directory_holding_a_hf_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text((CONFIGS / "llada2.0-mini.json").read_text())
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["experts"] == 256 and info["moe_layers"] == 19


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_export_family_is_recovered_from_the_clover_config(name):
    """Every published dLLM config, once mapped to Clover, exports back as its own model_type."""
    from clover.checkpoint.convert import family_for

    hf = json.loads((CONFIGS / name).read_text())
    assert family_for(resolve_config(str(CONFIGS / name))) == hf["model_type"]


def test_diffusion_gemma_kv_cache_counts_each_layer_shape():
    """25 sliding layers keep 8 kv heads x 256, the 5 full ones 2 x 512 (keys and values, bf16)."""
    info = describe(resolve_config(str(CONFIGS / "diffusiongemma-26b-a4b-it.json")))
    assert info["kv_cache_bytes_per_token_bf16"] == 2 * 2 * (25 * 8 * 256 + 5 * 2 * 512)
    assert (info["experts"], info["experts_per_token"], info["moe_layers"]) == (128, 8, 30)
