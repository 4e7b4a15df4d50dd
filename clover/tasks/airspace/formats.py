"""Building blocks shared by the message families (`msg_icao`, `msg_faa`, `msg_cn`, `msg_plain`).

A builder draws one realistic message and returns it as a `Msg`: the text, its gold tool calls,
the normalised zones they mean, cancelled ids, and the ids of the wordings it used. Truth comes
from the values the builder printed (see `writing.py`), never from parsing the text. Every
wording list is split by `Turn.wording`: its last quarter (rounded, at least one) is held-out
only, so the held-out split reads templates no other split has.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from clover.tasks.airspace.normalise import NM_M, Zone, close_polygon, enclosing_circle
from clover.tasks.airspace.writing import COORD_WRITERS, LimitSpec, Written, iso_z, json_num

RADIUS_UNITS_M = {"NM": NM_M, "KM": 1000.0, "M": 1.0}


@dataclass
class Msg:
    """One message with its gold calls, normalised zones, cancelled ids and wording ids."""

    text: str
    kind: str
    calls: list[dict] = field(default_factory=list)
    zones: list[Zone] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    templates: list[str] = field(default_factory=list)


@dataclass
class Turn:
    """Shared state while drawing one user turn (and the wordings it used)."""

    rng: random.Random
    pools: dict[str, tuple[dict, ...]]
    heldout: bool
    next_zone: int = 1
    used: list[str] = field(default_factory=list)

    def airport(self, family: str) -> dict:
        return self.rng.choice(self.pools[family])

    def zone_id(self) -> str:
        self.next_zone += 1
        return f"Z{self.next_zone - 1}"

    def pick(self, train: Sequence, heldout: Sequence):
        return self.rng.choice(heldout if self.heldout else train)

    def wording(self, name: str, options: Sequence):
        """One of `options`, recorded as `name:index`; held-out draws only from the last quarter."""
        held = max(1, round(len(options) / 4))
        if len(options) < 2:
            raise ValueError(f"wording {name!r} needs a train and a held-out option")
        lo, hi = (len(options) - held, len(options)) if self.heldout else (0, len(options) - held)
        k = self.rng.randrange(lo, hi)
        self.used.append(f"{name}:{k}")
        return options[k]


@dataclass(frozen=True)
class Radius:
    value: float
    unit: str  # NM, KM, M

    @property
    def metres(self) -> float:
        return self.value * RADIUS_UNITS_M[self.unit]

    def arg(self) -> dict:
        return {"value": json_num(self.value), "unit": self.unit}


def pick_radius(rng: random.Random, units: str = "NM KM M") -> Radius:
    unit = rng.choice(units.split())
    values = {
        "NM": (0.5, 0.5, 1, 1, 1.5, 2, 2, 3, 5, 0.3, 0.25, 10, 4, 8),
        "KM": (0.5, 1, 1, 1.5, 2, 3, 3, 5, 8, 10, 2.5, 4, 20),
        "M": (100, 200, 300, 300, 500, 500, 800, 1000, 1500, 2000, 250, 150, 3000),
    }[unit]
    return Radius(rng.choice(values), unit)


@dataclass
class Area:
    """One drawn area: a circle (centre + radius) or a polygon (vertices), as written."""

    centre: Written | None = None
    radius: Radius | None = None
    vertices: list[Written] = field(default_factory=list)


def circle_area(rng: random.Random, point: tuple[float, float], layout: str,
                units: str = "NM KM M") -> Area:  # fmt: skip
    return Area(COORD_WRITERS[layout](*point), pick_radius(rng, units))


def polygon_area(rng: random.Random, point: tuple[float, float], layout: str) -> Area:
    """3 to 6 vertices around `point` (2-9 km out), in angular order, so the outline is simple;
    redrawn until every vertex prints differently in `layout`."""
    while True:
        n, size = rng.choice((3, 4, 4, 4, 5, 6)), rng.uniform(2.0, 9.0) * 1000
        angles = sorted(rng.uniform(0, 2 * math.pi) for _ in range(n))
        verts = [_vertex(point, a, size * rng.uniform(0.5, 1.0), layout) for a in angles]
        if len({v.text for v in verts}) == n:
            return Area(vertices=verts)


def _vertex(point: tuple[float, float], angle: float, dist_m: float, layout: str) -> Written:
    lat = point[0] + dist_m * math.cos(angle) / 111_195.0
    lon = point[1] + dist_m * math.sin(angle) / (111_195.0 * max(0.2, math.cos(math.radians(
        point[0]))))  # fmt: skip
    return COORD_WRITERS[layout](lat, lon)


@dataclass
class When:
    """Gold time arguments and their UTC values, plus a schedule as written (or None)."""

    start: str | None
    end: str | None
    start_utc: datetime | None
    end_utc: datetime | None
    schedule: str | None = None


def add_zone(msg: Msg, *, zone_id: str, area: Area, lower: LimitSpec, upper: LimitSpec,
             when: When, replaces: str | None = None) -> None:  # fmt: skip
    """Append the gold call and its normalised zone. Default limits (SFC, UNL) are omitted."""
    args: dict = {"zone_id": zone_id}
    if area.vertices:
        args["polygon"] = [v.text for v in area.vertices]
        poly = close_polygon([(v.lat, v.lon) for v in area.vertices])
        lat, lon, radius_m = enclosing_circle(poly)
    else:
        args["centre"], args["radius"] = area.centre.text, area.radius.arg()
        poly, lat, lon, radius_m = (), area.centre.lat, area.centre.lon, area.radius.metres
    if not lower.is_default_lower:
        args["lower"] = lower.arg()
    if not upper.is_unlimited:
        args["upper"] = upper.arg()
    args["start"], args["end"] = when.start, when.end
    if when.schedule:
        args["schedule"] = when.schedule
    if replaces:
        args["action"], args["replaces"] = "replace", replaces
    msg.calls.append({"name": "set_no_fly_zone", "arguments": args})
    msg.zones.append(Zone(
        lat=round(lat, 7), lon=round(lon, 7), radius_m=radius_m, lower=lower.limit,
        upper=upper.limit, start_utc=iso_z(when.start_utc), end_utc=iso_z(when.end_utc),
        id=zone_id, replaces=replaces, polygon=poly,
        schedule=" ".join(when.schedule.upper().replace(".", " ").split()) if when.schedule
        else None,
    ))  # fmt: skip


def cancel_zone(msg: Msg, zone_id: str) -> None:
    msg.calls.append({"name": "clear_zone", "arguments": {"zone_id": zone_id}})
    msg.cancels.append(zone_id)


def rwy(rng: random.Random) -> str:
    a = rng.randint(1, 18)
    side = rng.choice(("", "", "L", "R"))
    other = {"L": "R", "R": "L", "": ""}[side]
    return f"{a:02d}{side}/{a + 18:02d}{other}"


def wrap(rng: random.Random, text: str, p: float = 0.3, keep: Sequence[str] = (),
         width: tuple = (45, 75)) -> str:  # fmt: skip
    """Noise: with probability p, break the text into lines as teleprinters and portals do,
    never inside a `keep` string (a coordinate the gold answer copies)."""
    if rng.random() >= p:
        return text
    for k in keep:
        text = text.replace(k, k.replace(" ", "\x00"))
    limit, lines, line = rng.randint(*width), [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line]).replace("\x00", " ")
