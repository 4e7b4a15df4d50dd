"""PNG plots of a bench results document: quality vs TPF, quality vs full task time (AR marked),
TPS vs batch size, first-usable-result latency, and the time split.

Pure functions of the results dict (`harness.run_bench`); matplotlib's object API only (no
pyplot, no global backend state), so plotting never opens a window. A plot with nothing to
show (no quality figures for a prompt file without truth, no valid tool call in any run) says
so on its canvas, so every run leaves the same files.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

MARKERS = "osD^v<>ph"


def write_plots(results: dict[str, Any], out: Path) -> dict[str, str]:
    """Every plot that has data, as {name: path}."""
    points = results["points"]
    makers = {"quality_vs_tpf": quality_vs_tpf, "quality_vs_time": quality_vs_time,
              "tps_vs_batch": tps_vs_batch, "first_usable": first_usable,
              "time_split": time_split}
    files = {}
    for name, make in makers.items():
        path = out / f"{name}.png"
        make(points).savefig(path, dpi=110, bbox_inches="tight")
        files[name] = str(path)
    return files


def _figure(title: str, xlabel: str, ylabel: str, size=(7.5, 4.8)):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _nothing(ax, why: str):
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="grey")
    return ax.figure


def _ar_color(p: dict, points: list[dict]) -> str:
    """AR in black at the first precision, then greys, so precisions stay apart."""
    precisions = list(dict.fromkeys(q["precision"] for q in points))
    return ("k", "0.45", "0.7")[min(precisions.index(p["precision"]), 2)]


def _series(p: dict) -> str:
    return f"{p['precision']} {p['policy']} block {p['block_size']}"


def _scored(points: list[dict]) -> bool:
    return any(p.get("zone_f1") is not None for p in points)


def quality_vs_tpf(points: list[dict]):
    """Zone F1 against tokens per forward; one line per (precision, policy, block size) through
    its knob values. Outputs do not depend on the batch, so the smallest batch stands for all."""
    fig, ax = _figure("quality vs tokens per forward", "TPF (tokens committed per forward)",
                      "zone F1")
    if not _scored(points):
        return _nothing(ax, "no ground truth: quality not scored")
    smallest = min(p["batch_size"] for p in points)
    lines = defaultdict(list)
    for p in points:
        if p["batch_size"] == smallest and p["role"] == "dllm":
            lines[_series(p)].append(p)
    for i, (label, pts) in enumerate(sorted(lines.items())):
        pts.sort(key=lambda p: p["tpf"])
        ax.plot([p["tpf"] for p in pts], [p["zone_f1"] for p in pts], marker=MARKERS[i % 9],
                label=label)
        for p in pts:
            ax.annotate(p["setting"].split()[-1], (p["tpf"], p["zone_f1"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    for p in points:
        if p["batch_size"] == smallest and p["role"] == "ar":
            ax.plot(p["tpf"], p["zone_f1"], "*", color=_ar_color(p, points), markersize=13,
                    label=f"AR {p['precision']}")
        if p["batch_size"] == smallest and p["role"] == "spec":
            ax.plot(p["tpf"], p["zone_f1"], "D", color=_ar_color(p, points), markersize=8,
                    label=f"AR + drafter {p['precision']}")
    ax.legend(fontsize=8)
    return fig


def quality_vs_time(points: list[dict]):
    """Zone F1 against full task time (median, bars = min..max over repeats); AR as stars."""
    fig, ax = _figure("quality vs full task time", "full task time (s)", "zone F1")
    if not _scored(points):
        return _nothing(ax, "no ground truth: quality not scored")
    batches = sorted({p["batch_size"] for p in points})
    colors = {}
    for p in points:
        lo, hi = p["spread"].get("full_task_s", [p["full_task_s"]] * 2)
        err = [[p["full_task_s"] - lo], [hi - p["full_task_s"]]]
        if p["role"] == "ar":
            ax.errorbar(p["full_task_s"], p["zone_f1"], xerr=err, fmt="*", markersize=14,
                        color=_ar_color(p, points))
            ax.annotate(f"b{p['batch_size']}", (p["full_task_s"], p["zone_f1"]), fontsize=8,
                        xytext=(4, 6), textcoords="offset points")
            continue
        series = f"{p['precision']} {p['setting'] if p['role'] == 'spec' else p['policy']}"
        color = colors.setdefault(series, f"C{len(colors) % 10}")
        ax.errorbar(p["full_task_s"], p["zone_f1"], xerr=err, color=color, alpha=0.85,
                    fmt=MARKERS[batches.index(p["batch_size"]) % 9])
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker="o", ls="", label=s) for s, c in colors.items()]
    handles += [Line2D([], [], color="grey", marker=MARKERS[i % 9], ls="", label=f"batch {b}")
                for i, b in enumerate(batches)]
    handles += [Line2D([], [], color=_ar_color(p, points), marker="*", ls="", markersize=12,
                       label=f"AR {p['precision']} (bN: batch N)")
                for p in points if p["role"] == "ar" and p["batch_size"] == batches[0]]
    ax.legend(handles=handles, fontsize=8)
    return fig


def tps_vs_batch(points: list[dict]):
    """Throughput against batch size; each dLLM setting at its first block size, AR in black."""
    fig, ax = _figure("throughput vs batch size", "batch size (engine rows)",
                      "TPS (generated tokens / s)")
    first_block = next((p["block_size"] for p in points if p["role"] == "dllm"), None)
    lines = defaultdict(list)
    for p in points:
        if p["role"] != "dllm" or p["block_size"] == first_block:
            lines[(p["role"], p["precision"], p["setting"])].append(p)
    for (role, precision, setting), pts in sorted(lines.items()):
        pts.sort(key=lambda p: p["batch_size"])
        style = {"ar": {"color": "k", "lw": 2.5, "ls": "--"},
                 "spec": {"color": "k", "lw": 1.5, "ls": ":"}}.get(role, {})
        ax.plot([p["batch_size"] for p in pts], [p["tps"] for p in pts], marker="o",
                label=f"{precision} {setting}", **style)
    batches = sorted({p["batch_size"] for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.legend(fontsize=8)
    return fig


def first_usable(points: list[dict]):
    """Seconds to the first valid tool call, per point (bars = min..max over repeats)."""
    pts = [p for p in points if p.get("first_usable_s") is not None]
    fig, ax = _figure("time to first usable result (first valid tool call)", "seconds", "",
                      size=(7.5, 0.28 * max(len(pts), 4) + 1.2))
    if not pts:
        return _nothing(ax, "no run executed a valid tool call")
    for i, p in enumerate(pts):
        lo, hi = p["spread"].get("first_usable_s", [p["first_usable_s"]] * 2)
        ax.barh(i, p["first_usable_s"], xerr=[[p["first_usable_s"] - lo], [hi - p[
            "first_usable_s"]]], color="k" if p["role"] == "ar" else "C0", alpha=0.8)
    ax.set_yticks(range(len(pts)), [p["key"] for p in pts], fontsize=7)
    ax.invert_yaxis()
    return fig


def time_split(points: list[dict]):
    """Where each point's full task time went: model / policy / grammar / other."""
    fig, ax = _figure("time split (median run)", "seconds", "",
                      size=(7.5, 0.28 * len(points) + 1.2))
    left = [0.0] * len(points)
    for part, color in (("model_s", "C0"), ("policy_s", "C1"), ("grammar_s", "C2"),
                        ("other_s", "C7")):
        widths = [p.get(part) or 0.0 for p in points]
        ax.barh(range(len(points)), widths, left=left, color=color,
                label=part.removesuffix("_s"))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(range(len(points)), [p["key"] for p in points], fontsize=7)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
