"""Helpers shared by the benchmarks: medians over repeats and the markdown report."""
from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def median_of(fn: Callable[[], float], repeats: int = 5) -> tuple[float, list[float]]:
    values = [fn() for _ in range(repeats)]
    return statistics.median(values), values


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_report(sections: list[tuple[str, list[tuple[str, str, str]]]], name: str = "report.md") -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [f"# dvfs-mlops benchmarks\n\nMachine: {machine()}. Each figure is the median of several runs.\n"]
    for title, rows in sections:
        lines += [f"\n## {title}\n", "| metric | value | target |", "|---|---|---|"]
        lines += [f"| {m} | {v} | {t} |" for m, v, t in rows]
    path = RESULTS / name
    path.write_text("\n".join(lines) + "\n")
    return path
