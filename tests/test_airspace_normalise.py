"""Deterministic conversions of copied values: coordinates, units, limits and times."""

import json

import pytest

from clover.tasks.airspace.normalise import (
    Limit,
    Zone,
    parse_centre,
    parse_limit,
    parse_radius,
    parse_time,
)
from clover.tasks.airspace.tools import ZoneRegistry
from clover.tasks.airspace.writing import COORD_WRITERS


def dms(d: float, m: float = 0, s: float = 0, sign: int = 1) -> float:
    return sign * (d + m / 60 + s / 3600)


@pytest.mark.parametrize(
    "text, lat, lon",
    [
        ("512107N 0003608W", dms(51, 21, 7), dms(0, 36, 8, -1)),
        ("430205N0753903W", dms(43, 2, 5), dms(75, 39, 3, -1)),
        ("335633N/1182429W", dms(33, 56, 33), dms(118, 24, 29, -1)),
        ("N320604E0344856", dms(32, 6, 4), dms(34, 48, 56)),
        ("S335633 W0702400", dms(33, 56, 33, -1), dms(70, 24, 0, -1)),
        ("4512.5N 00615.0E", dms(45, 12.5), dms(6, 15)),
        ("4512N00615E", dms(45, 12), dms(6, 15)),
        ("451230.5N 0061510.2E", dms(45, 12, 30.5), dms(6, 15, 10.2)),
        ("45 12 30S 006 15 10W", dms(45, 12, 30, -1), dms(6, 15, 10, -1)),
        ("45°12′30″N 6°15′10″E", dms(45, 12, 30), dms(6, 15, 10)),
        ("45°12'30\"N 006°15'10\"W", dms(45, 12, 30), dms(6, 15, 10, -1)),
        ("北纬31°08′36″、东经121°48′18″", dms(31, 8, 36), dms(121, 48, 18)),
        ("51.47002, -0.45430", 51.47002, -0.4543),
        ("-33.5, 151.25", -33.5, 151.25),
        ("33.5000° S, 70.2500° W", -33.5, -70.25),
    ],
)
def test_parse_centre_notations(text, lat, lon):
    """Every notation in the issue reads to the exact signed degrees (S and W negative)."""
    got = parse_centre(text)
    assert got == pytest.approx((lat, lon), abs=1e-7)


@pytest.mark.parametrize(
    "text", ["", "hello", "12N", "516107N 0003608W", "512107N 1803608W", "0003608W 512107N",
             "51.5, 0.1, 3.2", "91.0, 0.0", "512107N 0360W", "XXXX", None, 42],
)  # fmt: skip
def test_parse_centre_rejects_bad_text(text):
    """Minutes >= 60, out-of-range degrees, swapped or missing hemispheres, unknown places fail."""
    with pytest.raises(ValueError):
        parse_centre(text)


def test_places_resolve_through_airportsdata():
    """An ICAO code and the Chinese airport name reach the same airportsdata position."""
    import airportsdata

    a = airportsdata.load("ICAO")["ZSPD"]
    assert parse_centre("ZSPD") == pytest.approx((a["lat"], a["lon"]), abs=1e-7)
    assert parse_centre("上海浦东国际机场") == parse_centre("ZSPD")


def test_writers_and_reader_agree_on_every_notation():
    """Each coordinate writer's exact value equals what the independent reader recovers."""
    points = [(51.35194, -0.60222), (-33.94611, 151.17722), (0.0004, -0.0004), (89.5, 179.99)]
    for name, write in COORD_WRITERS.items():
        for lat, lon in points:
            w = write(lat, lon)
            assert parse_centre(w.text) == pytest.approx((w.lat, w.lon), abs=1e-7), (name, w)
            assert abs(w.lat - lat) < 0.01 and abs(w.lon - lon) < 0.01, (name, w)


@pytest.mark.parametrize(
    "value, metres",
    [({"value": 0.5, "unit": "NM"}, 926.0), ({"value": ".5", "unit": "NM"}, 926.0),
     ({"value": 3, "unit": "KM"}, 3000.0), ("500MTR", 500.0), ("3公里", 3000.0), ("800米", 800.0)],
)  # fmt: skip
def test_radius_units(value, metres):
    """1 NM is 1852 m; MTR and 米 are metres, 公里 kilometres."""
    assert parse_radius(value) == pytest.approx(metres)


@pytest.mark.parametrize("unit", ["KM", "NM", "M"])
def test_radius_bound_is_on_metres(unit):
    """The 2,000 km bound holds for the radius in metres, not for the number before the unit: a
    model wrote 187052 KM, the registry stored it, and the map page (Zone.from_dict) failed."""
    with pytest.raises(ValueError, match="2000 km"):
        parse_radius({"value": 187052 if unit != "M" else 2_500_000, "unit": unit})
    registry = ZoneRegistry()
    call = {"name": "set_no_fly_zone", "arguments": {
        "centre": "47.5N 8.5E", "radius": {"value": 187052, "unit": "KM"},
        "start": "2025-01-01T00:00Z", "end": "2025-01-02T00:00Z"}}
    assert json.loads(registry.execute(call))["ok"] is False and not registry.zones
    call["arguments"]["radius"] = {"value": 5, "unit": unit}
    assert json.loads(registry.execute(call))["ok"] is True
    for zone in registry.zones.values():
        assert Zone.from_dict(zone.to_dict()) == zone


def test_limits_compare_in_metres_with_reference():
    """200 M and 656 FT match (2 m tolerance); AGL vs AMSL, FL vs feet AMSL never match."""
    m200 = parse_limit({"value": 200, "unit": "M", "ref": "AGL"})
    assert m200.matches(parse_limit({"value": 656, "unit": "FT", "ref": "AGL"}))
    assert not m200.matches(parse_limit({"value": 640, "unit": "FT", "ref": "AGL"}))
    assert not m200.matches(parse_limit({"value": 200, "unit": "M", "ref": "AMSL"}))
    assert not parse_limit("FL095").matches(parse_limit("9500FT AMSL"))
    assert parse_limit("FL095").metres() == ("STD", pytest.approx(9500 * 0.3048))
    assert parse_limit("GND") == parse_limit({"value": 0, "unit": "FT", "ref": "SFC"})
    assert parse_limit("SFC").matches(Limit(value=0.0, unit="M", ref="AGL"))
    assert parse_limit({"unit": "UNL"}).matches(parse_limit("UNL"))
    assert parse_limit("3000FT MSL") == parse_limit({"value": 3000, "unit": "FT", "ref": "AMSL"})


@pytest.mark.parametrize(
    "text, utc",
    [("2025-03-15T08:00Z", "2025-03-15T08:00Z"), ("2503150800", "2025-03-15T08:00Z"),
     ("2025-03-15T24:00+08:00", "2025-03-15T16:00Z"),
     ("2025-03-16T07:30+08:00", "2025-03-15T23:30Z"),
     ("2025-12-31T24:00Z", "2026-01-01T00:00Z"), ("2025-01-01T05:00+10:00", "2024-12-31T19:00Z"),
     ("2025-06-01T20:00-05:00", "2025-06-02T01:00Z"), (None, None), ("PERM", None)],
)  # fmt: skip
def test_times_to_utc(text, utc):
    """Local offsets (UTC+8), 24:00 and year/day roll-over are applied in code, exactly."""
    assert parse_time(text) == utc


@pytest.mark.parametrize("text", ["2025-02-30T10:00Z", "2025-03-15T24:30Z", "15 March", "2025", 5])
def test_bad_times_raise(text):
    """Impossible dates, 24:30 and free text are errors, not silent guesses."""
    with pytest.raises(ValueError):
        parse_time(text)


def test_a_missing_airportsdata_names_the_task_extra(monkeypatch):
    """airportsdata is the task's optional dependency: without it the error says how to get it."""
    import sys

    from clover.tasks.airspace.places import load_airports

    monkeypatch.setitem(sys.modules, "airportsdata", None)  # `import airportsdata` now fails
    with pytest.raises(ImportError, match=r"\.\[task\]"):
        load_airports.__wrapped__()
