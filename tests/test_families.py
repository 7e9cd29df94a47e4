"""Board families in the registry: an old store migrated on first use, promote/rollback/list per family, and
`load_governor` with a board (its family's production, none, or another family's only when allowed)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

NAME = "dvfs-governor"
NVML = "nvml-a100-sxm4-80gb"


def _register(c, profile: str | None, run_name: str, tags: dict | None = None, metrics: dict | None = None) -> str:
    """The published tree registered as a new version, tagged as an older release tagged it (no board family), with
    `tags` and its run's `metrics` besides."""
    import mlflow

    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.model.governor.policies import paper_tree

    with mlflow.start_run(experiment_id=c.get_experiment_by_name("Default").experiment_id, run_name=run_name):
        info = log_governor(paper_tree().policy, registered_name=NAME, metrics=metrics)
    v = str(info.registered_model_version)
    if profile is not None:
        c.set_model_version_tag(NAME, v, "device_profile", profile)
        c.set_model_version_tag(NAME, v, "n_workloads", "12")
    for k, value in (tags or {}).items():
        c.set_model_version_tag(NAME, v, k, value)
    return v


@pytest.fixture(scope="module")
def old_store(tmp_path_factory, store_template):
    """A store as a release before board families left it: v1 the AGX Orin's (production), v2 an NVML board's
    (previous, promoted before v1 when `production` was the only alias), v3 another NVML version; no family tags."""
    import shutil

    import mlflow
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("families")
    shutil.copy2(store_template, tmp / "mlflow.db")
    uri = f"sqlite:///{tmp}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    c = MlflowClient(tracking_uri=uri)
    v1 = _register(c, "jetson-agx-orin-64gb", "agx")
    v2 = _register(c, NVML, "nvml")
    v3 = _register(c, NVML, "nvml again")
    c.set_registered_model_alias(NAME, "production", v1)
    c.set_registered_model_alias(NAME, "previous", v2)
    assert all("dvfs.board_family" not in c.get_model_version(NAME, v).tags for v in (v1, v2, v3))
    return tmp, {"MLFLOW_TRACKING_URI": uri}, c


def test_an_old_store_is_migrated_on_first_use_and_listed_per_family(old_store):
    _tmp, env, c = old_store
    r = run_cli("registry", "list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    listing = {v["version"]: v for v in json.loads(r.stdout)}
    assert [listing[v]["family"] for v in (1, 2, 3)] == ["jetson-agx-orin-64gb", NVML, NVML]
    assert [c.get_model_version(NAME, v).tags["dvfs.board_family"] for v in "123"] == ["jetson-agx-orin-64gb", NVML, NVML]
    assert c.get_registered_model(NAME).tags["dvfs.families"] == "1"
    # the legacy aliases kept their versions and got their family twins
    aliases = c.get_registered_model(NAME).aliases
    assert aliases["production"] == aliases["production-jetson-agx-orin-64gb"] == 1
    assert aliases["previous"] == aliases[f"previous-{NVML}"] == 2
    only = json.loads(run_cli("registry", "list", "--family", NVML, "--json", env=env).stdout)
    assert [v["version"] for v in only] == [2, 3]
    text = run_cli("registry", "list", env=env).stdout.splitlines()
    assert text[0].startswith("v1 ") and "jetson-agx-orin-64gb" in text[0] and NVML in text[1]


def test_promote_and_rollback_move_only_their_family(old_store):
    _tmp, env, c = old_store
    run_cli("registry", "list", env=env)  # migrated (the test above may run alone)
    r = run_cli("registry", "promote", "2", env=env)  # no CV figures: the trained gates fail, within its family
    assert r.returncode == 2 and "failed gate(s) regret-no-worse-than-production" in r.stderr
    r = run_cli("registry", "promote", "2", "--force", env=env)
    assert r.returncode == 0, r.stderr
    assert f"{NAME}: production-{NVML} -> v2" in r.stdout and "overridden by --force" in r.stdout
    r = run_cli("registry", "promote", "3", "--force", env=env)
    assert r.returncode == 0 and f"production-{NVML} -> v3, previous-{NVML} -> v2" in r.stdout
    aliases = c.get_registered_model(NAME).aliases
    assert aliases[f"production-{NVML}"] == 3 and aliases["production"] == 1, "the AGX Orin's production did not move"
    r = run_cli("registry", "rollback", "--family", NVML, env=env)
    assert r.returncode == 0 and f"production-{NVML} -> v2, previous-{NVML} -> v3" in r.stdout
    assert c.get_registered_model(NAME).aliases["production"] == 1
    r = run_cli("registry", "promote", "1", "--family", NVML, env=env)
    assert r.returncode == 2 and f"v1 is a governor of jetson-agx-orin-64gb, not {NVML}" in r.stderr
    r = run_cli("registry", "rollback", "--family", "jetson-orin-nano-8gb", env=env)
    assert r.returncode == 2 and "no 'previous-jetson-orin-nano-8gb' version to roll back to" in r.stderr


def _board(family: str, profile: str = "sim-x"):
    from dvfs_mlops.hw.board import Board

    return Board("sim", profile, family, "sim@test", True, (306.0, 510.0, 816.0, 1020.0, 1300.5))


def test_load_governor_resolves_the_boards_family(old_store, monkeypatch):
    _tmp, env, _c = old_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    from dvfs_mlops.mlops.governor import Choice, NoGovernorForBoard, OtherBoardGovernor, governor_for_board, load_governor
    from dvfs_mlops.mlops.launch import Decision

    run_cli("registry", "list", env=env)  # migrated
    agx = load_governor(board=_board("jetson-agx-orin-64gb"))
    assert agx.ref.version == 1 and agx.ref.alias == "production" and agx.ref.family == "jetson-agx-orin-64gb"
    nvml = load_governor(board=_board(NVML, NVML))
    assert nvml.ref.alias == f"production-{NVML}" and nvml.ref.family == NVML
    with pytest.raises(NoGovernorForBoard) as e:
        load_governor(board=_board("jetson-orin-nano-8gb"))
    assert str(e.value).startswith("no production governor for jetson-orin-nano-8gb (registered: jetson-agx-orin-64gb v1, "
                                   f"{NVML} v")
    with pytest.raises(OtherBoardGovernor, match="pass --allow-other-board"):
        load_governor("models:/dvfs-governor/1", board=_board(NVML, NVML))
    other = load_governor(board=_board("jetson-orin-nano-8gb"), allow_other_board=True)
    assert other.ref.family in ("jetson-agx-orin-64gb", NVML)
    said: list[str] = []
    none = governor_for_board(_board("jetson-orin-nano-8gb"), say=said.append)
    assert none.governor is None and none.decide({}, _board("jetson-orin-nano-8gb")) == Choice(816.0, "refine")
    plan = Decision.of(none)
    assert "refining from the curve model" in none.note and plan.tags()["decision.reason"] == none.note
    assert plan.refine_budget(None, 0) == 30 and plan.refine_budget(50, 0) == 50
    allowed = governor_for_board(_board("jetson-orin-nano-8gb"), allow_other_board=True, say=said.append)
    assert allowed.other_board and Decision.of(allowed).tags()["governor.other_board"] == "true"
    assert said and said[-1].startswith("warning: governor dvfs-governor v") and "(--allow-other-board)" in said[-1]


def test_a_calibrated_version_passes_its_own_gates_but_never_replaces_a_trained_one(old_store):
    _tmp, env, c = old_store
    nx = {"dvfs.board_family": "jetson-orin-nx-16gb", "calibrated_from": "1", "calibration_sweep": "sweep-x"}
    worse = _register(c, "sim-orin-nx-16gb", "worse", nx, {"calibration_regret": 0.05, "calibration_source_regret": 0.01})
    r = run_cli("registry", "promote", worse, env=env)
    assert r.returncode == 2 and "failed gate(s) calibrated-no-worse-than-source" in r.stderr
    assert "regret-no-worse-than-production" not in r.stdout, "a calibrated version is not held to the trained gates"
    good = _register(c, "sim-orin-nx-16gb", "good", nx, {"calibration_regret": 0.01, "calibration_source_regret": 0.03})
    r = run_cli("registry", "promote", good, env=env)
    assert r.returncode == 0, r.stderr
    assert "gate pass calibrated-no-worse-than-source" in r.stdout and "gate pass calibrated-regret" in r.stdout
    assert "production-jetson-orin-nx-16gb -> v" + good in r.stdout
    trained = _register(c, "sim-orin-nx-16gb", "trained on the NX", {"dvfs.board_family": "jetson-orin-nx-16gb"})
    assert run_cli("registry", "promote", trained, "--force", env=env).returncode == 0
    again = _register(c, "sim-orin-nx-16gb", "again", nx, {"calibration_regret": 0.0, "calibration_source_regret": 0.03})
    r = run_cli("registry", "promote", again, env=env)
    assert r.returncode == 2 and "calibrated-not-over-trained" in r.stderr and f"production v{trained} is trained" in r.stderr


def test_dvfs_callback_on_a_board_without_its_familys_governor_refines_and_says_why(old_store, monkeypatch, tmp_path):
    """DvfsCallback resolves its board family's governor as finetune does: on an Orin Nano twin with only other boards'
    governors registered it refines from the curve model (saying why, recorded on the user's run); with
    allow_other_board another family's governor decides, recorded too."""
    import mlflow
    from transformers import Trainer

    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from tests.conftest import trainer_args, trainer_data

    _tmp, env, c = old_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    train_split, collate = trainer_data(w)
    args = trainer_args(tmp_path / "out", 8)
    tags = []
    for allow in (False, True):
        said: list[str] = []
        with mlflow.start_run(experiment_id=c.get_experiment_by_name("Default").experiment_id) as run, \
                DvfsCallback(device=SimDevice(builtin_profile("sim-orin-nano-8gb")), announce=said.append, gpu_util_pct=80.0,
                             allow_other_board=allow) as dvfs:
            Trainer(model=build_model(w.model_config, seed=0), args=args, train_dataset=train_split, data_collator=collate,
                    callbacks=[dvfs]).train()
        tags.append(c.get_run(run.info.run_id).data.tags)
        if not allow:
            assert any(line.startswith("no production governor for jetson-orin-nano-8gb (registered: ") for line in said), said
            assert dvfs.decision.path == "refine" and dvfs.refined is not None  # the probes, not a governor, picked
    refined, other = tags
    assert refined["dvfs.board_family"] == "jetson-orin-nano-8gb" and refined["decision.path"] == "refine"
    assert refined["decision.reason"].startswith("no production governor for jetson-orin-nano-8gb")
    assert "governor.other_board" not in refined
    assert other["governor.other_board"] == "true" and other["decision.path"] != "refine"
