"""One run lifecycle (`mlops.lifecycle.owned_run`): FINISHED on success; KILLED on Ctrl-C, SIGTERM and SIGHUP, also between
clock sessions and after a sweep's last point; FAILED with a one-line reason on any other exception; `mlflow run`'s run
adopted; a parent run a dead process left RUNNING closed when its sweep resumes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli


@pytest.fixture
def store(tmp_path, empty_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    monkeypatch.chdir(tmp_path)
    return empty_store


def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _runs(experiment: str, where: str = "") -> list:
    c = _client()
    exp = c.get_experiment_by_name(experiment)
    return c.search_runs([exp.experiment_id], filter_string=where, max_results=1000) if exp else []


# ---- the outcome, once ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raised, status, reason", [
    (None, "FINISHED", None),
    (KeyboardInterrupt(), "KILLED", "SIGINT"),
    (SystemExit(128 + signal.SIGTERM), "KILLED", "SIGTERM"),
    (SystemExit(128 + signal.SIGHUP), "KILLED", "SIGHUP"),
    (ValueError("the loss diverged\nat step 3"), "FAILED", "ValueError: the loss diverged"),
])
def test_the_outcome_is_the_runs_status_and_reason(store, raised, status, reason):
    from dvfs_mlops.mlops import lifecycle

    with pytest.raises(type(raised)) if raised is not None else _nothing():
        with lifecycle.owned_run("dvfs-test", name="job", tags={"dvfs.workload": "w"}) as run:
            assert _client().get_run(run.run_id).info.status == "RUNNING"  # it exists from the start
            if raised is not None:
                raise raised
    got = _client().get_run(run.run_id)
    assert got.info.status == status and got.data.tags.get("dvfs.end_reason") == reason and got.data.tags["dvfs.workload"] == "w"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_mlflow_runs_run_is_adopted_and_ended_but_a_nested_run_never_adopts_it(store, monkeypatch):
    from dvfs_mlops.mlops import lifecycle, tracking

    c = tracking.client()
    started = c.create_run(tracking.experiment_id(c, "Default"))
    monkeypatch.setenv("MLFLOW_RUN_ID", started.info.run_id)
    with lifecycle.owned_run("dvfs-test", name="adopted") as run:
        assert run.adopted and run.run_id == started.info.run_id and run.experiment_name == "Default"
        with lifecycle.owned_run("dvfs-test", name="trial 0", parent_id=run.run_id) as nested:
            assert not nested.adopted and nested.run_id != run.run_id
    assert c.get_run(run.run_id).info.status == "FINISHED" and c.get_run(run.run_id).data.tags["mlflow.runName"] == "adopted"
    assert c.get_run(nested.run_id).data.tags["mlflow.parentRunId"] == run.run_id


def test_a_user_run_is_logged_into_and_never_ended(store):
    import mlflow

    from dvfs_mlops.mlops import lifecycle

    assert lifecycle.user_run() is None
    with mlflow.start_run() as active:
        run = lifecycle.user_run()
        assert run is not None and not run.ends_here and run.run_id == active.info.run_id
        run.log_batch(metrics={"dvfs_energy_j": 1.5})
        assert _client().get_run(active.info.run_id).info.status == "RUNNING"
    assert _client().get_run(active.info.run_id).data.metrics["dvfs_energy_j"] == 1.5


def test_create_start_and_terminate_live_in_two_modules():
    """The lifecycle module, and the atomic point claims (a claim is a run created before it is read back)."""
    hits = sorted(str(p.relative_to(REPO)) for p in (REPO / "dvfs_mlops").rglob("*.py")
                  if any(word in p.read_text() for word in ("create_run", "set_terminated", "start_run")))
    assert hits == ["dvfs_mlops/mlops/claims.py", "dvfs_mlops/mlops/lifecycle.py"]


# ---- signals, in a real process -------------------------------------------------------------------------------------

class _Process:
    """A process whose stderr is read as it comes (the test waits for a line before it signals)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s: " + "".join(self.lines)[-3000:]
            time.sleep(0.1)

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code


def _env(store: str, state: Path) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": store, "DVFS_STATE_DIR": str(state)}


# A command run with one step of it held (a marker file written, then a long sleep), so a signal lands there for sure.
HELD = """
import sys, time, pathlib
import {module} as target
real = target.{name}
def held(*args, **kwargs):
    pathlib.Path(sys.argv[1]).write_text("held")
    time.sleep(600)
    return real(*args, **kwargs)
target.{name} = held
from dvfs_mlops.app.cli import main
main(sys.argv[2:], prog_name="dvfs-mlops")
"""


def _held(python: str, module: str, name: str, marker: Path, *args: str) -> list[str]:
    return [python, "-c", HELD.format(module=module, name=name), str(marker), *args]


def _wait_file(path: Path, proc: _Process, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.proc.poll() is None and time.monotonic() < deadline, "".join(proc.lines)[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("sig, reason", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_a_finetune_stopped_mid_training_ends_killed_with_its_clocks_restored(store, state_dir, tmp_path, sig, reason, warm):
    for args in (("registry", "bootstrap"), ("registry", "promote", "1")):  # a production governor decides
        assert run_cli(*args).returncode == 0
    p = _Process([warm.python, "-m", "dvfs_mlops", "finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "sim",
                  "--steps", "100000", "--train-size", "64", "--probe-steps", "0", "--no-save-model"],
                 _env(store, state_dir), tmp_path)
    p.wait_for("fine-tuning on cpu")
    time.sleep(1.0)  # training
    assert p.stop(sig) != 0
    runs = _runs("dvfs-finetune")
    assert [r.info.status for r in runs] == ["KILLED"], "".join(p.lines)[-2000:]
    assert runs[0].data.tags["dvfs.end_reason"] == reason and runs[0].data.tags["governor.version"] == "1"
    assert not list(state_dir.glob("restore-*.json")), "a journal was left: the clock was not restored"


@pytest.mark.parametrize("sig, reason", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_a_sweep_stopped_mid_point_ends_killed_parent_and_point(store, state_dir, tmp_path, sig, reason, warm):
    p = _Process([warm.python, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--device", "sim", "--models", "bert-tiny",
                  "--tasks", "sst2", "--freqs", "510", "--steps", "100000", "--train-size", "64", "--claims", "none"],
                 _env(store, state_dir), tmp_path)
    p.wait_for("sweep sweep-")  # the sweep's announcement: its parent run and the first point's run come next
    deadline = time.monotonic() + 120
    while not _runs("dvfs-sweep", "tags.`dvfs.point` != ''"):
        assert p.proc.poll() is None and time.monotonic() < deadline, "".join(p.lines)[-3000:]
        time.sleep(0.2)
    time.sleep(1.5)  # the point trains
    assert p.stop(sig) != 0
    statuses = {r.data.tags.get("dvfs.point", "parent"): (r.info.status, r.data.tags.get("dvfs.end_reason")) for r in _runs("dvfs-sweep")}
    assert statuses == {"parent": ("KILLED", reason), "bert-tiny/sst2@maxn#0": ("KILLED", reason)}, statuses
    assert not list(state_dir.glob("restore-*.json"))


@pytest.mark.parametrize("sig, reason", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_an_evaluate_stopped_midway_ends_killed(store, state_dir, tmp_path, sig, reason, warm):
    _hand_sweep()
    marker = tmp_path / "held"
    p = _Process(_held(warm.python, "dvfs_mlops.mlops.evaluate", "evaluate_dataset", marker, "evaluate", "--sweep-id", "hand",
                       "--policies", "ffg,maxn,oracle"), _env(store, state_dir), tmp_path)
    _wait_file(marker, p)
    assert p.stop(sig) != 0
    runs = _runs("dvfs-evaluate")
    assert [(r.info.status, r.data.tags.get("dvfs.end_reason")) for r in runs] == [("KILLED", reason)], "".join(p.lines)[-2000:]


def test_an_exception_in_evaluate_ends_failed_with_the_reason(store, monkeypatch):
    from dvfs_mlops.mlops import evaluate

    _hand_sweep()

    def full_disk(*a, **k):
        raise OSError("No space left on device: 'savings.png'")

    monkeypatch.setattr(evaluate, "savings_chart", full_disk)
    r = run_cli("evaluate", "--sweep-id", "hand", "--policies", "ffg,maxn,oracle")
    assert r.returncode != 0
    runs = _runs("dvfs-evaluate")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags["dvfs.end_reason"] == "OSError: No space left on device: 'savings.png'"
    assert runs[0].data.params["sweep_id"] == "hand"  # what it had logged stays


def _hand_sweep() -> None:
    """A tiny sweep logged by hand: two workloads (one training, one held-out) at maxn and one clock."""
    from dvfs_mlops.mlops import tracking

    c = tracking.client()
    exp = tracking.experiment_id(c, "dvfs-sweep")
    for task, split in (("sst2", "train"), ("rte", "eval")):
        for freq, energy in (("maxn", 100.0), ("612", 70.0)):
            run = c.create_run(exp, tags={"dvfs.sweep_id": "hand", "dvfs.point": f"m/{task}@{freq}#0", "dvfs.workload": f"m/{task}",
                                          "dvfs.simulated": "true"})
            tracking.log_run_batch(c, run.info.run_id, params={"model": "m", "task": task, "freq_mhz": freq, "split": split,
                                                               "model_type": "encoder", "num_layers": 2, "hidden_size": 128,
                                                               "num_params": 4_000_000, "avg_seq_len": 20.0, "device_profile": "sim-orin"},
                                   metrics={"energy_j": energy, "time_s": 1.0, "gpu_util_pct": 50.0})
            c.set_terminated(run.info.run_id, "FINISHED")


# ---- a sweep's parent in every case ---------------------------------------------------------------------------------

SMOKE = ["sweep", "--preset", "smoke", "--device", "sim", "--steps", "0", "--models", "bert-tiny", "--tasks", "sst2",
         "--claims", "none"]


def test_a_sigterm_after_the_last_point_ends_the_parent_killed_and_a_resume_finishes_it(store, state_dir, tmp_path, warm):
    marker = tmp_path / "held"
    p = _Process(_held(warm.python, "dvfs_mlops.mlops.sweep.runner", "log_sweep_artifacts", marker, *SMOKE), _env(store, state_dir), tmp_path)
    _wait_file(marker, p)  # every point done; the artifacts are next
    assert p.stop(signal.SIGTERM) != 0
    parents = _runs("dvfs-sweep", "tags.`mlflow.runName` LIKE 'sweep %'")
    assert [(r.info.status, r.data.tags.get("dvfs.end_reason")) for r in parents] == [("KILLED", "SIGTERM")]
    points = _runs("dvfs-sweep", "tags.`dvfs.point` != ''")
    assert points and {r.info.status for r in points} == {"FINISHED"}
    r = run_cli(*SMOKE)
    assert r.returncode == 0 and "ran 0 points" in r.stdout, r.stderr
    statuses = sorted(r.info.status for r in _runs("dvfs-sweep", "tags.`mlflow.runName` LIKE 'sweep %'"))
    assert statuses == ["FINISHED", "KILLED"]


def test_a_parent_left_running_by_a_killed_process_is_closed_when_its_sweep_resumes(store, state_dir, tmp_path):
    marker = tmp_path / "held"  # a fresh interpreter: SIGKILL lands on the process itself, not on a warm command's shim
    p = _Process(_held(sys.executable, "dvfs_mlops.mlops.sweep.runner", "log_sweep_artifacts", marker, *SMOKE), _env(store, state_dir), tmp_path)
    _wait_file(marker, p)
    p.stop(signal.SIGKILL)  # nothing runs in the process any more: its parent stays RUNNING
    assert [r.info.status for r in _runs("dvfs-sweep", "tags.`mlflow.runName` LIKE 'sweep %'")] == ["RUNNING"]
    r = run_cli(*SMOKE)
    assert r.returncode == 0, r.stderr
    assert "1 parent run(s) of a process that is gone closed as KILLED" in r.stderr
    parents = {r.info.status: r.data.tags.get("dvfs.end_reason") for r in _runs("dvfs-sweep", "tags.`mlflow.runName` LIKE 'sweep %'")}
    assert parents == {"KILLED": "the sweep's process is gone (found by a resumed sweep)", "FINISHED": None}


def test_under_mlflow_run_the_line_and_the_link_name_the_experiment_the_run_is_in(store):
    """`mlflow run . -e evaluate` without --experiment-name: MLflow's run is in Default, and the command says so."""
    from dvfs_mlops.mlops import tracking

    _hand_sweep()
    c = tracking.client()
    started = c.create_run(tracking.experiment_id(c, "Default"))
    r = run_cli("evaluate", "--sweep-id", "hand", "--policies", "ffg,maxn", env={"MLFLOW_RUN_ID": started.info.run_id})
    assert r.returncode == 0, r.stderr
    exp = c.get_experiment_by_name("Default").experiment_id
    assert f"logged run {started.info.run_id} in Default" in r.stdout
    assert f"/#/experiments/{exp}/runs/{started.info.run_id}?" in r.stdout + r.stderr
    assert c.get_run(started.info.run_id).info.status == "FINISHED" and c.get_experiment_by_name("dvfs-evaluate") is None
