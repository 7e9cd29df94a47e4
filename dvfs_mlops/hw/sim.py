"""The `sim` backend: a digital twin of a Jetson Orin module (the AGX Orin 64 GB by default; see twin/profiles.py).

Fine-tuning runs for real on the CPU; every training step is charged the time and energy the
Orin would spend on it at the session's configuration (`step(trace)`): the GPU clock, and the CPU and
memory (EMC) clocks where the session names them (`cpu_mhz`, `emc_mhz`; left out, they stay at their
tables' tops, as a board left alone runs them). Nothing on the host is changed, so no lock or journal
is needed. Every report is marked `simulated`.

The twin's power terms (twin/physics.py: the GPU/SoC rail, the CPU rail, the board's 5 V and the DRAM) are reported on
the rails of the module the profile describes (`twin.profiles.rail_names`, `board_watts`), so `energy_j` and
`energy_total_j` follow the same rail plan as a real board's (hw/meter.py). A session that names a CPU or EMC clock
also reports the joint energy (physics.py `joint_energy`: the rails those clocks feed, DRAM included) in its
`context`, the one energy GPU-only and joint configurations are compared on; `expected` gives the same figures
without noise for any configuration (the twin's expected oracle).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dvfs_mlops.errors import DvfsError, UnknownNameError
from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    FreqSession,
    freq_label,
    parse_freq,
)
from dvfs_mlops.hw.meter import EnergyReport, cpu_gpu_energy, total_energy
from dvfs_mlops.hw.replay import Setting
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import (
    JointEnergy,
    MaxnEstimate,
    StepEstimate,
    energy_curve,
    estimate_maxn,
    joint_energy,
    rail_power,
)
from dvfs_mlops.hw.twin.profiles import AGX_ORIN_RAILS, rail_names
from dvfs_mlops.hw.twin.trace import StepTrace

# How far a CPU or EMC clock may be from a table entry and still name it (the GPU's: `device.parse_freq`).
CLOCK_TOLERANCE_MHZ = 0.5
# The context keys of a session that names a CPU or EMC clock (`SimSession.context`).
CONTEXT_CPU_MHZ = "cpu_mhz"
CONTEXT_EMC_MHZ = "emc_mhz"
CONTEXT_ENERGY_JOINT = "energy_joint_j"
CONTEXT_ENERGY_JOINT_EXPECTED = "energy_joint_expected_j"
CONTEXT_JOINT_RAILS = "energy_joint_rails"


def board_watts(physics_w: dict[str, float], params: OrinTwinParams) -> dict[str, float]:
    """The twin's power terms (twin/physics.py's VDD_GPU_SOC: GPU and SoC, VDD_CPU_CV, VIN_SYS_5V0: the board's 5 V
    loads, VDDQ_VDD2_1V8AO: the DRAM) as the rails the module reports (`rail_names`).

    AGX Orin: VIN_SYS_5V0 feeds VDDQ_VDD2_1V8AO (energymon/energymon jetson/JetsonPowerRails.md, "AGX Orin Series"), so
    its reading holds the DRAM's draw; the DRAM rail is also read on its own. Orin NX / Nano: VDD_IN, the module's input,
    feeds every other; VDD_SOC is the clock-independent part of the twin's GPU/SoC term (`gpu_static_w`, described in
    twin/profiles.py as the SoC fabric and memory controllers: ASSUMED, no public per-rail split of the NX/Nano was
    found), and VDD_CPU_GPU_CV the rest of that term with the CPU's.
    """
    gpu_soc, cpu = physics_w["VDD_GPU_SOC"], physics_w["VDD_CPU_CV"]
    sys_5v0, dram = physics_w["VIN_SYS_5V0"], physics_w["VDDQ_VDD2_1V8AO"]
    if rail_names(params) == AGX_ORIN_RAILS:
        return {"VDD_GPU_SOC": gpu_soc, "VDD_CPU_CV": cpu, "VIN_SYS_5V0": sys_5v0 + dram, "VDDQ_VDD2_1V8AO": dram}
    soc = min(gpu_soc, params.gpu_static_w)
    return {"VDD_IN": gpu_soc + cpu + sys_5v0 + dram, "VDD_CPU_GPU_CV": gpu_soc - soc + cpu, "VDD_SOC": soc}


@dataclasses.dataclass(frozen=True)
class TwinConfig:
    """A configuration checked against one twin's tables (`SimDevice.configuration`).

    Attributes:
        freq: the GPU request: a clock of the GPU table, or "maxn" (the load-tracking governor).
        cpu_mhz: the CPU clock of the CPU table, None where the configuration leaves it (at the table's top).
        emc_mhz: the memory (EMC) clock of the EMC table, None where the configuration leaves it (at the table's top).
    """

    freq: FreqRequest
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    @property
    def knobs_given(self) -> bool:
        """Whether the configuration names a CPU or an EMC clock (even at its table's top)."""
        return self.cpu_mhz is not None or self.emc_mhz is not None

    def physics_key(self, params: OrinTwinParams) -> tuple[float | None, float | None]:
        """The CPU and EMC clocks as the physics sees them: None for a clock at its table's top (the same figures as one
        left out, twin/physics.py), so both share a curve and a noise draw."""
        cpu = None if self.cpu_mhz is None or self.cpu_mhz == params.cpu_max_mhz else self.cpu_mhz
        emc = None if self.emc_mhz is None or self.emc_mhz == params.emc_max_mhz else self.emc_mhz
        return cpu, emc

    def noise_key(self, params: OrinTwinParams) -> str:
        """What seeds a draw besides the seed and the label: the GPU request, and the CPU and EMC clocks below their
        tops (a GPU clock alone, or with the tops, draws exactly what the GPU-only twin drew)."""
        cpu, emc = self.physics_key(params)
        extra = (f"|cpu {cpu:g}" if cpu is not None else "") + (f"|emc {emc:g}" if emc is not None else "")
        return freq_label(self.freq) + extra


@dataclasses.dataclass(frozen=True)
class JointReading:
    """The joint energy of a session's window: the rails a GPU-only and a joint configuration are compared on.

    Attributes:
        energy_joint_j: the joules of `rails` in the window (SIMULATED, with the draw's noise, like `energy_j`).
        energy_joint_expected_j: the same without the noise.
        rails: the rails summed (physics.py `joint_energy`: AGX Orin GPU/SoC + CPU + DRAM, Orin NX/Nano the module input).
    """

    energy_joint_j: float
    energy_joint_expected_j: float
    rails: tuple[str, ...]

    def context(self) -> dict[str, Any]:
        """The reading as `FreqSession.context` entries (the rails as one comma-separated text, like `energy_rails`)."""
        return {CONTEXT_ENERGY_JOINT: self.energy_joint_j, CONTEXT_ENERGY_JOINT_EXPECTED: self.energy_joint_expected_j,
                CONTEXT_JOINT_RAILS: ",".join(self.rails)}


@dataclasses.dataclass(frozen=True)
class TwinExpectation:
    """The twin's noise-free figures of `steps` steps of one trace at one configuration: what a session's draw is a
    noisy sample of (`SimDevice.expected`), on the module's own rails.

    Attributes:
        config: the configuration.
        cpu_mhz: the CPU clock it runs at (the table's top where the configuration leaves it).
        emc_mhz: the EMC clock it runs at (the table's top where the configuration leaves it).
        settled_mhz: the GPU clock it runs at (maxn: the clock the load-tracking governor settles at).
        steps: how many steps the figures hold.
        time_expected_s: the steps' time.
        energy_expected_j: the study's energy (CPU + GPU rails: `EnergyReport.energy_expected_j`).
        energy_total_expected_j: the board's energy (`EnergyReport.energy_total_j`'s rails).
        energy_joint_expected_j: the joint energy (`joint_rails`).
        joint_rails: the rails of the joint energy.
        energy_by_rail_j: joules per rail of the module.
        gpu_util: the GPU's load (0..1).
    """

    config: TwinConfig
    cpu_mhz: float
    emc_mhz: float
    settled_mhz: float
    steps: int
    time_expected_s: float
    energy_expected_j: float
    energy_total_expected_j: float
    energy_joint_expected_j: float
    joint_rails: tuple[str, ...]
    energy_by_rail_j: dict[str, float]
    gpu_util: float

    @property
    def setting(self) -> Setting:
        """The clocks it runs at as one record (maxn: the GPU clock it settles at)."""
        return Setting(self.settled_mhz, self.cpu_mhz, self.emc_mhz)


class SimDevice:
    """The twin as a `Device` (module doc): the profile's GPU, CPU and EMC tables; sessions at a configuration.

    Args:
        params: the board's constants (default: sim-orin's).
        seed: seeds every session's run-to-run noise (with its label and configuration).

    Attributes:
        params: the twin's constants.
        profile: the profile's name.
        device_id: `sim@<host>`.
    """

    name = "sim"
    simulated = True
    torch_device = "cpu"  # fine-tuning runs for real on the host CPU; the twin charges Orin time/energy

    def __init__(self, params: OrinTwinParams | None = None, seed: int = 0):
        self.params = params or OrinTwinParams()
        self.profile = self.params.profile
        self.seed = seed
        self.device_id = f"sim@{socket.gethostname()}"
        self._curves: dict[tuple[str, float | None, float | None], tuple[dict[float, StepEstimate], MaxnEstimate]] = {}

    @property
    def frequencies_mhz(self) -> list[float]:
        return sorted(self.params.frequencies_mhz)

    @property
    def cpu_frequencies_mhz(self) -> tuple[float, ...]:
        """The CPU clocks a session may name (the profile's cpufreq table), ascending."""
        return tuple(sorted(self.params.cpu_frequencies_mhz))

    @property
    def emc_frequencies_mhz(self) -> tuple[float, ...]:
        """The memory (EMC) clocks a session may name (the profile's EMC table), ascending."""
        return tuple(sorted(self.params.emc_frequencies_mhz))

    @property
    def joint_energy(self) -> JointEnergy:
        """Which rails of this twin's module the joint energy sums (physics.py `joint_energy`)."""
        return joint_energy(rail_names(self.params))

    def curve(self, trace: StepTrace, cpu_mhz: float | None = None,
              emc_mhz: float | None = None) -> tuple[dict[float, StepEstimate], MaxnEstimate]:
        """Noise-free per-step estimates at every GPU clock and under maxn, with the CPU and EMC at `cpu_mhz` and
        `emc_mhz` (None: their tops), memoised per (trace, CPU clock, EMC clock). The clocks are not checked against the
        tables here (`configuration` does that)."""
        cpu = None if cpu_mhz is None or cpu_mhz == self.params.cpu_max_mhz else float(cpu_mhz)
        emc = None if emc_mhz is None or emc_mhz == self.params.emc_max_mhz else float(emc_mhz)
        key = (trace.key, cpu, emc)
        if key not in self._curves:
            curve = energy_curve(trace, self.params, cpu, emc)
            self._curves[key] = (curve, estimate_maxn(trace, self.params, curve))
        return self._curves[key]

    def configuration(self, freq: FreqRequest | Setting, cpu_mhz: float | None = None,
                      emc_mhz: float | None = None) -> TwinConfig:
        """A configuration of this twin's tables.

        Args:
            freq: a GPU clock (MHz or its text), "maxn", or a `Setting` (its GPU, CPU and EMC clocks; then `cpu_mhz` and
                `emc_mhz` must be None).
            cpu_mhz: a clock of `cpu_frequencies_mhz` (within 0.5 MHz), None: leave the CPU at its top.
            emc_mhz: a clock of `emc_frequencies_mhz` (within 0.5 MHz), None: leave the memory clock at its top.

        Returns:
            The `TwinConfig`, every clock as its table writes it.

        Raises:
            UnknownNameError: a clock not in its table (the message names the table and lists it).
            DvfsError: a `Setting` together with `cpu_mhz` or `emc_mhz`.
        """
        if isinstance(freq, Setting):
            if cpu_mhz is not None or emc_mhz is not None:
                raise DvfsError(f"{freq.label()} already names its CPU and EMC clocks; give them once (a Setting, or a GPU "
                                "clock with cpu_mhz/emc_mhz)")
            cpu_mhz, emc_mhz, freq = freq.cpu_mhz, freq.emc_mhz, freq.gpu_mhz
        return TwinConfig(parse_freq(freq, self.frequencies_mhz), self._table_clock("CPU", cpu_mhz, self.cpu_frequencies_mhz),
                          self._table_clock("EMC", emc_mhz, self.emc_frequencies_mhz))

    def _table_clock(self, domain: str, value: str | float | None, table: Sequence[float]) -> float | None:
        if value is None:
            return None
        try:
            mhz = float(value)
        except (TypeError, ValueError):
            mhz = math.nan
        for clock in table:
            if math.isclose(clock, mhz, abs_tol=CLOCK_TOLERANCE_MHZ):
                return float(clock)
        raise UnknownNameError(f"{domain} clock {value!r} MHz is not in the {self.profile} twin's {domain} table; its {domain} "
                               f"clocks (MHz): {', '.join(f'{f:g}' for f in table)}")

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "", *, cpu_mhz: float | None = None,
                emc_mhz: float | None = None) -> SimSession:
        """A session at a configuration: the GPU at `freq` (a clock, or "maxn": the load-tracking governor), the CPU and
        memory clocks at `cpu_mhz` and `emc_mhz`.

        Args:
            freq: a clock of `frequencies_mhz` in MHz, or "maxn".
            observe: the twin runs as found, i.e. under its default governor (maxn) with every clock at its top.
            label: names the measurement (a sweep point, a probe): with the seed and the configuration it seeds this
                run's noise.
            cpu_mhz: a clock of `cpu_frequencies_mhz`; None leaves the CPU at its top (every figure then is the GPU-only
                twin's).
            emc_mhz: a clock of `emc_frequencies_mhz`; None leaves the memory clock at its top.

        Returns:
            The `SimSession`, not yet entered.

        Raises:
            UnknownNameError: a clock not in its table (one line naming the table).
            DvfsError: `observe` with a CPU or EMC clock (an observing session sets no clock).
        """
        config = self.configuration(freq, cpu_mhz, emc_mhz)
        if observe and config.knobs_given:
            raise DvfsError("an observing session sets no clock, so it cannot run the CPU or memory clock at a setting; "
                            "drop observe, or the CPU and EMC clocks")
        return SimSession(self, config, label, observe=observe)

    def expected(self, trace: StepTrace, freq: FreqRequest | Setting = MAXN, *, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None, steps: int = 1) -> TwinExpectation:
        """The twin's noise-free figures of `steps` steps of `trace` at a configuration: what a session there measures
        without its run-to-run noise (its report's `energy_expected_j`, `time_expected_s` and its context's
        `energy_joint_expected_j`), the oracle GPU-only and joint policies are judged against.

        Args:
            trace: the step's trace.
            freq: a GPU clock, "maxn", or a `Setting` (see `configuration`).
            cpu_mhz: a clock of the CPU table; None: its top.
            emc_mhz: a clock of the EMC table; None: its top.
            steps: how many steps of the trace.

        Returns:
            The `TwinExpectation`.

        Raises:
            UnknownNameError: a clock not in its table.
            DvfsError: a `Setting` together with `cpu_mhz` or `emc_mhz`.
        """
        config = self.configuration(freq, cpu_mhz, emc_mhz)
        step = _Step.of(self, config, trace)
        rails = board_watts(step.power_by_rail_w, self.params)
        joules = {r: w * step.time_s * steps for r, w in rails.items()}
        rule = self.joint_energy
        return TwinExpectation(config, config.cpu_mhz or self.params.cpu_max_mhz, config.emc_mhz or self.params.emc_max_mhz,
                               step.settled_mhz, steps, step.time_s * steps, cpu_gpu_energy(joules), total_energy(joules),
                               float(rule.total(joules)), rule.rails, joules, step.gpu_util)

    def close(self) -> None:
        """Nothing to release."""

    def info(self) -> DeviceInfo:
        return DeviceInfo(
            "sim", self.profile, self.frequencies_mhz, None, "nvhost_podgov (simulated maxn)", list(rail_names(self.params)), True,
            {"note": f"simulated {self.params.family} twin; no hardware is touched"},
        )


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step at one configuration, noise-free: its time, load, the GPU clock it runs at and its physics watts."""

    time_s: float
    gpu_util: float
    settled_mhz: float
    power_by_rail_w: dict[str, float]

    @classmethod
    def of(cls, device: SimDevice, config: TwinConfig, trace: StepTrace) -> _Step:
        curve, maxn = device.curve(trace, *config.physics_key(device.params))
        if config.freq == MAXN:
            return cls(maxn.time_s, maxn.gpu_util, maxn.settled_mhz, maxn.power_by_rail_w)
        est = curve[float(config.freq)]
        return cls(est.time_s, est.gpu_util, float(config.freq), est.power_by_rail_w)


class SimSession(FreqSession):
    """One session on the twin (`SimDevice.session`): nothing written, the steps charged at the configuration.

    Attributes:
        cpu_mhz: the CPU clock the session was given (a clock of the CPU table), None where it leaves the CPU at its top.
        emc_mhz: the memory clock the session was given (a clock of the EMC table), None where it leaves it at its top.
        time_factor: this draw's time noise (1 + noise).
        power_factor: this draw's power noise (1 + noise).
        effective_mhz: the GPU clock the last step ran at (maxn: the settled clock).
        context: where the session names a CPU or EMC clock: `cpu_mhz` and `emc_mhz` (the clocks it runs at, the tops
            for one left out), and once the session has ended the joint energy of its "train" window (else of the
            session): `energy_joint_j`, `energy_joint_expected_j`, `energy_joint_rails` (`JointReading`). Empty
            otherwise, as on the GPU-only twin.
    """

    device: SimDevice

    def __init__(self, device: SimDevice, config: TwinConfig, label: str = "", observe: bool = False):
        super().__init__(device, MAXN if observe else config.freq, observe=observe)
        self.cpu_mhz = config.cpu_mhz
        self.emc_mhz = config.emc_mhz
        self._label = label
        self._draw_noise(config.freq)  # an observing session draws the noise of the clock it was asked for
        self._time_s = 0.0
        self._busy_s = 0.0
        self._joules = {r: 0.0 for r in rail_names(device.params)}
        # The same totals without the noise: what this draw is a noisy sample of.
        self._time_expected_s = 0.0
        self._joules_expected = {r: 0.0 for r in rail_names(device.params)}
        self._series: list[float] = []
        self._wall0 = 0.0
        self._steps: dict[str, tuple[_Step, dict[str, float]]] = {}  # per trace: the step and its rails' watts, until a repin
        self.effective_mhz: float | None = None
        self._say_configuration()

    @property
    def config(self) -> TwinConfig:
        """The configuration the next step runs at: the session's GPU request (maxn when observing; `repin` moves it)
        and its CPU and EMC clocks."""
        return TwinConfig(self.freq, self.cpu_mhz, self.emc_mhz)

    def _say_configuration(self) -> None:
        """Put the CPU and EMC clocks the session runs at in `context`, where it names either."""
        config, p = self.config, self.device.params
        if config.knobs_given:
            self.context.update({CONTEXT_CPU_MHZ: config.cpu_mhz or p.cpu_max_mhz, CONTEXT_EMC_MHZ: config.emc_mhz or p.emc_max_mhz})

    def _draw_noise(self, freq: FreqRequest) -> None:
        """This session's run-to-run noise at `freq` with its CPU and EMC clocks (seeded: same seed, label and
        configuration, same draw; a configuration at the CPU and EMC tops draws what the GPU clock alone draws)."""
        key = dataclasses.replace(self.config, freq=freq).noise_key(self.device.params)
        digest = hashlib.sha256(f"{self.device.seed}|{key}|{self._label}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        p = self.device.params
        self.time_factor = float(1.0 + p.noise_time * rng.standard_normal())
        self.power_factor = float(1.0 + p.noise_power * rng.standard_normal())

    def _apply(self) -> None:
        """Nothing on the host is changed."""

    def _repin(self, mhz: float) -> None:
        """A new GPU clock for the next steps (the session's CPU and EMC clocks kept), with its own noise draw (a probe is
        a measurement of its own)."""
        self._draw_noise(mhz)
        self._steps.clear()

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        """New CPU and memory clocks for the next steps (None: that one stays as it is), with the noise draw of the new
        configuration (the `FreqSession.repin` hook for the CPU and EMC knobs).

        Raises:
            UnknownNameError: a clock not in its table (nothing moved).
        """
        config = self.device.configuration(self.freq, cpu_mhz if cpu_mhz is not None else self.cpu_mhz,
                                           emc_mhz if emc_mhz is not None else self.emc_mhz)
        self.cpu_mhz, self.emc_mhz = config.cpu_mhz, config.emc_mhz
        self._draw_noise(self.freq)
        self._steps.clear()
        self._say_configuration()

    def _restore(self) -> None:
        """Nothing on the host was changed."""

    def _start_meter(self) -> None:
        self._wall0 = time.monotonic()

    def _mark(self) -> _Counters:
        return _Counters(self._time_s, self._busy_s, dict(self._joules), len(self._series), self._time_expected_s,
                         dict(self._joules_expected))

    def _window_report(self, start: _Counters, end: _Counters) -> EnergyReport:
        joules = _between(start.joules, end.joules)
        expected = _between(start.joules_expected, end.joules_expected)
        return self._build(end.time_s - start.time_s, end.busy_s - start.busy_s, joules, self._series[start.steps:end.steps],
                           end.time_expected_s - start.time_expected_s, expected)

    def step(self, profile: StepTrace | None = None) -> None:
        """Charge one training step of `profile` (a StepTrace) at this session's configuration."""
        if profile is None:
            return
        known = self._steps.get(profile.key)
        if known is None:
            est = _Step.of(self.device, self.config, profile)
            known = self._steps[profile.key] = (est, board_watts(est.power_by_rail_w, self.device.params))
        est, rails = known
        t, util = est.time_s, est.gpu_util
        self.effective_mhz = est.settled_mhz
        self._time_expected_s += t
        for r, w in rails.items():
            self._joules_expected[r] += w * t
        t *= self.time_factor
        self._time_s += t
        self._busy_s += util * t
        for r, w in rails.items():
            self._joules[r] += w * self.power_factor * t
        self._series.append(total_energy(rails) * self.power_factor)

    def joint(self, window: str | None = None) -> JointReading:
        """The joint energy (the rails GPU-only and joint configurations are compared on) of a window.

        Args:
            window: a window that has ended; None: the "train" window where one ended, else the session so far.

        Returns:
            The `JointReading`.

        Raises:
            KeyError: `window` has not ended in this session.
        """
        rule = self.device.joint_energy
        marks = {name: (a, b) for name, a, b in self._window_marks}
        if window is None:
            window = "train" if "train" in marks else None
        if window is None:
            now = self._mark()
            joules, expected = now.joules, now.joules_expected
        elif window in marks:
            a, b = marks[window]
            joules, expected = _between(a.joules, b.joules), _between(a.joules_expected, b.joules_expected)
        else:
            raise KeyError(f"window {window!r} has not ended in this session")
        return JointReading(float(rule.total(joules)), float(rule.total(expected)), rule.rails)

    def _charge_wall_time(self) -> None:
        """A run with no step trace (an external command): its wall time at an assumed load."""
        p = self.device.params
        wall = time.monotonic() - self._wall0
        f = p.max_mhz if self.freq == MAXN else float(self.freq)
        cpu, emc = self.config.physics_key(p)
        rails = board_watts(rail_power(f if cpu is None and emc is None else Setting(f, cpu, emc), p.external_gpu_util, 1.0, 0.0, p), p)
        self._time_s, self._busy_s = wall, p.external_gpu_util * wall
        self._joules = {r: w * self.power_factor * wall for r, w in rails.items()}
        self._time_expected_s, self._joules_expected = wall, {r: w * wall for r, w in rails.items()}
        self._series = [total_energy(rails) * self.power_factor]
        self.effective_mhz = f

    def _build(self, time_s: float | None = None, busy_s: float | None = None, joules: dict[str, float] | None = None,
               series: list[float] | None = None, time_expected_s: float | None = None,
               joules_expected: dict[str, float] | None = None) -> EnergyReport:
        time_s = self._time_s if time_s is None else time_s
        time_expected_s = self._time_expected_s if time_expected_s is None else time_expected_s
        joules_expected = dict(self._joules_expected) if joules_expected is None else joules_expected
        busy_s = self._busy_s if busy_s is None else busy_s
        joules = dict(self._joules) if joules is None else joules
        series = list(self._series) if series is None else series
        total = total_energy(joules)
        return EnergyReport(
            duration_s=time_s,
            energy_j=cpu_gpu_energy(joules),
            energy_total_j=total,
            energy_by_rail_j=joules,
            avg_power_w=total / time_s if time_s > 0 else 0.0,
            peak_power_w=max(series) if series else 0.0,
            gpu_util_pct=100.0 * busy_s / time_s if time_s > 0 else None,
            samples=len(series),
            simulated=True,
            clock_mhz_measured=self.effective_mhz if series else None,
            power_series_w=series,
            energy_expected_j=cpu_gpu_energy(joules_expected),
            time_expected_s=time_expected_s,
            emc_mhz=(self.emc_mhz or self.device.params.emc_max_mhz) if self.config.knobs_given and series else None,
        )

    def _stop_meter(self) -> EnergyReport:
        if not self._series:
            self._charge_wall_time()
        if self.config.knobs_given:
            self._say_configuration()
            self.context.update(self.joint().context())
        return self._build()

    def _snapshot(self) -> EnergyReport:
        return self._build()


def _between(start: Mapping[str, float], end: Mapping[str, float]) -> dict[str, float]:
    return {r: end[r] - start.get(r, 0.0) for r in end}


@dataclasses.dataclass(frozen=True)
class _Counters:
    """The twin's running totals at a window boundary."""

    time_s: float
    busy_s: float
    joules: dict[str, float]
    steps: int
    time_expected_s: float
    joules_expected: dict[str, float]
