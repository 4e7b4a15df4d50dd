"""AIP ENR 5.1 area entries (prohibited, restricted and danger areas) as national AIPs print
them: a designator and name, lateral limits (a circle in several wordings, or a polygon with
vertices joined by dashes, commas or line breaks, sometimes with place names between them),
limits as `ALT 5 000 ft` / `Upper limits: 2500 FT AMSL` / `FL370 / SFC` / metres, and remarks
that carry H24, activation by NOTAM or a daily schedule. Permanent areas have no times."""

from __future__ import annotations

import random

from clover.tasks.airspace.formats import (
    Area,
    Msg,
    Turn,
    When,
    add_zone,
    circle_area,
    polygon_area,
)
from clover.tasks.airspace.writing import LimitSpec, json_num, num_text, offset_point, sfc

KINDS = (("PROHIBITED AREA", "P"), ("RESTRICTED AREA", "R"), ("DANGER AREA", "D"))
CIRCLES = ("Circle of {r} radius centred at {c}", "A circle, radius {r} centered at {c}",
           "Circle, radius {r}, centre {c}.", "{c} radius {r}",
           "Within a radius of {r} of {c}")  # fmt: skip
POLY_JOIN = (" - ", ",\n", "\n", ", ", " -\n")
POLY_LEAD = ("", "An area bounded by: ", "", "Lateral limits: ")
LIMITS = ("ALT {up}\n{lo}", "Upper limits: {up}\nLower limits: {lo}", "{up} /\n{lo}",
          "Upper limit: {up} Lower limit: {lo}")  # fmt: skip
REMARKS = ("H24\n{why}", "Period of activity to be notified by NOTAM.\n{why}",
           "Permanently active military area.", "{why}\nEntry subject to prior permission.")
SCHEDULED = ("{s}\n{why}", "Active: {s}\n{why}", "Time of activity: {s}. {why}")
SCHEDULES = ("Daily: 0030 - 1200", "MON-FRI 0700-1600", "Daily 0800-1800", "SAT SUN 0900-1700",
             "MON-THU 0600-2200")  # fmt: skip
WHY = ("Military firing", "Explosive depot", "Satellite earth station", "Police firing.",
       "Artillery firing", "Prison", "Power station", "Training area for light aircraft.")
PLACES = ("Hill", "Point", "Bay", "Lake", "Quarry", "Farm", "Bridge")


def aip_area(t: Turn) -> Msg:
    """One ENR 5.1 entry: a circle or a polygon with its limits and remarks, no B)-C) times."""
    rng, a = t.rng, t.airport("icao")
    word, letter = rng.choice(KINDS)
    name = f"{a['icao'][:2]}{letter}{rng.randint(1, 399)} {a['city'].upper()}"
    point = offset_point(rng, a["lat"], a["lon"], 40)
    layout = rng.choice(("dms_sp", "dms_join", "dm", "dms_decsec"))
    area = polygon_area(rng, point, layout) if rng.random() < 0.45 else circle_area(
        rng, point, layout)  # fmt: skip
    lateral = _lateral(t, area)
    lower, upper = _limits(rng)
    limits = t.wording("aip.limits", LIMITS).format(up=_limit_text(rng, upper, True),
                                                    lo=_limit_text(rng, lower, False))
    schedule = rng.choice(SCHEDULES) if rng.random() < 0.3 else None
    why = rng.choice(WHY)
    remark = (t.wording("aip.scheduled", SCHEDULED).format(s=schedule, why=why) if schedule
              else t.wording("aip.remark", REMARKS).format(why=why))  # fmt: skip
    head = f"{word}\n{name}" if rng.random() < 0.5 else name
    msg = Msg(text=f"{head}\n{lateral}\n{limits}\n{remark}", kind="aip_area")
    add_zone(msg, zone_id=name.split()[0], area=area, lower=lower, upper=upper,
             when=When(None, None, None, None, schedule))  # fmt: skip
    msg.templates = t.used[:]
    return msg


def _lateral(t: Turn, area: Area) -> str:
    rng = t.rng
    if area.vertices:
        join = t.wording("aip.poly_join", POLY_JOIN)
        texts = [v.text + (f" {rng.choice(PLACES)}" if rng.random() < 0.15 else "")
                 for v in area.vertices]  # fmt: skip
        closing = join + area.vertices[0].text if rng.random() < 0.6 else ""
        return t.wording("aip.poly_lead", POLY_LEAD) + join.join(texts) + closing + "."
    r = area.radius
    r_text = f"{num_text(r.value)} {r.unit}"
    if r.unit == "NM" and rng.random() < 0.4:  # the metric equivalent in brackets
        r_text += f" ({r.metres / 1000:.1f} km)"
    if rng.random() < 0.15 and "." in r_text.split()[0]:
        r_text = r_text.replace(".", ",", 1)  # decimal comma
    return t.wording("aip.circle", CIRCLES).format(r=r_text, c=area.centre.text)


def _limits(rng: random.Random) -> tuple[LimitSpec, LimitSpec]:
    roll = rng.random()
    if roll < 0.6:
        return sfc(rng, 0.5), LimitSpec(rng.choice((1000, 2000, 2500, 3000, 5000, 12000)),
                                        "FT", "AMSL")  # fmt: skip
    if roll < 0.8:
        return sfc(rng, 0.5), LimitSpec(rng.choice((95, 195, 370)), "FL", "STD")
    if roll < 0.9:
        return LimitSpec(6000, "M", "AMSL"), LimitSpec(15000, "M", "AMSL")
    return LimitSpec(rng.choice((1000, 2000)), "FT", "AMSL"), LimitSpec(
        rng.choice((95, 125)), "FL", "STD")  # fmt: skip


def _limit_text(rng: random.Random, lim: LimitSpec, upper: bool) -> str:
    """ALT-style limits: `5 000 ft` (AMSL, thousands with a space), `2500 FT AMSL`, `FL370`,
    `15 000 m`, `GND` / `SFC`."""
    if lim.is_default_lower:
        return rng.choice(("GND", "SFC", "Ground"))
    if lim.unit == "FL":
        return f"FL{int(lim.value):03d}"
    value = int(lim.value)
    spaced = f"{value:,}".replace(",", " ") if value >= 1000 and rng.random() < 0.6 else str(value)
    if lim.unit == "M":
        return f"{spaced} m" + (" AMSL" if rng.random() < 0.5 else "")
    return rng.choice((f"{spaced} ft", f"{json_num(value)} FT AMSL", f"{spaced} ft MSL"))
