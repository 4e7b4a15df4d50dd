"""`clover inspect`: what a model is and what it costs, before anyone loads a single weight.

Builds the model on the meta device (no memory, seconds even at 35B), counts total parameters and
the parameters active per token (everything except the routed experts a token does not use), and
derives weight memory per precision and KV-cache bytes per token. Pure arithmetic on shapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clover.config import PRESETS, ModelConfig, get_preset

# Weight-only storage per parameter; int8/int4 ignore the (small) per-group scales.
BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


def resolve_config(name_or_dir: str) -> ModelConfig:
    """A preset name, a Clover model directory, or a Hugging Face config.json (a file, or a
    directory holding one) of a family `clover convert` imports: no weights are read."""
    if name_or_dir in PRESETS:
        return get_preset(name_or_dir)
    path = Path(name_or_dir)
    hf_file = path / "config.json" if path.is_dir() else path
    if hf_file.is_file():
        hf = json.loads(hf_file.read_text())
        if "model_type" in hf:  # a foreign config; Clover's own config.json has no model_type
            from clover.checkpoint.convert import family_of

            name = hf_file.parent.name if path.is_dir() else hf_file.stem
            return family_of(hf, str(hf_file)).config_from_hf(hf, name=name)
    if path.is_dir():
        from clover.checkpoint import load_config
        return load_config(name_or_dir)
    raise ValueError(f"{name_or_dir!r} is neither a preset ({', '.join(sorted(PRESETS))}), "
                     f"a model directory nor a Hugging Face config.json")


def count_params(config: ModelConfig) -> tuple[int, int]:
    """(total, active per token) parameters, from a meta-device model."""
    from clover.model import build_model

    model = build_model(config, device="meta")
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    for block in model.layers:
        experts = block.routed_experts
        if experts is not None:
            routed = sum(p.numel() for p in experts.parameters())
            unused = config.num_experts - config.num_experts_per_tok
            inactive += routed * unused // config.num_experts
    return total, total - inactive


def describe(config: ModelConfig) -> dict[str, Any]:
    total, active = count_params(config)
    kv_per_token = sum(2 * heads * dim for heads, dim in map(config.layer_kv_shape,
                                                             range(config.num_layers)))
    if config.token_conv:  # the cache also keeps each layer's convolution input
        kv_per_token += config.num_layers * config.dim
    info: dict[str, Any] = {
        "name": config.name,
        "attention": config.attention,
        "block_size": config.block_size,
        "layers": config.num_layers,
        "dim": config.dim,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "token_conv": config.token_conv,
        "experts": config.num_experts,
        "experts_per_token": config.num_experts_per_tok,
        "shared_experts": config.num_shared_experts,
        "moe_layers": sum(config.layer_is_moe(i) for i in range(config.num_layers)),
        "vocab_size": config.vocab_size,
        "total_params": total,
        "active_params": active,
        "kv_cache_bytes_per_token_bf16": kv_per_token * 2,
    }
    for precision, nbytes in BYTES_PER_PARAM.items():
        info[f"weights_bytes_{precision}"] = int(total * nbytes)
    return info


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def render_table(info: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"clover inspect: {info['name']}", show_header=False)
    rows = [
        ("attention", f"{info['attention']} (block size {info['block_size']})"),
        ("layers / dim", f"{info['layers']} / {info['dim']}"),
        ("heads / kv heads", f"{info['heads']} / {info['kv_heads']}"),
        ("experts / top-k / shared", f"{info['experts']} / {info['experts_per_token']} / "
                                     f"{info['shared_experts']} ({info['moe_layers']} MoE layers)"),
        ("total params", human(info["total_params"])),
        ("active params / token", human(info["active_params"])),
    ]
    rows += [(f"weights {p}", human(info[f"weights_bytes_{p}"], "B")) for p in BYTES_PER_PARAM]
    rows.append(("KV cache / token (bf16)", human(info["kv_cache_bytes_per_token_bf16"], "B")))
    for key, value in rows:
        table.add_row(key, value)
    console = Console(record=True, width=80)
    with console.capture() as capture:
        console.print(table)
    return capture.get()
