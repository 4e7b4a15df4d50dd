"""Message families: ICAO NOTAMs, FAA domestic / FDC TFRs, Chinese notices, plain English.

Each builder draws one realistic message over a real airport and returns it with its gold tool
calls and normalised zones (`Msg`). Builders share a `Turn` (the RNG, the split's airport pools,
a zone-id counter). Templates marked held-out are used only by the `heldout` split, so a model
that memorised training phrasings is caught. Builders never parse text: truth comes from the
values they printed (see `writing.py`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from clover.tasks.airspace.normalise import MONTHS, NM_M, Zone
from clover.tasks.airspace.places import CN_AIRPORTS, FIRS, US_STATES
from clover.tasks.airspace.writing import (
    COORD_WRITERS,
    LimitSpec,
    Written,
    bearing_distance,
    compass,
    iso_z,
    json_num,
    notam_time,
    num_text,
    offset_point,
    pick_upper,
    pick_window,
    sfc,
    unl,
)

RADIUS_UNITS_M = {"NM": NM_M, "KM": 1000.0, "M": 1.0}


@dataclass
class Msg:
    """One message with its gold calls, normalised zones and cancelled ids."""

    text: str
    kind: str
    calls: list[dict] = field(default_factory=list)
    zones: list[Zone] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)


@dataclass
class Turn:
    """Shared state while drawing one user turn."""

    rng: random.Random
    pools: dict[str, tuple[dict, ...]]
    heldout: bool
    next_zone: int = 1

    def airport(self, family: str) -> dict:
        return self.rng.choice(self.pools[family])

    def zone_id(self) -> str:
        self.next_zone += 1
        return f"Z{self.next_zone - 1}"

    def pick(self, train: list | tuple, heldout: list | tuple):
        return self.rng.choice(heldout if self.heldout else train)


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
        "NM": (0.5, 0.5, 1, 1, 1.5, 2, 2, 3, 5, 0.3, 0.25, 10),
        "KM": (0.5, 1, 1, 1.5, 2, 3, 3, 5, 8, 10, 2.5),
        "M": (100, 200, 300, 300, 500, 500, 800, 1000, 1500, 2000, 250),
    }[unit]
    return Radius(rng.choice(values), unit)


def add_zone(
    msg: Msg, *, zone_id: str, centre: Written, radius: Radius, lower: LimitSpec,
    upper: LimitSpec, start: str | None, end: str | None, start_utc: datetime | None,
    end_utc: datetime | None, replaces: str | None = None,
) -> None:  # fmt: skip
    """Append the gold call and its normalised zone. Default limits (SFC, UNL) are omitted."""
    args: dict = {"zone_id": zone_id, "centre": centre.text, "radius": radius.arg()}
    if not lower.is_default_lower:
        args["lower"] = lower.arg()
    if not upper.is_unlimited:
        args["upper"] = upper.arg()
    args["start"], args["end"] = start, end
    if replaces:
        args["action"], args["replaces"] = "replace", replaces
    msg.calls.append({"name": "set_no_fly_zone", "arguments": args})
    msg.zones.append(Zone(
        lat=round(centre.lat, 7), lon=round(centre.lon, 7), radius_m=radius.metres,
        lower=lower.limit, upper=upper.limit, start_utc=iso_z(start_utc), end_utc=iso_z(end_utc),
        id=zone_id, replaces=replaces,
    ))  # fmt: skip


def cancel_zone(msg: Msg, zone_id: str) -> None:
    msg.calls.append({"name": "clear_zone", "arguments": {"zone_id": zone_id}})
    msg.cancels.append(zone_id)


def rwy(rng: random.Random) -> str:
    a = rng.randint(1, 18)
    side = rng.choice(("", "", "L", "R"))
    other = {"L": "R", "R": "L", "": ""}[side]
    return f"{a:02d}{side}/{a + 18:02d}{other}"


# ---- ICAO NOTAM --------------------------------------------------------------------------------

# (Q-code, traffic, purpose, scope, E templates with {r} radius and {c} centre)
ICAO_SUBJECTS = (
    ("QRTCA", "IV", "BO", "W", ("TEMPORARY RESTRICTED AREA ACT WI {r} RADIUS: {c}.",
                                "TEMPO RESTRICTED AREA ESTABLISHED WI {r} RADIUS OF PSN {c} "
                                "FOR {why}.")),
    ("QWULW", "IV", "BO", "W", ("UAS OPS WI {r} RADIUS: {c}.",
                                "UNMANNED ACFT OPS WILL TAKE PLACE WI AREA: CIRCLE RADIUS {r} "
                                "CENTRED ON {c}.")),
    ("QRPCA", "IV", "BO", "W", ("PSN {c} RADIUS {r}. FLT OF UNMANNED ACFT PROHIBITED.",
                                "PROHIBITED AREA ACT WI {r} RADIUS CENTERED PSN {c}.")),
    ("QRDCA", "IV", "BO", "W", ("DANGER AREA ACT WI {r} RADIUS CENTERED PSN {c} DUE TO MIL EXER.",
                                "WI {r} RADIUS CENTRED {c} DANGER AREA ACT.")),
    ("QWELW", "IV", "M", "W", ("MIL EXER WI {r} RADIUS OF {c}.",)),
    ("QWPLW", "IV", "M", "W", ("PJE WI {r} RADIUS OF {c}. ACFT AVOID AREA.",)),
    ("QWMLW", "IV", "BO", "W", ("GUN FIRING WI {r} RADIUS CENTRED ON {c}.",)),
    ("QRRCA", "IV", "BO", "W", ("RESTRICTED AREA WI {r} RADIUS CENTRED ON {c} ACT FOR VIP FLT.",)),
)  # fmt: skip
ICAO_E_HELDOUT = (
    "AIRSPACE RESERVED FOR RPAS FLIGHTS IN A CIRCLE OF {r} RADIUS AROUND {c}.",
    "ACTIVATION OF TEMPORARY SEGREGATED AREA. CIRCLE CENTRE {c} RADIUS {r}.",
    "AERIAL WORK BY REMOTELY PILOTED ACFT WITHIN CIRCLE OF {r} RADIUS CENTRED AT {c}.",
)
ICAO_WHY = ("UAS OPS", "AERIAL PHOTOGRAPHY", "VIP VISIT", "SPORTING EVENT", "STATE CEREMONY")
ICAO_COORDS = ("dms_sp", "dms_sp", "dms_join", "dms_pre", "dms_pre_sp", "dm_dec", "dms_decsec")
ICAO_COORDS_HELDOUT = ("dms_spaced", "dms_sp", "dms_ascii", "dm", "dms_join")
ICAO_NEGATIVE = (
    ("QMRLC", "A", "RWY {rwy} CLSD DUE TO WIP."),
    ("QOLAS", "AW", "OBST LGT ON CRANE PSN {c} HGT {h}FT AMSL U/S."),
    ("QMXLC", "A", "TWY {twy} CLSD DUE TO MAINT."),
    ("QICAS", "A", "ILS RWY {rwy1} NOT AVBL."),
    ("QFAAH", "A", "AD HR OF OPS: MON-FRI 0600-2000."),
)


def _radius_notam(r: Radius, rng: random.Random) -> str:
    unit = "MTR" if r.unit == "M" and rng.random() < 0.5 else r.unit
    return f"{num_text(r.value)}{unit}"


def _q_line(
    fir: str,
    code: str,
    traffic: str,
    purpose: str,
    scope: str,
    lower: LimitSpec,
    upper: LimitSpec,
    centre: tuple[float, float],
    radius_m: float,
    elev: float,
) -> str:
    lo = min(999, int(lower.feet_amsl(elev) // 100))
    up = min(999, math.ceil(upper.feet_amsl(elev) / 100))
    lat, lon = centre
    la, lo_m = round(abs(lat) * 60), round(abs(lon) * 60)
    pos = (
        f"{la // 60:02d}{la % 60:02d}{'N' if lat >= 0 else 'S'}"
        f"{lo_m // 60:03d}{lo_m % 60:02d}{'E' if lon >= 0 else 'W'}"
    )
    nm = max(1, math.ceil(radius_m / NM_M))
    return f"Q) {fir}/{code}/{traffic}/{purpose}/{scope}/{lo:03d}/{up:03d}/{pos}{nm:03d}"


def _notam_id(rng: random.Random, year: int) -> str:
    return f"{rng.choice('ABCDW')}{rng.randint(1, 9999):04d}/{year % 100:02d}"


def _notam_times(rng: random.Random, start: datetime, end: datetime | None) -> str:
    c = "PERM" if end is None else notam_time(end) + (" EST" if rng.random() < 0.1 else "")
    return f"B) {notam_time(start)} C) {c}"


def _schedule(rng: random.Random, start: datetime, end: datetime | None) -> str:
    if end is None or end - start < timedelta(days=2) or rng.random() < 0.6:
        return ""
    h = rng.choice(("DAILY 0700-1900", "MON-FRI 0800-1600", "SR-SS", "DAILY 2200-0500"))
    return f"D) {h}\n"


def icao_notam(
    t: Turn, *, kind: str = "N", ref: str | None = None, airport: dict | None = None,
    nid: str | None = None, allow_negative: bool = True,
) -> Msg:  # fmt: skip
    """An ICAO-format NOTAM (NOTAMN; NOTAMR replacing `ref`; NOTAMC cancelling `ref`)."""
    rng, a = t.rng, airport or t.airport("icao")
    start, end = pick_window(rng)
    end = None if kind == "N" and rng.random() < 0.04 else end
    nid = nid or _notam_id(rng, start.year)
    if kind == "N" and allow_negative and rng.random() < 0.12:
        return _icao_negative(t, a, nid, start, end)
    header = f"{nid} NOTAMN" if kind == "N" else f"{nid} NOTAM{kind} {ref}"
    code, traffic, purpose, scope, e_templates = rng.choice(ICAO_SUBJECTS)
    n_zones = 2 if kind != "C" and rng.random() < 0.1 else 1
    centres = [t.rng.choice(ICAO_COORDS_HELDOUT if t.heldout else ICAO_COORDS)]
    lower, upper = _icao_limits(rng)
    msg = Msg(text="", kind=f"icao_notam{kind.lower()}")
    base = offset_point(rng, a["lat"], a["lon"], 25)
    items, radii = [], []
    for k in range(n_zones):
        point = base if k == 0 else offset_point(rng, base[0], base[1], 8)
        c = COORD_WRITERS[centres[0]](*point)
        r = pick_radius(rng)
        items.append((c, r))
        radii.append(r.metres)
    if kind == "C":
        cancel_zone(msg, str(ref))
        e = rng.choice(
            ("UAS OPS CNL.", "TEMPORARY RESTRICTED AREA CANCELLED.", "AREA DEACTIVATED.")
        )
        code = code[:3] + "XX"
    else:
        e = _icao_e_text(t, e_templates, items)
        for k, (c, r) in enumerate(items):
            zid = nid if n_zones == 1 else f"{nid}-{k + 1}"
            add_zone(msg, zone_id=zid, centre=c, radius=r, lower=lower, upper=upper,
                     start=notam_time(start), end=end and notam_time(end), start_utc=start,
                     end_utc=end,
                     replaces=ref if kind == "R" else None)  # fmt: skip
    fir = rng.choice(FIRS[a["country"]])
    q = _q_line(fir, code, traffic, purpose, scope, lower, upper, base, max(radii), a["elevation"])
    times = f"B) {notam_time(start)}" if kind == "C" else _notam_times(rng, start, end)
    skip_fg = kind == "C" or (lower.is_default_lower and upper.is_unlimited and rng.random() < 0.7)
    fg = "" if skip_fg else f"\nF) {lower.notam()} G) {upper.notam()}"
    sched = "" if kind == "C" else _schedule(rng, start, end)
    body = f"{header}\n{q}\nA) {a['icao']} {times}\n{sched}E) {e}{fg}"
    msg.text = f"({body})" if rng.random() < 0.4 else body
    return msg


def _icao_limits(rng: random.Random) -> tuple[LimitSpec, LimitSpec]:
    """Lower and upper limit; a raised lower limit comes with an AMSL / FL upper above it."""
    if rng.random() < 0.85:
        return sfc(rng), pick_upper(rng) if rng.random() < 0.9 else unl()
    upper = LimitSpec(*rng.choice(((3000, "FT", "AMSL"), (95, "FL", "STD"), (125, "FL", "STD"))))
    return LimitSpec(rng.choice((500, 1000, 1500)), "FT", "AMSL"), upper


def _icao_e_text(t: Turn, templates: tuple[str, ...], items: list) -> str:
    rng = t.rng
    if len(items) == 1:
        c, r = items[0]
        template = rng.choice(ICAO_E_HELDOUT if t.heldout else templates)
        return template.format(r=_radius_notam(r, rng), c=c.text, why=rng.choice(ICAO_WHY))
    if t.heldout:
        parts = [f"AREA {chr(65 + k)}: CIRCLE RADIUS {_radius_notam(r, rng)} CENTRE {c.text}."
                 for k, (c, r) in enumerate(items)]  # fmt: skip
        return "RPAS FLIGHTS WITHIN: " + " ".join(parts)
    parts = [f"{k + 1}. {_radius_notam(r, rng)} RADIUS {c.text}" for k, (c, r) in enumerate(items)]
    return "UAS OPS WI FLW AREAS:\n" + "\n".join(parts)


def _icao_negative(t: Turn, a: dict, nid: str, start: datetime, end: datetime | None) -> Msg:
    rng = t.rng
    code, scope, e = rng.choice(ICAO_NEGATIVE)
    c = COORD_WRITERS[rng.choice(ICAO_COORDS)](*offset_point(rng, a["lat"], a["lon"], 3))
    e = e.format(rwy=rwy(rng), rwy1=rwy(rng).split("/")[0], twy=rng.choice("ABCDEFGKLMNPS"),
                 c=c.text, h=int(a["elevation"]) + rng.randrange(80, 400))  # fmt: skip
    fir = rng.choice(FIRS[a["country"]])
    la, lo = round(abs(a["lat"]) * 60), round(abs(a["lon"]) * 60)
    pos = (
        f"{la // 60:02d}{la % 60:02d}{'N' if a['lat'] >= 0 else 'S'}"
        f"{lo // 60:03d}{lo % 60:02d}{'E' if a['lon'] >= 0 else 'W'}"
    )
    q = f"Q) {fir}/{code}/IV/NBO/{scope}/000/999/{pos}005"
    body = f"{nid} NOTAMN\n{q}\nA) {a['icao']} {_notam_times(rng, start, end)}\nE) {e}"
    return Msg(text=f"({body})" if rng.random() < 0.4 else body, kind="icao_negative")


def icao_replace_pair(t: Turn) -> tuple[Msg, Msg]:
    """A NOTAMN and a later NOTAMR or NOTAMC that refers to it (multi-turn examples)."""
    a = t.airport("icao")
    first = icao_notam(t, airport=a, allow_negative=False)
    while len(first.zones) != 1:
        first = icao_notam(t, airport=a, allow_negative=False)
    ref = first.zones[0].id
    number = (int(ref[1:5]) + t.rng.randint(1, 60)) % 10000
    nid = f"{ref[0]}{number:04d}{ref[5:]}"
    return first, icao_notam(t, kind=t.rng.choice("RC"), ref=ref, airport=a, nid=nid)


# ---- FAA domestic and FDC ----------------------------------------------------------------------

FAA_UAS = (
    "!{acct} {num} {loc} AIRSPACE UAS WI AN AREA DEFINED AS {r} RADIUS OF {c} ({ref}) {lo}-{up} "
    "{t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE UAS WI {r}R {c} ({ref}) {lo}-{up} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE UNMANNED ACFT OPS WI AN AREA DEFINED AS {r} RADIUS OF {c} "
    "({ref}) {lo}-{up} {t1}-{t2}",
)
FAA_UAS_HELDOUT = (
    "!{acct} {num} {loc} AIRSPACE SUAS OPS WI A {r} RADIUS CENTERED ON {c} ({ref}) {lo}-{up} "
    "{t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE DRONE SWARM DEMO {r} RADIUS OF {c} ({ref}) {lo}-{up} {t1}-{t2}",
)
FDC_137 = (
    "FIRE FIGHTING ACFT OPS", "A HAZARD ASSOCIATED WITH A TOXIC GAS LEAK",
    "SEARCH AND RECOVERY OPS", "A BUILDING COLLAPSE",
)  # fmt: skip
FAA_NEGATIVE = (
    "!{acct} {num} {loc} RWY {rwy} CLSD {t1}-{t2}",
    "!{acct} {num} {loc} TWY {twy} CLSD {t1}-{t2}",
    "!{acct} {num} {loc} OBST TOWER LGT (ASR {asr}) {c} ({ref}) {h}FT ({agl}FT AGL) U/S {t1}-{t2}",
    "!{acct} {num} {loc} NAV ILS RWY {rwy1} LOC U/S {t1}-{t2}",
)


def _faa_ref(airport: dict, point: tuple[float, float], loc: str, fdc: bool) -> str:
    bearing, nm = bearing_distance((airport["lat"], airport["lon"]), point)
    if fdc:  # VOR/DME-style fix: ident, radial, distance
        return f"{loc}{round(bearing) % 360:03d}{nm:05.1f}"
    return f"{nm:.1f}NM {compass(bearing)} {loc}"


def _faa_radius(t: Turn, choices: tuple[float, ...] | None = None) -> tuple[Radius, str]:
    r = Radius(t.rng.choice(choices), "NM") if choices else pick_radius(t.rng, "NM")
    return r, num_text(r.value, leading_zero=t.rng.random() < 0.5) + "NM"


def faa_notam(t: Turn) -> Msg:
    """A US domestic (UAS) NOTAM or an FDC TFR (91.137 / 91.141 / 91.145 / 99.7)."""
    roll = t.rng.random()
    if roll < 0.12:
        return _faa_negative(t)
    if roll < 0.55:
        return _faa_uas(t)
    return _faa_fdc(t, t.rng.choice(("91.137", "91.141", "91.145", "99.7")))


def _faa_common(t: Turn) -> tuple[dict, str, datetime, datetime, tuple[float, float], Written]:
    rng, a = t.rng, t.airport("faa")
    loc = a["lid"] if a["lid"] and len(a["lid"]) == 3 else a["iata"]
    start, end = pick_window(rng)
    point = offset_point(rng, a["lat"], a["lon"], 20)
    centre = COORD_WRITERS[rng.choice(("dms_join",) * 4 + ("dms_slash",))](*point)
    return a, loc, start, end, point, centre


def _faa_times(rng: random.Random, start: datetime, end: datetime) -> tuple[str, str]:
    return notam_time(start), notam_time(end) + ("EST" if rng.random() < 0.1 else "")


def _faa_uas(t: Turn) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _faa_common(t)
    r, r_text = _faa_radius(t, (0.5, 0.5, 1, 1, 1.5, 2, 3, 0.3, 0.25))
    up = LimitSpec(rng.choice((200, 400, 400, 400, 700, 1200)), "FT", "AGL")
    if rng.random() < 0.15:
        up = LimitSpec(rng.choice((1500, 2500, 3000)), "FT", "MSL")
    num = f"{start.month:02d}/{rng.randint(1, 999):03d}"
    t1, t2 = _faa_times(rng, start, end)
    text = t.pick(FAA_UAS, FAA_UAS_HELDOUT).format(
        acct=loc,
        num=num,
        loc=loc,
        r=r_text,
        c=centre.text,
        ref=_faa_ref(a, point, loc, False),
        lo="SFC",
        up=up.notam(),
        t1=t1,
        t2=t2,
    )
    msg = Msg(text=text, kind="faa_uas")
    add_zone(msg, zone_id=f"{loc} {num}", centre=centre, radius=r, lower=sfc(rng, 0), upper=up,
             start=notam_time(start), end=notam_time(end), start_utc=start,
             end_utc=end)  # fmt: skip
    return msg


def _faa_fdc(t: Turn, part: str) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _faa_common(t)
    state, artcc = US_STATES[a["subd"]]
    num = f"{start.year % 10}/{rng.randint(1000, 9999)}"
    head = f"!FDC {num} {artcc} {state}..AIRSPACE {a['city'].upper()}, {state}.."
    ref = _faa_ref(a, point, loc, True)
    t1, t2 = _faa_times(rng, start, end)
    msg = Msg(text="", kind=f"faa_fdc_{part}")
    zid = f"FDC {num}"
    if part == "91.141":
        r1, r2 = Radius(rng.choice((3, 10)), "NM"), Radius(30, "NM")
        up = LimitSpec(17999, "FT", "MSL")
        area = "WI AN AREA DEFINED AS {r} RADIUS OF {c} ({ref}) SFC-17999FT MSL"
        a1 = area.format(r=f"{num_text(r1.value)}NM", c=centre.text, ref=ref)
        a2 = area.format(r="30NM", c=centre.text, ref=ref)
        msg.text = (f"{head}TEMPORARY FLIGHT RESTRICTIONS {t1}-{t2}. PURSUANT TO 14 CFR SECTION "
                    f"91.141 AIRCRAFT FLIGHT OPERATIONS ARE PROHIBITED {a1}, AND {a2}. "
                    "DUE TO VIP MOVEMENT.")  # fmt: skip
        for k, r in enumerate((r1, r2)):
            add_zone(
                msg,
                zone_id=f"{zid}-{k + 1}",
                centre=centre,
                radius=r,
                lower=sfc(rng, 0),
                upper=up,
                start=notam_time(start),
                end=notam_time(end),
                start_utc=start,
                end_utc=end,
            )
        return msg
    r, r_text = _faa_radius(t, (1, 2, 3, 3, 5, 5, 10))
    up = LimitSpec(*rng.choice(((3000, "FT", "AGL"), (2000, "FT", "AGL"), (15000, "FT", "MSL"),
                                (3000, "FT", "MSL"), (8000, "FT", "MSL"))))  # fmt: skip
    area = f"WI AN AREA DEFINED AS {r_text} RADIUS OF {centre.text} ({ref}) SFC-{up.notam()}"
    sub = rng.randint(1, 3)
    why = {
        "91.137": f"TEMPORARY FLIGHT RESTRICTIONS {area}. PURSUANT TO 14 CFR SECTION "
        f"91.137(A)({sub}) TEMPORARY FLIGHT RESTRICTIONS ARE IN EFFECT DUE TO "
        f"{rng.choice(FDC_137)}.",
        "91.145": f"TEMPORARY FLIGHT RESTRICTIONS FOR {rng.choice(('AIR SHOW', 'NASCAR RACE'))}. "
        f"PURSUANT TO 14 CFR SECTION 91.145, MANAGEMENT OF ACFT OPS IN THE VICINITY OF AERIAL "
        f"DEMONSTRATIONS AND MAJOR SPORTING EVENTS, {area}.",
        "99.7": f"SPECIAL SECURITY INSTRUCTIONS. PURSUANT TO 14 CFR SECTION 99.7, UNMANNED "
        f"AIRCRAFT FLIGHT OPS ARE PROHIBITED {area} DUE TO {a['city'].upper()} STADIUM EVENT.",
    }[part]
    msg.text = f"{head}{why} {artcc} ARTCC IS THE FAA CDN FACILITY. {t1}-{t2}"
    add_zone(msg, zone_id=zid, centre=centre, radius=r, lower=sfc(rng, 0), upper=up,
             start=notam_time(start), end=notam_time(end), start_utc=start,
             end_utc=end)  # fmt: skip
    return msg


def _faa_negative(t: Turn) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _faa_common(t)
    agl = rng.randrange(150, 1500)
    t1, t2 = _faa_times(rng, start, end)
    text = rng.choice(FAA_NEGATIVE).format(
        acct=loc, num=f"{start.month:02d}/{rng.randint(1, 999):03d}", loc=loc, rwy=rwy(rng),
        rwy1=rwy(rng).split("/")[0], twy=rng.choice("ABCDEFGHJKLM"), asr=rng.randint(1000000,
        1299999), c=centre.text, ref=_faa_ref(a, point, loc, False), h=int(a["elevation"]) + agl,
        agl=agl, t1=t1, t2=t2,
    )  # fmt: skip
    return Msg(text=text, kind="faa_negative")


# ---- Chinese public-security notices -----------------------------------------------------------

CN_EVENTS = (
    "马拉松赛",
    "国际车展",
    "重大活动",
    "国际博览会",
    "体育赛事",
    "大型文艺演出",
    "航空展览",
)
CN_CRAFT = "无人机、航空模型、动力伞、三角翼、热气球、孔明灯等“低慢小”航空器"


def _cn_time(t: Turn) -> tuple[str, str, str, datetime, datetime]:
    """(written text, gold start, gold end, start UTC, end UTC); local time is UTC+8."""
    rng = t.rng
    day = datetime(2024, 1, 1) + timedelta(days=rng.randrange(3 * 365))
    start = day.replace(hour=rng.randrange(6, 21), minute=rng.choice((0, 0, 0, 30)))
    days = rng.choice((0, 0, 0, 1, 2, 3, 6))
    end_day = start + timedelta(days=days)
    end_h = 24 if rng.random() < 0.3 or days == 0 and start.hour >= 20 else rng.randrange(
        start.hour + 1 if days == 0 else 6, 24)  # fmt: skip

    def stamp(d: datetime, h: int, mi: int, with_date: bool, with_year: bool) -> str:
        date = (f"{d.year}年" if with_year else "") + f"{d.month}月{d.day}日" if with_date else ""
        return f"{date}{h}时" + (f"{mi}分" if mi else "")

    s_text = stamp(start, start.hour, start.minute, True, True)
    e_text = stamp(end_day, end_h, 0, days > 0 or rng.random() < 0.3, rng.random() < 0.2)
    text = f"{s_text}至{e_text}"
    # gold: the start as written, the end with the date and year the message leaves to the start
    gold_s, gold_e = s_text, stamp(end_day, end_h, 0, True, True)
    end_local = end_day.replace(hour=0, minute=0) + timedelta(hours=end_h)
    return text, gold_s, gold_e, start - timedelta(hours=8), end_local - timedelta(hours=8)


def _cn_area(t: Turn, a: dict, msg: Msg, times: tuple) -> str:
    rng = t.rng
    if rng.random() < 0.3:
        name = CN_AIRPORTS[a["icao"]][0]
        centre = Written(name, round(a["lat"], 7), round(a["lon"], 7))
    else:
        centre = COORD_WRITERS["cn"](*offset_point(rng, a["lat"], a["lon"], 30))
    r = pick_radius(rng, "KM M")
    r_text = f"{num_text(r.value)}{'公里' if r.unit == 'KM' else '米'}"
    has_upper = rng.random() < 0.75
    up = LimitSpec(rng.choice((120, 150, 300, 500, 1000)), "M", "AGL") if has_upper else unl()
    alt = f"真高{json_num(up.value)}米以下" if has_upper else ""
    add_zone(msg, zone_id=t.zone_id(), centre=centre, radius=r, lower=sfc(rng, 0), upper=up,
             start=times[1], end=times[2], start_utc=times[3], end_utc=times[4])  # fmt: skip
    verb = "为中心" if t.heldout else rng.choice(("为中心", "为圆心"))
    return f"以{centre.text}{verb}，半径{r_text}范围内{alt}空域"


def cn_notice(t: Turn) -> Msg:
    """A Chinese public-security temporary no-fly notice (临时禁飞通告), local time UTC+8."""
    rng, a = t.rng, t.airport("cn")
    city = CN_AIRPORTS[a["icao"]][1]
    times = _cn_time(t)
    msg = Msg(text="", kind="cn_notice")
    n = 2 if rng.random() < 0.15 else 1
    areas = [_cn_area(t, a, msg, times) for _ in range(n)]
    area = areas[0] if n == 1 else "；".join(f"（{'一二'[k]}）{x}" for k, x in enumerate(areas))
    event = f"{city.rstrip('市')}{rng.choice(CN_EVENTS)}"
    issued = times[3] - timedelta(days=rng.randint(2, 10))
    date = f"{issued.year}年{issued.month}月{issued.day}日"
    if t.heldout:
        msg.text = (
            f"关于划设临时禁飞区的通告\n因{event}需要，经研究决定，{times[0]}，{area}划设为"
            f"临时禁飞区。禁飞区内严禁一切“低慢小”航空器飞行活动。\n{city}公安局\n{date}"
        )
        return msg
    msg.text = (
        f"{city}公安局关于{event}期间实施临时禁飞管控的通告\n"
        f"为保障{event}安全顺利进行，根据《中华人民共和国治安管理处罚法》《无人驾驶航空器飞行管理"
        f"暂行条例》等有关规定，现将有关事项通告如下：\n一、管控时间：{times[0]}。\n"
        f"二、管控区域：{area}。\n三、管控期间，上述区域内禁止放飞{CN_CRAFT}。\n"
        f"四、对违反本通告规定的，公安机关将依法予以处罚。\n特此通告。\n{city}公安局\n{date}"
    )
    return msg


# ---- plain-English notices ---------------------------------------------------------------------

PLAIN_COORDS = ("dms_sym", "dms_ascii", "dec_signed", "dec_hemi", "dec_plain", "dms_sp")
PLAIN_EVENTS = ("music festival", "air show", "state visit", "marathon", "royal visit",
                "firework display", "football match")  # fmt: skip


def _plain_time(style: int, d: datetime) -> str:
    m = MONTHS[d.month - 1]
    return (f"{d:%H:%M} UTC on {d.day} {m} {d.year}", f"{d.day} {m} {d.year} {d:%H%M}Z",
            f"{d:%H%M} UTC {d.day} {m[:3].upper()} {d.year}")[style]  # fmt: skip


def _plain_radius(rng: random.Random, r: Radius) -> str:
    words = {"NM": ("NM", " nautical miles"), "KM": (" km", " kilometres"), "M": (" m", " metres")}
    return f"{num_text(r.value)}{rng.choice(words[r.unit])}"


def _plain_limit(rng: random.Random, lim: LimitSpec) -> str:
    if lim.is_default_lower:
        return rng.choice(("the surface", "ground level", "SFC"))
    value = f"{int(lim.value):,}" if lim.value >= 1000 and rng.random() < 0.5 else num_text(
        lim.value)  # fmt: skip
    unit = {"FT": rng.choice((" ft", " feet")), "M": rng.choice((" m", " metres"))}[lim.unit]
    ref = {"AGL": (" AGL", " above ground level"), "AMSL": (" AMSL", " above mean sea level")}
    return f"{value}{unit}{rng.choice(ref[lim.ref])}"


def plain_notice(t: Turn) -> Msg:
    """A plain-English drone restriction notice (decimal or DMS centre, km / m / NM, ft / m)."""
    rng, a = t.rng, t.airport("plain")
    if rng.random() < 0.12:
        return _plain_negative(t, a)
    start, end = pick_window(rng)
    r = pick_radius(rng)
    up = pick_upper(rng, flight_levels=False)
    msg = Msg(text="", kind="plain_notice")
    place, event, ts = a["city"], rng.choice(PLAIN_EVENTS), rng.randrange(3)
    if t.heldout:
        return _plain_heldout(t, a, msg, r, up, start, end)
    if rng.random() < 0.2:
        centre = Written(a["icao"], round(a["lat"], 7), round(a["lon"], 7))
        msg.text = (f"Drone restriction at {a['name']} ({a['icao']}): no unmanned aircraft may be "
                    f"flown within {_plain_radius(rng, r)} of the aerodrome from "
                    f"{_plain_time(ts, start)} until further notice, from the surface to "
                    f"{_plain_limit(rng, up)}.")  # fmt: skip
        end = None
    else:
        centre = COORD_WRITERS[rng.choice(PLAIN_COORDS)](*offset_point(rng, a["lat"], a["lon"], 20))
        msg.text = rng.choice((
            f"TEMPORARY DRONE RESTRICTION - {place}\nUnmanned aircraft must not be flown within "
            f"{_plain_radius(rng, r)} of {centre.text} between {_plain_time(ts, start)} and "
            f"{_plain_time(ts, end)}, from the surface up to {_plain_limit(rng, up)}.",
            f"Flight Restriction Zone: {place} {event}\nCentre: {centre.text}\n"
            f"Radius: {_plain_radius(rng, r)}\nLimits: {_plain_limit(rng, sfc(rng))} to "
            f"{_plain_limit(rng, up)}\nValid: {_plain_time(ts, start)} - {_plain_time(ts, end)}",
        ))  # fmt: skip
    add_zone(msg, zone_id=t.zone_id(), centre=centre, radius=r, lower=sfc(rng, 0), upper=up,
             start=_plain_time(ts, start), end=end and _plain_time(ts, end), start_utc=start,
             end_utc=end)  # fmt: skip
    return msg


def _plain_heldout(
    t: Turn, a: dict, msg: Msg, r: Radius, up: LimitSpec, start: datetime, end: datetime
) -> Msg:
    """Held-out phrasing: local times with a stated UTC offset."""
    rng = t.rng
    hours = max(-11, min(13, round(a["lon"] / 15)))
    off = f"{'+' if hours >= 0 else '-'}{abs(hours):02d}:00"
    ls, le = start + timedelta(hours=hours), end + timedelta(hours=hours)
    centre = COORD_WRITERS[rng.choice(("dms_sym", "dec_signed", "dms_spaced"))](
        *offset_point(rng, a["lat"], a["lon"], 20))  # fmt: skip
    msg.text = (f"Temporary restricted airspace is declared near {a['city']} for the "
                f"{rng.choice(PLAIN_EVENTS)}. RPA operations are not permitted inside a "
                f"{_plain_radius(rng, r)} radius of {centre.text} from the surface to "
                f"{_plain_limit(rng, up)}, from {ls:%H:%M} on {ls.day} {MONTHS[ls.month - 1]} "
                f"{ls.year} to {le:%H:%M} on {le.day} {MONTHS[le.month - 1]} {le.year} local "
                f"time (UTC{off}).")  # fmt: skip
    add_zone(msg, zone_id=t.zone_id(), centre=centre, radius=r, lower=sfc(rng, 0), upper=up,
             start=f"{ls:%H:%M} on {ls.day} {MONTHS[ls.month - 1]} {ls.year} UTC{off}",
             end=f"{le:%H:%M} on {le.day} {MONTHS[le.month - 1]} {le.year} UTC{off}",
             start_utc=start, end_utc=end)  # fmt: skip
    return msg


def _plain_negative(t: Turn, a: dict) -> Msg:
    rng = t.rng
    start, end = pick_window(rng)
    ts = rng.randrange(3)
    c = COORD_WRITERS[rng.choice(PLAIN_COORDS)](*offset_point(rng, a["lat"], a["lon"], 5))
    text = rng.choice((
        f"Runway {rwy(rng)} at {a['name']} will be closed for resurfacing from "
        f"{_plain_time(ts, start)} to {_plain_time(ts, end)}.",
        f"The obstacle light on the mast at {c.text} is unserviceable until "
        f"{_plain_time(ts, end)}.",
        f"Drone pilots are reminded to register before flying anywhere near {a['name']}.",
    ))  # fmt: skip
    return Msg(text=text, kind="plain_negative")


BUILDERS = {"icao": icao_notam, "faa": faa_notam, "cn": cn_notice, "plain": plain_notice}
FAMILY_WEIGHTS = {"icao": 0.32, "faa": 0.26, "cn": 0.2, "plain": 0.22}
