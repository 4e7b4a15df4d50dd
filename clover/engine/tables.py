"""`clover generate --stats`: per-request and engine statistics as rich tables.

Presentation only: the figures come from `RequestStats` and `EngineStats` as they are.
"""

from __future__ import annotations

from typing import TextIO


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def request_table(outputs: list):
    from rich.table import Table

    table = Table(title="requests")
    for col in ("request", "finish", "tokens", "forwards", "TPF", "TPS", "first block s",
                "total s"):
        table.add_column(col, justify="left" if col in ("request", "finish") else "right")
    for out in outputs:
        s = out.stats
        table.add_row(out.request_id, out.finish_reason, str(s.generated_tokens),
                      str(s.forwards), _fmt(s.tpf, 2), _fmt(s.tps, 1), _fmt(s.first_block_s),
                      _fmt(s.total_s))
    return table


def engine_table(stats):
    from rich.table import Table

    d = stats.as_dict()
    wall = stats.wall_s

    def share(x: float) -> str:
        return f"{x:.4f} s ({100 * x / wall:.0f}%)" if wall else f"{x:.4f} s"

    table = Table(title="engine")
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = [("steps", d["steps"]), ("forwards", d["forwards"]),
            ("generated tokens", d["generated_tokens"]), ("TPF", d["tpf"]),
            ("mean batch rows", d["mean_batch_rows"]), ("model time", share(stats.model_s)),
            ("policy time", share(stats.policy_s)), ("grammar time", share(stats.grammar_s)),
            ("other time", share(stats.other_s)),
            ("overhead share", f"{100 * d['overhead_share']:.1f}%"),
            ("peak memory", f"{d['peak_memory_bytes'] / 2**20:.1f} MiB")]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def print_stats(outputs: list, engine_stats, stream: TextIO) -> None:
    from rich.console import Console

    console = Console(file=stream, width=max(100, Console(file=stream).width))
    console.print(request_table(outputs))
    console.print(engine_table(engine_stats))
