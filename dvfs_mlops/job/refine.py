"""Probe-and-refine inside a fine-tuning job: a few short windows at clocks around the governor's
choice, the curve model (`curve.py`) fitted to them, and the rest of the job at its optimum.

It drives an open `FreqSession` from the training loop's per-step hook (`on_step`): after a few
warm-up steps at the starting clock, each probe clock gets its own metered window
("probe@<MHz>") of `MIN_PROBE_STEPS` steps (more when the budget allows more than `MAX_PROBE_CLOCKS`
windows), read while the session is still open. Steps are steps of the probe grid (`probe_grid`): the
table's clocks about `PROBE_SPACING_MHZ` apart, so a datacenter GPU's 15 MHz table is probed as widely in
MHz as an Orin's. On hardware each window is long enough for the meter (`Board.min_window_s` at the
warm-up's step time), opens `SETTLE_STEPS` after a re-pin, and its noise floor is its own samples' spread;
the voltage curve's shape is the board's own where known, else fitted from the probes (never another
board's constants). The probing is sequential (`ProbePlan`): the start
and the clocks two grid steps either side of it; then the curve model, fitted to every probe so far,
may move the clock ONE grid step, and only where its predicted saving exceeds `MOVE_Z` standard
deviations of that saving (the fit's own uncertainty, with the per-window noise as a floor:
`Board.noise` on the twin). After a move, up to two unprobed clocks within two steps of the new one are probed (the settled
clock itself may go unprobed: the fit speaks for it) and the same test
is made from there, while the budget lasts; once it says stay, `repin` keeps the clock for the
remaining steps. Probing costs energy at clocks off the optimum, so it stops as soon as the test
says stay: the budget is a ceiling, not a quota. The probes are part of the job: their time and
energy stay in the "train" window's totals. The session's journal keeps the clock found before the
session, so the restore is the one it would be without refining.
With the board's power prior (`curve.PowerPrior`: what the governor's training sweep says about this
board's power curves; `dvfs-mlops train` stores it on the version as the tag `power_prior`) and the GPU
utilisation each probe window measured, the fit leans on it (curve.py): the probes then mostly have to
pin the time curve, whose noise per window is half the power's.
With the CPU or memory clock tuned too (`knobs`: their tables), the GPU clock settles first (at the knobs' top
clocks), then each knob's axis in turn (`AxisWalk`, a coordinate descent): from its top clock, one step of its axis
grid (at most `AXIS_POINTS` clocks) down at a time, a window of `MIN_PROBE_STEPS` steps each (or what the meter needs),
while the per-step energy falls by more than `MOVE_Z` standard deviations of the difference of two windows; the axes
again while a pass moved; the rest of the budget, if any, is left unspent.
numpy only (through curve.py); nothing here imports torch or MLflow.
"""
from __future__ import annotations

import dataclasses
import io
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.model.curve import CurvePoint, Measurement, PowerPrior, fit_curve, fit_voltage_shape

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import FreqSession
    from dvfs_mlops.hw.meter import EnergyReport

log = logging.getLogger(__name__)

MIN_PROBE_STEPS = 4  # below this a window says more about the meter than about the clock
MAX_PROBE_CLOCKS = 7
FIRST_STRIDE = 2  # the first probes: the start and the clocks this many table steps either side
MOVE_Z = 0.5  # move one table step only on a predicted saving above this many of its standard deviations
WARMUP_STEPS = 2  # steps at the starting clock before the first probe (first-step costs: allocation, autotuning)
# The probes move on a grid of the table's clocks about this far apart, so a step means the same in MHz on every board:
# the AGX Orin's table is its own grid (102 MHz steps), a datacenter GPU's 15 MHz table is thinned to ~100 MHz.
PROBE_SPACING_MHZ = 100.0
SETTLE_STEPS = 1  # on hardware, steps after a re-pin before the probe window opens (the clock and the meter settle)
NOISE_FLOOR = 1e-3  # relative: the least per-window noise a fit assumes, however steady a window's samples were
MIN_BATCHES = 3  # independent batches a window needs before its own power samples say its noise
AXIS_POINTS = 6  # a CPU or memory clock's axis is walked on at most this many of its table's clocks (its top included)
KNOB_NAMES = {"cpu_mhz": "CPU", "emc_mhz": "EMC"}


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe window: `steps` training steps at `freq_mhz`.

    Attributes:
        freq_mhz: the clock probed.
        steps: training steps in the window.
        time_s: the window's time.
        energy_j: the window's energy (CPU + GPU, `EnergyReport.energy_j`).
        gpu_util: the GPU's busy share of the window (0..1), None where the meter did not read it.
    """

    freq_mhz: float
    steps: int
    time_s: float
    energy_j: float
    gpu_util: float | None = None  # the GPU's busy share of the window (0..1), where the meter read it
    cpu_mhz: float | None = None  # the CPU clock of the window, where refine tunes it
    emc_mhz: float | None = None  # the memory clock of the window, where refine tunes it

    def per_step(self) -> Measurement:
        """The window as one step's `Measurement`: time and energy divided by `steps`."""
        return Measurement(self.freq_mhz, self.time_s / self.steps, self.energy_j / self.steps, self.gpu_util)


@dataclasses.dataclass
class RefineResult:
    """What probe-and-refine did: the probes, the clock it settled on and why.

    Attributes:
        start_mhz: the session's clock when refining began (the governor's choice).
        chosen_mhz: the clock the rest of the job ran at.
        probes: the probe windows, in the order run.
        predicted: the curve model's prediction per training step at every clock of the table (empty when no fit
            was made).
        reason: why the job settled where it did.
        prior: the board power prior the last fit leaned on; None where none was used.
        settle_steps: training steps spent settling after a re-pin before a window opened (hardware).
        probe_steps: (property) training steps spent in probe windows.
    """

    start_mhz: float
    chosen_mhz: float
    probes: list[Probe]
    predicted: list[CurvePoint]  # per training step, at every clock of the table
    reason: str  # why the job settled where it did
    prior: PowerPrior | None = None  # the board prior the fits leaned on
    settle_steps: int = 0
    chosen_knobs: dict[str, float] = dataclasses.field(default_factory=dict)  # the CPU/memory clocks settled on (tuned)

    @property
    def probe_steps(self) -> int:
        return sum(p.steps for p in self.probes)

    def to_csv(self) -> str:
        """refine.csv: the probes as measured, then every clock as predicted (per step), the choice marked."""
        out = io.StringIO()
        knobs = [k for k in KNOB_NAMES if k in self.chosen_knobs]  # the CPU/memory clock columns, where refine tuned them
        out.write("kind,freq_mhz,steps,time_s,energy_j,time_per_step_s,energy_per_step_j,energy_per_step_std_j,chosen,gpu_util"
                  + "".join(f",{k}" for k in knobs) + "\n")
        for p in self.probes:
            m = p.per_step()
            util = "" if p.gpu_util is None else repr(p.gpu_util)
            clocks = [getattr(p, k) for k in knobs]
            chosen = p.freq_mhz == self.chosen_mhz and all(c is None or c == self.chosen_knobs[k] for k, c in zip(knobs, clocks))
            out.write(f"probe,{p.freq_mhz:g},{p.steps},{p.time_s!r},{p.energy_j!r},{m.time_s!r},{m.energy_j!r},,"
                      f"{int(chosen)},{util}" + "".join("," if c is None else f",{c:g}" for c in clocks) + "\n")
        for pt in self.predicted:
            sd = "" if pt.energy_std_j is None else repr(pt.energy_std_j)
            out.write(f"predicted,{pt.freq_mhz:g},,,,{pt.time_s!r},{pt.energy_j!r},{sd},{int(pt.freq_mhz == self.chosen_mhz)},"
                      + "," * len(knobs) + "\n")
        return out.getvalue()

    def lines(self) -> list[str]:
        """The result as "refine: ..." lines for the log: the probes, the clock settled on, the prior used."""
        probes = ", ".join(f"{p.freq_mhz:g} MHz {p.per_step().energy_j:.4g} J/step" for p in self.probes)
        settling = f" + {self.settle_steps} settling after re-pins" if self.settle_steps else ""
        out = [f"refine: probed {probes} ({self.probe_steps} steps{settling})",
               f"refine: settled at {self.chosen_mhz:g} MHz (started at {self.start_mhz:g}; {self.reason})"]
        if self.chosen_knobs:
            out.append("refine: then " + ", ".join(f"{KNOB_NAMES[k]} {v:g} MHz" for k, v in self.chosen_knobs.items())
                       + " (each axis walked down from its top while the energy per step fell)")
        if self.prior is not None:
            p = self.prior
            out.append(f"refine: power curve fitted with the board's power prior from {p.workloads} workloads of the governor's sweep "
                       f"(idle share {p.idle_share:g}, log dynamic/static ratio {p.log_ratio_mean:.3f} +- {p.log_ratio_sd:.3f})")
        return out


def probe_clocks(start_mhz: float, table: Sequence[float], n_clocks: int, stride: int = FIRST_STRIDE) -> list[float]:
    """The first probe clocks: the start, then clocks `stride` table steps apart on both sides, alternating up and down.

    Args:
        start_mhz: the starting clock (snapped to the nearest of the table).
        table: the device's clock table.
        n_clocks: how many clocks are wanted.
        stride: table steps between neighbouring probes.

    Returns:
        Up to `n_clocks` distinct clocks of the table, the start first; at the table's edges the missing ones are
        filled with the unused clocks nearest the start.
    """
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


def probe_grid(table: Sequence[float], start_mhz: float, spacing_mhz: float = PROBE_SPACING_MHZ) -> list[float]:
    """The clocks refine probes and moves on: the table where its steps are already `spacing_mhz` wide or wider (half
    of it or more), else the table's clocks nearest the start plus and minus whole multiples of `spacing_mhz`.

    Args:
        table: the device's clock table.
        start_mhz: the starting clock (on the grid, snapped to the table).
        spacing_mhz: the grid's step.

    Returns:
        The grid, ascending, the start's nearest table clock included.
    """
    freqs = sorted(float(f) for f in table)
    steps = sorted(b - a for a, b in itertools.pairwise(freqs))
    if not steps or steps[len(steps) // 2] >= spacing_mhz / 2:
        return freqs
    start = min(freqs, key=lambda f: abs(f - start_mhz))
    grid = {start}
    for sign in (-1, 1):
        k = 1
        while freqs[0] - spacing_mhz / 2 <= start + sign * k * spacing_mhz <= freqs[-1] + spacing_mhz / 2:
            grid.add(min(freqs, key=lambda f, t=start + sign * k * spacing_mhz: abs(f - t)))  # type: ignore[misc]
            k += 1
    return sorted(grid)


def plan(budget: int, start_mhz: float, table: Sequence[float], per_probe: int = 0, settle: int = 0) -> tuple[list[float], int]:
    """The first round of probes for a budget of probe steps.

    A window is `MIN_PROBE_STEPS` steps, or `budget // MAX_PROBE_CLOCKS` where that is more; at most
    `budget // steps` windows in all (`ProbePlan.windows`). The first round is the start and its
    neighbours `FIRST_STRIDE` table steps away; the later ones (after a move) are decided by the fit.

    Args:
        budget: training steps that may be spent probing (windows and the settling steps before them).
        start_mhz: the starting clock.
        table: the clocks to probe on (`probe_grid`).
        per_probe: the fewest steps a window needs for the meter to tell it apart (0: no such floor).
        settle: steps after each re-pin before its window opens.

    Returns:
        (the first round's clocks, at most three; steps per probe window); ([], 0) when the budget (or the table)
        allows fewer than two windows.
    """
    per = max(MIN_PROBE_STEPS, budget // MAX_PROBE_CLOCKS, per_probe)
    windows = min(budget // (per + settle), len(table))
    if windows < 2:
        return [], 0
    return probe_clocks(start_mhz, table, min(3, windows)), per


class ProbePlan:
    """The sequential probe design, apart from any session (the benchmark and `Refiner` both drive it).

    `next_clock()` says which clock to probe next, or None once settled (`chosen_mhz`); `record()` takes
    each probe's per-step measurement, in the order asked.

    Args:
        start_mhz: the starting clock (snapped to the nearest of the table).
        table: the device's clock table; the probes move on its `probe_grid`.
        budget: training steps that may be spent probing (`plan`).
        voltage_shape: r of the board's voltage curve; None: fitted from the probes once three clocks are measured
            (a board whose curve is only assumed); with fewer, the plan stays at the start.
        noise: (relative time noise, relative power noise) of one probe window (`noise` may be updated as windows
            are measured).
        max_steps: the probe steps the job leaves room for (None: no limit beside the budget).
        prior: the board's power prior (used where the probes carry their GPU utilisation).
        per_probe: the fewest steps a window needs for the meter (0: `MIN_PROBE_STEPS` and the budget decide).
        settle: steps after each re-pin before its window opens (counted against the budget).

    Attributes:
        chosen_mhz: the clock settled on; None while probing.
        reason: why it settled there.
        predicted: the last fit's prediction per step at every clock of the table.
        prior_used: the prior the last fit leaned on (None: none, or a probe lacked its utilisation).
        measured: each probed clock's per-step measurement, in the order probed.
    """

    def __init__(self, start_mhz: float, table: Sequence[float], budget: int, *, voltage_shape: float | None,
                 noise: tuple[float, float], max_steps: int | None = None, prior: PowerPrior | None = None, per_probe: int = 0,
                 settle: int = 0):
        self.full_table = sorted(float(f) for f in table)
        self.table = probe_grid(self.full_table, start_mhz)
        self.voltage_shape, self.noise, self.prior = voltage_shape, noise, prior
        self.prior_used: PowerPrior | None = None  # the prior the last fit leaned on (None: a probe lacked its utilisation)
        self.center = min(range(len(self.table)), key=lambda k: abs(self.table[k] - start_mhz))
        first, self.per_probe = plan(budget, start_mhz, self.table, per_probe, settle)
        cost = self.per_probe + settle
        self.windows = 0 if not first else min(budget // cost, len(self.table),
                                                 max_steps // cost if max_steps is not None else len(self.table))
        self.queue: list[float] = first[:self.windows]
        self.measured: dict[float, Measurement] = {}  # each probed clock once, in the order probed
        self.moves = 0
        self.predicted: list[CurvePoint] = []
        self.chosen_mhz: float | None = None if self.queue else self.table[self.center]
        self.reason = "" if self.queue else "no probes"

    def next_clock(self) -> float | None:
        """The clock to probe next, fitting and deciding once the queued probes are measured.

        Returns:
            The clock, or None once settled (`chosen_mhz`, `reason`).
        """
        while self.chosen_mhz is None:
            if self.queue:
                return self.queue[0]
            self._decide()
        return None

    def shape(self) -> float | None:
        """The voltage shape the fits use: the given one, else fitted across the probes (three clocks or more), else
        None (no fit: another board's constants would bias it)."""
        if self.voltage_shape is not None:
            return self.voltage_shape
        try:
            return fit_voltage_shape([list(self.measured.values())], self.full_table[-1])
        except DvfsError:
            return None

    def record(self, m: Measurement) -> None:
        """Take the per-step measurement of the clock `next_clock()` returned (recorded at that clock).

        Args:
            m: one training step's time, energy and GPU utilisation at that clock.
        """
        f = self.queue.pop(0)
        self.measured[f] = dataclasses.replace(m, freq_mhz=f)

    def _decide(self) -> None:
        """Fit every probe so far; move one table step on a significant predicted saving, then probe around it."""
        here = self.table[self.center]
        shape = self.shape()
        if shape is None:
            self.chosen_mhz, self.reason = here, f"this board's voltage curve is unknown and {len(self.measured)} clocks cannot fit it; staying at {here:g} MHz"
            return
        try:
            fit = fit_curve(list(self.measured.values()), voltage_shape=shape, f_max_mhz=self.full_table[-1], noise=self.noise,
                            prior=self.prior)
        except DvfsError as e:
            self.chosen_mhz, self.reason = here, f"no fit ({e}); staying at {here:g} MHz"
            return
        self.predicted = fit.predict(self.full_table)
        self.prior_used = fit.prior
        best, best_gain, best_z = self.center, 0.0, 0.0
        for j in (self.center - 1, self.center + 1):
            if 0 <= j < len(self.table):
                g, sd = fit.gain(here, self.table[j])
                z = g / sd if sd > 0 else 0.0
                if g > 0 and z > MOVE_Z and g > best_gain:
                    best, best_gain, best_z = j, g, z
        if best == self.center:
            moved = f"after {self.moves} move(s)" if self.moves else "the start"
            self.chosen_mhz = here
            self.reason = f"the curve model predicts no significant saving one table step from {moved} (z <= {MOVE_Z:g})"
            return
        self.center, self.moves = best, self.moves + 1
        left = self.windows - len(self.measured)
        fresh = [self.table[j] for j in (best - 1, best + 1, best - 2, best + 2)
                 if 0 <= j < len(self.table) and self.table[j] not in self.measured]
        self.queue = fresh[:min(2, left)]
        if not self.queue and left > 0:
            return  # its neighbours are probed already: the same test from the new clock
        if not self.queue:
            self.chosen_mhz = self.table[best]
            self.reason = (f"moved {self.moves} table step(s) on the curve model's predicted saving "
                           f"(last z = {best_z:.2f}); probe budget spent")


def axis_grid(table: Sequence[float], points: int = AXIS_POINTS) -> list[float]:
    """At most `points` clocks of a knob's table, evenly spread by position, its top included, ascending."""
    freqs = sorted(float(f) for f in table)
    if len(freqs) <= points:
        return freqs
    stride = (len(freqs) - 1) / (points - 1)
    return sorted({freqs[len(freqs) - 1 - round(k * stride)] for k in range(points)})


class AxisWalk:
    """The CPU and memory clocks after the GPU's: a coordinate descent from their tops. Each axis in turn, one grid step
    down per probe window while the energy per step falls significantly; then the axes again while a pass moved (a
    configuration measured before costs no window). The GPU clock stays where it settled.

    Args:
        axes: (knob, its table) for each knob tuned, in order ("cpu_mhz", "emc_mhz").
        windows: the probe windows left in the budget.
        noise: the relative noise of one window's energy per step.
        start: the energy per step already measured at every knob's top (the GPU's settled clock), None: measure it.

    Attributes:
        chosen: each knob's clock settled on so far (its top until it moves).
    """

    def __init__(self, axes: Sequence[tuple[str, Sequence[float]]], windows: int, noise: float, start: float | None = None):
        self.axes = [(k, axis_grid(t)) for k, t in axes if len(t) > 0]
        self.chosen = {k: grid[-1] for k, grid in self.axes}
        self.windows, self.noise = windows, noise
        self.measured: dict[tuple[float, ...], float] = {}  # energy per step by the knobs' clocks, in `axes` order
        if start is not None:
            self.measured[self._key(self.chosen)] = start
        self.axis = 0
        self.moved = False  # a move in this pass over the axes
        self.pending: dict[str, float] | None = None

    def _key(self, knobs: Mapping[str, float]) -> tuple[float, ...]:
        return tuple(knobs[k] for k, _ in self.axes)

    def _candidate(self) -> dict[str, float] | None:
        """The configuration the walk looks at next (the tops first, then one step down the axis walked), None at the end."""
        if self._key(self.chosen) not in self.measured:
            return dict(self.chosen)
        while self.axis < len(self.axes):
            knob, grid = self.axes[self.axis]
            at = grid.index(self.chosen[knob])
            if at > 0:
                return {**self.chosen, knob: grid[at - 1]}
            self._next_axis()
        return None

    def next_knobs(self) -> dict[str, float] | None:
        """The knob clocks of the next probe window (every tuned knob), or None once no axis moves or the budget is spent."""
        while self.pending is None:
            tried = self._candidate()
            if tried is None:
                return None
            known = self.measured.get(self._key(tried))
            if known is None:
                if self.windows < 1:
                    return None
                self.pending = tried
            else:
                self._judge(tried, known)
        return self.pending

    def record(self, energy_per_step: float) -> None:
        """Take the window of `next_knobs()`: move on a significant fall, else on to the next axis."""
        assert self.pending is not None
        tried, self.pending = self.pending, None
        self.windows -= 1
        self.measured[self._key(tried)] = energy_per_step
        if tried != self.chosen:
            self._judge(tried, energy_per_step)

    def _judge(self, tried: dict[str, float], energy: float) -> None:
        best = self.measured[self._key(self.chosen)]
        if energy < best * (1.0 - MOVE_Z * math.sqrt(2.0) * self.noise):
            self.chosen, self.moved = tried, True
        else:
            self._next_axis()

    def _next_axis(self) -> None:
        self.axis += 1
        if self.axis == len(self.axes) and self.moved:  # another pass while one moved
            self.axis, self.moved = 0, False


class Refiner:
    """Probe-and-refine driven from a training loop: call `on_step(step)` after every charged training step.

    Probing starts from the session's clock (the governor's choice). When the budget or the job is too
    small to probe, it is done at once (`active` False, `result` says why) and the clock is left as it is.

    Args:
        session: an entered `FreqSession` that pins a clock of the table (not observing, not maxn).
        budget: the most training steps spent probing (a ceiling, not a quota).
        total_steps: the job's training steps; at least one is left for the settled clock.
        board: the board (its table, voltage shape and per-window noise).
        prior: the board's power prior (the governor version's, `GovernorRef.power_prior_for(board)`). Its ratios
            were fitted with its own voltage shape and table top, so it is used only on a table with that top, and
            its shape then replaces the board's where that is assumed, not known.
        warmup: steps at the starting clock before the first probe.
        say: where the "refine: ..." lines go (None: this module's logger at INFO).
        knobs: the CPU and memory clocks to tune after the GPU's ({"cpu_mhz": table, "emc_mhz": table}; empty: the GPU
            clock alone); the session is repinned with them, each starting at its table's top (`AxisWalk`).

    Raises:
        DvfsError: the session pins no clock (maxn): there is no clock to probe around.

    Attributes:
        result: the `RefineResult` once settled; None while probing.
        active: (property) still probing.
    """

    def __init__(self, session: FreqSession, budget: int, total_steps: int, board: Board, *, prior: PowerPrior | None = None,
                 warmup: int = WARMUP_STEPS, say: Callable[[str], None] | None = None,
                 knobs: Mapping[str, Sequence[float]] | None = None):
        if session.pinned_mhz is None:
            raise DvfsError("refine probes around a pinned clock, and this session pins none (maxn or observe); "
                            "give it a clock of the table")
        self.session, self.board, self.budget = session, board, budget
        self.table = sorted(float(f) for f in board.frequencies_mhz)
        self.start_mhz = float(session.pinned_mhz)
        self.prior, self.voltage_shape = _usable_prior(prior, board)
        self.noise = board.noise()
        self.settle = 0 if board.simulated else SETTLE_STEPS  # the twin's clock and meter move with the step
        self.warmup = warmup
        self.say = say or log.info
        self.max_steps = max(total_steps - warmup - 1, 0)  # at least one step left at the settled clock
        self.plan = self._plan(0)
        self.clocks = list(self.plan.queue)  # the first round (more may follow a move)
        self.per_probe = per = self.plan.per_probe
        self.result: RefineResult | None = None
        self._probes: list[Probe] = []
        self._clock: float | None = None  # the clock of the probe running, None before the first
        self._in_probe = 0
        self._settling = 0  # steps left before the window of the probe running opens
        self._settled = 0  # steps spent settling so far
        self._stamps: list[float] = []  # monotonic time at each step's end: warm-up and window step times
        self._window_noise = (NOISE_FLOOR, NOISE_FLOOR)
        self._done = False
        self.knobs = {k: sorted(float(f) for f in t) for k, t in (knobs or {}).items() if t}
        self._walk: AxisWalk | None = None
        self._walk_steps = MIN_PROBE_STEPS  # a walk's window: the fewest steps, or what the meter needs (`_size_to_meter`)
        self._knob_clocks: dict[str, float] = {}  # the knob clocks of the probe running (the walk's)
        self._gpu_settled: tuple[float, list[CurvePoint], str] | None = None
        if not per:
            self._finish(self.start_mhz, [], f"a budget of {budget} steps is too small to probe (needs {2 * (MIN_PROBE_STEPS + self.settle)})")
        elif len(self.clocks) < 2:
            self._finish(self.start_mhz, [], f"the job's {total_steps} steps leave nothing after {2 * per} probe steps")

    def _plan(self, per_probe: int) -> ProbePlan:
        return ProbePlan(self.start_mhz, self.table, self.budget, voltage_shape=self.voltage_shape, noise=self.noise,
                         max_steps=self.max_steps, prior=self.prior, per_probe=per_probe, settle=self.settle)

    def _size_to_meter(self) -> bool:
        """Before the first probe: windows long enough for the meter (`Board.min_window_s`) at the step time the warm-up
        showed; False (refine done) when the budget then allows fewer than two windows."""
        if self.board.min_window_s <= 0 or len(self._stamps) < 2:
            return True
        step_s = (self._stamps[-1] - self._stamps[0]) / (len(self._stamps) - 1)
        need = math.ceil(self.board.min_window_s / step_s) if step_s > 0 else 0
        self._walk_steps = max(MIN_PROBE_STEPS, need)
        if need <= self.plan.per_probe:
            return True
        self.plan = self._plan(need)
        self.per_probe = self.plan.per_probe
        self.clocks = list(self.plan.queue)
        if len(self.plan.queue) < 2:
            self._finish(self.start_mhz, [], f"windows the meter can tell apart need {need} steps ({self.board.min_window_s:g} s); "
                                             f"a budget of {self.budget} steps holds fewer than two")
            return False
        return True

    @property
    def active(self) -> bool:
        return not self._done

    def _window_name(self) -> str:
        clocks = "".join(f"/{KNOB_NAMES[k].lower()}{v:g}" for k, v in self._knob_clocks.items())
        return f"probe@{self._clock:g}{clocks}"

    def _begin(self, clock: float, knob_clocks: Mapping[str, float] | None = None) -> None:
        self._clock, self._in_probe = clock, 0
        knob_clocks = dict(knob_clocks or {})
        moved = {k: v for k, v in knob_clocks.items() if getattr(self.session, k, None) != v}
        self._knob_clocks = knob_clocks
        if clock != float(self.session.freq) or moved:
            self.session.repin(clock, **moved)
            self._settling = self.settle
        if not self._settling:
            self.session.begin_window(self._window_name())

    def on_step(self, step: int, loss: float | None = None) -> None:
        """Advance probing by one finished training step: open, close and read probe windows, repin, settle.

        The first probe window opens once `warmup` steps have run (on hardware sized to the meter from their step
        time, and `SETTLE_STEPS` after each re-pin); each closes after its steps, and the plan then names the next
        clock or settles, pinning the chosen clock for the rest of the job and saying the result. A no-op once
        settled.

        Args:
            step: the 0-based index of the step that just finished.
            loss: the step's loss (not used).

        Raises:
            DvfsError: the session cannot move its clock (an observing session).
        """
        if self._done:
            return
        self._stamps.append(time.monotonic())
        if self._clock is None:
            if step + 1 >= self.warmup and self._size_to_meter():
                self._stamps = self._stamps[-1:]
                self._begin(self.plan.queue[0])
            return
        if self._settling:
            self._settling -= 1
            self._settled += 1
            if not self._settling:
                self._stamps = self._stamps[-1:]
                self.session.begin_window(self._window_name())
            return
        self._in_probe += 1
        if self._in_probe < (self._walk_steps if self._walk is not None else self.per_probe):
            return
        name = self._window_name()
        self.session.end_window(name)
        r = self.session.window_report(name)
        util = None if r.gpu_util_pct is None else r.gpu_util_pct / 100.0
        knobs = {k: getattr(self.session, k, None) for k in self.knobs}  # the tuned knobs' clocks of the window
        probe = Probe(self._clock, self._in_probe, r.duration_s, r.energy_j, util, knobs.get("cpu_mhz"), knobs.get("emc_mhz"))
        self._probes.append(probe)
        if not self.board.simulated:  # the noise floor from this window's own samples, not a constant
            self.plan.noise = self._floor_from(r)
        self._stamps = self._stamps[-1:]
        if self._walk is not None:
            self._walk.record(probe.per_step().energy_j)
            self._walk_on()
            return
        self.plan.record(probe.per_step())
        nxt = self.plan.next_clock()
        if nxt is not None:
            self._begin(nxt)
        else:
            self._settle()

    def _floor_from(self, report: EnergyReport) -> tuple[float, float]:
        """(time, power) relative noise of a window's mean from its own samples, the largest over the windows so far.

        Time: the step times' standard error. Power: batch means, each batch at least a step and at least the span a
        sample is already averaged over (`Board.power_average_s`), since samples closer than that are not independent
        (NVML's ~1 s average; a step's own phases); with fewer than `MIN_BATCHES` batches the window cannot tell its
        noise and the board's per-window noise stands in. Drift between windows (temperature) is not seen here.
        """
        steps = [b - a for a, b in itertools.pairwise(self._stamps)]
        t = _relative_error(steps)
        power = list(report.power_series_w)
        span_s = max(sum(steps) / len(steps) if steps else 0.0, self.board.power_average_s)
        per_sample_s = report.duration_s / len(power) if power else 0.0
        size = max(1, math.ceil(span_s / per_sample_s - 1e-9)) if per_sample_s > 0 else len(power) or 1
        batches = [power[k:k + size] for k in range(0, len(power) - size + 1, size)]
        means = [sum(b) / len(b) for b in batches]
        p = _relative_error(means) if len(means) >= MIN_BATCHES else self.board.noise_power
        self._window_noise = (max(self._window_noise[0], t), max(self._window_noise[1], p))
        return self._window_noise

    def _settle(self) -> None:
        chosen = float(self.plan.chosen_mhz if self.plan.chosen_mhz is not None else self.session.freq)
        if self.knobs:  # the GPU clock settled: walk the CPU and memory axes from their tops, in the budget left
            self._gpu_settled = (chosen, self.plan.predicted, self.plan.reason)
            left = self.budget - sum(p.steps for p in self._probes) - self._settled
            windows = min(left, self.max_steps - sum(p.steps for p in self._probes) - self._settled) // (self._walk_steps + self.settle)
            # the settled GPU clock probed with every knob at its top already measured the walk's start
            tops = {k: t[-1] for k, t in self.knobs.items()}
            start = next((p.per_step().energy_j for p in self._probes if p.freq_mhz == chosen
                          and all(getattr(p, k) == v for k, v in tops.items())), None)
            self._walk = AxisWalk(list(self.knobs.items()), max(windows, 0), self.noise[1], start)
            self._walk_on()
            return
        if chosen != float(self.session.freq):
            self.session.repin(chosen)
        self._finish(chosen, self.plan.predicted, self.plan.reason)

    def _walk_on(self) -> None:
        """The walk's next probe window, or its end: every knob at the clock it settled on."""
        assert self._walk is not None and self._gpu_settled is not None
        chosen, predicted, reason = self._gpu_settled
        nxt = self._walk.next_knobs()
        if nxt is not None:
            self._begin(chosen, nxt)
            return
        knobs = self._walk.chosen
        moved = {k: v for k, v in knobs.items() if getattr(self.session, k, None) != v}
        if chosen != float(self.session.freq) or moved:
            self.session.repin(chosen, **moved)
        self._finish(chosen, predicted, reason, knobs)

    def _finish(self, chosen: float, predicted: list[CurvePoint], reason: str, knobs: Mapping[str, float] | None = None) -> None:
        self._done = True
        self.result = RefineResult(self.start_mhz, chosen, list(self._probes), predicted, reason, self.plan.prior_used,
                                   self._settled, dict(knobs or {}))
        for line in self.result.lines():
            self.say(line)


def _relative_error(values: Sequence[float]) -> float:
    """The relative standard error of the mean of `values` (`NOISE_FLOOR` with fewer than two)."""
    if len(values) < 2:
        return NOISE_FLOOR
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return max(NOISE_FLOOR, math.sqrt(var / len(values)) / mean) if mean > 0 else NOISE_FLOOR


def _usable_prior(prior: PowerPrior | None, board: Board) -> tuple[PowerPrior | None, float | None]:
    """(the prior, if it belongs to this board; the voltage shape the fits use: the prior's, else the board's own, else
    None where the board's is only assumed, which `ProbePlan` then fits from the probes)."""
    own = board.voltage_shape if board.voltage_shape_known else None
    if prior is None:
        return None, own
    if prior.f_max_mhz is not None and abs(prior.f_max_mhz - board.f_max_mhz) > 0.5:
        log.info("refine: the power prior was fitted on a table topping out at %g MHz, this one at %g MHz; not used",
                 prior.f_max_mhz, board.f_max_mhz)
        return None, own
    if prior.voltage_shape is None:
        return prior, own
    if board.voltage_shape_known and abs(prior.voltage_shape - board.voltage_shape) > 1e-9:
        log.info("refine: the power prior was fitted with voltage shape %g, this board's is %g; not used",
                 prior.voltage_shape, board.voltage_shape)
        return None, own
    return prior, prior.voltage_shape
