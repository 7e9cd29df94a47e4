"""Probe-and-refine inside a fine-tuning job: a few short windows at clocks around the governor's
choice, the curve model (`curve.py`) fitted to them, and the rest of the job at its optimum.

It drives an open `FreqSession` from the training loop's per-step hook (`on_step`): after a few
warm-up steps at the starting clock, each probe clock gets its own metered window
("probe@<MHz>") of an equal share of the step budget, read while the session is still open; then
`repin` moves the clock to the predicted optimum for the remaining steps. The probes are part of
the job: their time and energy stay in the "train" window's totals. The session's journal keeps
the clock found before the session, so the restore is the one it would be without refining.
numpy only (through curve.py); nothing here imports torch or MLflow.
"""
from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Callable, Sequence
from typing import Any

from dvfs_mlops.curve import CurvePoint, Measurement, fit_curve, voltage_shape_for
from dvfs_mlops.errors import DvfsError

log = logging.getLogger(__name__)

MIN_PROBE_STEPS = 4  # below this a window says more about the meter than about the clock
MAX_PROBE_CLOCKS = 5
WARMUP_STEPS = 2  # steps at the starting clock before the first probe (first-step costs: allocation, autotuning)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe window: `steps` training steps at `freq_mhz`."""

    freq_mhz: float
    steps: int
    time_s: float
    energy_j: float

    def per_step(self) -> Measurement:
        return Measurement(self.freq_mhz, self.time_s / self.steps, self.energy_j / self.steps)


@dataclasses.dataclass
class RefineResult:
    start_mhz: float
    chosen_mhz: float
    probes: list[Probe]
    predicted: list[CurvePoint]  # per training step, at every clock of the table
    reason: str  # why the job settled where it did

    @property
    def probe_steps(self) -> int:
        return sum(p.steps for p in self.probes)

    def tags(self) -> dict[str, str]:
        return {"refine.start_mhz": f"{self.start_mhz:g}", "refine.chosen_mhz": f"{self.chosen_mhz:g}",
                "refine.probes": ",".join(f"{p.freq_mhz:g}x{p.steps}" for p in self.probes),
                "refine.probe_steps": str(self.probe_steps), "refine.reason": self.reason}

    def to_csv(self) -> str:
        """refine.csv: the probes as measured, then every clock as predicted (per step), the choice marked."""
        out = io.StringIO()
        out.write("kind,freq_mhz,steps,time_s,energy_j,time_per_step_s,energy_per_step_j,energy_per_step_std_j,chosen\n")
        for p in self.probes:
            m = p.per_step()
            out.write(f"probe,{p.freq_mhz:g},{p.steps},{p.time_s!r},{p.energy_j!r},{m.time_s!r},{m.energy_j!r},,"
                      f"{int(p.freq_mhz == self.chosen_mhz)}\n")
        for pt in self.predicted:
            sd = "" if pt.energy_std_j is None else repr(pt.energy_std_j)
            out.write(f"predicted,{pt.freq_mhz:g},,,,{pt.time_s!r},{pt.energy_j!r},{sd},{int(pt.freq_mhz == self.chosen_mhz)}\n")
        return out.getvalue()

    def lines(self) -> list[str]:
        probes = ", ".join(f"{p.freq_mhz:g} MHz {p.per_step().energy_j:.4g} J/step" for p in self.probes)
        return [f"refine: probed {probes} ({self.probe_steps} steps)",
                f"refine: settled at {self.chosen_mhz:g} MHz (started at {self.start_mhz:g}; {self.reason})"]


def probe_clocks(start_mhz: float, table: Sequence[float], n_clocks: int, stride: int = 2) -> list[float]:
    """The start clock, then clocks `stride` table steps apart on both sides (filled inward at the table's edges)."""
    freqs = sorted(float(f) for f in table)
    i = min(range(len(freqs)), key=lambda k: abs(freqs[k] - start_mhz))
    wanted: list[int] = []
    for k in range(n_clocks):
        off = ((k + 1) // 2) * stride * (-1 if k % 2 else 1)
        j = min(max(i + off, 0), len(freqs) - 1)
        if j not in wanted:
            wanted.append(j)
    for j in sorted(range(len(freqs)), key=lambda k: (abs(k - i), k)):  # at an edge: the nearest unused clocks
        if len(wanted) >= min(n_clocks, len(freqs)):
            break
        if j not in wanted:
            wanted.append(j)
    return [freqs[j] for j in wanted]


def plan(budget: int, start_mhz: float, table: Sequence[float]) -> tuple[list[float], int]:
    """(probe clocks, steps per probe) for a budget of probe steps; no clocks when the budget is too small."""
    n = min(MAX_PROBE_CLOCKS, budget // MIN_PROBE_STEPS, len(table))
    if n < 2:
        return [], 0
    return probe_clocks(start_mhz, table, n), budget // n


class Refiner:
    """Call `on_step(step, loss)` after every charged training step of a session opened at `start_mhz`."""

    def __init__(self, session: Any, budget: int, total_steps: int, *, voltage_shape: float | None = None,
                 warmup: int = WARMUP_STEPS, say: Callable[[str], None] | None = None):
        self.session = session
        self.table = sorted(float(f) for f in session.device.frequencies_mhz)
        self.start_mhz = float(session.freq)
        self.voltage_shape = voltage_shape_for(session.device) if voltage_shape is None else voltage_shape
        self.warmup = warmup
        self.say = say or log.info
        self.clocks, self.per_probe = plan(budget, self.start_mhz, self.table)
        self.result: RefineResult | None = None
        self._probes: list[Probe] = []
        self._k = -1  # index of the probe running, -1 before the first
        self._in_probe = 0
        self._done = False
        if not self.clocks:
            self._finish(self.start_mhz, [], f"a budget of {budget} steps is too small to probe (needs {2 * MIN_PROBE_STEPS})")
        elif total_steps < warmup + self.per_probe * len(self.clocks) + 1:
            self._finish(self.start_mhz, [], f"the job's {total_steps} steps leave nothing after {self.per_probe * len(self.clocks)} probe steps")

    @property
    def active(self) -> bool:
        return not self._done

    def _window(self, k: int) -> str:
        return f"probe@{self.clocks[k]:g}"

    def _begin(self, k: int) -> None:
        self._k, self._in_probe = k, 0
        if self.clocks[k] != float(self.session.freq):
            self.session.repin(self.clocks[k])
        self.session.begin_window(self._window(k))

    def on_step(self, step: int, loss: float | None = None) -> None:
        if self._done:
            return
        if self._k < 0:
            if step + 1 >= self.warmup:
                self._begin(0)
            return
        self._in_probe += 1
        if self._in_probe < self.per_probe:
            return
        name = self._window(self._k)
        self.session.end_window(name)
        r = self.session.window_report(name)
        self._probes.append(Probe(self.clocks[self._k], self._in_probe, r.duration_s, r.energy_j))
        if self._k + 1 < len(self.clocks):
            self._begin(self._k + 1)
        else:
            self._settle()

    def _settle(self) -> None:
        try:
            fit = fit_curve([p.per_step() for p in self._probes], voltage_shape=self.voltage_shape, f_max_mhz=max(self.table))
        except DvfsError as e:
            self._finish(float(self.session.freq), [], f"no fit ({e}); staying at the last probe's clock")
            return
        predicted = fit.predict(self.table)
        best = min(predicted, key=lambda p: p.energy_j)
        if best.freq_mhz != float(self.session.freq):
            self.session.repin(best.freq_mhz)
        self._finish(best.freq_mhz, predicted, "the curve model's predicted optimum")

    def _finish(self, chosen: float, predicted: list[CurvePoint], reason: str) -> None:
        self._done = True
        self.result = RefineResult(self.start_mhz, chosen, list(self._probes), predicted, reason)
        for line in self.result.lines():
            self.say(line)
