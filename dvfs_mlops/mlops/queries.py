"""Queries over a sweep's MLflow runs, shared by the sweep (resume, artifacts) and the governor (dataset).

It sits beside `tracking.py`: it knows the tag names, nothing about how a point is run.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ARTIFACT as BOARD_ARTIFACT
from dvfs_mlops.hw.board import Board, legacy_board
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.model.curve import Measurement, mean_measurement


def sweep_frame(experiment_ids: list[str], sweep_id: str) -> Any:
    """All FINISHED point runs of a sweep as a pandas DataFrame (one row per run)."""
    import mlflow

    df = mlflow.search_runs(experiment_ids, filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'",
                            max_results=50000)
    if len(df) and f"tags.{schema.TAG_POINT}" in df:
        df = df[df[f"tags.{schema.TAG_POINT}"].notna()]
    return df


def find_sweep_ids(c: Any, experiment_ids: list[str], filter_string: str) -> list[str]:
    """Every sweep id with a FINISHED point run matching `filter_string` (an MLflow filter over the point runs, e.g.
    `params.device_profile = 'sim-orin'`), oldest first."""
    where = f"tags.`{schema.TAG_POINT}` != '' and attributes.status = 'FINISHED'" + (f" and {filter_string}" if filter_string.strip() else "")
    ids: dict[str, None] = {}
    token = None
    while True:
        page = c.search_runs(experiment_ids, filter_string=where, max_results=5000, order_by=["attributes.start_time ASC"], page_token=token)
        for r in page:
            sid = r.data.tags.get(schema.TAG_SWEEP)
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
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{schema.TAG_POINT}` != ''", max_results=1,
                         order_by=["attributes.start_time DESC"])
    if not runs:
        raise DvfsError(f"experiment {experiment!r} has no sweep points; run a sweep first (dvfs-mlops sweep)")
    return runs[0].data.tags[schema.TAG_SWEEP]


def sweep_board(c: Any, experiment_ids: list[str], sweep_id: str, df: Any = None) -> Board:
    """The board a sweep ran on: `board.json` of its newest parent run (named `sweep <id>`) that carries one. A sweep
    with no such parent run is rebuilt from its points' device profile and clocks (`hw.board.legacy_board`).

    Args:
        c: an MLflow client.
        experiment_ids: where the sweep's runs are.
        sweep_id: the sweep.
        df: the sweep's point runs (`sweep_frame`), for the fallback; read when not given.
    """
    import tempfile

    parents = c.search_runs(experiment_ids, max_results=100, order_by=["attributes.start_time DESC"],
                            filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and tags.`{schema.TAG_RUN_NAME}` = 'sweep {sweep_id}'")
    for r in parents:
        if BOARD_ARTIFACT not in {a.path for a in c.list_artifacts(r.info.run_id)}:
            continue  # an older parent, or one killed before it logged the board
        with tempfile.TemporaryDirectory() as tmp:
            return Board.from_json(Path(c.download_artifacts(r.info.run_id, BOARD_ARTIFACT, tmp)).read_text())
    df = sweep_frame(experiment_ids, sweep_id) if df is None else df
    profiles = sorted({str(p) for p in df["params.device_profile"].dropna()}) if len(df) else []
    clocks = sorted({float(f) for f in df["params.freq_mhz"] if f != MAXN}) if len(df) else []
    return legacy_board(profiles[0] if len(profiles) == 1 else "", clocks)


@dataclasses.dataclass(frozen=True)
class SweepPoints:
    """A sweep's pinned points as curve-model measurements, by workload (MODEL/TASK and its variant): one
    `Measurement` per clock, the mean of its repeats; the sweep's board, and its runs per point."""

    sweep_id: str
    board: Board
    repeats: int
    workloads: dict[str, list[Measurement]]


def sweep_points(experiment: str, sweep_id: str) -> SweepPoints:
    """Every workload's pinned points of a sweep (default: the experiment's latest), repeats averaged, with the GPU
    utilisation each run logged, and the sweep's board.

    Raises:
        DvfsError: no such experiment, or no FINISHED runs of the sweep.
    """
    c = tracking.check_reachable()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    sid = sweep_id or latest_sweep_id(c, experiment)
    df = sweep_frame([exp.experiment_id], sid)
    if not len(df):
        raise DvfsError(f"no FINISHED runs of sweep {sid!r} in experiment {experiment!r}")
    board = sweep_board(c, [exp.experiment_id], sid, df)
    df = df[df["params.freq_mhz"] != MAXN]
    runs: dict[str, dict[float, list[Measurement]]] = {}
    for _, r in df.iterrows():
        pct = r.get("metrics.gpu_util_pct")
        util = None if pct is None or math.isnan(float(pct)) else float(pct) / 100.0
        name = r.get(f"tags.{schema.TAG_WORKLOAD}") or f"{r['params.model']}/{r['params.task']}"
        f = float(r["params.freq_mhz"])
        runs.setdefault(str(name), {}).setdefault(f, []).append(Measurement(f, float(r["metrics.time_s"]), float(r["metrics.energy_j"]), util))
    repeats = max((len(v) for clocks in runs.values() for v in clocks.values()), default=1)
    points = {name: [mean_measurement(f, clocks[f]) for f in sorted(clocks)] for name, clocks in runs.items()}
    return SweepPoints(sid, board, repeats, points)
