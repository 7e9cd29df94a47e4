"""Sweeps: every workload x clock x repeat as one nested MLflow run, resumable and shared by workers.

`spec.py` defines a sweep (presets, `SweepRequest` -> `SweepSpec`, its points and its identity), `runner.py` runs it
(the one loop: parent run, claims, retries, artifacts) with a strategy of `grid.py` or `adaptive.py`, `points.py` runs
and logs one point, `resume.py` reads what the store already has, `artifacts.py` and `plots.py` draw the parent's
summary. On the twin each workload trains once and its step trace is replayed at the other clocks (tag
`dvfs.sim_train_once=true`); `steps=0` only plans and charges the steps (tag `dvfs.profile_only=true`).
"""
from __future__ import annotations

from dvfs_mlops.mlops.sweep.runner import STORE_FAILURES_PER_POINT, RunOptions, SweepOutcome, run_sweep
from dvfs_mlops.mlops.sweep.spec import PRESETS, Point, SweepPreset, SweepRequest, SweepSpec, build_spec, check_request

__all__ = ["PRESETS", "STORE_FAILURES_PER_POINT", "Point", "RunOptions", "SweepOutcome", "SweepPreset", "SweepRequest", "SweepSpec",
           "build_spec", "check_request", "run_sweep"]
