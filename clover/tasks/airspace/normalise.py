"""Deterministic conversion of raw, copied values into the normalised zone form.

The model copies values from a message (a coordinate string, a radius with its unit, limits with
their reference, ISO times that may carry a local offset); this module turns them into numbers:
decimal degrees, metres, UTC minutes. It is pure Python, never guesses, and raises `ValueError`
with a message naming the bad value for anything it cannot read. 1 NM = 1852 m, 1 ft = 0.3048 m,
FL = 100 ft (standard pressure), SFC/GND = 0 ft AGL, `24:00` = next day 00:00. It is long because it
reads every notation the messages use (coordinates, places, polygons, lengths, limits, times).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

NM_M, FT_M = 1852.0, 0.3048
LENGTH_UNITS = {"NM": NM_M, "KM": 1000.0, "M": 1.0, "FT": FT_M}
MAX_RADIUS_M = 2_000_000  # a zone radius is below 2,000 km (the contract bounds it per unit)
_UNIT_ALIASES = {
    "MTR": "M", "METRE": "M", "METRES": "M", "METER": "M", "METERS": "M", "米": "M",
    "公里": "KM", "千米": "KM", "NMR": "NM", "FEET": "FT", "F": "FT",
}  # fmt: skip
_REF_ALIASES = {"GND": "SFC", "MSL": "AMSL", "SFC": "SFC", "AMSL": "AMSL", "AGL": "AGL"}
REFS = ("SFC", "AMSL", "AGL", "STD")
EARTH_RADIUS_M = 6371008.8
LIMIT_TOL_M = 2.0


@dataclass(frozen=True, kw_only=True)
class Limit:
    """A vertical limit: `value` in `unit` (FT, M, FL) above `ref`; `unit="UNL"` is unlimited."""

    value: float | None
    unit: str
    ref: str | None

    def metres(self) -> tuple[str, float]:
        """(reference class, height in metres); SFC is 0 m AGL, UNL is +inf."""
        if self.unit == "UNL":
            return "UNL", math.inf
        if self.ref == "SFC":
            return "AGL", 0.0
        scale = 100 * FT_M if self.unit == "FL" else LENGTH_UNITS[self.unit]
        return str(self.ref), float(self.value or 0.0) * scale

    def matches(self, other: Limit, tol_m: float = LIMIT_TOL_M) -> bool:
        (ref_a, m_a), (ref_b, m_b) = self.metres(), other.metres()
        return ref_a == ref_b and (m_a == m_b or abs(m_a - m_b) <= tol_m)

    def to_dict(self) -> dict[str, Any]:
        if self.unit == "UNL":
            return {"unit": "UNL"}
        return {"value": _compact(self.value or 0.0), "unit": self.unit, "ref": self.ref}


SFC = Limit(value=0.0, unit="FT", ref="SFC")
UNL = Limit(value=None, unit="UNL", ref=None)


@dataclass(frozen=True, kw_only=True)
class Zone:
    """One no-fly zone in normalised form (the ground-truth and scoring representation): a
    cylinder, or a polygon extruded between its limits (with the circle enclosing it)."""

    lat: float
    lon: float
    radius_m: float
    lower: Limit = SFC
    upper: Limit = UNL
    start_utc: str | None = None
    end_utc: str | None = None
    id: str = ""
    replaces: str | None = None
    label: str = field(default="", compare=False)
    polygon: tuple[tuple[float, float], ...] = ()  # vertices; lat/lon/radius_m enclose them
    schedule: str | None = None  # active hours inside start-end, as written (NOTAM D) item)

    def to_dict(self) -> dict[str, Any]:
        """The external JSON form (issue 'normalised form'), plus `id`/`replaces` when set."""
        d: dict[str, Any] = {
            "lat": round(self.lat, 7), "lon": round(self.lon, 7),
            "radius_m": round(self.radius_m, 3),
            "lower": self.lower.to_dict(), "upper": self.upper.to_dict(),
            "start_utc": self.start_utc, "end_utc": self.end_utc,
        }  # fmt: skip
        if self.id:
            d["id"] = self.id
        if self.replaces:
            d["replaces"] = self.replaces
        if self.polygon:
            d["polygon"] = [[round(a, 7), round(b, 7)] for a, b in self.polygon]
        if self.schedule:
            d["schedule"] = self.schedule
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Zone:
        """Read the external form; raises ValueError on anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"zone must be an object, got {type(d).__name__}")
        polygon = _vertices(d["polygon"]) if d.get("polygon") else ()
        lat, lon, radius_m = enclosing_circle(polygon) if polygon else (
            d.get("lat"), d.get("lon"), d.get("radius_m"))
        return cls(
            lat=_lat_lon(lat, 90.0, "lat"),
            lon=_lat_lon(lon, 180.0, "lon"),
            radius_m=_positive(radius_m, "radius_m"),
            polygon=polygon,
            schedule=parse_schedule(d.get("schedule")),
            lower=parse_limit(d.get("lower", "SFC")),
            upper=parse_limit(d.get("upper", "UNL")),
            start_utc=parse_time(d.get("start_utc")),
            end_utc=parse_time(d.get("end_utc")),
            id=str(d.get("id") or ""),
            replaces=d.get("replaces") or None,
        )


def _vertices(points: Any) -> tuple[tuple[float, float], ...]:
    if not isinstance(points, list | tuple) or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in points):
        raise ValueError(f"polygon must be a list of [lat, lon] pairs, got {points!r}")
    return close_polygon([(_lat_lon(a, 90.0, "lat"), _lat_lon(b, 180.0, "lon")) for a, b in points])


def close_polygon(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Vertices without a closing repeat of the first; ValueError under three."""
    if len(points) > 1 and distance_m(*points[0], *points[-1]) < 1.0:
        points = points[:-1]
    if len(points) < 3:
        raise ValueError(f"a polygon needs at least 3 vertices, got {len(points)}")
    return tuple((round(a, 7), round(b, 7)) for a, b in points)


def enclosing_circle(points: tuple[tuple[float, float], ...]) -> tuple[float, float, float]:
    """(lat, lon, radius_m) of a circle around the vertices: their mean, the farthest one + 1 m."""
    lat = sum(p[0] for p in points) / len(points)
    lon = sum(p[1] for p in points) / len(points)
    return round(lat, 7), round(lon, 7), max(distance_m(lat, lon, *p) for p in points) + 1.0


def parse_schedule(text: Any) -> str | None:
    """A schedule as written (`MON-FRI 0800-1600`) -> upper case, single spaces; None if unset."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise ValueError(f"schedule must be a string, got {text!r}")
    return " ".join(text.upper().replace(".", " ").split()) or None


def _compact(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 6)


def _number(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float | str):
        raise ValueError(f"{what} must be a number, got {x!r}")
    try:
        v = float(str(x).replace(",", "").strip())
    except ValueError:
        raise ValueError(f"{what} must be a number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {x!r}")
    return v


def _positive(x: Any, what: str) -> float:
    v = _number(x, what)
    if not 0 < v < MAX_RADIUS_M:
        raise ValueError(f"{what} must be in (0, 2000 km), got {x!r}")
    return v


def _lat_lon(x: Any, bound: float, what: str) -> float:
    v = _number(x, what)
    if abs(v) > bound:
        raise ValueError(f"{what} out of range: {x!r}")
    return v


# ---- coordinates -------------------------------------------------------------------------------

_CN_HEMI = {"北纬": "N", "南纬": "S", "东经": "E", "西经": "W"}
_COORD_TOKEN = re.compile(r"[NSEW]|[-+]?\d+(?:\.\d+)?")


def parse_centre(text: Any) -> tuple[float, float]:
    """Centre text as written -> (lat, lon) in signed decimal degrees.

    Reads DDMMSS / DDMM / decimal, hemisphere first or last, joined, spaced or slashed, with or
    without symbols (512107N 0003608W, N320604E0344856, 335633N/1182429W, 4512.5N 00615.0E,
    45°12′30″N 6°15′10″E, 北纬31°08′36″、东经121°48′18″, 51.47002, -0.45430), or a place: an
    ICAO code or an airport name known to airportsdata or the Chinese name table.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"centre must be a non-empty string, got {text!r}")
    s = text.strip().upper()
    for cn, hemi in _CN_HEMI.items():
        s = s.replace(cn, f" {hemi} ")
    if not any(c.isdigit() for c in s):
        return resolve_place(text)
    tokens = _COORD_TOKEN.findall(s)
    lat_part, lat_h, lon_part, lon_h = _split_tokens(tokens, text)
    lat = _part_degrees(lat_part, lat_h, is_lat=True, text=text)
    lon = _part_degrees(lon_part, lon_h, is_lat=False, text=text)
    return round(lat, 7), round(lon, 7)


def _split_tokens(tokens: list[str], text: str) -> tuple[list[str], str, list[str], str]:
    letters = [i for i, t in enumerate(tokens) if t in "NSEW"]
    if not letters:
        if len(tokens) != 2:
            raise ValueError(f"cannot read coordinates {text!r}")
        return tokens[:1], "", tokens[1:], ""
    if len(letters) != 2:
        raise ValueError(f"coordinates need two hemisphere letters: {text!r}")
    i, j = letters
    if i == 0:  # hemisphere first: N320604E0344856
        lat, lon = tokens[1:j], tokens[j + 1 :]
    elif j == len(tokens) - 1:  # hemisphere last: 320604N0344856E
        lat, lon = tokens[:i], tokens[i + 1 : j]
    else:
        raise ValueError(f"cannot read coordinates {text!r}")
    if tokens[i] not in "NS" or tokens[j] not in "EW":
        raise ValueError(f"latitude (N/S) must come before longitude (E/W): {text!r}")
    return lat, tokens[i], lon, tokens[j]


def _part_degrees(nums: list[str], hemi: str, *, is_lat: bool, text: str) -> float:
    if not 1 <= len(nums) <= 3 or any(n in "NSEW" for n in nums):
        raise ValueError(f"cannot read coordinates {text!r}")
    sign = -1.0 if hemi in ("S", "W") else 1.0
    if not hemi and nums[0][0] in "+-":
        sign = -1.0 if nums[0][0] == "-" else 1.0
    nums = [n.lstrip("+-") for n in nums]
    if hemi and len(nums) == 1:
        nums = _unpack(nums[0], 2 if is_lat else 3, text)
    elif not hemi and len(nums) != 1:
        raise ValueError(f"signed coordinates must be decimal degrees: {text!r}")
    if any("." in n for n in nums[:-1]):
        raise ValueError(f"only the last field may have decimals: {text!r}")
    parts = [float(n) for n in nums] + [0.0, 0.0]
    deg, mins, secs = parts[:3]
    if mins >= 60 or secs >= 60:
        raise ValueError(f"minutes and seconds must be < 60: {text!r}")
    value = deg + mins / 60 + secs / 3600
    if value > (90 if is_lat else 180):
        raise ValueError(f"coordinate out of range: {text!r}")
    return sign * value


def _unpack(packed: str, deg_digits: int, text: str) -> list[str]:
    """DDMMSS(.s) / DDMM(.m) / DD(.d) (three degree digits for longitude) -> fields."""
    whole, dot, frac = packed.partition(".")
    n = len(whole)
    if n <= deg_digits:
        return [packed]
    if n not in (deg_digits + 2, deg_digits + 4):
        raise ValueError(f"cannot read packed coordinate {packed!r} in {text!r}")
    fields = [whole[:deg_digits], whole[deg_digits : deg_digits + 2], whole[deg_digits + 2 :]]
    fields = [f for f in fields if f]
    fields[-1] += dot + frac
    return fields


def resolve_place(name: str) -> tuple[float, float]:
    """ICAO code or airport name (airportsdata English name, or the Chinese table) -> (lat, lon)."""
    airports, by_name = _airport_index()
    key = name.strip()
    code = key.upper()
    if code in airports:
        return _airport_latlon(airports[code])
    icao = by_name.get(key.lower())
    if icao is None:
        for m in re.findall(r"\b[A-Z]{4}\b", key):
            if m in airports:
                icao = m
                break
    if icao is None:
        raise ValueError(f"unknown place {name!r}: give coordinates, an ICAO code or airport name")
    return _airport_latlon(airports[icao])


def _airport_latlon(a: dict) -> tuple[float, float]:
    return round(float(a["lat"]), 7), round(float(a["lon"]), 7)


@cache
def _airport_index() -> tuple[dict, dict[str, str]]:
    from clover.tasks.airspace.places import CN_AIRPORTS, load_airports

    airports = load_airports()
    by_name = {a["name"].lower(): icao for icao, a in airports.items()}
    by_name.update({names[0].lower(): icao for icao, names in CN_AIRPORTS.items()})
    return airports, by_name


def distance_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle (haversine) distance in metres."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


# ---- lengths and limits ------------------------------------------------------------------------


def parse_unit(unit: Any) -> str:
    if not isinstance(unit, str):
        raise ValueError(f"unit must be a string, got {unit!r}")
    u = unit.strip().upper()
    u = _UNIT_ALIASES.get(unit.strip(), _UNIT_ALIASES.get(u, u))
    if u not in LENGTH_UNITS and u not in ("FL", "UNL"):
        raise ValueError(f"unknown unit {unit!r}: use NM, KM, M, FT, FL or UNL")
    return u


def parse_radius(radius: Any) -> float:
    """{"value": 0.5, "unit": "NM"} (or the string "0.5NM" / "500 MTR" / "3公里") -> metres."""
    if isinstance(radius, str):
        m = re.fullmatch(r"\s*(\d*\.?\d+)\s*([A-Za-z\u4e00-\u9fff]+)\s*", radius)
        if not m:
            raise ValueError(f"cannot read radius {radius!r}")
        radius = {"value": m.group(1), "unit": m.group(2)}
    if not isinstance(radius, dict):
        raise ValueError(f"radius must be an object with value and unit, got {radius!r}")
    unit = parse_unit(radius.get("unit"))
    if unit not in LENGTH_UNITS:
        raise ValueError(f"radius unit must be NM, KM, M or FT, got {unit!r}")
    # the bound is on the radius in metres, as Zone.from_dict checks it: 187052 KM is 187,052 km
    metres = _number(radius.get("value"), "radius.value") * LENGTH_UNITS[unit]
    return _positive(metres, f"radius {radius.get('value')!r} {unit}")


_LIMIT_TEXT = re.compile(r"\s*(FL)\s*(\d+)\s*|\s*(\d[\d,]*\.?\d*)\s*(FT|M|MTR)\s*(AMSL|MSL|AGL)\s*")


def parse_limit(limit: Any) -> Limit:
    """{"value", "unit", "ref"} (or text: SFC, GND, 400FT AGL, FL095, UNL) -> Limit."""
    if isinstance(limit, str):
        return _limit_from_text(limit)
    if not isinstance(limit, dict):
        raise ValueError(f"limit must be an object with value, unit, ref; got {limit!r}")
    ref = limit.get("ref")
    if isinstance(ref, str) and ref.strip().upper() in ("SFC", "GND"):
        return SFC
    unit = parse_unit(limit.get("unit"))
    if unit == "UNL":
        return UNL
    if unit == "FL":
        return Limit(value=_number(limit.get("value"), "limit.value"), unit="FL", ref="STD")
    if unit == "KM" or unit == "NM":
        raise ValueError(f"vertical limits are in FT, M or FL, got {unit!r}")
    if not isinstance(ref, str) or ref.strip().upper() not in _REF_ALIASES:
        raise ValueError(f"limit ref must be SFC, AMSL or AGL, got {ref!r}")
    value = _number(limit.get("value"), "limit.value")
    if not 0 <= value < 1e6:
        raise ValueError(f"limit value out of range: {value!r}")
    return Limit(value=value, unit=unit, ref=_REF_ALIASES[ref.strip().upper()])


def _limit_from_text(text: str) -> Limit:
    t = text.strip().upper()
    if t in ("SFC", "GND"):
        return SFC
    if t in ("UNL", "UNLTD"):
        return UNL
    m = _LIMIT_TEXT.fullmatch(t)
    if not m:
        raise ValueError(f"cannot read limit {text!r}")
    if m.group(1):
        return Limit(value=float(m.group(2)), unit="FL", ref="STD")
    value = float(m.group(3).replace(",", ""))
    return Limit(value=value, unit=parse_unit(m.group(4)), ref=_REF_ALIASES[m.group(5)])


# ---- times -------------------------------------------------------------------------------------

_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2})(?::00)?\s*(Z|UTC|[+-]\d{2}:?\d{2})?")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")  # fmt: skip
_MONTH = {name: k for k, m in enumerate(MONTHS, 1) for name in (m.upper(), m[:3].upper())}
_M = "([A-Z]+)"
_ZONE_TAIL = r"\s*(?:\(?UTC\s*([+-]\d{2}:?\d{2})\)?|([+-]\d{2}:?\d{2}))"
# The message's own spellings (written UTC unless an offset follows): 14:00 UTC on 8 November
# 2025 | 8 November 2025 1400Z | 1400 UTC 8 NOV 2025 | 14:00 on 8 November 2025 UTC+05:00.
_WORDS = (
    (re.compile(rf"(\d{{2}}):?(\d{{2}})\s*(?:UTC|Z)\s+(?:ON\s+)?(\d{{1,2}})\s+{_M}\s+(\d{{4}})"),
     ("h", "mi", "d", "mo", "y"), "Z"),
    (re.compile(rf"(\d{{1,2}})\s+{_M}\s+(\d{{4}})\s+(\d{{2}}):?(\d{{2}})\s*(?:Z|UTC)"),
     ("d", "mo", "y", "h", "mi"), "Z"),
    (re.compile(rf"(\d{{2}}):?(\d{{2}})\s+(?:ON\s+)?(\d{{1,2}})\s+{_M}\s+(\d{{4}}){_ZONE_TAIL}"),
     ("h", "mi", "d", "mo", "y", "tz", "tz2"), None),
)
# Chinese notices state Beijing time (UTC+8): 2024年4月3日14时[30分]; 24时 is the next day's 0时.
_CN = re.compile(r"(\d{4})年(\d{1,2})月(\d{1,2})日(\d{1,2})时(?:(\d{1,2})分)?")
CN_OFFSET = "+08:00"


def parse_time(value: Any) -> str | None:
    """A time -> `YYYY-MM-DDTHH:MMZ` (UTC); None / "" / PERM / UFN -> None.

    Reads ISO (UTC `Z` or a local offset such as `+08:00`, `24:00` allowed) and the messages' own
    spellings, so a model can copy a time as written: NOTAM `YYMMDDHHMM` (UTC), the Chinese
    `2024年4月3日14时30分` (UTC+8), and the English `14:00 UTC on 8 November 2025`,
    `8 November 2025 1400Z`, `1400 UTC 8 NOV 2025` (a local one needs its offset:
    `14:00 on 8 November 2025 UTC+05:00`).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"time must be a string or null, got {value!r}")
    s = value.strip().upper()
    if s in ("", "PERM", "UFN", "NULL"):
        return None
    if re.fullmatch(r"\d{10}", s):
        s = f"20{s[:2]}-{s[2:4]}-{s[4:6]}T{s[6:8]}:{s[8:]}Z"
    elif m := _CN.fullmatch(s):
        y, mo, d, hh, mi = (int(g or 0) for g in m.groups())
        s = f"{y:04d}-{mo:02d}-{d:02d}T{hh:02d}:{mi:02d}{CN_OFFSET}"
    else:
        s = _words_to_iso(s) or s
    m = _ISO.fullmatch(s)
    if not m:
        raise ValueError(f"cannot read time {value!r}: use YYYY-MM-DDTHH:MMZ, an offset, or the "
                         "time as the message writes it")
    y, mo, d, hh, mm = (int(g) for g in m.groups()[:5])
    if hh == 24 and mm == 0:
        hh, extra = 0, timedelta(days=1)
    else:
        extra = timedelta(0)
    try:
        local = datetime(y, mo, d, hh, mm) + extra
    except ValueError:
        raise ValueError(f"not a valid time: {value!r}") from None
    utc = local - _offset(m.group(6))
    return utc.strftime("%Y-%m-%dT%H:%MZ")


def _words_to_iso(s: str) -> str | None:
    """An English spelling (upper case) -> ISO text for `_ISO`; None if it is not one."""
    for pattern, names, zone in _WORDS:
        m = pattern.fullmatch(s)
        if not m:
            continue
        g = dict(zip(names, m.groups(), strict=True))
        month = _MONTH.get(g["mo"])
        if month is None:
            raise ValueError(f"unknown month {g['mo'].title()!r} in time {s!r}")
        tz = zone or g.get("tz") or g.get("tz2")
        if len(tz) == 5:  # +0500
            tz = f"{tz[:3]}:{tz[3:]}"
        return f"{g['y']}-{month:02d}-{int(g['d']):02d}T{g['h']}:{g['mi']}{tz}"
    return None


def _offset(tz: str | None) -> timedelta:
    if tz in (None, "Z", "UTC"):
        return timedelta(0)
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 14 or minutes >= 60:
        raise ValueError(f"bad UTC offset {tz!r}")
    return sign * timedelta(hours=hours, minutes=minutes)
