"""`clover bench`: sweep a diffusion model and its AR twin over decoding settings on a task, and
report quality beside speed, memory and the machine's limits (table, JSON, plots, report.md)."""

from clover.bench.config import BenchConfig, Point, grid, make_config
from clover.bench.harness import run_bench
from clover.bench.report import write_outputs

__all__ = ["BenchConfig", "Point", "grid", "make_config", "run_bench", "write_outputs"]
