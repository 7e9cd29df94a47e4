"""Fit a profile's timing and power constants to measured points (`dvfs-mlops twin fit`).

A point is one pinned clock of one workload: the steps it ran (step traces and how often each
ran), its measured time and its CPU + GPU power (the study's energy over that time). Knows
nothing of workloads or MLflow: the command (`twin_fit.py`) builds the points.

What is fitted, and why these constants:
- Timing first (power does not change time): `host_per_step_s` (the fixed per-step overhead),
  `host_per_kernel_s` (host dispatch per launch; `host_per_view_s` keeps its ratio to it),
  `kernel_fixed_s` (per-kernel GPU cost, scales as 1/f) and `eta_compute_flop_ops` (matmul
  efficiency; `eta_compute_other` keeps its ratio). Together they set the launch-bound floor,
  the compute-bound slope in 1/f and where one turns into the other. Peak rates, the clock
  table and DRAM bandwidth are datasheet facts, not fitted. Least squares on log(time).
- Power, on the fitted timing: the GPU rail's static part, its dynamic coefficient k, its idle
  share, and the shape of V(f) (the share r of V(fmax) that rises with (f/fmax)^2). V(fmax)
  itself stays the base profile's: only k V^2 is observable, k absorbs the scale. For a given
  shape the CPU + GPU power is linear in (static, k, k * idle share), so those come from a
  bounded linear least-squares solve, and r from a 1-D search. The CPU rail's constants stay
  the base profile's: CPU + GPU energy alone cannot tell the CPU's base power from the GPU
  rail's static part (both are constant), so the static part absorbs any difference.
Relative errors are reported per quantity (time, power, energy), before and after the fit.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import StepEstimate, estimate_step
from dvfs_mlops.hw.twin.trace import StepTrace

TIMING_CONSTANTS = ("host_per_step_s", "host_per_kernel_s", "kernel_fixed_s", "eta_compute_flop_ops")
POWER_CONSTANTS = ("gpu_static_w", "gpu_k", "gpu_idle_dynamic_share", "volt_v0", "volt_v1")
# Companions: constants that keep their ratio to a fitted one (too weakly observed to fit apart).
_COMPANIONS = {"host_per_kernel_s": "host_per_view_s", "eta_compute_flop_ops": "eta_compute_other"}


@dataclasses.dataclass(frozen=True)
class FitPoint:
    """One workload at one pinned clock: the steps it ran, and what was measured."""

    workload: str
    freq_mhz: float
    steps: tuple[tuple[StepTrace, int], ...]  # (trace, how many steps ran it)
    time_s: float
    power_w: float  # CPU + GPU, energy_j / time_s
    # On the twin: the noise-free values of the same point (time_expected_s, energy_expected_j), else None.
    time_expected_s: float | None = None
    energy_expected_j: float | None = None

    @property
    def energy_j(self) -> float:
        return self.power_w * self.time_s

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
    memo: dict[tuple[str, float], StepEstimate] = {}
    t, e = np.zeros(len(points)), np.zeros(len(points))
    for i, pt in enumerate(points):
        for trace, n in pt.steps:
            est = _step(memo, trace, pt.freq_mhz, p)
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
        p = _fit_timing(points, p)
        fitted += TIMING_CONSTANTS
    if fit_power:
        p = _fit_power(points, p)
        fitted += POWER_CONSTANTS
    truths = [pt.truth for pt in points]
    expected = errors([t for t in truths if t is not None], p) if all(t is not None for t in truths) else None
    return FitResult(p, base, len(points), len(workloads), errors(points, p), errors(points, base), fitted, expected)


def _step(memo: dict[tuple[str, float], StepEstimate], trace: StepTrace, f: float, p: OrinTwinParams) -> StepEstimate:
    key = (trace.key, f)
    if key not in memo:
        memo[key] = estimate_step(trace, f, p)
    return memo[key]


def _with_timing(p: OrinTwinParams, x: np.ndarray) -> OrinTwinParams:
    values = dict(zip(TIMING_CONSTANTS, np.exp(x)))
    values["eta_compute_flop_ops"] = min(1.0, values["eta_compute_flop_ops"])
    changes: dict[str, float] = {k: float(v) for k, v in values.items()}
    for lead, companion in _COMPANIONS.items():
        changes[companion] = min(1.0 if companion.startswith("eta") else np.inf,
                                 getattr(p, companion) * changes[lead] / getattr(p, lead))
    return dataclasses.replace(p, **changes)


def _fit_timing(points: Sequence[FitPoint], p: OrinTwinParams) -> OrinTwinParams:
    from scipy.optimize import least_squares

    measured = np.log([pt.time_s for pt in points])
    x0 = np.log([getattr(p, k) for k in TIMING_CONSTANTS])
    # a factor of 30 either way around the base profile; efficiencies at most 1
    lo = x0 - np.log(30.0)
    hi = x0 + np.log(30.0)
    eta = TIMING_CONSTANTS.index("eta_compute_flop_ops")
    hi[eta] = 0.0
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(points, _with_timing(p, x))["time"]) - measured

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, xtol=1e-10, ftol=1e-12, max_nfev=200)
    return _with_timing(p, sol.x)


def _power_design(points: Sequence[FitPoint], p: OrinTwinParams) -> tuple[np.ndarray, ...]:
    """Per point: T, CPU energy (fixed constants), and per step sums for the GPU rail's linear terms."""
    memo: dict[tuple[str, float], StepEstimate] = {}
    n = len(points)
    T, cpu, x2, util_g, idle_g = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for i, pt in enumerate(points):
        f = pt.freq_mhz
        x2[i] = (f / p.max_mhz) ** 2
        for trace, c in pt.steps:
            est = _step(memo, trace, f, p)
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
