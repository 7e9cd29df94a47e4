"""`sweep --strategy adaptive` end to end on the twin: few clocks measured, none invented, resumable, usable by train."""
from __future__ import annotations

import csv
import io

from tests.conftest import run_cli

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]


def _runs(uri: str):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("dvfs-sweep")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    return c, [r for r in runs if "dvfs.point" in r.data.tags], [r for r in runs if "dvfs.point" not in r.data.tags]


def test_adaptive_sweep_measures_at_most_four_clocks_logs_predictions_apart_and_resumes(tmp_path, monkeypatch, empty_store):
    uri = empty_store
    env = {"MLFLOW_TRACKING_URI": uri}
    args = ("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2,rte", "--steps", "2", "--strategy", "adaptive")
    r = run_cli(*args, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    c, points, parents = _runs(uri)
    assert len(parents) == 1
    by_workload: dict[str, list[str]] = {}
    for p in points:
        assert p.data.tags["dvfs.strategy"] == "adaptive" and p.info.status == "FINISHED"
        by_workload.setdefault(p.data.tags["dvfs.workload"], []).append(p.data.params["freq_mhz"])
    assert set(by_workload) == {"bert-tiny/sst2", "bert-tiny/rte"}
    for clocks in by_workload.values():
        pinned = [float(f) for f in clocks if f != "maxn"]
        assert clocks.count("maxn") == 1 and 2 <= len(pinned) <= 4 and len(set(pinned)) == len(pinned)
        assert set(pinned) <= set(TABLE)

    # predictions live on the parent, marked as such; every measured clock is flagged measured, no other
    parent = parents[0]
    assert parent.data.tags["dvfs.strategy"] == "adaptive" and "curve model" in parent.data.tags["dvfs.predictions"]
    assert parent.data.tags["dvfs.power_prior"].startswith("none (")  # two workloads: too few for a board prior
    local = c.download_artifacts(parent.info.run_id, "predicted.csv", str(tmp_path))
    rows = list(csv.DictReader(io.StringIO(open(local).read())))
    assert len(rows) == 2 * len(TABLE)
    for w, clocks in by_workload.items():
        measured = {float(x["freq_mhz"]) for x in rows if x["workload"] == w and x["measured"] == "1"}
        assert measured == {float(f) for f in clocks if f != "maxn"}
        assert sum(x["predicted_optimum"] == "1" for x in rows if x["workload"] == w) == 1

    # the governor's dataset takes it: unmeasured clocks come from the curve model, measured ones stay measured
    from dvfs_mlops.mlops.dataset import load_sweep_dataset

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ds = load_sweep_dataset(parent.data.tags["dvfs.sweep_id"])
    assert ds.simulated and len(ds.curves) == 2
    union = sorted({float(p.data.params["freq_mhz"]) for p in points if p.data.params["freq_mhz"] != "maxn"})
    assert ds.frequencies == union
    assert any(len(by_workload[c.workload]) - 1 < len(union) for c in ds.curves), "no clock was left to predict"
    for curve in ds.curves:
        assert curve.clocks == union  # every clock the sweep measured for any workload: measured or predicted
        for p in points:
            if p.data.tags["dvfs.workload"] == curve.workload and p.data.params["freq_mhz"] != "maxn":
                assert curve.energy_j[float(p.data.params["freq_mhz"])] == p.data.metrics["energy_j"]
                assert curve.gpu_util_pct[float(p.data.params["freq_mhz"])] == p.data.metrics["gpu_util_pct"]  # for the power prior
        assert len(curve.gpu_util_pct) == len(by_workload[curve.workload]) - 1  # measured clocks only, never a fill-in

    # resume: the same choices from the finished points, nothing run twice
    r = run_cli(*args, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ran 0 points" in r.stdout
    assert len(_runs(uri)[1]) == len(points)
