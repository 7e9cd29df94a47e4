"""A shared MLflow tracking server (SQLite backend on 127.0.0.1): concurrent workers, a server that dies."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dvfs_mlops.hw.guard import list_journals
from testkit.fakes.pgserver import MlflowServer
from tests.conftest import REPO

# 4 workers, one sweep each, at once; 8 workers sharing sweeps under server and database restarts: test_fleet.py
WORKLOADS = [(m, t) for m in ("bert-tiny", "pythia-14m") for t in ("sst2", "mrpc")]


def sqlite_server(root: Path, template: Path) -> MlflowServer:
    """`mlflow server` on a SQLite store in `root` (a copy of the migrated template: no migrations at start), two
    workers (the fleet's server class, another backend)."""
    shutil.copy2(template, root / "server.db")
    return MlflowServer(root, f"sqlite:///{root}/server.db", start_timeout=90)


@pytest.fixture(scope="module")
def server(tmp_path_factory, store_template):
    """One server for the module (a start costs ~10-20 s of a loaded machine); the test that kills it runs last."""
    s = sqlite_server(tmp_path_factory.mktemp("sqlite-server"), store_template)
    yield s
    s.stop()


def _sweep_cmd(python: str, model: str, task: str) -> list[str]:
    return [python, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", model, "--tasks", task,
            "--freqs", "816", "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", "concurrent"]


def test_concurrent_workers_every_point_exactly_once(server, warm):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri}
    procs = [subprocess.Popen(_sweep_cmd(warm.python, m, t), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


# The sweep with its back-off after a failed store shortened (runner.STORE_BACKOFF_S, 5 s per failure in a row): what
# the test checks is how the sweep ends once its tries are spent, not how long it waits between them.
SHORT_BACKOFF = ("import sys; from dvfs_mlops.mlops.sweep import runner; runner.STORE_BACKOFF_S = 0.2; "
                 "from dvfs_mlops.app.cli import main; main(sys.argv[1:], prog_name='dvfs-mlops')")


def test_server_dying_mid_sweep_fails_the_point_cleanly(server, orin6, state_dir, warm):
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
           "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0"}  # a refused connection fails at once
    cmd = [warm.python, "-c", SHORT_BACKOFF, "sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2",
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
