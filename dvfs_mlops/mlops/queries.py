"""Queries over a sweep's MLflow runs, shared by the sweep (resume, artifacts) and the governor (dataset).

It sits beside `tracking.py`: it knows the tag names, nothing about how a point is run.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import tracking


def sweep_frame(experiment_ids: list[str], sweep_id: str) -> Any:
    """All FINISHED point runs of a sweep as a pandas DataFrame (one row per run)."""
    import mlflow

    df = mlflow.search_runs(experiment_ids, filter_string=f"tags.`{tracking.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'",
                            max_results=50000)
    if len(df) and f"tags.{tracking.TAG_POINT}" in df:
        df = df[df[f"tags.{tracking.TAG_POINT}"].notna()]
    return df


def find_sweep_ids(c: Any, experiment_ids: list[str], filter_string: str) -> list[str]:
    """Every sweep id with a FINISHED point run matching `filter_string` (an MLflow filter over the point runs, e.g.
    `params.device_profile = 'sim-orin'`), oldest first."""
    where = f"tags.`{tracking.TAG_POINT}` != '' and attributes.status = 'FINISHED'" + (f" and {filter_string}" if filter_string.strip() else "")
    ids: dict[str, None] = {}
    token = None
    while True:
        page = c.search_runs(experiment_ids, filter_string=where, max_results=5000, order_by=["attributes.start_time ASC"], page_token=token)
        for r in page:
            sid = r.data.tags.get(tracking.TAG_SWEEP)
            if sid:
                ids.setdefault(sid, None)
        token = getattr(page, "token", None)
        if not token:
            return list(ids)


def sweeps_frame(experiment_ids: list[str], sweep_ids: list[str]) -> Any:
    """The FINISHED point runs of several sweeps, one frame (a sweep without any is named)."""
    import pandas as pd

    frames = []
    for sid in sweep_ids:
        df = sweep_frame(experiment_ids, sid)
        if not len(df):
            raise DvfsError(f"no FINISHED runs of sweep {sid!r}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def latest_sweep_id(c: Any, experiment: str) -> str:
    """The sweep id of the newest point run of `experiment`."""
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{tracking.TAG_POINT}` != ''", max_results=1,
                         order_by=["attributes.start_time DESC"])
    if not runs:
        raise DvfsError(f"experiment {experiment!r} has no sweep points; run a sweep first (dvfs-mlops sweep)")
    return runs[0].data.tags[tracking.TAG_SWEEP]


@dataclasses.dataclass(frozen=True)
class SweepPoints:
    """A sweep's pinned points as curve-model measurements (`curve.Measurement`, one per run), by workload MODEL/TASK."""

    sweep_id: str
    device_profile: str
    workloads: dict[str, list[Any]]


def sweep_points(experiment: str, sweep_id: str) -> SweepPoints:
    """Every workload's pinned points of a sweep (default: the experiment's latest), with each run's GPU utilisation."""
    import math

    from dvfs_mlops.model.curve import Measurement

    c = tracking.check_reachable()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    sid = sweep_id or latest_sweep_id(c, experiment)
    df = sweep_frame([exp.experiment_id], sid)
    if not len(df):
        raise DvfsError(f"no FINISHED runs of sweep {sid!r} in experiment {experiment!r}")
    df = df[df["params.freq_mhz"] != "maxn"]
    out: dict[str, list[Any]] = {}
    for _, r in df.iterrows():
        pct = r.get("metrics.gpu_util_pct")
        util = None if pct is None or math.isnan(float(pct)) else float(pct) / 100.0
        out.setdefault(f"{r['params.model']}/{r['params.task']}", []).append(
            Measurement(float(r["params.freq_mhz"]), float(r["metrics.time_s"]), float(r["metrics.energy_j"]), util))
    profiles = df["params.device_profile"].dropna().unique() if "params.device_profile" in df else []
    return SweepPoints(sid, str(profiles[0]) if len(profiles) == 1 else "", out)
