"""Power sampling and energy integration -> `EnergyReport`.

Real backends hand the meter a `read_rails()` callable (watts per rail), and optionally
`read_util()` (GPU load in %), `read_clock()` (the GPU clock, MHz, with `clock_source` saying whether it is the
clock measured or the one requested), `read_emc()` (the memory controller clock, MHz) and `read_cpu()` (each cpufreq
policy's clock, MHz). Where a session pinned the CPU or memory clock, each is judged held like the GPU's. A daemon
thread samples them at a fixed rate (50 Hz by default: jtop's 1 s interval is too coarse for short
runs) and the energy is the trapezoidal integral of each rail. A failed read (INA3221 reads do fail
now and then) is retried once, then counted in `samples_failed` and skipped; the thread never dies
of it. `mark()` takes a sample on the caller's thread and returns its index, so one session can be
cut into windows (set-up, training steps, evaluation) that are integrated separately.
Which rails make `energy_j` and which `energy_total_j` depends on the board's rail set (`rail_plan`).
The simulated twin builds its reports analytically instead.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

# One rail plan per board: `energy_j` covers CPU, GPU, CV and SoC on every family, `energy_total_j` the board's input,
# and no rail is counted twice.
# - AGX Orin: INA3221 0x40 ch1 VDD_GPU_SOC, ch2 VDD_CPU_CV, ch3 VIN_SYS_5V0; 0x41 ch2 VDDQ_VDD2_1V8AO (NVIDIA Jetson
#   Linux Developer Guide r35/r36, Platform Power and Performance, "Jetson Orin Nano Series, Jetson Orin NX Series and
#   Jetson AGX Orin Series"; energymon/energymon jetson/JetsonPowerRails.md @a95cefb, "AGX Orin Series"). energy_j is
#   VDD_GPU_SOC + VDD_CPU_CV (the study's). There is no module input rail: the total is VDD_GPU_SOC + VDD_CPU_CV +
#   VIN_SYS_5V0, and VDDQ_VDD2_1V8AO is logged, not added, since VIN_SYS_5V0 feeds it (energymon JetsonPowerRails.md,
#   after the NVIDIA forum thread "Jetson AGX Orin INA3221 power monitor layout"): `FED_BY`.
# - Orin NX / Orin Nano (and Xavier NX): INA3221 0x40 ch1 VDD_IN (module input), ch2 VDD_CPU_GPU_CV, ch3 VDD_SOC (same
#   guide; energymon JetsonPowerRails.md "Xavier NX"). energy_j is VDD_CPU_GPU_CV + VDD_SOC (CPU, GPU and CV share the
#   first rail, so they cannot be told apart); the total is VDD_IN alone, which feeds the other two.
# - NVML: one "gpu" rail (the board's power).
GPU_RAILS = ("VDD_GPU_SOC", "gpu")
CPU_RAILS = ("VDD_CPU_CV",)
COMBINED_CPU_GPU_RAILS = ("VDD_CPU_GPU_CV",)
SOC_RAILS = ("VDD_SOC",)  # the SoC's own rail where the GPU's does not carry it (Orin NX/Nano)
# A rail another rail of the same board feeds: read and logged, never added to a total that has its feeder.
FED_BY = {"VDDQ_VDD2_1V8AO": "VIN_SYS_5V0"}
# A module input rail: the board's total where present, never summed with the rails it feeds. jetson-stats takes the
# same two names as the total (rbonghi/jetson_stats jtop/core/power.py @f41d5ca, total_power(), l.26-57: "POM_5V_IN"
# or "VDD_IN", else the sum of all rails).
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
# A run whose meter lost more than this share of its samples is flagged (`meter_degraded`).
DEGRADED_SHARE = 0.01
# The clock "held" when it stayed at the pinned table clock (within half the gap to its neighbour, `at_pin`) this
# share of the time.
HELD_SHARE = 0.95
# Where the clock read back comes from (`EnergyReport.clock_source`).
CLOCK_MEASURED = "measured"  # a counter of the clock the GPU actually ran at (Jetson: BPMP's NAFLL counters)
CLOCK_REQUESTED = "requested"  # the clock the driver asked for (Jetson: devfreq cur_freq)
# Where a window's energy comes from (`EnergyReport.energy_source`).
ENERGY_COUNTER = "counter"  # a hardware energy counter's difference (NVML nvmlDeviceGetTotalEnergyConsumption)
ENERGY_SAMPLES = "samples"  # the power samples integrated (Jetson's INA3221 rails; NVML where the counter cannot say)


@dataclasses.dataclass(frozen=True)
class RailPlan:
    """Which rails make each energy figure of one rail set.

    Attributes:
        energy_rails: the rails summed into `energy_j`: CPU + GPU (+ CV and SoC where they have rails of their own);
            the total where none of them is known.
        total_rails: the rails summed into `energy_total_j`: the module input rail alone where there is one, else
            every rail but those another rail of the set feeds (`FED_BY`).
        gpu_rails: the rails of `energy_gpu_j` (empty where CPU and GPU share one rail).
        cpu_rails: the rails of `energy_cpu_j` (empty where CPU and GPU share one rail).
        combined: CPU and GPU are metered on one rail, so `energy_gpu_j` and `energy_cpu_j` are unknown.
    """

    energy_rails: tuple[str, ...]
    total_rails: tuple[str, ...]
    gpu_rails: tuple[str, ...]
    cpu_rails: tuple[str, ...]
    combined: bool


def rail_plan(rails: Iterable[str]) -> RailPlan:
    """The `RailPlan` of a rail set (the rail names a meter reads), in the rails' own order."""
    names = list(dict.fromkeys(rails))
    inputs = [r for r in names if r in INPUT_RAILS]
    total = (inputs[0],) if inputs else tuple(r for r in names if FED_BY.get(r) not in names)
    gpu = tuple(r for r in names if r in GPU_RAILS)
    cpu = tuple(r for r in names if r in CPU_RAILS)
    combined = tuple(r for r in names if r in COMBINED_CPU_GPU_RAILS)
    soc = tuple(r for r in names if r in SOC_RAILS)
    if gpu or cpu:
        return RailPlan(gpu + cpu, total, gpu, cpu, False)
    if combined:
        return RailPlan(combined + soc, total, (), (), True)
    return RailPlan(total, total, (), (), False)


@dataclasses.dataclass
class EnergyReport:
    """Energy of one metered interval (a session or one of its windows). JSON keys are the field names.

    Attributes:
        duration_s: the interval's length.
        energy_j: the rails of `energy_rails`: CPU, GPU, CV and SoC (AGX Orin VDD_GPU_SOC + VDD_CPU_CV, Orin NX/Nano
            VDD_CPU_GPU_CV + VDD_SOC, NVML the GPU), the total where none of them is known.
        energy_total_j: the rails of `total_rails`: the module input rail where there is one (VDD_IN), else every rail
            no other rail feeds.
        energy_by_rail_j: joules per rail name.
        avg_power_w: `energy_total_j / duration_s`.
        peak_power_w: the highest sampled total power.
        gpu_util_pct: the mean GPU load (0..100), None where the backend cannot read it.
        samples: power samples taken (the twin: steps charged).
        simulated: True for the twin's reports.
        clock_mhz_measured: the time-weighted mean of the GPU clock read back, None where it cannot be read.
        clock_held: whether the clock read back stayed at the pinned table clock (within half the gap to the neighbouring
            table clock) >= 95 % of the time; None where nothing was pinned (maxn, observe) or no clock was read.
        samples_failed: samples that could not be read (after one retry) and were skipped.
        power_series_w: total power per sample (left out of `to_dict()` unless asked for).
        energy_expected_j: the twin only: `energy_j` without its run-to-run noise; None on real backends.
        time_expected_s: the twin only: `duration_s` without its run-to-run noise; None on real backends.
        energy_rails: the rails summed into `energy_j` (derived from the rail names where not given).
        total_rails: the rails summed into `energy_total_j` (derived from the rail names where not given).
        cpu_gpu_combined: CPU and GPU share one rail, so `energy_gpu_j` and `energy_cpu_j` are None.
        clock_source: where `clock_mhz_measured` comes from: "measured" (a counter of the clock the GPU ran at),
            "requested" (the clock the driver asked for, e.g. devfreq cur_freq), None (not said, or no clock read).
        emc_mhz: the time-weighted mean memory controller (EMC) clock over the interval, None where it cannot be read.
        oc_throttle_events: over-current/under-voltage throttling events the board counted during the interval (Jetson
            Orin: the soctherm_oc hwmon counters), None where no counter is readable.
        energy_source: where the energy comes from: "counter" (a hardware energy counter's difference), "samples" (the
            power samples integrated), None (not said: the twin, a sum of several).
        cpu_mhz_measured: the time-weighted mean CPU clock read back (the mean of the cpufreq policies read), None
            where no CPU clock was read.
        cpu_held: whether every policy's CPU clock stayed at the clock pinned on it (as `clock_held` judges the GPU's);
            None where the CPU clock was not pinned or not read.
        emc_held: whether the memory clock stayed at the one pinned; None where it was not pinned or not read.
        meter_degraded: (property) more than 1 % of the sample reads failed.
    """

    duration_s: float
    energy_j: float  # the rails of energy_rails (CPU + GPU, as in the study)
    energy_total_j: float  # the rails of total_rails (the module input where there is one)
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
    energy_rails: tuple[str, ...] = ()  # () = derive from energy_by_rail_j's rail names (rail_plan)
    total_rails: tuple[str, ...] = ()
    cpu_gpu_combined: bool = False
    clock_source: str | None = None  # "measured" | "requested" | None
    emc_mhz: float | None = None  # time-weighted mean EMC clock over the interval
    oc_throttle_events: int | None = None  # throttling events the board counted in the interval
    energy_source: str | None = None  # "counter" | "samples" | None
    cpu_mhz_measured: float | None = None
    cpu_held: bool | None = None
    emc_held: bool | None = None

    def __post_init__(self) -> None:
        """Fill `energy_rails`, `total_rails` and `cpu_gpu_combined` from the rail names where not given."""
        if not self.energy_rails and self.energy_by_rail_j:
            plan = rail_plan(self.energy_by_rail_j)
            self.energy_rails, self.total_rails, self.cpu_gpu_combined = plan.energy_rails, plan.total_rails, plan.combined

    @property
    def energy_gpu_j(self) -> float | None:
        """The GPU rails' joules; None where CPU and GPU share one rail (`cpu_gpu_combined`)."""
        if self.cpu_gpu_combined:
            return None
        return sum(v for k, v in self.energy_by_rail_j.items() if k in GPU_RAILS)

    @property
    def energy_cpu_j(self) -> float | None:
        """The CPU rails' joules; None where CPU and GPU share one rail (`cpu_gpu_combined`)."""
        if self.cpu_gpu_combined:
            return None
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
    """The study's energy: the rails `rail_plan` puts into `energy_j` (CPU, GPU, CV and SoC)."""
    return float(sum(by_rail[r] for r in rail_plan(by_rail).energy_rails))


def total_energy(by_rail: Mapping[str, float]) -> float:
    """The board's energy: the rails `rail_plan` puts into `energy_total_j` (the input rail, or no rail twice)."""
    return float(sum(by_rail[r] for r in rail_plan(by_rail).total_rails))


def infer_update_period(read: Callable[[], float | int | None], limit_s: float = 0.5, changes: int = 3,
                        clock: Callable[[], float] = time.monotonic, pause_s: float = 0.001) -> float | None:
    """The update period of a counter that advances in steps, as Zeus infers NVML's (ml-energy/zeus
    zeus/monitor/power.py, _infer_counter_update_period_single): read it repeatedly, note when the value changes, and
    take the shortest time between two changes.

    Zeus reads 1000 times back to back; here the reads are `pause_s` apart and stop after `changes` changes or `limit_s`
    seconds, whichever comes first, so a slow counter costs at most `limit_s` and little CPU.

    Args:
        read: returns the counter's value now.
        limit_s: the longest the reads go on.
        changes: stop after this many changes were seen.
        clock: the time source.
        pause_s: the pause between two reads.

    Returns:
        The shortest interval between two changes; `limit_s` where only one change was seen (the counter is at least
        that slow to be told apart); None where the value never changed (the counter does not advance).
    """
    start = clock()
    prev = read()
    changed_at: list[float] = []
    while len(changed_at) < changes and clock() - start < limit_s:
        time.sleep(pause_s)
        value = read()
        if value != prev:
            changed_at.append(clock())
            prev = value
    if not changed_at:
        return None
    if len(changed_at) == 1:
        return limit_s
    return min(b - a for a, b in itertools.pairwise(changed_at))


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


def at_pin(clock_mhz: float, pinned_mhz: float, table_mhz: Sequence[float]) -> bool:
    """Whether a clock read back is the pinned table clock: within half the gap to the neighbouring table clock on its
    side (the top and bottom clocks use their one gap on both sides), so a clock one table step away never is.

    A measured clock (a counter) reads a little off the table's values; half the gap takes it to the nearest table
    clock. 0.5 MHz is the floor: the table's own rounding (1300.5 MHz) where the table has one clock or none.
    """
    return _within(clock_mhz, pinned_mhz, _pin_gaps(pinned_mhz, table_mhz))


def _pin_gaps(pinned_mhz: float, table_mhz: Sequence[float]) -> tuple[float | None, float | None]:
    """The gaps from the pinned clock to its table neighbours below and above (None where it has none)."""
    table = sorted(set(table_mhz))
    below = [f for f in table if f < pinned_mhz - 1e-9]
    above = [f for f in table if f > pinned_mhz + 1e-9]
    return (pinned_mhz - below[-1] if below else None), (above[0] - pinned_mhz if above else None)


def _within(clock_mhz: float, pinned_mhz: float, gaps: tuple[float | None, float | None]) -> bool:
    """`at_pin` with the pin's table gaps already found."""
    gap_below, gap_above = gaps
    gap = gap_below if clock_mhz < pinned_mhz else gap_above
    gap = gap if gap is not None else (gap_above if gap_below is None else gap_below)
    return abs(clock_mhz - pinned_mhz) <= max(0.5, gap / 2.0 if gap is not None else 0.0)


def clock_held(times_s: Sequence[float], clocks_mhz: Sequence[float | None], pinned_mhz: float,
               table_mhz: Sequence[float]) -> bool | None:
    """True when the clock read back stayed at the pinned table clock (`at_pin`) >= 95 % of the time."""
    pairs = [(t, c) for t, c in zip(times_s, clocks_mhz) if c is not None]
    if not pairs:
        return None
    gaps = _pin_gaps(pinned_mhz, table_mhz)  # one table, one pin: found once, not per sample
    ok = [_within(c, pinned_mhz, gaps) for _, c in pairs]
    if len(pairs) == 1:
        return ok[0]
    spans = [t1 - t0 for (t0, _), (t1, _) in itertools.pairwise(pairs)]
    total = sum(spans)
    if total <= 0:
        return sum(ok) / len(ok) >= HELD_SHARE
    return sum(s for s, good in zip(spans, ok) if good) / total >= HELD_SHARE


@dataclasses.dataclass(frozen=True)
class KnobPins:
    """The CPU and memory clocks a session pinned, each with its table, so a report judges whether each held.

    Attributes:
        cpu: per cpufreq policy read (in `read_cpu`'s order), the clock pinned on it and its table; () where the CPU
            clock was not pinned.
        emc: the memory clock pinned and its table; None where it was not pinned.
    """

    cpu: tuple[tuple[float, tuple[float, ...]], ...] = ()
    emc: tuple[float, tuple[float, ...]] | None = None


@dataclasses.dataclass(frozen=True)
class KnobReadings:
    """The memory and CPU clocks read at each sample (empty: not read) and the pins they are judged against.

    Attributes:
        emc_mhz: the memory clock at each sample.
        cpu_mhz: each sample's per-policy CPU clocks.
        pins: the CPU and memory clocks pinned (None: not judged).
    """

    emc_mhz: Sequence[float | None] = ()
    cpu_mhz: Sequence[Sequence[float | None] | None] = ()
    pins: KnobPins | None = None


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
    clock_source: str | None = None,
    readings: KnobReadings = KnobReadings(),
) -> EnergyReport:
    """Assemble an `EnergyReport` from samples (energy_override_j: a hardware energy counter, `energy_source` "counter";
    without it the samples integrated, "samples").

    With `pinned_mhz` (and the frequency table) `clock_held` is judged sample by sample, and so are the CPU and memory
    clocks pinned (`readings.pins`). The total power of a sample (peak, series) is the sum of the plan's total rails,
    like `energy_total_j`.
    """
    emc_mhz, cpu_mhz, knobs = readings.emc_mhz, readings.cpu_mhz, readings.pins
    duration = (times_s[-1] - times_s[0]) if len(times_s) >= 2 else 0.0
    by_rail = dict(energy_override_j) if energy_override_j is not None else integrate(times_s, watts, rails)
    plan = rail_plan(rails if rails else by_rail)
    at = [i for i, r in enumerate(rails) if r in plan.total_rails]
    totals = [float(sum(w[i] for i in at)) for w in watts]
    total_j = float(sum(by_rail.get(r, 0.0) for r in plan.total_rails))
    util_values = [u for u in utils if u is not None]
    clocks_known = bool(clocks_mhz) and any(c is not None for c in clocks_mhz)
    return EnergyReport(
        duration_s=duration,
        energy_j=float(sum(by_rail.get(r, 0.0) for r in plan.energy_rails)),
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
        energy_rails=plan.energy_rails,
        total_rails=plan.total_rails,
        cpu_gpu_combined=plan.combined,
        clock_source=clock_source if clocks_known else None,
        emc_mhz=time_weighted_mean(times_s, emc_mhz) if emc_mhz else None,
        energy_source=ENERGY_COUNTER if energy_override_j is not None else ENERGY_SAMPLES,
        cpu_mhz_measured=time_weighted_mean(times_s, [_mean_clock(c) for c in cpu_mhz]) if cpu_mhz else None,
        cpu_held=_cpu_held(times_s, cpu_mhz, knobs.cpu) if knobs is not None and knobs.cpu and cpu_mhz else None,
        emc_held=(clock_held(times_s, emc_mhz, knobs.emc[0], knobs.emc[1])
                  if knobs is not None and knobs.emc is not None and emc_mhz else None),
    )


def _mean_clock(clocks: Sequence[float | None] | None) -> float | None:
    """The mean of one sample's per-policy CPU clocks (None where none was read)."""
    values = [c for c in clocks or () if c is not None]
    return sum(values) / len(values) if values else None


def _cpu_held(times_s: Sequence[float], cpu_mhz: Sequence[Sequence[float | None] | None],
              pins: tuple[tuple[float, tuple[float, ...]], ...]) -> bool | None:
    """Every policy's clock held at the clock pinned on it (`clock_held`); None where no policy's clock was read."""
    verdicts = []
    for i, (pinned, table) in enumerate(pins):
        series = [c[i] if c is not None and i < len(c) else None for c in cpu_mhz]
        verdicts.append(clock_held(times_s, series, pinned, table))
    known = [v for v in verdicts if v is not None]
    return all(known) if known else None


@dataclasses.dataclass
class _Sample:
    t: float
    watts: Sequence[float]
    util: float | None
    clock_mhz: float | None
    emc_mhz: float | None = None
    cpu_mhz: Sequence[float | None] | None = None


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
        read_clock: returns the GPU clock, in MHz (None: not read).
        retry_delay_s: the pause before the one retry of a failed read.
        clock_source: what `read_clock` reads: "measured" or "requested" (`EnergyReport.clock_source`); None: not said.
        read_emc: returns the memory controller (EMC) clock in MHz (None: not read); its window mean is `emc_mhz`.
        read_cpu: returns each cpufreq policy's clock in MHz (None: not read); its window mean is `cpu_mhz_measured`.
        knobs: the CPU and memory clocks pinned, judged in each report (None: not judged).

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
        clock_source: str | None = None,
        read_emc: Callable[[], float | None] | None = None,
        read_cpu: Callable[[], Sequence[float | None]] | None = None,
        knobs: KnobPins | None = None,
    ):
        if hz <= 0:
            raise ValueError("sample rate must be positive")
        self._read_rails = read_rails
        self.rails = list(rails)
        self._read_util = read_util
        self._read_clock = read_clock
        self.clock_source = clock_source
        self._read_emc = read_emc
        self._read_cpu = read_cpu
        self.knobs = knobs
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
        emc_mhz = self._read_emc() if self._read_emc is not None else None
        cpu_mhz = self._read_cpu() if self._read_cpu is not None else None
        return _Sample(self._clock(), watts, util, clock_mhz, emc_mhz, cpu_mhz)

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

    def read_cpu_from(self, read_cpu: Callable[[], Sequence[float | None]]) -> None:
        """Read each policy's CPU clock from the next sample on (a session that pins the CPU clock only from a repin)."""
        with self._lock:
            self._read_cpu = read_cpu

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
            table_mhz: the clock table: half the gap from the pin to its neighbour is the tolerance of that judgement.

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
                            pinned_mhz=pinned_mhz, table_mhz=table_mhz, clock_source=self.clock_source,
                            readings=KnobReadings([s.emc_mhz for s in window] if self._read_emc is not None else (),
                                                  [s.cpu_mhz for s in window] if self._read_cpu is not None else (),
                                                  self.knobs))

    def span_s(self, start: int, end: int) -> float:
        """Seconds between samples `start` and `end` (two `mark()`s)."""
        return self._samples[end].t - self._samples[start].t if 0 <= start <= end < len(self._samples) else 0.0
