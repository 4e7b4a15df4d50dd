"""`clover convert`: foreign checkpoints -> Clover model directories, and back to Hugging Face.

Sources: a Hugging Face model directory (config.json + safetensors, sharded or not) or a GGUF file.
The family is chosen from `model_type` in the explicit `FAMILIES` registry; each family module
gives `config_from_hf`, `config_to_hf` and a declarative `KEYS` map that accounts for every key.
Tokenizer and chat template travel with the model; a ChatML model whose template cannot render
tools gets Clover's ChatML-with-tools template (`clover/templates/chatml_tools.jinja`).
`add_mask_token` prepares an AR model for diffusion: one new embedding row (documented below).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from clover.checkpoint import (
    diffusion_gemma,
    dream,
    llada,
    llada2,
    llada_moe,
    llama,
    olmoe,
    qwen2,
    qwen3,
    qwen3_moe,
    sdar,
    sdar_moe,
)
from clover.checkpoint.keymap import CheckpointError, from_clover_state, to_clover_state
from clover.config import ModelConfig

# model_type -> family module (config_from_hf, config_to_hf, KEYS; optional ALT_KEYS: other
# layouts of the same tensors, read on import only; optional ZEROS: Clover keys no source holds;
# optional select_tensors(tensors, where): drops or cross-checks source keys before the map)
FAMILIES: dict[str, ModuleType] = {"llama": llama, "mistral": llama, "qwen2": qwen2,
                                   "qwen3": qwen3, "qwen3_moe": qwen3_moe, "olmoe": olmoe}
FAMILIES["llada"] = llada
FAMILIES["Dream"] = dream
FAMILIES["llada2_moe"] = llada2
FAMILIES["sdar"] = sdar
FAMILIES["sdar_moe"] = sdar_moe
FAMILIES["lladamoe"] = llada_moe
FAMILIES["diffusion_gemma"] = diffusion_gemma
MASK_TOKEN = "<|mask|>"
CHATML_TOOLS_TEMPLATE = (Path(__file__).parent.parent / "templates"
                         / "chatml_tools.jinja").read_text(encoding="utf-8")


def family_of(hf_config: dict[str, Any], where: str) -> ModuleType:
    kind = hf_config.get("model_type")
    if kind not in FAMILIES:
        raise CheckpointError(f"{where}: model_type {kind!r} is not supported; "
                              f"supported: {sorted(FAMILIES)}")
    return FAMILIES[kind]


# ---- reading ------------------------------------------------------------------------------------

def read_hf_dir(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, every tensor) of a Hugging Face directory (one file or shards + index)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing; not a Hugging Face model directory")
    config = json.loads(config_file.read_text())
    index = path / "model.safetensors.index.json"
    files = (sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
             if index.is_file() else [path / "model.safetensors"])
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (safetensors weights)")
        tensors.update(load_file(str(file)))
    return config, tensors


def read_source(src: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """(HF config dict, HF-named tensors, tokenizer or None) from a directory or a .gguf file."""
    src = Path(src)
    if src.is_file() and src.suffix == ".gguf":
        from clover.checkpoint.gguf_file import gguf_tokenizer, read_gguf

        config, tensors = read_gguf(src)
        return config, tensors, gguf_tokenizer(src)
    if not src.is_dir():
        raise CheckpointError(f"{src}: neither a model directory nor a .gguf file")
    config, tensors = read_hf_dir(src)
    return config, tensors, _hf_tokenizer(src)


def _hf_tokenizer(path: Path):
    if not (path / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


# ---- mapping ------------------------------------------------------------------------------------

def to_clover(hf_config: dict[str, Any], tensors: dict[str, torch.Tensor], *,
              name: str, where: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Clover config + state dict for HF-named tensors; every key accounted for."""
    from clover.model import build_model

    family = family_of(hf_config, where)
    config = family.config_from_hf(hf_config, name=name)
    expected = build_model(config, device="meta").state_dict()
    if hasattr(family, "select_tensors"):  # a family that drops or cross-checks keys first
        tensors = family.select_tensors(tensors, where)
    if config.tie_embeddings and "lm_head.weight" in tensors:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}  # tied copy
    keymap = {**family.KEYS, **getattr(family, "ALT_KEYS", {})}
    state = to_clover_state(tensors, keymap, expected, zeros=getattr(family, "ZEROS", ()),
                            where=where)
    return config, state


def chat_template_with_tools(tokenizer) -> None:
    """Give a ChatML tokenizer whose template ignores tools the ChatML-with-tools template."""
    template = tokenizer.chat_template or ""
    if "tools" not in template and "<|im_start|>" in tokenizer.get_vocab():
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE


def reserved_id(config: ModelConfig, num_tokens: int) -> int:
    """The id Clover's engine reserves as its mask sentinel in a converted AR model.

    The engine marks undecided positions with `mask_id` and never samples it, so for an AR model
    it must be an id no text needs: the first padding row when the embedding is larger than the
    tokenizer (Qwen: 151936 rows, 151665 tokens), else the family mapping's spare id (the lowest
    id that is neither eos nor pad; SmolLM2: 0, `<|endoftext|>`: chats end with `<|im_end|>`, but
    a plain-text continuation that transformers would end there goes on instead).
    """
    if config.attention == "causal" and num_tokens < config.vocab_size:
        return num_tokens
    return config.mask_id


def add_mask_token(config: ModelConfig, state: dict[str, torch.Tensor], tokenizer):
    """Add `<|mask|>` as a new token whose embedding is the mean of the real token embeddings.

    The mean row sits in the middle of the embedding cloud, so a masked position starts as an
    "average token" rather than a real one; with a tied head its own logit starts near the mean
    logit, and the engine never samples the mask id anyway. The token takes the first padding
    row when the embedding is larger than the tokenizer (Qwen), else one new row is appended
    (SmolLM2). Returns the new config.
    """
    if MASK_TOKEN in tokenizer.get_vocab():
        raise CheckpointError(f"the tokenizer already has {MASK_TOKEN}")
    tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask_id > config.vocab_size:
        raise CheckpointError(f"{MASK_TOKEN} got id {mask_id}, beyond the embedding's "
                              f"{config.vocab_size} rows")
    for key in ("embed.weight", "lm_head.weight"):
        if key in state:
            rows = state[key]
            mean = rows[:mask_id].mean(0, keepdim=True)
            state[key] = torch.cat([rows[:mask_id], mean, rows[mask_id + 1:]])
    return config.replace(vocab_size=max(config.vocab_size, mask_id + 1), mask_id=mask_id)


def convert(src: str | Path, dst: str | Path, *, name: str | None = None,
            dtype: str = "float32", mask_token: bool = False) -> Path:
    """Write a Clover model directory at dst from a HF directory or a GGUF file."""
    from clover.checkpoint import save_state

    src = Path(src)
    hf_config, tensors, tokenizer = read_source(src)
    config, state = to_clover(hf_config, tensors, name=name or Path(dst).name, where=str(src))
    if tokenizer is not None:
        chat_template_with_tools(tokenizer)
        config = config.replace(mask_id=reserved_id(config, len(tokenizer)))
    if mask_token:
        if tokenizer is None:
            raise CheckpointError(f"{src}: --mask-token needs the tokenizer (tokenizer.json)")
        config = add_mask_token(config, state, tokenizer)
    return save_state(config, state, tokenizer, dst, dtype=getattr(torch, dtype))


# ---- export -------------------------------------------------------------------------------------

def export_hf(src: str | Path, dst: str | Path, family: str | None = None) -> Path:
    """A Clover model directory -> a directory transformers' AutoModelForCausalLM loads.

    family: the model_type to write (a key of FAMILIES); None picks it from the config.
    """
    from clover.checkpoint import load_config, read_state

    config = load_config(src)
    family = family or family_for(config)
    if family not in FAMILIES:
        raise CheckpointError(f"--family {family!r}: choose one of {sorted(FAMILIES)}")
    module = FAMILIES[family]
    hf_config = module.config_to_hf(config)
    out = from_clover_state(read_state(src), module.KEYS, zeros=getattr(module, "ZEROS", ()),
                      where=str(src))
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    _copy_tokenizer(Path(src), dst)
    return dst


def family_for(config: ModelConfig) -> str:
    """The family whose features match a Clover config (for `--to hf` without --family)."""
    if config.arch == "diffusion_gemma":
        return "diffusion_gemma"
    if config.attention != "causal":
        return _dllm_family_for(config)
    if config.is_moe:
        return "olmoe" if config.qk_norm and config.qk_norm_scope == "all" else "qwen3_moe"
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.qkv_bias else "llama"


def _dllm_family_for(config: ModelConfig) -> str:
    """Diffusion configs: the dLLM family with the same attention mode and prediction."""
    if config.attention == "full":
        return "Dream" if config.shift_logits else ("lladamoe" if config.is_moe else "llada")
    if config.is_moe:
        return "llada2_moe" if config.router == "sigmoid" else "sdar_moe"
    return "sdar"


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            (dst / name).write_bytes((src / name).read_bytes())
