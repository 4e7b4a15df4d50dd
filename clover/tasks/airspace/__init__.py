"""The airspace-restriction task: realistic messages over real airports, no-fly-zone tools, scorer.

Public API (training, demo and bench code against this, not the submodules):
`generate_examples`, `split_examples` (any split, `real-dev` included), `Example`,
`reference_calls`, `assistant_text`, `TOOLS`, `SYSTEM_PROMPT`, `normalise_call`, `interpret_call`,
`parse_tool_calls`, `ZoneRegistry`, `Zone`, `score`, `load_messages_jsonl`, `write_jsonl`.
Argument format, time handling and defaults are documented in `tools.py`; unit conversions in
`normalise.py`; splits in `places.py`; the real dev set in `data/README.md`.
"""

from clover.tasks.airspace.data import (
    ANSWER_MAX_TOKENS,
    EVAL_SPLITS,
    REAL_DEV,
    Example,
    assistant_text,
    example_from_record,
    generate_examples,
    load_messages_jsonl,
    reference_calls,
    split_examples,
    write_jsonl,
)
from clover.tasks.airspace.normalise import Limit, Zone, parse_centre
from clover.tasks.airspace.places import SPLITS
from clover.tasks.airspace.scorer import read_prediction, score
from clover.tasks.airspace.tools import (
    NO_ZONE_REPLY,
    SYSTEM_PROMPT,
    TOOLS,
    Cancel,
    ZoneRegistry,
    interpret_call,
    normalise_call,
    parse_tool_calls,
)

__all__ = [
    "SPLITS", "TOOLS", "SYSTEM_PROMPT", "NO_ZONE_REPLY", "Example", "Zone", "Limit", "Cancel",
    "ZoneRegistry", "generate_examples", "reference_calls", "assistant_text", "normalise_call",
    "interpret_call", "parse_tool_calls", "parse_centre", "score", "read_prediction",
    "load_messages_jsonl", "write_jsonl", "example_from_record", "ANSWER_MAX_TOKENS",
    "EVAL_SPLITS", "REAL_DEV", "split_examples",
]  # fmt: skip
