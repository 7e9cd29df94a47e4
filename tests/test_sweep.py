"""The sweep end to end: `mlflow run . -e sweep --env-manager local -P preset=smoke`, resume, bad input."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, smoke_sweep_copy

PARAMS = {"model", "model_type", "num_layers", "hidden_size", "num_params", "task", "avg_seq_len", "freq_mhz", "device",
          "device_profile", "batch_size", "steps", "seed", "repeat", "split"}
METRICS = {"energy_j", "energy_gpu_j", "energy_cpu_j", "energy_total_j", "avg_power_w", "peak_power_w", "time_s",
           "gpu_util_pct", "samples_per_s", "energy_per_sample_j"}
TAGS = {"dvfs.workload", "dvfs.point", "dvfs.sweep_id", "dvfs.simulated"}
SMOKE_POINTS = 2 * 3 * 4  # 2 models x 3 tasks x (3 clocks + maxn)
SMOKE_WORKLOADS = 6


def _env(tmp_path: Path) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PATH": venv_bin + os.pathsep + os.environ["PATH"]}


def _runs(tmp_path: Path, status: str | None = None):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(exps, max_results=10000)
    children = [r for r in runs if "dvfs.point" in r.data.tags]
    return [r for r in children if status is None or r.info.status == status], runs


@pytest.fixture(scope="module")
def smoke_store(tmp_path_factory, smoke_sweep_master):
    """A copy of the session's smoke sweep (`mlflow run . -e sweep -P preset=smoke`), this module's to write to."""
    tmp = tmp_path_factory.mktemp("smoke")
    return tmp, smoke_sweep_copy(smoke_sweep_master, tmp)


def test_smoke_sweep_logs_one_run_per_point(smoke_store):
    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    assert len(children) == SMOKE_POINTS
    assert all(r.info.status == "FINISHED" for r in children)
    assert len({r.data.tags["dvfs.point"] for r in children}) == SMOKE_POINTS


def test_parent_is_the_mlflow_run_run(smoke_store):
    tmp, out = smoke_store
    children, runs = _runs(tmp)
    parents = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert len(parents) == 1
    parent = next(r for r in runs if r.info.run_id in parents)
    assert parent.data.tags.get("mlflow.project.entryPoint") == "sweep"  # created by `mlflow run`
    assert parent.info.run_id in out.stderr + out.stdout


def test_every_param_metric_tag_present(smoke_store):
    tmp, _ = smoke_store
    from mlflow.tracking import MlflowClient

    children, _ = _runs(tmp)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    for r in children:
        assert r.data.params.keys() >= PARAMS, PARAMS - r.data.params.keys()
        assert METRICS | {"eval_accuracy"} <= r.data.metrics.keys()
        assert r.data.tags.keys() >= TAGS and r.data.tags["dvfs.simulated"] == "true"
        assert r.data.params["device"] == "sim" and r.data.params["device_profile"] == "sim-orin"
    series = c.get_metric_history(children[0].info.run_id, "power_w")
    assert len(series) == 4 and [m.step for m in series] == [0, 1, 2, 3]  # one per training step


def test_points_log_the_noise_free_values_beside_the_measured(smoke_store):
    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    for r in children:
        m = r.data.metrics
        assert m["energy_expected_j"] > 0 and m["time_expected_s"] > 0
        assert m["time_s"] != m["time_expected_s"] and abs(m["time_s"] / m["time_expected_s"] - 1) < 0.05  # ~1 % noise
        assert abs(m["energy_j"] / m["energy_expected_j"] - 1) < 0.1  # ~1 % x ~2 % noise
    w = [r for r in children if r.data.tags["dvfs.workload"] == "bert-tiny/rte"]
    expected = {r.data.params["freq_mhz"]: r.data.metrics["energy_expected_j"] for r in w}
    assert expected["510"] < expected["1300.5"]


def test_twin_fit_from_the_sweep_reproduces_its_points(smoke_store):
    """Fit sim-orin-measured to the sim-orin smoke sweep: the fitted profile lands within the noise of the truth."""
    import json

    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    sweep_id = children[0].data.tags["dvfs.sweep_id"]
    out = tmp / "fitted.yaml"
    r = run_cli("twin", "fit", "--sweep-id", sweep_id, "--twin-profile", "sim-orin-measured", "--out", str(out), "--json",
                env=_env(tmp), timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["n_points"] == SMOKE_WORKLOADS * 3 and report["n_workloads"] == SMOKE_WORKLOADS  # maxn left out
    assert report["simulated_input"] is True and report["base_profile"] == "sim-orin-measured"
    truth = report["errors_expected"]
    assert truth["energy"]["mean_rel"] < 0.03 and truth["time"]["mean_rel"] < 0.02, truth
    assert report["errors_base"]["energy"]["mean_rel"] > 3 * report["errors"]["energy"]["mean_rel"]
    assert out.read_text().startswith("# Twin profile fit-" + sweep_id)


def test_a_sweep_id_of_another_profile_is_refused(smoke_store):
    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    sweep_id = children[0].data.tags["dvfs.sweep_id"]
    r = run_cli("sweep", "--preset", "smoke", "--device", "sim", "--twin-profile", "sim-orin-measured", "--sweep-id", sweep_id,
                env=_env(tmp), timeout=300)
    assert r.returncode == 2 and "was measured on device profile 'sim-orin', not 'sim-orin-measured'" in r.stderr
    assert len(_runs(tmp)[0]) == SMOKE_POINTS


def test_accuracy_identical_across_clocks(smoke_store):
    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    by_workload: dict[str, set] = {}
    for r in children:
        by_workload.setdefault(r.data.tags["dvfs.workload"], set()).add(r.data.metrics["eval_accuracy"])
    assert len(by_workload) == SMOKE_WORKLOADS and all(len(v) == 1 for v in by_workload.values())
    replays = [r for r in children if r.data.tags["dvfs.sim_train_once"] == "true"]
    assert len(replays) == SMOKE_POINTS - SMOKE_WORKLOADS  # trained once per workload, replayed at the other clocks


def test_energy_differs_by_clock_and_maxn_is_baseline(smoke_store):
    tmp, _ = smoke_store
    children, _ = _runs(tmp)
    w = [r for r in children if r.data.tags["dvfs.workload"] == "bert-tiny/rte"]
    energies = {r.data.params["freq_mhz"]: r.data.metrics["energy_j"] for r in w}
    assert set(energies) == {"maxn", "510", "816", "1300.5"}
    assert energies["510"] < energies["1300.5"]


def test_parent_has_plots_and_summary_csv(smoke_store):
    tmp, _ = smoke_store
    from mlflow.tracking import MlflowClient

    children, _ = _runs(tmp)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    parent = children[0].data.tags["mlflow.parentRunId"]
    names = {a.path for a in c.list_artifacts(parent)} | {a.path for a in c.list_artifacts(parent, "plots")}
    assert "summary.csv" in names and "plots/bert-tiny_rte.png" in names and len([n for n in names if n.endswith(".png")]) == SMOKE_WORKLOADS
    csv = Path(c.download_artifacts(parent, "summary.csv", str(tmp)))
    assert len(csv.read_text().strip().splitlines()) == SMOKE_POINTS + 1


def test_rerun_adds_no_runs(smoke_store):
    from mlflow.tracking import MlflowClient

    tmp, _ = smoke_store
    r = run_cli("sweep", "--preset", "smoke", env=_env(tmp), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ran 0 points" in r.stdout
    children, _ = _runs(tmp)
    assert len(children) == SMOKE_POINTS
    parent = re.search(r"parent run (\w+)", r.stdout).group(1)  # the rerun's own parent run describes the whole sweep
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    summary = Path(c.download_artifacts(parent, "summary.csv", str(tmp)))
    assert len(summary.read_text().strip().splitlines()) == SMOKE_POINTS + 1
    assert len([a for a in c.list_artifacts(parent, "plots") if a.path.endswith(".png")]) == SMOKE_WORKLOADS  # the figures too


ALL_CLOCKS = "306,408,510,612,714,816,918,1020,1122,1224,1300.5"


def test_killed_sweep_resumes_without_loss_or_duplicates(tmp_path, empty_store):
    env = _env(tmp_path)
    # 12 profile-only points (maxn + every clock), killed just after the first one is reported: a point takes
    # ~0.1 s, so the kill lands with most points still to run however the machine is loaded. Training is not
    # what this tests (a training sweep killed and resumed: test_faults.py); the process's death is.
    args = ["sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--freqs", ALL_CLOCKS, "--steps", "0",
            "--profile-steps", "20"]
    proc = subprocess.Popen([sys.executable, "-m", "dvfs_mlops", *args], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("[1/"):
            break
    time.sleep(0.05)  # most often inside the next point, its claim held by the process about to die
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    finished, _ = _runs(tmp_path, "FINISHED")
    assert 1 <= len(finished) < 12
    r = run_cli(*args, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"ran {12 - len(finished)} points" in r.stdout
    assert "waiting for" not in r.stderr  # the killed worker's claim is taken over at once, not waited out
    finished, _ = _runs(tmp_path, "FINISHED")
    keys = [x.data.tags["dvfs.point"] for x in finished]
    assert len(keys) == 12 and len(set(keys)) == 12
    running, _ = _runs(tmp_path, "RUNNING")
    assert running == []  # a point the kill cut short was closed (KILLED), not left dangling
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    parent = re.search(r"parent run (\w+)", r.stdout).group(1)  # the resume's parent describes the whole sweep
    summary = Path(c.download_artifacts(parent, "summary.csv", str(tmp_path)))
    assert len(summary.read_text().strip().splitlines()) == 12 + 1


@pytest.mark.parametrize("args, message", [
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--preset", "smoke", "--models", "bert-xl"], "unknown model 'bert-xl'"),
    (["--preset", "smoke", "--tasks", "squad"], "unknown task 'squad'"),
    (["--preset", "smoke", "--freqs", "700"], "unknown frequency '700'"),
    (["--preset", "smoke", "--steps", "x"], "--steps must be a whole number"),
])
def test_bad_input_is_one_line(tmp_path, empty_store, args, message):
    r = run_cli("sweep", *args, env=_env(tmp_path))
    assert r.returncode == 2
    err = [l for l in r.stderr.splitlines() if l.startswith("Error")]
    assert len(err) == 1 and message in err[0] and "Traceback" not in r.stderr


def test_data_dir_missing_files(tmp_path, empty_store):
    r = run_cli("sweep", "--preset", "smoke", "--tasks", "sst2", "--data-dir", str(tmp_path), env=_env(tmp_path))
    assert r.returncode == 2 and "has no SST-2/ folder" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_tracking_checked_before_clocks(orin6, tmp_path, state_dir):
    env = {**_env(tmp_path), "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    t0 = time.monotonic()
    r = run_cli("sweep", "--preset", "smoke", "--device", "jetson", env=env)
    assert r.returncode == 2 and "unreachable" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 60
    assert orin6.range_hz == (306000000, 1300500000) and not list(state_dir.glob("restore-*"))
