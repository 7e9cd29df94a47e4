"""Move a curve governor to another board from a few measured points (`dvfs-mlops calibrate`'s model).

A curve governor (curve_tree.py) holds two kinds of knowledge: WHICH workloads behave alike (its splits, learnt from
many workloads of one board) and HOW each group's energy and time move with the clock on that board (its leaves, the
normalised curves E/E_min and T/T_maxn at the board's clocks). The first is about the workloads and carries to another
board of the same kind; the second is the board's physics and does not: a board with a lower clock ceiling, fewer
SMs or less memory bandwidth has other optima for the same workload. So the splits are kept and every leaf is
re-expressed on the target's clock table through the curve model's shape (curve.py), in each board's normalised clock
x = f / f_max:

    time(x)  ~ (1 - phi) + phi / x                       phi: the share of the time at the top clock that scales with it
    power(x) ~ (1 - psi) + psi * (V(x) / V(1))^2 * x      psi: the dynamic share of the power at the top clock

phi and psi are fitted to each source leaf (on the source's voltage shape and table), and carried to the target by
one board-level shift each in logit space, logit phi_t = logit phi_s + time_shift (and psi alike with power_shift):
the target's fewer SMs and lower ceiling make the clock-bound share of every workload grow or shrink together, its
static (SoC, CPU) power share likewise. The shifts, the target's voltage shape (its own where the board knows it,
else fitted across the calibration points) and the board's power prior (power_prior.py) are the board constants the
calibration measures: `plan_calibration` picks at most 3 workloads (from different, well-populated leaves) and at most
4 clocks of the target's table (spread over it: the ends pin both fits best), `calibrate_policy` fits each measured
workload's phi and psi on the target and compares them with its source leaf's (median of the differences). MAXN is not
needed: a leaf's time against MAXN keeps its source relation at the top clock.

A classifier policy (leaves hold one clock, like the published tree) has no curve to re-express, but its leaves say
where on the source's table each group's optimum sits (x_L = f_L / f_max). The calibration points say where it sits on
the target: each calibration workload's own curve-model fit on the target (the shares above, on the target's voltage
shape) has its optimum at x_c on the target's table. Every leaf moves by one board-level shift of that relative place,
place_shift = median over the calibration workloads of (x_c - x_L(c)), L(c) the leaf the workload reaches (a smaller
board with a lower ceiling puts the same workload's optimum higher in its table), and is snapped to the target's table
(clipped to its ends). x_c is the fit's own optimum, which may lie above the table's top (a workload whose energy still
falls at the top clock): taking the table's top instead would understate the move. A leaf that calibration workloads
reach is measured on the target: it takes their fitted optimum (the median) rather than the board-level shift, which
is for the groups nothing measured. Without a calibration workload that reaches a leaf the shift is 0 (the relative
place kept).

A tree that splits on gpu_util_pct (the GPU's busy share at MAXN) learnt its thresholds on the source's scale: the
same workload is busier on a slower GPU, whose busy time grows while the time the GPU waits on the host does not, so
its busy share moves by about one board-level shift in logit space (logit u = log(busy / idle)). Where the
calibration workloads' features as the source measured them are known (`source_features`: the source's own sweep),
util_shift = median of logit(u_target) - logit(u_source) moves every gpu_util_pct threshold onto the target's scale,
and each calibration workload is compared with the leaf it was learnt in on the source.

A curve source without splits (the NX 8 GB's and the Nano's own governors: on a board whose ceiling binds, one clock
is best for nearly every workload) carries no workload knowledge; moved to a wider table it could only pick one clock
for everything. There the calibration points' own fits decide, through the one feature tied to the curve's shape: a
busier GPU (gpu_util_pct at MAXN) has more of its time and power scaling with the clock, so logit phi and logit psi
are fitted as lines in logit u across the calibration workloads (least squares; they need two distinct utilisations),
and the tree splits gpu_util_pct where the optimum of the curve those lines give moves to another clock (each leaf
that interval's middle curve). numpy only (no MLflow, no torch).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE, Board
from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.policy_tree import feature_value
from dvfs_mlops.model.workload import WorkloadFeatures

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BoardConstants", "CalibrationPlan", "calibrate_policy", "leaf_of", "plan_calibration", "spread_clocks"]

MAX_WORKLOADS = 3
MAX_CLOCKS = 4
_SHARE_CLIP = 1e-3
_UTIL_GRID = 400  # utilisations (logit-spaced) a source without splits is split over
# What a search wrote of the source's own sweep: moved under "calibrated_from", not claimed for the target.
_SOURCE_ONLY = ("sweep_id", "inner_cv", "outer_cv", "n_workloads")  # phi and psi are kept inside (0.001, 0.999) so their logits stay finite


@dataclasses.dataclass(frozen=True)
class CalibrationPlan:
    """What to measure on the target board.

    Attributes:
        workloads: workload names as sweep presets name them ("bert-base/rte"), at most `MAX_WORKLOADS`.
        clocks_mhz: clocks of the TARGET board's table, ascending, each measured for every workload.
        needs_maxn: whether the fit needs MAXN measured too (it does not: False; a sweep may measure it anyway).
    """

    workloads: tuple[str, ...]
    clocks_mhz: tuple[float, ...]
    needs_maxn: bool = False

    def cost(self, steps: int) -> int:
        """Training steps the plan measures at `steps` per point (clocks x workloads x steps)."""
        return len(self.clocks_mhz) * len(self.workloads) * int(steps)


@dataclasses.dataclass(frozen=True)
class BoardConstants:
    """The target board's constants a calibration fitted (stored on the calibrated policy as "board_constants").

    Attributes:
        voltage_shape: r of the target's V(f) ~ 1 + r (f / f_max)^2.
        voltage_shape_fitted: True where r was fitted across the calibration points (the board does not state it).
        f_max_mhz: the target's table top.
        time_shift: logit(phi_target) - logit(phi_source leaf), the median over the calibration workloads.
        power_shift: logit(psi_target) - logit(psi_source leaf), likewise.
        workloads: the calibration workloads the shifts were fitted from.
        clocks_mhz: the target clocks they were measured at.
        place_shift: for a classifier source, the shift of each leaf's relative clock (module doc; time_shift and
            power_shift are 0 there); None for a curve source.
        util_shift: logit(u_target) - logit(u_source) of the GPU utilisation at MAXN, the median over the calibration
            workloads whose source utilisation is known; None where none is.
    """

    voltage_shape: float
    voltage_shape_fitted: bool
    f_max_mhz: float
    time_shift: float
    power_shift: float
    workloads: tuple[str, ...]
    clocks_mhz: tuple[float, ...]
    place_shift: float | None = None
    util_shift: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["workloads"], d["clocks_mhz"] = list(self.workloads), list(self.clocks_mhz)
        for key in ("place_shift", "util_shift"):
            if d[key] is None:
                d.pop(key)
        return d


def spread_clocks(table: Sequence[float], n: int = MAX_CLOCKS) -> tuple[float, ...]:
    """`n` clocks of `table` spread over it: the lowest, the highest and the nearest to evenly spaced points between
    (306/612/918/1300.5 on the AGX Orin 64 GB); the whole table where it has no more than `n`."""
    t = sorted(float(f) for f in table)
    if len(t) <= n:
        return tuple(t)
    lo, hi = t[0], t[-1]
    chosen: list[float] = []
    for k in range(n):
        target = lo + k * (hi - lo) / (n - 1)
        left = [f for f in t if f not in chosen]
        chosen.append(min(left, key=lambda f: (abs(f - target), f)))
    return tuple(sorted(chosen))


def leaf_of(policy: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(the path to the leaf as a string, the leaf) that `row` reaches in the policy's tree; None where the row lacks
    a feature the path needs (e.g. gpu_util_pct before anything was measured)."""
    node = policy["tree"]
    path = ""
    while "feature" in node:
        try:
            left = feature_value(row, node["feature"]) <= float(node["threshold"])
        except ValueError:
            return None
        path += "L" if left else "R"
        node = node["left"] if left else node["right"]
    return path, node


Features = Mapping[str, WorkloadFeatures]


def _source_row(curve: WorkloadCurve, source_features: Features | None) -> Mapping[str, Any]:
    """The row that routes a calibration workload through the source's tree: its features as the source's own sweep
    measured them where known (the leaf it was learnt in), else as measured on the target."""
    known = (source_features or {}).get(curve.workload)
    return (known or curve.features).as_row()


def util_shift(curves: Sequence[WorkloadCurve], source_features: Features | None) -> float | None:
    """The board's shift of GPU utilisation at MAXN (module doc): median over the calibration workloads measured on
    both boards of logit(u_target) - logit(u_source); None where none is."""
    moves = []
    for c in curves:
        known = (source_features or {}).get(c.workload)
        if known is not None and known.gpu_util_pct is not None and c.features.gpu_util_pct is not None:
            moves.append(_logit(c.features.gpu_util_pct / 100.0) - _logit(known.gpu_util_pct / 100.0))
    return float(statistics.median(moves)) if moves else None


def _moved_thresholds(node: Mapping[str, Any], shift: float | None) -> dict[str, Any]:
    """The tree with every gpu_util_pct threshold put on the target's utilisation scale (logit shifted by `shift`)."""
    if "feature" not in node:
        return dict(node)
    threshold = node["threshold"]
    if node["feature"] == "gpu_util_pct" and shift is not None:
        threshold = round(100.0 * _sigmoid(_logit(float(threshold) / 100.0) + shift), 6)
    return {**node, "threshold": threshold, "left": _moved_thresholds(node["left"], shift),
            "right": _moved_thresholds(node["right"], shift)}


def plan_calibration(source_policy: Mapping[str, Any], target: Board,
                     candidates: Sequence[str | tuple[str, WorkloadFeatures]], max_workloads: int = MAX_WORKLOADS,
                     max_clocks: int = MAX_CLOCKS) -> CalibrationPlan:
    """Which workloads and clocks to measure on `target` to calibrate `source_policy` for it.

    Args:
        source_policy: the source governor's policy.json (policy_tree.FORMAT).
        target: the target board (its clock table).
        candidates: the workloads that can be run, by name ("bert-base/rte", as sweep presets name them), or as
            (name, features) pairs: with features, the plan takes one workload from each of the most populated leaves
            the candidates reach (the median-sized one there), so the shifts are fitted across unlike workloads;
            without, it takes names spread over the list (sorted).
        max_workloads: at most this many workloads (1..3).
        max_clocks: at most this many clocks (2..4).

    Returns:
        The `CalibrationPlan`.

    Raises:
        DvfsError: no candidates, or limits outside their range.
    """
    if not candidates:
        raise DvfsError("no candidate workloads to calibrate on; name a preset whose workloads can run on this board")
    if not 1 <= max_workloads <= MAX_WORKLOADS or not 2 <= max_clocks <= MAX_CLOCKS:
        raise DvfsError(f"a calibration measures 1..{MAX_WORKLOADS} workloads at 2..{MAX_CLOCKS} clocks, "
                        f"not {max_workloads} at {max_clocks}")
    named: list[tuple[str, WorkloadFeatures | None]] = [(c, None) if isinstance(c, str) else (str(c[0]), c[1]) for c in candidates]
    named = sorted(dict(named).items())  # unique names, a stable order
    by_leaf: dict[str, list[tuple[str, WorkloadFeatures]]] = {}
    samples: dict[str, int] = {}
    for name, feats in named:
        found = leaf_of(source_policy, feats.as_row()) if feats is not None else None
        if found is not None:
            by_leaf.setdefault(found[0], []).append((name, feats))  # type: ignore[arg-type]
            samples[found[0]] = int(found[1].get("samples", 1))
    chosen: list[str] = []
    for leaf in sorted(by_leaf, key=lambda p: (-samples[p], p))[:max_workloads]:
        members = sorted(by_leaf[leaf], key=lambda m: (m[1].num_params, m[0]))
        chosen.append(members[len(members) // 2][0])
    rest = [n for n, _ in named if n not in chosen]
    need = max_workloads - len(chosen)
    if need > 0 and rest:
        step = len(rest) / need
        chosen += [rest[min(len(rest) - 1, int((k + 0.5) * step))] for k in range(min(need, len(rest)))]
    return CalibrationPlan(tuple(chosen), spread_clocks(target.frequencies_mhz, max_clocks))


def _logit(p: float) -> float:
    p = min(1.0 - _SHARE_CLIP, max(_SHARE_CLIP, p))
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _nonneg_fit(basis: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y ~ basis @ beta, beta >= 0, least squares on relative residuals (noise is multiplicative); two columns."""
    w = 1.0 / np.abs(y)
    xw, yw = basis * w[:, None], y * w
    best: tuple[float, np.ndarray] | None = None
    for cols in ([0, 1], [0], [1]):
        sub, *_ = np.linalg.lstsq(xw[:, cols], yw, rcond=None)
        if np.any(sub < 0):
            continue
        beta = np.zeros(2)
        beta[cols] = sub
        rss = float(np.sum((yw - xw @ beta) ** 2))
        if best is None or rss < best[0]:
            best = (rss, beta)
    return best[1] if best is not None else np.zeros(2)


def _v2(x: np.ndarray, shape: float) -> np.ndarray:
    """(V(x) / V(1))^2 for V ~ 1 + r x^2."""
    return ((1.0 + shape * x * x) / (1.0 + shape)) ** 2


def shares(clocks_mhz: Sequence[float], energy: Sequence[float], time: Sequence[float], voltage_shape: float,
           f_max_mhz: float) -> tuple[float, float]:
    """(phi, psi) of a curve (module doc): the clock-bound share of its time and the dynamic share of its power at the
    table top, from energy and time at `clocks_mhz` (any common scale)."""
    x = np.asarray(clocks_mhz, dtype=float) / float(f_max_mhz)
    t, e = np.asarray(time, dtype=float), np.asarray(energy, dtype=float)
    a, b = _nonneg_fit(np.column_stack([np.ones_like(x), 1.0 / x]), t)
    c, d = _nonneg_fit(np.column_stack([np.ones_like(x), _v2(x, voltage_shape) * x]), e / t)
    phi = b / (a + b) if a + b > 0 else 0.5
    psi = d / (c + d) if c + d > 0 else 0.5
    return float(phi), float(psi)


def _curve(x: np.ndarray, phi: float, psi: float, shape: float) -> tuple[np.ndarray, np.ndarray]:
    t = (1.0 - phi) + phi / x
    p = (1.0 - psi) + psi * _v2(x, shape) * x
    return t * p, t


def _source_shape(policy: Mapping[str, Any]) -> tuple[float, float]:
    """(voltage shape, table top) the source policy's leaves were measured with: its own record where it carries one
    ("board_constants" of an earlier calibration, or top-level "voltage_shape"/"f_max_mhz"), else the built-in twin
    profile its "device_profile" names (or the first of the family it names, as the published tree names the AGX Orin
    64 GB), else the AGX Orin's curve; the top of its clocks ("clocks_mhz", a search's "frequencies_mhz", that twin's
    table, else its leaves' clocks)."""
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES

    consts = policy.get("board_constants") or {}
    shape = consts.get("voltage_shape", policy.get("voltage_shape"))
    fmax = consts.get("f_max_mhz", policy.get("f_max_mhz"))
    named = str(policy.get("device_profile", ""))
    twin = BUILTIN_PROFILES.get(named) or next(  # the published tree names its board family, not a twin profile
        (p for p in BUILTIN_PROFILES.values() if p.family in (named, policy.get("board_family"))), None)
    if shape is None and twin is not None and twin.volt_v0 > 0:
        shape = twin.volt_v1 / twin.volt_v0
    if fmax is None:
        clocks = (policy.get("clocks_mhz") or policy.get("frequencies_mhz") or (twin.frequencies_mhz if twin else None)
                  or _leaf_clocks(policy["tree"]))
        fmax = max(float(f) for f in clocks)
    return float(shape) if shape is not None else ORIN_VOLTAGE_SHAPE, float(fmax)


def _leaf_clocks(node: Mapping[str, Any]) -> list[float]:
    if "feature" in node:
        return _leaf_clocks(node["left"]) + _leaf_clocks(node["right"])
    return [float(node["freq_mhz"])] if "freq_mhz" in node else []


def _target_shape(target: Board, curves: Sequence[WorkloadCurve]) -> tuple[float, bool]:
    if target.voltage_shape_known:
        return target.voltage_shape, False
    from dvfs_mlops.model.curve import Measurement, fit_voltage_shape

    points = [[Measurement(f, c.time_s[f], c.energy_j[f]) for f in c.clocks] for c in curves]
    try:
        return fit_voltage_shape(points, target.f_max_mhz), True
    except DvfsError:
        return target.voltage_shape, False


def _map_leaves(node: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    if "feature" in node:
        return {**node, "left": _map_leaves(node["left"], fn), "right": _map_leaves(node["right"], fn)}
    return fn(node)


def fit_board_constants(source_policy: Mapping[str, Any], target: Board, curves: Sequence[WorkloadCurve],
                        source_features: Features | None = None) -> BoardConstants:
    """The target's constants from the calibration curves (module doc): each workload's (phi, psi) on the target
    against its source leaf's (the leaf its source features reach where `source_features` has them).

    Raises:
        DvfsError: no curve reaches a curve leaf of the source policy with at least two measured clocks.
    """
    src_shape, src_fmax = _source_shape(source_policy)
    src_clocks = [float(f) for f in source_policy["clocks_mhz"]]
    shape, fitted = _target_shape(target, curves)
    dt, dp, used = [], [], []
    for c in curves:
        found = leaf_of(source_policy, _source_row(c, source_features))
        if found is None or "energy" not in found[1] or len(c.clocks) < 2:
            continue
        leaf = found[1]
        phi_s, psi_s = shares(src_clocks, leaf["energy"], leaf["time"], src_shape, src_fmax)
        clocks = c.clocks
        phi_t, psi_t = shares(clocks, [c.energy_j[f] for f in clocks], [c.time_s[f] for f in clocks], shape,
                              target.f_max_mhz)
        dt.append(_logit(phi_t) - _logit(phi_s))
        dp.append(_logit(psi_t) - _logit(psi_s))
        used.append(c.workload)
    if not used:
        raise DvfsError("no calibration workload reaches a curve leaf of the source governor with two measured clocks; "
                        "calibrate a curve governor, measuring at least two clocks per workload")
    measured = sorted({f for c in curves for f in c.clocks})
    return BoardConstants(float(shape), fitted, float(target.f_max_mhz), float(statistics.median(dt)),
                          float(statistics.median(dp)), tuple(used), tuple(measured), None, util_shift(curves, source_features))


def fitted_place(curve: WorkloadCurve, f_max_mhz: float, voltage_shape: float) -> float:
    """Where `curve`'s own curve-model fit (its shares on this voltage shape, from its measured clocks, at least two) has
    its least energy, as a place x = f / f_max on a continuous scale that does not stop at the table's top: a
    workload whose energy still falls at the top clock has its optimum above it, and counting it at the top would
    understate how far the board moved it (the fit's shape is extrapolated there, up to 3 f_max)."""
    clocks = curve.clocks
    phi, psi = shares(clocks, [curve.energy_j[f] for f in clocks], [curve.time_s[f] for f in clocks], voltage_shape, f_max_mhz)
    x = np.linspace(min(clocks) / f_max_mhz, 3.0, 600)
    e, _ = _curve(x, phi, psi, voltage_shape)
    return float(x[int(np.argmin(e))])


def fit_place_shift(source_policy: Mapping[str, Any], target: Board, curves: Sequence[WorkloadCurve],
                    source_features: Features | None = None) -> tuple[BoardConstants, dict[str, float]]:
    """A classifier source's board constant and measured leaves (module doc).

    Returns:
        (the constants, whose place_shift is the median over the calibration workloads that reach a leaf (with at
        least two measured clocks) of their fitted optimum's place on the target minus their leaf's on the source, 0
        where none does; {leaf path ("L"/"R" per split): the median fitted place of the workloads that reach it}).
    """
    _, src_fmax = _source_shape(source_policy)
    shape, fitted = _target_shape(target, curves)
    f_max = max(float(f) for f in target.frequencies_mhz)
    moves, used, places = [], [], dict[str, list[float]]()
    for c in curves:
        found = leaf_of(source_policy, _source_row(c, source_features))
        if found is None or "freq_mhz" not in found[1] or len(c.clocks) < 2:
            continue
        place = fitted_place(c, f_max, shape)
        moves.append(place - float(found[1]["freq_mhz"]) / src_fmax)
        places.setdefault(found[0], []).append(place)
        used.append(c.workload)
    measured = sorted({f for c in curves for f in c.clocks})
    consts = BoardConstants(float(shape), fitted, f_max, 0.0, 0.0, tuple(used), tuple(measured),
                            float(statistics.median(moves)) if moves else 0.0, util_shift(curves, source_features))
    return consts, {path: float(statistics.median(xs)) for path, xs in places.items()}


def _move_classifier(source_policy: Mapping[str, Any], target: Board, curves: Sequence[WorkloadCurve], src_fmax: float,
                     source_features: Features | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the classifier tree on the target's table, its board constants as stored): a leaf some calibration workload
    reaches takes their fitted optimum (a measurement of that group on this board), any other leaf its source place
    moved by the board's place shift; each snapped to the table (its ends where the place falls outside)."""
    table = sorted(float(f) for f in target.frequencies_mhz)
    consts, measured = fit_place_shift(source_policy, target, curves, source_features)

    def walk(node: Mapping[str, Any], path: str) -> dict[str, Any]:
        if "feature" in node:
            return {**node, "left": walk(node["left"], path + "L"), "right": walk(node["right"], path + "R")}
        x = measured.get(path, float(node["freq_mhz"]) / src_fmax + float(consts.place_shift or 0.0))
        return {**node, "freq_mhz": min(table, key=lambda f: (abs(f / table[-1] - x), -f))}

    tree = _moved_thresholds(walk(source_policy["tree"], ""), consts.util_shift)
    return tree, {**consts.to_dict(), "measured_leaves": measured}


def calibrate_policy(source_policy: Mapping[str, Any], target: Board, curves: Sequence[WorkloadCurve],
                     source_features: Features | None = None) -> dict[str, Any]:
    """The source governor moved onto `target`: the same splits, every leaf re-expressed on the target's table.

    Args:
        source_policy: the source governor's policy.json (a curve policy; or a classifier, whose leaves move by the
            place shift the calibration points measure).
        target: the target board (table, voltage shape where known, family).
        curves: the calibration sweep's workloads on the target (`WorkloadCurve`s; each its measured clocks; the
            features with the GPU utilisation measured there).
        source_features: {workload name: its features as the source's own sweep measured them} where known (what
            calibrate gives plan_calibration): each calibration workload is then compared with the leaf it was learnt
            in, and the tree's gpu_util_pct thresholds move onto the target's utilisation scale (module doc); None:
            routed by the target's features, thresholds kept.

    Returns:
        A new policy dict (policy_tree.FORMAT) on the target's clock table ("device_profile", "simulated" and a
        search's "frequencies_mhz" the target's), with "calibrated_from" (the source's clocks, voltage shape, table
        top, and what it had of "board_family", "device_profile", "version", and of its own sweep: "sweep_id",
        "n_workloads", "inner_cv", "outer_cv", moved here),
        "board_constants" (`BoardConstants.to_dict`), "board_family" (the target's), "voltage_shape"/"f_max_mhz" (so
        it can be calibrated again) and, where the calibration points make one, "power_prior" (the target's
        `PowerPrior` fields).

    Raises:
        DvfsError: nothing to calibrate from (see `fit_board_constants`), a policy without a tree, or a governor of
            configurations.
    """
    if "tree" not in source_policy:
        raise DvfsError("the source governor has no decision tree to calibrate")
    if source_policy.get("family") == "configurations":
        raise DvfsError("the source governor decides configurations (GPU, CPU, EMC clocks); calibrate moves a GPU-only "
                        "governor: train a governor of configurations on this board's joint sweep instead")
    table = sorted(float(f) for f in target.frequencies_mhz)
    src_shape, src_fmax = _source_shape(source_policy)
    out = copy.deepcopy(dict(source_policy))
    calibrated_from = {"clocks_mhz": list(source_policy.get("clocks_mhz", [])), "voltage_shape": src_shape,
                       "f_max_mhz": src_fmax, **{k: out.pop(k) for k in _SOURCE_ONLY if k in out},
                       **{k: source_policy[k] for k in ("board_family", "device_profile", "version") if k in source_policy}}
    out.update(device_profile=target.profile, simulated=target.simulated)
    if "frequencies_mhz" in out:
        out["frequencies_mhz"] = table
    if "clocks_mhz" not in source_policy:  # a classifier tree: measured leaves at their optimum, the rest shifted
        out["tree"], constants = _move_classifier(source_policy, target, curves, src_fmax, source_features)
        out.update(calibrated_from=calibrated_from, board_constants=constants, board_family=target.family,
                   voltage_shape=constants["voltage_shape"], f_max_mhz=table[-1])
        out.pop("power_prior", None)
        return out
    consts = fit_board_constants(source_policy, target, curves, source_features)
    src_clocks = [float(f) for f in source_policy["clocks_mhz"]]
    x = np.asarray(table) / table[-1]

    def redo(leaf: dict[str, Any]) -> dict[str, Any]:
        phi_s, psi_s = shares(src_clocks, leaf["energy"], leaf["time"], src_shape, src_fmax)
        phi = _sigmoid(_logit(phi_s) + consts.time_shift)
        psi = _sigmoid(_logit(psi_s) + consts.power_shift)
        e, t = _curve(x, phi, psi, consts.voltage_shape)
        top_s = max(range(len(src_clocks)), key=lambda i: src_clocks[i])
        time = t * float(leaf["time"][top_s])  # T/T_maxn: the source's relation at the top clock carried over
        hi = max(float(h) / float(v) for h, v in zip(leaf.get("time_hi", leaf["time"]), leaf["time"]) if v > 0)
        return {"energy": [round(float(v), 6) for v in e / e.min()], "time": [round(float(v), 6) for v in time],
                "time_hi": [round(float(v) * hi, 6) for v in time], "samples": leaf.get("samples", 0)}

    out["tree"] = _moved_thresholds(_map_leaves(out["tree"], redo), consts.util_shift)
    constants = consts.to_dict()
    grown = _util_tree(curves, table, consts.voltage_shape, out["tree"]) if "feature" not in source_policy["tree"] else None
    if grown is not None:  # a source without splits: the calibration points' own fits split by GPU utilisation
        out["tree"], constants["util_fit"] = grown
    out.update(clocks_mhz=table, calibrated_from=calibrated_from, board_constants=constants,
               board_family=target.family, voltage_shape=consts.voltage_shape, f_max_mhz=table[-1])
    prior = _power_prior(curves, consts, target)
    if prior is not None:
        out["power_prior"] = prior
    else:
        out.pop("power_prior", None)  # the source board's prior says nothing of this one
    return out


def _util_tree(curves: Sequence[WorkloadCurve], table: Sequence[float], shape: float,
               moved_leaf: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[float]]] | None:
    """For a source without splits (module doc): the tree on gpu_util_pct the calibration workloads' own fits make,
    and the fitted lines {"time": [a, b], "power": [a, b]} (logit share = a + b logit u); None where fewer than two
    workloads with at least two measured clocks and distinct utilisations have one."""
    f_max = max(table)
    x = np.asarray(table, dtype=float) / f_max
    rows = []
    for c in curves:
        if c.features.gpu_util_pct is not None and len(c.clocks) >= 2:
            phi, psi = shares(c.clocks, [c.energy_j[f] for f in c.clocks], [c.time_s[f] for f in c.clocks], shape, f_max)
            rows.append((_logit(c.features.gpu_util_pct / 100.0), _logit(phi), _logit(psi)))
    if len({round(u, 6) for u, _, _ in rows}) < 2:
        return None
    lu, lt, lp = (np.asarray(col) for col in zip(*rows))
    basis = np.column_stack([np.ones_like(lu), lu])
    time_line, power_line = (np.linalg.lstsq(basis, y, rcond=None)[0] for y in (lt, lp))
    hi = max(float(h) / float(v) for h, v in zip(moved_leaf.get("time_hi", moved_leaf["time"]), moved_leaf["time"]) if v > 0)

    def leaf(logit_u: float) -> dict[str, Any]:
        phi = _sigmoid(float(time_line[0] + time_line[1] * logit_u))
        psi = _sigmoid(float(power_line[0] + power_line[1] * logit_u))
        e, t = _curve(x, phi, psi, shape)
        return {"energy": [round(float(v), 6) for v in e / e.min()], "time": [round(float(v), 6) for v in t],
                "time_hi": [round(float(v) * hi, 6) for v in t], "samples": 0}

    grid = np.linspace(_logit(0.0), _logit(1.0), _UTIL_GRID)  # the shares' clip bounds: every utilisation
    best = [int(np.argmin(leaf(float(g))["energy"])) for g in grid]
    cuts, leaves, start = [], [], 0
    for i in range(1, len(grid) + 1):
        if i == len(grid) or best[i] != best[i - 1]:
            leaves.append(leaf(float(grid[(start + i - 1) // 2])))
            if i < len(grid):
                cuts.append(round(100.0 * _sigmoid(float(grid[i] + grid[i - 1]) / 2.0), 6))
            start = i

    def build(lo: int, hi_: int) -> dict[str, Any]:  # leaves[lo:hi_], split at the middle cut
        if hi_ - lo == 1:
            return leaves[lo]
        mid = (lo + hi_) // 2
        return {"feature": "gpu_util_pct", "threshold": cuts[mid - 1], "left": build(lo, mid), "right": build(mid, hi_)}

    fit = {"time": [float(v) for v in time_line], "power": [float(v) for v in power_line]}
    return build(0, len(leaves)), fit


def _power_prior(curves: Sequence[WorkloadCurve], consts: BoardConstants, target: Board) -> dict[str, Any] | None:
    """The target's power prior (power_prior.board_prior) from the calibration points that logged GPU utilisation;
    None where they are too few to make one."""
    from dvfs_mlops.model.curve import Measurement
    from dvfs_mlops.model.power_prior import board_prior

    points = [[Measurement(f, c.time_s[f], c.energy_j[f], c.gpu_util_pct[f] / 100.0) for f in c.clocks if f in c.gpu_util_pct]
              for c in curves]
    prior = board_prior(points, voltage_shape=consts.voltage_shape, f_max_mhz=consts.f_max_mhz, noise=target.noise()[1])
    if prior is None:
        return None
    return dataclasses.asdict(dataclasses.replace(prior, voltage_shape=consts.voltage_shape, f_max_mhz=consts.f_max_mhz))
