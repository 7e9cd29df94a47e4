"""A point of a replayed sweep (`--device replay --trace FILE`): one unit of work looked up in the measured grid and
logged as one MLflow run, like any point.

Nothing trains: the point's session (`hw.replay.ReplaySession`, opened through `launch.Launch` at the point's clock)
charges one unit of work, the grid's `time_s` and `energy_j` at that setting, and the run records it with the
workload's features from the file's feature columns (`features_of_grid`). The run carries `dvfs.device=replay`,
`dvfs.trace_sha256` and `dvfs.trace_name` (`replay_tags`), and what is printed says REPLAYED.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import freq_label
from dvfs_mlops.hw.replay import REPLAYED
from dvfs_mlops.mlops import lifecycle, records, schema
from dvfs_mlops.mlops.launch import Decision, Launch
from dvfs_mlops.mlops.sweep.points import log_and_end, tracked
from dvfs_mlops.model.workload import WorkloadFeatures, feature_types

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.replay import ReplayGrid
    from dvfs_mlops.mlops.sweep.points import PointContext
    from dvfs_mlops.mlops.sweep.spec import Point

# What a feature the file does not give is recorded as: the governor then cannot tell workloads apart by it.
_UNKNOWN_FEATURE: Mapping[type, Any] = {str: "encoder", int: 0, float: 0.0}


@dataclasses.dataclass(frozen=True)
class ReplayedWorkload:
    """A workload of a measured grid, as a sweep's strategies see a prepared one: its name and its features.

    Attributes:
        name: the workload, exactly as the file writes it.
        features: the governor's features from the file's feature columns (`features_of_grid`).
        split: train or eval: the workload's side of the governor's held-out split (the file's `split` column; train).
    """

    name: str
    features: WorkloadFeatures
    split: str = "train"


def replayed_workload(grid: ReplayGrid, workload: str) -> ReplayedWorkload:
    """A grid workload as a sweep's point sees it: its features (`features_of_grid`) and its split (the file's `split`
    column, else train)."""
    return ReplayedWorkload(workload, features_of_grid(grid, workload), grid.features.get(workload, {}).get("split", "train"))


def features_of_grid(grid: ReplayGrid, workload: str) -> WorkloadFeatures:
    """A grid workload's features: the file's feature columns; a feature the file lacks is unknown (0, model_type
    encoder, precision fp32), the same for every workload, so the governor does not split on it; `gpu_util_pct` None
    unless the file gives it.

    Args:
        grid: the grid.
        workload: one of its workloads.

    Returns:
        The `WorkloadFeatures`.
    """
    types = feature_types()
    given = grid.features.get(workload, {})
    values: dict[str, Any] = {}
    for name, kind in types.items():
        if name in given:
            values[name] = kind(float(given[name])) if kind is int else kind(given[name])
        elif name in ("gpu_util_pct", "trainable_params"):
            values[name] = None
        elif name != "precision":
            values[name] = _UNKNOWN_FEATURE[kind]
    return WorkloadFeatures(**values)


def replay_tags(device: Device) -> dict[str, str]:
    """The tags of every run measured on a replay device: `dvfs.device=replay`, the grid's SHA-256 and name; {} on any
    other device."""
    grid = getattr(device, "grid", None)
    if getattr(device, "name", "") != "replay" or grid is None:
        return {}
    return {schema.TAG_DEVICE: "replay", schema.TAG_TRACE_SHA256: grid.sha256, schema.TAG_TRACE_NAME: grid.name}


def run_replayed_point(ctx: PointContext, point: Point, workload: ReplayedWorkload, still_mine: Callable[[], bool] | None = None,
                       run_id: str | None = None) -> str | None:
    """Look one point up and log it as one run (`points.run_point`'s contract: the summary line, or None where another
    worker took the point over meanwhile).

    Raises:
        TrackingStoreError: the store failed (after MLflow's bounded retries); the run is left FAILED.
    """
    spec, c, board = ctx.spec, ctx.client, ctx.board
    tags = {schema.TAG_SWEEP: spec.sweep_id, schema.TAG_POINT: point.key, schema.TAG_WORKLOAD: point.workload,
            schema.TAG_SIMULATED: "false", **replay_tags(ctx.device),
            **({schema.TAG_STRATEGY: spec.strategy} if spec.strategy != "grid" else {})}
    with contextlib.ExitStack() as stack:
        run = tracked(lambda: stack.enter_context(lifecycle.owned_run(
            spec.experiment, experiment_id=ctx.experiment_id, name=point.key, tags=tags, parent_id=ctx.parent_id, run_id=run_id,
            client=c)), point)
        launch = Launch(ctx.device, board, Decision.at(point.freq, f"sweep point {point.key}", cpu_mhz=point.cpu_mhz, emc_mhz=point.emc_mhz),
                        label=f"{point.workload}#{point.repeat}")
        session = launch.begin(total_steps=spec.steps, warmup=0)
        for step in range(spec.steps):
            session.step()  # one unit of work, as the grid recorded it at this setting
            launch.step_done(step)
        done = launch.end()
        assert done is not None
        report = done.report
        clock = None if point.freq == "maxn" else float(point.freq)
        params = {**records.feature_params(workload.features), "model": point.model, "split": workload.split, "freq_mhz": freq_label(point.freq), "device": board.backend, "device_profile": board.profile, "steps": spec.steps,
                  "repeat": point.repeat, "data_source": spec.data_source, **records.session_params(session),
                  **records.report_params(report), **point.params()}
        metrics = {**records.report_metrics(report), "clock_mhz": clock or report.clock_mhz_measured,
                   **records.session_metrics(session)}
        if workload.features.gpu_util_pct is not None:
            metrics["gpu_util_pct"] = workload.features.gpu_util_pct
        record = records.RunRecord(params, metrics, records.session_tags(session, report, board),
                                   {"power_w": records.downsample(report.power_series_w)})
        if not log_and_end(run, c, record, point, still_mine):
            return None
    return f"{report.energy_j:.4g} J {REPLAYED} in {report.duration_s:.4g} s"
