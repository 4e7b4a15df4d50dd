"""Declarative key maps: foreign checkpoint key patterns -> Clover keys, every key accounted for.

A key map is `{source_pattern: clover_pattern | None}` where `{}` stands for a layer (or expert)
index and `None` drops a key on purpose (e.g. RoPE buffers recomputed from the config). `rename`
maps a whole state dict and raises `CheckpointError` naming the first source key no pattern
matches, and the first Clover key nothing produced. Pure Python over names: no tensors, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

KeyMap = dict[str, str | None]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded or converted; the message names the file and key."""


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(r"\{\}", r"(\d+)") + "$")


def rename(keys: Iterable[str], keymap: KeyMap, expected: Iterable[str], *,
           where: str = "checkpoint") -> dict[str, str]:
    """{source key: Clover key} for every kept key; dropped keys are left out.

    Raises CheckpointError for a source key that matches no pattern (unknown), for two source
    keys landing on one Clover key, and for an expected Clover key that no source key produced.
    """
    compiled = [(_compile(src), dst) for src, dst in keymap.items()]
    out: dict[str, str] = {}
    for key in keys:
        target = _target(key, compiled, where)
        if target is None:
            continue
        if target in out.values():
            raise CheckpointError(f"{where}: two keys map onto {target!r} (one is {key!r})")
        out[key] = target
    missing = sorted(set(expected) - set(out.values()))
    if missing:
        raise CheckpointError(f"{where}: missing key for {missing[0]!r} "
                              f"({len(missing)} missing in all)")
    return out


def _target(key: str, compiled: list, where: str) -> str | None:
    for regex, dst in compiled:
        match = regex.match(key)
        if match:
            return None if dst is None else dst.replace("{}", "{}").format(*match.groups())
    raise CheckpointError(f"{where}: unknown key {key!r}: no rule of the key map accounts for it")


def invert(keymap: KeyMap) -> KeyMap:
    """Clover pattern -> source pattern (for export); dropped keys have no inverse."""
    return {dst: src for src, dst in keymap.items() if dst is not None}
