"""The loop run again, as a user meets it after the first run: the main job twice in one folder, a calibration, then
train and evaluate without --sweep-id, and a bare calibrate on a board that has its production governor already."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO, run_cli, smoke_sweep_copy

AGX, NANO = "jetson-agx-orin-64gb", "jetson-orin-nano-8gb"
# The main job, small: the session's smoke sweep is the one it resumes (same definition: the smoke preset on sim-orin).
MAIN_JOB = [str(REPO / "scripts" / "main-job"), "--preset", "smoke", "--trials", "2", "--finetune-steps", "4"]


def _versions(store: str) -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=store)
    return sorted(c.search_model_versions("name='dvfs-governor'"), key=lambda v: int(v.version))


def _aliases(store: str) -> dict[str, int]:
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(tracking_uri=store).get_registered_model("dvfs-governor").aliases)


@pytest.mark.timeout(900)  # two main jobs, two calibrations, a train and an evaluate: about 2 minutes of CPU
def test_the_main_job_twice_a_calibration_then_train_and_evaluate_without_a_sweep_id(tmp_path, smoke_sweep_master, warm):
    smoke_sweep_copy(smoke_sweep_master, tmp_path)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"MLFLOW_TRACKING_URI": store}
    for args in (("registry", "bootstrap"), ("registry", "promote", "1")):  # a production governor from before (v1)
        assert run_cli(*args, env=env).returncode == 0
    shell_env = {**os.environ, **env, "PATH": warm.path()}  # its commands warm: the main job as a user's shell runs it
    trained: list[int] = []
    for _ in range(2):
        r = subprocess.run(MAIN_JOB, capture_output=True, text=True, env=shell_env, cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "ran 0 points" in r.stdout  # resumed: the sweep was complete
        trained.append(int(_versions(store)[-1].version))
        assert _aliases(store)["production"] in (1, trained[-1]), "production is the main job's own version or where it was"
    assert len([v for v in _versions(store) if v.tags.get("dvfs.baseline") == "true"]) == 1, "no published-tree copy registered"

    r = run_cli("calibrate", "--device", "sim", "--twin-profile", "sim-orin-nano-8gb", "--preset", "smoke", "--steps", "0", env=env)
    assert r.returncode == 0, r.stderr
    agx_production = _aliases(store)["production"]
    assert _aliases(store)[f"production-{NANO}"] == int(_versions(store)[-1].version)  # the Nano had none: promoted

    r = run_cli("train", "--trials", "2", "--no-register", env=env)
    assert r.returncode == 0, r.stderr
    smoke = [line for line in r.stderr.splitlines() if "(no --sweep-id given)" in line]
    assert smoke and "the newest in dvfs-sweep with train workloads" in smoke[0]
    sweep_id = smoke[0].split()[1].rstrip(":")
    calibration_sweeps = _versions(store)[-1].tags["calibration_sweep"].split(",")
    assert sweep_id not in calibration_sweeps and "4 training workloads" in r.stderr
    r = run_cli("evaluate", env=env)
    assert r.returncode == 0, r.stderr
    assert f"sweep {sweep_id}: the newest in dvfs-sweep with eval workloads" in r.stderr

    r = run_cli("calibrate", "--device", "sim", "--preset", "smoke", "--steps", "0", env=env)  # a bare calibrate on the AGX Orin
    assert r.returncode == 0, r.stderr
    kept = f"{AGX} keeps its production v{agx_production}"
    assert kept in r.stderr and f"not promoted: production-{AGX} stays v{agx_production}" in r.stdout
    assert _aliases(store)["production"] == agx_production, "a bare calibrate never replaces a family's production"


def test_a_calibrate_on_a_fresh_store_says_what_to_run_first(empty_store):
    env = {"MLFLOW_TRACKING_URI": empty_store}
    r = run_cli("calibrate", "--device", "sim", "--steps", "0", env=env)  # the AGX Orin: its own loop comes first
    assert r.returncode == 2 and f"{AGX} trains its own: dvfs-mlops sweep, dvfs-mlops train" in r.stderr, r.stderr
    r = run_cli("calibrate", "--device", "sim", "--twin-profile", "sim-orin-nano-8gb", "--steps", "0", env=env)
    assert r.returncode == 2 and "promote one first: dvfs-mlops registry bootstrap, then dvfs-mlops registry promote latest" in r.stderr
    for args in (("registry", "bootstrap"), ("registry", "promote", "latest")):  # as it says
        assert run_cli(*args, env=env).returncode == 0
    r = run_cli("registry", "show", "production", env=env)
    assert r.returncode == 0 and '"version": 1' in r.stdout
    r = run_cli("registry", "show", f"production-{AGX}", env=env)
    assert r.returncode == 0 and '"version": 1' in r.stdout
    r = run_cli("registry", "show", f"production-{NANO}", env=env)
    assert r.returncode == 2 and f"has no version with alias 'production-{NANO}'; aliases: " in r.stderr
