"""The demo's 3D map page: truth and predicted zones (cylinders, or extruded polygons) over a
world land map.

`write_map(messages, out_path)` writes ONE self-contained HTML file: deck.gl's standalone bundles,
topojson-client and world-atlas country outlines (npm packages pinned in web/package-lock.json,
installed by scripts/install_browser_deps.sh) are inlined, so the page works from file:// with no
network, tile server or token. This module only draws: correctness comes from the caller (or, when
absent, from `scorer.match_zones`); it never edits the zones it is given.
Heights: FL is 100 ft pressure altitude, AGL/SFC/AMSL are drawn above a flat sea-level map.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from clover.tasks.airspace.normalise import Limit, Zone, enclosing_circle, parse_limit
from clover.tasks.airspace.scorer import match_zones

TEMPLATE = Path(__file__).with_name("map_template.html")
NODE_MODULES_ENV = "CLOVER_NODE_MODULES"
# placeholder in the template -> file under node_modules, inlined verbatim
ASSETS = {
    "DECK_CORE": "@deck.gl/core/dist.min.js",
    "DECK_LAYERS": "@deck.gl/layers/dist.min.js",
    "TOPOJSON": "topojson-client/dist/topojson-client.min.js",
    "LAND": "world-atlas/countries-50m.json",
}
NICE_EXAGGERATIONS = (1, 2, 5, 10, 20, 50, 100)
MIN_UNL_TOP_M = 6000.0  # UNL ceilings are drawn to max(this, highest finite ceiling) * 1.25
SNIPPET_CHARS = 160


def count_zones(messages: list[dict]) -> int:
    """Cylinders the page draws: every truth zone plus every predicted zone."""
    return sum(len(m.get("truth") or []) + len(m.get("pred") or []) for m in messages)


def write_map(
    messages: list[dict],
    out_path: str | Path,
    *,
    title: str = "Clover airspace demo",
    vertical_exaggeration: float | None = None,
) -> Path:
    """Write the map page for `messages` ({"id", "text", "truth", "pred", "pred_correct"?,
    "model"?}, zones in normalised form) to `out_path`; returns the path.

    `vertical_exaggeration=None` picks one from the data (see `auto_exaggeration`). The page sets
    `window.CLOVER_ZONES_DRAWN` (== `count_zones(messages)`) and `window.CLOVER_READY = true`
    once its first frame with every layer loaded has been drawn.
    """
    if vertical_exaggeration is not None and not vertical_exaggeration > 0:
        raise ValueError(f"vertical_exaggeration must be > 0, got {vertical_exaggeration!r}")
    exaggeration = vertical_exaggeration or auto_exaggeration(messages)
    data = page_data(messages, title=title, exaggeration=exaggeration)
    html = render_page(data, read_assets())
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


# ---- heights -----------------------------------------------------------------------------------


def limit_metres(limit: Any) -> float:
    """Height of a normalised limit in metres above the (flat, sea-level) map; UNL is +inf."""
    return parse_limit(limit).metres()[1]


def limit_text(limit: Any) -> str:
    """A limit as an aviator writes it: SFC, 400 FT AGL, 1500 FT AMSL, FL125, UNL."""
    lim: Limit = parse_limit(limit)
    if lim.unit == "UNL" or lim.ref == "SFC":
        return lim.unit if lim.unit == "UNL" else "SFC"
    value = lim.to_dict()["value"]
    return f"FL{int(value):03d}" if lim.unit == "FL" else f"{value} {lim.unit} {lim.ref}"


def auto_exaggeration(messages: list[dict]) -> float:
    """A nice factor (1, 2, 5, 10, ...) that makes the median zone about half as tall as wide."""
    ratios = sorted(
        2 * z["radius_m"] / (ceil - floor)
        for z in _all_zones(messages)
        for floor, ceil in [(limit_metres(z.get("lower", "SFC")), _ceiling(z))]
        if math.isfinite(ceil) and ceil > floor
    )
    if not ratios:
        return 10.0
    target = 0.5 * ratios[len(ratios) // 2]
    return float(min(NICE_EXAGGERATIONS, key=lambda x: abs(math.log(x / target))))


def unl_top_m(messages: list[dict]) -> float:
    """Real height (m) to which UNL ceilings are drawn: above every finite ceiling on the page."""
    finite = [c for z in _all_zones(messages) if math.isfinite(c := _ceiling(z))]
    return max([MIN_UNL_TOP_M, *finite]) * 1.25


def _ceiling(zone: dict) -> float:
    return limit_metres(zone.get("upper", "UNL"))


def _all_zones(messages: list[dict]) -> list[dict]:
    return [_with_circle(z) for m in messages
            for z in (m.get("truth") or []) + (m.get("pred") or [])]  # fmt: skip


def _with_circle(zone: dict) -> dict:
    """A polygon zone given by its vertices alone gets its enclosing circle (for framing and
    labels); the outline itself is drawn from the vertices."""
    if not zone.get("polygon") or "radius_m" in zone:
        return zone
    lat, lon, radius_m = enclosing_circle(tuple(tuple(p) for p in zone["polygon"]))
    return {**zone, "lat": lat, "lon": lon, "radius_m": radius_m}


# ---- page data ---------------------------------------------------------------------------------


def page_data(messages: list[dict], *, title: str, exaggeration: float) -> dict:
    """Everything the page's script needs, with heights already in drawn (exaggerated) metres."""
    unl_top = unl_top_m(messages)
    out = [_message_data(m, k, exaggeration, unl_top) for k, m in enumerate(messages)]
    models = sorted({str(m["model"]) for m in messages if m.get("model")})
    return {
        "title": title, "model": ", ".join(models), "exaggeration": exaggeration,
        "unl_top_m": unl_top, "num_zones": count_zones(messages), "messages": out,
    }  # fmt: skip


def _message_data(msg: dict, index: int, exaggeration: float, unl_top: float) -> dict:
    truth = [_with_circle(z) for z in msg.get("truth") or []]
    pred = [_with_circle(z) for z in msg.get("pred") or []]
    truth_verdicts, pred_verdicts = _verdicts(truth, pred, _pred_correct(msg, truth, pred))
    zones = [_zone_data(z, "truth", v, exaggeration, unl_top)
             for z, v in zip(truth, truth_verdicts, strict=True)]  # fmt: skip
    zones += [_zone_data(z, "pred", v, exaggeration, unl_top)
              for z, v in zip(pred, pred_verdicts, strict=True)]  # fmt: skip
    return {
        "index": index, "id": str(msg.get("id", index)), "text": str(msg.get("text", "")),
        "snippet": _snippet(str(msg.get("text", ""))), "ok": all(z["ok"] for z in zones),
        "num_truth": len(truth), "num_pred": len(pred), "zones": zones,
    }  # fmt: skip


def _pred_correct(msg: dict, truth: list[dict], pred: list[dict]) -> list[bool]:
    """The caller's per-zone verdicts, or the scorer's matching when it gave none."""
    given = msg.get("pred_correct")
    if given is None:
        matches = match_zones(_zones(pred), _zones(truth))
        ok = {i for i, _, errs in matches if not errs}
        return [i in ok for i in range(len(pred))]
    if len(given) != len(pred):
        raise ValueError(
            f"message {msg.get('id')!r}: pred_correct has {len(given)} entries for "
            f"{len(pred)} predicted zones; give one bool per zone in 'pred'"
        )
    return [bool(x) for x in given]


def _verdicts(truth: list[dict], pred: list[dict], pred_ok: list[bool]
              ) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """{"ok", "matched", "errors"} per truth and per predicted zone. The scorer pairs them; a truth
    zone is ok when its partner is one the caller called correct; unpaired zones are missing/extra.
    """
    truth_v = [{"ok": False, "matched": False, "errors": ["missing_zone"]} for _ in truth]
    pred_v = [{"ok": ok, "matched": False, "errors": [] if ok else ["extra_zone"]}
              for ok in pred_ok]  # fmt: skip
    for i, j, errs in match_zones(_zones(pred), _zones(truth)):
        errors = [] if pred_ok[i] else errs
        truth_v[j] = {"ok": pred_ok[i], "matched": True, "errors": errors}
        pred_v[i] = {"ok": pred_ok[i], "matched": True, "errors": errors}
    return truth_v, pred_v


def _zones(dicts: list[dict]) -> list[Zone]:
    return [Zone.from_dict(d) for d in dicts]


def _zone_data(z: dict, kind: str, verdict: dict, exaggeration: float, unl_top: float) -> dict:
    floor, ceil = limit_metres(z.get("lower", "SFC")), _ceiling(z)
    top = ceil if math.isfinite(ceil) else max(unl_top, floor + 1.0)
    return {
        "kind": kind, **verdict, "id": str(z.get("id") or "?"),
        "lat": float(z["lat"]), "lon": float(z["lon"]), "radius_m": float(z["radius_m"]),
        "floor_m": floor, "ceil_m": ceil if math.isfinite(ceil) else None,
        "z_draw": floor * exaggeration, "h_draw": max(top - floor, 1.0) * exaggeration,
        "lower": limit_text(z.get("lower", "SFC")), "upper": limit_text(z.get("upper", "UNL")),
        "start_utc": z.get("start_utc"), "end_utc": z.get("end_utc"),
        "polygon": z.get("polygon") or None, "schedule": z.get("schedule"),
    }  # fmt: skip


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


# ---- assets and HTML ---------------------------------------------------------------------------


def node_modules_dir() -> Path:
    """web/node_modules of this checkout, or $CLOVER_NODE_MODULES."""
    env = os.environ.get(NODE_MODULES_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / "web" / "node_modules"


def read_assets() -> dict[str, str]:
    """The inlined libraries and land data; a clear error when they are not installed."""
    root = node_modules_dir()
    missing = [rel for rel in ASSETS.values() if not (root / rel).is_file()]
    if missing:
        raise FileNotFoundError(
            f"map page assets missing under {root}: {', '.join(missing)}. Run "
            f"`bash scripts/install_browser_deps.sh` (or `make browser-deps`), or point "
            f"${NODE_MODULES_ENV} at a node_modules folder that has them."
        )
    return {key: (root / rel).read_text(encoding="utf-8") for key, rel in ASSETS.items()}


def render_page(data: dict, assets: dict[str, str]) -> str:
    """Fill the template: scripts and JSON go in verbatim, made safe inside <script> tags."""
    parts = {key: _script_safe(text) for key, text in assets.items() if key != "LAND"}
    parts["LAND"] = _json_safe(assets["LAND"])
    parts["DATA"] = _json_safe(json.dumps(data, ensure_ascii=False, allow_nan=False))
    html = TEMPLATE.read_text(encoding="utf-8").replace("__TITLE__", _html_escape(data["title"]))
    return re.sub(r"/\*@(\w+)@\*/", lambda m: parts[m.group(1)], html)


def _script_safe(js: str) -> str:
    """A script body can't contain `</script` or `<!--`; both only ever occur inside strings."""
    return re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE).replace("<!--", "<\\!--")


def _json_safe(text: str) -> str:
    """JSON inside <script type=application/json>: `<` as \\u003c (only valid inside strings)."""
    return text.replace("<", "\\u003c")


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
