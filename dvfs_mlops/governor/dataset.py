"""From a sweep's MLflow runs to one row per workload: features, energy/time curves, label."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.governor.objectives import Objective
from dvfs_mlops.workloads.features import NUMERIC_FEATURES, WorkloadFeatures

log = logging.getLogger(__name__)

__all__ = ["NUMERIC_FEATURES", "GovernorDataset", "WorkloadCurve", "dataset_from_frame", "feature_matrix", "load_sweep_dataset",
           "unheld_points", "warn_unheld_clocks"]


@dataclasses.dataclass
class WorkloadCurve:
    workload: str  # "bert-base/rte"
    split: str  # train | eval
    features: WorkloadFeatures  # gpu_util_pct measured at maxn
    energy_j: dict[float, float]  # mean over repeats, per pinned clock
    time_s: dict[float, float]
    maxn_energy_j: float
    maxn_time_s: float
    accuracy: dict[str, float] = dataclasses.field(default_factory=dict)  # freq label -> eval metric

    def label(self, objective: Objective) -> float:
        return objective.best(self.energy_j, self.time_s, self.maxn_time_s)

    def regret(self, chosen: float, objective: Objective) -> float:
        return objective.regret(chosen, self.energy_j, self.time_s, self.maxn_time_s)


@dataclasses.dataclass
class GovernorDataset:
    curves: list[WorkloadCurve]
    frequencies: list[float]
    sweep_id: str
    device_profile: str
    simulated: bool

    def split(self, name: str | None) -> GovernorDataset:
        if name is None:
            return self
        return dataclasses.replace(self, curves=[c for c in self.curves if c.split == name])

    def __len__(self) -> int:
        return len(self.curves)


def _num(v: Any) -> float:
    return float(v)


def unheld_points(df: Any) -> list[str]:
    """Point keys of pinned runs whose measured clock did not hold (tag dvfs.clock_held=false)."""
    from dvfs_mlops import tracking

    col = f"tags.{tracking.TAG_CLOCK_HELD}"
    if col not in df:
        return []
    bad = df[df[col] == "false"]
    key_col = f"tags.{tracking.TAG_POINT}"
    return sorted(str(k) for k in (bad[key_col] if key_col in bad else bad["run_id"]))


def warn_unheld_clocks(df: Any, sweep_id: str = "") -> None:
    """Name the points whose clock strayed: their energy belongs to another clock than the label says."""
    bad = unheld_points(df)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        log.warning("sweep %s: %d point(s) did not hold their pinned clock (throttled or capped), their energy is "
                    "labelled with a clock the GPU did not run at: %s", sweep_id or "?", len(bad), shown)


def dataset_from_frame(df: Any, sweep_id: str = "", device_profile: str = "", simulated: bool = True) -> GovernorDataset:
    """Rows of `mlflow.search_runs` (params.*, metrics.*, tags.*) -> a dataset; missing points are named."""
    if not len(df):
        raise DvfsError(f"sweep {sweep_id or '?'} has no FINISHED point runs")
    df = df.copy()
    df["_workload"] = df["params.model"] + "/" + df["params.task"]
    warn_unheld_clocks(df, sweep_id)
    pinned = df[df["params.freq_mhz"] != "maxn"]
    freqs = sorted({_num(f) for f in pinned["params.freq_mhz"]})
    curves: list[WorkloadCurve] = []
    missing: list[str] = []
    for workload, g in df.groupby("_workload", sort=True):
        have = {_num(f) for f in g.loc[g["params.freq_mhz"] != "maxn", "params.freq_mhz"]}
        lacks = [f"{workload}@{f:g}" for f in freqs if f not in have]
        adaptive = "tags.dvfs.strategy" in g and (g["tags.dvfs.strategy"] == "adaptive").all() and len(have) >= 2
        if adaptive:
            lacks = []  # an adaptive sweep's unmeasured clocks are the curve model's predictions (below)
        if not (g["params.freq_mhz"] == "maxn").any():
            lacks.append(f"{workload}@maxn")
        if lacks:
            missing += lacks
            continue
        gp = g[g["params.freq_mhz"] != "maxn"].assign(_f=lambda x: x["params.freq_mhz"].map(_num))
        energy = gp.groupby("_f")["metrics.energy_j"].mean().to_dict()
        time = gp.groupby("_f")["metrics.time_s"].mean().to_dict()
        if adaptive and set(energy) != set(freqs):
            from dvfs_mlops.curve import Measurement, fit_curve

            fit = fit_curve([Measurement(f, time[f], energy[f]) for f in energy], f_max_mhz=max(freqs))
            for pt in fit.predict([f for f in freqs if f not in energy]):
                energy[pt.freq_mhz], time[pt.freq_mhz] = pt.energy_j, pt.time_s
        m = g[g["params.freq_mhz"] == "maxn"]
        r0 = g.iloc[0]
        feats = WorkloadFeatures(
            model_type=str(r0["params.model_type"]), num_layers=int(r0["params.num_layers"]),
            hidden_size=int(r0["params.hidden_size"]), num_params=int(r0["params.num_params"]),
            avg_seq_len=_num(r0["params.avg_seq_len"]), gpu_util_pct=float(m["metrics.gpu_util_pct"].mean()),
        )
        acc_col = next((c for c in ("metrics.eval_accuracy", "metrics.eval_pearson") if c in g and g[c].notna().any()), None)
        acc = {str(k): float(v) for k, v in g.groupby("params.freq_mhz")[acc_col].mean().items()} if acc_col else {}
        curves.append(WorkloadCurve(workload, str(r0.get("params.split", "train")), feats, energy, time,
                                    float(m["metrics.energy_j"].mean()), float(m["metrics.time_s"].mean()), acc))
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        raise DvfsError(f"sweep {sweep_id or '?'} is missing {len(missing)} point(s): {shown}; re-run the sweep to complete it")
    return GovernorDataset(curves, freqs, sweep_id, device_profile, simulated)


def load_sweep_dataset(sweep_id: str | None = None, experiment: str = "dvfs-sweep") -> GovernorDataset:
    """The dataset of a sweep (by id, else the latest sweep of the experiment)."""
    from dvfs_mlops import tracking
    from dvfs_mlops.runs import latest_sweep_id, sweep_frame

    c = tracking.check_reachable()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    sid = sweep_id or latest_sweep_id(c, experiment)
    df = sweep_frame([exp.experiment_id], sid)
    if not len(df):
        raise DvfsError(f"no FINISHED runs of sweep {sid!r} in experiment {experiment!r}")
    profile = str(df["params.device_profile"].iloc[0])
    simulated = str(df[f"tags.{tracking.TAG_SIMULATED}"].iloc[0]) == "true"
    return dataset_from_frame(df, sid, profile, simulated)


def feature_matrix(curves: Sequence[WorkloadCurve], columns: Sequence[str]) -> list[list[float]]:
    """Numeric features for sklearn (columns from NUMERIC_FEATURES); model_type becomes is_decoder (0/1)."""
    rows = []
    for c in curves:
        values = c.features.numeric_row()
        rows.append([float(values[k]) for k in columns])
    return rows
