"""Writing Hugging Face model directories: config.json + safetensors, sharded with an index.

`write_hf_dir` writes the layout the Hub publishes (`model-00001-of-0000N.safetensors` files and
`model.safetensors.index.json` mapping every key to its shard), so exports load in transformers and
tests can build synthetic checkpoints in a family's exact published layout. Keys keep their order;
shards split the key list into N nearly equal runs. No torch model is built here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

INDEX_FILE = "model.safetensors.index.json"


def write_hf_dir(path: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], *,
                 shards: int = 1) -> Path:
    """config.json plus the tensors in `shards` safetensors files (with an index when > 1)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1 (got {shards})")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    keys = list(tensors)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i * len(keys) // shards:(i + 1) * len(keys) // shards]
        save_file({k: tensors[k] for k in part}, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return path
