"""CPU cost of the power sampler at 50 Hz on a fake AGX Orin sysfs tree (target <= 1 % of a core)."""
from __future__ import annotations

import time
from typing import Any

from benchmarks.common import fake_orin, median_of


def sampler_cpu_share(dev: Any, seconds: float, rates: list[float] | None = None) -> float:
    """CPU seconds per wall second of one metered session whose main thread sleeps: all of that
    CPU time is the sampler's. Appends the achieved sample rate to `rates` when given."""
    with dev.session(816) as s:
        c0, w0 = time.process_time(), time.monotonic()
        time.sleep(seconds)
        c1, w1 = time.process_time(), time.monotonic()
    if rates is not None:
        report = s.report()
        rates.append(report.samples / report.duration_s)
    return (c1 - c0) / (w1 - w0)


def run(seconds: float = 3.0, hz: float = 50.0, repeats: int = 5) -> list[tuple[str, str, str]]:
    with fake_orin(hz) as dev:
        rates: list[float] = []
        share, _ = median_of(lambda: sampler_cpu_share(dev, seconds, rates), repeats)
    return [
        (f"meter CPU share of one core at {hz:g} Hz (4 rails + load)", f"{100 * share:.3f} %", "<= 1 %"),
        ("achieved sample rate", f"{sorted(rates)[len(rates) // 2]:.1f} Hz", f"{hz:g} Hz"),
    ]
