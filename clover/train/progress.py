"""What a training run shows a person: log lines on the main process, and a rich progress bar
(loss, tokens/s, ETA) when stderr is a terminal. Display only: it never changes the run."""

from __future__ import annotations

from typing import Any


class Display:
    """Log lines on the main process; plus a progress bar when `progress` and a terminal."""

    def __init__(self, steps: int, progress: bool, enabled: bool, start_step: int) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = Console(stderr=True)
        self.progress = None
        if enabled and progress and self.console.is_terminal:
            self.progress = _rich_progress(self.console)
            self.task = self.progress.add_task("train", total=steps, completed=start_step,
                                               loss=float("nan"), tok_s=0.0)

    def __enter__(self) -> Display:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, tok_s: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=loss, tok_s=tok_s)

    def log(self, entry: dict[str, Any]) -> None:
        if not self.enabled:
            return
        shown = {k: v for k, v in entry.items() if k not in ("moe_load", "lr", "tokens_seen")}
        self.console.print(" ".join(f"{k}={v}" for k, v in shown.items()), highlight=False,
                           soft_wrap=True)


def _rich_progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"),
                    TextColumn("{task.fields[tok_s]:,.0f} tok/s"), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console)
