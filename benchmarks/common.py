"""Helpers shared by the benchmarks: medians over repeats and the markdown report."""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def median_of(fn: Callable[[], float], repeats: int = 5) -> tuple[float, list[float]]:
    values = [fn() for _ in range(repeats)]
    return statistics.median(values), values


@contextlib.contextmanager
def fake_orin(sample_hz: float = 50.0) -> Iterator[object]:
    """A JetsonDevice on a fake AGX Orin sysfs tree (JetPack 6): the sampler does a board's reads.
    Sets DVFS_SYSFS_ROOT and DVFS_SYSTEM_STATE_PREFIX for the process, as a benchmark owns its process."""
    from dvfs_mlops.hw.jetson import JetsonDevice
    from testkit.fakes.sysfs import make_orin_tree

    with tempfile.TemporaryDirectory() as tmp:
        fake = make_orin_tree(Path(tmp) / "root", jetpack=6)
        os.environ["DVFS_SYSFS_ROOT"] = str(fake.root)
        os.environ["DVFS_SYSTEM_STATE_PREFIX"] = str(Path(tmp) / "state")
        yield JetsonDevice(sample_hz=sample_hz)


def machine() -> str:
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
