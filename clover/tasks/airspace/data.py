"""Examples and splits: seeded generation, chat rendering, and the external JSONL form.

`generate_examples(split, n, seed)` is deterministic (same arguments, same examples, on any
machine). An `Example` is one scored user turn: one to three messages, the normalised zones they
define (empty for negatives), cancelled ids, gold tool calls, and optionally an earlier turn
(multi-turn with tool results). The external form is one JSON object per line,
`{"id", "text", "zones"?}`; `load_messages_jsonl` reads it and accepts anything `write_jsonl`
writes. Nothing here imports torch or the tokenizer.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover.tasks.airspace.formats import Msg, Turn
from clover.tasks.airspace.msg_aip import aip_area
from clover.tasks.airspace.msg_cn import cn_notice
from clover.tasks.airspace.msg_faa import faa_notam
from clover.tasks.airspace.msg_icao import icao_notam, icao_replace_pair
from clover.tasks.airspace.msg_plain import plain_notice
from clover.tasks.airspace.normalise import Zone
from clover.tasks.airspace.places import SPLITS, airport_pools
from clover.tasks.airspace.tools import (
    NO_ZONE_REPLY,
    SYSTEM_PROMPT,
    TOOLS,
    ZoneRegistry,
    format_call,
)

# Real public messages with hand-made labels (data/README.md): evaluated beside the generated
# splits, never trained on, so not in SPLITS and not drawn by generate_examples.
REAL_DEV = "real-dev"
REAL_DEV_PATH = Path(__file__).resolve().parent / "data" / "real_dev.jsonl"
EVAL_SPLITS = (*SPLITS, REAL_DEV)
BUILDERS = {"icao": icao_notam, "faa": faa_notam, "cn": cn_notice, "plain": plain_notice,
            "aip": aip_area}
FAMILY_WEIGHTS = {"icao": 0.31, "faa": 0.24, "cn": 0.16, "plain": 0.19, "aip": 0.10}
POOL_OF = {"aip": "icao"}  # the AIP entries are written over the ICAO families' airports
MULTI_TURN_P = 0.08
ACK_REPLY = "Done."
# Room for one assistant answer, in tokens: the longest gold answer of any split is 843 tokens
# with the shipped tokenizer (test; 778 in train, 612 in heldout: three NOTAMs with several areas
# and polygons), and a model's own spelling of an answer runs longer (more digits, optional
# fields), so leave 30% on top. A smaller max_tokens cuts right answers, and a cut call is scored
# invalid (tests/test_airspace_data.py).
ANSWER_MAX_TOKENS = 1280


@dataclass(kw_only=True)
class Example:
    """One scored user turn with its ground truth and gold assistant calls."""

    id: str
    text: str
    zones: list[Zone] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    kind: str = "external"
    calls: list[dict] = field(default_factory=list)
    history: list[tuple[str, list[dict]]] = field(default_factory=list)  # (user text, gold calls)
    templates: list[str] = field(default_factory=list)  # wording ids the generator used

    @property
    def is_negative(self) -> bool:
        return not self.zones and not self.cancels

    def messages(self, tools: bool = True, ack: bool = False) -> list[dict]:
        """OpenAI-style conversation ending with the gold assistant turn. `tools=True` puts calls
        in `tool_calls`; `tools=False` writes them as `<tool_call>` text in `content`. `ack=True`
        goes on to the agent's second turn: the gold calls' tool results, then the short closing
        reply (`ACK_REPLY`), as in the history; it needs an example that makes calls."""
        if ack and not self.calls:
            raise ValueError(f"example {self.id}: no calls, so no tool results to acknowledge")
        out: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
        registry = ZoneRegistry()
        turns = [*self.history, (self.text, self.calls)]
        for n, (text, calls) in enumerate(turns):
            out += [{"role": "user", "content": text}, _assistant(calls, tools)]
            if n < len(self.history) or ack:
                out += [_tool_result(call, k, registry, tools) for k, call in enumerate(calls)]
                out.append({"role": "assistant", "content": ACK_REPLY})
        return out

    def chat(self) -> dict:
        """The request/response pair as an OpenAI chat payload: {"messages", "tools"}."""
        return {"messages": self.messages(tools=True), "tools": copy.deepcopy(TOOLS)}

    def to_record(self) -> dict:
        """External JSONL form (plus `cancels` and `kind` when useful)."""
        record: dict[str, Any] = {"id": self.id, "text": self.text}
        record["zones"] = [z.to_dict() for z in self.zones]
        if self.cancels:
            record["cancels"] = list(self.cancels)
        record["kind"] = self.kind
        return record


def _assistant(calls: list[dict], tools: bool) -> dict:
    if not calls:
        return {"role": "assistant", "content": NO_ZONE_REPLY}
    if not tools:
        return {"role": "assistant", "content": assistant_text(calls)}
    tool_calls = [
        {"id": f"call_{k}", "type": "function", "function": {
            "name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
        for k, c in enumerate(calls)
    ]  # fmt: skip
    return {"role": "assistant", "content": "", "tool_calls": tool_calls}


def _tool_result(call: dict, k: int, registry: ZoneRegistry, tools: bool) -> dict:
    msg = {"role": "tool", "content": registry.execute(call)}
    if tools:
        msg["tool_call_id"] = f"call_{k}"
    return msg


def assistant_text(calls: list[dict]) -> str:
    """The gold assistant output as the model emits it (empty calls -> the short no-zone reply)."""
    return "\n".join(format_call(c) for c in calls) if calls else NO_ZONE_REPLY


def reference_calls(example: Example) -> list[dict]:
    """Gold tool calls ({"name", "arguments"}) for the final turn: the SFT assistant target."""
    return copy.deepcopy(example.calls)


# ---- generation --------------------------------------------------------------------------------


def generate_examples(split: str, n: int, seed: int = 0) -> list[Example]:
    """`n` examples of `split` (train / validation / test / heldout); deterministic in the args."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split == REAL_DEV:
        raise ValueError(f"{REAL_DEV!r} is real messages, not generated: use split_examples")
    pools = airport_pools(split)
    rng = random.Random(f"airspace:{split}:{seed}")
    families = [f for f in FAMILY_WEIGHTS if pools[POOL_OF.get(f, f)]]
    weights = [FAMILY_WEIGHTS[f] for f in families]
    if not families:
        raise ValueError(f"split {split!r} has no airports")
    turn = Turn(rng=rng, pools=pools, heldout=split == "heldout")
    return [_example(turn, f"{split}-{seed}-{i:06d}", families, weights) for i in range(n)]


def _example(turn: Turn, ex_id: str, families: list[str], weights: list[float]) -> Example:
    rng = turn.rng
    turn.next_zone = 1
    turn.used = []
    if "icao" in families and rng.random() < MULTI_TURN_P:
        first, second = icao_replace_pair(turn)
        return _combine(ex_id, [second], history=[(first.text, first.calls)])
    k = rng.choices((1, 2, 3), (0.75, 0.17, 0.08))[0]
    msgs = []
    for f in rng.choices(families, weights, k=k):
        turn.used = []
        msgs.append(BUILDERS[f](turn))
    return _combine(ex_id, msgs)


def _combine(ex_id: str, msgs: list[Msg], history: list | None = None) -> Example:
    return Example(
        id=ex_id, text="\n\n".join(m.text for m in msgs),
        zones=[z for m in msgs for z in m.zones], cancels=[c for m in msgs for c in m.cancels],
        kind="+".join(m.kind for m in msgs), calls=[c for m in msgs for c in m.calls],
        history=history or [], templates=[x for m in msgs for x in m.templates],
    )  # fmt: skip


def split_examples(split: str, n: int, seed: int = 0) -> list[Example]:
    """`n` examples of any split `clover eval` / `bench` / `demo` take: a generated one, or the
    first `n` of the hand-labelled real messages (`real-dev`; the seed does not apply)."""
    if split == REAL_DEV:
        return load_messages_jsonl(REAL_DEV_PATH)[:n]
    return generate_examples(split, n, seed)


# ---- external JSONL ----------------------------------------------------------------------------


def example_from_record(record: Any, line: int = 0) -> Example:
    """{"id", "text", "zones"?, "cancels"?} -> Example; ValueError names the line on bad input."""
    where = f"line {line}: " if line else ""
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"{where}each record needs a string 'text'")
    try:
        zones = [Zone.from_dict(z) for z in record.get("zones") or []]
    except ValueError as e:
        raise ValueError(f"{where}bad zone: {e}") from None
    return Example(id=str(record.get("id", line)), text=record["text"], zones=zones,
                   cancels=[str(c) for c in record.get("cancels") or []],
                   kind=str(record.get("kind", "external")))  # fmt: skip


def load_messages_jsonl(path: str | Path) -> list[Example]:
    """Read the external form (one JSON object per line; blank lines skipped)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}: line {i} is not valid JSON") from None
            examples.append(example_from_record(record, i))
    return examples


def write_jsonl(records: list[Any], path: str | Path | None = None) -> str:
    """Write Examples (as `to_record`) or plain dicts, one JSON per line; returns the text."""
    lines = [json.dumps(r.to_record() if isinstance(r, Example) else r, ensure_ascii=False)
             for r in records]  # fmt: skip
    text = "".join(line + "\n" for line in lines)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


__all__ = ["SPLITS", "EVAL_SPLITS", "REAL_DEV", "Example", "generate_examples", "split_examples",
           "reference_calls", "load_messages_jsonl", "write_jsonl", "assistant_text",
           "example_from_record"]  # fmt: skip
