"""The 3D map page: self-contained HTML with the zones embedded, and a real headless-Chromium run.

The browser test opens the page from file://, waits for `window.CLOVER_READY`, and checks that it
drew as many zone cylinders as `count_zones` says, logged no errors and loaded nothing from the
network; it saves screenshots (world view and one message zoomed) for a person to look at.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from clover.tasks.airspace import generate_examples
from clover.tasks.airspace.mappage import (
    auto_exaggeration,
    count_zones,
    limit_text,
    read_assets,
    write_map,
)
from clover.tasks.airspace.normalise import Zone
from clover.tasks.airspace.scorer import match_zones

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT_DIR = Path(__file__).resolve().parents[1] / "runs" / "test-screenshots"
SHIFT_DEG = 0.02  # ~2 km: far outside the scorer's 100 m centre tolerance


def _perturb(truth: list[dict], k: int) -> list[dict]:
    """Model output for message k: mostly right, with every kind of mistake somewhere."""
    pred = copy.deepcopy(truth)
    if k in (1, 7) and pred:  # centre (or every vertex) shifted
        pred[0]["lat"] += SHIFT_DEG
        pred[0]["polygon"] = [[a + SHIFT_DEG, b] for a, b in pred[0].get("polygon", [])]
    if k == 4 and pred:  # wrong ceiling
        pred[0]["upper"] = {"value": 999, "unit": "FT", "ref": "AGL"}
    if k == 10 and pred:  # a zone missed
        pred.pop()
    if k == 12:  # a hallucinated extra zone
        pred.append({"lat": 10.0, "lon": 20.0, "radius_m": 3000.0, "id": "X9",
                     "lower": {"value": 0, "unit": "FT", "ref": "SFC"}, "upper": {"unit": "UNL"},
                     "start_utc": None, "end_utc": None})  # fmt: skip
    return pred


def _correct(pred: list[dict], truth: list[dict]) -> list[bool]:
    matches = match_zones([Zone.from_dict(z) for z in pred], [Zone.from_dict(z) for z in truth])
    ok = {i for i, _, errs in matches if not errs}
    return [i in ok for i in range(len(pred))]


def sample_messages(n: int = 20) -> list[dict]:
    """The demo's input shape, built from the test split's ground truth."""
    out = []
    for k, ex in enumerate(generate_examples("test", n, 0)):
        truth = [z.to_dict() for z in ex.zones]
        pred = _perturb(truth, k)
        out.append({"id": ex.id, "text": ex.text, "truth": truth, "pred": pred,
                    "pred_correct": _correct(pred, truth), "model": "sample"})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def messages() -> list[dict]:
    return sample_messages()


@pytest.fixture(scope="module")
def page(messages, tmp_path_factory) -> Path:
    try:
        read_assets()
    except FileNotFoundError as e:
        _skip_or_fail(str(e))
    return write_map(messages, tmp_path_factory.mktemp("map") / "map.html")


def _skip_or_fail(reason: str) -> None:
    """Skip on a dev machine without the browser deps; in CI their absence is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run scripts/install_browser_deps.sh)")
    pytest.skip(reason)


def _embedded(html: str, block: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', html, re.S)
    assert m, f"no {block} block"
    return json.loads(m.group(1))


def test_count_zones_counts_truth_and_predictions():
    """The page draws every truth zone and every predicted one, whatever their verdicts."""
    z = {"lat": 1.0, "lon": 2.0, "radius_m": 500.0}
    msgs = [{"id": "a", "text": "", "truth": [z, z], "pred": [z]},
            {"id": "b", "text": "", "truth": [], "pred": []}, {"id": "c", "text": "", "truth": [z]}]
    assert count_zones(msgs) == 4 and count_zones([]) == 0


def test_polygons_and_schedules_are_embedded(tmp_path):
    """A polygon zone goes to the page with its vertices (drawn as an extruded outline, not a
    column), and a schedule with the zone; a circle has no vertices."""
    poly = {"polygon": [[51.5, -0.2], [51.52, -0.15], [51.48, -0.12]], "id": "P1",
            "schedule": "MON-FRI 0800-1600", "upper": {"value": 400, "unit": "FT", "ref": "AGL"}}
    circle = {"lat": 51.5, "lon": -0.1, "radius_m": 900.0, "id": "C1"}
    page = write_map([{"id": "m", "text": "t", "truth": [poly, circle], "pred": [poly]}],
                     tmp_path / "p.html")
    zones = _embedded(page.read_text(encoding="utf-8"), "clover-data")["messages"][0]["zones"]
    assert [(z["kind"], z["id"], z["ok"]) for z in zones] == [
        ("truth", "P1", True), ("truth", "C1", False), ("pred", "P1", True)]
    assert zones[0]["polygon"] == poly["polygon"] and zones[0]["schedule"] == "MON-FRI 0800-1600"
    assert zones[1]["polygon"] is None and zones[0]["radius_m"] > 2000  # the enclosing circle


def test_page_is_self_contained(page):
    """No external scripts, styles, images or fetches: the page must work from file:// offline."""
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img|iframe|source)\b[^>]*\b(src|href)\s*=", html, re.I)
    assert not re.search(r"url\(\s*['\"]?https?:", html, re.I)
    app = html.rsplit("<script>", 1)[1]  # the page's own code, after the inlined libraries
    assert "http" not in app and "fetch(" not in app and "XMLHttpRequest" not in app
    assert html.count("</script>") == html.lower().count("<script")


def test_zones_embedded_with_status(page, messages):
    """Every zone is embedded with its kind and verdict; wrong, missed and extra ones marked."""
    data = _embedded(page.read_text(encoding="utf-8"), "clover-data")
    zones = [z for m in data["messages"] for z in m["zones"]]
    assert data["num_zones"] == len(zones) == count_zones(messages)
    assert [m["id"] for m in data["messages"]] == [m["id"] for m in messages]
    by_msg = {m["id"]: m for m in data["messages"]}
    shifted = by_msg[messages[1]["id"]]["zones"]
    assert [(z["kind"], z["ok"], z["errors"]) for z in shifted] == [
        ("truth", False, ["centre"]), ("pred", False, ["centre"])]
    assert not by_msg[messages[1]["id"]]["ok"] and by_msg[messages[0]["id"]]["ok"]
    missed = [z for z in by_msg[messages[10]["id"]]["zones"] if z["kind"] == "truth"]
    assert [z["errors"] for z in missed if not z["ok"]] == [["missing_zone"]]
    extra = [z for z in by_msg[messages[12]["id"]]["zones"] if z["id"] == "X9"]
    assert [(z["ok"], z["matched"], z["errors"], z["ceil_m"]) for z in extra] == [
        (False, False, ["extra_zone"], None)]


def test_land_data_embedded(page):
    """The land outline comes from the installed world-atlas package, inlined as TopoJSON."""
    land = _embedded(page.read_text(encoding="utf-8"), "clover-land")
    assert land["type"] == "Topology" and len(land["objects"]["countries"]["geometries"]) > 200


def test_heights_are_exaggerated_metres(tmp_path):
    """Drawn height = (ceiling - floor) in metres x exaggeration; FL is 100 ft, UNL is capped."""
    zone = {"lat": 49.5, "lon": 11.2, "radius_m": 1000.0, "id": "A1",
            "lower": {"value": 1500, "unit": "FT", "ref": "AMSL"},
            "upper": {"value": 125, "unit": "FL", "ref": "STD"}}  # fmt: skip
    unl = {**zone, "id": "A2", "lower": {"value": 0, "unit": "FT", "ref": "SFC"},
           "upper": {"unit": "UNL"}}  # fmt: skip
    msgs = [{"id": "m", "text": "t", "truth": [zone, unl], "pred": [], "pred_correct": []}]
    page = write_map(msgs, tmp_path / "p.html", vertical_exaggeration=3)
    z1, z2 = _embedded(page.read_text(encoding="utf-8"), "clover-data")["messages"][0]["zones"]
    assert z1["z_draw"] == pytest.approx(1500 * 0.3048 * 3)
    assert z1["h_draw"] == pytest.approx((12500 - 1500) * 0.3048 * 3)
    assert z2["z_draw"] == 0 and z2["h_draw"] > z1["z_draw"] + z1["h_draw"]
    assert (z1["lower"], z1["upper"], z2["lower"], z2["upper"]) == (
        "1500 FT AMSL", "FL125", "SFC", "UNL")


def test_auto_exaggeration_is_nice_and_grows_with_flat_zones():
    """Flat zones (wide, low) need more exaggeration; the factor is a round number."""
    def msgs(radius_m: float) -> list[dict]:
        z = {"lat": 0.0, "lon": 0.0, "radius_m": radius_m,
             "upper": {"value": 400, "unit": "FT", "ref": "AGL"}}  # fmt: skip
        return [{"id": "m", "text": "", "truth": [z], "pred": []}]
    small, large = auto_exaggeration(msgs(200.0)), auto_exaggeration(msgs(20000.0))
    assert small in (1, 2, 5, 10, 20, 50, 100) and large in (1, 2, 5, 10, 20, 50, 100)
    assert small < large


def test_bad_input_is_reported(tmp_path, messages):
    """A verdict list of the wrong length or a non-positive exaggeration is a user error."""
    bad = copy.deepcopy(messages[:1])
    bad[0]["pred_correct"] = bad[0]["pred_correct"] + [True]
    with pytest.raises(ValueError, match="pred_correct"):
        write_map(bad, tmp_path / "x.html")
    with pytest.raises(ValueError, match="vertical_exaggeration"):
        write_map(messages, tmp_path / "x.html", vertical_exaggeration=0)


def test_verdicts_default_to_the_scorer(tmp_path, messages):
    """Without pred_correct the page uses the scorer's matching: the same verdicts as given."""
    stripped = [{k: v for k, v in m.items() if k != "pred_correct"} for m in messages]
    a = _embedded(write_map(messages, tmp_path / "a.html").read_text("utf-8"), "clover-data")
    b = _embedded(write_map(stripped, tmp_path / "b.html").read_text("utf-8"), "clover-data")
    assert a["messages"] == b["messages"]


def test_message_text_cannot_break_out_of_the_page(tmp_path):
    """Message text is data: a `</script>` in it must not end the data block."""
    evil = "</script><script>window.PWNED=1</script><!--"
    z = {"lat": 1.0, "lon": 2.0, "radius_m": 500.0, "id": "Z1"}
    page = write_map([{"id": evil, "text": evil, "truth": [z], "pred": [z]}], tmp_path / "e.html")
    html = page.read_text(encoding="utf-8")
    assert "PWNED" not in html.replace("window.PWNED=1", "")  # appears once, inside JSON
    assert _embedded(html, "clover-data")["messages"][0]["text"] == evil
    assert html.count("<script") == html.count("</script>")


def test_empty_input_gives_an_empty_map(tmp_path):
    """No messages is a valid demo result: a page with nothing to draw, not an error."""
    data = _embedded(write_map([], tmp_path / "e.html").read_text("utf-8"), "clover-data")
    assert data["messages"] == [] and data["num_zones"] == count_zones([]) == 0


def test_limit_text_reads_like_a_notam():
    assert limit_text({"value": 400, "unit": "FT", "ref": "AGL"}) == "400 FT AGL"
    assert limit_text({"value": 95, "unit": "FL", "ref": "STD"}) == "FL095"
    assert limit_text({"value": 0, "unit": "FT", "ref": "SFC"}) == "SFC"
    assert limit_text({"unit": "UNL"}) == "UNL"


# ---- real browser ------------------------------------------------------------------------------


CHROME_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1600,1000", "--hide-scrollbars",
    # WebGL without a GPU: ANGLE on SwiftShader (software Vulkan/GL)
    "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
)  # fmt: skip


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        _skip_or_fail(f"{CHROMIUM} / {CHROMEDRIVER} missing: run scripts/install_browser_deps.sh")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chrome-profile')}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait_ready(driver, timeout_s: float = 120.0) -> None:  # software WebGL on 2 busy cores
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if driver.execute_script("return window.CLOVER_READY === true"):
            return
        errors = driver.execute_script("return window.CLOVER_ERRORS || []")
        assert not errors, f"page errors before ready: {errors}"
        time.sleep(0.2)
    raise AssertionError(f"page not ready after {timeout_s}s; errors: {_severe(driver)}")


def _severe(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    """Save under tmp (always) and under runs/test-screenshots (when writable)."""
    path = tmp_path / name
    driver.save_screenshot(str(path))
    try:
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOT_DIR / name)
    except OSError:
        pass
    return path


@pytest.mark.slow
def test_page_renders_in_headless_chromium(browser, page, messages, tmp_path):
    """The real page: WebGL renders, every zone cylinder is drawn, no errors, nothing fetched."""
    browser.get(page.as_uri())
    _wait_ready(browser)
    assert browser.execute_script("return window.CLOVER_ZONES_DRAWN") == count_zones(messages)
    assert browser.execute_script("return window.CLOVER_ERRORS") == []
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(r.split(":", 1)[0] in ("file", "data", "blob") for r in resources), resources
    time.sleep(0.5)
    assert _screenshot(browser, tmp_path, "map.png").stat().st_size > 20_000
    # zoomed on message 1 (centre shifted: red model zone beside the amber truth outline), the
    # GPU picking pass must find that message's cylinders where they are drawn
    browser.execute_script("window.CLOVER_FLY_TO_MESSAGE(1, 0)")
    time.sleep(1.5)
    for k, kind in enumerate(["truth", "pred"]):
        picked = browser.execute_script("return window.CLOVER_PICK_ZONE(1, arguments[0])", k)
        assert (picked.get("message"), picked.get("kind")) == (messages[1]["id"], kind), picked
    assert _screenshot(browser, tmp_path, "map-message.png").stat().st_size > 20_000
    assert _severe(browser) == []
