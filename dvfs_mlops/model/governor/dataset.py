"""The governor's data: one row per workload (features, energy/time curves, label), and the fill-ins of an adaptive
sweep's unmeasured clocks from the curve model. Reading them from a sweep's MLflow runs is `mlops.dataset`."""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE, Board
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.workload import NUMERIC_FEATURES, WorkloadFeatures, split_variant

if TYPE_CHECKING:
    from dvfs_mlops.model.curve import PowerPrior

log = logging.getLogger(__name__)

__all__ = ["NUMERIC_FEATURES", "FitCheck", "GovernorDataset", "WorkloadCurve", "check_fit", "feature_matrix", "fill_from_curves",
           "with_fitted_curves"]


@dataclasses.dataclass
class WorkloadCurve:
    """One workload's curves. `energy_j`/`time_s` are measured (mean over repeats); the `*_expected_*` ones are the
    twin's noise-free values (metrics energy_expected_j, time_expected_s), empty on hardware and where runs did not log them;
    the `*_fit_*` ones the curve model's fit to the measured clocks (`with_fitted_curves`), empty until it is made.

    A partial sweep leaves some clocks out: every method works on the clocks this workload has."""

    workload: str  # "bert-base/rte"
    split: str  # train | eval
    features: WorkloadFeatures  # gpu_util_pct measured at maxn
    energy_j: dict[float, float]  # mean over repeats, per pinned clock
    time_s: dict[float, float]
    maxn_energy_j: float
    maxn_time_s: float
    accuracy: dict[str, float] = dataclasses.field(default_factory=dict)  # freq label -> eval metric
    energy_expected_j: dict[float, float] = dataclasses.field(default_factory=dict)
    time_expected_s: dict[float, float] = dataclasses.field(default_factory=dict)
    maxn_energy_expected_j: float | None = None
    maxn_time_expected_s: float | None = None
    gpu_util_pct: dict[float, float] = dataclasses.field(default_factory=dict)  # mean over repeats, per measured pinned clock
    energy_fit_j: dict[float, float] = dataclasses.field(default_factory=dict)  # the curve model's fit, per measured clock
    time_fit_s: dict[float, float] = dataclasses.field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.workload.split("/", 1)[0]

    @property
    def task(self) -> str:
        """The task without the workload's variant: a LoRA job on sst2 is held out with sst2."""
        return split_variant(self.workload.split("/", 1)[-1])[0]

    @property
    def clocks(self) -> list[float]:
        """The pinned clocks this workload measured, ascending."""
        return sorted(self.energy_j)

    @property
    def has_expected(self) -> bool:
        """True when the noise-free curve covers every measured clock and maxn."""
        return (bool(self.energy_expected_j) and set(self.energy_j) <= set(self.energy_expected_j)
                and set(self.energy_j) <= set(self.time_expected_s) and self.maxn_time_expected_s is not None)

    def truth(self) -> tuple[dict[float, float], dict[float, float], float, float]:
        """(energy, time, maxn time, maxn energy) to judge a choice by: expected where logged, else the measured mean."""
        if self.has_expected:
            e = {f: self.energy_expected_j[f] for f in self.energy_j}
            t = {f: self.time_expected_s[f] for f in self.energy_j}
            return e, t, float(self.maxn_time_expected_s), float(self.maxn_energy_expected_j or self.maxn_energy_j)  # type: ignore[arg-type]
        return dict(self.energy_j), dict(self.time_s), self.maxn_time_s, self.maxn_energy_j

    @property
    def has_fit(self) -> bool:
        """True when the curve model's fit covers every measured clock."""
        return bool(self.energy_fit_j) and set(self.energy_j) <= set(self.energy_fit_j) and set(self.energy_j) <= set(self.time_fit_s)

    def measured(self, fitted: bool = False) -> tuple[dict[float, float], dict[float, float]]:
        """(energy, time) per measured clock: as measured, or (`fitted`, where the fit was made) the curve model's fit."""
        if fitted and self.has_fit:
            return {f: self.energy_fit_j[f] for f in self.energy_j}, {f: self.time_fit_s[f] for f in self.energy_j}
        return dict(self.energy_j), dict(self.time_s)

    def label(self, objective: Objective, fitted: bool = False) -> float:
        """The measured best clock (all hardware can give; `fitted`: on the curve model's fit): what a classifier learns."""
        energy, time = self.measured(fitted)
        return objective.best(energy, time, self.maxn_time_s)

    def true_label(self, objective: Objective) -> float:
        e, t, mt, _ = self.truth()
        return objective.best(e, t, mt)

    def regret(self, chosen: float, objective: Objective) -> float:
        """Regret against the truth (the expected oracle where logged, else the mean-over-repeats one)."""
        e, t, mt, _ = self.truth()
        return objective.regret(self.nearest(chosen), e, t, mt)

    def regret_measured(self, chosen: float, objective: Objective) -> float:
        return objective.regret(self.nearest(chosen), self.energy_j, self.time_s, self.maxn_time_s)

    def nearest(self, freq: float) -> float:
        """The measured clock nearest to `freq` (ties go up): a policy is judged among the clocks that were measured."""
        f = float(freq)
        return f if f in self.energy_j else min(self.energy_j, key=lambda c: (abs(c - f), -c))

    def normalised(self, truth: bool = False, fitted: bool = False) -> tuple[dict[float, float], dict[float, float]]:
        """(E/E_min, T/T_maxn) per measured clock: the shape of the curve, comparable across workload sizes; on the truth,
        on the measurements, or (`fitted`) on the curve model's fit to them where it was made."""
        e, t, mt, _ = self.truth() if truth else (*self.measured(fitted), self.maxn_time_s, self.maxn_energy_j)
        lo = min(e.values())
        return {f: v / lo for f, v in e.items()}, {f: v / mt for f, v in t.items()}


@dataclasses.dataclass
class GovernorDataset:
    curves: list[WorkloadCurve]
    frequencies: list[float]
    sweep_id: str
    device_profile: str
    simulated: bool
    repeats: int = 1  # runs per measured point (the median): a point's mean is that much less noisy than one run
    board: Board | None = None  # the sweep's board (its parent run's record); None: nothing is known of it
    fit_check: FitCheck | None = None  # whether the curve model describes these curves (`with_fitted_curves`)

    def split(self, name: str | None) -> GovernorDataset:
        if name is None:
            return self
        return dataclasses.replace(self, curves=[c for c in self.curves if c.split == name])

    def __len__(self) -> int:
        return len(self.curves)


Curves = tuple[dict[float, float], dict[float, float], dict[float, float]]  # energy, time and GPU util % by clock


def _shape(board: Board, every: Sequence[Sequence[Any]]) -> float:
    """The voltage-curve shape the fills and the prior use: the board's own where it is known (the twin's profile),
    else fitted across the sweep's workloads (a real board's curve is not the Orin default the record assumes, and
    the default would bias every fill-in and the clock each workload's curve calls best); the Orin's when no workload
    has three clocks."""
    from dvfs_mlops.model.curve import fit_voltage_shape

    if board.voltage_shape_known:
        return board.voltage_shape
    try:
        return fit_voltage_shape(every, board.f_max_mhz)
    except DvfsError:
        return ORIN_VOLTAGE_SHAPE


def _assumed_board(freqs: Sequence[float]) -> Board:
    """A board nothing is known of, on the sweep's clocks (its curve assumed, its noise the default)."""
    return Board("unknown", "", "", "", False, tuple(sorted(float(f) for f in freqs)))


def fill_from_curves(measured: Sequence[Curves], freqs: Sequence[float], gaps: Sequence[int], board: Board | None = None,
                     repeats: int = 1) -> float:
    """Predict the clocks the adaptive-sweep workloads `measured[i]` (i in `gaps`) did not measure (their energy, time
    and GPU utilisation by clock; energy and time filled in place) from their own curve fits (curve.py), on the
    sweep's board (its record; None: a board nothing is known of): its voltage shape (`_shape`), its table top, and
    the noise of a mean of `repeats` runs. Where the utilisation was logged, each gap's power curve also leans on the
    board's power prior from the sweep's other workloads (power_prior.py), as the sweep's own predictions do.
    Returns the voltage shape used."""
    from dvfs_mlops.model.curve import Measurement, fit_curve
    from dvfs_mlops.model.power_prior import leave_one_out_priors

    def points(energy: dict[float, float], time: dict[float, float], util: dict[float, float]) -> list[Measurement]:
        return [Measurement(f, time[f], energy[f], util[f] / 100.0 if f in util else None) for f in energy]

    board = board or _assumed_board(freqs)
    every = [points(*w) for w in measured]
    shape, noise = _shape(board, every), board.noise(repeats)
    priors = leave_one_out_priors(every, voltage_shape=shape, f_max_mhz=board.f_max_mhz, noise=noise[1])
    for i in gaps:
        energy, time, _ = measured[i]
        fit = fit_curve(every[i], voltage_shape=shape, f_max_mhz=board.f_max_mhz, noise=noise, prior=priors[i])
        for pt in fit.predict([f for f in freqs if f not in energy]):
            energy[pt.freq_mhz], time[pt.freq_mhz] = pt.energy_j, pt.time_s
    return shape


@dataclasses.dataclass(frozen=True)
class FitCheck:
    """Whether the curve model describes a sweep's curves: every interior measured clock of every workload predicted
    from the rest of that workload's clocks, by the model fitted without it and by the line between its two neighbours.

    The neighbours' line is the model-free yardstick: it gains nothing from a shape, so it is as good as the
    measurements are smooth (their noise, and the curve's bend across one table step). A model that predicts a clock it
    did not see worse than that has the wrong shape for this board (on public A100/A40 sweeps it does: their power
    curve is not c + d V(f)^2 f), and its fit would move the minimum instead of finding it.

    Attributes:
        model_error: root mean square of (model prediction / measured energy - 1) over the points.
        neighbour_error: the same for the neighbours' line.
        points: the interior clocks predicted (of workloads with four or more clocks).
        model_fits: (property) points were predicted and the model's error is the smaller.
    """

    model_error: float
    neighbour_error: float
    points: int

    @property
    def model_fits(self) -> bool:
        return self.points > 0 and self.model_error <= self.neighbour_error


def check_fit(workloads: Sequence[Sequence[Any]], voltage_shape: float, f_max_mhz: float) -> FitCheck:
    """`FitCheck` of the curve model on these workloads' measurements (`curve.Measurement`s, any order)."""
    from dvfs_mlops.model.curve import fit_curve

    model: list[float] = []
    neighbours: list[float] = []
    for points in workloads:
        pts = sorted(points, key=lambda m: m.freq_mhz)
        if len(pts) < 4:
            continue
        for i in range(1, len(pts) - 1):
            rest = pts[:i] + pts[i + 1:]
            try:
                predicted = fit_curve(rest, voltage_shape=voltage_shape, f_max_mhz=f_max_mhz).predict([pts[i].freq_mhz])[0]
            except DvfsError:
                continue
            lo, mid, hi = pts[i - 1], pts[i], pts[i + 1]
            line = lo.energy_j + (hi.energy_j - lo.energy_j) * (mid.freq_mhz - lo.freq_mhz) / (hi.freq_mhz - lo.freq_mhz)
            model.append(predicted.energy_j / mid.energy_j - 1.0)
            neighbours.append(line / mid.energy_j - 1.0)
    if not model:
        return FitCheck(math.nan, math.nan, 0)
    return FitCheck(_rms(model), _rms(neighbours), len(model))


def with_fitted_curves(dataset: GovernorDataset) -> GovernorDataset:
    """The dataset with each workload's curve-model fit at its measured clocks (`energy_fit_j`, `time_fit_s`) where the
    model describes this board's curves (`check_fit`, kept as `fit_check`); else the dataset as it is, with its check.

    A flat curve's measured minimum is mostly noise: one run per clock (the twin's 1 % time and 2 % power noise per
    window) moves the clock with the least measured energy by several table steps, where the expected curve differs
    by less than that noise between them. The fit (curve.py: time = a + b/f, power = c + d V(f)^2 f, four parameters
    from every clock the workload measured) averages that noise over all of them. The voltage shape is the board's
    own where the sweep's record knows it, else one fitted across this dataset's workloads (`_shape`: a board
    constant). A workload with fewer than three clocks, or points the model refuses, keeps no fit (the governor then
    reads its measurements).
    """
    from dvfs_mlops.model.curve import Measurement, fit_curve

    board = dataset.board or _assumed_board(dataset.frequencies)
    every = [[Measurement(f, c.time_s[f], c.energy_j[f]) for f in c.clocks] for c in dataset.curves]
    shape = _shape(board, every)
    check = check_fit(every, shape, board.f_max_mhz)
    if not check.model_fits:
        log.info("the curve model predicts a held-out clock %.2f %% off (rms), the neighbouring clocks %.2f %%: the governor "
                 "reads the measured curves", 100 * check.model_error, 100 * check.neighbour_error)
        return dataclasses.replace(dataset, fit_check=check)
    out = []
    for curve, points in zip(dataset.curves, every):
        if len(points) < 3:
            out.append(curve)
            continue
        try:
            fit = fit_curve(points, voltage_shape=shape, f_max_mhz=board.f_max_mhz)
        except DvfsError as e:
            log.info("%s: no curve fit (%s); the governor reads its measurements", curve.workload, e)
            out.append(curve)
            continue
        predicted = fit.predict(curve.clocks)
        out.append(dataclasses.replace(curve, energy_fit_j={pt.freq_mhz: pt.energy_j for pt in predicted},
                                       time_fit_s={pt.freq_mhz: pt.time_s for pt in predicted}))
    return dataclasses.replace(dataset, curves=out, fit_check=check)


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def board_power_prior(dataset: GovernorDataset) -> PowerPrior | None:
    """The board's power prior (power_prior.py) from every workload's measured clocks with their GPU utilisation, for
    refine at launch on workloads the sweep never saw: `train` stores it on the governor version. The voltage shape
    and table top it was fitted with travel with it (`_shape`, the board's table). None without enough workloads that
    logged utilisation."""
    from dvfs_mlops.model.curve import Measurement
    from dvfs_mlops.model.power_prior import board_prior

    points = [[Measurement(f, c.time_s[f], c.energy_j[f], c.gpu_util_pct[f] / 100.0) for f in sorted(c.gpu_util_pct)
               if f in c.energy_j and f in c.time_s] for c in dataset.curves]
    board = dataset.board or _assumed_board(dataset.frequencies)
    shape = _shape(board, points)
    prior = board_prior(points, voltage_shape=shape, f_max_mhz=board.f_max_mhz, noise=board.noise(dataset.repeats)[1])
    return None if prior is None else dataclasses.replace(prior, voltage_shape=shape, f_max_mhz=board.f_max_mhz)


def feature_matrix(curves: Sequence[WorkloadCurve], columns: Sequence[str]) -> list[list[float]]:
    """Numeric features for sklearn (columns from NUMERIC_FEATURES); model_type becomes is_decoder (0/1)."""
    rows = []
    for c in curves:
        values = c.features.numeric_row()
        rows.append([float(values[k]) for k in columns])
    return rows
