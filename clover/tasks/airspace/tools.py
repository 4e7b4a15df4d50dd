"""The agent's tools: JSON Schemas (OpenAI function format), call parsing and execution.

Argument contract (what the model emits, kept a near-copy of the message text because tiny models
copy digits well and do arithmetic badly):
- `centre`: the centre exactly as written in the message (`512107N 0003608W`, `N320604E0344856`,
  `北纬31°08′36″、东经121°48′18″`, `51.47002, -0.45430`) or, when a notice names a place instead,
  the airport name or ICAO code as written; `normalise.parse_centre` reads every form.
- `polygon` (instead of centre and radius): the vertices, each as written; a closing repeat of
  the first is dropped. The zone is kept as its vertices plus an enclosing circle.
- `schedule`: the active hours inside start-end as written (NOTAM D) `MON-FRI 0800-1600`);
  start and end stay the B) and C) window.
- `radius`: `{"value": 0.5, "unit": "NM"|"KM"|"M"}` (MTR, 米 -> M; 公里 -> KM).
- `lower`/`upper`: `{"value", "unit": "FT"|"M"|"FL", "ref": "SFC"|"AMSL"|"AGL"|"STD"}` or
  `{"unit": "UNL"}`; omitted when the message states no limit (defaults: SFC and UNL).
- `start`/`end`: the time as the message writes it (NOTAM `2603220630`, `2024年4月3日14时30分`,
  `14:00 UTC on 8 November 2025`); a Chinese end that leaves out its date or year takes the
  start's (`至16时` -> `2024年4月3日16时`). ISO `YYYY-MM-DDTHH:MM` + `Z` or an offset (`+08:00`)
  is read too, `24:00` allowed; null for PERM / not stated. Reordering, the Chinese UTC+8 and
  offsets are applied in code (`normalise.parse_time`), not by the model.
- `action` is `create` (default, omitted) or `replace` with `replaces`; a cancellation is
  `clear_zone`. This module never raises on model output: bad calls come back as error strings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from clover.tasks.airspace.normalise import (
    Zone,
    close_polygon,
    enclosing_circle,
    parse_centre,
    parse_limit,
    parse_radius,
    parse_schedule,
    parse_time,
)
from clover.tokenizer import TOOL_CALL_CLOSE, json_call_end

_LIMIT_SCHEMA = {
    "type": "object",
    "properties": {
        "value": {"type": "number"},
        "unit": {"type": "string", "enum": ["FT", "M", "FL", "UNL"]},
        "ref": {"type": "string", "enum": ["SFC", "AMSL", "AGL", "STD"]},
    },
    "required": ["unit"],
}
_TIME_SCHEMA = {"type": ["string", "null"],
                "description": "as written (2603220630), or YYYY-MM-DDTHH:MMZ / +HH:MM"}

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "set_no_fly_zone",
            "description": "Create or replace a no-fly zone for drones: a circle or a polygon.",
            "parameters": {
                "type": "object",
                "properties": {
                    "zone_id": {"type": "string", "description": "NOTAM number, or Z1, Z2..."},
                    "label": {"type": "string"},
                    "centre": {"type": "string", "description": "centre as written"},
                    "polygon": {"type": "array", "items": {"type": "string"},
                                "description": "vertices as written (instead of centre, radius)"},
                    "radius": {
                        "type": "object",
                        "properties": {
                            "value": {"type": "number"},
                            "unit": {"type": "string", "enum": ["NM", "KM", "M"]},
                        },
                        "required": ["value", "unit"],
                    },
                    "lower": _LIMIT_SCHEMA,
                    "upper": _LIMIT_SCHEMA,
                    "start": _TIME_SCHEMA,
                    "end": _TIME_SCHEMA,
                    "schedule": {"type": "string", "description": "active hours as written"},
                    "action": {"type": "string", "enum": ["create", "replace", "delete"]},
                    "replaces": {"type": "string"},
                },
                "required": ["zone_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "clear_zone",
            "description": "Remove a zone whose NOTAM was cancelled.",
            "parameters": {
                "type": "object",
                "properties": {"zone_id": {"type": "string"}},
                "required": ["zone_id"],
            },
        },
    },
]
TOOL_NAMES = ("set_no_fly_zone", "clear_zone")

SYSTEM_PROMPT = (
    "You turn airspace restriction messages into drone no-fly zones. For each restricted area, "
    "call set_no_fly_zone once: copy the centre and radius, or a polygon's vertices, values and "
    "times as written (a Chinese end time with its full date), and a D) schedule. Omit limits "
    "that are not stated. Runway, taxiway, obstacle, navaid, bird and procedure notices are no "
    "zone. "
    "For a replacing NOTAM use action replace; for a cancelled one call clear_zone. "
    "If a message defines no zone, make no call."
)
NO_ZONE_REPLY = "No no-fly zone."


@dataclass(frozen=True)
class Cancel:
    """A cancellation: remove zone `zone_id`."""

    zone_id: str


@dataclass(frozen=True)
class ParsedCalls:
    """Tool calls found in one model output: the readable ones and how many were broken."""

    calls: list[dict]
    num_invalid: int


def interpret_call(name: Any, arguments: Any) -> Zone | Cancel:
    """One call -> a normalised Zone (create / replace) or a Cancel; ValueError if invalid."""
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    action = arguments.get("action", "create")
    if name == "clear_zone" or (name == "set_no_fly_zone" and action == "delete"):
        zone_id = arguments.get("zone_id") or arguments.get("replaces")
        if not isinstance(zone_id, str) or not zone_id:
            raise ValueError("clear_zone needs a zone_id")
        return Cancel(zone_id)
    if name != "set_no_fly_zone":
        raise ValueError(f"unknown tool {name!r}: use one of {', '.join(TOOL_NAMES)}")
    if action not in ("create", "replace"):
        raise ValueError(f"action must be create, replace or delete, got {action!r}")
    return normalise_call(arguments)


def normalise_call(arguments: dict) -> Zone:
    """set_no_fly_zone arguments (raw, copied values) -> the normalised Zone. A `polygon` (three or
    more vertices as written) wins over centre and radius: the zone's circle then encloses it."""
    a = arguments
    polygon = _polygon(a["polygon"]) if a.get("polygon") else ()
    if polygon:
        lat, lon, radius_m = enclosing_circle(polygon)
    else:
        lat, lon = _centre(a)
        radius_m = parse_radius(a.get("radius"))
    replaces = a.get("replaces") if a.get("action") == "replace" else None
    if replaces is not None and not isinstance(replaces, str):
        raise ValueError(f"replaces must be a zone id string, got {replaces!r}")
    return Zone(
        lat=lat, lon=lon, radius_m=radius_m, polygon=polygon,
        schedule=parse_schedule(a.get("schedule")),
        lower=parse_limit(a.get("lower", "SFC")), upper=parse_limit(a.get("upper", "UNL")),
        start_utc=parse_time(a.get("start")), end_utc=parse_time(a.get("end")),
        id=str(a.get("zone_id") or ""), replaces=replaces, label=str(a.get("label") or ""),
    )  # fmt: skip


def _centre(a: dict) -> tuple[float, float]:
    if "centre" in a or "center" in a:
        return parse_centre(a.get("centre", a.get("center")))
    if "lat" in a:
        return parse_centre(f"{a.get('lat')}, {a.get('lon')}")
    raise ValueError("set_no_fly_zone needs a centre and radius, or a polygon")


def _polygon(vertices: Any) -> tuple[tuple[float, float], ...]:
    if not isinstance(vertices, list):
        raise ValueError(f"polygon must be a list of vertices as written, got {vertices!r}")
    return close_polygon([parse_centre(v) for v in vertices])


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"not valid JSON: {text[:60]!r}") from None


# ---- parsing model output ----------------------------------------------------------------------

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


def format_call(call: dict) -> str:
    """{"name", "arguments"} -> the text the model emits for it."""
    body = {"name": call["name"], "arguments": call["arguments"]}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"


def parse_tool_calls(output: Any) -> ParsedCalls:
    """Model output (text with <tool_call> blocks, or a list of already parsed calls in either
    {"name", "arguments"} or OpenAI {"function": {...}} form) -> calls + count of broken ones."""
    if isinstance(output, str):
        return _parse_text(output)
    if isinstance(output, dict):
        output = [output]
    if not isinstance(output, list | tuple):
        return ParsedCalls([], 1 if output is not None else 0)
    calls, bad = [], 0
    for item in output:
        call = _as_call(item)
        calls += [call] if call else []
        bad += call is None
    return ParsedCalls(calls, bad)


def _parse_text(text: str) -> ParsedCalls:
    """Each `<tool_call>` block: one JSON value then `</tool_call>` (its strings may hold the
    tags' text, as the grammar allows), else up to the first `</tool_call>` or the end."""
    calls, bad, pos = [], 0, 0
    while (m := _BLOCK.search(text, pos)) is not None:
        end = json_call_end(text, m.start(1))
        body, closed = (text[m.start(1):end - len(TOOL_CALL_CLOSE)], True) if end else m.groups()
        try:
            call = _as_call(json.loads(body)) if closed else None
        except (ValueError, RecursionError):
            call = None
        calls += [call] if call else []
        bad += call is None
        pos = end or m.end()
    return ParsedCalls(calls, bad)


def _as_call(item: Any) -> dict | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name, args = item.get("name"), item.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}


# ---- execution ---------------------------------------------------------------------------------


class ZoneRegistry:
    """In-memory zones keyed by id; `execute` runs one call and returns the tool-result string."""

    def __init__(self) -> None:
        self.zones: dict[str, Zone] = {}

    def execute(self, call: dict) -> str:
        try:
            action = interpret_call(call.get("name"), call.get("arguments"))
        except (ValueError, TypeError, AttributeError) as e:
            return json.dumps({"ok": False, "error": str(e)}, ensure_ascii=False)
        if isinstance(action, Cancel):
            return self._delete(action.zone_id)
        return self._put(action)

    def _put(self, zone: Zone) -> str:
        zone_id = zone.id or f"Z{len(self.zones) + 1}"
        if zone.replaces:
            self.zones.pop(zone.replaces, None)
        self.zones[zone_id] = zone
        result = {"ok": True, "zone_id": zone_id, "radius_m": round(zone.radius_m, 1)}
        if zone.replaces:
            result["replaced"] = zone.replaces
        return json.dumps(result)

    def _delete(self, zone_id: str) -> str:
        if self.zones.pop(zone_id, None) is None:
            return json.dumps({"ok": False, "error": f"no zone {zone_id}"})
        return json.dumps({"ok": True, "cleared": zone_id})
