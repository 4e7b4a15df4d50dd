"""US NOTAMs: domestic UAS NOTAMs (with DLY schedules), FDC TFRs (14 CFR 91.137 / 91.141 /
91.145 / 99.7, circles and polygons ending TO POINT OF ORIGIN), and non-zone NOTAMs (runway,
taxiway, obstacle, navaid, bird, procedure) as negatives. Heights are SFC-nnnFT AGL / MSL."""

from __future__ import annotations

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
)
from clover.tasks.airspace.places import US_STATES
from clover.tasks.airspace.writing import (
    COORD_WRITERS,
    LimitSpec,
    Written,
    bearing_distance,
    compass,
    notam_time,
    num_text,
    offset_point,
    pick_window,
    sfc,
)

UAS = (
    "!{acct} {num} {loc} AIRSPACE UAS WI AN AREA DEFINED AS {r} RADIUS OF {c} ({ref}) {lo}-{up}"
    "{dly} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE UAS WI {r}R {c} ({ref}) {lo}-{up}{dly} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE UNMANNED ACFT OPS WI AN AREA DEFINED AS {r} RADIUS OF {c} "
    "({ref}) {lo}-{up}{dly} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE UAS OPS {r} RADIUS {c} ({ref}) {lo}-{up}{dly} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE SUAS OPS WI A {r} RADIUS CENTERED ON {c} ({ref}) {lo}-{up}"
    "{dly} {t1}-{t2}",
    "!{acct} {num} {loc} AIRSPACE DRONE SWARM DEMO {r} RADIUS OF {c} ({ref}) {lo}-{up}{dly} "
    "{t1}-{t2}",
)  # fmt: skip
REASONS_137 = ("FIRE FIGHTING ACFT OPS", "A HAZARD ASSOCIATED WITH A TOXIC GAS LEAK",
               "SEARCH AND RECOVERY OPS", "A BUILDING COLLAPSE", "LAW ENFORCEMENT ACTIVITY")
POLY_TFR = (
    "TEMPORARY FLIGHT RESTRICTIONS WI AN AREA DEFINED AS {p} TO POINT OF ORIGIN {lo}-{up}. "
    "PURSUANT TO 14 CFR SECTION 91.137(A)({sub}) DUE TO {why}.",
    "PURSUANT TO 14 CFR SECTION 99.7, SPECIAL SECURITY INSTRUCTIONS, UNMANNED AIRCRAFT FLIGHT "
    "OPS ARE PROHIBITED WI AN AREA DEFINED AS {p} TO THE POINT OF ORIGIN {lo}-{up}.",
    "TEMPORARY FLIGHT RESTRICTIONS. AIRSPACE DEFINED AS {p} BACK TO ORIGIN {lo}-{up}. "
    "PURSUANT TO 14 CFR SECTION 91.145 DUE TO {why}.",
)  # fmt: skip
FDC_AREAS = ("WI AN AREA DEFINED AS {r} RADIUS OF {c} ({ref}) SFC-{up}",
             "WI {r} RADIUS OF {c} ({ref}) SFC-{up}",
             "WITHIN A {r} RADIUS OF {c} ({ref}) FROM THE SURFACE UP TO AND INCLUDING {up}")
NEGATIVES = (
    ("rwy", ("!{acct} {num} {loc} RWY {rwy} CLSD {t1}-{t2}",
             "!{acct} {num} {loc} RWY {rwy} CLSD EXC TAX {t1}-{t2}",
             "!{acct} {num} {loc} RWY {rwy1} TDZ LGT U/S {t1}-{t2}")),
    ("twy", ("!{acct} {num} {loc} TWY {twy} CLSD {t1}-{t2}",
             "!{acct} {num} {loc} TWY {twy} BTN TWY {twy2} AND RWY {rwy1} CLSD {t1}-{t2}",
             "!{acct} {num} {loc} TWY {twy} EDGE LGT U/S {t1}-{t2}")),
    ("obstacle", ("!{acct} {num} {loc} OBST TOWER LGT (ASR {asr}) {c} ({ref}) {h}FT ({agl}FT AGL)"
                  " U/S {t1}-{t2}",
                  "!{acct} {num} {loc} OBST CRANE (ASN 2024-AEA-{n}-NRA) {c} ({ref}) {h}FT "
                  "({agl}FT AGL) FLAGGED AND LGTD {t1}-{t2}",
                  "!{acct} {num} {loc} OBST MOORED BALLOON WI A {r} RADIUS OF {c} ({ref}) "
                  "{h}FT ({agl}FT AGL) {t1}-{t2}")),
    ("navaid", ("!{acct} {num} {loc} NAV ILS RWY {rwy1} LOC U/S {t1}-{t2}",
                "!{acct} {num} {loc} NAV VOR/DME OUT OF SERVICE {t1}-{t2}",
                "!{acct} {num} {loc} NAV RWY {rwy1} GP U/S {t1}-{t2}")),
    ("bird", ("!{acct} {num} {loc} AD AP BIRD ACT INCREASED {t1}-{t2}",
              "!{acct} {num} {loc} AD AP WILDLIFE HAZARD DEER ON AND INVOF RWY {rwy1} {t1}-{t2}",
              "!{acct} {num} {loc} AD AP BIRD HAZARD LARGE FLOCKS OF WATERFOWL {t1}-{t2}")),
    ("procedure", ("!FDC {fnum} {loc} IAP {city}, RNAV (GPS) RWY {rwy1}, AMDT 2... LPV DA 820/"
                   "24 {t1}-{t2}",
                   "!FDC {fnum} {loc} ODP {city}, TAKEOFF MINIMUMS AND (OBSTACLE) DEPARTURE "
                   "PROCEDURES AMDT 3... RWY {rwy1}, 300-1 {t1}-{t2}",
                   "!FDC {fnum} {loc} SID {city}, {sid} ONE DEPARTURE... NOT AUTHORIZED "
                   "{t1}-{t2}")),
)  # fmt: skip
SIDS = ("BOSOX", "KAYLN", "HAWKZ", "SEAVU", "TRUKN", "JAYBE", "PORTE", "LOOP")


def faa_notam(t: Turn) -> Msg:
    """A US domestic (UAS) NOTAM, an FDC TFR (circle or polygon), or a non-zone NOTAM."""
    roll = t.rng.random()
    if roll < 0.22:
        msg = _negative(t)
    elif roll < 0.58:
        msg = _uas(t)
    elif roll < 0.68:
        msg = _polygon_tfr(t)
    else:
        msg = _fdc(t, t.rng.choice(("91.137", "91.141", "91.145", "99.7")))
    msg.templates = t.used[:]
    return msg


def _ref(airport: dict, point: tuple[float, float], loc: str, fdc: bool) -> str:
    bearing, nm = bearing_distance((airport["lat"], airport["lon"]), point)
    if fdc:  # VOR/DME-style fix: ident, radial, distance
        return f"{loc}{round(bearing) % 360:03d}{nm:05.1f}"
    return f"{nm:.1f}NM {compass(bearing)} {loc}"


def _radius(t: Turn, choices: tuple[float, ...] | None = None) -> tuple[Radius, str]:
    r = Radius(t.rng.choice(choices), "NM") if choices else pick_radius(t.rng, "NM")
    return r, num_text(r.value, leading_zero=t.rng.random() < 0.5) + "NM"


def _common(t: Turn) -> tuple[dict, str, datetime, datetime, tuple[float, float], Written]:
    rng, a = t.rng, t.airport("faa")
    loc = a["lid"] if a["lid"] and len(a["lid"]) == 3 else a["iata"]
    start, end = pick_window(rng)
    point = offset_point(rng, a["lat"], a["lon"], 20)
    centre = COORD_WRITERS[rng.choice(("dms_join",) * 4 + ("dms_slash",))](*point)
    return a, loc, start, end, point, centre


def _times(t: Turn, start: datetime, end: datetime) -> tuple[str, str]:
    return notam_time(start), notam_time(end) + ("EST" if t.rng.random() < 0.1 else "")


def _uas(t: Turn) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _common(t)
    r, r_text = _radius(t, (0.5, 0.5, 1, 1, 1.5, 2, 3, 0.3, 0.25))
    up = LimitSpec(rng.choice((200, 400, 400, 400, 700, 1200)), "FT", "AGL")
    if rng.random() < 0.15:
        up = LimitSpec(rng.choice((1500, 2500, 3000)), "FT", "MSL")
    dly = None
    if end - start >= timedelta(days=2) and rng.random() < 0.4:
        h = rng.randrange(0, 20)
        dly = f"DLY {h:02d}00-{h + rng.randint(2, 4):02d}00"
    num = f"{start.month:02d}/{rng.randint(1, 999):03d}"
    t1, t2 = _times(t, start, end)
    text = t.wording("faa.uas", UAS).format(
        acct=loc, num=num, loc=loc, r=r_text, c=centre.text, ref=_ref(a, point, loc, False),
        lo="SFC", up=up.notam(), dly=f" {dly}" if dly else "", t1=t1, t2=t2)  # fmt: skip
    msg = Msg(text=text, kind="faa_uas")
    when = When(notam_time(start), notam_time(end), start, end, dly)
    add_zone(msg, zone_id=f"{loc} {num}", area=Area(centre, r), lower=sfc(rng, 0), upper=up,
             when=when)  # fmt: skip
    return msg


def _polygon_tfr(t: Turn) -> Msg:
    rng = t.rng
    a, loc, start, end, point, _ = _common(t)
    state, artcc = US_STATES[a["subd"]]
    num = f"{start.year % 10}/{rng.randint(1000, 9999)}"
    area = polygon_area(rng, point, "dms_join")
    up = LimitSpec(*rng.choice(((3000, "FT", "AGL"), (2000, "FT", "AGL"), (5000, "FT", "MSL"),
                                (17999, "FT", "MSL"))))  # fmt: skip
    joiner = rng.choice((" TO ", " TO "))
    body = t.wording("faa.poly", POLY_TFR).format(
        p=joiner.join(v.text for v in area.vertices), lo="SFC", up=up.notam(),
        sub=rng.randint(1, 3), why=rng.choice(REASONS_137))  # fmt: skip
    t1, t2 = _times(t, start, end)
    msg = Msg(text=f"!FDC {num} {artcc} {state}..AIRSPACE {a['city'].upper()}, {state}..{body} "
                   f"{artcc} ARTCC IS THE FAA CDN FACILITY. {t1}-{t2}", kind="faa_fdc_polygon")
    add_zone(msg, zone_id=f"FDC {num}", area=area, lower=sfc(rng, 0), upper=up,
             when=When(notam_time(start), notam_time(end), start, end))  # fmt: skip
    return msg


def _fdc(t: Turn, part: str) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _common(t)
    state, artcc = US_STATES[a["subd"]]
    num = f"{start.year % 10}/{rng.randint(1000, 9999)}"
    head = f"!FDC {num} {artcc} {state}..AIRSPACE {a['city'].upper()}, {state}.."
    ref = _ref(a, point, loc, True)
    t1, t2 = _times(t, start, end)
    msg = Msg(text="", kind=f"faa_fdc_{part}")
    when = When(notam_time(start), notam_time(end), start, end)
    wording = t.wording("faa.fdc.area", FDC_AREAS)
    if part == "91.141":
        r1, r2 = Radius(rng.choice((3, 10)), "NM"), Radius(30, "NM")
        up = LimitSpec(17999, "FT", "MSL")
        a1 = wording.format(r=f"{num_text(r1.value)}NM", c=centre.text, ref=ref, up=up.notam())
        a2 = wording.format(r="30NM", c=centre.text, ref=ref, up=up.notam())
        msg.text = (f"{head}TEMPORARY FLIGHT RESTRICTIONS {t1}-{t2}. PURSUANT TO 14 CFR SECTION "
                    f"91.141 AIRCRAFT FLIGHT OPERATIONS ARE PROHIBITED {a1}, AND {a2}. "
                    "DUE TO VIP MOVEMENT.")  # fmt: skip
        for k, r in enumerate((r1, r2)):
            add_zone(msg, zone_id=f"FDC {num}-{k + 1}", area=Area(centre, r), lower=sfc(rng, 0),
                     upper=up, when=when)  # fmt: skip
        return msg
    r, r_text = _radius(t, (1, 2, 3, 3, 5, 5, 10))
    up = LimitSpec(*rng.choice(((3000, "FT", "AGL"), (2000, "FT", "AGL"), (15000, "FT", "MSL"),
                                (3000, "FT", "MSL"), (8000, "FT", "MSL"))))  # fmt: skip
    area = wording.format(r=r_text, c=centre.text, ref=ref, up=up.notam())
    sub = rng.randint(1, 3)
    why = {
        "91.137": f"TEMPORARY FLIGHT RESTRICTIONS {area}. PURSUANT TO 14 CFR SECTION "
        f"91.137(A)({sub}) TEMPORARY FLIGHT RESTRICTIONS ARE IN EFFECT DUE TO "
        f"{rng.choice(REASONS_137)}.",
        "91.145": f"TEMPORARY FLIGHT RESTRICTIONS FOR {rng.choice(('AIR SHOW', 'NASCAR RACE'))}. "
        f"PURSUANT TO 14 CFR SECTION 91.145, MANAGEMENT OF ACFT OPS IN THE VICINITY OF AERIAL "
        f"DEMONSTRATIONS AND MAJOR SPORTING EVENTS, {area}.",
        "99.7": f"SPECIAL SECURITY INSTRUCTIONS. PURSUANT TO 14 CFR SECTION 99.7, UNMANNED "
        f"AIRCRAFT FLIGHT OPS ARE PROHIBITED {area} DUE TO {a['city'].upper()} STADIUM EVENT.",
    }[part]
    msg.text = f"{head}{why} {artcc} ARTCC IS THE FAA CDN FACILITY. {t1}-{t2}"
    add_zone(msg, zone_id=f"FDC {num}", area=Area(centre, r), lower=sfc(rng, 0), upper=up,
             when=when)  # fmt: skip
    return msg


def _negative(t: Turn) -> Msg:
    rng = t.rng
    a, loc, start, end, point, centre = _common(t)
    agl = rng.randrange(150, 1500)
    t1, t2 = _times(t, start, end)
    kind, wordings = rng.choice(NEGATIVES)
    text = t.wording(f"faa.neg.{kind}", wordings).format(
        acct=loc, num=f"{start.month:02d}/{rng.randint(1, 999):03d}", loc=loc, rwy=rwy(rng),
        rwy1=rwy(rng).split("/")[0], twy=rng.choice("ABCDEFGHJKLM"),
        twy2=rng.choice("ABCDEFGHJKLM") + str(rng.randint(1, 9)), asr=rng.randint(1000000,
        1299999), c=centre.text, ref=_ref(a, point, loc, False), h=int(a["elevation"]) + agl,
        agl=agl, t1=t1, t2=t2, n=rng.randint(100, 9999), r=f"{rng.choice((1, 2, 3))}NM",
        fnum=f"{start.year % 10}/{rng.randint(1000, 9999)}", city=a["city"].upper(),
        sid=rng.choice(SIDS),
    )  # fmt: skip
    return Msg(text=text, kind="faa_negative")
