"""What a sweep finds in the store before it runs: finished points, stale runs, stale parent runs."""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import lifecycle, schema

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)


def finished_points(c: MlflowClient, experiment_ids: list[str], sweep_id: str) -> tuple[set[str], dict[str, list[str]]]:
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


def point_runs(c: MlflowClient, exp_id: str, sweep_id: str, point_key: str) -> tuple[bool, list[str]]:
    """One point as the store has it now: (a FINISHED run exists, ids of its RUNNING/SCHEDULED runs)."""
    runs = c.search_runs([exp_id], filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and tags.`{schema.TAG_POINT}` = '{point_key}'",
                         max_results=1000)
    finished = any(r.info.status == "FINISHED" for r in runs)
    return finished, [r.info.run_id for r in runs if r.info.status in ("RUNNING", "SCHEDULED")]


def check_same_profile(c: MlflowClient, experiment_ids: list[str], sweep_id: str, profile: str) -> None:
    """A sweep id already measured on another device profile is refused: its points would mix two boards."""
    runs = c.search_runs(experiment_ids, filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and params.device_profile != '{profile}'",
                         max_results=1)
    if runs:
        other = runs[0].data.params.get("device_profile")
        raise DvfsError(f"sweep {sweep_id} was measured on device profile {other!r}, not {profile!r}; "
                        "give this profile its own sweep (drop --sweep-id or choose another)")


def close_stale_parents(c: MlflowClient, experiment_ids: list[str], sweep_id: str, own_parent: str) -> list[str]:
    """End as KILLED this sweep's parent runs left RUNNING by a process that ran on this machine and is gone (kill -9,
    a power cut), so a resumed sweep leaves no parent RUNNING forever; a live worker's parent, or one of another
    machine, is left alone.

    Returns:
        The ids of the runs closed.
    """
    from dvfs_mlops.mlops.claims import process_gone

    runs = c.search_runs(experiment_ids, max_results=1000,
                         filter_string=f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and tags.`{schema.TAG_RUN_NAME}` = 'sweep {sweep_id}' "
                                       "and attributes.status = 'RUNNING'")
    closed = []
    for r in runs:
        if r.info.run_id == own_parent:
            continue
        try:
            gone = process_gone(json.loads(r.data.tags.get(schema.TAG_PROCESS) or "{}"))
        except (ValueError, TypeError, AttributeError):
            gone = False
        if gone:
            lifecycle.end_stale(c, r.info.run_id, "the sweep's process is gone (found by a resumed sweep)")
            closed.append(r.info.run_id)
    return closed
