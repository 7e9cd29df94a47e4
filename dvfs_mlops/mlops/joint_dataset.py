"""A joint sweep's point runs as a configuration table: what a governor of configurations learns from and is judged on.

A joint grid sweep (`sweep --knobs gpu,cpu[,emc] --strategy grid`) measures every workload at every configuration
(GPU, CPU, EMC clock) of its tables. `load_joint_dataset` reads its FINISHED point runs (`dataset.read_sweep_points`,
the same reader as the GPU-only dataset's) into a `JointDataset`: the `configurations.ConfigurationTable` of cost (the
named joint energy metric the sweep logged, expected where the twin logged it), the time at each configuration (so
`max-slowdown:X` can be judged against the workload's maxn time), the workloads' features as the GPU-only dataset
reads them (`dataset.features_of`, the GPU utilisation at maxn), their train/eval split and CV groups (the task).

The cost metric, first that every point (maxn included; a maxn capped at the start is not the reference and is left
out, as `dataset` does) logged: `energy_joint_expected_j` (the twin's noise-free joint energy, SIMULATED),
`energy_joint_j` (the joint rails, measured), `energy_j` (the energy rails the sweep logged: a replayed grid's energy).
Time matches it: `time_expected_s` with the expected energy, `time_s` with a measured one, logged at every point. The
configurations are the full product of the sweep's GPU, CPU and EMC clocks (the top column is every clock at its top).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dvfs_mlops.clocks import Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import fields, schema
from dvfs_mlops.mlops.dataset import (
    FREQ,
    SPLIT,
    SweepPoints,
    features_of,
    is_replayed,
    model_task,
    read_sweep_points,
    warn_unheld_clocks,
)
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT
from dvfs_mlops.model.governor.configurations import ConfigurationTable
from dvfs_mlops.model.workload import METRIC, NUMERIC_FEATURES, WorkloadFeatures, split_variant

if TYPE_CHECKING:
    import pandas as pd

    from dvfs_mlops.hw.board import Board

# The joint energy a governor of configurations is judged on, by preference (each a declared metric: `fields.py`).
COST_METRICS = ("energy_joint_expected_j", "energy_joint_j", "energy_j")
TIME_METRICS = ("time_expected_s", "time_s")
CPU, EMC = fields.column("cpu_freq_mhz"), fields.column("emc_freq_mhz")
UTIL = fields.column("gpu_util_pct", METRIC)


@dataclasses.dataclass(frozen=True)
class JointDataset:
    """A joint sweep's workloads at every configuration of its tables.

    Attributes:
        table: the configuration table (cost = `metric` at every configuration; features `NUMERIC_FEATURES`; groups: tasks).
        time_s: each workload's time at each configuration (rows x columns; expected where logged).
        maxn_time_s: each workload's time at maxn (the slowdown reference of `max-slowdown:X`).
        maxn_cost: each workload's `metric` at maxn.
        features: each workload's `WorkloadFeatures` (GPU utilisation at maxn).
        splits: each workload's split (train, eval).
        metric: the cost metric's name (`COST_METRICS`).
        rails: the rails the cost sums (param energy_joint_rails, else energy_rails; '' where not logged).
        tuned: the clocks the sweep tuned ("gpu", "cpu", "emc" among them).
        sweep_id, device_profile, simulated, board: the sweep's.
        measured: where `metric` is the twin's expected energy, the same table on the measured (noisy) joint energy
            `energy_joint_j` and `time_s` (what a measured oracle is judged on); None where not logged.
    """

    table: ConfigurationTable
    time_s: np.ndarray
    maxn_time_s: np.ndarray
    maxn_cost: np.ndarray
    features: tuple[WorkloadFeatures, ...]
    splits: tuple[str, ...]
    metric: str
    rails: str
    tuned: tuple[str, ...]
    sweep_id: str
    device_profile: str
    simulated: bool
    board: Board | None = None
    measured: JointDataset | None = None

    @property
    def replayed(self) -> bool:
        """The sweep played a measured grid (a replay device's board): REPLAYED."""
        return is_replayed(self)

    def split(self, name: str) -> JointDataset:
        """The workloads of one split (train, eval; all: every one)."""
        if name == "all":
            return self
        rows = [i for i, s in enumerate(self.splits) if s == name]
        return dataclasses.replace(self, table=self.table.subset(rows), time_s=self.time_s[rows], maxn_time_s=self.maxn_time_s[rows],
                                   maxn_cost=self.maxn_cost[rows], features=tuple(self.features[i] for i in rows),
                                   splits=tuple(self.splits[i] for i in rows),
                                   measured=None if self.measured is None else self.measured.split(name))

    @property
    def slowdown(self) -> np.ndarray:
        """Each workload's time at each configuration over its maxn time (rows x columns)."""
        return self.time_s / self.maxn_time_s[:, None]

    @property
    def top(self) -> int:
        """The column of every clock at its table's top (the GPU-only governor's CPU and memory clocks)."""
        s = self.table.settings
        best = max(s, key=lambda x: (x.cpu_mhz or 0.0, x.emc_mhz or 0.0, x.gpu_mhz))
        return s.index(Setting(max(x.gpu_mhz for x in s), best.cpu_mhz, best.emc_mhz))

    def gpu_only_columns(self) -> list[int]:
        """The columns whose CPU and memory clocks are at their tops: the configurations a GPU-only governor runs."""
        top = self.table.settings[self.top]
        return [j for j, s in enumerate(self.table.settings) if (s.cpu_mhz, s.emc_mhz) == (top.cpu_mhz, top.emc_mhz)]


def configuration_of(row: pd.Series) -> Setting:
    """A point run's configuration from its params freq_mhz, cpu_freq_mhz and emc_freq_mhz."""
    def clock(column: str) -> float | None:
        v = row.get(column)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    return Setting(float(row[FREQ]), clock(CPU), clock(EMC))


def _first_logged(points: pd.DataFrame, names: Sequence[str], label: str) -> str:
    """The first of `names` that every point (maxn included) logged.

    Raises:
        DvfsError: none is logged at every point (one line naming the points that miss the first).
    """
    for name in names:
        column = fields.column(name, METRIC)
        if column in points and points[column].notna().all():
            return name
    first = fields.column(names[0], METRIC)
    lacking = points[points[first].isna()] if first in points else points
    shown = sorted({f"{w}@{f}" for w, f in zip(lacking["_workload"], lacking[FREQ])})
    raise DvfsError(f"sweep {label}: the points log none of {', '.join(names)} at every configuration and at maxn (first missing: "
                    f"{', '.join(shown[:4])}{' ...' if len(shown) > 4 else ''}); re-run the sweep")


def _time_metric(cost_metric: str) -> str:
    """The time metric that matches the cost's: expected (noise-free) time with expected energy, measured with measured."""
    return TIME_METRICS[0] if cost_metric.endswith("_expected_j") else TIME_METRICS[1]


def _missing_product(settings: Sequence[Setting]) -> list[Setting]:
    """The configurations of the product of the settings' GPU, CPU and EMC clocks that are not among them."""
    gpus = sorted({s.gpu_mhz for s in settings})
    cpus = sorted({s.cpu_mhz for s in settings}, key=lambda v: v or 0.0)
    emcs = sorted({s.emc_mhz for s in settings}, key=lambda v: v or 0.0)
    present = set(settings)
    return [s for s in itertools.starmap(Setting, itertools.product(gpus, cpus, emcs)) if s not in present]


def joint_dataset_from_points(points: SweepPoints) -> JointDataset:
    """A `JointDataset` from a joint sweep's point runs (`dataset.read_sweep_points`).

    Raises:
        DvfsError: not a joint sweep; a workload without maxn or without every configuration of the table (one line
            naming them: a governor of configurations learns from the whole grid), or without the GPU utilisation at
            maxn (a replayed grid without that column); no cost metric logged everywhere.
    """
    if not points.joint:
        raise DvfsError(f"sweep {points.label} tunes the GPU clock alone; a governor of configurations learns from a sweep "
                        "of configurations (dvfs-mlops sweep --knobs gpu,cpu,emc --strategy grid)")
    df = points.frame.copy()
    named = f"tags.{schema.TAG_WORKLOAD}"
    df["_workload"] = model_task(df)
    if named in df:
        df["_workload"] = df[named].fillna(df["_workload"])
    warn_unheld_clocks(df, points.label)
    capped = f"tags.{schema.TAG_CAP_AT_START}"
    if capped in df:  # maxn under a cap found at the start is another clock than the reference (as `dataset` reads it)
        df = df[~((df[FREQ] == "maxn") & df[capped].notna())]
    metric = _first_logged(df, COST_METRICS, points.label)
    dataset = _table(points, df, metric)
    measured_column = fields.column("energy_joint_j", METRIC)
    if metric.endswith("_expected_j") and measured_column in df and df[measured_column].notna().all():
        # the twin: the measured joint energy beside the expected (what the measured oracle is judged on)
        dataset = dataclasses.replace(dataset, measured=_table(points, df, "energy_joint_j"))
    return dataset


def _table(points: SweepPoints, df: pd.DataFrame, metric: str) -> JointDataset:
    """The `JointDataset` of the sweep's point runs (`df`, capped maxn left out) on one cost metric and its time metric."""
    pinned = df[df[FREQ] != "maxn"]
    time_metric = _time_metric(metric)
    _first_logged(df, (time_metric,), points.label)
    cost_col, time_col = fields.column(metric, METRIC), fields.column(time_metric, METRIC)
    settings = tuple(sorted({configuration_of(r) for _, r in pinned.iterrows()},
                            key=lambda s: (s.gpu_mhz, s.cpu_mhz or 0.0, s.emc_mhz or 0.0)))
    absent = _missing_product(settings)
    if absent:
        raise DvfsError(f"sweep {points.label}: its configurations are not a full grid ({len(absent)} of the GPU x CPU x EMC product "
                        f"missing: {', '.join(s.label() for s in absent[:4])}{' ...' if len(absent) > 4 else ''}); a governor of "
                        "configurations learns from the whole grid: sweep every combination (--strategy grid)")
    column = {s: j for j, s in enumerate(settings)}
    names, feats, splits, groups, costs, times, maxn_t, maxn_e, holes = [], [], [], [], [], [], [], [], []
    for workload, g in df.groupby("_workload", sort=True):
        m, gp = g[g[FREQ] == "maxn"], g[g[FREQ] != "maxn"]
        cost, time = np.full(len(settings), math.nan), np.full(len(settings), math.nan)
        for j, sg in gp.assign(_j=[column[configuration_of(r)] for _, r in gp.iterrows()]).groupby("_j"):
            cost[int(j)], time[int(j)] = float(sg[cost_col].mean()), float(sg[time_col].mean())  # mean over repeats
        missing = int(np.isnan(cost).sum())
        if m.empty or missing:
            holes.append(f"{workload} ({'no maxn' if m.empty else f'{missing} of {len(settings)} configurations missing'})")
            continue
        maxn_cost = m[cost_col].mean()
        util = float(m[UTIL].mean()) if UTIL in m and m[UTIL].notna().any() else math.nan
        r0 = g.iloc[0]
        names.append(str(workload))
        feats.append(features_of(r0, util))
        splits.append(str(r0.get(SPLIT, "train")))
        groups.append(split_variant(str(workload).split("/", 1)[-1])[0])
        costs.append(cost)
        times.append(time)
        maxn_t.append(float(m[time_col].mean()))
        maxn_e.append(float(maxn_cost))
    if holes:
        shown = ", ".join(holes[:6]) + (f" and {len(holes) - 6} more" if len(holes) > 6 else "")
        raise DvfsError(f"sweep {points.label}: {len(holes)} workload(s) did not measure every configuration of its table: {shown}; "
                        "a governor of configurations learns from the whole grid: resume the sweep (--sweep-id, --strategy grid)")
    no_util = [n for n, f in zip(names, feats) if f.gpu_util_pct is None or math.isnan(f.gpu_util_pct)]
    if no_util:
        raise DvfsError(f"sweep {points.label}: {len(no_util)} workload(s) without the GPU utilisation at maxn the governor decides on "
                        f"({', '.join(no_util[:6])}{' ...' if len(no_util) > 6 else ''}); a replayed grid needs a gpu_util_pct "
                        "column (% at the top setting): add it and sweep again")
    tuned = ("gpu", *(k for k, col in (("cpu", CPU), ("emc", EMC)) if col in pinned and pinned[col].notna().any()))
    rails_col = fields.column("energy_rails" if metric == "energy_j" else "energy_joint_rails")
    rails = str(pinned[rails_col].dropna().iloc[0]) if rails_col in pinned and pinned[rails_col].notna().any() else ""
    matrix = np.array([[f.numeric_row()[c] for c in NUMERIC_FEATURES] for f in feats], dtype=float).reshape(len(feats), len(NUMERIC_FEATURES))
    table = ConfigurationTable(settings, tuple(names), matrix, NUMERIC_FEATURES, np.array(costs).reshape(len(names), len(settings)),
                               tuple(groups))
    return JointDataset(table, np.array(times).reshape(len(names), len(settings)), np.array(maxn_t), np.array(maxn_e), tuple(feats),
                        tuple(splits), metric, rails, tuned, points.label, points.device_profile, points.simulated, points.board)


def load_joint_dataset(sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, *, sweeps_filter: str = "",
                       mix_profiles: bool = False, split: str = "train", say: Callable[[str], None] | None = None) -> JointDataset:
    """The `JointDataset` of a joint sweep (or several: `dataset.read_sweep_points`, the same arguments).

    Raises:
        DvfsError: as `read_sweep_points` and `joint_dataset_from_points`.
    """
    points = read_sweep_points(sweep_id, experiment, sweeps_filter=sweeps_filter, mix_profiles=mix_profiles, split=split, say=say)
    return joint_dataset_from_points(points)
