"""Power sampling and energy integration -> `EnergyReport`.

Real backends hand the meter a `read_rails()` callable (watts per rail) and optionally a
`read_util()` callable (GPU load in %). A daemon thread samples them at a fixed rate (50 Hz by
default: jtop's 1 s interval is too coarse for short runs) and the energy is the trapezoidal
integral of each rail. The simulated twin builds its reports analytically instead.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The study's "energy" is CPU + GPU; these rail names carry it on an AGX Orin.
CPU_GPU_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV")
GPU_RAILS = ("VDD_GPU_SOC", "gpu")
CPU_RAILS = ("VDD_CPU_CV",)


@dataclasses.dataclass
class EnergyReport:
    """Energy of one metered interval. JSON keys are the field names."""

    duration_s: float
    energy_j: float  # CPU + GPU, as in the study (GPU only where no CPU rail exists)
    energy_total_j: float  # every rail
    energy_by_rail_j: dict[str, float]
    avg_power_w: float  # energy_total_j / duration_s
    peak_power_w: float  # highest sampled total power
    gpu_util_pct: float | None
    samples: int
    simulated: bool
    power_series_w: list[float] = dataclasses.field(default_factory=list, repr=False)

    @property
    def energy_gpu_j(self) -> float:
        return sum(v for k, v in self.energy_by_rail_j.items() if k in GPU_RAILS)

    @property
    def energy_cpu_j(self) -> float:
        return sum(v for k, v in self.energy_by_rail_j.items() if k in CPU_RAILS)

    def to_dict(self, with_series: bool = False) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not with_series:
            d.pop("power_series_w")
        return d


def cpu_gpu_energy(by_rail: Mapping[str, float]) -> float:
    """The study's energy: GPU + CPU rails; falls back to all rails if neither is present."""
    chosen = [v for k, v in by_rail.items() if k in CPU_GPU_RAILS or k == "gpu"]
    return float(sum(chosen)) if chosen else float(sum(by_rail.values()))


def integrate(times_s: Sequence[float], watts: Sequence[Sequence[float]], rails: Sequence[str]) -> dict[str, float]:
    """Trapezoidal energy per rail (J) from timestamped samples (one row of watts per sample)."""
    import numpy as np

    if len(times_s) < 2:
        return {r: 0.0 for r in rails}
    t = np.asarray(times_s, dtype=float)
    w = np.asarray(watts, dtype=float).reshape(len(times_s), len(rails))
    joules = (0.5 * (w[1:] + w[:-1]) * np.diff(t)[:, None]).sum(axis=0)
    return {r: float(j) for r, j in zip(rails, joules)}


def build_report(
    times_s: Sequence[float],
    watts: Sequence[Sequence[float]],
    rails: Sequence[str],
    utils: Sequence[float],
    *,
    simulated: bool = False,
    energy_override_j: Mapping[str, float] | None = None,
) -> EnergyReport:
    """Assemble an `EnergyReport` from samples (energy_override_j: a hardware energy counter)."""
    duration = (times_s[-1] - times_s[0]) if len(times_s) >= 2 else 0.0
    by_rail = dict(energy_override_j) if energy_override_j is not None else integrate(times_s, watts, rails)
    totals = [float(sum(w)) for w in watts]
    total_j = float(sum(by_rail.values()))
    return EnergyReport(
        duration_s=duration,
        energy_j=cpu_gpu_energy(by_rail),
        energy_total_j=total_j,
        energy_by_rail_j={k: float(v) for k, v in by_rail.items()},
        avg_power_w=total_j / duration if duration > 0 else (totals[-1] if totals else 0.0),
        peak_power_w=max(totals) if totals else 0.0,
        gpu_util_pct=(sum(utils) / len(utils)) if utils else None,
        samples=len(times_s),
        simulated=simulated,
        power_series_w=totals,
    )


class PowerSampler:
    """Sample rail power (and GPU load) on a daemon thread and integrate on stop.

    A sample is taken at start and at stop, so even a run shorter than one period is integrated
    over its whole length.
    """

    def __init__(
        self,
        read_rails: Callable[[], Sequence[float]],
        rails: Sequence[str],
        read_util: Callable[[], float | None] | None = None,
        hz: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if hz <= 0:
            raise ValueError("sample rate must be positive")
        self._read_rails = read_rails
        self.rails = list(rails)
        self._read_util = read_util
        self._period = 1.0 / hz
        self._clock = clock
        self._times: list[float] = []
        self._watts: list[Sequence[float]] = []
        self._utils: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        # list.append is atomic under the GIL; the reader only looks after join().
        self._watts.append(self._read_rails())
        if self._read_util is not None:
            util = self._read_util()
            if util is not None:
                self._utils.append(util)
        self._times.append(self._clock())

    def _run(self) -> None:
        # time.sleep wakes cheaper than Event.wait (no lock/condition round trip); stop() waits
        # at most one period for the loop to notice.
        clock, period, stop = self._clock, self._period, self._stop
        next_t = clock() + period
        while True:
            delay = next_t - clock()
            if delay > 0:
                time.sleep(delay)
            if stop.is_set():
                return
            self._sample()
            next_t += period
            if next_t < clock():  # fell behind (suspended): skip, don't burst
                next_t = clock() + period

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="dvfs-power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> tuple[list[float], list[Sequence[float]], list[float]]:
        """Stop sampling (idempotent): the final sample is taken once, when the thread has ended."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self._sample()
        return list(self._times), list(self._watts), list(self._utils)

    def report(self, energy_override_j: Mapping[str, float] | None = None) -> EnergyReport:
        times, watts, utils = self.stop()
        return build_report(times, watts, self.rails, utils, energy_override_j=energy_override_j)
