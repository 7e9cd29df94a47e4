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

from dvfs_mlops.device.guard import list_journals
from dvfs_mlops.device.jetson import JetsonDevice, JetsonSession
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
    from dvfs_mlops.workloads.prepare import prepare_workload

    return prepare_workload("bert-tiny", "sst2", train_size=32, dev_size=16)


def test_run_command_signals_and_sigkill(orin6, state_dir):
    """`dvfs-mlops run` in a subprocess, signalled at a random moment of its life."""
    rng = random.Random(1234)
    table = JetsonDevice().frequencies_mhz
    env = dict(os.environ)
    pinned_when_signalled = 0
    for trial in range(TRIALS):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            freq = rng.choice(table)
            proc = subprocess.Popen([sys.executable, "-m", "dvfs_mlops.cli", "run", "--freq", f"{freq:g}", "--device", "jetson",
                                     "--", "sleep", "5"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(rng.uniform(0.0, 0.8))  # before, during or after pinning (the child pins ~0.2 s after start)
            pinned_when_signalled += orin6.range_hz != DEFAULT
            proc.send_signal(sig)
            proc.wait(timeout=30)
            if sig == signal.SIGKILL:
                from dvfs_mlops.device import restore_journals

                restore_journals(announce=lambda m: None)
            assert orin6.range_hz == DEFAULT, (trial, sig, freq, proc.stderr.read())
            assert list_journals(state_dir) == []
            proc.stderr.close()
    assert pinned_when_signalled >= TRIALS  # most signals land while the clock is pinned, some before


@pytest.mark.parametrize("fault", FAULTS)
def test_run_command_in_process_faults(orin6, state_dir, monkeypatch, fault):
    """run_metered with the child's wait() failing at a random moment."""
    from dvfs_mlops.runner import run_metered

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
    from dvfs_mlops.sweep import build_spec

    return build_spec(device, "smoke", models="bert-tiny", tasks="sst2", freqs="510,1300.5", steps=3, train_size=32, dev_size=16)


@pytest.mark.parametrize("fault", FAULTS)
def test_sweep_faults_then_resume_exactly_once(orin6, state_dir, store, workload, monkeypatch, fault):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.sweep import run_sweep
    from dvfs_mlops.workloads import prepare

    monkeypatch.setattr(prepare, "prepare_workload", lambda *a, **k: workload)
    rng = random.Random(f"sweep-{fault}")
    spec = _tiny_sweep_spec(JetsonDevice())
    total_steps = len(spec.points()) * spec.steps
    for _ in range(TRIALS):
        _arm(monkeypatch, fault, rng.randint(1, total_steps))
        with contextlib.suppress(Injected, KeyboardInterrupt, SystemExit):
            run_sweep(spec, JetsonDevice(), announce=lambda m: None)
        _assert_restored(orin6, state_dir)
    monkeypatch.setattr(JetsonSession, "step", lambda self, profile=None: None)
    run_sweep(spec, JetsonDevice(), announce=lambda m: None)
    c = MlflowClient()
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()], filter_string="tags.`dvfs.point` != ''", max_results=5000)
    finished = [r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED"]
    assert sorted(finished) == sorted(p.key for p in spec.points())  # each point exactly once
    assert not [r for r in runs if r.info.status == "RUNNING"]  # interrupted points were closed
    _assert_restored(orin6, state_dir)


@pytest.mark.parametrize("fault", FAULTS)
def test_finetune_faults(orin6, state_dir, store, workload, monkeypatch, fault):
    from dvfs_mlops import launcher, registry
    from dvfs_mlops.finetune import FinetuneConfig

    registry.bootstrap(say=lambda m: None)
    registry.promote("latest", say=lambda m: None)
    resolved = registry.resolve()
    monkeypatch.setattr(registry, "resolve", lambda uri=None, config=None: resolved)
    rng = random.Random(f"finetune-{fault}")
    for _ in range(TRIALS):
        _arm(monkeypatch, fault, rng.randint(1, 4))
        with pytest.raises((Injected, KeyboardInterrupt, SystemExit)):
            launcher.run_finetune(JetsonDevice(), workload, FinetuneConfig(steps=4), probe_steps=0, save_model=False, say=lambda m: None)
        _assert_restored(orin6, state_dir)
