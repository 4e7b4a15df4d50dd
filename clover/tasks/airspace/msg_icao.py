"""ICAO-format NOTAMs: areas in E) (circles, polygons, several areas), Q-line-only positions,
heights in F)/G) or in E), D) schedules, NOTAMR / NOTAMC, and non-zone NOTAMs as negatives.

What is a zone: an area the NOTAM activates, restricts or fills with a hazardous activity (a
restricted, prohibited or danger area; UAS, parachute, firing, aerobatic or exercise areas).
What is not: runway / taxiway closures, obstacles (even with a radius), navaid outages, bird
hazards, procedure changes and aerodrome notices. A NOTAM whose E) gives no geometry takes the
Q-line's position and radius (`4851N00220E002`: centre `4851N00220E`, radius 2 NM).
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

from clover.tasks.airspace.formats import (
    Area,
    Msg,
    Radius,
    Turn,
    When,
    add_zone,
    cancel_zone,
    circle_area,
    polygon_area,
    rwy,
    wrap,
)
from clover.tasks.airspace.normalise import NM_M
from clover.tasks.airspace.places import FIRS
from clover.tasks.airspace.writing import (
    COORD_WRITERS,
    LimitSpec,
    Written,
    dm_packed,
    notam_time,
    num_text,
    offset_point,
    pick_upper,
    pick_window,
    sfc,
    unl,
)

# (Q-code, traffic, purpose, E) leads): the activity that makes the area a zone
SUBJECTS = (
    ("QRTCA", "IV", "BO", ("TEMPORARY RESTRICTED AREA ACT", "TEMPO RESTRICTED AREA ESTABLISHED",
                           "TRA ACTIVATED", "TEMPORARY RESERVED AIRSPACE ACTIVE")),
    ("QWULW", "IV", "BO", ("UAS OPS", "UNMANNED ACFT OPS WILL TAKE PLACE", "RPAS FLT",
                           "DRONE OPS IN PROGRESS")),
    ("QRPCA", "IV", "BO", ("PROHIBITED AREA ACT", "FLT OF UNMANNED ACFT PROHIBITED",
                           "TEMPORARY PROHIBITED AREA")),
    ("QRDCA", "IV", "BO", ("DANGER AREA ACT", "TEMPORARY DANGER AREA ACT", "TDA ACTIVE")),
    ("QWELW", "IV", "M", ("MIL EXER", "MILITARY EXERCISE WILL TAKE PLACE", "MIL FLYING EXER")),
    ("QWPLW", "IV", "M", ("PJE", "PARACHUTE JUMPING EXER", "PARA DROPPING")),
    ("QWMLW", "IV", "BO", ("GUN FIRING", "MISSILE, GUN OR ROCKET FIRING", "PYROTECHNICS")),
    ("QWALW", "IV", "M", ("AEROBATICS", "AEROBATIC DISPLAY", "AIR DISPLAY")),
    ("QRRCA", "IV", "BO", ("RESTRICTED AREA ACT FOR VIP FLT", "VIP MOVEMENT, AREA RESTRICTED",
                           "RESTRICTED AREA FOR STATE EVENT")),
)  # fmt: skip
CIRCLES = ("WI {r} RADIUS OF {c}", "RADIUS {r} CENTRED ON {c}", "CIRCLE RADIUS {r} CENTRE {c}",
           "WI {r} RADIUS CENTERED PSN {c}", "PSN {c} RADIUS {r}", "{r} RDS {c}",
           "AREA WI {r} OF {c}", "WI CIRCLE {r} RADIUS AROUND {c}",
           "A CIRCLE WITH RADIUS {r} CENTRED AT {c}", "WI {r} OF PSN {c}",
           "CIRCLE CENTRE {c} RADIUS {r}")  # fmt: skip
POLYGONS = ("WI AREA: {p}", "WI AREA BOUNDED BY LINES JOINING {p}", "AREA {p}",
            "WI AN AREA DEFINED AS {p}", "WI POLYGON {p}", "WITHIN LATERAL LIMITS {p}",
            "INSIDE THE AREA {p}")  # fmt: skip
JOINERS = (" - ", "-", " TO ", " ", "\n", ", ")
CLOSERS = ("", "", "same", " TO POINT OF ORIGIN", " BACK TO START")
SHAPES = ("{lead} {geom}{h}.", "{lead}:\n{geom}{h}.", "{geom}{h}:\n{lead}.",
          "{lead} {geom}{h}. ACFT AVOID AREA.", "{lead} ({why}) {geom}{h}.")
HEIGHTS = ("{lo}-{up}", "FM {lo} TO {up}", "BTN {lo} AND {up}", "{lo} TO {up}")
UPPER_ONLY = ("BLW {up}", "UP TO {up}", "MAX HGT {up}", "BELOW {up}")
AREA_LABELS = ("{k}. ", "AREA {K}: ", "PSN {k}: ", "{k}) ", "SECTOR {K}: ")
MULTI_LEADS = ("{lead} WI FLW AREAS:", "{lead} IN THE FLW AREAS:", "{lead}, AREAS:")
QLINE_ONLY = ("{lead}.", "{lead} WILL TAKE PLACE.", "{lead} ({why}).", "{lead} IN PROGRESS.")
WHY = ("UAS OPS", "AERIAL PHOTOGRAPHY", "VIP VISIT", "SPORTING EVENT", "STATE CEREMONY",
       "FILMING", "AIR SHOW", "SEARCH AND RESCUE")  # fmt: skip
SCHEDULES = ("DAILY 0700-1900", "MON-FRI 0800-1600", "SR-SS", "DAILY 2200-0500", "0800-1700",
             "1200-1500 1800-2100", "MON WED FRI 0900-1200", "SAT SUN 1000-1800",
             "DLY 0600-1800", "TUE-THU 1300-1700")  # fmt: skip
COORDS = ("dms_sp", "dms_sp", "dms_join", "dms_pre", "dms_pre_sp", "dm_dec", "dms_decsec", "dm")
COORDS_HELDOUT = ("dms_spaced", "dms_sp", "dms_ascii", "dm", "dms_join")
CANCEL_E = ("UAS OPS CNL.", "TEMPORARY RESTRICTED AREA CANCELLED.", "AREA DEACTIVATED.",
            "NOTAM CNL, ACT FINISHED.")  # fmt: skip
# Not zones: (kind, Q-code, scope, wordings). {c} a position, {r} a radius, {h}/{agl} heights.
NEGATIVES = (
    ("rwy", "QMRLC", "A", ("RWY {rwy} CLSD DUE TO WIP.", "RWY {rwy} CLOSED FOR MAINT.",
                           "RWY {rwy} CLSD EXC TAX.", "RWY {rwy1} THR DISPLACED 300M. DECLARED "
                           "DIST CHANGED: TORA 2800M LDA 2500M.")),
    ("twy", "QMXLC", "A", ("TWY {twy} CLSD.", "TWY {twy} BTN TWY {twy2} AND RWY {rwy1} CLSD DUE "
                           "TO WIP.", "TWY {twy} WIP ADJ, CAUTION ADZ.", "TWY {twy} NOT AVBL "
                           "FOR ACFT WINGSPAN ABV 36M.")),
    ("obstacle", "QOBCE", "AW", ("OBST LGT ON CRANE PSN {c} HGT {h}FT AMSL U/S.",
                                 "CRANE ERECTED PSN {c} HGT {h}FT AMSL ({agl}FT AGL). LGT AND "
                                 "MARKED.", "TEMPO OBST: MOBILE CRANES {agl}FT AGL WI {r} RADIUS "
                                 "OF {c}.", "WIND TURBINE {c} ELEV {h}FT AMSL NOT LGT.")),
    ("navaid", "QNVAS", "AE", ("VOR/DME {nav} {mhz}MHZ U/S.", "ILS RWY {rwy1} NOT AVBL.",
                               "NDB {nav} {khz}KHZ OUT OF SERVICE.", "DME {nav} CH{ch}X U/S DUE "
                               "TO MAINT.", "GP RWY {rwy1} U/S. LOC AVBL.")),
    ("bird", "QFAXX", "A", ("BIRD CONCENTRATION IN THE VICINITY OF AD.",
                            "INCREASED BIRD ACT WI {r} RADIUS OF AD, SFC-1500FT AGL.",
                            "BIRD HAZARD: FLOCKS OF MIGRATORY BIRDS ON APCH RWY {rwy1}.",
                            "BIRD STRIKE RISK HIGH DUE TO SEASONAL MIGRATION.")),
    ("procedure", "QPICH", "A", ("RNAV (GNSS) APCH RWY {rwy1} NOT AVBL.",
                                 "SID {sid}1A WITHDRAWN. USE {sid}1B.",
                                 "STAR {sid}2C TEMPO SUSPENDED.",
                                 "MISSED APCH PROC RWY {rwy1} CHANGED: CLIMB STRAIGHT AHEAD TO "
                                 "3000FT.", "ILS OR LOC RWY {rwy1} OCA CHANGED TO 520FT.")),
    ("aerodrome", "QFAAH", "A", ("AD HR OF OPS: MON-FRI 0600-2000.", "AD CLSD TO VFR FLT.",
                                 "FUEL JET A1 NOT AVBL.", "APRON {n} CLSD DUE TO WIP.",
                                 "PAPI RWY {rwy1} U/S.")),
)  # fmt: skip
NAVS = ("LON", "BPK", "DET", "MID", "OCK", "TOU", "PAM", "KOK", "RUS", "SPY", "ABN", "TNO")


def icao_notam(t: Turn, *, kind: str = "N", ref: str | None = None, airport: dict | None = None,
               nid: str | None = None, allow_negative: bool = True) -> Msg:  # fmt: skip
    """An ICAO-format NOTAM (NOTAMN; NOTAMR replacing `ref`; NOTAMC cancelling `ref`)."""
    rng, a = t.rng, airport or t.airport("icao")
    start, end = pick_window(rng)
    end = None if kind == "N" and rng.random() < 0.04 else end
    nid = nid or _notam_id(rng, start.year)
    if kind == "N" and allow_negative and rng.random() < 0.25:
        return _negative(t, a, nid, start, end)
    code, traffic, purpose, leads = rng.choice(SUBJECTS)
    lead = t.wording(f"icao.lead.{code}", leads)
    msg = Msg(text="", kind=f"icao_notam{kind.lower()}")
    base = offset_point(rng, a["lat"], a["lon"], 25)
    lower, upper = _limits(rng)
    areas, q_only, e_heights, qnm = [], False, False, 5
    if kind == "C":
        cancel_zone(msg, str(ref))
        e = t.wording("icao.cancel", CANCEL_E)
    else:
        e, areas, q_only, e_heights, qnm = _zone_e(t, lead, base, lower, upper, kind == "R")
    fir = rng.choice(FIRS[a["country"]])
    code = code[:3] + "XX" if kind == "C" else code
    q_pos = dm_packed(*base, places=0)
    q = _q_line(fir, code, traffic, purpose, lower, upper, q_pos.text, qnm, a["elevation"])
    header = f"{nid} NOTAMN" if kind == "N" else f"{nid} NOTAM{kind} {ref}"
    when = _when(rng, start, end, schedule=kind != "C" and rng.random() < 0.3)
    if q_only:  # E) says what and when, the Q-line where
        areas[0].centre, areas[0].radius = q_pos, Radius(qnm, "NM")
    for k, area in enumerate(areas):
        add_zone(msg, zone_id=nid if len(areas) == 1 else f"{nid}-{k + 1}", area=area,
                 lower=lower, upper=upper, when=when, replaces=ref if kind == "R" else None)
    keep = [w.text for area in areas for w in (area.vertices or [area.centre])]
    msg.text = _assemble(t, header, q, a["icao"], when, kind, e, (lower, upper), e_heights, keep)
    msg.templates = t.used[:]
    return msg


def _zone_e(t: Turn, lead: str, base: tuple, lower: LimitSpec, upper: LimitSpec,
            replacing: bool) -> tuple[str, list[Area], bool, bool, int]:  # fmt: skip
    """(E) text, its areas, whether the Q-line alone places them, whether E) states the
    heights, the Q-line radius in NM) for a zone NOTAM."""
    rng = t.rng
    layout = t.pick(COORDS, COORDS_HELDOUT)
    heights = "" if rng.random() < 0.6 else " " + _heights_text(t, lower, upper)
    roll = rng.random()
    if roll < 0.12 and not replacing:  # Q-line-only position: filled in by the caller
        e = t.wording("icao.qline_only", QLINE_ONLY).format(lead=lead, why=rng.choice(WHY))
        return e + heights, [Area()], True, bool(heights), rng.choice((1, 2, 3, 5))
    n = 1 if roll < 0.85 or replacing else rng.choice((2, 2, 3))
    points = [base] + [offset_point(rng, base[0], base[1], 10) for _ in range(n - 1)]
    areas = [polygon_area(rng, p, layout) if rng.random() < 0.25 else circle_area(rng, p, layout)
             for p in points]  # fmt: skip
    geoms = [_geom_text(t, area) for area in areas]
    if n == 1:
        shape = t.wording("icao.shape", SHAPES)
        e = shape.format(lead=lead, geom=geoms[0], h=heights, why=rng.choice(WHY))
    else:
        label = t.wording("icao.area_label", AREA_LABELS)
        rows = [label.format(k=k + 1, K=chr(65 + k)) + g for k, g in enumerate(geoms)]
        e = t.wording("icao.multi", MULTI_LEADS).format(lead=lead) + "\n" + "\n".join(rows)
        e += f"\n{heights.strip()}." if heights else ""
    qnm = max(1, math.ceil(max(_area_radius(x) for x in areas) / NM_M))
    return e, areas, False, bool(heights), qnm


def _area_radius(area: Area) -> float:
    if area.radius is not None:
        return area.radius.metres
    return 8000.0


def _geom_text(t: Turn, area: Area) -> str:
    rng = t.rng
    if area.vertices:
        joiner = t.wording("icao.joiner", JOINERS)
        closer = t.wording("icao.closer", CLOSERS)
        texts = [v.text for v in area.vertices]
        tail = joiner + texts[0] if closer == "same" else closer
        return t.wording("icao.polygon", POLYGONS).format(p=joiner.join(texts) + tail)
    return t.wording("icao.circle", CIRCLES).format(r=_radius_text(rng, area.radius),
                                                    c=area.centre.text)


def _radius_text(rng: random.Random, r: Radius) -> str:
    unit = "MTR" if r.unit == "M" and rng.random() < 0.5 else r.unit
    return f"{num_text(r.value)}{' ' if rng.random() < 0.25 else ''}{unit}"


def _heights_text(t: Turn, lower: LimitSpec, upper: LimitSpec) -> str:
    lo, up = _limit_text(t.rng, lower), _limit_text(t.rng, upper)
    if lower.is_default_lower and t.rng.random() < 0.4:
        return t.wording("icao.upper_only", UPPER_ONLY).format(up=up)
    return t.wording("icao.heights", HEIGHTS).format(lo=lo, up=up)


def _limit_text(rng: random.Random, lim: LimitSpec) -> str:
    text = lim.notam()
    return text.replace("FT ", " FT ", 1) if rng.random() < 0.2 and "FT " in text else text


def _limits(rng: random.Random) -> tuple[LimitSpec, LimitSpec]:
    """Lower and upper limit; a raised lower limit comes with an AMSL / FL upper above it."""
    roll = rng.random()
    if roll < 0.8:
        return sfc(rng), pick_upper(rng) if rng.random() < 0.88 else unl()
    if roll < 0.9:
        upper = LimitSpec(*rng.choice(((3000, "FT", "AMSL"), (95, "FL", "STD"),
                                       (125, "FL", "STD"))))  # fmt: skip
        return LimitSpec(rng.choice((500, 1000, 1500)), "FT", "AMSL"), upper
    lower = LimitSpec(rng.choice((50, 65, 75)), "FL", "STD")
    return lower, LimitSpec(rng.choice((95, 125, 195, 245)), "FL", "STD")


def _when(rng: random.Random, start: datetime, end: datetime | None, schedule: bool) -> When:
    sched = rng.choice(SCHEDULES) if schedule and end and end - start >= timedelta(days=2) else None
    return When(notam_time(start), end and notam_time(end), start, end, sched)


def _q_line(fir: str, code: str, traffic: str, purpose: str, lower: LimitSpec, upper: LimitSpec,
            pos: str, nm: int, elev: float) -> str:  # fmt: skip
    lo = min(999, int(lower.feet_amsl(elev) // 100))
    up = min(999, math.ceil(upper.feet_amsl(elev) / 100))
    return f"Q) {fir}/{code}/{traffic}/{purpose}/W/{lo:03d}/{up:03d}/{pos}{nm:03d}"


def _notam_id(rng: random.Random, year: int) -> str:
    return f"{rng.choice('ABCDW')}{rng.randint(1, 9999):04d}/{year % 100:02d}"


HEADERS = ("", "", "", "GG {fir}ZZZX\n{dtg} {ad}YNYX\n", "CREATED: {day} SOURCE: EUECYIYN\n",
           "NOTAM {ad}\n")  # fmt: skip


def _assemble(t: Turn, header: str, q: str, ad: str, when: When, kind: str, e: str,
              limits: tuple[LimitSpec, LimitSpec], e_heights: bool = False,
              keep: list[str] = ()) -> str:  # fmt: skip
    """Items in one of several layouts, with the noise real feeds carry (wrapped E), AFTN
    addresses, a created line, parentheses)."""
    rng = t.rng
    c = "PERM" if when.end is None else when.end + (" EST" if rng.random() < 0.1 else "")
    abc = f"A) {ad} B) {when.start}" + ("" if kind == "C" else f" C) {c}")
    if rng.random() < 0.35:
        abc = abc.replace(" B)", "\nB)").replace(" C)", "\nC)")
    d = f"D) {when.schedule}\n" if when.schedule else ""
    lower, upper = limits
    in_e = e_heights and rng.random() < 0.6
    skip_fg = kind == "C" or in_e or (lower.is_default_lower and upper.is_unlimited)
    fg = "" if skip_fg else f"\nF) {lower.notam()}" + ("\n" if rng.random() < 0.3 else " ") + (
        f"G) {upper.notam()}")
    body = f"{header}\n{q}\n{abc}\n{d}E) {wrap(rng, e, 0.25, keep)}{fg}"
    body = f"({body})" if rng.random() < 0.35 else body
    head = t.wording("icao.header", HEADERS)
    return head.format(fir=q[3:7], dtg=f"{rng.randint(10, 31)}{rng.randint(0, 2359):04d}",
                       ad=ad, day=f"{rng.randint(1, 28)} JAN 2025 10:00:00") + body


def _negative(t: Turn, a: dict, nid: str, start: datetime, end: datetime | None) -> Msg:
    rng = t.rng
    kind, code, scope, wordings = rng.choice(NEGATIVES)
    c = COORD_WRITERS[t.pick(COORDS, COORDS_HELDOUT)](*offset_point(rng, a["lat"], a["lon"], 3))
    agl = rng.randrange(80, 400)
    e = t.wording(f"icao.neg.{kind}", wordings).format(
        rwy=rwy(rng), rwy1=rwy(rng).split("/")[0], twy=rng.choice("ABCDEFGKLMNPS"),
        twy2=rng.choice("ABCDEFGKLMNPS") + str(rng.randint(1, 9)), c=c.text,
        h=int(a["elevation"]) + agl, agl=agl, r=_radius_text(rng, Radius(rng.choice((1, 2, 5)),
        "NM")), nav=rng.choice(NAVS), mhz=f"{rng.randint(108, 117)}.{rng.choice('0257')}00",
        khz=rng.randint(190, 535), ch=rng.randint(17, 119), sid=rng.choice(NAVS), n=rng.randint(1,
        9))  # fmt: skip
    fir = rng.choice(FIRS[a["country"]])
    pos = dm_packed(a["lat"], a["lon"], places=0).text
    q = f"Q) {fir}/{code}/IV/NBO/{scope}/000/999/{pos}005"
    when = _when(rng, start, end, schedule=False)
    text = _assemble(t, f"{nid} NOTAMN", q, a["icao"], when, "N", e, (sfc(rng, 0), unl()),
                     keep=[c.text])
    return Msg(text=text, kind="icao_negative", templates=t.used[:])


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


__all__ = ["icao_notam", "icao_replace_pair", "Written"]
