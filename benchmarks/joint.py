"""The joint (GPU, CPU, EMC) search on a real measured grid, replayed (REPLAYED, not simulated).

On the shipped BoFL Jetson AGX Xavier grid (benchmarks/data/public/bofl-agx-xavier.csv: every GPU x CPU x EMC setting,
14 x 29 x 6 = 2,436 per workload, three training workloads; its source and how it was measured in README.md there),
each workload is searched through the replay device (`ReplayDevice.measure_setting`) by the product's joint search
(`dvfs_mlops.model.joint`: the GPU axis by the curve model from the top setting, golden-section along CPU then EMC, a
compass search to finish) within a budget of configurations, for each objective (`energy`, `max-slowdown:1.10`).
Reported per workload and objective:

- configurations measured: the distinct settings the device looked up (`looked_up`, a sweep's `points_measured`);
- regret: cost(pick) / cost(the grid's measured joint optimum) - 1, the optimum over all 2,436 settings under the
  objective (targets: within 2 % at <= 20 configurations for `energy`; at `max-slowdown:1.10` the headroom over the
  GPU-only optimum is small, so the pick must be close: about 1.3 % for ViT);
- saving against all clocks at max (1 - E / E(top setting)) of the joint pick, next to the GPU-only optimum's (the best
  GPU clock with CPU and EMC at their top, under the same objective; target for `energy`: >= 5 points above it) and
  the joint optimum's (the ceiling).

The candidates the strategy was chosen from run on the same grid, budget and objectives (their regrets side by side):
`coordinate` (the product), `separable` (a curve model per axis: `curve.next_clock` and `fit_curve` along GPU, then
CPU, then EMC, each through the previous axis's pick, multiplied into one model of the grid whose best predicted
settings are measured in turn), `tpe` (Optuna's TPE, multivariate, with the time limit as a constraint, seeded with what
the product's search measures along the GPU axis alone: its curve-model pick and that pick's neighbours), `random`
(uniform, the top setting first) and, with `--gp` (it needs torch and takes minutes), `gp` (Optuna's GPSampler seeded
the same way). Seeded candidates are averaged over `--seeds` seeds.

The grid holds one measurement per setting (the mean of 10 steps; no repeats), so its surface carries that draw's
noise: the notes count its local minima, the settings within 2 % of the optimum, how far the optimum dips below the
mean of its CPU neighbours, and the pick's regret on that smoothed surface (what the pick is worth once the dip is
averaged out). Nothing here writes anything.

    python -m benchmarks.joint                       # the tables and the notes
    python -m benchmarks.joint --gp --seeds 3        # with Optuna's GP sampler too
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dvfs_mlops.clocks import Setting
    from dvfs_mlops.model.governor.objectives import Objective
    from dvfs_mlops.model.joint import JointSpace, Measured, TimeEnergy

DATA = Path(__file__).resolve().parent / "data" / "public"
GRID = "bofl-agx-xavier"
BOARD = "Jetson AGX Xavier"
OBJECTIVES = ("energy", "max-slowdown:1.10")
BUDGET = 20
SEEDS = 5
REGRET_TARGET = 0.02  # energy: the pick within 2 % of the grid's joint optimum
SAVING_MARGIN = 0.05  # energy: the joint pick's saving at least 5 points above the GPU-only optimum's
CANDIDATES = ("coordinate", "separable", "tpe", "random")
REDRAWS = 10
MAX_TRIALS = 20  # an Optuna candidate's trials per configuration of the budget (it may suggest a setting again)


@dataclasses.dataclass(frozen=True)
class Surface:
    """One workload of the grid: its time and energy at every setting, and the objective's view of them."""

    workload: str
    space: JointSpace
    time_s: dict[Setting, float]
    energy_j: dict[Setting, float]

    @property
    def top(self) -> Setting:
        return self.space.top

    def costs(self, objective: Objective) -> dict[Setting, float]:
        """Each setting's cost under the objective (infinite where too slow)."""
        return objective.costs(self.energy_j, self.time_s, self.time_s[self.top])

    def optimum(self, objective: Objective, settings: Sequence[Setting] | None = None) -> Setting:
        """The least-cost setting (of `settings`, default every one); ties to the higher clocks."""
        costs = self.costs(objective)
        return min(settings or list(costs), key=lambda s: (costs[s], -s.gpu_mhz, -s.cpu_mhz, -s.emc_mhz))

    def gpu_only(self) -> list[Setting]:
        """The GPU knob alone: every GPU clock, CPU and EMC at their top."""
        return [s for s in self.space if (s.cpu_mhz, s.emc_mhz) == (self.top.cpu_mhz, self.top.emc_mhz)]

    def regret(self, objective: Objective, pick: Setting) -> float:
        costs = self.costs(objective)
        return costs[pick] / costs[self.optimum(objective)] - 1.0

    def saving(self, setting: Setting) -> float:
        return 1.0 - self.energy_j[setting] / self.energy_j[self.top]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One search of one workload under one objective."""

    candidate: str
    workload: str
    objective: str
    seed: int
    pick: Setting
    measured: int  # distinct settings looked up on the replay device
    regret: float
    saving: float
    seconds: float


def surfaces(path: Path) -> list[Surface]:
    """Every workload of the grid at `path`, in the file's order."""
    from dvfs_mlops.hw.replay import read_grid
    from dvfs_mlops.model.joint import JointSpace

    grid = read_grid(path)
    space = JointSpace.from_grid(grid)
    out = []
    for w in grid.workloads:
        means = {s: grid.mean(w, s) for s in space}
        out.append(Surface(w, space, {s: m.time_s for s, m in means.items()}, {s: m.energy_j for s, m in means.items()}))
    return out


# -- the candidates: each measures through `measure(setting) -> Lookup` and returns what it measured --------------------

def coordinate(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int, seed: int) -> Setting:
    """The product's joint search (`dvfs_mlops.model.joint`)."""
    from dvfs_mlops.model.joint import JointSearch, search

    return search(measure, JointSearch(space, objective, budget=budget)).pick


def _measured(seen: dict[Setting, TimeEnergy]) -> list[Measured]:
    from dvfs_mlops.model.joint import Measured

    return [Measured(s, m.time_s, m.energy_j) for s, m in seen.items()]


def _pick(space: JointSpace, objective: Objective, seen: dict[Setting, TimeEnergy]) -> Setting:
    from dvfs_mlops.model.joint import JointSearch

    return JointSearch(space, objective).pick(_measured(seen))


def _axis_ratios(space: JointSpace, at: Callable[[Setting], TimeEnergy], fixed: list[int], axis: int) -> tuple[list[float], list[float]]:
    """The curve model along one axis through `fixed`, fitted to the clocks `curve.next_clock` asks for: each clock's
    predicted (energy, time) over the prediction at `fixed`'s clock, as two lists in table order."""
    from dvfs_mlops.model.curve import Measurement, fit_curve, next_clock

    table = list(space.tables[axis])
    cut: list[Measurement] = []
    while (f := next_clock(cut, table, table[len(table) // 2])) is not None:
        index = list(fixed)
        index[axis] = table.index(f)
        m = at(space.setting((index[0], index[1], index[2])))
        cut.append(Measurement(f, m.time_s, m.energy_j))
    predicted = fit_curve(cut, f_max_mhz=table[-1]).predict(table)
    here = predicted[fixed[axis]]
    return [p.energy_j / here.energy_j for p in predicted], [p.time_s / here.time_s for p in predicted]


def separable(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int, seed: int) -> Setting:
    """A curve model per axis (module doc), multiplied into one model of the grid; its best predictions measured in turn."""
    seen: dict[Setting, TimeEnergy] = {}

    def at(setting: Setting) -> TimeEnergy:
        if setting not in seen:
            seen[setting] = measure(setting)
        return seen[setting]

    top_time = at(space.top).time_s
    fixed = list(space.index(space.top))  # each axis's pick, once its axis is done: the next axes go through it
    ratios = []
    for axis in range(3):
        energy, times = _axis_ratios(space, at, fixed, axis)
        ratios.append((energy, times))
        base = at(space.setting((fixed[0], fixed[1], fixed[2])))
        fixed[axis] = objective.best({i: base.energy_j * r for i, r in enumerate(energy)},
                                     {i: base.time_s * r for i, r in enumerate(times)}, top_time)
    anchor = at(space.setting((fixed[0], fixed[1], fixed[2])))

    def predicted(s: Setting, which: int, value: float) -> float:
        for axis, i in enumerate(space.index(s)):
            value *= ratios[axis][which][i] / ratios[axis][which][fixed[axis]]
        return value

    model_e = {s: predicted(s, 0, anchor.energy_j) for s in space}
    model_t = {s: predicted(s, 1, anchor.time_s) for s in space}
    costs = objective.costs(model_e, model_t, top_time)
    for s in sorted(costs, key=lambda s: (costs[s], -s.gpu_mhz, -(s.cpu_mhz or 0.0), -(s.emc_mhz or 0.0))):
        if len(seen) >= budget or not math.isfinite(costs[s]):
            break
        at(s)
    return _pick(space, objective, seen)


def _seed_trials(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int) -> dict[Setting, TimeEnergy]:
    """What the product's search measures along the GPU axis alone (CPU and EMC at their top): the seeds of an Optuna
    candidate."""
    from dvfs_mlops.model.joint import JointSearch, JointSpace

    gpu_only = JointSpace(space.gpu_mhz, space.cpu_mhz[-1:], space.emc_mhz[-1:])
    seen: dict[Setting, TimeEnergy] = {}
    proposer = JointSearch(gpu_only, objective, budget=budget)
    while (s := proposer.next_configuration(_measured(seen))) is not None:
        seen[s] = measure(s)
    return seen


def _optuna(sampler_of: Callable[[int, Any], Any], space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy],
            budget: int, seed: int) -> Setting:
    """An Optuna sampler over the three knobs' table positions, asked and told one trial at a time, seeded as `tpe` says;
    the time limit of `max-slowdown` is a constraint (time / limit - 1 <= 0)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen = _seed_trials(space, objective, measure, budget)
    top_time = seen[space.top].time_s
    limit = objective.max_slowdown * top_time if objective.kind == "max-slowdown" else None
    # Optuna >= 5 reads a trial's constraints from `Trial.set_constraint`; before it, from the sampler's constraints_func
    per_trial = hasattr(optuna.trial.Trial, "set_constraint")

    def constraints(trial: Any) -> list[float]:
        return [trial.user_attrs["time_s"] / limit - 1.0]  # type: ignore[operator]

    def value(m: TimeEnergy) -> float:
        return m.energy_j * m.time_s if objective.kind == "edp" else m.energy_j

    names = ("gpu", "cpu", "emc")
    dists = {n: optuna.distributions.IntDistribution(0, len(t) - 1) for n, t in zip(names, space.tables)}
    study = optuna.create_study(sampler=sampler_of(seed, constraints if limit is not None and not per_trial else None))
    for s in seen:  # the seeds are told as trials (already measured: nothing is looked up again)
        study.enqueue_trial(dict(zip(names, space.index(s))))
    for _ in range(len(seen) + MAX_TRIALS * budget):
        if len(seen) >= budget and len(study.trials) >= len(seen):
            break
        trial = study.ask(dists)
        s = space.setting(tuple(trial.params[n] for n in names))
        if s not in seen:
            seen[s] = measure(s)
        trial.set_user_attr("time_s", seen[s].time_s)
        if limit is not None and per_trial:
            trial.set_constraint("slowdown", seen[s].time_s / limit - 1.0)
        study.tell(trial, value(seen[s]))
    return _pick(space, objective, seen)


def tpe(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int, seed: int) -> Setting:
    """Optuna's TPE (multivariate), seeded with the GPU axis alone as the product's search measures it."""
    import optuna

    return _optuna(lambda s, c: optuna.samplers.TPESampler(seed=s, multivariate=True, constraints_func=c), space, objective,
                   measure, budget, seed)


def gp(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int, seed: int) -> Setting:
    """Optuna's GPSampler, seeded as `tpe`."""
    import optuna

    return _optuna(lambda s, c: optuna.samplers.GPSampler(seed=s, constraints_func=c, deterministic_objective=True), space,
                   objective, measure, budget, seed)


def random_search(space: JointSpace, objective: Objective, measure: Callable[[Setting], TimeEnergy], budget: int, seed: int) -> Setting:
    """The top setting, then settings drawn uniformly (without replacement) to the budget."""
    import random

    settings = list(space)
    seen = {space.top: measure(space.top)}
    for s in random.Random(seed).sample(settings, len(settings)):
        if len(seen) >= budget:
            break
        if s not in seen:
            seen[s] = measure(s)
    return _pick(space, objective, seen)


SEARCHES: dict[str, Callable[..., Any]] = {"coordinate": coordinate, "separable": separable, "tpe": tpe, "random": random_search,
                                           "gp": gp}
SEEDED = ("tpe", "random", "gp")


def _search_all(candidate: str, objective_text: str, budget: int, seed: int, found: list[Surface],
                measure_of: Callable[[Surface], tuple[Callable[[Setting], TimeEnergy], Callable[[], int]]]) -> list[Outcome]:
    """One candidate on every workload under one objective; `measure_of(surface)` gives (measure, configurations so
    far)."""
    from dvfs_mlops.model.governor.objectives import parse_objective

    objective = parse_objective(objective_text)
    out = []
    for surface in found:
        measure, counted = measure_of(surface)
        t0 = time.perf_counter()
        pick = SEARCHES[candidate](surface.space, objective, measure, budget, seed)
        seconds = time.perf_counter() - t0
        out.append(Outcome(candidate, surface.workload, objective_text, seed, pick, counted(), surface.regret(objective, pick),
                           surface.saving(pick), seconds))
    return out


def evaluate(candidate: str, objective_text: str, budget: int = BUDGET, seed: int = 0,
             found: list[Surface] | None = None) -> list[Outcome]:
    """One candidate on every workload of the grid under one objective, through a fresh replay device: what it measured
    is what the device looked up."""
    from dvfs_mlops.hw.replay import ReplayDevice

    dev = ReplayDevice(DATA / f"{GRID}.csv")

    def measure_of(surface: Surface) -> tuple[Callable[[Setting], TimeEnergy], Callable[[], int]]:
        w = surface.workload
        return (lambda s: dev.measure_setting(w, s)), (lambda: len(dev.looked_up(w)))

    return _search_all(candidate, objective_text, budget, seed, found or surfaces(DATA / f"{GRID}.csv"), measure_of)


@dataclasses.dataclass(frozen=True)
class _Point:
    time_s: float
    energy_j: float


def noise_level(found: list[Surface]) -> tuple[float, float]:
    """The grid's own (time, power) noise per setting: the spread of second differences of log time and log power along
    the CPU axis, over its upper two thirds (where the axis is flat, so curvature adds little), scaled to one setting's
    (a second difference of three independent draws has 1.5 times one draw's variance)."""
    import numpy as np

    logs: dict[str, list[float]] = {"time": [], "power": []}
    for s in found:
        g_n, c_n, m_n = (len(t) for t in s.space.tables)
        for g in range(g_n):
            for m in range(m_n):
                row = [s.space.setting((g, c, m)) for c in range(c_n // 3, c_n)]
                t = np.log([s.time_s[x] for x in row])
                p = np.log([s.energy_j[x] / s.time_s[x] for x in row])
                logs["time"] += list(t[1:-1] - (t[:-2] + t[2:]) / 2)
                logs["power"] += list(p[1:-1] - (p[:-2] + p[2:]) / 2)
    return float(np.std(logs["time"]) / math.sqrt(1.5)), float(np.std(logs["power"]) / math.sqrt(1.5))


def redrawn(found: list[Surface], noise: tuple[float, float], draw: int) -> list[Surface]:
    """The grid with every setting drawn again at `noise` (SIMULATED): time and power each times exp(N(0, sd))."""
    import random

    rng = random.Random(draw)
    out = []
    for s in found:
        t = {x: v * math.exp(rng.gauss(0.0, noise[0])) for x, v in s.time_s.items()}
        e = {x: s.energy_j[x] / s.time_s[x] * math.exp(rng.gauss(0.0, noise[1])) * t[x] for x in s.time_s}
        out.append(Surface(s.workload, s.space, t, e))
    return out


def evaluate_redrawn(candidate: str, objective_text: str, found: list[Surface], noise: tuple[float, float], draws: int,
                     budget: int = BUDGET) -> list[Outcome]:
    """One candidate on `draws` re-drawn grids (`redrawn`), each judged against its own optimum; draw d is seed d."""
    out = []
    for draw in range(draws):
        def measure_of(surface: Surface) -> tuple[Callable[[Setting], TimeEnergy], Callable[[], int]]:
            seen: set[Setting] = set()

            def measure(s: Setting) -> _Point:
                seen.add(s)
                return _Point(surface.time_s[s], surface.energy_j[s])
            return measure, lambda: len(seen)

        out += _search_all(candidate, objective_text, budget, draw, redrawn(found, noise, draw), measure_of)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _clocks(s: Setting) -> str:
    return f"{s.gpu_mhz:g} / {s.cpu_mhz:g} / {s.emc_mhz:g}"


def table(found: list[Surface], outcomes: list[Outcome], objectives: Sequence[str]) -> list[str]:
    """The product's figures per workload and objective (markdown)."""
    from dvfs_mlops.model.governor.objectives import parse_objective

    size = found[0].space.size
    lines = [(f"| workload | objective | configurations measured (of {size:,}) | joint pick, MHz (GPU / CPU / EMC) | "
              "regret vs the grid's joint optimum | saving vs all-max: joint pick / GPU-only optimum / joint optimum |"),
             "|---|---|---|---|---|---|"]
    for text in objectives:
        objective = parse_objective(text)
        for s in found:
            o = next(o for o in outcomes if (o.candidate, o.workload, o.objective) == ("coordinate", s.workload, text))
            gpu = s.optimum(objective, s.gpu_only())
            lines.append(f"| {s.workload} | {text} | {o.measured} | {_clocks(o.pick)} | {_pct(o.regret)} | "
                         f"{_pct(o.saving)} / {_pct(s.saving(gpu))} ({gpu.gpu_mhz:g} MHz) / "
                         f"{_pct(s.saving(s.optimum(objective)))} ({_clocks(s.optimum(objective))}) |")
    return lines


def comparison(found: list[Surface], outcomes: list[Outcome], objectives: Sequence[str], candidates: Sequence[str],
               seeds_are: str = "seeds") -> list[str]:
    """Each candidate's regret per workload and objective (mean over seeds where seeded), configurations and time."""
    head = " | ".join(f"{text}: {s.workload}" for text in objectives for s in found)
    lines = [f"| candidate | {head} | worst | configurations (mean) | seconds per search (mean) |",
             "|---" * (len(objectives) * len(found) + 4) + "|"]
    for c in candidates:
        mine = [o for o in outcomes if o.candidate == c]
        cells = []
        for text in objectives:
            for s in found:
                runs = [o.regret for o in mine if (o.workload, o.objective) == (s.workload, text)]
                spread = f" (max {_pct(max(runs))})" if len(runs) > 1 else ""
                cells.append(f"{_pct(statistics.mean(runs))}{spread}")
        worst = max(statistics.mean([o.regret for o in mine if (o.workload, o.objective) == (s.workload, text)])
                    for text in objectives for s in found)
        seeds = len({o.seed for o in mine})
        name = f"{c} ({seeds} {seeds_are})" if seeds > 1 else c
        lines.append(f"| {name} | {' | '.join(cells)} | {_pct(worst)} | {statistics.mean(o.measured for o in mine):.1f} | "
                     f"{statistics.mean(o.seconds for o in mine):.2f} |")
    return lines


@dataclasses.dataclass(frozen=True)
class Roughness:
    """How rough one workload's energy surface is (module doc)."""

    workload: str
    local_minima: int  # settings cheaper than every setting one table step away along one knob
    near_optimal: int  # settings within REGRET_TARGET of the optimum
    dip: float  # 1 - E(optimum) / (the mean of E over the optimum and its CPU neighbours)
    smoothed_optimum: Setting
    pick_smoothed_regret: float  # the energy pick's regret on the smoothed surface


def roughness(s: Surface, pick: Setting) -> Roughness:
    """The roughness figures of one workload's energy surface, and the energy pick's regret once it is smoothed along
    the CPU axis (each setting's energy averaged with its two CPU neighbours': the finest axis, 77 MHz a step)."""
    space = s.space

    def near(index: tuple[int, int, int]) -> list[Setting]:
        out = []
        for axis, table in enumerate(space.tables):
            for step in (-1, 1):
                i = list(index)
                i[axis] += step
                if 0 <= i[axis] < len(table):
                    out.append(space.setting(tuple(i)))
        return out

    e = s.energy_j
    minima = sum(all(e[x] < e[n] for n in near(space.index(x))) for x in space)
    best = min(e, key=e.__getitem__)

    def smoothed(x: Setting) -> float:
        g, c, m = space.index(x)
        row = [space.setting((g, j, m)) for j in (c - 1, c, c + 1) if 0 <= j < len(space.cpu_mhz)]
        return statistics.mean(e[r] for r in row)

    smooth = {x: smoothed(x) for x in space}
    s_best = min(smooth, key=smooth.__getitem__)
    return Roughness(s.workload, minima, sum(v <= (1 + REGRET_TARGET) * e[best] for v in e.values()), 1.0 - e[best] / smooth[best],
                     s_best, smooth[pick] / smooth[s_best] - 1.0)


def notes(found: list[Surface], outcomes: list[Outcome]) -> list[str]:
    """One line per workload: how rough its energy surface is, and how the energy pick fares there."""
    out = []
    for s in found:
        o = next((o for o in outcomes if (o.candidate, o.workload, o.objective) == ("coordinate", s.workload, "energy")), None)
        if o is None:
            continue
        r = roughness(s, o.pick)
        out.append(f"- {s.workload}: {r.local_minima} local minima over {s.space.size:,} settings (cheaper than every setting "
                   f"one step away); {r.near_optimal} settings within {_pct(REGRET_TARGET)} of the optimum, which lies "
                   f"{_pct(r.dip)} below the mean of its CPU neighbours. Smoothed along CPU, the optimum is "
                   f"{_clocks(r.smoothed_optimum)} MHz; the energy pick {_clocks(o.pick)} MHz is {_pct(o.regret)} from the "
                   f"measured optimum and {_pct(r.pick_smoothed_regret)} from the smoothed one.")
    return out


def results(candidates: Sequence[str] = CANDIDATES, objectives: Sequence[str] = OBJECTIVES, budget: int = BUDGET,
            seeds: int = SEEDS) -> tuple[list[Surface], list[Outcome]]:
    found = surfaces(DATA / f"{GRID}.csv")
    outcomes = []
    for c in candidates:
        for text in objectives:
            for seed in range(seeds if c in SEEDED else 1):
                outcomes += evaluate(c, text, budget, seed, found)
    return found, outcomes


def run() -> list[tuple[str, str, str]]:
    """The benchmark's rows (metric, value, target) for `python -m benchmarks`: the product's search only."""
    from dvfs_mlops.model.governor.objectives import parse_objective

    found, outcomes = results(("coordinate",), OBJECTIVES, BUDGET, 1)
    rows = []
    for o in outcomes:
        s = next(s for s in found if s.workload == o.workload)
        objective = parse_objective(o.objective)
        gpu = s.saving(s.optimum(objective, s.gpu_only()))
        energy = objective.kind == "energy"
        what = f"[{GRID}] {o.workload}, {o.objective}"
        rows.append((f"{what}: configurations measured; regret of the joint pick vs the grid's joint optimum (REPLAYED)",
                     f"{o.measured}; {_pct(o.regret)}", f"<= {BUDGET}; <= {_pct(REGRET_TARGET)}" if energy else f"<= {BUDGET}; -"))
        rows.append((f"{what}: saving vs all-max, joint pick / GPU-only optimum", f"{_pct(o.saving)} / {_pct(gpu)}",
                     f">= GPU-only + {100 * SAVING_MARGIN:.0f} points" if energy else "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--budget", type=int, default=BUDGET, help=f"configurations per workload (default {BUDGET})")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES), help=f"comma-separated (default {','.join(OBJECTIVES)})")
    ap.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds of the seeded candidates (default {SEEDS})")
    ap.add_argument("--redraws", type=int, default=REDRAWS,
                    help=f"re-drawn grids (SIMULATED noise at the grid's own level) to judge the candidates on (default {REDRAWS}; 0: none)")
    ap.add_argument("--gp", action="store_true", help="add Optuna's GPSampler to the candidates (needs torch; minutes)")
    args = ap.parse_args(argv)
    objectives = [t.strip() for t in args.objectives.split(",") if t.strip()]
    candidates = (*CANDIDATES, "gp") if args.gp else CANDIDATES
    found, outcomes = results(candidates, objectives, args.budget, args.seeds)
    print(f"The joint search on {GRID} ({BOARD}; REPLAYED), budget {args.budget} configurations per workload:\n")
    print("\n".join(table(found, outcomes, objectives)))
    print(f"\nCandidates: regret vs the grid's joint optimum, budget {args.budget} (mean over seeds where seeded):\n")
    print("\n".join(comparison(found, outcomes, objectives, candidates)))
    if args.redraws:
        noise = noise_level(found)
        again = [o for c in candidates for text in objectives
                 for o in evaluate_redrawn(c, text, found, noise, args.redraws, args.budget)]
        print(f"\nCandidates on {args.redraws} re-drawn grids (SIMULATED: every setting's time and power drawn again at the "
              f"grid's own noise, {_pct(noise[0])} and {_pct(noise[1])}), each judged against its own optimum: mean regret "
              f"(max):\n")
        print("\n".join(comparison(found, again, objectives, candidates, seeds_are="draws")))
    rough = notes(found, outcomes)
    if rough:
        print("\nHow rough the surface is (one measurement per setting) and how the energy pick fares there:\n" + "\n".join(rough))
    return 0


if __name__ == "__main__":
    sys.exit(main())
