"""The curve governor: a multi-output regression tree whose leaves hold normalised energy/time curves.

The tree is grown on each workload's measured curve (or, `fitted`, the curve model's fit to it:
dataset.with_fitted_curves), normalised so workload size drops out: energy E/E_min per workload and
(weighted by `time_weight`) time T/T_maxn, at the dataset's clocks (a workload that lacks a clock
has it interpolated for growing the tree only), or (`grow_on="best-clock"`) on the clock each workload
is best at under the training objective, one-hot: the splits of a classifier (squared error on a
one-hot target is Gini impurity), the leaves of a curve tree. The whole normalised curve is dominated
by its far end (15-90 % above the minimum at the lowest clocks), so on a flat curve the splits it
asks for explain that end and not where the minimum lies; the best clock is the decision itself.
Each leaf then holds
the mean of the curves that reached it (measured points only where a clock has any), and the
largest time ratio seen there (`time_hi`), so `max-slowdown:X` keeps its bound on the leaf's own
workloads. The objective is applied when deciding (policy_tree.leaf_choice), so one policy serves
energy, edp and max-slowdown:X.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.governor.policy_tree import FORMAT
from dvfs_mlops.model.workload import NUMERIC_FEATURES, WorkloadFeatures

if TYPE_CHECKING:
    from pathlib import Path


_KEPT: dict[int, dict[Hashable, Any]] = {}


def kept(curve: WorkloadCurve, key: Hashable, make: Callable[[], Any]) -> Any:
    """`make()`, made once per workload curve (by identity; forgotten when the curve is) and `key`: a governor search
    asks the same of each workload (its normalised curve, its best clock, its regret at each clock) thousands of times.
    The curves are read, never changed, while a search runs."""
    memo = _KEPT.get(id(curve))
    if memo is None:
        memo = _KEPT[id(curve)] = {}
        weakref.finalize(curve, _KEPT.pop, id(curve), None)
    if key not in memo:
        memo[key] = make()
    return memo[key]


def best_clock(curve: WorkloadCurve, objective: Objective, fitted: bool) -> float:
    """`curve.label(objective, fitted)`, kept."""
    return float(kept(curve, ("label", objective, fitted), lambda: curve.label(objective, fitted)))


@functools.lru_cache(maxsize=16384)
def feature_row(features: WorkloadFeatures) -> dict[str, Any]:
    """`features.as_row()`, made once per features (read it, never change it): a governor search decides for the same
    workloads thousands of times, and `dataclasses.asdict` was a fifth of its time."""
    return features.as_row()


@functools.lru_cache(maxsize=16384)
def _numeric_row(features: WorkloadFeatures) -> dict[str, float]:
    return features.numeric_row()


def feature_array(curves: Sequence[WorkloadCurve], columns: Sequence[str]) -> np.ndarray:
    """`dataset.feature_matrix` as the float32 array sklearn's trees split on (rows: curves, columns: `columns` of
    NUMERIC_FEATURES), from each features' numeric row made once. sklearn casts X to float32 itself when it checks
    its input (sklearn/tree/_classes.py, BaseDecisionTree._fit), so a tree fitted on this array with
    `check_input=False` is the tree it would fit on the float64 matrix, without the checks' cost on every fit."""
    rows = [[float(_numeric_row(c.features)[k]) for k in columns] for c in curves]
    return np.asarray(rows, dtype=np.float32).reshape(len(curves), len(columns))


@dataclasses.dataclass(frozen=True)
class CurveParams:
    max_depth: int = 2  # 0: one leaf, the mean curve (ignores every feature)
    min_samples_leaf: int = 2
    min_samples_split: int = 2
    ccp_alpha: float = 0.0
    time_weight: float = 0.0  # how much the time curve shapes the splits (energy always does)
    max_features: float | None = None
    features: tuple[str, ...] = NUMERIC_FEATURES
    seed: int = 0
    fitted: bool = True  # grow and fill the leaves from each workload's curve-model fit where it has one
    grow_on: str = "curve"  # what the splits explain: the normalised curves, or each workload's best clock


def _curve_rows(curve: WorkloadCurve, clocks: tuple[float, ...], fitted: bool) -> np.ndarray:
    """One workload's rows of `curve_matrix` and their `_filled` copies: [E/E_min, T/T_maxn, filled E, filled T]."""
    ne, nt = curve.normalised(fitted=fitted)
    rows = np.full((4, len(clocks)), np.nan)
    for j, f in enumerate(clocks):
        if f in ne:
            rows[0, j], rows[1, j] = ne[f], nt[f]
    rows[2:] = _filled(rows[:2], clocks)
    return rows


def _matrices(curves: Sequence[WorkloadCurve], clocks: Sequence[float], fitted: bool) -> np.ndarray:
    """Every workload's `_curve_rows`, kept per workload: shape (4, workloads, clocks)."""
    key = tuple(float(f) for f in clocks)
    return np.stack([kept(c, ("rows", key, fitted), lambda c=c: _curve_rows(c, key, fitted)) for c in curves], axis=1)  # type: ignore[misc]


def curve_matrix(curves: Sequence[WorkloadCurve], clocks: Sequence[float], fitted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(E/E_min, T/T_maxn) per workload x clock, measured or (`fitted`) the curve model's; NaN where a workload did not
    measure the clock."""
    m = _matrices(curves, clocks, fitted)
    return m[0].copy(), m[1].copy()


def _filled(m: np.ndarray, clocks: Sequence[float]) -> np.ndarray:
    """Missing clocks interpolated along each row (edges held flat)."""
    out = m.copy()
    x = np.asarray(clocks, dtype=float)
    for row in out:
        ok = ~np.isnan(row)
        if ok.any() and not ok.all():
            row[~ok] = np.interp(x[~ok], x[ok], row[ok])
    return out


def _leaf(e: np.ndarray, t: np.ndarray, ef: np.ndarray, tf: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """A leaf of the workloads `idx`: per clock the mean of the measured (or fitted) values where any workload has one,
    else of the filled ones; the largest time ratio likewise."""
    def col_mean(m: np.ndarray, fill: np.ndarray) -> list[float]:
        rows = m[idx]
        seen = ~np.isnan(rows)
        n = seen.sum(axis=0)
        v = np.where(n > 0, np.where(seen, rows, 0.0).sum(axis=0) / np.maximum(n, 1), fill[idx].mean(axis=0))
        return [round(float(a), 6) for a in v]

    rows = t[idx]
    seen = ~np.isnan(rows)
    hi = np.where(seen.any(axis=0), np.where(seen, rows, -np.inf).max(axis=0), tf[idx].max(axis=0))
    return {"energy": col_mean(e, ef), "time": col_mean(t, tf), "time_hi": [round(float(a), 6) for a in hi], "samples": int(len(idx))}


GROW_ON = ("curve", "best-clock")


def best_clock_matrix(curves: Sequence[WorkloadCurve], clocks: Sequence[float], objective: Objective, fitted: bool = False) -> np.ndarray:
    """One row per workload, one column per clock: 1 at the clock the workload is best at under `objective` (on its
    measurements or, `fitted`, on the curve model's fit), 0 elsewhere."""
    out = np.zeros((len(curves), len(clocks)))
    index = {float(f): j for j, f in enumerate(clocks)}
    for i, c in enumerate(curves):
        out[i, index[best_clock(c, objective, fitted)]] = 1.0
    return out


def fit_curve_policy(curves: Sequence[WorkloadCurve], clocks: Sequence[float], params: CurveParams,
                     metadata: dict[str, Any] | None = None, objective: Objective | None = None) -> tuple[dict[str, Any], Any]:
    """(policy.json dict, the fitted sklearn regressor or None for depth 0).

    Raises:
        ValueError: `grow_on="best-clock"` without the objective that says which clock is best, or an unknown `grow_on`.
    """
    if params.grow_on not in GROW_ON:
        raise ValueError(f"grow_on {params.grow_on!r}; valid: {', '.join(GROW_ON)}")
    clocks = [float(f) for f in clocks]
    e, t, ef, tf = _matrices(curves, clocks, params.fitted)
    meta = {"format": FORMAT, "family": "curve", "clocks_mhz": clocks, **(metadata or {})}
    if params.max_depth == 0 or len(curves) < 2:
        return {**meta, "tree": _leaf(e, t, ef, tf, np.arange(len(curves)))}, None
    from sklearn.tree import DecisionTreeRegressor

    x = feature_array(curves, params.features)
    if params.grow_on == "best-clock":
        if objective is None:
            raise ValueError("grow_on='best-clock' needs the objective that says which clock is best")
        y = best_clock_matrix(curves, clocks, objective, params.fitted)
    else:
        y = np.hstack([ef, params.time_weight * tf]) if params.time_weight > 0 else ef
    reg = DecisionTreeRegressor(max_depth=params.max_depth, min_samples_leaf=params.min_samples_leaf,
                                min_samples_split=params.min_samples_split, ccp_alpha=params.ccp_alpha,
                                max_features=params.max_features, random_state=params.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg.fit(x, y, check_input=False)
    leaves = reg.apply(x, check_input=False)
    tr = reg.tree_

    def node(i: int) -> dict[str, Any]:
        if tr.children_left[i] == tr.children_right[i]:
            return _leaf(e, t, ef, tf, np.flatnonzero(leaves == i))
        return {"feature": params.features[int(tr.feature[i])], "threshold": round(float(tr.threshold[i]), 6),
                "left": node(int(tr.children_left[i])), "right": node(int(tr.children_right[i]))}

    return {**meta, "tree": node(0)}, reg


def leaf_curves_plot(policy: dict[str, Any], path: str | Path) -> None:
    """Every leaf's normalised energy (and time) curve against clock: what the governor believes, leaf by leaf."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    leaves: list[tuple[str, dict[str, Any]]] = []

    def walk(n: dict[str, Any], label: str) -> None:
        if "feature" in n:
            walk(n["left"], f"{label}{n['feature']}<={n['threshold']:g}; ")
            walk(n["right"], f"{label}{n['feature']}>{n['threshold']:g}; ")
        else:
            leaves.append((label.rstrip("; ") or "all workloads", n))

    walk(policy["tree"], "")
    clocks = policy["clocks_mhz"]
    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, leaf in leaves:
        line, = ax_e.plot(clocks, leaf["energy"], marker="o", label=f"{label} (n={leaf['samples']})")
        ax_t.plot(clocks, leaf["time"], marker="o", color=line.get_color())
    ax_e.set_xlabel("GPU clock (MHz)")
    ax_e.set_ylabel("energy / least energy of the workload")
    ax_t.set_xlabel("GPU clock (MHz)")
    ax_t.set_ylabel("time / time at maxn")
    ax_e.legend(fontsize=7)
    fig.suptitle(f"curve governor leaves (objective default {policy.get('objective', 'energy')})"
                 + (" - SIMULATED sweep" if policy.get("simulated") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
