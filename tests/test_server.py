"""A shared MLflow tracking server (SQLite backend on 127.0.0.1): concurrent workers, a server that dies."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dvfs_mlops.hw.guard import list_journals
from testkit.fakes.pgserver import MlflowServer
from tests.conftest import REPO

# 4 workers, one sweep each, at once; 8 workers sharing sweeps under server and database restarts: test_fleet.py
WORKLOADS = [(m, t) for m in ("bert-tiny", "pythia-14m") for t in ("sst2", "mrpc")]


def sqlite_server(root: Path) -> MlflowServer:
    """`mlflow server` on a SQLite store in `root`, two workers (the fleet's server class, another backend)."""
    return MlflowServer(root, f"sqlite:///{root}/server.db", start_timeout=90)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (a start costs ~10-20 s of a loaded machine); the test that kills it runs last."""
    s = sqlite_server(tmp_path_factory.mktemp("sqlite-server"))
    yield s
    s.stop()


def _sweep_cmd(model: str, task: str) -> list[str]:
    return [sys.executable, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", model, "--tasks", task,
            "--freqs", "816", "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", "concurrent"]


def test_concurrent_workers_every_point_exactly_once(server):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri}
    procs = [subprocess.Popen(_sweep_cmd(m, t), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m, t in WORKLOADS]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    c = MlflowClient(tracking_uri=server.uri)
    exp = c.get_experiment_by_name("concurrent")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`dvfs.point` != ''", max_results=1000)
    keys = sorted(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED")
    expected = sorted(f"{m}/{t}@{f}#0" for m, t in WORKLOADS for f in ("maxn", "816"))
    assert keys == expected  # 8 points, each exactly once
    assert len(runs) == len(expected)


def test_server_dying_mid_sweep_fails_the_point_cleanly(server, orin6, state_dir):
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
           "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    cmd = [sys.executable, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2",
           "--steps", "6", "--train-size", "32", "--dev-size", "16", "--device", "jetson"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[1/"):
            break
    server.stop()
    _, rest = proc.communicate(timeout=300)
    err = "".join(seen) + rest
    assert proc.returncode == 2, err
    errors = [l for l in err.splitlines() if l.startswith("Error:")]
    assert len(errors) == 1, err[-3000:]
    assert "[1/" in err  # the first point landed before the server died
    assert "tracking store" in errors[0] and "re-run the same sweep" in errors[0]
    assert "Traceback" not in err
    assert orin6.range_hz == (306000000, 1300500000) and list_journals(state_dir) == []
