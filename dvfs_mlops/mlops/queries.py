"""Queries over a sweep's MLflow runs, shared by the sweep (resume, artifacts) and the governor (dataset).

It sits beside `tracking.py`: it knows the tag names, nothing about how a point is run.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ARTIFACT as BOARD_ARTIFACT
from dvfs_mlops.hw.board import Board, legacy_board
from dvfs_mlops.mlops import fields, schema, tracking
from dvfs_mlops.model.curve import Measurement, mean_measurement
from dvfs_mlops.model.workload import METRIC

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

MODEL, TASK, FREQ, PROFILE = (fields.column(n) for n in ("model", "task", "freq_mhz", "device_profile"))
ENERGY, TIME, UTIL = (fields.column(n, METRIC) for n in ("energy_j", "time_s", "gpu_util_pct"))


def sweep_frame(experiment_ids: list[str], sweep_id: str) -> pd.DataFrame:
    """All FINISHED point runs of a sweep as a pandas DataFrame (one row per run)."""
    import mlflow

    df = mlflow.search_runs(experiment_ids, filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'",
                            max_results=50000)
    if len(df) and f"tags.{schema.TAG_POINT}" in df:
        df = df[df[f"tags.{schema.TAG_POINT}"].notna()]
    return renamed_tags(df)


def renamed_tags(df: Any) -> Any:
    """A frame of runs with a renamed tag read under its name of now: `dvfs.sim_replay` (points logged before the
    twin's train-once was named so) as `dvfs.sim_train_once`."""
    old, new = f"tags.{schema.TAG_TRAIN_ONCE_BEFORE}", f"tags.{schema.TAG_TRAIN_ONCE}"
    if old not in df:
        return df
    merged = df[new].fillna(df[old]) if new in df else df[old]
    return df.drop(columns=[old]).assign(**{new: merged})


def find_sweep_ids(c: MlflowClient, experiment_ids: list[str], filter_string: str) -> list[str]:
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


def sweeps_frame(experiment_ids: list[str], sweep_ids: list[str]) -> pd.DataFrame:
    """The FINISHED point runs of several sweeps, one frame (a sweep without any is named)."""
    import pandas as pd

    frames = []
    for sid in sweep_ids:
        df = sweep_frame(experiment_ids, sid)
        if not len(df):
            raise DvfsError(f"no FINISHED runs of sweep {sid!r}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def calibration_sweeps(c: MlflowClient) -> set[str]:
    """The sweeps calibrated versions were measured with (their `calibration_sweep` tag): a calibration's sweeps, also
    those from before their parent runs said so."""
    from dvfs_mlops.mlops.registry import load_config

    try:
        versions = c.search_model_versions(f"name='{load_config().name}'")
    except Exception:  # noqa: BLE001 - no registered model yet: no calibrations
        return set()
    return {s for v in versions for s in str((v.tags or {}).get(schema.TAG_CALIBRATION_SWEEP) or "").split(",") if s}


def newest_sweep(c: MlflowClient, experiment: str, *, split: str = "train", workload: str = "") -> str:
    """The newest sweep of `experiment` that can serve a command, by its parent runs (a resumed sweep's parent is new,
    so a sweep resumed last counts as the newest): a grid or adaptive sweep with FINISHED points of the `split`'s
    workloads (train, eval; all: any) or of `workload` (MODEL/TASK, any variant), never a calibration sweep.

    Raises:
        DvfsError: no such experiment, or no sweep in it that can serve (the message says what to run).
    """
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    calibrations = calibration_sweeps(c)
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{schema.TAG_RUN_NAME}` LIKE 'sweep %'", max_results=1000,
                            order_by=["attributes.start_time DESC"])
    seen: set[str] = set()
    for parent in parents:
        sid = parent.data.tags.get(schema.TAG_SWEEP)
        if not sid or sid in seen:
            continue
        seen.add(sid)
        if parent.data.tags.get(schema.TAG_SWEEP_KIND) == schema.CALIBRATION_SWEEP or sid in calibrations:
            continue
        if _serves(c, exp.experiment_id, sid, split, workload):
            return sid
    wanted = f"points of {workload}" if workload else "training workloads" if split == "train" else f"{split!r} workloads" \
        if split != "all" else "finished points"
    raise DvfsError(f"experiment {experiment!r} has no sweep with {wanted} (calibration sweeps do not count); run a sweep "
                    "first (dvfs-mlops sweep, e.g. --preset quick) or name one with --sweep-id")


def _serves(c: MlflowClient, experiment_id: str, sweep_id: str, split: str, workload: str) -> bool:
    """The sweep has a FINISHED point of the split's workloads (or of `workload`)."""
    where = f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and tags.`{schema.TAG_POINT}` != '' and attributes.status = 'FINISHED'"
    if workload:
        where += f" and tags.`{schema.TAG_WORKLOAD}` LIKE '{workload}%'"
    elif split != "all":
        where += f" and {fields.column('split')} = '{split}'"
    return bool(c.search_runs([experiment_id], filter_string=where, max_results=1))


def sweep_board(c: MlflowClient, experiment_ids: list[str], sweep_id: str, df: pd.DataFrame | None = None) -> Board:
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
    profiles = sorted({str(p) for p in df[PROFILE].dropna()}) if len(df) else []
    clocks = sorted({float(f) for f in df[FREQ] if f != MAXN}) if len(df) else []
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
    sid = sweep_id or newest_sweep(c, experiment, split="all")
    df = sweep_frame([exp.experiment_id], sid)
    if not len(df):
        raise DvfsError(f"no FINISHED runs of sweep {sid!r} in experiment {experiment!r}")
    board = sweep_board(c, [exp.experiment_id], sid, df)
    df = df[df[FREQ] != MAXN]
    runs: dict[str, dict[float, list[Measurement]]] = {}
    for _, r in df.iterrows():
        pct = r.get(UTIL)
        util = None if pct is None or math.isnan(float(pct)) else float(pct) / 100.0
        name = r.get(f"tags.{schema.TAG_WORKLOAD}") or f"{r[MODEL]}/{r[TASK]}"
        f = float(r[FREQ])
        runs.setdefault(str(name), {}).setdefault(f, []).append(Measurement(f, float(r[TIME]), float(r[ENERGY]), util))
    repeats = max((len(v) for clocks in runs.values() for v in clocks.values()), default=1)
    points = {name: [mean_measurement(f, clocks[f]) for f in sorted(clocks)] for name, clocks in runs.items()}
    return SweepPoints(sid, board, repeats, points)
