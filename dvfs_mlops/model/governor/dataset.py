"""The governor's data: one row per workload (features, energy/time curves, label), and the fill-ins of an adaptive
sweep's unmeasured clocks from the curve model. Reading them from a sweep's MLflow runs is `mlops.dataset`."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE, Board
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.workload import NUMERIC_FEATURES, WorkloadFeatures, split_variant

if TYPE_CHECKING:
    from dvfs_mlops.model.curve import PowerPrior

log = logging.getLogger(__name__)

__all__ = ["NUMERIC_FEATURES", "GovernorDataset", "WorkloadCurve", "feature_matrix", "fill_from_curves"]


@dataclasses.dataclass
class WorkloadCurve:
    """One workload's curves. `energy_j`/`time_s` are measured (mean over repeats); the `*_expected_*` ones are the
    twin's noise-free values (metrics energy_expected_j, time_expected_s), empty on hardware and where runs did not log them.

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

    def label(self, objective: Objective) -> float:
        """The measured best clock: what a classifier learns from (all hardware can give)."""
        return objective.best(self.energy_j, self.time_s, self.maxn_time_s)

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

    def normalised(self, truth: bool = False) -> tuple[dict[float, float], dict[float, float]]:
        """(E/E_min, T/T_maxn) per measured clock: the shape of the curve, comparable across workload sizes."""
        e, t, mt, _ = self.truth() if truth else (self.energy_j, self.time_s, self.maxn_time_s, self.maxn_energy_j)
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
