"""The `sim` backend: a digital twin of a Jetson Orin module (the AGX Orin 64 GB by default; see twin/profiles.py).

Fine-tuning runs for real on the CPU; every training step is charged the time and energy the
Orin would spend on it at the session's clock (`step(trace)`). Nothing on the host is changed, so
no lock or journal is needed. Every report is marked `simulated`.

The twin's power terms (twin/physics.py: the GPU/SoC rail, the CPU rail, the board's 5 V and the DRAM) are reported on
the rails of the module the profile describes (`twin.profiles.rail_names`, `board_watts`), so `energy_j` and
`energy_total_j` follow the same rail plan as a real board's (hw/meter.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import socket
import time
from typing import Any

import numpy as np

from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    FreqSession,
    freq_label,
    parse_freq,
)
from dvfs_mlops.hw.meter import EnergyReport, cpu_gpu_energy, total_energy
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import (
    MaxnEstimate,
    StepEstimate,
    energy_curve,
    estimate_maxn,
    rail_power,
)
from dvfs_mlops.hw.twin.profiles import AGX_ORIN_RAILS, rail_names
from dvfs_mlops.hw.twin.trace import StepTrace


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


class SimDevice:
    name = "sim"
    simulated = True
    torch_device = "cpu"  # fine-tuning runs for real on the host CPU; the twin charges Orin time/energy

    def __init__(self, params: OrinTwinParams | None = None, seed: int = 0):
        self.params = params or OrinTwinParams()
        self.profile = self.params.profile
        self.seed = seed
        self.device_id = f"sim@{socket.gethostname()}"
        self._curves: dict[str, tuple[dict[float, StepEstimate], MaxnEstimate]] = {}

    @property
    def frequencies_mhz(self) -> list[float]:
        return sorted(self.params.frequencies_mhz)

    def curve(self, trace: StepTrace) -> tuple[dict[float, StepEstimate], MaxnEstimate]:
        """Noise-free per-step estimates at every clock and under maxn (memoised per trace)."""
        if trace.key not in self._curves:
            curve = energy_curve(trace, self.params)
            self._curves[trace.key] = (curve, estimate_maxn(trace, self.params, curve))
        return self._curves[trace.key]

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "") -> SimSession:
        """A session at `freq`. `observe=True`: the twin runs as found, i.e. under its default governor (maxn).
        `label` names the measurement (a sweep point, a probe): with the seed and the clock it seeds this run's noise."""
        return SimSession(self, parse_freq(freq, self.frequencies_mhz), label, observe=observe)

    def close(self) -> None:
        """Nothing to release."""

    def info(self) -> DeviceInfo:
        return DeviceInfo(
            "sim", self.profile, self.frequencies_mhz, None, "nvhost_podgov (simulated maxn)", list(rail_names(self.params)), True,
            {"note": f"simulated {self.params.family} twin; no hardware is touched"},
        )


class SimSession(FreqSession):
    device: SimDevice

    def __init__(self, device: SimDevice, freq: FreqRequest, label: str = "", observe: bool = False):
        super().__init__(device, MAXN if observe else freq, observe=observe)
        self._label = label
        self._draw_noise(freq)
        self._time_s = 0.0
        self._busy_s = 0.0
        self._joules = {r: 0.0 for r in rail_names(device.params)}
        # The same totals without the noise: what this draw is a noisy sample of.
        self._time_expected_s = 0.0
        self._joules_expected = {r: 0.0 for r in rail_names(device.params)}
        self._series: list[float] = []
        self._wall0 = 0.0
        self.effective_mhz: float | None = None

    def _draw_noise(self, freq: FreqRequest) -> None:
        """This session's run-to-run noise at `freq` (seeded: same seed, label and clock, same draw)."""
        digest = hashlib.sha256(f"{self.device.seed}|{freq_label(freq)}|{self._label}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        p = self.device.params
        self.time_factor = float(1.0 + p.noise_time * rng.standard_normal())
        self.power_factor = float(1.0 + p.noise_power * rng.standard_normal())

    def _apply(self) -> None:
        """Nothing on the host is changed."""

    def _repin(self, mhz: float) -> None:
        """A new clock for the next steps, with its own noise draw (a probe is a measurement of its own)."""
        self._draw_noise(mhz)

    def _restore(self) -> None:
        """Nothing on the host was changed."""

    def _start_meter(self) -> None:
        self._wall0 = time.monotonic()

    def _mark(self) -> _Counters:
        return _Counters(self._time_s, self._busy_s, dict(self._joules), len(self._series), self._time_expected_s,
                         dict(self._joules_expected))

    def _window_report(self, start: _Counters, end: _Counters) -> EnergyReport:
        joules = {r: end.joules[r] - start.joules.get(r, 0.0) for r in end.joules}
        expected = {r: end.joules_expected[r] - start.joules_expected.get(r, 0.0) for r in end.joules_expected}
        return self._build(end.time_s - start.time_s, end.busy_s - start.busy_s, joules, self._series[start.steps:end.steps],
                           end.time_expected_s - start.time_expected_s, expected)

    def step(self, profile: Any = None) -> None:
        """Charge one training step of `profile` (a StepTrace) at this session's clock."""
        if profile is None:
            return
        curve, maxn = self.device.curve(profile)
        if self.freq == MAXN:
            t, rails, util = maxn.time_s, maxn.power_by_rail_w, maxn.gpu_util
            self.effective_mhz = maxn.settled_mhz
        else:
            est = curve[float(self.freq)]
            t, rails, util = est.time_s, est.power_by_rail_w, est.gpu_util
            self.effective_mhz = float(self.freq)
        rails = board_watts(rails, self.device.params)
        self._time_expected_s += t
        for r, w in rails.items():
            self._joules_expected[r] += w * t
        t *= self.time_factor
        self._time_s += t
        self._busy_s += util * t
        for r, w in rails.items():
            self._joules[r] += w * self.power_factor * t
        self._series.append(total_energy(rails) * self.power_factor)

    def _charge_wall_time(self) -> None:
        """A run with no step trace (an external command): its wall time at an assumed load."""
        p = self.device.params
        wall = time.monotonic() - self._wall0
        f = p.max_mhz if self.freq == MAXN else float(self.freq)
        rails = board_watts(rail_power(f, p.external_gpu_util, 1.0, 0.0, p), p)
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
        )

    def _stop_meter(self) -> EnergyReport:
        if not self._series:
            self._charge_wall_time()
        return self._build()

    def _snapshot(self) -> EnergyReport:
        return self._build()


@dataclasses.dataclass(frozen=True)
class _Counters:
    """The twin's running totals at a window boundary."""

    time_s: float
    busy_s: float
    joules: dict[str, float]
    steps: int
    time_expected_s: float
    joules_expected: dict[str, float]
