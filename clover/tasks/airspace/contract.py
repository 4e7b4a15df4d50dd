"""The argument contract as JSON Schema: tools that allow every value the scorer reads, no other.

`TOOLS` (in `tools.py`) is what the model is shown: short schemas with plain `string` and `number`
types. `strict_tools()` is what a grammar enforces: the same tools with patterns, ranges and
`anyOf` branches drawn from the parsers in `normalise.py`, so a call that matches its schema is
one `interpret_call` accepts. `tool_constraint()` wraps them as `SamplingParams.structured`. Under
`clover eval airspace --grammar` every call the model closes is therefore valid by construction,
whatever the model is.

- `centre`: coordinates in every layout `parse_centre` reads (packed DDMMSS / DDMM / decimal,
  spaced or with degree symbols, hemisphere first or last, the Chinese 北纬/东经 form, signed
  decimals), with degrees, minutes and seconds in range; or an ICAO code or Chinese airport name
  the task can name (`place_names`).
- `start` / `end`: a real calendar date and time, as the message writes it (NOTAM `YYMMDDHHMM`,
  Chinese `2024年4月3日14时30分`, English `14:00 UTC on 8 November 2025` and two more) or ISO
  with UTC `Z` or an offset of at most 14 hours; null.
- `radius`: a positive number below 2,000 km in NM, KM or M.
- `lower` / `upper`: `SFC`, `UNL`, a flight level, or a value in FT or M with its reference.

Not enforced (the scorer does not need them): that a zone id looks like a NOTAM number, and that
`replaces` is given when `action` is `replace`.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from clover.tasks.airspace.normalise import LENGTH_UNITS, MAX_RADIUS_M, MONTHS
from clover.tasks.airspace.tools import TOOLS

# ---- coordinates ---------------------------------------------------------------------------------
# Regex pieces (JSON Schema `pattern` dialect: no lookaround, no backreferences).
_FRAC = r"(\.[0-9]{1,6})?"
_MIN = "[0-5][0-9]"  # minutes and seconds: 00-59
_LAT_DEG = "[0-8]?[0-9]"  # 0-89 (a pole is no place for a drone zone)
_LON_DEG = "(1[0-7][0-9]|0?[0-9]?[0-9])"  # 0-179, padded or not
# One number with a hemisphere: packed DD[MM[SS]] / DDD[MM[SS]] (parse_centre's _unpack) or
# plain degrees of fewer digits, decimals on the last field only.
_LAT_PACKED = f"([0-8][0-9]({_MIN}({_MIN})?)?|[0-9]){_FRAC}"
_LON_PACKED = f"((1[0-7][0-9]|0[0-9][0-9])({_MIN}({_MIN})?)?|[0-9]?[0-9]){_FRAC}"
# Two or three numbers: degrees, minutes[, seconds], each followed by a symbol or a space.
_SEP_DEG = "(°|° | )"
_SEP_MIN = "(′|'|′ |' | )"
_END_SEC = "(″|\"|'')?"


def _dms(deg: str) -> str:
    return f"{deg}{_SEP_DEG}{_MIN}({_FRAC}|{_SEP_MIN}{_MIN}{_FRAC}{_END_SEC})"


def _part(packed: str, deg: str) -> str:
    """One coordinate's value: packed, or degrees and minutes (and seconds) with separators."""
    return f"(({packed})°?|{_dms(deg)}|{_dms(deg)}′)"


_LAT = _part(_LAT_PACKED, _LAT_DEG)
_LON = _part(_LON_PACKED, _LON_DEG)
_BETWEEN = "( |, |,|/| / |、|)"
_HEMI_LAST = f"{_LAT} ?[NS]{_BETWEEN}{_LON} ?[EW]"
_HEMI_FIRST = f"([NS] ?|北纬|南纬){_LAT}{_BETWEEN}([EW] ?|东经|西经){_LON}"
_SIGNED = f"[-+]?{_LAT_DEG}{_FRAC}(, |,| ){'[-+]?'}{_LON_DEG}{_FRAC}"
COORDINATES = f"^({_HEMI_LAST}|{_HEMI_FIRST}|{_SIGNED})$"

# ---- times ---------------------------------------------------------------------------------------
# ISO, and the spellings messages use (parse_time reads all of them); every date is a real one.
_DAYS = {1: 31, 2: 28, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
_LEAP_YY = "([02468][048]|[13579][26])"  # 2000-2099: leap when YY % 4 == 0


def _days(last: int, pad: bool) -> str:
    """Day numbers 1..last (28, 30 or 31), zero-padded or not."""
    first = "0[1-9]" if pad else "[1-9]"
    tail = {31: "2[0-9]|3[01]", 30: "2[0-9]|30", 28: "2[0-8]"}[last]
    return f"({first}|1[0-9]|{tail})"


def _dates(month: Any, day_first: bool, pad: bool, sep: str = "") -> str:
    """Every valid (month, day) pair but 29 February: `month(m)` spells month m."""
    alts = []
    for last in (31, 30, 28):
        months = "|".join(month(m) for m, n in _DAYS.items() if n == last)
        d = _days(last, pad)
        alts.append(f"{d}{sep}({months})" if day_first else f"({months}){sep}{d}")
    return f"({'|'.join(alts)})"


_MONTH_DAY = _dates(lambda m: f"{m:02d}", False, True, "-")
_LEAP_DAY = f"20{_LEAP_YY}-02-29"
_CLOCK = "(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)"
_ZONE = "(Z|[-+](0[0-9]|1[0-4]):[0-5][0-9])"
_ISO_TIME = f"(20[0-9][0-9]-{_MONTH_DAY}|{_LEAP_DAY})T{_CLOCK}{_ZONE}"
# NOTAM YYMMDDHHMM (UTC)
_NOTAM_TIME = (f"([0-9][0-9]{_dates(lambda m: f'{m:02d}', False, True)}|{_LEAP_YY}0229)"
               "(([01][0-9]|2[0-3])[0-5][0-9]|2400)")
# Chinese (UTC+8): 2024年4月3日14时[30分], 24时 without minutes
_CN_DATE = (f"(20[0-9][0-9]年{_dates(lambda m: f'{m}月', False, False)}日"
            f"|20{_LEAP_YY}年2月29日)")
_CN_TIME = f"{_CN_DATE}(([0-9]|1[0-9]|2[0-3])时([1-5]?[0-9]分)?|24时)"
# English (UTC): 14:00 UTC on 8 November 2025 | 8 November 2025 1400Z | 1400 UTC 8 NOV 2025


def _en_date(month: Any) -> str:
    return (f"({_dates(month, True, False, ' ')} 20[0-9][0-9]"
            f"|29 {month(2)} 20{_LEAP_YY})")


_EN_FULL = _en_date(lambda m: MONTHS[m - 1])
_EN_ABBR = _en_date(lambda m: MONTHS[m - 1][:3].upper())
_HHMM = "([01][0-9]|2[0-3])[0-5][0-9]"
_HH_MM = "([01][0-9]|2[0-3]):[0-5][0-9]"
# and a local one with the offset the message states: 20:00 on 15 May 2025 UTC+01:00
_EN_LOCAL = f"{_HH_MM} on {_EN_FULL} UTC[-+](0[0-9]|1[0-4]):[0-5][0-9]"
_EN_TIME = f"({_HH_MM} UTC on {_EN_FULL}|{_EN_FULL} {_HHMM}Z|{_HHMM} UTC {_EN_ABBR}|{_EN_LOCAL})"
TIME = f"^({_ISO_TIME}|{_NOTAM_TIME}|{_CN_TIME}|{_EN_TIME})$"

# ---- the schemas ---------------------------------------------------------------------------------
_HEIGHT = {"type": "number", "minimum": 0, "maximum": 999999}
_LIMIT = {"anyOf": [
    {"type": "object", "properties": {"value": _HEIGHT, "unit": {"enum": ["FT", "M"]},
                                      "ref": {"enum": ["SFC", "AMSL", "AGL"]}},
     "required": ["value", "unit", "ref"], "additionalProperties": False},
    {"type": "object", "properties": {"value": _HEIGHT, "unit": {"const": "FL"},
                                      "ref": {"const": "STD"}},
     "required": ["value", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"unit": {"const": "UNL"}},
     "required": ["unit"], "additionalProperties": False},
]}
_TIME = {"anyOf": [{"type": "string", "pattern": TIME}, {"type": "null"}]}


@cache
def place_names() -> tuple[str, ...]:
    """Every place the task's messages name instead of coordinates: the ICAO codes of all
    splits' airports and the Chinese airport names, each of which `resolve_place` knows."""
    from clover.tasks.airspace.places import CN_AIRPORTS, SPLITS, airport_pools

    codes = {a["icao"] for split in SPLITS for pool in airport_pools(split).values()
             for a in pool}
    return tuple(sorted(codes)) + tuple(names[0] for names in CN_AIRPORTS.values())


@cache
def strict_tools() -> list[dict]:
    """`TOOLS` with the contract enforced: a zone is a circle (`centre` + `radius`) or a polygon
    (`polygon`: 3 to 40 vertices), one `anyOf` branch each. Cached: callers must not mutate it."""
    tools = copy.deepcopy(TOOLS)
    props: dict[str, Any] = dict(tools[0]["function"]["parameters"]["properties"])
    props["zone_id"] = {"type": "string", "minLength": 1, "maxLength": 40}
    props["label"] = {"type": "string", "maxLength": 80}
    centre = {"anyOf": [{"type": "string", "pattern": COORDINATES},
                        {"enum": list(place_names())}]}
    radius = {"anyOf": [
        {"type": "object",
         "properties": {"value": {"type": "number", "exclusiveMinimum": 0,
                                  "exclusiveMaximum": MAX_RADIUS_M / LENGTH_UNITS[unit]},
                        "unit": {"const": unit}},
         "required": ["value", "unit"], "additionalProperties": False}
        for unit in ("NM", "KM", "M")]}  # fmt: skip
    props["polygon"] = {"type": "array", "items": {"type": "string", "pattern": COORDINATES},
                        "minItems": 3, "maxItems": 40}
    props["lower"], props["upper"] = _LIMIT, _LIMIT
    props["start"], props["end"] = _TIME, _TIME
    props["schedule"] = {"type": "string", "minLength": 1, "maxLength": 80}
    props["action"] = {"enum": ["create", "replace", "delete"]}
    props["replaces"] = {"type": "string", "minLength": 1, "maxLength": 40}
    props["centre"], props["radius"] = centre, radius
    # in TOOLS' order in both branches: a grammar keeps properties in the order listed
    circle = {"type": "object", "properties": {k: v for k, v in props.items() if k != "polygon"},
              "required": ["zone_id", "centre", "radius"], "additionalProperties": False}
    polygon = {"type": "object", "required": ["zone_id", "polygon"], "additionalProperties": False,
               "properties": {k: v for k, v in props.items() if k not in ("centre", "radius")}}
    tools[0]["function"]["parameters"] = {"anyOf": [circle, polygon]}
    clear = tools[1]["function"]["parameters"]
    clear["properties"]["zone_id"] = {"type": "string", "minLength": 1, "maxLength": 40}
    clear["additionalProperties"] = False
    return tools


GRAMMAR_HELP = ("constrain every turn to text or tool calls that keep the task's argument "
                "contract (clover.tasks.airspace.contract): every call is valid; the same "
                "grammar for any message")


def add_grammar_flag(parser: Any) -> None:
    """`--grammar` on an argparse parser (eval, demo and bench share this one definition)."""
    parser.add_argument("--grammar", action="store_true", help=GRAMMAR_HELP)


def tool_constraint() -> dict[str, Any]:
    """`SamplingParams.structured` for any airspace turn: text, or calls that keep the contract.
    The same for every message: it says what a valid call looks like, never which values."""
    return {"tools": strict_tools(), "tool_choice": "auto"}
