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
import re
from functools import cache
from typing import Any

from clover.grammar.tools import ordered_calls_lark
from clover.tasks.airspace.normalise import (
    LENGTH_UNITS,
    MAX_RADIUS_M,
    MONTHS,
    parse_centre,
    parse_time,
)
from clover.tasks.airspace.tools import TOOLS
from clover.tokenizer import normalize_tool_call

ZONE_TOOL, CLEAR_TOOL = (t["function"]["name"] for t in TOOLS)
# The task's text replies are one short sentence ("Done.", "No no-fly zone."): under the turn
# grammar a turn's text is at most this long, so a model that wants a call the grammar no longer
# allows cannot fill max_tokens with text instead.
REPLY_MAX_CHARS = 200

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


# ---- grounded: the contract narrowed to one turn's messages --------------------------------------
# Values a call copies must be written in the messages it answers: the centre one of their
# coordinate spans or place names, a time one of their time spans, a radius or limit one of their
# numbers. The candidates come from the message text alone (never from a gold answer); the model
# still decides which zones there are and which value goes where. Two layers: per call
# (`grounded_tools`: plain tools, which a server client can send) and per turn
# (`grounded_constraint`: a Lark grammar whose calls follow the message's centres and cancelled
# ids in the order written, each once, `turn_slots`).
_COORD_SPAN = re.compile(COORDINATES[1:-1])  # unanchored: fullmatch(text, pos, endpos) works
_TIME_SPAN = re.compile(TIME[1:-1])
_UTC_OFFSET = re.compile(r"UTC([-+]\d{2}:\d{2})")
_EN_LOCAL_SPAN = re.compile(r"\b\d{2}:\d{2} on \d{1,2} [A-Z][a-z]+ \d{4}")
_CN_FULL_SPAN = re.compile(r"(20\d\d)年(\d{1,2})月(\d{1,2})日\d{1,2}时(?:\d{1,2}分)?")
_CN_PART_SPAN = re.compile(r"(?<![\d日年])(?:(\d{1,2})月(\d{1,2})日)?\d{1,2}时(?:\d{1,2}分)?")
_NUMBER_SPAN = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+|\d+)?(\.\d+)?")
_ICAO_SPAN = re.compile(r"\b[A-Z]{4}\b")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_GLUED = re.compile(r"[A-Za-z0-9]")  # what may not touch a centre
# units as messages write them right after a number (`10NM`, `2 km`, `150 m`, `半径1.5公里`)
_METRES = r"MTR|M|m|metres?|meters?|米"
_RADIUS_UNITS = {"NM": r"NMR|NM|nautical miles?|海里",
                 "KM": r"KM|km|kilometres?|kilometers?|公里|千米", "M": _METRES}
_HEIGHT_UNITS = {"FT": r"FT|ft|feet|foot", "M": _METRES}
_FLIGHT_LEVEL_SPAN = re.compile(r"\bFL ?(\d{1,3})\b")
# a number written as a radius is not a height; a height's reference written after it
_RADIUS_BEFORE = re.compile(r"(半径|(?i:radius):? ?|\bWI ?|\bwithin ?)$")
# `8.6NM WNW VLD`: a distance and bearing from a reference point, not a radius
_BEARING_AFTER = re.compile(r" (N|NNE|NE|ENE|E|ESE|SE|SSE|S|SSW|SW|WSW|W|WNW|NW|NNW)\b")
_RADIUS_AFTER = re.compile(r" ?(?i:radius)\b")
_REFS = {"AGL": "AGL", "above ground level": "AGL", "AMSL": "AMSL", "MSL": "AMSL",
         "above mean sea level": "AMSL"}
_REF_AFTER = re.compile(r" ?(" + "|".join(_REFS) + r")\b")
_HEIGHT_BEFORE = "真高"  # "true height": above ground level
_ITEM_BREAK = re.compile(r"\n|；|;|, AND ")  # between the items of a list of zones
_UNLIMITED = re.compile(r"\bUNL(?:IMITED)?\b|unlimited")
_REPLACE_SPAN = re.compile(r"\bNOTAMR +([A-Z]\d{4}/\d{2})\b")
_CANCEL_SPAN = re.compile(r"\b(?:NOTAMC|CNL|CANCEL(?:S|LED)?) +([A-Z]\d{4}/\d{2})\b")


def _spans(pattern: re.Pattern, text: str, longest: int = 64) -> set[str]:
    """Spans of `text` that `pattern` matches, each the longest one at its start (Python's `re`
    takes the first alternative that matches, which can stop a coordinate at its degrees)."""
    out, pos = set(), 0
    while m := pattern.search(text, pos):
        end = next((e for e in range(min(len(text), m.start() + longest), m.end(), -1)
                    if pattern.fullmatch(text, m.start(), e)), m.end())
        if end > m.start():
            out.add(text[m.start():end].strip())
        pos = max(end, m.start() + 1)
    return out - {""}


def centre_candidates(text: str) -> list[str]:
    """Coordinate spans and place names (ICAO codes, Chinese airport names) written in `text`."""
    spans = _spans(_COORD_SPAN, text)
    names = set(place_names())
    spans |= {m.group(0) for m in _ICAO_SPAN.finditer(text) if m.group(0) in names}
    spans |= {n for n in names if not n.isascii() and n in text}
    # two bare integers ("26 020", "1,50") are dates and counts far more often than a centre
    spans = {s for s in spans if not re.fullmatch(r"[-+]?\d+(, |,| )[-+]?\d+", s)}
    # a centre stands alone: `4912N06754W` glued to the Q-line's radius (`4912N06754W002`) or
    # to other letters is part of something else
    return sorted(s for s in spans if _occurrences(s, text) and _parses(s))


def _occurrences(span: str, text: str) -> list[int]:
    """Where `span` is written in `text` standing alone (no ASCII letter or digit glued on)."""
    return [m.start() for m in re.finditer(re.escape(span), text)
            if not _GLUED.match(text[m.start() - 1:m.start()]) and not _GLUED.match(text, m.end())]


def time_candidates(text: str) -> list[str]:
    """Time spans written in `text`; each Chinese end completed with a start's date; each English
    local time with an offset the text states (`local time (UTC+01:00)`)."""
    return sorted(time_positions(text))


def time_positions(text: str) -> dict[str, int]:
    """`time_candidates` -> where `text` first writes each (a completed Chinese end or a local
    time with its offset: where its written part is)."""
    spans = {span: text.find(span) for span in _spans(_TIME_SPAN, text)}
    for full in _CN_FULL_SPAN.finditer(text):
        year, month, day = (int(g) for g in full.groups())
        for part in _CN_PART_SPAN.finditer(text, full.end()):
            p = part.group(0)
            if part.group(1) is None:
                spans.setdefault(f"{year}年{month}月{day}日{p}", part.start())
            else:
                later = int(part.group(1)) < month  # December to January: the next year
                spans.setdefault(f"{year + later}年{p}", part.start())
    offsets = set(_UTC_OFFSET.findall(text))
    for local in _EN_LOCAL_SPAN.finditer(text):
        for off in offsets:
            spans.setdefault(f"{local.group(0)} UTC{off}", local.start())
    # sorted: `_spans` is a set, and the grammar built from these must not depend on hashing
    return {s: pos for s, pos in sorted(spans.items()) if _TIME_SPAN.fullmatch(s)}


def number_candidates(text: str) -> list[float | int]:
    """Every number written in `text` (`.3` is 0.3, `1,200` is 1200, `FL095` gives 95)."""
    return sorted({_number(m.group(0)) for m in _NUMBER_SPAN.finditer(text)
                   if any(c.isdigit() for c in m.group(0))})


def radius_candidates(text: str) -> dict[str, list[float | int]]:
    """Numbers `text` writes with a length unit right after them (`10NM`, `2 km`, `300 metres`,
    `半径1.5公里`), by the contract's radius unit, not a height (`真高300米`, `150 m AGL`) nor a
    distance and bearing from a reference point (`8.6NM WNW VLD`); empty when it writes none."""
    out: dict[str, set] = {}
    for m in _unit_span(tuple(_RADIUS_UNITS.values())).finditer(text):
        if (text[:m.start()].endswith(_HEIGHT_BEFORE) or _REF_AFTER.match(text, m.end())
                or _BEARING_AFTER.match(text, m.end())):
            continue
        unit = next(u for u, words in _RADIUS_UNITS.items() if re.fullmatch(words, m.group(2)))
        out.setdefault(unit, set()).add(_number(m.group(1)))
    return {u: sorted(vs) for u, vs in out.items()}


def height_candidates(text: str) -> dict[str, list[float | int]]:
    """Numbers `text` writes as heights, by unit: with feet or metres right after them
    (`500FT`, `1200 feet`, `150 m`, `真高300米`) or after a flight level (`FL125`, `FL 095`);
    not a radius (`半径100米`, `RADIUS 2000MTR`, `250M RADIUS`, `within 300 m`); empty when it
    writes none."""
    out: dict[str, set] = {}
    for unit, value, _ in height_mentions(text):
        out.setdefault(unit, set()).add(value)
    return {u: sorted(vs) for u, vs in out.items()}


def height_mentions(text: str) -> list[tuple[str, float | int, str | None]]:
    """(unit, value, reference) of each height `text` writes (see `height_candidates`), in the
    order written; the reference is the one its words give (`AGL` / `above ground level` after
    it or `真高` before it: AGL; `AMSL` / `MSL` / `above mean sea level`: AMSL; a flight level:
    STD), else None."""
    return [(u, v, r) for _, u, v, r in _height_spans(text)]


def _height_spans(text: str) -> list[tuple[int, str, float | int, str | None]]:
    """`height_mentions` with where each is written: (position, unit, value, reference)."""
    out = []
    for m in _unit_span(tuple(_HEIGHT_UNITS.values())).finditer(text):
        before, after = text[max(0, m.start() - 8):m.start()], text[m.end():m.end() + 24]
        if _RADIUS_BEFORE.search(before) or _RADIUS_AFTER.match(after):
            continue
        unit = next(u for u, words in _HEIGHT_UNITS.items() if re.fullmatch(words, m.group(2)))
        ref = _REF_AFTER.match(after)
        ref = _REFS[ref.group(1)] if ref else "AGL" if before.endswith(_HEIGHT_BEFORE) else None
        out.append((m.start(), unit, _number(m.group(1)), ref))
    out += [(m.start(), "FL", _number(m.group(1)), "STD")
            for m in _FLIGHT_LEVEL_SPAN.finditer(text)]
    return sorted(x for x in out if x[2] <= _HEIGHT["maximum"])


@cache
def _unit_span(spellings: tuple[str, ...]) -> re.Pattern:
    return re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+|\d*\.?\d+) ?(" + "|".join(spellings)
                      + r")(?![A-Za-z])")


def _number(written: str) -> float | int:
    v = float(written.replace(",", ""))
    return int(v) if v.is_integer() else v


def _parses(centre: str) -> bool:
    try:
        parse_centre(centre)
    except ValueError:
        return False
    return True


def grounded_tools(texts: list[str]) -> list[dict]:
    """`strict_tools()` with every copied value narrowed to what `texts` (the turn's user
    messages) write. A zone's values all come from one message: a user message may hold several
    (a feed puts a blank line between them, `split_messages`), and the zone tool's parameters
    are one branch per message (`anyOf`), so a call cannot take its centre from one message and
    its times from another; and a zone ends after it starts (an `anyOf` of start / end pairs
    beside each message's properties).
    `set_no_fly_zone` is left out when no message gives a centre and a radius."""
    tools = copy.deepcopy(strict_tools())
    branches: list[dict] = []
    for text in (block for t in texts for block in split_messages(t)):
        params = _grounded_zone_params(tools[0]["function"]["parameters"], text)
        if params is not None and params not in branches:
            branches.append(params)
    if not branches:
        return tools[1:]
    tools[0]["function"]["parameters"] = (branches[0] if len(branches) == 1 else
                                          {"type": "object", "anyOf": branches})
    return tools


def split_messages(text: str) -> list[str]:
    """The messages of one user turn: blocks separated by a blank line (how the task's feeds,
    and `data.generate_examples`, join several messages into one turn)."""
    return [b.strip() for b in _BLANK_LINE.split(text) if b.strip()]


def _grounded_zone_params(strict: dict, text: str) -> dict | None:
    """The zone tool's strict parameters narrowed to the values `text` writes, with an `anyOf`
    whose branches each pair some starts with the ends after them; None when it writes no
    centre or no radius with its unit (no zone without one)."""
    centres, times = centre_candidates(text), time_positions(text)
    if not centres:
        return None
    # a radius or a limit is a number of its own, not digits of a coordinate or a time
    numbers = number_candidates(_blank(text, [*centres, *_spans(_TIME_SPAN, text)]))
    params = copy.deepcopy(strict)
    props = params["properties"]
    props["centre"] = {"enum": centres}
    # a radius is a number written with its unit (`10NM`, `2 km`), and a message that writes
    # none orders no zone; a limit likewise (`500FT`), any number when the message writes none
    without_centres = _blank(text, centres)
    radii = radius_candidates(without_centres)
    for branch in props["radius"]["anyOf"]:
        value = branch["properties"]["value"]
        unit = branch["properties"]["unit"]["const"]
        allowed = [v for v in radii.get(unit, []) if 0 < v < value["exclusiveMaximum"]]
        branch["properties"]["value"] = {"enum": allowed}
    props["radius"]["anyOf"] = [b for b in props["radius"]["anyOf"]
                                if b["properties"]["value"]["enum"]]
    if not props["radius"]["anyOf"]:
        return None
    props["lower"] = _grounded_limit(height_mentions(without_centres), numbers)
    props["upper"] = copy.deepcopy(props["lower"])
    props["start"] = props["end"] = _time_choice([*times, None])  # times are sorted
    params["anyOf"] = [{"properties": {"start": _time_choice(starts), "end": _time_choice(ends)}}
                       for starts, ends in _ordered_times(times)]
    # a zone says when it starts and ends (null: not written); it replaces an earlier zone only
    # when its message says so (`NOTAMR A1233/25`), and then that one
    replaced = [m.group(1) for m in _REPLACE_SPAN.finditer(text)]
    extra = ["start", "end"]
    if replaced:
        props["action"], props["replaces"] = {"const": "replace"}, {"enum": replaced}
        extra += ["action", "replaces"]
    else:
        del props["action"], props["replaces"]
    params["required"] = [*params["required"], *extra]
    return params


def _blank(text: str, spans: list[str]) -> str:
    """`text` with every occurrence of `spans` (longest first) blanked out with spaces (so
    positions in it are positions in `text`)."""
    for span in sorted(spans, key=len, reverse=True):
        text = text.replace(span, " " * len(span))
    return text


def _grounded_limit(written: list[tuple[str, float | int, str | None]],
                    numbers: list | None = None, raised: bool = False) -> dict:
    """`_LIMIT` with each unit's value one of the heights written with that unit (0 always, for
    SFC / GND, and UNL, unless `raised`: a written height only), and each height's reference the
    one its words give (any when they give none); when nothing is written, any of `numbers` in
    FT or M and as FL (None: SFC only)."""
    if not written and numbers is not None:
        anywhere = sorted({0, *(v for v in numbers if v <= _HEIGHT["maximum"])})
        written = [(u, v, None) for u in ("FT", "M", "FL") for v in anywhere]
    limit = copy.deepcopy(_LIMIT)
    feet_or_metres, flight_level, unlimited = limit["anyOf"]
    any_ref = feet_or_metres["properties"]["ref"]["enum"]
    branches = []
    for unit in ("FT", "M"):
        refs: dict[float | int, set[str]] = {} if raised else {0: set(any_ref)}
        for u, value, ref in written:
            if u == unit:
                refs.setdefault(value, set()).update([ref] if ref else any_ref)
        by_refs: dict[tuple, list] = {}
        for value, allowed in sorted(refs.items()):
            by_refs.setdefault(tuple(r for r in any_ref if r in allowed), []).append(value)
        for allowed, values in by_refs.items():
            branch = copy.deepcopy(feet_or_metres)
            branch["properties"]["value"] = {"enum": values}
            branch["properties"]["unit"] = {"const": unit}
            branch["properties"]["ref"] = {"enum": list(allowed)}
            branches.append(branch)
    levels = sorted({v for u, v, _ in written if u == "FL"})
    if levels:
        flight_level["properties"]["value"] = {"enum": levels}
        branches.append(flight_level)
    limit["anyOf"] = branches if raised else [*branches, unlimited]
    return limit


def _time_choice(values: list[str | None]) -> dict:
    named = [v for v in values if v is not None]
    options = ([{"enum": named}] if named else []) + ([{"type": "null"}] if None in values else [])
    return options[0] if len(options) == 1 else {"anyOf": options}


def _ordered_times(times: dict[str, int]) -> list[tuple[list[str | None], list[str | None]]]:
    """(starts, ends) groups for a message's times ({time: where it is written}): every end a
    group allows is written after every start in it and is later (a time `parse_time` cannot
    place is taken as later); a missing end only when the message writes one time; a missing
    start goes with anything."""
    when = {t: parse_time(t) for t in times}
    groups: dict[tuple, list[str | None]] = {}
    for start in [*times, None]:
        if start is None:
            ends = (*times, None)
        else:
            ends = tuple(e for e in times if times[e] > times[start] and (
                when[start] is None or when[e] is None or when[e] > when[start]))
            ends += (None,) if len(times) == 1 else ()
        groups.setdefault(ends, []).append(start)
    return [(starts, list(ends)) for ends, starts in groups.items() if ends]


def grounded_constraint(conversation: list[dict]) -> dict[str, Any]:
    """`SamplingParams.structured` for the next assistant turn of `conversation` (for
    `run_agent`): the turn answers the last user message only (earlier ones were answered in
    their own turns), and its calls follow that message in the order it writes things
    (`turn_slots`): a zone per centre written, a clear per cancelled id written, each at most
    once. The calls this turn already made (before their tool results) used up their slots."""
    last = max((i for i, m in enumerate(conversation) if m.get("role") == "user"), default=None)
    text = conversation[last].get("content") if last is not None else None
    if not isinstance(text, str):
        return tool_constraint()
    slots, owed = _turn(text)
    done = 0
    for call in _calls(conversation[last + 1:]):
        done = next((i + 1 for i in range(done, len(slots)) if _fills(slots[i], call)), done)
    owed = [range(r.start - done, r.stop - done) for r in owed if r.start >= done]
    return {"lark": ordered_calls_lark(slots[done:], owed, max_text=REPLY_MAX_CHARS)}


def turn_slots(text: str) -> list[tuple[str, dict]]:
    """The calls `text` allows, in the order it writes them, as (tool name, parameters) slots:
    the zone tool's grounded parameters (`grounded_tools`'s branch for its message) once per
    centre written, with that centre fixed (a centre written twice gives two slots), and
    clear_zone once per id a message cancels (written after NOTAMC, CNL or CANCEL)."""
    return _turn(text)[0]


def _turn(text: str) -> tuple[list[tuple[str, dict]], list[range]]:
    """(`turn_slots`, the slot ranges of which one must be called: each message that writes a
    centre and a radius orders a zone, and in a message listing several, each item that writes
    its radius orders its own)."""
    strict = strict_tools()
    zone, clear = (t["function"]["parameters"] for t in strict)
    slots, owed = [], []
    for message in split_messages(text):
        first = len(slots)
        params = _grounded_zone_params(zone, message)
        centres = params["properties"]["centre"]["enum"] if params is not None else []
        where = [(at, -len(c), ZONE_TOOL, "centre", c, params) for c in centres
                 for at in _occurrences(c, message)]
        where += [(m.start(1), 0, CLEAR_TOOL, "zone_id", m.group(1), clear)
                  for m in _CANCEL_SPAN.finditer(message)]
        items = _items(message, [(w[0], w[0] - w[1]) for w in where if w[2] == ZONE_TOOL])
        blanked = _blank(message, centres)
        heights, unlimited = _height_spans(blanked), bool(_UNLIMITED.search(blanked))
        listed = []  # the listed zones whose item writes their radius: each is owed
        for start, _, name, key, value, base in sorted(where, key=lambda w: w[:2]):
            slot = copy.deepcopy(base)
            props = slot["properties"]
            props[key] = {"const": value}
            if name == ZONE_TOOL:
                item = items.get(start)
                radii = radius_candidates(blanked[item[0]:item[1]]) if item else {}
                if radii:
                    _narrow_radius(props, radii)
                    listed.append(len(slots))
                # a listed zone's limits are written in its own item or outside every item
                own = [h for h in heights if not items or (item and item[0] <= h[0] < item[1])
                       or not any(a <= h[0] < b for a, b in items.values())]
                props["lower"], props["upper"], raised = _limits_in_order(own, unlimited)
                if raised:  # no SFC: the lower is written
                    slot["required"] = [*slot.get("required", []), "lower"]
            slots.append((name, slot))
        zones = [i for i in range(first, len(slots)) if slots[i][0] == ZONE_TOOL]
        # each listed zone whose item writes its radius is owed; else one zone of the message
        owed += [range(i, i + 1) for i in listed] or ([range(zones[0], zones[-1] + 1)]
                                                      if zones else [])
    return slots, owed


def _items(message: str, centres: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """{centre position: (start, end) of its item} for a message that lists several zones: an
    item is a line or a `;`-clause holding one centre (`1. 3KM RADIUS 491218N 0675403W`,
    `（二）以…为中心，半径1500米范围内空域`, `…, AND WI … RADIUS OF …`); none for a message
    with one."""
    pieces, pos = [], 0
    for m in [*_ITEM_BREAK.finditer(message), None]:
        end = m.start() if m else len(message)
        pieces.append((pos, end))
        pos = m.end() if m else pos
    holds = {p: sorted({a for a, _ in centres if p[0] <= a < p[1]
                        and not any(b < a < e for b, e in centres)}) for p in pieces}
    own = {at[0]: p for p, at in holds.items() if len(at) == 1}
    return own if len(own) >= 2 else {}


def _narrow_radius(props: dict, radii: dict[str, list]) -> None:
    """A listed zone's radius is one its own item writes (`radii`, by unit), when it allows
    one of them."""
    narrowed = [{**b, "properties": {**b["properties"], "value": {"enum": [
        v for v in b["properties"]["value"]["enum"] if v in radii.get(
            b["properties"]["unit"]["const"], [])]}}} for b in props["radius"]["anyOf"]]
    narrowed = [b for b in narrowed if b["properties"]["value"]["enum"]]
    if narrowed:
        props["radius"] = {"anyOf": narrowed}


def _limits_in_order(heights: list[tuple], unlimited: bool) -> tuple[dict, dict, bool]:
    """(lower, upper, whether the lower must be given) schemas for a zone whose message writes
    `heights` (`_height_spans`) in this order: the upper limit is the last height written (UNL
    when none is, or also when the message writes UNL), the lower SFC or a height written
    before the upper's (not SFC when two heights are written: the first is the lower)."""
    nonzero = [(u, v, r) for _, u, v, r in heights if v != 0]
    raised = len(nonzero) >= 2 and not unlimited  # two heights written: a lower, then the upper
    lower = _grounded_limit(nonzero if unlimited else nonzero[:-1], raised=raised)
    upper = copy.deepcopy(_LIMIT)
    feet_or_metres, flight_level, unl = upper["anyOf"]
    upper["anyOf"] = [unl] if unlimited or not nonzero else []
    if nonzero:
        unit, value, ref = nonzero[-1]
        branch = flight_level if unit == "FL" else feet_or_metres
        branch["properties"]["value"] = {"enum": [value]}
        if unit != "FL":
            branch["properties"]["unit"] = {"const": unit}
            branch["properties"]["ref"] = {"enum": [ref]} if ref else branch["properties"]["ref"]
        upper["anyOf"].insert(0, branch)
    return lower, upper, raised


def _fills(slot: tuple[str, dict], call: dict) -> bool:
    name, params = slot
    key = "centre" if name == ZONE_TOOL else "zone_id"
    return call["name"] == name and call["arguments"].get(key) == params["properties"][key][
        "const"]


def _calls(messages: list[dict]) -> list[dict]:
    """{"name", "arguments"} of the tool calls in `messages` (assistant turns), in order."""
    fns = [normalize_tool_call(c)["function"] for m in messages for c in m.get("tool_calls") or []
           if isinstance(c, dict)]
    return [{"name": fn.get("name"), "arguments": fn["arguments"]} for fn in fns
            if isinstance(fn.get("arguments"), dict)]


def tool_constraint(texts: list[str] | None = None) -> dict[str, Any]:
    """`SamplingParams.structured` for one airspace turn: text, or calls that keep the contract;
    given the turn's user messages, the grounded contract (`grounded_tools`)."""
    tools = strict_tools() if texts is None else grounded_tools(texts)
    return {"tools": tools, "tool_choice": "auto"}
