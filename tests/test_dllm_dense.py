"""Dense dLLM importers against transformers' own classes on random tiny configs.

LLaDA-8B's math is a Llama block with bidirectional attention: a random tiny `LlamaForCausalLM`
run with `is_causal=False` is rewritten into LLaDA's published key layout (sharded, with an index),
converted, and must give the same logits; Clover's engine must then decode the same tokens as
LLaDA's own generate algorithm (low-confidence remasking) run on the reference. Dream is Qwen2
(QKV bias) bidirectional with shifted prediction: a bidirectional `Qwen2ForCausalLM`'s logits at
i - 1 are what Clover uses for i.
"""

import copy
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from clover.bench.llada_reference import llada_generate
from clover.bench.llada_reference import llama_as_llada as reference_layout
from clover.checkpoint import load_model
from clover.checkpoint.convert import convert, export_hf, read_hf_dir
from clover.checkpoint.hf_files import write_hf_dir
from clover.checkpoint.keymap import CheckpointError

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
            max_position_embeddings=256, attn_implementation="eager")


def bidirectional(model):
    """transformers' own switch: a config with is_causal=False builds a bidirectional mask."""
    model.config.is_causal = False
    for layer in model.model.layers:
        layer.self_attn.is_causal = False
    return model.eval()


def llama_as_llada(ref) -> tuple[dict, dict]:
    """The same weights under LLaDA-8B's published names and config fields."""
    return reference_layout(ref, eos_id=5, mask_id=7)


@pytest.fixture(scope="module")
def llama_ref():
    torch.manual_seed(0)
    return bidirectional(LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False)))


def test_llada_logits_match_bidirectional_llama(llama_ref, tmp_path):
    """A converted LLaDA-layout checkpoint gives a bidirectional Llama's logits: catches a
    wrong key (gate vs up, attn_out), a causal mask left in, or a norm on the wrong side."""
    config, tensors = llama_as_llada(llama_ref)
    src = write_hf_dir(tmp_path / "llada", config, tensors, shards=3)
    model = load_model(convert(src, tmp_path / "clover"))
    assert model.config.attention == "full" and not model.config.shift_logits
    assert model.config.mask_id == 7
    ids = torch.randint(0, 300, (2, 13))
    with torch.no_grad():
        want, got = llama_ref(ids).logits, model(ids).logits
        prefix = model(ids[:, :5]).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # bidirectional: position 0's logits depend on later tokens
    assert (prefix[:, 0] - got[:, 0]).abs().max() > 1e-3


def test_llada_round_trip_is_bit_exact(llama_ref, tmp_path):
    """Import then `--to hf` export gives back the same keys, shapes and bytes."""
    config, tensors = llama_as_llada(llama_ref)
    src = write_hf_dir(tmp_path / "llada", config, tensors, shards=2)
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back", family="llada")
    exported_config, exported = read_hf_dir(back)
    assert exported_config["model_type"] == "llada"
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)


def test_llada_refuses_math_it_does_not_implement(llama_ref, tmp_path):
    config, tensors = llama_as_llada(llama_ref)
    for field, value in (("alibi", True), ("attention_layer_norm", True),
                         ("activation_type", "gelu"), ("layer_norm_type", "default")):
        src = write_hf_dir(tmp_path / field, {**config, field: value}, tensors)
        with pytest.raises(CheckpointError, match=field):
            convert(src, tmp_path / f"{field}-out")


def test_llada_unknown_key_is_named(llama_ref, tmp_path):
    config, tensors = llama_as_llada(llama_ref)
    tensors["model.transformer.blocks.0.extra.weight"] = torch.zeros(3)
    src = write_hf_dir(tmp_path / "llada", config, tensors)
    with pytest.raises(CheckpointError, match="blocks.0.extra.weight"):
        convert(src, tmp_path / "out")


def dream_checkpoint(tmp_path):
    torch.manual_seed(1)
    ref = bidirectional(Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=False)))
    with torch.no_grad():  # random biases, so a dropped bias cannot pass
        for layer in ref.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    config = {**json.loads(ref.config.to_json_string()), "model_type": "Dream",
              "architectures": ["DreamModel"], "mask_token_id": 9, "eos_token_id": 5,
              "pad_token_id": 5, "bos_token_id": 5}
    src = write_hf_dir(tmp_path / "dream", config, ref.state_dict(), shards=2)
    return ref, src


def test_dream_logits_match_bidirectional_qwen2_shifted(tmp_path):
    """Dream = bidirectional Qwen2 with QKV bias; Clover marks it shift_logits so the engine
    reads position i's prediction from logits i - 1 (checked here on the model's own output)."""
    ref, src = dream_checkpoint(tmp_path)
    model = load_model(convert(src, tmp_path / "clover"))
    assert model.config.shift_logits and model.config.attention == "full"
    assert model.config.qkv_bias and model.config.mask_id == 9
    ids = torch.randint(0, 300, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-4, rtol=0)


def test_dream_round_trip_is_bit_exact(tmp_path):
    _, src = dream_checkpoint(tmp_path)
    _, tensors = read_hf_dir(src)
    back = export_hf(convert(src, tmp_path / "clover"), tmp_path / "back", family="Dream")
    _, exported = read_hf_dir(back)
    assert sorted(exported) == sorted(tensors)
    assert all(torch.equal(exported[k], tensors[k]) for k in tensors)


def test_engine_decodes_like_llada_generate(llama_ref, tmp_path):
    """Clover's engine on a converted LLaDA checkpoint (topk policy, full recompute) commits the
    same tokens as LLaDA's own generate algorithm run on the reference weights."""
    from clover.engine import LLM, SamplingParams

    ref = copy.deepcopy(llama_ref)
    with torch.no_grad():  # larger weights, so greedy decoding writes varied tokens
        for name, p in ref.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 1.0 if "embed" in name else 0.25)
        ref.lm_head.weight[[5, 7]] = 0.0  # eos (5) and mask (7) never win an argmax
    config, tensors = llama_as_llada(ref)
    model = load_model(convert(write_hf_dir(tmp_path / "llada", config, tensors), tmp_path / "c"))
    prompt = [11, 42, 8, 99, 150]
    with torch.no_grad():
        (want,) = llada_generate(lambda ids: ref(ids).logits, [prompt], mask_id=7,
                                 gen_length=16, block_length=8, steps=8)
    assert len(set(want)) > 4  # a real sequence, not one repeated token
    llm = LLM(model, device="cpu", dtype="float32")
    params = SamplingParams(policy="topk", steps_per_block=4, block_size=8, max_tokens=16,
                            cache="none", ignore_eos=True)
    (out,) = llm.generate([prompt], params)
    assert out.token_ids == want
