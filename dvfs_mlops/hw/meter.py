"""Power sampling and energy integration -> `EnergyReport`.

Real backends hand the meter a `read_rails()` callable (watts per rail), and optionally
`read_util()` (GPU load in %) and `read_clock()` (the GPU clock actually running, MHz). A daemon
thread samples them at a fixed rate (50 Hz by default: jtop's 1 s interval is too coarse for short
runs) and the energy is the trapezoidal integral of each rail. A failed read (INA3221 reads do fail
now and then) is retried once, then counted in `samples_failed` and skipped; the thread never dies
of it. `mark()` takes a sample on the caller's thread and returns its index, so one session can be
cut into windows (set-up, training steps, evaluation) that are integrated separately.
The simulated twin builds its reports analytically instead.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

# The study's "energy" is CPU + GPU; these rail names carry it on an AGX Orin.
CPU_GPU_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV")
GPU_RAILS = ("VDD_GPU_SOC", "gpu")
CPU_RAILS = ("VDD_CPU_CV",)
# A run whose meter lost more than this share of its samples is flagged (`meter_degraded`).
DEGRADED_SHARE = 0.01
# The clock "held" when it stayed within one table step of the pinned one this share of the time.
HELD_SHARE = 0.95


@dataclasses.dataclass
class EnergyReport:
    """Energy of one metered interval (a session or one of its windows). JSON keys are the field names.

    Attributes:
        duration_s: the interval's length.
        energy_j: CPU + GPU rails (GPU only where no CPU rail exists; every rail where neither is known).
        energy_total_j: every rail.
        energy_by_rail_j: joules per rail name.
        avg_power_w: `energy_total_j / duration_s`.
        peak_power_w: the highest sampled total power.
        gpu_util_pct: the mean GPU load (0..100), None where the backend cannot read it.
        samples: power samples taken (the twin: steps charged).
        simulated: True for the twin's reports.
        clock_mhz_measured: the time-weighted mean of the GPU clock read back, None where it cannot be read.
        clock_held: whether the clock stayed within one table step of the pinned one >= 95 % of the time; None
            where nothing was pinned (maxn, observe) or no clock was read.
        samples_failed: samples that could not be read (after one retry) and were skipped.
        power_series_w: total power per sample (left out of `to_dict()` unless asked for).
        energy_expected_j: the twin only: `energy_j` without its run-to-run noise; None on real backends.
        time_expected_s: the twin only: `duration_s` without its run-to-run noise; None on real backends.
        meter_degraded: (property) more than 1 % of the sample reads failed.
    """

    duration_s: float
    energy_j: float  # CPU + GPU, as in the study (GPU only where no CPU rail exists)
    energy_total_j: float  # every rail
    energy_by_rail_j: dict[str, float]
    avg_power_w: float  # energy_total_j / duration_s
    peak_power_w: float  # highest sampled total power
    gpu_util_pct: float | None
    samples: int
    simulated: bool
    clock_mhz_measured: float | None = None  # time-weighted mean of the clock read back
    clock_held: bool | None = None  # None where nothing was pinned (maxn, observe)
    samples_failed: int = 0
    power_series_w: list[float] = dataclasses.field(default_factory=list, repr=False)
    # The twin only: the same window without its run-to-run noise (the truth a policy is judged by).
    # Real backends leave them None, so nothing is logged for them.
    energy_expected_j: float | None = None  # CPU + GPU, like energy_j
    time_expected_s: float | None = None

    @property
    def energy_gpu_j(self) -> float:
        return sum(v for k, v in self.energy_by_rail_j.items() if k in GPU_RAILS)

    @property
    def energy_cpu_j(self) -> float:
        return sum(v for k, v in self.energy_by_rail_j.items() if k in CPU_RAILS)

    @property
    def meter_degraded(self) -> bool:
        attempts = self.samples + self.samples_failed
        return attempts > 0 and self.samples_failed / attempts > DEGRADED_SHARE

    def to_dict(self, with_series: bool = False) -> dict[str, Any]:
        """The JSON form: every field and `meter_degraded`; the twin's expected values only where set.

        Args:
            with_series: keep `power_series_w`.

        Returns:
            A dict of plain values.
        """
        d = dataclasses.asdict(self)
        d["meter_degraded"] = self.meter_degraded
        if not with_series:
            d.pop("power_series_w")
        for key in ("energy_expected_j", "time_expected_s"):  # the twin's; real backends have no noise-free value
            if d[key] is None:
                d.pop(key)
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


def time_weighted_mean(times_s: Sequence[float], values: Sequence[float | None]) -> float | None:
    """Mean of a step signal sampled at `times_s` (each value holds until the next sample)."""
    pairs = [(t, v) for t, v in zip(times_s, values) if v is not None]
    if not pairs:
        return None
    if len(pairs) == 1:
        return float(pairs[0][1])
    span = pairs[-1][0] - pairs[0][0]
    if span <= 0:
        return float(sum(v for _, v in pairs) / len(pairs))
    return float(sum(v * (t1 - t0) for (t0, v), (t1, _) in itertools.pairwise(pairs)) / span)


def clock_held(times_s: Sequence[float], clocks_mhz: Sequence[float | None], pinned_mhz: float,
               table_mhz: Sequence[float]) -> bool | None:
    """True when the clock read back stayed within one table step of `pinned_mhz` >= 95 % of the time."""
    pairs = [(t, c) for t, c in zip(times_s, clocks_mhz) if c is not None]
    if not pairs:
        return None
    table = sorted(table_mhz)
    steps = [b - a for a, b in itertools.pairwise(table)]
    tolerance = (max(steps) if steps else 0.0) + 0.5
    ok = [abs(c - pinned_mhz) <= tolerance for _, c in pairs]
    if len(pairs) == 1:
        return ok[0]
    spans = [t1 - t0 for (t0, _), (t1, _) in itertools.pairwise(pairs)]
    total = sum(spans)
    if total <= 0:
        return sum(ok) / len(ok) >= HELD_SHARE
    return sum(s for s, good in zip(spans, ok) if good) / total >= HELD_SHARE


def build_report(
    times_s: Sequence[float],
    watts: Sequence[Sequence[float]],
    rails: Sequence[str],
    utils: Sequence[float | None],
    *,
    clocks_mhz: Sequence[float | None] = (),
    samples_failed: int = 0,
    simulated: bool = False,
    energy_override_j: Mapping[str, float] | None = None,
    pinned_mhz: float | None = None,
    table_mhz: Sequence[float] = (),
) -> EnergyReport:
    """Assemble an `EnergyReport` from samples (energy_override_j: a hardware energy counter).

    With `pinned_mhz` (and the frequency table) `clock_held` is judged sample by sample.
    """
    duration = (times_s[-1] - times_s[0]) if len(times_s) >= 2 else 0.0
    by_rail = dict(energy_override_j) if energy_override_j is not None else integrate(times_s, watts, rails)
    totals = [float(sum(w)) for w in watts]
    total_j = float(sum(by_rail.values()))
    util_values = [u for u in utils if u is not None]
    return EnergyReport(
        duration_s=duration,
        energy_j=cpu_gpu_energy(by_rail),
        energy_total_j=total_j,
        energy_by_rail_j={k: float(v) for k, v in by_rail.items()},
        avg_power_w=total_j / duration if duration > 0 else (totals[-1] if totals else 0.0),
        peak_power_w=max(totals) if totals else 0.0,
        gpu_util_pct=(sum(util_values) / len(util_values)) if util_values else None,
        samples=len(times_s),
        simulated=simulated,
        clock_mhz_measured=time_weighted_mean(times_s, clocks_mhz) if clocks_mhz else None,
        clock_held=(clock_held(times_s, clocks_mhz, pinned_mhz, table_mhz)
                    if pinned_mhz is not None and clocks_mhz else None),
        samples_failed=samples_failed,
        power_series_w=totals,
    )


@dataclasses.dataclass
class _Sample:
    t: float
    watts: Sequence[float]
    util: float | None
    clock_mhz: float | None


class PowerSampler:
    """Sample rail power, GPU load and clock on a daemon thread; integrate whole or per window.

    A sample is taken at start, at every `mark()` and at stop, so even a window shorter than one
    period is integrated over its whole length.

    Args:
        read_rails: returns the watts of each rail, in the order of `rails`.
        rails: the rail names.
        read_util: returns the GPU load in % (None: not read).
        hz: the sampling rate of the thread.
        clock: the time source (seconds).
        read_clock: returns the GPU clock actually running, in MHz (None: not read).
        retry_delay_s: the pause before the one retry of a failed read.

    Raises:
        ValueError: `hz` is not positive.
    """

    def __init__(
        self,
        read_rails: Callable[[], Sequence[float]],
        rails: Sequence[str],
        read_util: Callable[[], float | None] | None = None,
        hz: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
        read_clock: Callable[[], float | None] | None = None,
        retry_delay_s: float = 0.001,
    ):
        if hz <= 0:
            raise ValueError("sample rate must be positive")
        self._read_rails = read_rails
        self.rails = list(rails)
        self._read_util = read_util
        self._read_clock = read_clock
        self._period = 1.0 / hz
        self._clock = clock
        self._retry_delay_s = retry_delay_s
        self._samples: list[_Sample] = []
        self._failed_at: list[int] = []  # sample count when each failure happened (for windows)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None

    @property
    def samples_failed(self) -> int:
        """Samples that could not be read so far (each after one retry)."""
        return len(self._failed_at)

    def _read_once(self) -> _Sample:
        watts = self._read_rails()
        util = self._read_util() if self._read_util is not None else None
        clock_mhz = self._read_clock() if self._read_clock is not None else None
        return _Sample(self._clock(), watts, util, clock_mhz)

    def _sample(self) -> int:
        """Take one sample (one retry on an I/O error); returns the index of the newest sample."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    self._samples.append(self._read_once())
                    break
                except (OSError, ValueError) as e:  # EIO from the sensor, a torn read
                    if attempt == 0:
                        time.sleep(self._retry_delay_s)
                        continue
                    self._failed_at.append(len(self._samples))
                    if self._last_error is None:
                        log.warning("power sample failed (%s); counted in samples_failed", e)
                    self._last_error = str(e)
            return len(self._samples) - 1

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
            try:
                self._sample()
            except Exception as e:  # noqa: BLE001 - the meter must outlive any reader bug
                with self._lock:
                    self._failed_at.append(len(self._samples))
                log.warning("power sampler: %s", e)
            next_t += period
            if next_t < clock():  # fell behind (suspended): skip, don't burst
                next_t = clock() + period

    def start(self) -> None:
        """Take the first sample on the caller's thread, then start the sampling thread."""
        self._sample()
        self._thread = threading.Thread(target=self._run, name="dvfs-power-sampler", daemon=True)
        self._thread.start()

    def mark(self) -> int:
        """Sample now (on the caller's thread): a window boundary.

        Returns:
            The index of the newest sample (after `stop()`, the last one; no new sample is taken).
        """
        if self._stop.is_set():
            return len(self._samples) - 1
        return self._sample()

    def stop(self) -> None:
        """Stop sampling (idempotent): the final sample is taken once, when the thread has ended."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self._sample()

    def report(self, start: int = 0, end: int | None = None, energy_override_j: Mapping[str, float] | None = None,
               pinned_mhz: float | None = None, table_mhz: Sequence[float] = ()) -> EnergyReport:
        """The report of samples `start..end`, both included.

        Args:
            start: the first sample's index (a `mark()`).
            end: the last sample's index (a `mark()`); None stops the sampler and takes everything from `start`.
            energy_override_j: joules per rail from a hardware energy counter, used instead of the integral.
            pinned_mhz: the clock pinned, so `clock_held` is judged sample by sample (None: not judged).
            table_mhz: the clock table, whose widest step is the tolerance of that judgement.

        Returns:
            The interval's `EnergyReport`, failed samples inside it counted in `samples_failed`.
        """
        if end is None:
            self.stop()
            end = len(self._samples) - 1
        window = self._samples[max(0, start): end + 1]
        failed = sum(1 for i in self._failed_at if start < i <= end + 1)
        return build_report([s.t for s in window], [s.watts for s in window], self.rails, [s.util for s in window],
                            clocks_mhz=[s.clock_mhz for s in window] if self._read_clock is not None else (),
                            samples_failed=failed, energy_override_j=energy_override_j,
                            pinned_mhz=pinned_mhz, table_mhz=table_mhz)
