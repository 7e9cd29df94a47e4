"""MLflow overhead per sweep point (target <= 0.3 s) and wall time of the quick preset on this machine.

usage: python -m benchmarks sweep   (DVFS_BENCH_SWEEP_QUICK=0 skips the quick preset's sweep, minutes on 2 cores)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median_of
from dvfs_mlops.mlops import schema


def mlflow_per_point(n_points: int = 20, steps: int = 60) -> float:
    """Median seconds of MLflow work for one point: create, one log_batch (params, metrics, tags, series), terminate."""
    from dvfs_mlops.mlops import tracking

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        c = tracking.check_reachable()
        exp = tracking.experiment_id(c, "bench")
        parent = c.create_run(exp).info.run_id
        params = {f"p{i}": i for i in range(17)}
        metrics = {f"m{i}": float(i) for i in range(14)}
        tags = {schema.TAG_PARENT: parent, schema.TAG_POINT: "x", schema.TAG_SWEEP: "s"}
        times = []
        for i in range(n_points):
            t0 = time.perf_counter()
            rid = c.create_run(exp, run_name=f"p{i}", tags=tags).info.run_id
            tracking.log_run_batch(c, rid, params=params, metrics=metrics, tags={}, series={"power_w": [1.0] * steps})
            c.set_terminated(rid, "FINISHED")
            times.append(time.perf_counter() - t0)
        del os.environ["MLFLOW_TRACKING_URI"]
    times.sort()
    return times[len(times) // 2]


def quick_preset_wall_s() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "DVFS_CACHE_DIR": f"{tmp}/traces"}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dvfs_mlops", "sweep", "--preset", "quick", "--device", "sim"],
                       env=env, check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1])
        return time.perf_counter() - t0


def run(with_quick: bool | None = None) -> list[tuple[str, str, str]]:
    """The per-point overhead, and (`with_quick`; None: unless DVFS_BENCH_SWEEP_QUICK=0) the quick preset's wall time."""
    if with_quick is None:
        with_quick = os.environ.get("DVFS_BENCH_SWEEP_QUICK", "1") != "0"
    per_point, _ = median_of(mlflow_per_point, 3)
    rows = [("MLflow overhead per sweep point (SQLite, create + log_batch + terminate, 60-step power series)",
             f"{1e3 * per_point:.0f} ms", "<= 300 ms")]
    if with_quick:
        rows.append(("quick preset wall time (72 points, cold trace cache, sim)", f"{quick_preset_wall_s():.0f} s", "a few minutes on 2 cores"))
    return rows
