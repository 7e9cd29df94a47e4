"""Measuring less, jointly: which (GPU, CPU, EMC) configuration to measure next, and which one to pick.

A configuration is one `Setting` (GPU, CPU and memory clock) of a `JointSpace` (each knob's table). The search
measures a few configurations of one workload, one at a time, each chosen from what the ones before it measured, and
picks the best measured one under an objective (`energy`, `edp` or `max-slowdown:X`, X against all clocks at their
top: model/governor/objectives.py):

1. the top configuration (every clock at its highest): the reference of `max-slowdown` and of every saving;
2. the GPU axis, CPU and EMC at their top, as the GPU-only adaptive sweep measures it: the clocks
   `curve.next_clock` asks for (the start, the table's ends, then the clocks that best pin the optimum, at most
   `gpu_clocks`), and the curve model's pick for the objective (`Objective.best` on its predicted time and energy);
   where that pick measures too slow for the objective, the next GPU clocks up until one is not;
3. the CPU axis at that GPU clock (EMC at its top), then the EMC axis at the best configuration so far: a golden-section
   search along the axis's table (J. Kiefer, "Sequential minimax search for a maximum", Proc. AMS 4(3), 1953, on the
   table's positions; a configuration already measured costs nothing);
4. a compass search from the best configuration so far: every configuration one table step away along one knob
   (Kolda, Lewis and Torczon, "Optimization by direct search", SIAM Review 45(3), 2003, section 3), moving to the
   best of them while one improves; it ends when none does or the budget is spent.

A configuration "improves" when it is feasible and cheaper (cost from the objective), or, of two infeasible ones,
faster. Axis by axis from the GPU-only pick suits the landscape measured on real boards: close to separable, each
clock's axis U-shaped (`python -m benchmarks joint` measures this strategy against Optuna's samplers and a separable
curve model per axis on the shipped BoFL Jetson grid).

The proposer is stateless: `JointSearch.next_configuration(measured)` replays the search on the measurements so far and
returns the first configuration it needs that has not been measured (or None: done, or the budget spent). So a sweep
that resumes from its store, or a refine that measures online between training steps, makes the same choices again
from the same measurements, as `curve.next_clock` does for the GPU alone. Repeats of one configuration are averaged.
Standard library and numpy (through curve.py) only.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from dvfs_mlops.clocks import Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import DEFAULT_NOISE, ORIN_VOLTAGE_SHAPE
from dvfs_mlops.hw.replay import ReplayGrid
from dvfs_mlops.model.curve import Measurement, PowerPrior, fit_curve, next_clock
from dvfs_mlops.model.governor.objectives import Objective, parse_objective

__all__ = ["DEFAULT_BUDGET", "GPU_CLOCKS", "KNOBS", "JointResult", "JointSearch", "JointSpace", "Measured", "TimeEnergy", "search"]

KNOBS = ("gpu", "cpu", "emc")
DEFAULT_BUDGET = 20  # distinct configurations measured per workload, the top one included
GPU_CLOCKS = 4  # the GPU axis's clocks the curve model asks for, as the adaptive sweep's MAX_PINNED
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclasses.dataclass(frozen=True)
class JointSpace:
    """The configurations a joint search may measure: each knob's table, ascending.

    A knob with an empty table is not in the configuration (None in every `Setting`); a knob with one value is held
    there (e.g. the memory clock of `--knobs gpu,cpu` on a grid that has one: its top).

    Attributes:
        gpu_mhz: the GPU clocks (at least one).
        cpu_mhz: the CPU clocks; () where the configuration has no CPU clock.
        emc_mhz: the memory (EMC) clocks; () where the configuration has no memory clock.

    Raises:
        DvfsError: no GPU clock, or a table that is not of distinct positive clocks in ascending order.
    """

    gpu_mhz: tuple[float, ...]
    cpu_mhz: tuple[float, ...] = ()
    emc_mhz: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.gpu_mhz:
            raise DvfsError("a joint search needs at least one GPU clock")
        for knob, table in zip(KNOBS, self.tables):
            if any(not (math.isfinite(f) and f > 0) for f in table) or any(b <= a for a, b in itertools.pairwise(table)):
                raise DvfsError(f"the {knob} table must be distinct positive clocks in ascending order, got "
                                f"{', '.join(f'{f:g}' for f in table)}")

    @classmethod
    def from_grid(cls, grid: ReplayGrid, knobs: Sequence[str] = KNOBS) -> JointSpace:
        """The space a replayed grid offers to the knobs tuned: their tables; the others held at the grid's top.

        Args:
            grid: the grid (`hw.replay.read_grid`).
            knobs: the knobs tuned, `gpu` among them.

        Returns:
            The `JointSpace`: a tuned knob's table is the grid's; an untuned knob the grid has is held at its highest
            clock (what the replay device plays for it); a knob the grid lacks is not in the configuration.

        Raises:
            DvfsError: an unknown knob, `gpu` not among them, or a tuned knob the grid has no column for.
        """
        unknown = [k for k in knobs if k not in KNOBS]
        if unknown or "gpu" not in knobs:
            raise DvfsError(f"knobs {','.join(knobs)}: tune gpu, optionally with cpu and emc (e.g. gpu,cpu,emc)")
        tables = {"gpu": grid.gpu_mhz, "cpu": grid.cpu_mhz, "emc": grid.emc_mhz}
        lacking = [k for k in knobs if not tables[k]]
        if lacking:
            raise DvfsError(f"{grid.path} has no {'/'.join(f'{k}_mhz' for k in lacking)} column to tune; tune the knobs it "
                            "measured")
        held = {k: t if k in knobs else t[-1:] for k, t in tables.items()}
        return cls(tuple(held["gpu"]), tuple(held["cpu"]), tuple(held["emc"]))

    @property
    def tables(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """(GPU, CPU, EMC) tables, in `KNOBS` order."""
        return self.gpu_mhz, self.cpu_mhz, self.emc_mhz

    @property
    def size(self) -> int:
        """How many configurations the space holds."""
        return math.prod(max(1, len(t)) for t in self.tables)

    @property
    def top(self) -> Setting:
        """Every clock at its highest."""
        return self.setting((len(self.gpu_mhz) - 1, len(self.cpu_mhz) - 1, len(self.emc_mhz) - 1))

    def setting(self, index: tuple[int, int, int]) -> Setting:
        """The configuration at (GPU, CPU, EMC) table positions (a knob not in the configuration: any position)."""
        g, c, m = index
        return Setting(self.gpu_mhz[g], self.cpu_mhz[c] if self.cpu_mhz else None, self.emc_mhz[m] if self.emc_mhz else None)

    def index(self, setting: Setting) -> tuple[int, int, int]:
        """The table positions of a configuration of the space.

        Raises:
            DvfsError: a clock not in its knob's table (or a clock given for a knob the configuration lacks).
        """
        out = []
        for knob, table, value in zip(KNOBS, self.tables, (setting.gpu_mhz, setting.cpu_mhz, setting.emc_mhz)):
            if not table and value is None:
                out.append(-1)
                continue
            try:
                out.append(table.index(value))
            except ValueError:
                raise DvfsError(f"{setting.label()} is not a configuration of the search: {knob} clock {value} is not one of "
                                f"{', '.join(f'{f:g}' for f in table) or 'none'} MHz") from None
        return out[0], out[1], out[2]

    def __iter__(self) -> Iterator[Setting]:
        for g in range(len(self.gpu_mhz)):
            for c in range(max(1, len(self.cpu_mhz))):
                for m in range(max(1, len(self.emc_mhz))):
                    yield self.setting((g, c, m))


@dataclasses.dataclass(frozen=True)
class Measured:
    """One measurement of one configuration: time and energy of the same unit of work (a step, say).

    Attributes:
        setting: the configuration.
        time_s: the time the unit of work took.
        energy_j: the energy it drew.
        gpu_util: the GPU's busy share of that time (0..1), None where the meter did not read it (the curve model's
            power prior needs it).
    """

    setting: Setting
    time_s: float
    energy_j: float
    gpu_util: float | None = None


class TimeEnergy(Protocol):
    """What a measurement callable returns (a replayed `Lookup` is one): the time and energy of one unit of work."""

    @property
    def time_s(self) -> float: ...

    @property
    def energy_j(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class JointResult:
    """What `search` did for one workload.

    Attributes:
        pick: the configuration picked (the best measured one under the objective).
        measured: every measurement, in the order made.
        objective: the objective's name (`energy`, `max-slowdown:1.1`, ...).
    """

    pick: Setting
    measured: tuple[Measured, ...]
    objective: str

    @property
    def configurations(self) -> int:
        """How many distinct configurations were measured."""
        return len({m.setting for m in self.measured})


class _Need(Exception):
    """The replayed search needs a configuration that has not been measured."""

    def __init__(self, setting: Setting):
        super().__init__(setting.label())
        self.setting = setting


class _Spent(Exception):
    """The replayed search needs a configuration past the budget."""


class JointSearch:
    """The ask/tell proposer of a joint search for one workload (module doc).

    Args:
        space: the configurations it may measure.
        objective: `energy`, `edp` or `max-slowdown:X` (an `Objective` or its text).
        budget: the most distinct configurations measured, the top one included (at least 1).
        start_mhz: the GPU axis's first clock (snapped to the table): the production governor's clock for the workload
            where there is one; None: the middle of the table, as the adaptive sweep starts without a governor.
        gpu_clocks: the most clocks the curve model asks for along the GPU axis (at least 2).
        voltage_shape: r of the board's voltage curve (curve.py).
        noise: (relative time noise, relative power noise) of one measurement.
        prior: the board's power prior for the GPU axis's fit, used where every measurement there carries its GPU
            utilisation.

    Raises:
        DvfsError: an unknown objective, a budget below 1 or `gpu_clocks` below 2.
    """

    def __init__(self, space: JointSpace, objective: Objective | str = "energy", *, budget: int = DEFAULT_BUDGET,
                 start_mhz: float | None = None, gpu_clocks: int = GPU_CLOCKS, voltage_shape: float = ORIN_VOLTAGE_SHAPE,
                 noise: tuple[float, float] = DEFAULT_NOISE, prior: PowerPrior | None = None):
        if budget < 1:
            raise DvfsError(f"a joint search's budget is at least 1 configuration, got {budget}")
        if gpu_clocks < 2:
            raise DvfsError(f"the GPU axis needs at least 2 clocks for its curve, got gpu_clocks={gpu_clocks}")
        self.space = space
        self.objective = parse_objective(objective) if isinstance(objective, str) else objective
        self.budget = int(budget)
        self.start_mhz = start_mhz
        self.gpu_clocks = int(gpu_clocks)
        self.voltage_shape = voltage_shape
        self.noise = noise
        self.prior = prior

    def next_configuration(self, measured: Sequence[Measured]) -> Setting | None:
        """The configuration to measure next, from the measurements so far.

        Args:
            measured: every measurement of this workload so far, in any order (repeats of a configuration averaged).

        Returns:
            A configuration of the space not yet measured; None once the search has ended or the budget is spent.

        Raises:
            DvfsError: a measurement of a configuration outside the space, or with a time or energy that is not a
                finite number > 0.
        """
        walk = _Walk(self, _means(self.space, measured))
        try:
            walk.run()
        except _Need as need:
            return need.setting
        except _Spent:
            return None
        return None

    def pick(self, measured: Sequence[Measured]) -> Setting:
        """The best measured configuration under the objective: the least cost among those fast enough, else the
        fastest; ties go to the higher clocks.

        Args:
            measured: the workload's measurements (the top configuration among them for `max-slowdown`).

        Returns:
            The configuration.

        Raises:
            DvfsError: no measurement; `max-slowdown` without the top configuration measured; or a measurement as
                `next_configuration` refuses it.
        """
        known = _means(self.space, measured)
        if not known:
            raise DvfsError("nothing measured to pick a configuration from")
        walk = _Walk(self, known)
        return min(known, key=walk.rank)


def search(measure: Callable[[Setting], TimeEnergy], proposer: JointSearch) -> JointResult:
    """Run a joint search for one workload: measure what the proposer asks for until it is done, then pick.

    Args:
        measure: measures one configuration (on replay, `lambda s: device.measure_setting(workload, s)`); what it returns
            may carry a `gpu_util` (0..1) for the curve model's power prior.
        proposer: the `JointSearch` (space, objective, budget, ...).

    Returns:
        The `JointResult`.

    Raises:
        DvfsError: as the proposer and `measure` raise it.
    """
    measured: list[Measured] = []
    while (setting := proposer.next_configuration(measured)) is not None:
        found = measure(setting)
        measured.append(Measured(setting, float(found.time_s), float(found.energy_j), getattr(found, "gpu_util", None)))
    return JointResult(proposer.pick(measured), tuple(measured), proposer.objective.name)


def _means(space: JointSpace, measured: Sequence[Measured]) -> dict[Setting, Measured]:
    """Each configuration's measurements as one (their mean), in the order first measured; checked (see raises)."""
    runs: dict[Setting, list[Measured]] = {}
    for m in measured:
        space.index(m.setting)
        if not all(math.isfinite(x) and x > 0 for x in (m.time_s, m.energy_j)):
            raise DvfsError(f"the measurement at {m.setting.label()} has time_s={m.time_s!r}, energy_j={m.energy_j!r}; "
                            "each needs a time and an energy > 0")
        runs.setdefault(m.setting, []).append(m)
    out = {}
    for setting, ms in runs.items():
        utils = [m.gpu_util for m in ms if m.gpu_util is not None]
        out[setting] = Measured(setting, math.fsum(m.time_s for m in ms) / len(ms), math.fsum(m.energy_j for m in ms) / len(ms),
                                math.fsum(utils) / len(utils) if len(utils) == len(ms) else None)
    return out


class _Walk:
    """One replay of the search (module doc) over the measurements known: `value` looks a configuration up or stops
    the replay with the one needed (`_Need`) or with the budget spent (`_Spent`)."""

    def __init__(self, search_: JointSearch, known: dict[Setting, Measured]):
        self.s = search_
        self.space = search_.space
        self.known = known
        self.visited: dict[Setting, Measured] = {}  # what the replay has looked at so far, in order

    def value(self, setting: Setting) -> Measured:
        found = self.known.get(setting)
        if found is None:
            if len(self.known) >= self.s.budget:
                raise _Spent
            raise _Need(setting)
        self.visited.setdefault(setting, found)
        return found

    def rank(self, setting: Setting) -> tuple[float, ...]:
        """A configuration's place (lower is better): feasible ones by cost, then infeasible ones by time; ties to the
        higher clocks."""
        m = self.known[setting]
        top = self.known.get(self.space.top)
        if top is None and self.s.objective.kind == "max-slowdown":
            raise DvfsError(f"{self.s.objective.name} is judged against the top configuration ({self.space.top.label()}); "
                            "measure it first")
        cost = self.s.objective.costs({0: m.energy_j}, {0: m.time_s}, top.time_s if top else m.time_s)[0]
        higher = tuple(-(x or 0.0) for x in (setting.gpu_mhz, setting.cpu_mhz, setting.emc_mhz))
        return (0.0, cost, *higher) if math.isfinite(cost) else (1.0, m.time_s, *higher)

    def key(self, index: tuple[int, int, int]) -> tuple[float, ...]:
        setting = self.space.setting(index)
        self.value(setting)
        return self.rank(setting)

    def best(self) -> tuple[int, int, int]:
        """The best configuration the replay has looked at."""
        return self.space.index(min(self.visited, key=self.rank))

    def run(self) -> None:
        space = self.space
        top = space.index(space.top)
        self.key(top)
        g = self._gpu_axis(top)
        cur = (g, top[1], top[2])
        while self.key(cur)[0] > 0 and cur[0] < top[0]:  # too slow for the objective: up the GPU table
            cur = (cur[0] + 1, cur[1], cur[2])
        for axis in (1, 2):
            if len(space.tables[axis]) > 1:
                self._golden(cur, axis)
                cur = self.best()
        self._compass(cur)

    def _gpu_axis(self, top: tuple[int, int, int]) -> int:
        """The curve model's pick along the GPU axis (CPU and EMC at their top), after measuring what it asks for."""
        table = list(self.space.gpu_mhz)
        if len(table) == 1:
            return 0
        start = table[len(table) // 2] if self.s.start_mhz is None else float(self.s.start_mhz)
        cut: list[Measurement] = []
        while (f := next_clock(cut, table, start, max_clocks=self.s.gpu_clocks, voltage_shape=self.s.voltage_shape,
                               noise=self.s.noise, prior=self.s.prior)) is not None:
            m = self.value(self.space.setting((table.index(f), top[1], top[2])))
            cut.append(Measurement(f, m.time_s, m.energy_j, m.gpu_util))
        fit = fit_curve(cut, voltage_shape=self.s.voltage_shape, f_max_mhz=table[-1], noise=self.s.noise, prior=self.s.prior)
        predicted = fit.predict(table)
        chosen = self.s.objective.best({p.freq_mhz: p.energy_j for p in predicted}, {p.freq_mhz: p.time_s for p in predicted},
                                       self.value(self.space.top).time_s)
        return table.index(chosen)

    def _golden(self, at: tuple[int, int, int], axis: int) -> None:
        """Golden-section search along one axis through `at`, down to a bracket of at most three table positions, each
        of which is then looked at (a configuration measured before costs nothing)."""
        def along(i: int) -> tuple[int, int, int]:
            index = list(at)
            index[axis] = i
            return index[0], index[1], index[2]

        lo, hi = 0, len(self.space.tables[axis]) - 1
        while hi - lo > 2:
            b = lo + round((hi - lo) * (1.0 - _GOLDEN))
            c = max(b + 1, lo + round((hi - lo) * _GOLDEN))
            if self.key(along(b)) <= self.key(along(c)):
                hi = c
            else:
                lo = b
        for i in range(lo, hi + 1):
            self.key(along(i))

    def _compass(self, cur: tuple[int, int, int]) -> None:
        """Move to the best of the configurations one table step away along one knob while it improves."""
        while True:
            steps = []
            for axis, table in enumerate(self.space.tables):
                for step in (-1, 1):
                    index = list(cur)
                    index[axis] += step
                    if len(table) > 1 and 0 <= index[axis] < len(table):
                        steps.append((index[0], index[1], index[2]))
            if not steps:
                return
            best = min(steps, key=self.key)
            if self.key(best) >= self.key(cur):
                return
            cur = best
