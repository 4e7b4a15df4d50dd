"""GGUF files (llama.cpp) -> a Hugging Face-style config dict and HF-named float tensors.

Read with the `gguf` package's `GGUFReader`; quantised tensors (Q4_0, Q4_1, Q8_0, ...) are
dequantised with `gguf.quants.dequantize`. llama.cpp's converter permutes the rows of Q and K so
that RoPE pairs (i, i + d/2) become adjacent (i, i + 1); `unpermute_rope` undoes that, back to the
rotate-half layout of Hugging Face and Clover. The tokenizer comes from transformers' own GGUF
tokenizer conversion. Only the `llama` architecture is mapped so far; others name themselves.
"""

# Shapes: O output features, I input features, H heads, Dh head dim

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from clover.checkpoint.keymap import CheckpointError, KeyMap

# GGUF tensor names -> Hugging Face Llama names (`{}` is the block index)
GGUF_LLAMA_KEYS: KeyMap = {
    "token_embd.weight": "model.embed_tokens.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": None,  # only for scaled RoPE, which the config mapping refuses
}


def unpermute_rope(w_OI: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's Q/K row permutation: per head, interleaved pairs -> two halves."""
    out_features, in_features = w_OI.shape
    head_dim = out_features // num_heads
    return (w_OI.reshape(num_heads, head_dim // 2, 2, in_features)
            .transpose(1, 2).reshape(out_features, in_features))


def permute_rope(w_OI: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's permutation (for writing GGUF files in tests): two halves -> interleaved."""
    out_features, in_features = w_OI.shape
    head_dim = out_features // num_heads
    return (w_OI.reshape(num_heads, 2, head_dim // 2, in_features)
            .transpose(1, 2).reshape(out_features, in_features))


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def hf_config(reader, path: Path) -> dict[str, Any]:
    """The `llama.*` metadata as a Hugging Face LlamaConfig dict."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported "
                              "(supported: llama)")
    get = lambda key, default=None: _field(reader, f"llama.{key}", default)  # noqa: E731
    num_heads = int(get("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = get("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(vocab),
        "hidden_size": int(get("embedding_length")), "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", num_heads)),
        "intermediate_size": int(get("feed_forward_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 0)),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
    }


def _dequantised(tensor) -> torch.Tensor:
    """One GGUF tensor as fp32 in PyTorch's [out, in] order (GGUF lists dims innermost first)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = np.asarray(tensor.data, dtype=np.float32)
    else:
        data = dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(HF config dict, {HF key: fp32 tensor}) from a GGUF file, Q/K un-permuted."""
    from gguf import GGUFReader

    from clover.checkpoint.keymap import rename

    path = Path(path)
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from e
    config = hf_config(reader, path)
    names = rename([t.name for t in reader.tensors], GGUF_LLAMA_KEYS, [], where=str(path))
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    tensors = {}
    for tensor in reader.tensors:
        if tensor.name not in names:
            continue
        w = _dequantised(tensor)
        kind = tensor.name.split(".")[-2]
        tensors[names[tensor.name]] = unpermute_rope(w, heads[kind]) if kind in heads else w
    return config, tensors


def gguf_tokenizer(path: str | Path):
    """transformers' fast tokenizer converted from the GGUF's vocabulary, merges and template."""
    from transformers import AutoTokenizer

    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                         local_files_only=True)
