"""End to end on the smoke sweep: train -> v1 -> promote -> load in a fresh process; gates; rollback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, smoke_sweep_copy

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]


@pytest.fixture(scope="module")
def store(tmp_path_factory, smoke_sweep_master):
    tmp = tmp_path_factory.mktemp("registry")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    smoke_sweep_copy(smoke_sweep_master, tmp)  # the session's smoke sweep
    r = run_cli("train", "--trials", "8", env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "registered dvfs-governor v1" in r.stdout and "held-out regret (nested CV" in r.stdout and "paper-mlg" in r.stdout
    assert "power prior for refine: 6 workloads" in r.stderr  # progress, as the other lines of the search
    assert all(f"one {split}" in r.stdout for split in ("workload", "task", "model"))
    return tmp, env


def _client(tmp):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")


def test_version_carries_tags_metrics_and_artifacts(store):
    tmp, env = store
    c = _client(tmp)
    mv = c.get_model_version("dvfs-governor", "1")
    assert {"objective", "device_profile", "sweep_id", "n_workloads"} <= mv.tags.keys()
    assert mv.tags["device_profile"] == "sim-orin" and mv.tags["n_workloads"] == "4"
    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
    from dvfs_mlops.model.curve import PowerPrior

    prior = PowerPrior.from_json(mv.tags["power_prior"])  # for refine at launch: all 6 workloads of the sweep, 3 clocks each
    assert prior.workloads == 6 and prior.f_max_mhz == 1300.5 and prior.voltage_shape == pytest.approx(ORIN_VOLTAGE_SHAPE)
    m = c.get_run(mv.run_id).data.metrics
    for k in ("tree", "ffg", "paper"):  # nested CV: the held-out score with its interval, for every split
        assert {f"{k}_outer_regret", f"{k}_outer_regret_ci_low", f"{k}_outer_regret_ci_high"} <= m.keys()
        assert m[f"{k}_outer_regret_ci_low"] <= m[f"{k}_outer_regret"] <= m[f"{k}_outer_regret_ci_high"]
        assert {f"{k}_outer_regret_{s}" for s in ("workload", "task", "model")} <= m.keys()
    assert {"n_features_used", "features_matter", "tree_depth"} <= m.keys() and mv.tags["family"] in ("curve", "classifier", "fixed", "published")
    # which family of candidate won and why (SearchResult.description): the version's description, the run's, an artifact
    assert "Each fold's own search chose" in mv.description and mv.description.startswith(("A fixed clock", "The published", "A curve", "A classifier"))
    assert c.get_run(mv.run_id).data.tags["mlflow.note.content"] == mv.description[:5000]
    assert "description.md" in {a.path for a in c.list_artifacts(mv.run_id)}
    trials = c.search_runs([c.get_run(mv.run_id).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{mv.run_id}'")
    assert len(trials) == 8 and all("inner_regret" in t.data.metrics for t in trials)
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    path = Path(mlflow.artifacts.download_artifacts("models:/dvfs-governor/1", dst_path=str(tmp / "model")))
    names = {p.name for p in path.rglob("*")}
    assert {"policy.json", "tree.txt", "tree.png", "MLmodel", "model_code.py", "policy_tree.py"} <= names
    assert not [p for p in path.rglob("*") if p.suffix in (".pkl", ".pickle", ".joblib", ".cloudpickle")]
    mlmodel = (path / "MLmodel").read_text()
    assert "loader_module: mlflow.pyfunc.loaders.code_model" in mlmodel  # models-from-code
    assert "python_model.pkl" not in mlmodel and "signature" in mlmodel
    policy = json.loads(next(path.rglob("policy.json")).read_text())
    assert policy["format"] == "dvfs-governor-policy/1" and "tree" in policy and policy["objective"] == "energy"


def test_promote_then_load_in_fresh_process(store):
    tmp, env = store
    # the smoke sweep's 3 clocks leave nothing for features to win: whether v1 beats FFG is the data's call, so force
    r = run_cli("registry", "promote", "1", "--force", env=env)
    assert r.returncode == 0, r.stderr
    assert "production -> v1" in r.stdout
    code = (
        "import pickle, cloudpickle\n"
        "def refuse(*a, **k): raise AssertionError('the governor must load without unpickling')\n"
        "pickle.load = pickle.loads = cloudpickle.load = cloudpickle.loads = refuse\n"
        "import json, mlflow, pandas as pd\n"
        "m = mlflow.pyfunc.load_model('models:/dvfs-governor@production')\n"
        "rows = pd.DataFrame([{'model_type': 'encoder', 'num_layers': 12, 'hidden_size': 768, 'num_params': 109000000,"
        " 'avg_seq_len': 71.3, 'gpu_util_pct': 95.0}, {'model_type': 'decoder', 'num_layers': 6, 'hidden_size': 128,"
        " 'num_params': 7600000, 'avg_seq_len': 12.8, 'gpu_util_pct': 30.0}])\n"
        f"out = m.predict(rows, params={{'frequencies': {TABLE}}})\n"
        "print(json.dumps({'freqs': out['freq_mhz'].tolist(), 'paths': out['decision_path'].tolist()}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120, cwd=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    # the loaded pyfunc applies exactly the registered policy.json (same clocks, same explanation)
    import mlflow

    from dvfs_mlops.model.governor import policy_tree

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    art = Path(mlflow.artifacts.download_artifacts("models:/dvfs-governor/1", dst_path=str(tmp / "model-predict")))
    policy = json.loads(next(art.rglob("policy.json")).read_text())
    rows = [{"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "num_params": 109000000, "avg_seq_len": 71.3,
             "gpu_util_pct": 95.0},
            {"model_type": "decoder", "num_layers": 6, "hidden_size": 128, "num_params": 7600000, "avg_seq_len": 12.8,
             "gpu_util_pct": 30.0}]
    expected = []
    for row in rows:
        f, path = policy_tree.decide(policy, row)
        f = policy_tree.snap(f, TABLE)
        expected.append((f, policy_tree.explain(path, f)))
    assert list(zip(out["freqs"], out["paths"])) == expected
    assert all(f in TABLE for f in out["freqs"])


def test_gates_block_a_worse_version_and_force_overrides(store):
    tmp, env = store
    import mlflow

    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.model.governor.policies import paper_tree

    c = _client(tmp)
    assert run_cli("registry", "promote", "1", "--force", env=env).returncode == 0  # v1 is production (idempotent)
    prod_run = c.get_model_version("dvfs-governor", "1").run_id
    prod_m = c.get_run(prod_run).data.metrics
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    with mlflow.start_run(experiment_id=c.get_run(prod_run).info.experiment_id, run_name="worse"):
        worse = {**prod_m, "tree_outer_regret": prod_m["tree_outer_regret"] + 0.1}
        info = log_governor(paper_tree().policy, registered_name="dvfs-governor", metrics=worse)
    v = info.registered_model_version
    r = run_cli("registry", "promote", str(v), env=env)
    assert r.returncode == 2 and "regret-no-worse-than-production" in r.stderr and "--force" in r.stderr
    assert "FAIL regret-no-worse-than-production" in r.stdout
    assert str(c.get_model_version_by_alias("dvfs-governor", "production").version) == "1"
    r = run_cli("registry", "promote", str(v), "--force", env=env)
    assert r.returncode == 0 and "overridden by --force" in r.stdout
    assert str(c.get_model_version_by_alias("dvfs-governor", "production").version) == str(v)
    assert str(c.get_model_version_by_alias("dvfs-governor", "previous").version) == "1"
    r = run_cli("registry", "rollback", env=env)
    assert r.returncode == 0 and "production -> v1" in r.stdout
    assert str(c.get_model_version_by_alias("dvfs-governor", "production").version) == "1"
    assert str(c.get_model_version_by_alias("dvfs-governor", "previous").version) == str(v)


def test_a_curve_version_serves_every_objective_by_predict_param(store):
    """One registered curve version: the objective is a predict param, its default the trained one."""
    tmp, env = store
    import mlflow
    import pandas as pd

    from dvfs_mlops.mlops.pyfunc import log_governor
    from tests.test_governor_cv import POLICY

    c = _client(tmp)
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    with mlflow.start_run(experiment_id=c.get_run(c.get_model_version("dvfs-governor", "1").run_id).info.experiment_id):
        info = log_governor(POLICY, registered_name=None)
    model = mlflow.pyfunc.load_model(info.model_uri)
    rows = pd.DataFrame([{"model_type": "encoder", "num_layers": n, "hidden_size": 256, "num_params": 1, "avg_seq_len": 20.0,
                          "gpu_util_pct": 50.0} for n in (2, 12)])
    assert model.predict(rows)["freq_mhz"].tolist() == [510.0, 816.0]  # the default: energy
    assert model.predict(rows, params={"objective": "edp"})["freq_mhz"].tolist() == [1300.5, 1300.5]
    out = model.predict(rows, params={"objective": "max-slowdown:1.4", "frequencies": TABLE})
    assert out["freq_mhz"].tolist() == [816.0, 816.0] and "leaf curve" in out["decision_path"][0]
    art = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp / "curve")))
    assert {"leaf_curves.png", "policy.json", "tree.txt"} <= {p.name for p in art.rglob("*")}


def test_bootstrap_registers_the_published_tree(store):
    _tmp, env = store
    r = run_cli("registry", "bootstrap", env=env)
    assert r.returncode == 0 and "registered the published tree" in r.stdout
    listing = json.loads(run_cli("registry", "list", "--json", env=env).stdout)
    boot = listing[-1]
    assert boot["tags"]["dvfs.baseline"] == "true" and boot["tags"]["source"] == "paper-mlg"


@pytest.mark.parametrize("args, message", [
    (["registry", "promote", "99"], "has no version 99"),
    (["registry", "show", "99"], "has no version 99"),
    (["train", "--objective", "power"], "unknown objective 'power'"),
    (["train", "--sweep-id", "nope"], "no FINISHED runs of sweep 'nope'"),
])
def test_registry_bad_input(store, args, message):
    _, env = store
    r = run_cli(*args, env=env)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_too_few_workloads_named(empty_store):
    env = {"MLFLOW_TRACKING_URI": empty_store}
    assert run_cli("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--freqs", "510,1020", "--steps", "0",
                   env=env).returncode == 0  # profiled on the twin: one workload is what matters here, not its training
    r = run_cli("train", "--trials", "2", env=env)
    assert r.returncode == 2 and "cross-validation needs at least 4" in r.stderr
