"""What a sweep finds in the store before it runs: finished points, stale runs, the parent run."""
from __future__ import annotations

import logging
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.mlops.sweep.spec import SweepSpec

log = logging.getLogger(__name__)


def finished_points(c: Any, experiment_ids: list[str], sweep_id: str) -> tuple[set[str], dict[str, list[str]]]:
    """FINISHED point keys, and run ids of unfinished runs per key (to mark as killed and redo)."""
    runs = c.search_runs(experiment_ids, filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}'", max_results=50000)
    done: set[str] = set()
    stale: dict[str, list[str]] = {}
    for r in runs:
        key = r.data.tags.get(schema.TAG_POINT)
        if not key:
            continue
        if r.info.status == "FINISHED":
            done.add(key)
        elif r.info.status in ("RUNNING", "SCHEDULED"):
            stale.setdefault(key, []).append(r.info.run_id)
    return done, stale


def point_runs(c: Any, exp_id: str, sweep_id: str, point_key: str) -> tuple[bool, list[str]]:
    """One point as the store has it now: (a FINISHED run exists, ids of its RUNNING/SCHEDULED runs)."""
    runs = c.search_runs([exp_id], filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and tags.`{schema.TAG_POINT}` = '{point_key}'",
                         max_results=1000)
    finished = any(r.info.status == "FINISHED" for r in runs)
    return finished, [r.info.run_id for r in runs if r.info.status in ("RUNNING", "SCHEDULED")]


def check_same_profile(c: Any, experiment_ids: list[str], sweep_id: str, profile: str) -> None:
    """A sweep id already measured on another device profile is refused: its points would mix two boards."""
    runs = c.search_runs(experiment_ids, filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and params.device_profile != '{profile}'",
                         max_results=1)
    if runs:
        other = runs[0].data.params.get("device_profile")
        raise DvfsError(f"sweep {sweep_id} was measured on device profile {other!r}, not {profile!r}; "
                        "give this profile its own sweep (drop --sweep-id or choose another)")


def resolve_parent(c: Any, spec: SweepSpec) -> tuple[str, str, bool]:
    """(experiment id, parent run id, created by us). Under `mlflow run`, the parent is MLFLOW_RUN_ID."""
    env_run = settings.mlflow_run_id()
    if env_run:
        try:
            run = c.get_run(env_run)
        except Exception as e:  # noqa: BLE001
            raise DvfsError(f"MLFLOW_RUN_ID={env_run} does not exist in {tracking.tracking_uri()}: {e}") from None
        exp_id = run.info.experiment_id
        exp_name = c.get_experiment(exp_id).name
        if exp_name != spec.experiment:
            log.warning("note: the sweep logs into experiment %r (the one `mlflow run` chose); "
                        "pass --experiment-name %s to `mlflow run` to use %r", exp_name, spec.experiment, spec.experiment)
        return exp_id, env_run, False
    exp_id = tracking.experiment_id(c, spec.experiment)
    run = c.create_run(exp_id, run_name=f"sweep {spec.sweep_id}", tags={schema.TAG_SWEEP: spec.sweep_id})
    return exp_id, run.info.run_id, True
