"""Declarative key maps: foreign checkpoint key patterns -> Clover keys, every key accounted for.

A key map is `{source_pattern: rule}` where `{}` stands for a layer (or expert) index. A rule is
- a Clover pattern (`str`): the tensor is renamed;
- a Clover pattern ending in `[{}]`: the tensor is one slice (along dim 0) of a stacked Clover
  tensor, e.g. expert e of `layers.N.ffn.experts.gate_proj` [E, F, D]; every slice must be present;
- a `Split`: the source tensor is several Clover tensors concatenated along one dim (a fused
  `gate_up_proj`, a fused `query_key_value`); part sizes come from the Clover shapes;
- `None`: dropped on purpose (e.g. RoPE buffers recomputed from the config).
`zeros` names Clover patterns that no source holds and that start at zero (e.g. the expert bias
of a softmax router, which never reads it). `rename` maps names only; `to_clover_state` builds
the Clover state dict and `from_clover_state` the source one, so export is the same map read
backwards. Every failure is a `CheckpointError` naming the key: an unknown source key, a missing
Clover key (or expert slice), two keys onto one, a wrong shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

STACK = "[{}]"  # suffix of a Clover pattern whose tensor is stacked from per-index source keys


@dataclass(frozen=True)
class Split:
    """The source tensor is `parts` (Clover patterns) concatenated along `dim`."""

    parts: tuple[str, ...]
    dim: int = 0

    def __init__(self, *parts: str, dim: int = 0) -> None:
        object.__setattr__(self, "parts", tuple(parts))
        object.__setattr__(self, "dim", dim)

    def format(self, *groups: str) -> Split:
        return Split(*(p.format(*groups) for p in self.parts), dim=self.dim)


Rule = str | Split | None
KeyMap = dict[str, Rule]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded or converted; the message names the file and key."""


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(r"\{\}", r"(\d+)") + "$")


def _target(key: str, compiled: list, where: str) -> Rule:
    for regex, dst in compiled:
        match = regex.match(key)
        if match:
            return None if dst is None else dst.format(*match.groups())
    raise CheckpointError(f"{where}: unknown key {key!r}: no rule of the key map accounts for it")


def _produced(rule: str | Split) -> list[str]:
    """The Clover keys one resolved rule writes (a stacked slice writes its whole tensor)."""
    if isinstance(rule, Split):
        return list(rule.parts)
    return [rule.rsplit("[", 1)[0] if rule.endswith("]") else rule]


def rename(keys: Iterable[str], keymap: KeyMap, expected: Iterable[str], *,
           where: str = "checkpoint") -> dict[str, str | Split]:
    """{source key: resolved rule} for every kept key; dropped keys are left out.

    Raises CheckpointError for a source key that matches no pattern (unknown), for two source
    keys landing on one Clover key, and for an expected Clover key that no source key produced.
    """
    compiled = [(_compile(src), dst) for src, dst in keymap.items()]
    out: dict[str, str | Split] = {}
    seen: set[str] = set()  # Clover keys written so far
    slices: set[str] = set()  # stacked slices written so far ("key[i]")
    for key in keys:
        target = _target(key, compiled, where)
        if target is None:
            continue
        clash = target in slices if isinstance(target, str) and target.endswith("]") else (
            seen & set(_produced(target)))
        if clash:
            raise CheckpointError(f"{where}: two keys map onto {target!r} (one is {key!r})")
        out[key] = target
        seen.update(_produced(target))
        if isinstance(target, str) and target.endswith("]"):
            slices.add(target)
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(f"{where}: missing key for {missing[0]!r} "
                              f"({len(missing)} missing in all)")
    return out


def invert(keymap: KeyMap) -> KeyMap:
    """Clover pattern -> source pattern for plain renames and stacked slices (for export)."""
    return {dst: src for src, dst in keymap.items() if isinstance(dst, str)}


# ---- tensors ------------------------------------------------------------------------------------

def to_clover_state(tensors: Mapping[str, torch.Tensor], keymap: KeyMap,
              expected: Mapping[str, torch.Tensor], *, zeros: Iterable[str] = (),
              where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The Clover state dict (every key of `expected`, same shapes) from source tensors."""
    filled = _zero_keys(expected, zeros)
    names = rename(tensors, keymap, set(expected) - set(filled), where=where)
    state = {k: torch.zeros_like(expected[k], device="cpu") for k in filled}
    slices: dict[str, dict[int, torch.Tensor]] = {}
    for src, rule in names.items():
        if isinstance(rule, Split):
            sizes = [expected[p].shape[rule.dim] for p in rule.parts]
            _check_split(tensors[src], sizes, rule, src, where)
            state.update(zip(rule.parts, torch.split(tensors[src], sizes, rule.dim), strict=True))
        elif rule.endswith("]"):
            stacked, index = rule[:-1].rsplit("[", 1)
            slices.setdefault(stacked, {})[int(index)] = tensors[src]
        else:
            state[rule] = tensors[src]
    unexpected = sorted(set(state) - set(expected)) + sorted(set(slices) - set(expected))
    if unexpected:
        source = next(s for s, r in names.items() if unexpected[0] in _produced(r))
        raise CheckpointError(f"{where}: unexpected key {source!r}: it maps onto "
                              f"{unexpected[0]!r}, which this config does not have")
    for key, parts in slices.items():
        state[key] = _stack(key, parts, expected[key].shape[0], where)
    _check_shapes(state, expected, where)
    return state


def from_clover_state(state: Mapping[str, torch.Tensor], keymap: KeyMap, *,
                      zeros: Iterable[str] = (), where: str = "checkpoint",
                      ) -> dict[str, torch.Tensor]:
    """The source-named tensors for a Clover state dict: `to_clover_state` read backwards."""
    state = dict(state)
    for key in _zero_keys(state, zeros):
        if state.pop(key).count_nonzero():
            raise CheckpointError(f"{where}: {key!r} is not zero; the target format has no "
                                  "place for it")
    out = _join_splits(state, keymap, where)
    stacked = [_compile(p[:-len(STACK)]) for p in invert(keymap) if p.endswith(STACK)]
    flat: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if any(regex.match(key) for regex in stacked):
            flat.update({f"{key}[{i}]": t for i, t in enumerate(tensor.unbind(0))})
        else:
            flat[key] = tensor
    names = rename(flat, invert(keymap), [], where=where)
    out.update({names[k]: v.contiguous() for k, v in flat.items()})
    return out


def _join_splits(state: dict[str, torch.Tensor], keymap: KeyMap,
                 where: str) -> dict[str, torch.Tensor]:
    """Concatenate the Clover parts of every Split rule (removing them from `state`)."""
    out = {}
    for src, rule in keymap.items():
        if not isinstance(rule, Split):
            continue
        first = _compile(rule.parts[0])
        for key in [k for k in state if first.match(k)]:
            groups = first.match(key).groups()
            parts = rule.format(*groups).parts
            absent = [p for p in parts if p not in state]
            if absent:
                raise CheckpointError(f"{where}: missing key {absent[0]!r} (part of {src!r})")
            out[src.format(*groups)] = torch.cat([state.pop(p) for p in parts], rule.dim)
    return out


def _zero_keys(keys: Iterable[str], zeros: Iterable[str]) -> list[str]:
    compiled = [_compile(z) for z in zeros]
    return [k for k in keys if any(regex.match(k) for regex in compiled)]


def _stack(key: str, parts: dict[int, torch.Tensor], count: int, where: str) -> torch.Tensor:
    absent = sorted(set(range(count)) - set(parts))
    if absent:
        raise CheckpointError(f"{where}: missing key for {key}[{absent[0]}] "
                              f"({len(absent)} of {count} slices missing)")
    extra = sorted(set(parts) - set(range(count)))
    if extra:
        raise CheckpointError(f"{where}: unexpected slice {key}[{extra[0]}]: the config has "
                              f"{count}")
    return torch.stack([parts[i] for i in range(count)])


def _check_split(tensor: torch.Tensor, sizes: list[int], rule: Split, src: str,
                 where: str) -> None:
    if tensor.ndim <= rule.dim % max(tensor.ndim, 1) or tensor.shape[rule.dim] != sum(sizes):
        raise CheckpointError(f"{where}: key {src!r} has shape {tuple(tensor.shape)}; splitting it "
                              f"into {rule.parts} needs {sum(sizes)} along dim {rule.dim}")


def _check_shapes(state: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                  where: str) -> None:
    for key, like in expected.items():
        if tuple(state[key].shape) != tuple(like.shape):
            raise CheckpointError(f"{where}: key {key!r} has shape {tuple(state[key].shape)}, "
                                  f"the config expects {tuple(like.shape)}")
