"""Sweep orchestration: every workload x clock x repeat as one nested MLflow run, resumable.

A sweep is identified by `dvfs.sweep_id` (a hash of its definition unless given), so re-running
the same sweep skips points that already have a FINISHED run and re-does RUNNING/FAILED ones.
On hardware the clock order is shuffled per workload and repeat (seeded by the sweep's seed), so
drift (warming up, a thermal soak) does not line up with the clock; `settle_s` waits between
points.
On the twin, numerics don't depend on the clock: each workload is trained once and its step
trace replayed at the other clocks (tag `dvfs.sim_replay=true`); `steps=0` only plans and charges
the steps (no training, no eval metrics, tag `dvfs.profile_only=true`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from dvfs_mlops import tracking
from dvfs_mlops.finetune import FinetuneResult
from dvfs_mlops.records import point_metrics
from dvfs_mlops.runs import sweep_frame
from dvfs_mlops.sweep.artifacts import log_sweep_artifacts
from dvfs_mlops.sweep.points import POWER_SERIES_MAX_POINTS, run_point
from dvfs_mlops.sweep.progress import Progress
from dvfs_mlops.sweep.resume import check_same_profile, finished_points, resolve_parent
from dvfs_mlops.sweep.spec import MODEL_PRESETS, PRESETS, Point, SweepPreset, SweepSpec, build_spec
from dvfs_mlops.workloads.tasks import get_task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SweepOutcome:
    sweep_id: str
    parent_run_id: str
    ran: list[str]
    skipped: list[str]
    experiment_id: str


def run_sweep(spec: SweepSpec, device: Any, announce: Callable[[str], None] | None = None, *,
              torch_device: str | None = None, settle_s: float = 0.0, start_clock: Callable[[Any], float | None] | None = None) -> SweepOutcome:
    """Run (or resume) a sweep; returns what ran and what was already there.

    `torch_device`: where training runs (default: the backend's own, `device.torch_device`);
    `settle_s`: seconds to idle before each point after the first, on hardware (cool-down).
    `start_clock`: with `spec.strategy == "adaptive"`, the governor's clock for a workload's features
    (where the adaptive search starts; None: the middle of the table).
    """
    from dvfs_mlops.device.placement import resolve_torch_device
    from dvfs_mlops.workloads.prepare import prepare_workload

    say = announce or log.info
    where = resolve_torch_device(device, torch_device)  # CUDA missing: an error before any clock is touched
    c = tracking.check_reachable()  # before any clock is touched
    if (exp := c.get_experiment_by_name(spec.experiment)) is not None:  # before a parent run is made for it
        check_same_profile(c, [exp.experiment_id], spec.sweep_id, device.profile)
    exp_id, parent_id, created = resolve_parent(c, spec)
    done, stale = finished_points(c, [exp_id], spec.sweep_id)
    if spec.strategy == "adaptive":
        from dvfs_mlops.sweep.adaptive import run_adaptive_sweep

        ran_now, found = run_adaptive_sweep(spec, device, c, exp_id, parent_id, created, stale, say, where, start_clock)
        return SweepOutcome(spec.sweep_id, parent_id, ran_now, found, exp_id)
    points = spec.points()
    todo = [p for p in points if p.key not in done]
    sim_label = " (SIMULATED)" if device.simulated else ""
    say(f"sweep {spec.sweep_id}: {len(points)} points, {len(points) - len(todo)} already finished, {len(todo)} to run "
        f"on {device.name}{sim_label}; tracking {tracking.tracking_uri()}, experiment id {exp_id}")
    tracking.log_run_batch(c, parent_id, params={"sweep_definition": json.dumps(spec.definition())[:6000]} if created else {},
                           tags={tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_SIMULATED: str(device.simulated).lower(),
                                 "dvfs.device_profile": device.profile})
    progress = Progress(len(points), len(points) - len(todo), say)
    ran: list[str] = []
    completed = False
    try:
        by_workload: dict[str, list[Point]] = {}
        for p in todo:
            by_workload.setdefault(p.workload, []).append(p)
        for wpoints in by_workload.values():
            model, task = wpoints[0].model, wpoints[0].task
            prepared = prepare_workload(task=task, **spec.entry(model).prepare_kwargs(), data_source=spec.data_source, data_dir=spec.data_dir, seed=spec.seed,
                                        train_size=spec.train_size, dev_size=spec.dev_size, peft=spec.peft, precision=spec.precision)
            split = get_task(task).split
            trace_for = prepared.trace_provider(spec.batch_size, spec.trace_dtype) if device.simulated else None
            trained: dict[int, FinetuneResult] = {}  # repeat -> the run whose numerics are replayed
            for point in wpoints:
                progress.start(point.key)
                for run_id in stale.pop(point.key, []):
                    c.set_terminated(run_id, "KILLED")
                if ran and settle_s > 0 and not device.simulated:
                    time.sleep(settle_s)
                summary = run_point(c, exp_id, parent_id, spec, device, point, prepared, split, trace_for, trained, where)
                ran.append(point.key)
                progress.finish(point.key, summary)
        completed = True
    finally:
        progress.close()
        if completed:  # plots and CSV describe a complete sweep; an interrupted one gets them on resume
            log_sweep_artifacts(c, exp_id, parent_id, spec.sweep_id, device.simulated)
        if created:
            try:
                c.set_terminated(parent_id, "FINISHED" if completed else "KILLED")
            except Exception:
                if completed:
                    raise
    return SweepOutcome(spec.sweep_id, parent_id, ran, sorted(done), exp_id)


__all__ = ["MODEL_PRESETS", "POWER_SERIES_MAX_POINTS", "PRESETS", "Point", "SweepOutcome", "SweepPreset", "SweepSpec", "build_spec",
           "point_metrics", "run_sweep", "sweep_frame"]
