"""Plain-English drone restriction notices: decimal or DMS centres, km / m / NM radii, ft / m
heights, UTC or local times with a stated offset, polygons, daily hours; and notices that order
no zone (runway works, unlit masts, reminders, bird warnings) as negatives."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from clover.tasks.airspace.formats import (
    Area,
    Msg,
    Radius,
    Turn,
    When,
    add_zone,
    pick_radius,
    polygon_area,
    rwy,
    wrap,
)
from clover.tasks.airspace.normalise import MONTHS
from clover.tasks.airspace.writing import (
    COORD_WRITERS,
    LimitSpec,
    Written,
    num_text,
    offset_point,
    pick_upper,
    pick_window,
    sfc,
)

COORDS = ("dms_sym", "dms_ascii", "dec_signed", "dec_hemi", "dec_plain", "dms_sp")
EVENTS = ("music festival", "air show", "state visit", "marathon", "royal visit",
          "firework display", "football match", "summit", "film shoot")  # fmt: skip
CIRCLE_NOTICES = (
    "TEMPORARY DRONE RESTRICTION - {place}\nUnmanned aircraft must not be flown within {r} of "
    "{c} between {t1} and {t2}, from the surface up to {up}.{sched}",
    "Flight Restriction Zone: {place} {event}\nCentre: {c}\nRadius: {r}\nLimits: {lo} to {up}\n"
    "Valid: {t1} - {t2}{sched}",
    "Restricted Area (Temporary) for the {place} {event}. No drones within a radius of {r} "
    "centred on {c}, {lo} to {up}, from {t1} to {t2}.{sched}",
    "NOTICE TO DRONE PILOTS\nA temporary flight restriction is in force around {c} (radius {r}) "
    "for the {event}.\nFrom: {t1}\nTo: {t2}\nHeight: up to {up}{sched}",
    "The airspace within {r} of {c}, from {lo} to {up}, is closed to all unmanned aircraft "
    "from {t1} until {t2} for the {event}.{sched}",
)  # fmt: skip
POLYGON_NOTICES = (
    "TEMPORARY DRONE RESTRICTION - {place}\nNo unmanned aircraft may fly inside the area "
    "bounded by {p}, from {lo} to {up}, between {t1} and {t2}.{sched}",
    "Flight Restriction Zone: {place} {event}\nArea: {p}\nLimits: {lo} to {up}\nValid: {t1} - "
    "{t2}{sched}",
    "Drones are banned within the polygon joining {p} ({lo} to {up}) from {t1} to {t2}.{sched}",
)  # fmt: skip
AERODROME = (
    "Drone restriction at {name} ({icao}): no unmanned aircraft may be flown within {r} of the "
    "aerodrome from {t1} until further notice, from the surface to {up}.",
    "Until further notice from {t1}, {name} ({icao}) has a drone exclusion zone of {r} around "
    "the airfield, surface to {up}.",
)  # fmt: skip
SCHEDULES = (" Active {s}.", " Active {s} only.", " Hours: {s}.")
NEGATIVES = (
    "Runway {rwy} at {name} will be closed for resurfacing from {t1} to {t2}.",
    "The obstacle light on the mast at {c} is unserviceable until {t2}.",
    "Drone pilots are reminded to register before flying anywhere near {name}.",
    "Increased bird activity is reported within {r} of {name}. Pilots should exercise caution.",
    "The instrument approach procedure for runway {rwy1} at {name} has been amended; new charts "
    "take effect on {t1}.",
    "Taxiway {twy} at {name} is closed until {t2}. Expect delays on the ground.",
    "The VOR at {name} will be out of service for maintenance from {t1} to {t2}.",
    "A crane up to 150 ft above ground will operate at {c} from {t1} to {t2}; it is lit at "
    "night.",
)  # fmt: skip


def plain_time(style: int, d: datetime) -> str:
    m = MONTHS[d.month - 1]
    return (f"{d:%H:%M} UTC on {d.day} {m} {d.year}", f"{d.day} {m} {d.year} {d:%H%M}Z",
            f"{d:%H%M} UTC {d.day} {m[:3].upper()} {d.year}")[style]  # fmt: skip


def _radius(rng: random.Random, r: Radius) -> str:
    words = {"NM": ("NM", " nautical miles", " nm"), "KM": (" km", " kilometres", "km"),
             "M": (" m", " metres", " meters")}  # fmt: skip
    return f"{num_text(r.value)}{rng.choice(words[r.unit])}"


def _limit(rng: random.Random, lim: LimitSpec) -> str:
    if lim.is_default_lower:
        return rng.choice(("the surface", "ground level", "SFC"))
    value = f"{int(lim.value):,}" if lim.value >= 1000 and rng.random() < 0.5 else num_text(
        lim.value)  # fmt: skip
    unit = {"FT": rng.choice((" ft", " feet")), "M": rng.choice((" m", " metres"))}[lim.unit]
    ref = {"AGL": (" AGL", " above ground level"), "AMSL": (" AMSL", " above mean sea level")}
    return f"{value}{unit}{rng.choice(ref[lim.ref])}"


def plain_notice(t: Turn) -> Msg:
    """A plain-English drone restriction notice, or (about one in six) a notice with no zone."""
    rng, a = t.rng, t.airport("plain")
    if rng.random() < 0.16:
        return _negative(t, a)
    if t.heldout and rng.random() < 0.3:
        return _local(t, a)
    start, end = pick_window(rng)
    up = pick_upper(rng, flight_levels=False)
    msg, ts = Msg(text="", kind="plain_notice"), rng.randrange(3)
    fill = {"place": a["city"], "event": rng.choice(EVENTS), "lo": _limit(rng, sfc(rng)),
            "up": _limit(rng, up), "t1": plain_time(ts, start), "t2": plain_time(ts, end),
            "name": a["name"], "icao": a["icao"], "sched": ""}  # fmt: skip
    when = When(fill["t1"], fill["t2"], start, end)
    point = offset_point(rng, a["lat"], a["lon"], 20)
    layout = rng.choice(COORDS)
    if rng.random() < 0.12:
        area = Area(Written(a["icao"], round(a["lat"], 7), round(a["lon"], 7)), pick_radius(rng))
        fill["r"] = _radius(rng, area.radius)
        text, when.end, when.end_utc = t.wording("plain.aerodrome", AERODROME), None, None
    elif rng.random() < 0.2:
        area = polygon_area(rng, point, layout)
        fill["p"] = rng.choice(("; ", ", then ", " / ")).join(v.text for v in area.vertices)
        text = t.wording("plain.polygon", POLYGON_NOTICES)
    else:
        area = circle_of(rng, point, layout)
        fill["c"], fill["r"] = area.centre.text, _radius(rng, area.radius)
        text = t.wording("plain.circle", CIRCLE_NOTICES)
    if "{sched}" in text and end - start >= timedelta(days=2) and rng.random() < 0.3:
        when.schedule = rng.choice(("daily 0900-1700", "MON-FRI 0800-1800", "0600-2000 daily"))
        fill["sched"] = t.wording("plain.schedule", SCHEDULES).format(s=when.schedule)
    keep = [w.text for w in (area.vertices or [area.centre])] + [fill["t1"], fill["t2"]]
    keep += [when.schedule] if when.schedule else []
    msg.text = wrap(rng, text.format(**fill), 0.15, keep)
    add_zone(msg, zone_id=t.zone_id(), area=area, lower=sfc(rng, 0), upper=up, when=when)
    msg.templates = t.used[:]
    return msg


def circle_of(rng: random.Random, point: tuple[float, float], layout: str) -> Area:
    return Area(COORD_WRITERS[layout](*point), pick_radius(rng))


def _local(t: Turn, a: dict) -> Msg:
    """Held-out phrasing: local times with a stated UTC offset."""
    rng = t.rng
    start, end = pick_window(rng)
    r, up = pick_radius(rng), pick_upper(rng, flight_levels=False)
    hours = max(-11, min(13, round(a["lon"] / 15)))
    off = f"{'+' if hours >= 0 else '-'}{abs(hours):02d}:00"
    ls, le = start + timedelta(hours=hours), end + timedelta(hours=hours)
    centre = COORD_WRITERS[rng.choice(("dms_sym", "dec_signed", "dms_spaced"))](
        *offset_point(rng, a["lat"], a["lon"], 20))  # fmt: skip
    msg = Msg(text="", kind="plain_notice", templates=[*t.used, "plain.local:0"])
    msg.text = (f"Temporary restricted airspace is declared near {a['city']} for the "
                f"{rng.choice(EVENTS)}. RPA operations are not permitted inside a "
                f"{_radius(rng, r)} radius of {centre.text} from the surface to "
                f"{_limit(rng, up)}, from {ls:%H:%M} on {ls.day} {MONTHS[ls.month - 1]} "
                f"{ls.year} to {le:%H:%M} on {le.day} {MONTHS[le.month - 1]} {le.year} local "
                f"time (UTC{off}).")  # fmt: skip
    when = When(f"{ls:%H:%M} on {ls.day} {MONTHS[ls.month - 1]} {ls.year} UTC{off}",
                f"{le:%H:%M} on {le.day} {MONTHS[le.month - 1]} {le.year} UTC{off}", start, end)
    add_zone(msg, zone_id=t.zone_id(), area=Area(centre, r), lower=sfc(rng, 0), upper=up,
             when=when)  # fmt: skip
    return msg


def _negative(t: Turn, a: dict) -> Msg:
    rng = t.rng
    start, end = pick_window(rng)
    ts = rng.randrange(3)
    c = COORD_WRITERS[rng.choice(COORDS)](*offset_point(rng, a["lat"], a["lon"], 5))
    text = t.wording("plain.negative", NEGATIVES).format(
        rwy=rwy(rng), rwy1=rwy(rng).split("/")[0], name=a["name"], t1=plain_time(ts, start),
        t2=plain_time(ts, end), c=c.text, r=_radius(rng, Radius(rng.choice((2, 5)), "NM")),
        twy=rng.choice("ABCDEFGHJK"))  # fmt: skip
    return Msg(text=text, kind="plain_negative", templates=t.used[:])
