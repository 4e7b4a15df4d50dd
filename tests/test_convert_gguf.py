"""GGUF import: a tiny Llama written here with `gguf.GGUFWriter` (one tensor quantised to Q8_0,
Q and K permuted the way llama.cpp writes them, a byte-level BPE vocabulary and a ChatML chat
template in the metadata) converts into a Clover directory whose logits equal transformers' own
GGUF loader on the same file, with the same tokenizer and the chat template carried over.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from clover.checkpoint import load
from clover.checkpoint.convert import convert
from clover.checkpoint.gguf_file import permute_rope, read_gguf

HEADS, KV_HEADS, DIM, FFN, LAYERS = 4, 2, 64, 96, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = ["The capital of France is Paris.", "Restricted airspace from the surface to 400 ft.",
        "A quick brown fox jumps over the lazy dog."] * 20


def tiny_bpe(vocab_size: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    return tok


def random_llama(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named Llama tensors (untied head), norms around 1."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: 0.15 * torch.randn(*shape, generator=gen)  # noqa: E731
    head_dim = DIM // HEADS
    out = {"model.embed_tokens.weight": rand(vocab, DIM), "lm_head.weight": rand(vocab, DIM),
           "model.norm.weight": 1 + rand(DIM)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": rand(HEADS * head_dim, DIM),
                p + "self_attn.k_proj.weight": rand(KV_HEADS * head_dim, DIM),
                p + "self_attn.v_proj.weight": rand(KV_HEADS * head_dim, DIM),
                p + "self_attn.o_proj.weight": rand(DIM, HEADS * head_dim),
                p + "mlp.gate_proj.weight": rand(FFN, DIM),
                p + "mlp.up_proj.weight": rand(FFN, DIM),
                p + "mlp.down_proj.weight": rand(DIM, FFN),
                p + "input_layernorm.weight": 1 + rand(DIM),
                p + "post_attention_layernorm.weight": 1 + rand(DIM)}
    return out


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(key: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
           "model.norm.weight": "output_norm.weight"}
    if key in top:
        return top[key]
    _, _, layer, rest = key.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def write_gguf(path, tensors: dict[str, torch.Tensor], tok: Tokenizer) -> None:
    """A llama.cpp-style file: Q/K permuted for RoPE, ffn_down quantised to Q8_0."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(tok.get_vocab_size())
    _write_vocab(w, tok)
    for key, t in tensors.items():
        name = gguf_name(key)
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            t = permute_rope(t, HEADS if "attn_q" in name else KV_HEADS)
        data = t.numpy().astype(np.float32)
        if name.endswith("ffn_down.weight"):
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_vocab(w, tok: Tokenizer) -> None:
    import json

    import gguf

    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL
                       for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    w.add_bos_token_id(tok.token_to_id("<|im_start|>"))
    w.add_chat_template(CHATML)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    tok = tiny_bpe()
    tensors = random_llama(tok.get_vocab_size())
    write_gguf(root / "tiny.gguf", tensors, tok)
    return root / "tiny.gguf", tensors, tok


def test_gguf_reader_dequantises_and_unpermutes(tiny_gguf):
    """Reading the file gives back the HF tensors: exact for F32 (so Q/K are un-permuted) and
    within Q8_0's rounding for the quantised ones."""
    path, tensors, _ = tiny_gguf
    _, read = read_gguf(path)
    assert read.keys() == tensors.keys()
    for key, t in tensors.items():
        if "down_proj" in key:
            scale = t.abs().reshape(t.shape[0], -1, 32).amax(-1).max()
            assert not torch.equal(read[key], t)  # really quantised
            torch.testing.assert_close(read[key], t, atol=float(scale) / 127, rtol=0)
        else:
            assert torch.equal(read[key], t), key


def test_gguf_logits_match_transformers(tiny_gguf, tmp_path):
    """Clover's conversion and transformers' GGUF loader agree on the same file (fp32)."""
    from transformers import AutoModelForCausalLM

    path, _, tok = tiny_gguf
    ours, our_tok = load(convert(path, tmp_path / "clover"))
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32, local_files_only=True).eval()
    ids = torch.tensor([our_tok.encode("The capital of France is Paris")[:6],
                        our_tok.encode("A quick brown fox jumps over")[:6]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, atol=1e-4, rtol=0)


def test_gguf_tokenizer_and_template_travel(tiny_gguf, tmp_path):
    """The converted tokenizer encodes like the one the file was written from, and the file's
    ChatML template (which has no tools) is replaced by the ChatML-with-tools one."""
    from clover.tokenizer import render_chat

    path, _, tok = tiny_gguf
    _, our_tok = load(convert(path, tmp_path / "clover"))
    text = "Restricted airspace: the quick brown fox."
    assert our_tok.encode(text, add_special_tokens=False) == tok.encode(text).ids
    prompt = render_chat(our_tok, [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi"}],
                         tools=[{"name": "draw", "parameters": {"type": "object"}}])
    assert prompt.startswith("<|im_start|>system\nBe brief.") and '"name": "draw"' in prompt
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
