"""Fit a profile's timing and power constants to measured points (`dvfs-mlops twin fit`).

A point is one pinned configuration of one workload (a GPU clock, and the CPU and memory clocks
where it ran them below their tops): the steps it ran (step traces and how often each ran), its
measured time and its CPU + GPU power (the study's energy over that time). Knows nothing of
workloads or MLflow: the command (`twin_fit.py`) builds the points.

What is fitted, and why these constants:
- Timing first (power does not change time): `host_per_step_s` (the fixed per-step overhead),
  `host_per_kernel_s` (host dispatch per launch; `host_per_view_s` keeps its ratio to it),
  `kernel_fixed_s` (per-kernel GPU cost, scales as 1/f) and `eta_compute_flop_ops` (matmul
  efficiency; `eta_compute_other` keeps its ratio). Together they set the launch-bound floor,
  the compute-bound slope in 1/f and where one turns into the other; with points below the CPU
  table's top, `cpu_bound_share` too (how much of the host's time follows the CPU clock). Peak rates,
  the clock tables and DRAM bandwidth are datasheet facts, not fitted. Least squares on log(time).
- Power, on the fitted timing: the GPU rail's static part, its dynamic coefficient k, its idle
  share, and the shape of V(f) (the share r of V(fmax) that rises with (f/fmax)^2). V(fmax)
  itself stays the base profile's: only k V^2 is observable, k absorbs the scale. For a given
  shape the CPU + GPU power is linear in (static, k, k * idle share), so those come from a
  bounded linear least-squares solve, and r from a 1-D search. The CPU rail's constants stay
  the base profile's (its power at each point's CPU clock is theirs, physics.py `rail_terms`):
  CPU + GPU energy alone cannot tell the CPU's base power from the GPU rail's static part (both
  are constant at one CPU clock), so the static part absorbs any difference. A memory clock
  below its top moves a point's time through the DRAM bandwidth (a data-sheet fact, not fitted).
Relative errors are reported per quantity (time, power, energy), before and after the fit.

A measured grid of every (GPU, CPU, EMC) setting without step traces (BoFL's, `fit_grid`) is fitted differently: each
workload is a `StepWork` (its host, GPU compute and DRAM work, and how they overlap), fitted together with the board's
constants on a random share of the settings (`split_settings`), and judged on the rest (`grid_errors`). What such a grid
can tell apart, and so what is fitted:
- time: per workload its four amounts of work and two overlaps; per board how the host follows the CPU clock
  (`cpu_bound_share`, `cpu_reserved_mhz`). Clock tables are the grid's; DRAM bandwidth and eta_memory are the caller's
  (data sheet), since bytes and bandwidth enter only as their ratio.
- power: a grid whose energy sums the board's rails knows each rail only through how it moves with the clocks and the
  loads: the GPU's k, idle share and V(f) shape, the CPU's switching amplitude, V(f) shape and busy term, the DRAM's
  clock-following amplitude and per-byte term, and one constant. The constant cannot be split among rails, so it is all
  put in `gpu_static_w` (the other rails' constant parts 0: `sys_5v0_w` = 0, `cpu_clock_share` = `ddr_clock_share` = 1).
  Energy, time and power per setting are what the fit promises, not the split of the constant among rails.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.replay import ReplayGrid, Setting
from dvfs_mlops.hw.twin.params import OrinTwinParams, read_yaml_mapping
from dvfs_mlops.hw.twin.physics import StepEstimate, estimate_step, work_grid
from dvfs_mlops.hw.twin.trace import StepTrace, StepWork

TIMING_CONSTANTS = ("host_per_step_s", "host_per_kernel_s", "kernel_fixed_s", "eta_compute_flop_ops")
POWER_CONSTANTS = ("gpu_static_w", "gpu_k", "gpu_idle_dynamic_share", "volt_v0", "volt_v1")
# Companions: constants that keep their ratio to a fitted one (too weakly observed to fit apart).
_COMPANIONS = {"host_per_kernel_s": "host_per_view_s", "eta_compute_flop_ops": "eta_compute_other"}


@dataclasses.dataclass(frozen=True)
class FitPoint:
    """One workload at one pinned configuration: the steps it ran, and what was measured (the CPU and memory clocks
    None where they were at their tables' tops, as in a GPU-only sweep)."""

    workload: str
    freq_mhz: float
    steps: tuple[tuple[StepTrace, int], ...]  # (trace, how many steps ran it)
    time_s: float
    power_w: float  # CPU + GPU, energy_j / time_s
    # On the twin: the noise-free values of the same point (time_expected_s, energy_expected_j), else None.
    time_expected_s: float | None = None
    energy_expected_j: float | None = None
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    @property
    def energy_j(self) -> float:
        return self.power_w * self.time_s

    @property
    def setting(self) -> Setting:
        """The configuration the point ran at."""
        return Setting(self.freq_mhz, self.cpu_mhz, self.emc_mhz)

    @property
    def truth(self) -> FitPoint | None:
        """The point as its noise-free values (twin points only)."""
        if not self.time_expected_s or not self.energy_expected_j:
            return None
        return dataclasses.replace(self, time_s=self.time_expected_s, power_w=self.energy_expected_j / self.time_expected_s)


@dataclasses.dataclass(frozen=True)
class QuantityError:
    """Relative error |predicted / measured - 1| over the points."""

    mean: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return {"mean_rel": self.mean, "max_rel": self.max}


@dataclasses.dataclass(frozen=True)
class FitResult:
    params: OrinTwinParams
    base: OrinTwinParams
    n_points: int
    n_workloads: int
    errors: dict[str, QuantityError]  # time, power, energy: the fitted profile
    errors_before: dict[str, QuantityError]  # the same for the base profile
    fitted: tuple[str, ...]
    # Twin points: the fitted profile against their noise-free values (what a fit can reach), else None.
    errors_expected: dict[str, QuantityError] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.params.profile, "base_profile": self.base.profile, "n_points": self.n_points,
                "n_workloads": self.n_workloads, "fitted": list(self.fitted),
                "constants": {k: getattr(self.params, k) for k in self.fitted},
                "errors": {k: v.to_dict() for k, v in self.errors.items()},
                "errors_base": {k: v.to_dict() for k, v in self.errors_before.items()},
                "errors_expected": None if self.errors_expected is None else {k: v.to_dict() for k, v in self.errors_expected.items()}}


def predict(points: Sequence[FitPoint], p: OrinTwinParams) -> dict[str, np.ndarray]:
    """The twin's noise-free time (s), CPU + GPU power (W) and energy (J) of every point."""
    memo: dict[tuple[str, Setting], StepEstimate] = {}
    t, e = np.zeros(len(points)), np.zeros(len(points))
    for i, pt in enumerate(points):
        for trace, n in pt.steps:
            est = _step(memo, trace, pt.setting, p)
            t[i] += n * est.time_s
            e[i] += n * est.energy_j
    return {"time": t, "power": e / t, "energy": e}


def errors(points: Sequence[FitPoint], p: OrinTwinParams) -> dict[str, QuantityError]:
    pred = predict(points, p)
    measured = {"time": np.array([x.time_s for x in points]), "power": np.array([x.power_w for x in points]),
                "energy": np.array([x.energy_j for x in points])}
    out = {}
    for q in ("time", "power", "energy"):
        rel = np.abs(pred[q] / measured[q] - 1.0)
        out[q] = QuantityError(float(rel.mean()), float(rel.max()))
    return out


def fit_profile(points: Sequence[FitPoint], base: OrinTwinParams, name: str, *, fit_timing: bool = True,
                fit_power: bool = True) -> FitResult:
    """Fit `base`'s timing, then its power constants, to `points`; the result is named `name`."""
    points = [pt for pt in points if pt.time_s > 0 and pt.power_w > 0 and pt.steps]
    workloads = {pt.workload for pt in points}
    clocks = {pt.freq_mhz for pt in points}
    if len(points) < 3 or len(clocks) < 2:
        raise DvfsError(f"twin fit needs measured points at 2 or more pinned clocks (3 or more points); got {len(points)} "
                        f"point(s) at {len(clocks)} clock(s)")
    p = dataclasses.replace(base, profile=name)
    fitted: tuple[str, ...] = ()
    if fit_timing:
        timing = _timing_constants(points, p)
        p = _fit_timing(points, p, timing)
        fitted += timing
    if fit_power:
        p = _fit_power(points, p)
        fitted += POWER_CONSTANTS
    truths = [pt.truth for pt in points]
    expected = errors([t for t in truths if t is not None], p) if all(t is not None for t in truths) else None
    return FitResult(p, base, len(points), len(workloads), errors(points, p), errors(points, base), fitted, expected)


def _step(memo: dict[tuple[str, Setting], StepEstimate], trace: StepTrace, setting: Setting, p: OrinTwinParams) -> StepEstimate:
    key = (trace.key, setting)
    if key not in memo:
        memo[key] = estimate_step(trace, setting, p)
    return memo[key]


def _timing_constants(points: Sequence[FitPoint], p: OrinTwinParams) -> tuple[str, ...]:
    """TIMING_CONSTANTS, and `cpu_bound_share` where some point ran below the CPU table's top (only then is it seen)."""
    below_top = any(pt.cpu_mhz is not None and pt.cpu_mhz < p.cpu_max_mhz for pt in points)
    return TIMING_CONSTANTS + (("cpu_bound_share",) if below_top else ())


def _with_timing(p: OrinTwinParams, x: np.ndarray, names: Sequence[str] = TIMING_CONSTANTS) -> OrinTwinParams:
    values = dict(zip(names, np.exp(x)))
    values["eta_compute_flop_ops"] = min(1.0, values["eta_compute_flop_ops"])
    if "cpu_bound_share" in values:
        values["cpu_bound_share"] = min(1.0, values["cpu_bound_share"])
    changes: dict[str, float] = {k: float(v) for k, v in values.items()}
    for lead, companion in _COMPANIONS.items():
        changes[companion] = min(1.0 if companion.startswith("eta") else np.inf,
                                 getattr(p, companion) * changes[lead] / getattr(p, lead))
    return dataclasses.replace(p, **cast(dict[str, Any], changes))


def _fit_timing(points: Sequence[FitPoint], p: OrinTwinParams, names: Sequence[str] = TIMING_CONSTANTS) -> OrinTwinParams:
    from scipy.optimize import least_squares

    measured = np.log([pt.time_s for pt in points])
    x0 = np.log([max(getattr(p, k), 0.05) if k == "cpu_bound_share" else getattr(p, k) for k in names])
    # a factor of 30 either way around the base profile; efficiencies and the CPU-bound share at most 1
    lo = x0 - np.log(30.0)
    hi = x0 + np.log(30.0)
    for capped in ("eta_compute_flop_ops", "cpu_bound_share"):
        if capped in names:
            hi[list(names).index(capped)] = 0.0
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(points, _with_timing(p, x, names))["time"]) - measured

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, xtol=1e-10, ftol=1e-12, max_nfev=200)
    return _with_timing(p, sol.x, names)


def _power_design(points: Sequence[FitPoint], p: OrinTwinParams) -> tuple[np.ndarray, ...]:
    """Per point: T, CPU energy (fixed constants), and per step sums for the GPU rail's linear terms."""
    memo: dict[tuple[str, Setting], StepEstimate] = {}
    n = len(points)
    T, cpu, x2, util_g, idle_g = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for i, pt in enumerate(points):
        f = pt.freq_mhz
        x2[i] = (f / p.max_mhz) ** 2
        for trace, c in pt.steps:
            est = _step(memo, trace, pt.setting, p)
            t, u = c * est.time_s, est.gpu_util
            T[i] += t
            cpu[i] += t * est.power_by_rail_w["VDD_CPU_CV"]
            util_g[i] += t * u * f / 1000.0
            idle_g[i] += t * (1.0 - u) * f / 1000.0
    return T, cpu, x2, util_g, idle_g


def _fit_power(points: Sequence[FitPoint], p: OrinTwinParams) -> OrinTwinParams:
    from scipy.optimize import lsq_linear, minimize_scalar

    T, cpu, x2, util_g, idle_g = _power_design(points, p)
    scale = T * np.array([pt.power_w for pt in points])  # relative residuals in power: P_pred / P_measured - 1
    v_top = p.volt_v0 + p.volt_v1

    def solve(r: float) -> tuple[float, np.ndarray]:
        v2 = (v_top * ((1.0 - r) + r * x2)) ** 2
        a = np.column_stack([T, v2 * util_g, v2 * idle_g]) / scale[:, None]
        b = 1.0 - cpu / scale
        sol = lsq_linear(a, b, bounds=([0.0, 1e-6, 0.0], [np.inf, np.inf, np.inf]))
        return float(np.sum((a @ sol.x - b) ** 2)), sol.x

    grid = np.linspace(0.0, 1.0, 41)
    costs = [solve(r)[0] for r in grid]
    j = int(np.argmin(costs))
    best = minimize_scalar(lambda r: solve(r)[0], bounds=(grid[max(0, j - 1)], grid[min(len(grid) - 1, j + 1)]), method="bounded",
                           options={"xatol": 1e-6})
    r = float(best.x) if best.fun <= costs[j] else float(grid[j])
    _, (static, k, k_idle) = solve(r)
    return dataclasses.replace(p, gpu_static_w=float(static), gpu_k=float(k), gpu_idle_dynamic_share=float(min(1.0, k_idle / k)),
                               volt_v0=float(v_top * (1.0 - r)), volt_v1=float(v_top * r))


# --- a grid of (GPU, CPU, EMC) settings without traces ---------------------------------------------------------------
GRID_FIT_SHARE = 0.15  # the share of a grid's settings the twin is fitted on; the rest judge it
_OVERLAP_MAX = 64.0  # an overlap this large is max(a, b) to within 1 %


@dataclasses.dataclass(frozen=True)
class GridSplit:
    """Which settings of a grid fit the twin and which judge it (`split_settings`).

    Attributes:
        share: the share of the settings fitted.
        seed: the random permutation's seed.
        fitted: the settings fitted.
        judged: every other setting.
    """

    share: float
    seed: int
    fitted: frozenset[Setting]
    judged: frozenset[Setting]


def grid_settings(grid: ReplayGrid) -> tuple[Setting, ...]:
    """Every setting the grid measured, ordered by GPU, CPU and EMC clock."""
    found = {r.setting for r in grid.rows}
    return tuple(sorted(found, key=lambda s: (s.gpu_mhz, s.cpu_mhz or 0.0, s.emc_mhz or 0.0)))


def split_settings(settings: Sequence[Setting], share: float = GRID_FIT_SHARE, seed: int = 0) -> GridSplit:
    """A seeded random `share` of `settings` (at least one) to fit on, the others to judge on.

    Args:
        settings: the grid's settings, in `grid_settings` order (the split depends on it).
        share: the share fitted, 0 < share < 1.
        seed: the permutation's seed.

    Returns:
        The `GridSplit`.
    """
    if not 0 < share < 1:
        raise DvfsError(f"the share of a grid's settings to fit on must be between 0 and 1, got {share!r}")
    order = np.random.default_rng(seed).permutation(len(settings))
    k = max(1, round(share * len(settings)))
    fitted = frozenset(settings[i] for i in order[:k])
    return GridSplit(share, seed, fitted, frozenset(settings) - fitted)


def domain_of(setting: Setting, top: Setting) -> str:
    """Which clocks a setting moves off the grid's top: "gpu", "cpu+emc", ... ("top" for none)."""
    moved = [name for name, value, highest in (("gpu", setting.gpu_mhz, top.gpu_mhz), ("cpu", setting.cpu_mhz, top.cpu_mhz),
                                               ("emc", setting.emc_mhz, top.emc_mhz)) if value != highest]
    return "+".join(moved) or "top"


@dataclasses.dataclass(frozen=True)
class GridErrors:
    """A fitted twin's relative errors |twin / grid - 1| per setting (time, power and energy), on a set of settings.

    Attributes:
        n: how many (workload, setting) pairs were judged.
        overall: every pair.
        by_workload: per workload.
        by_domain: per `domain_of` (which clocks the setting moves off the top).
    """

    n: int
    overall: dict[str, QuantityError]
    by_workload: dict[str, dict[str, QuantityError]]
    by_domain: dict[str, dict[str, QuantityError]]

    def to_dict(self) -> dict[str, Any]:
        def table(errs: dict[str, QuantityError]) -> dict[str, Any]:
            return {q: e.to_dict() for q, e in errs.items()}

        return {"n": self.n, "overall": table(self.overall), "workloads": {w: table(e) for w, e in self.by_workload.items()},
                "domains": {d: table(e) for d, e in self.by_domain.items()}}


@dataclasses.dataclass(frozen=True)
class GridFit:
    """A twin fitted to a grid of settings: the board, each workload's work, the split, and the errors.

    Attributes:
        params: the board's constants (its clock tables the grid's).
        work: each workload's `StepWork`, in the grid's workload order.
        split: the settings fitted and judged.
        judged: the errors on the judged settings (what the fit is reported by).
        fitted_errors: the errors on the fitted settings.
        source: the grid's file name and SHA-256.
    """

    params: OrinTwinParams
    work: tuple[StepWork, ...]
    split: GridSplit
    judged: GridErrors
    fitted_errors: GridErrors
    source: tuple[str, str]


def grid_errors(grid: ReplayGrid, params: OrinTwinParams, work: Iterable[StepWork], settings: Collection[Setting]) -> GridErrors:
    """The twin's relative errors on `settings` of every workload of `work` (the grid's mean of each setting's repeats).

    Args:
        grid: the measured grid.
        params: the twin's board.
        work: the workloads' work (keys: the grid's workload names).
        settings: the settings judged.

    Returns:
        The `GridErrors`.
    """
    order = sorted(settings, key=lambda s: (s.gpu_mhz, s.cpu_mhz or 0.0, s.emc_mhz or 0.0))
    top = grid.top
    rel: dict[str, list[np.ndarray]] = {"time": [], "power": [], "energy": []}
    labels: list[tuple[str, str]] = []
    for w in work:
        measured = _measured(grid, w.key, order)
        predicted = work_grid(w, *_clock_arrays(order), params)
        e_pred = predicted.energy_total_j
        rel["time"].append(np.abs(predicted.time_s / measured[0] - 1.0))
        rel["energy"].append(np.abs(e_pred / measured[1] - 1.0))
        rel["power"].append(np.abs((e_pred / predicted.time_s) / (measured[1] / measured[0]) - 1.0))
        labels += [(w.key, domain_of(s, top)) for s in order]
    flat = {q: np.concatenate(v) for q, v in rel.items()}
    workloads = np.array([w for w, _ in labels])
    domains = np.array([d for _, d in labels])

    def summary(mask: np.ndarray) -> dict[str, QuantityError]:
        return {q: QuantityError(float(v[mask].mean()), float(v[mask].max())) for q, v in flat.items()}

    return GridErrors(len(labels), summary(np.ones(len(labels), bool)),
                      {w: summary(workloads == w) for w in dict.fromkeys(workloads.tolist())},
                      {d: summary(domains == d) for d in sorted(set(domains.tolist()))})


def _clock_arrays(settings: Sequence[Setting]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([s.gpu_mhz for s in settings]), np.array([s.cpu_mhz for s in settings], dtype=float),
            np.array([s.emc_mhz for s in settings], dtype=float))


def _measured(grid: ReplayGrid, workload: str, settings: Sequence[Setting]) -> tuple[np.ndarray, np.ndarray]:
    means = [grid.mean(workload, s) for s in settings]
    return np.array([m.time_s for m in means]), np.array([m.energy_j for m in means])


# The fitted board constants, in the fit vector's order, with their bounds. Clock-following amplitudes in W; shares and
# V(f) shapes (the share r of V(top) that rises with (f / top)^2) in 0..1.
_BOARD = (("cpu_bound_share", 0.0, 1.0), ("cpu_reserved_mhz", 0.0, None), ("constant_w", 0.0, 200.0), ("gpu_k", 1e-3, 500.0),
          ("gpu_idle_dynamic_share", 0.0, 1.0), ("gpu_volt_shape", 0.0, 1.0), ("cpu_switching_w", 0.0, 100.0),
          ("cpu_volt_shape", 0.0, 1.0), ("cpu_busy_w", 0.0, 100.0), ("ddr_clock_w", 0.0, 50.0), ("ddr_per_bw_w", 0.0, 200.0))
_WORK = ("host_serial_s", "host_dispatch_s", "gpu_compute_s", "dram_bytes")  # fitted as logs


def fit_grid(grid: ReplayGrid, base: OrinTwinParams, name: str, family: str, *, share: float = GRID_FIT_SHARE,
             seed: int = 0) -> GridFit:
    """Fit a board and each workload's `StepWork` to a grid of (GPU, CPU, EMC) settings (least squares on log time and
    log power of the fitted settings), and judge the result on the other settings.

    Args:
        grid: a measured grid with `cpu_mhz` and `emc_mhz` columns, every workload at every setting; its energy must
            be the sum of the rails the twin models (GPU, CPU, DRAM, board).
        base: the board's published facts the grid cannot tell (`dram_bw_bytes_s`, `eta_memory`, `cuda_cores`, ...) and
            the top voltages of its V(f) shapes.
        name: the fitted board's profile name.
        family: its board family.
        share: the share of settings fitted.
        seed: the split's seed.

    Returns:
        The `GridFit`.

    Raises:
        DvfsError: the grid has no CPU or EMC clocks, or a workload misses a setting.
    """
    from scipy.optimize import least_squares

    if not grid.cpu_mhz or not grid.emc_mhz:
        raise DvfsError(f"{grid.path} has no cpu_mhz or emc_mhz column: a grid of GPU clocks alone is fitted by `twin fit --csv`")
    settings = grid_settings(grid)
    split = split_settings(settings, share, seed)
    board = dataclasses.replace(base, profile=name, family=family, frequencies_mhz=grid.gpu_mhz, cpu_frequencies_mhz=grid.cpu_mhz,
                                emc_frequencies_mhz=grid.emc_mhz, sys_5v0_w=0.0, cpu_clock_share=1.0, ddr_clock_share=1.0,
                                cpu_volt_min=0.0)
    fitted = sorted(split.fitted, key=lambda s: (s.gpu_mhz, s.cpu_mhz or 0.0, s.emc_mhz or 0.0))
    clocks = _clock_arrays(fitted)
    measured = {w: _measured(grid, w, fitted) for w in grid.workloads}
    unpack = _Unpack(board, grid.workloads)

    def residuals(x: np.ndarray) -> np.ndarray:
        params, works = unpack(x)
        out = []
        for w in works:
            pred = work_grid(w, *clocks, params)
            t, e = measured[w.key]
            out += [np.log(pred.time_s / t), np.log(pred.total_power_w / (e / t))]
        return np.concatenate(out)

    x0, lo, hi = unpack.start(grid)
    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", max_nfev=4000, xtol=1e-10, ftol=1e-12)
    params, works = unpack(sol.x)
    return GridFit(params, tuple(works), split, grid_errors(grid, params, works, split.judged),
                   grid_errors(grid, params, works, split.fitted), (Path(grid.path).name, grid.sha256))


class _Unpack:
    """The fit vector <-> the board's constants and the workloads' work."""

    def __init__(self, board: OrinTwinParams, workloads: Sequence[str]):
        self.board, self.workloads = board, tuple(workloads)
        self.gpu_top_v = float(board.voltage(board.max_mhz))
        self.cpu_top_v = float(board.cpu_voltage(board.cpu_max_mhz))

    def start(self, grid: ReplayGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A start inside the bounds, and the bounds."""
        b = self.board
        x0 = [0.9, 0.0, 5.0, b.gpu_k, b.gpu_idle_dynamic_share, 0.5, 2.0, 0.5, 0.5, 1.0, b.ddr_per_bw_w]
        lo = [low for _, low, _ in _BOARD]
        hi = [high if high is not None else 0.9 * min(b.cpu_frequencies_mhz) for _, _, high in _BOARD]
        for w in self.workloads:
            t = grid.mean(w, grid.top).time_s
            x0 += [math.log(0.05 * t), math.log(0.3 * t), math.log(0.6 * t), math.log(0.4 * t * b.eta_memory * b.dram_bw_bytes_s), 3.0, 10.0]
            lo += [math.log(1e-7 * t)] * 3 + [math.log(1e-7 * t * b.eta_memory * b.dram_bw_bytes_s), 1.0, 1.0]
            hi += [math.log(10 * t)] * 3 + [math.log(10 * t * b.eta_memory * b.dram_bw_bytes_s), _OVERLAP_MAX, _OVERLAP_MAX]
        lo_a, hi_a = np.array(lo), np.array(hi)
        return np.clip(np.array(x0), lo_a + 1e-9, hi_a - 1e-9), lo_a, hi_a

    def __call__(self, x: np.ndarray) -> tuple[OrinTwinParams, list[StepWork]]:
        v = dict(zip((n for n, _, _ in _BOARD), (float(a) for a in x[:len(_BOARD)])))
        params = dataclasses.replace(
            self.board, cpu_bound_share=v["cpu_bound_share"], cpu_reserved_mhz=v["cpu_reserved_mhz"], gpu_static_w=v["constant_w"],
            gpu_k=v["gpu_k"], gpu_idle_dynamic_share=v["gpu_idle_dynamic_share"],
            volt_v0=self.gpu_top_v * (1.0 - v["gpu_volt_shape"]), volt_v1=self.gpu_top_v * v["gpu_volt_shape"],
            cpu_base_w=v["cpu_switching_w"], cpu_volt_v0=self.cpu_top_v * (1.0 - v["cpu_volt_shape"]),
            cpu_volt_v1=self.cpu_top_v * v["cpu_volt_shape"], cpu_busy_w=v["cpu_busy_w"], ddr_base_w=v["ddr_clock_w"],
            ddr_per_bw_w=v["ddr_per_bw_w"])
        works = []
        for i, key in enumerate(self.workloads):
            seg = x[len(_BOARD) + 6 * i: len(_BOARD) + 6 * (i + 1)]
            amounts = dict(zip(_WORK, (float(math.exp(a)) for a in seg[:4])))
            works.append(StepWork(key, **amounts, kernel_overlap=float(seg[4]), queue_overlap=float(seg[5])))
        return params, works


# --- a grid fit on disk: the board (a params file, `load_twin_params` reads it) and the work beside it -----------------
def save_grid_fit(fit: GridFit, board_path: str | Path, work_path: str | Path, header: str = "") -> None:
    """Write the fitted board as a twin params file and the workloads' work, split and errors as a second YAML.

    Args:
        fit: the fit.
        board_path: the params file (every constant; `load_twin_params(None, board_path)` loads it).
        work_path: the work file (`load_grid_work` reads it).
        header: comment lines put at the top of both files (each line gets its "# ").
    """
    import yaml

    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    Path(board_path).write_text(comments + yaml.safe_dump(fit.params.to_dict(), sort_keys=False))
    doc = {"board": Path(board_path).name, "grid": fit.source[0], "grid_sha256": fit.source[1],
           "split": {"share": fit.split.share, "seed": fit.split.seed, "fitted": len(fit.split.fitted), "judged": len(fit.split.judged)},
           "work": [w.to_dict() for w in fit.work], "errors_judged": fit.judged.to_dict()}
    Path(work_path).write_text(comments + yaml.safe_dump(doc, sort_keys=False))


@dataclasses.dataclass(frozen=True)
class GridWorkFile:
    """A work file written by `save_grid_fit`.

    Attributes:
        board: the params file's name (beside it).
        grid: the grid's file name.
        grid_sha256: the grid's SHA-256 when fitted.
        share: the split's share fitted.
        seed: the split's seed.
        work: each workload's work.
        errors_judged: the errors reported on the judged settings, as written (`GridErrors.to_dict`).
    """

    board: str
    grid: str
    grid_sha256: str
    share: float
    seed: int
    work: tuple[StepWork, ...]
    errors_judged: dict[str, Any]


def load_grid_work(path: str | Path) -> GridWorkFile:
    """Read a work file (`save_grid_fit`); a missing key or a bad value is one DvfsError naming the file."""
    data = read_yaml_mapping(path)
    try:
        split = data["split"]
        return GridWorkFile(str(data["board"]), str(data["grid"]), str(data["grid_sha256"]), float(split["share"]), int(split["seed"]),
                            tuple(StepWork.from_dict(w, source=str(path)) for w in data["work"]), dict(data["errors_judged"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DvfsError(f"{path} is not a twin's grid work file ({type(e).__name__}: {e}); rewrite it with "
                        "`python -m benchmarks.twin_joint --write`") from None
