"""Command-line flags for `SamplingParams`: one flag per field, generated from the dataclass.

`add_sampling_flags` adds them to a parser (`top_p` -> `--top-p`), so flags and fields cannot
drift; `sampling_params` builds the dataclass from parsed flags and reports a bad value under its
flag name (a ValueError for `clover.cli`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import typing
from typing import Any

from clover.engine.params import CACHE_MODES, SamplingParams

_FLAG_HELP = {
    "max_tokens": "most tokens to generate per prompt",
    "temperature": "0 = greedy",
    "top_p": "nucleus sampling mass",
    "top_k": "keep the k most likely tokens (0: off)",
    "seed": "seed for sampling (temperature > 0)",
    "stop": "stop strings (the text is cut before the first one)",
    "stop_token_ids": "extra token ids that end generation",
    "ignore_eos": "keep decoding after EOS",
    "policy": "commit policy: threshold | prefix (threshold, left to right) | topk | entropy | "
              "entropy_bound (uniform canvases)",
    "tau": "threshold / prefix policies: commit positions with confidence >= tau",
    "steps_per_block": "topk policy: denoising steps per block (uniform canvases: at most)",
    "gamma": "entropy / entropy_bound policies: summed-entropy budget per step (nats)",
    "min_temperature": "uniform canvases: temperature at the last step (linear schedule)",
    "stable_steps": "uniform canvases: stop when the argmax canvas held this many steps",
    "stop_entropy": "uniform canvases: ... and its mean entropy is below this",
    "block_size": "block size override for `full` attention models",
    "cache": f"`full` models: KV cache mode, one of {' | '.join(CACHE_MODES)}",
    "refresh_every": "`full` models: recompute the whole canvas every N steps (0: per block)",
    "structured": 'structured output as JSON, e.g. \'{"json_object": true}\'',
}



def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: Any) -> type:
    """`int | None` -> int; plain scalars pass through."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object (got {text!r})")
    return obj


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """One flag per SamplingParams field (`top_p` -> `--top-p`); unset flags keep the default."""
    group = p.add_argument_group("sampling (SamplingParams)")
    hints = typing.get_type_hints(SamplingParams)
    for f in dataclasses.fields(SamplingParams):
        hint, flag = hints[f.name], _flag(f.name)
        help_ = f"{_FLAG_HELP.get(f.name, f.name)} (default: {_field_default(f)})"
        if hint is bool:
            group.add_argument(flag, action="store_true", default=None, help=help_)
        elif _scalar_type(hint) is dict:
            group.add_argument(flag, type=_json_object, default=None, metavar="JSON",
                               help=help_)
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            group.add_argument(flag, nargs="+", action="extend", type=item, default=None,
                               metavar=item.__name__.upper(), help=help_)
        else:
            kind = _scalar_type(hint)
            group.add_argument(flag, type=kind, default=None, metavar=kind.__name__.upper(),
                               help=help_)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags describe; a ValueError names the flag, not the field."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(SamplingParams)
             if getattr(args, f.name, None) is not None}
    try:
        params = SamplingParams(**given)
    except ValueError as e:
        message = re.sub(r"SamplingParams\.(\w+)", lambda m: _flag(m.group(1)), str(e))
        raise ValueError(message) from None
    if getattr(params, "structured", None) is not None:
        _require_grammar()
    return params


def _require_grammar() -> None:
    try:
        import clover.grammar  # noqa: F401
    except ImportError:
        raise ValueError("--structured needs the grammar backend (clover.grammar), which this "
                         "install does not have") from None
