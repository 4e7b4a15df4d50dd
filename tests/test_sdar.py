"""SDAR import against transformers' Qwen3 run under SDAR's block-diffusion mask.

SDAR is Qwen3 (per-head QK-norm) with attention bidirectional inside blocks of `block_size` and
causal across them; its published generate() passes exactly that mask to the Qwen3 stack. So a
random tiny `Qwen3ForCausalLM` given the same 4D block mask is the reference for a converted SDAR
checkpoint (same keys, `model_type: sdar`), and import + export must give back the same bytes.
"""

import json

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from clover.checkpoint import load_model
from clover.checkpoint.convert import convert, export_hf, read_hf_dir
from clover.checkpoint.hf_files import write_hf_dir

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="eager")


def block_mask(length: int, block: int) -> torch.Tensor:
    """SDAR's additive mask [1, 1, L, L]: 0 where key block <= query block, -inf elsewhere."""
    blk = torch.arange(length) // block
    allowed = blk[None, :] <= blk[:, None]
    return torch.zeros(length, length).masked_fill(~allowed, float("-inf"))[None, None]


def sdar_checkpoint(tmp_path, block: int = 4):
    torch.manual_seed(2)
    ref = Qwen3ForCausalLM(Qwen3Config(**TINY)).eval()
    with torch.no_grad():  # non-trivial QK-norm weights, so a dropped norm cannot pass
        for layer in ref.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.2)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.2)
    config = {**json.loads(ref.config.to_json_string()), "model_type": "sdar",
              "architectures": ["SDARForCausalLM"], "block_size": block, "eos_token_id": 5,
              "pad_token_id": 5, "mask_token_id": 9}
    return ref, write_hf_dir(tmp_path / "sdar", config, ref.state_dict(), shards=2)


def test_sdar_logits_match_qwen3_under_the_block_mask(tmp_path):
    """Catches a causal (or full) mask where SDAR's block mask belongs, and a QK-norm left out."""
    ref, src = sdar_checkpoint(tmp_path)
    model = load_model(convert(src, tmp_path / "clover"))
    assert (model.config.attention, model.config.block_size) == ("block", 4)
    assert model.config.qk_norm and not model.config.shift_logits and model.config.mask_id == 9
    ids = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        want = ref(ids, attention_mask=block_mask(10, 4)).logits
        causal = ref(ids).logits
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert (got - causal).abs().max() > 1e-3  # the block mask is not the causal one


def test_sdar_round_trip_is_bit_exact(tmp_path):
    _, src = sdar_checkpoint(tmp_path)
    config, tensors = read_hf_dir(src)
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back", family="sdar")
    exported_config, exported = read_hf_dir(back)
    assert exported_config["block_size"] == 4 and exported_config["model_type"] == "sdar"
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)
