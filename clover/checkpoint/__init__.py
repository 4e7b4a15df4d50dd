"""Model directories: `config.json` + `model.safetensors` (or shards + index) + tokenizer files.

`save` writes a directory atomically (temp dir, then rename). `load` builds the model on the meta
device and assigns the stored tensors (no second copy, no pickle ever). Every way a directory can
be wrong (missing file, bad config, unknown/missing key, wrong shape, truncated file) raises
`CheckpointError` naming the file and the key, and what to do about it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from clover.checkpoint.keymap import CheckpointError
from clover.config import ModelConfig
from clover.model import CloverModel, build_model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"




def save(model: CloverModel, tokenizer: Any | None, path: str | Path,
         extra: dict[str, str] | None = None, *, dtype: torch.dtype | None = None) -> Path:
    """Write a model directory at `path` (replaced atomically if it exists).

    extra: more files to write beside the model, name -> text (e.g. README.md, training.json).
    dtype: store floating-point weights in this dtype (e.g. bfloat16 halves an fp32 model);
    `load_model(..., dtype=...)` converts them back for compute.
    """
    return save_state(model.config, model.state_dict(), tokenizer, path, extra, dtype=dtype)


def save_state(config: ModelConfig, state: dict[str, torch.Tensor], tokenizer: Any | None,
               path: str | Path, extra: dict[str, str] | None = None, *,
               dtype: torch.dtype | None = None) -> Path:
    """`save` for a config and a state dict (importers build these without a model)."""
    with atomic_dir(path) as tmp:
        config.save(tmp / CONFIG_FILE)
        state = {k: _stored(v, dtype) for k, v in state.items()}
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "producer": "clover"})
        write_extras(tmp, tokenizer, extra)
    return Path(path)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """A temporary directory beside `path` that replaces it when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_extras(directory: Path, tokenizer: Any | None, extra: dict[str, str] | None) -> None:
    """The tokenizer files and the extra text files (README.md, training.json) of a directory."""
    if tokenizer is not None:
        from clover.tokenizer import save_tokenizer
        save_tokenizer(tokenizer, directory)
    for name, text in (extra or {}).items():
        (directory / name).write_text(text)


def _stored(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = t.detach().cpu()
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.contiguous()


def replace_dir(src: Path, dst: Path) -> None:
    """Move a finished directory into place, replacing dst (never a half-written dst)."""
    old = dst.with_name(f".{dst.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        dst.rename(old)
    src.rename(dst)
    shutil.rmtree(old, ignore_errors=True)


def load_config(path: str | Path) -> ModelConfig:
    file = _require_dir(path) / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; a model directory needs {CONFIG_FILE}")
    try:
        return ModelConfig.from_dict(json.loads(file.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: invalid config: {e}") from e


def load_model(path: str | Path, *, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> CloverModel:
    """Build on the meta device and assign the stored weights (converted to dtype if given).

    An adapter directory (LoRA over the embedded base) is merged into the base first."""
    from clover.checkpoint.adapter import is_adapter_dir, load_adapter_model

    if is_adapter_dir(path):
        return load_adapter_model(path, device=device, dtype=dtype)
    config = load_config(path)
    model = build_model(config, device="meta")
    expected = model.state_dict()
    state = _read_tensors(Path(path), expected, device, dtype)
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def load(path: str | Path, *, device: str | torch.device = "cpu",
         dtype: torch.dtype | None = None) -> tuple[CloverModel, Any]:
    """(model, tokenizer) from a model directory; both must be present."""
    from clover.tokenizer import load_tokenizer

    model = load_model(path, device=device, dtype=dtype)
    tok_file = Path(path) / TOKENIZER_FILE
    if not tok_file.is_file():
        raise CheckpointError(f"{tok_file}: missing; save the model with its tokenizer")
    return model, load_tokenizer(path)


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Every stored tensor of a model directory, checked against its config (CPU, stored dtype)."""
    config = load_config(path)
    expected = build_model(config, device="meta").state_dict()
    return _read_tensors(Path(path), expected, "cpu", None)


def _require_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a model directory (it does not exist or is a file)")
    return path


def _weight_files(path: Path) -> dict[str, Path]:
    """Map each stored key to the safetensors file that holds it."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: invalid shard index ({e})") from e
        return {key: path / name for key, name in weight_map.items()}
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; a model directory needs {WEIGHTS_FILE}")
    with _open(file) as f:
        return dict.fromkeys(f.keys(), file)


def _open(file: Path):
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (named by the shard index)")
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: unreadable or truncated safetensors file ({e})") from e


def _read_tensors(path: Path, expected: dict[str, torch.Tensor], device, dtype) -> dict:
    files = _weight_files(path)
    unknown = sorted(set(files) - set(expected))
    missing = sorted(set(expected) - set(files))
    if unknown:
        raise CheckpointError(f"{files[unknown[0]]}: unknown key {unknown[0]!r} "
                              f"({len(unknown)} unknown in all); it does not match {CONFIG_FILE}")
    if missing:
        where = path / (INDEX_FILE if (path / INDEX_FILE).is_file() else WEIGHTS_FILE)
        raise CheckpointError(f"{where}: missing key {missing[0]!r} "
                              f"({len(missing)} missing in all)")
    state = {}
    for file in sorted(set(files.values())):
        with _open(file) as f:
            for key in f.keys():
                state[key] = _read_one(f, file, key, expected[key], device, dtype)
    return state


def _read_one(f, file: Path, key: str, like: torch.Tensor, device, dtype) -> torch.Tensor:
    try:
        tensor = f.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(f"{file}: cannot read key {key!r}; "
                              f"the file looks truncated ({e})") from e
    if tuple(tensor.shape) != tuple(like.shape):
        raise CheckpointError(f"{file}: key {key!r} has shape {tuple(tensor.shape)}, "
                              f"the config expects {tuple(like.shape)}")
    target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.to(device=device, dtype=target)
