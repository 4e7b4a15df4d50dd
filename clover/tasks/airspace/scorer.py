"""Strict scorer: predicted zones against ground truth, per zone and per message.

A predicted zone is matched to a true one (greedy best match: correct pairs first, then the
closest centre); it is correct when the centre is within 100 m and the radius within 1 % (a true
polygon: as many vertices, each within 100 m, in order from any vertex), both limits equal after
conversion to metres (2 m tolerance, same reference), both times exact, and `replaces` and the
schedule (upper case, spaces collapsed) equal when the truth has them. Field accuracy gives
partial credit: the share of the true zones' fields (centre, radius, lower, upper, start, end;
a polygon's outline is one field in place of centre and radius; `replaces` and `schedule` where
set) that the matched prediction gets right, a missing zone counting all its fields wrong.
Predictions may be raw model text, parsed tool calls, OpenAI tool_call dicts, or normalised
zones; garbage is counted as invalid, never raised.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from clover.tasks.airspace.normalise import Zone, distance_m
from clover.tasks.airspace.tools import Cancel, interpret_call, parse_tool_calls

CENTRE_TOL_M = 100.0
RADIUS_REL_TOL = 0.01
ZONE_FIELDS = ("centre", "radius", "lower", "upper", "start", "end")  # + replaces, schedule
ERROR_KINDS = ("centre", "radius", "lower", "upper", "start", "end", "replaces", "schedule",
               "missing_zone", "extra_zone", "invalid_call", "missing_cancel",
               "extra_cancel")  # fmt: skip


@dataclass
class Prediction:
    """What one prediction amounts to once read: zones, cancels, and call counts."""

    zones: list[Zone] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    num_calls: int = 0
    num_invalid: int = 0


def read_prediction(pred: Any) -> Prediction:
    """Raw text, a list of calls, or {"output" | "tool_calls" | "calls" | "zones" (+ "cancels")}
    -> Prediction."""
    if isinstance(pred, dict) and "zones" in pred and not _has_calls(pred):
        out = _from_zones(pred["zones"])
        cancels = pred.get("cancels")
        out.cancels = [str(c) for c in cancels] if isinstance(cancels, list) else []
        return out
    if isinstance(pred, dict):
        pred = next((pred[k] for k in ("output", "tool_calls", "calls", "text") if k in pred), None)
    parsed = parse_tool_calls(pred)
    out = Prediction(
        num_calls=len(parsed.calls) + parsed.num_invalid, num_invalid=parsed.num_invalid
    )
    for call in parsed.calls:
        try:
            action = interpret_call(call["name"], call["arguments"])
        except (ValueError, TypeError, AttributeError, OverflowError):
            out.num_invalid += 1
            continue
        if isinstance(action, Cancel):
            out.cancels.append(action.zone_id)
        else:
            out.zones.append(action)
    return out


def _has_calls(pred: dict) -> bool:
    return any(k in pred for k in ("output", "tool_calls", "calls"))


def _from_zones(zones: Any) -> Prediction:
    out = Prediction()
    for z in zones if isinstance(zones, list) else [zones]:
        out.num_calls += 1
        try:
            out.zones.append(Zone.from_dict(z))
        except (ValueError, TypeError, AttributeError, OverflowError):
            out.num_invalid += 1
    return out


def zone_errors(pred: Zone, truth: Zone) -> list[str]:
    """Which attributes of `pred` fail the tolerances against `truth` (empty: correct)."""
    errors = []
    if truth.polygon:  # the shape is its vertices: "centre" is the whole outline, no radius
        errors += [] if same_polygon(pred.polygon, truth.polygon) else ["centre"]
    else:
        if pred.polygon or distance_m(pred.lat, pred.lon, truth.lat, truth.lon) > CENTRE_TOL_M:
            errors.append("centre")
        if abs(pred.radius_m - truth.radius_m) > RADIUS_REL_TOL * truth.radius_m:
            errors.append("radius")
    errors += [
        name
        for name, a, b in (("lower", pred.lower, truth.lower), ("upper", pred.upper, truth.upper))
        if not a.matches(b)
    ]
    errors += ["start"] if pred.start_utc != truth.start_utc else []
    errors += ["end"] if pred.end_utc != truth.end_utc else []
    if truth.replaces and pred.replaces != truth.replaces:
        errors.append("replaces")
    if truth.schedule and pred.schedule != truth.schedule:
        errors.append("schedule")
    return errors


def same_polygon(pred: tuple, truth: tuple) -> bool:
    """As many vertices, each true vertex within CENTRE_TOL_M of its own predicted one (any
    starting vertex, either direction)."""
    n = len(truth)
    if len(pred) != n:
        return False
    orders = [pred[k:] + pred[:k] for k in range(n)]
    orders += [tuple(reversed(o)) for o in orders]
    return any(all(distance_m(*p, *t) <= CENTRE_TOL_M for p, t in zip(o, truth, strict=True))
               for o in orders)  # fmt: skip


def match_zones(preds: list[Zone], truths: list[Zone]) -> list[tuple[int, int, list[str]]]:
    """Greedy one-to-one matching: (pred index, truth index, errors); correct pairs win first."""
    pairs = []
    for i, p in enumerate(preds):
        for j, t in enumerate(truths):
            errs = zone_errors(p, t)
            dist = distance_m(p.lat, p.lon, t.lat, t.lon) + abs(p.radius_m - t.radius_m)
            pairs.append((len(errs) > 0, len(errs), dist, i, j, errs))
    pairs.sort(key=lambda x: x[:5])
    used_p, used_t, out = set(), set(), []
    for *_, i, j, errs in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i), used_t.add(j)
            out.append((i, j, errs))
    return out


@dataclass
class MessageScore:
    num_truth: int
    num_pred: int
    num_correct: int
    exact: bool
    errors: Counter
    centre_errors_m: list[float]
    num_fields: int = 0  # fields of the true zones (see `zone_fields`)
    num_fields_right: int = 0
    num_calls: int = 0  # calls made, parsed or not
    num_invalid: int = 0
    negative: bool = False  # the truth has no zone and no cancel


def zone_fields(truth: Zone) -> int:
    """How many fields a true zone is scored on: the six of ZONE_FIELDS (a polygon's outline is
    one, in place of centre and radius), + replaces and schedule when set."""
    return len(ZONE_FIELDS) - bool(truth.polygon) + bool(truth.replaces) + bool(truth.schedule)


def score_message(pred: Prediction, truth_zones: list[Zone], truth_cancels: list[str]
                  ) -> MessageScore:  # fmt: skip
    """Score one message's prediction against its truth."""
    errors: Counter = Counter()
    matches = match_zones(pred.zones, truth_zones)
    for _, _, errs in matches:
        errors.update(errs)
    num_correct = sum(1 for *_, errs in matches if not errs)
    errors["missing_zone"] += len(truth_zones) - len(matches)
    errors["extra_zone"] += len(pred.zones) - len(matches)
    errors["invalid_call"] += pred.num_invalid
    errors["missing_cancel"] += len(set(truth_cancels) - set(pred.cancels))
    errors["extra_cancel"] += len(set(pred.cancels) - set(truth_cancels))
    dists = [distance_m(pred.zones[i].lat, pred.zones[i].lon, truth_zones[j].lat,
                        truth_zones[j].lon) for i, j, _ in matches]  # fmt: skip
    exact = not +errors and len(pred.zones) == len(truth_zones) == num_correct
    fields_right = sum(zone_fields(truth_zones[j]) - len(errs) for _, j, errs in matches)
    return MessageScore(len(truth_zones), len(pred.zones), num_correct, exact, errors, dists,
                        sum(zone_fields(t) for t in truth_zones), fields_right, pred.num_calls,
                        pred.num_invalid, not truth_zones and not truth_cancels)


def read_truth(t: Any) -> tuple[list[Zone], list[str]]:
    """An Example or an external {zones, cancels} record -> (true zones, true cancels)."""
    if isinstance(t, dict):
        return [Zone.from_dict(z) for z in t.get("zones") or []], list(t.get("cancels") or [])
    return list(t.zones), list(getattr(t, "cancels", []))


def score_each(predictions: list[Any], truths: list[Any]) -> list[MessageScore]:
    """Each message's score, predictions and truths (Examples or external records) aligned by
    position."""
    if len(predictions) != len(truths):
        raise ValueError(f"{len(predictions)} predictions for {len(truths)} messages")
    return [score_message(read_prediction(p), *read_truth(t))
            for p, t in zip(predictions, truths, strict=True)]


def score(predictions: list[Any], truths: list[Any]) -> dict:
    """Score predictions against truths (Examples or external records), aligned by position.

    Returns zone precision / recall / F1, exact-message accuracy, tool-call validity, hallucinated
    zones on negatives, mean centre error of matched zones, and per-error counts.
    """
    return _summary(score_each(predictions, truths))


def _summary(scores: list[MessageScore]) -> dict:
    errors = sum((s.errors for s in scores), Counter())
    num_calls = sum(s.num_calls for s in scores)
    num_invalid = sum(s.num_invalid for s in scores)
    negatives = sum(s.negative for s in scores)
    hallucinated = sum(s.num_pred for s in scores if s.negative)
    n_truth = sum(s.num_truth for s in scores)
    n_pred = sum(s.num_pred for s in scores)
    n_ok = sum(s.num_correct for s in scores)
    precision = n_ok / n_pred if n_pred else 1.0  # nothing predicted: no false positives
    recall = n_ok / n_truth if n_truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    dists = [d for s in scores for d in s.centre_errors_m]
    n_fields = sum(s.num_fields for s in scores)
    return {
        "num_messages": len(scores), "num_truth_zones": n_truth, "num_pred_zones": n_pred,
        "num_correct_zones": n_ok, "zone_precision": precision, "zone_recall": recall,
        "zone_f1": f1,
        "field_accuracy": sum(s.num_fields_right for s in scores) / n_fields if n_fields else 1.0,
        "exact_message_accuracy": sum(s.exact for s in scores) / len(scores) if scores else 0.0,
        "num_calls": num_calls, "num_invalid_calls": num_invalid,
        "tool_call_validity": (num_calls - num_invalid) / num_calls if num_calls else 1.0,
        "num_negatives": negatives, "hallucinated_zones_on_negatives": hallucinated,
        "mean_centre_error_m": sum(dists) / len(dists) if dists else None,
        "errors": {k: errors.get(k, 0) for k in ERROR_KINDS},
    }  # fmt: skip
