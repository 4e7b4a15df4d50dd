"""Generator-side writers: coordinates, numbers, limits and times as real messages print them.

Every writer quantises first and returns the printed text together with the exact value that
text denotes, computed from the integers it printed (never by parsing the text back), so ground
truth equals what a careful reader recovers. `normalise.py` is the independent reader; tests check
that the two agree on every notation.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from clover.tasks.airspace.normalise import NM_M, SFC, UNL, Limit

Point = tuple[float, float]


@dataclass(frozen=True)
class Written:
    """Text as printed plus the value it denotes."""

    text: str
    lat: float
    lon: float


def _hemi(x: float, pos: str, neg: str) -> str:
    return neg if x < 0 else pos


def _dms_fields(x: float, sec_places: int) -> tuple[int, int, int, float]:
    """abs(x) -> (deg, min, sec in 10^-p units, exact value) quantised to 10^-p seconds."""
    scale = 10**sec_places
    total = round(abs(x) * 3600 * scale)
    deg, rem = divmod(total, 3600 * scale)
    mins, secs = divmod(rem, 60 * scale)
    return deg, mins, secs, total / (3600 * scale)


def _sec_text(secs: int, places: int) -> str:
    if places == 0:
        return f"{secs:02d}"
    whole, frac = divmod(secs, 10**places)
    return f"{whole:02d}.{frac:0{places}d}"


def _dms_pair(lat: float, lon: float, places: int = 0) -> tuple[tuple, tuple, float, float]:
    la, lo = _dms_fields(lat, places), _dms_fields(lon, places)
    return la, lo, math.copysign(la[3], lat), math.copysign(lo[3], lon)


def dms_packed(lat: float, lon: float, style: str = "sp", places: int = 0) -> Written:
    """512107N 0003608W (sp), 512107N0003608W (join), 335633N/1182429W (slash),
    N320604E0344856 (pre), N320604 E0344856 (pre_sp); `places` decimals on the seconds."""
    la, lo, vlat, vlon = _dms_pair(lat, lon, places)
    a = f"{la[0]:02d}{la[1]:02d}{_sec_text(la[2], places)}"
    b = f"{lo[0]:03d}{lo[1]:02d}{_sec_text(lo[2], places)}"
    h1, h2 = _hemi(lat, "N", "S"), _hemi(lon, "E", "W")
    text = {
        "sp": f"{a}{h1} {b}{h2}", "join": f"{a}{h1}{b}{h2}", "slash": f"{a}{h1}/{b}{h2}",
        "pre": f"{h1}{a}{h2}{b}", "pre_sp": f"{h1}{a} {h2}{b}",
    }[style]  # fmt: skip
    return Written(text, vlat, vlon)


def dm_packed(lat: float, lon: float, places: int = 1) -> Written:
    """Degrees and (decimal) minutes: 4512.5N 00615.0E (places=1) or 4512N00615E (places=0)."""
    scale = 10**places
    ta, to = round(abs(lat) * 60 * scale), round(abs(lon) * 60 * scale)

    def minutes(total: int) -> tuple[int, str]:
        deg, rem = divmod(total, 60 * scale)
        whole, frac = divmod(rem, scale)
        return deg, f"{whole:02d}" + (f".{frac:0{places}d}" if places else "")

    (da, ma), (do, mo) = minutes(ta), minutes(to)
    h1, h2 = _hemi(lat, "N", "S"), _hemi(lon, "E", "W")
    sep = " " if places else ""
    vlat, vlon = math.copysign(ta / (60 * scale), lat), math.copysign(to / (60 * scale), lon)
    return Written(f"{da:02d}{ma}{h1}{sep}{do:03d}{mo}{h2}", vlat, vlon)


def dms_spaced(lat: float, lon: float) -> Written:
    """45 12 30N 006 15 10E."""
    la, lo, vlat, vlon = _dms_pair(lat, lon)
    h1, h2 = _hemi(lat, "N", "S"), _hemi(lon, "E", "W")
    text = f"{la[0]:02d} {la[1]:02d} {la[2]:02d}{h1} {lo[0]:03d} {lo[1]:02d} {lo[2]:02d}{h2}"
    return Written(text, vlat, vlon)


def dms_symbols(lat: float, lon: float, ascii_marks: bool = False) -> Written:
    """45°12′30″N 6°15′10″E (or with ASCII ' and ")."""
    la, lo, vlat, vlon = _dms_pair(lat, lon)
    m, s = ("'", '"') if ascii_marks else ("′", "″")
    h1, h2 = _hemi(lat, "N", "S"), _hemi(lon, "E", "W")
    text = f"{la[0]}°{la[1]:02d}{m}{la[2]:02d}{s}{h1} {lo[0]}°{lo[1]:02d}{m}{lo[2]:02d}{s}{h2}"
    return Written(text, vlat, vlon)


def dms_chinese(lat: float, lon: float) -> Written:
    """北纬31°08′36″、东经121°48′18″."""
    la, lo, vlat, vlon = _dms_pair(lat, lon)
    h1 = "北纬" if lat >= 0 else "南纬"
    h2 = "东经" if lon >= 0 else "西经"
    text = f"{h1}{la[0]}°{la[1]:02d}′{la[2]:02d}″、{h2}{lo[0]}°{lo[1]:02d}′{lo[2]:02d}″"
    return Written(text, vlat, vlon)


def _decimal_text(x: float, places: int) -> tuple[str, float]:
    total = round(abs(x) * 10**places)
    whole, frac = divmod(total, 10**places)
    return f"{whole}.{frac:0{places}d}", total / 10**places


def decimal_signed(lat: float, lon: float, places: int = 5) -> Written:
    """51.47002, -0.45430."""
    (a, va), (b, vb) = _decimal_text(lat, places), _decimal_text(lon, places)
    sa, sb = ("-" if lat < 0 else ""), ("-" if lon < 0 else "")
    return Written(f"{sa}{a}, {sb}{b}", math.copysign(va, lat), math.copysign(vb, lon))


def decimal_hemi(lat: float, lon: float, places: int = 4, degree_sign: bool = True) -> Written:
    """51.4700° N, 0.4543° W (or 51.4700N 0.4543W)."""
    (a, va), (b, vb) = _decimal_text(lat, places), _decimal_text(lon, places)
    h1, h2 = _hemi(lat, "N", "S"), _hemi(lon, "E", "W")
    text = f"{a}° {h1}, {b}° {h2}" if degree_sign else f"{a}{h1} {b}{h2}"
    return Written(text, math.copysign(va, lat), math.copysign(vb, lon))


CoordWriter = Callable[[float, float], Written]
COORD_WRITERS: dict[str, CoordWriter] = {
    "dms_sp": lambda la, lo: dms_packed(la, lo, "sp"),
    "dms_join": lambda la, lo: dms_packed(la, lo, "join"),
    "dms_slash": lambda la, lo: dms_packed(la, lo, "slash"),
    "dms_pre": lambda la, lo: dms_packed(la, lo, "pre"),
    "dms_pre_sp": lambda la, lo: dms_packed(la, lo, "pre_sp"),
    "dms_decsec": lambda la, lo: dms_packed(la, lo, "sp", places=1),
    "dm_dec": lambda la, lo: dm_packed(la, lo, 1),
    "dm": lambda la, lo: dm_packed(la, lo, 0),
    "dms_spaced": dms_spaced,
    "dms_sym": dms_symbols,
    "dms_ascii": lambda la, lo: dms_symbols(la, lo, ascii_marks=True),
    "dec_signed": decimal_signed,
    "dec_hemi": decimal_hemi,
    "dec_plain": lambda la, lo: decimal_hemi(la, lo, 5, degree_sign=False),
    "cn": dms_chinese,
}


# ---- geometry helpers for realistic placement --------------------------------------------------


def offset_point(rng: random.Random, lat: float, lon: float, max_km: float) -> Point:
    """A point up to `max_km` from (lat, lon), uniform bearing (flat-earth, fine at this scale)."""
    bearing, dist_m = rng.uniform(0, 2 * math.pi), rng.uniform(0.3, max_km) * 1000
    dlat = dist_m * math.cos(bearing) / 111_195.0
    dlon = dist_m * math.sin(bearing) / (111_195.0 * max(0.2, math.cos(math.radians(lat))))
    return max(-89.9, min(89.9, lat + dlat)), ((lon + dlon + 180) % 360) - 180


_COMPASS = ("N", "NNE", "NE", "ENE", "E", "ESE", "SE", "SSE",
            "S", "SSW", "SW", "WSW", "W", "WNW", "NW", "NNW")  # fmt: skip


def bearing_distance(frm: Point, to: Point) -> tuple[float, float]:
    """(true bearing in degrees, distance in NM) from `frm` to `to`."""
    dy = (to[0] - frm[0]) * 111_195.0
    dx = (to[1] - frm[1]) * 111_195.0 * math.cos(math.radians(frm[0]))
    return math.degrees(math.atan2(dx, dy)) % 360, math.hypot(dx, dy) / NM_M


def compass(bearing: float) -> str:
    return _COMPASS[round(bearing / 22.5) % 16]


# ---- numbers, limits, times --------------------------------------------------------------------


def num_text(v: float, leading_zero: bool = True) -> str:
    """0.5 -> '0.5' (or '.5'), 2.0 -> '2'."""
    s = f"{v:g}"
    return s[1:] if not leading_zero and s.startswith("0.") else s


def json_num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


@dataclass(frozen=True)
class LimitSpec:
    """A vertical limit as drawn by the generator; `limit` is its normalised value."""

    value: float
    unit: str  # FT, M, FL, UNL; SFC/GND are unit FT with ref SFC
    ref: str  # SFC, GND, AMSL, MSL, AGL, STD, UNL

    @property
    def limit(self) -> Limit:
        if self.ref in ("SFC", "GND"):
            return SFC
        if self.unit == "UNL":
            return UNL
        ref = {"MSL": "AMSL"}.get(self.ref, self.ref)
        return Limit(value=float(self.value), unit=self.unit, ref=ref)

    def arg(self) -> dict:
        """The gold tool argument (the model maps GND -> SFC and MSL -> AMSL)."""
        if self.ref in ("SFC", "GND"):
            return {"value": 0, "unit": "FT", "ref": "SFC"}
        if self.unit == "UNL":
            return {"unit": "UNL"}
        ref = {"MSL": "AMSL"}.get(self.ref, self.ref)
        return {"value": json_num(self.value), "unit": self.unit, "ref": ref}

    @property
    def is_default_lower(self) -> bool:
        return self.ref in ("SFC", "GND")

    @property
    def is_unlimited(self) -> bool:
        return self.unit == "UNL"

    def notam(self) -> str:
        """ICAO / FAA contraction: SFC, GND, 400FT AGL, 3000FT MSL, FL095, 150M AGL, UNL."""
        if self.ref in ("SFC", "GND", "UNL"):
            return self.ref
        if self.unit == "FL":
            return f"FL{int(self.value):03d}"
        return f"{num_text(self.value)}{self.unit} {self.ref}"

    def feet_amsl(self, elevation_ft: float) -> float:
        """Rough altitude in feet for the Q-line (AGL limits use the aerodrome elevation)."""
        if self.ref in ("SFC", "GND"):
            return 0.0
        if self.unit == "UNL":
            return 99_900.0
        ft = (
            self.value * 100
            if self.unit == "FL"
            else self.value / (0.3048 if self.unit == "M" else 1)
        )
        return ft + (elevation_ft if self.ref == "AGL" else 0.0)


def sfc(rng: random.Random, gnd_p: float = 0.2) -> LimitSpec:
    return LimitSpec(0, "FT", "GND" if rng.random() < gnd_p else "SFC")


def unl() -> LimitSpec:
    return LimitSpec(0, "UNL", "UNL")


def pick_upper(rng: random.Random, *, flight_levels: bool = True, metres: bool = True) -> LimitSpec:
    """A realistic upper limit for a drone / TFR zone."""
    choices = [
        (400, "FT", "AGL"), (200, "FT", "AGL"), (500, "FT", "AGL"), (1200, "FT", "AGL"),
        (500, "FT", "AMSL"), (1500, "FT", "AMSL"), (2000, "FT", "AMSL"), (3000, "FT", "AMSL"),
    ]  # fmt: skip
    if metres:
        choices += [(120, "M", "AGL"), (150, "M", "AGL"), (300, "M", "AGL"), (600, "M", "AMSL")]
    if flight_levels:
        choices += [(45, "FL", "STD"), (95, "FL", "STD"), (125, "FL", "STD"), (195, "FL", "STD")]
    return LimitSpec(*rng.choice(choices))


def pick_window(rng: random.Random) -> tuple[datetime, datetime]:
    """A start in 2024-2026 on a round minute and a realistic duration."""
    day = datetime(2024, 1, 1) + timedelta(days=rng.randrange(3 * 365))
    start = day.replace(hour=rng.randrange(24), minute=rng.choice((0, 0, 0, 0, 15, 30, 30, 45)))
    hours = rng.choice((1, 2, 2, 3, 4, 5, 6, 8, 10, 12, 14, 24, 36, 48, 72, 120, 168, 336, 720))
    return start, start + timedelta(hours=hours, minutes=rng.choice((0, 0, 0, 30)))


def iso_z(t: datetime | None) -> str | None:
    return None if t is None else t.strftime("%Y-%m-%dT%H:%MZ")


def notam_time(t: datetime) -> str:
    return t.strftime("%y%m%d%H%M")
