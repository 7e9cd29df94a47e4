"""Fault injection on a fake Jetson sysfs tree: exceptions, SIGINT, SIGTERM and SIGKILL at seeded
random points of `dvfs-mlops run`, a sweep and a fine-tune launch. The clocks must be back to
what they were every time, and a sweep killed over and over must end with exactly one FINISHED
run per point once resumed."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from dvfs_mlops.hw.guard import list_journals
from dvfs_mlops.hw.jetson import JetsonDevice, JetsonSession
from tests.conftest import REPO

DEFAULT = (306000000, 1300500000)
TRIALS = 20
FAULTS = ("exception", "sigint", "sigterm")


class Injected(RuntimeError):
    pass


def _arm(monkeypatch, fault: str, at_step: int) -> dict:
    """Make the at_step-th training step of any Jetson session fail with `fault`."""
    state = {"n": 0, "fired": False}

    def step(self, profile=None):
        state["n"] += 1
        if state["n"] == at_step and not state["fired"]:
            state["fired"] = True
            if fault == "exception":
                raise Injected(f"injected at step {at_step}")
            os.kill(os.getpid(), signal.SIGINT if fault == "sigint" else signal.SIGTERM)
            time.sleep(0.05)  # the handler raises in this (main) thread

    monkeypatch.setattr(JetsonSession, "step", step)
    return state


def _assert_restored(fake, state_dir):
    assert fake.range_hz == DEFAULT
    assert list_journals(state_dir) == []


@pytest.fixture
def store(tmp_path, monkeypatch, empty_store):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    return tmp_path


@pytest.fixture(scope="module")
def workload():
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    return prepare_workload("bert-tiny", "sst2", train_size=32, dev_size=16)


def test_run_command_signals_and_sigkill(orin6_kernel, state_dir):
    """`dvfs-mlops run` in a subprocess, signalled at a random moment of its life.

    On the FUSE kernel tree: sysfs ignores O_TRUNC and stores each write(2) whole, so a SIGKILL cannot
    leave a half-written min_freq (a plain file truncated by open("w") could, which no board does)."""
    orin6 = orin6_kernel
    rng = random.Random(1234)
    table = JetsonDevice().frequencies_mhz
    env = dict(os.environ)
    pinned_when_signalled = 0
    for trial in range(TRIALS):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            freq = rng.choice(table)
            proc = subprocess.Popen([sys.executable, "-m", "dvfs_mlops", "run", "--freq", f"{freq:g}", "--device", "jetson",
                                     "--", "sleep", "5"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if rng.random() < 0.75:  # most signals: once the child has pinned the clock (~0.2 s after start on a quiet machine)
                deadline = time.monotonic() + 20
                while orin6.range_hz == DEFAULT and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.15))  # then at a random moment: before pinning, while pinning, or while pinned
            pinned_when_signalled += orin6.range_hz != DEFAULT
            proc.send_signal(sig)
            proc.wait(timeout=30)
            if sig == signal.SIGKILL:
                from dvfs_mlops.hw import restore_journals

                restore_journals(announce=lambda m: None)
            assert orin6.range_hz == DEFAULT, (trial, sig, freq, proc.stderr.read())
            assert list_journals(state_dir) == []
            proc.stderr.close()
    assert pinned_when_signalled >= TRIALS  # most signals land while the clock is pinned, some before


@pytest.mark.parametrize("fault", FAULTS)
def test_run_command_in_process_faults(orin6, state_dir, monkeypatch, fault):
    """run_metered with the child's wait() failing at a random moment."""
    from dvfs_mlops.app.run import run_metered

    rng = random.Random(f"run-{fault}")
    real_wait = subprocess.Popen.wait
    for _ in range(TRIALS):
        delay = rng.uniform(0.0, 0.2)

        def wait(self, timeout=None, _delay=delay):
            if timeout is not None:
                return real_wait(self, timeout)
            time.sleep(_delay)
            if fault == "exception":
                raise Injected("wait failed")
            os.kill(os.getpid(), signal.SIGINT if fault == "sigint" else signal.SIGTERM)
            time.sleep(0.05)
            return real_wait(self)

        monkeypatch.setattr(subprocess.Popen, "wait", wait)
        with pytest.raises((Injected, KeyboardInterrupt, SystemExit)):
            run_metered(JetsonDevice(), f"{rng.choice([510, 816, 1300.5]):g}", ["sleep", "2"])
        monkeypatch.setattr(subprocess.Popen, "wait", real_wait)
        _assert_restored(orin6, state_dir)


def _tiny_sweep_spec(device):
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.mlops.sweep import SweepRequest, build_spec

    return build_spec(board_of(device), SweepRequest("smoke", models="bert-tiny", tasks="sst2", freqs="510,1300.5", steps=3, train_size=32, dev_size=16))


@pytest.mark.parametrize("fault", FAULTS)
def test_sweep_faults_then_resume_exactly_once(orin6, state_dir, store, workload, monkeypatch, fault):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.job.workloads import prepare
    from dvfs_mlops.mlops.sweep import RunOptions, run_sweep

    monkeypatch.setattr(prepare, "prepare_workload", lambda *a, **k: workload)
    rng = random.Random(f"sweep-{fault}")
    spec = _tiny_sweep_spec(JetsonDevice())
    total_steps = len(spec.points()) * spec.steps
    for _ in range(TRIALS):
        _arm(monkeypatch, fault, rng.randint(1, total_steps))
        with contextlib.suppress(Injected, KeyboardInterrupt, SystemExit):
            run_sweep(spec, JetsonDevice(), options=RunOptions(announce=lambda m: None))
        _assert_restored(orin6, state_dir)
    monkeypatch.setattr(JetsonSession, "step", lambda self, profile=None: None)
    run_sweep(spec, JetsonDevice(), options=RunOptions(announce=lambda m: None))
    c = MlflowClient()
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()], filter_string="tags.`dvfs.point` != ''", max_results=5000)
    finished = [r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED"]
    assert sorted(finished) == sorted(p.key for p in spec.points())  # each point exactly once
    assert not [r for r in runs if r.info.status == "RUNNING"]  # interrupted points were closed
    _assert_restored(orin6, state_dir)


def _cut_connection():
    from mlflow.exceptions import MlflowException

    return MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with exception "
                           "('Connection broken: IncompleteRead(0 bytes read, 2 more expected)')")


def _refused_request():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException("Param value '...' had length 6001, which exceeded length limit of 6000", error_code=INVALID_PARAMETER_VALUE)


def _arm_store_cuts(monkeypatch, cuts: set[int], fault=None) -> list[int]:
    """Cut the tracking store's connection (as a server restart does) on the given calls (1-based) of what a sweep asks
    and logs: the parent's tags first, then per point its store read (claimed sweeps) and its results. Returns the calls."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.sweep import runner

    calls: list[int] = []

    def cut_or(real):
        def call(*a, **k):
            calls.append(len(calls) + 1)
            if len(calls) in cuts:
                raise (fault or _cut_connection)()
            return real(*a, **k)
        return call

    monkeypatch.setattr(runner, "STORE_BACKOFF_S", 0.0)
    monkeypatch.setattr(runner, "point_runs", cut_or(runner.point_runs))
    monkeypatch.setattr(tracking, "log_run_batch", cut_or(tracking.log_run_batch))
    return calls


def test_a_claimed_sweep_rides_out_a_cut_store_connection(orin6, state_dir, store, workload, monkeypatch):
    """A fleet worker (claimed points) whose tracking server restarts under a point: the point's run ends FAILED, the clocks
    are restored, the claim is released and the point measured again; every point ends FINISHED exactly once."""
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.job.workloads import prepare
    from dvfs_mlops.mlops.claims import open_claims
    from dvfs_mlops.mlops.sweep import RunOptions, run_sweep

    monkeypatch.setattr(prepare, "prepare_workload", lambda *a, **k: workload)
    monkeypatch.setattr(JetsonSession, "step", lambda self, profile=None: None)
    spec = _tiny_sweep_spec(JetsonDevice())
    calls = _arm_store_cuts(monkeypatch, {3, 4, 6})  # 1: the parent's tags; a point's store read, then its results cut
    said: list[str] = []
    claims = open_claims(None, os.environ["MLFLOW_TRACKING_URI"])
    assert claims.kind == "file"
    out = run_sweep(spec, JetsonDevice(), options=RunOptions(announce=said.append, claims=claims))
    assert len(calls) > 6
    retried = [m for m in said if "the tracking store failed" in m and "trying it again" in m]
    assert len(retried) == 3 and all("Connection broken" in m for m in retried), said
    assert sorted(out.ran) == sorted(p.key for p in spec.points())
    c = MlflowClient()
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()], filter_string="tags.`dvfs.point` != ''", max_results=5000)
    finished = [r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED"]
    assert sorted(finished) == sorted(p.key for p in spec.points())  # each point exactly once
    assert [r.info.status for r in runs if r.info.status != "FINISHED"] == ["FAILED", "FAILED"]  # the two cut while logging
    _assert_restored(orin6, state_dir)


def test_a_store_that_stays_down_stops_the_sweep_with_one_error(orin6, state_dir, store, workload, monkeypatch):
    """Claimed: a store that fails 1 + STORE_FAILURES_PER_POINT times in a row (whatever the point) ends the sweep, not
    each point failing that often in turn; unclaimed (no claims), or a request the store refused: at once. Clocks
    restored every time."""
    from dvfs_mlops.errors import TrackingStoreError
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.workloads import prepare
    from dvfs_mlops.mlops.claims import NoClaims, open_claims
    from dvfs_mlops.mlops.sweep import STORE_FAILURES_PER_POINT, RunOptions, SweepRequest, build_spec, run_sweep

    monkeypatch.setattr(prepare, "prepare_workload", lambda *a, **k: workload)
    monkeypatch.setattr(JetsonSession, "step", lambda self, profile=None: None)
    spec = build_spec(board_of(JetsonDevice()), SweepRequest("smoke", models="bert-tiny", tasks="sst2", freqs="408,510,816,1300.5", steps=3, train_size=32,
                      dev_size=16))
    assert len(spec.points()) > STORE_FAILURES_PER_POINT + 1  # the budget is over points, not per point
    for claims, fault, tries in ((open_claims(None, os.environ["MLFLOW_TRACKING_URI"]), _cut_connection, STORE_FAILURES_PER_POINT + 1),
                                 (NoClaims(), _cut_connection, 1),
                                 (open_claims(None, os.environ["MLFLOW_TRACKING_URI"]), _refused_request, 1)):
        with monkeypatch.context() as m:  # armed afresh each time, not wrapped around the last arming
            calls = _arm_store_cuts(m, set(range(2, 1000)), fault)
            with pytest.raises(TrackingStoreError, match="re-run the same sweep"):
                run_sweep(spec, JetsonDevice(), options=RunOptions(announce=lambda m: None, claims=claims))
        assert len(calls) - 1 == tries  # the parent's tags, then one (failed) store call per try
        _assert_restored(orin6, state_dir)


@pytest.mark.parametrize("fault", FAULTS)
def test_finetune_faults(orin6, state_dir, store, workload, monkeypatch, fault):
    from dvfs_mlops.app import finetune as launcher
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.mlops import governor, registry

    registry.bootstrap(say=lambda m: None)
    registry.promote("latest", say=lambda m: None)
    resolved = governor.load_governor()
    monkeypatch.setattr(governor, "load_governor", lambda uri=None, direct=True: resolved)
    rng = random.Random(f"finetune-{fault}")
    options = launcher.LaunchOptions(probe_steps=0, save_model=False)
    for _ in range(TRIALS):
        _arm(monkeypatch, fault, rng.randint(1, 4))
        with pytest.raises((Injected, KeyboardInterrupt, SystemExit)):
            dev = JetsonDevice()
            board = board_of(dev)
            launcher.run_finetune(dev, board, Job(workload, FinetuneConfig(steps=4), board.torch_device), options, say=lambda m: None)
        _assert_restored(orin6, state_dir)


def test_a_store_outage_anywhere_in_the_cli_is_one_line(store, monkeypatch):
    """MLflow's client giving up on a request outside a point (the sweep's end, a report) is one line, exit 2, no traceback."""
    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main
    from dvfs_mlops.mlops import sweep

    def outage(*a, **k):
        raise _cut_connection()

    monkeypatch.setattr(sweep, "run_sweep", outage)
    r = CliRunner().invoke(main, ["sweep", "--preset", "smoke", "--device", "sim"])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "stopped answering" in errors[0] and "Connection broken" in errors[0] and "re-run" in errors[0]
    assert "Traceback" not in r.output
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: 1 / 0)  # a bug stays a bug: not dressed up as an outage
    r = CliRunner().invoke(main, ["sweep", "--preset", "smoke", "--device", "sim"])
    assert isinstance(r.exception, ZeroDivisionError)


def test_a_store_outage_is_told_from_a_refused_request():
    """What a sweep retries (the store did not answer) and what it does not (the store said no)."""
    import requests
    from mlflow.exceptions import MlflowException, RestException
    from mlflow.utils.rest_utils import get_error_code

    from dvfs_mlops.mlops.tracking import is_store_outage

    def http(status: int) -> MlflowException:  # as MLflow's client raises a non-JSON error response
        return MlflowException(f"API request to endpoint /api/2.0/mlflow/runs/create failed with error code {status} != 200. "
                               "Response body: ''", error_code=get_error_code(status))

    outages = [_cut_connection(), requests.exceptions.ConnectionError("refused"),
               http(503), http(502),
               RestException({"error_code": "INTERNAL_ERROR", "message": "(psycopg.OperationalError) the database system is shutting down"}),
               RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"}),
               MlflowException("(sqlite3.OperationalError) database is locked")]
    refusals = [_refused_request(), RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Run 'x' not found"}),
                http(404), http(400),
                ValueError("a bug here, not the store")]
    assert [is_store_outage(e) for e in outages] == [True] * len(outages)
    assert [is_store_outage(e) for e in refusals] == [False] * len(refusals)


def test_a_workload_that_fails_to_prepare_frees_its_claim_at_once(orin6, state_dir, store, monkeypatch):
    """A claimed point whose workload cannot be prepared (bad data, a config that does not build) is released before the
    error goes up, so another worker need not wait out its lease; no clock was touched."""
    import json

    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.job.workloads import prepare
    from dvfs_mlops.mlops.claims import open_claims
    from dvfs_mlops.mlops.sweep import RunOptions, run_sweep

    def broken(*a, **k):
        raise DvfsError("SST-2/train.tsv: line 3 has no label")

    monkeypatch.setattr(prepare, "prepare_workload", broken)
    claims = open_claims(None, os.environ["MLFLOW_TRACKING_URI"])
    with pytest.raises(DvfsError, match="has no label"):
        run_sweep(_tiny_sweep_spec(JetsonDevice()), JetsonDevice(), options=RunOptions(announce=lambda m: None, claims=claims))
    table = json.loads(claims.path.read_text()) if claims.path.exists() else {}
    assert claims.kind == "file" and not [k for k, row in table.items() if not row.get("done")]
    _assert_restored(orin6, state_dir)

