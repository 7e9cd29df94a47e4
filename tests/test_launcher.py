"""Launcher, DvfsCallback and evaluate."""
from __future__ import annotations

import json

import pytest

from tests.conftest import production_store, run_cli, trainer_args, trainer_data

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store whose production governor is the published tree (bootstrap + promote)."""
    tmp = tmp_path_factory.mktemp("launcher")
    return tmp, production_store(tmp)


@pytest.fixture
def tracking_env(store, monkeypatch):
    tmp, env = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    return tmp


def test_decision_explanation_matches_the_tree(store):
    from dvfs_mlops.model.governor.policies import paper_tree

    _, env = store
    r = run_cli("finetune", "--model", "bert-base", "--task", "rte", "--device", "sim", "--dry-run", "--probe-steps", "0",
                "--train-size", "256", "--json", env=env)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["decision"]
    expected = paper_tree().explain(d["features"], TABLE)
    assert d["path"] == expected
    assert d["path"].endswith("-> 816 MHz") and "num_layers=12 > 7" in d["path"] and "avg_seq_len=" in d["path"]
    assert d["freq_mhz"] == 816.0 and d["governor"]["version"] == 1 and d["governor"]["alias"] == "production"
    assert f"decision: {expected}" in r.stderr and "expected saving vs maxn" in r.stderr and "SIMULATED" in r.stderr
    assert "dry run" in r.stderr


def test_finetune_logs_a_run_with_governor_tags_and_model(store):
    _tmp, env = store
    from mlflow.tracking import MlflowClient

    r = run_cli("finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "sim", "--steps", "3", "--train-size", "64",
                "--probe-steps", "2", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    c = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    run = c.get_run(out["run_id"])
    assert c.get_experiment(run.info.experiment_id).name == "dvfs-finetune" and run.info.status == "FINISHED"
    t = run.data.tags
    assert t["governor.name"] == "dvfs-governor" and t["governor.version"] == "1" and t["governor.alias"] == "production"
    assert t["decision.path"] == out["decision"]["path"] and t["dvfs.simulated"] == "true"
    assert {"energy_j", "time_s", "avg_power_w", "eval_accuracy", "gpu_util_pct"} <= run.data.metrics.keys()
    assert run.data.params["freq_mhz"] == f"{out['decision']['freq_mhz']:g}"
    names = {a.path for a in c.list_artifacts(run.info.run_id, "model")}
    assert "model/config.json" in names and "model/tokenizer.json" in names
    # the probe measured the GPU utilisation at maxn on the (simulated) device
    assert "probe: 2 steps at maxn" in out["decision"]["gpu_util_source"]


def test_clocks_restored_after_error_inside_training(orin6, tracking_env, monkeypatch):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import launch

    seen = []

    def exploding(*args, session=None, **kwargs):
        seen.append(orin6.range_hz)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(launch, "run_job", exploding)
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _launch(JetsonDevice(), w, FinetuneConfig(steps=2), say=lambda m: None, probe_steps=0)
    pinned = seen[0]
    assert pinned[0] == pinned[1] and pinned[0] in [int(f * 1e6) for f in TABLE]  # it was pinned during training
    assert orin6.range_hz == (306000000, 1300500000)  # and restored after the error
    c = MlflowClient()
    runs = c.search_runs([c.get_experiment_by_name("dvfs-finetune").experiment_id], filter_string="attributes.status = 'FAILED'")
    assert runs, "the failed fine-tune is logged as FAILED"
    assert runs[0].data.tags["dvfs.end_reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_lazy_workload_loads_before_any_clock_is_touched(orin6, tracking_env, state_dir):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    prepare_workload("bert-tiny", "sst2", train_size=48, dev_size=8)  # warms the caches
    w = prepare_workload("bert-tiny", "sst2", train_size=48, dev_size=8)
    assert not w.loaded  # decided from the caches; the data is loaded on first use

    def broken():
        assert orin6.range_hz == (306000000, 1300500000) and not list(state_dir.iterdir()), "loading after a clock write"
        raise OSError("disk went away")

    def n_runs() -> int:
        exp = MlflowClient().get_experiment_by_name("dvfs-finetune")
        return len(MlflowClient().search_runs([exp.experiment_id])) if exp else 0

    w._load = broken
    said, before = [], n_runs()
    with pytest.raises(OSError, match="disk went away"):
        _launch(JetsonDevice(), w, FinetuneConfig(steps=2), say=said.append, probe_steps=0)
    assert not any(line.startswith(("decision: ", "pinning")) for line in said)  # loaded first: before the run and the decision
    assert orin6.range_hz == (306000000, 1300500000) and not list(state_dir.iterdir())
    assert n_runs() == before  # no run was created for it


def _error_line(r) -> str:
    """The one `Error:` line a refused command prints (and that it printed no decision)."""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr and "decision:" not in r.stderr and not r.stdout.strip()
    return errors[0]


def test_no_production_says_how_to_make_one(tmp_path, empty_store):
    r = run_cli("finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "sim", "--dry-run", "--probe-steps", "0",
                "--train-size", "32", env={"MLFLOW_TRACKING_URI": empty_store})
    line = _error_line(r)
    assert line.startswith("Error: no dvfs-governor version has alias 'production'; register one with `dvfs-mlops train`")
    assert "registry bootstrap" in line and "dvfs-mlops registry promote VERSION" in line


def test_profile_mismatch_within_the_family_is_quiet_or_refused_with_strict(store):
    """The published tree is of the AGX Orin 64 GB; sim-orin is that board's twin, so no warning, but --strict refuses
    any other profile."""
    _, env = store
    args = ["finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "sim", "--dry-run", "--probe-steps", "0", "--train-size", "32"]
    r = run_cli(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert not [line for line in r.stderr.splitlines() if line.startswith("warning:")], r.stderr
    decisions = [line for line in r.stderr.splitlines() if line.startswith("decision: ")]
    assert len(decisions) == 1 and decisions[0].endswith(" MHz") and "dry run: stopping after the decision" in r.stderr  # warned, then decided
    r = run_cli(*args, "--strict", env=env)
    assert _error_line(r) == ("Error: governor models:/dvfs-governor@production was trained for device profile 'jetson-agx-orin-64gb', "
                              "this device is 'sim-orin' (--strict); retrain on this device or drop --strict")


def test_a_version_trained_on_another_family_s_profile_warns():
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.mlops import schema
    from dvfs_mlops.mlops.governor import Governor, GovernorRef

    sim_orin = board_of(SimDevice())
    said: list[str] = []
    ref = GovernorRef("models:/g/1", tags={schema.TAG_VERSION_PROFILE: "sim-orin-nano-8gb"})
    Governor(ref, None).check_board(sim_orin, False, said.append)
    assert said == [("warning: governor models:/g/1 was trained for device profile 'sim-orin-nano-8gb', this device is "
                     "'sim-orin'; its clocks are snapped to this device's table")]
    said.clear()
    Governor(GovernorRef("models:/g/1", tags={schema.TAG_VERSION_PROFILE: "jetson-agx-orin-64gb"}), None).check_board(
        sim_orin, False, said.append)
    assert not said


@pytest.mark.parametrize("args, message", [
    (["--governor", "models:/nope@production"], "no nope version has alias 'production'"),
    (["--governor", "models:/dvfs-governor/42"], "has no version 42"),
    (["--model", "bert-huge"], "unknown model 'bert-huge'"),
    (["--task", "squad"], "unknown task 'squad'"),
])
def test_launcher_bad_input(store, args, message):
    _, env = store
    options = {"--model": "bert-tiny", "--task": "sst2", **dict(zip(args[::2], args[1::2]))}
    flat = [x for kv in options.items() for x in kv]
    r = run_cli("finetune", *flat, "--device", "sim", "--dry-run", "--probe-steps", "0", "--train-size", "32", env=env)
    assert message in _error_line(r)


def test_dvfs_callback_with_a_real_trainer(orin6, tracking_env, tmp_path):
    import mlflow
    from transformers import Trainer, TrainerCallback

    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)

    train_split, collate = trainer_data(w)

    seen = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            seen.append(orin6.range_hz)

    from dvfs_mlops.job.finetune import build_model

    model = build_model(w.model_config, seed=0)
    args = trainer_args(tmp_path / "out", 3)
    with mlflow.start_run(experiment_id=mlflow.create_experiment("user-script")) as run:
        with DvfsCallback(device="jetson", announce=None, torch_device="cpu") as dvfs:  # the fake board has no GPU
            Trainer(model=model, args=args, train_dataset=train_split, data_collator=collate, callbacks=[dvfs, Probe()]).train()
    assert len(seen) == 3 and len(set(seen)) == 1 and seen[0][0] == seen[0][1]  # pinned for every step
    assert seen[0][0] / 1e6 == dvfs.decision.freq_mhz
    assert orin6.range_hz == (306000000, 1300500000)  # restored on train end
    assert dvfs.report.energy_j > 0 and dvfs.report.simulated is False
    logged = mlflow.get_run(run.info.run_id).data
    assert logged.metrics["dvfs_energy_j"] == pytest.approx(dvfs.report.energy_j) and "decision.path" in logged.tags
    assert "dvfs_clock_mhz_measured" in logged.metrics and logged.tags["dvfs.clock_held"] in ("true", "false")


def test_dvfs_callback_refuses_a_model_off_the_backends_gpu(orin6, tracking_env, state_dir, monkeypatch):
    monkeypatch.delenv("DVFS_TORCH_DEVICE")
    from dvfs_mlops.hw.placement import TorchDeviceError
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=16, dev_size=8)

    class Args:
        per_device_train_batch_size = 8

    with pytest.raises(TorchDeviceError, match="CUDA"), DvfsCallback(device="jetson", freq=612, avg_seq_len=13.0, announce=None) as dvfs:
        dvfs.on_train_begin(Args(), None, None, model=build_model(w.model_config, seed=0))
    assert orin6.range_hz == (306000000, 1300500000) and not list(state_dir.iterdir())  # nothing was touched


def test_dvfs_callback_observe_writes_nothing(orin6, tracking_env, state_dir):
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=16, dev_size=8)

    class Args:
        per_device_train_batch_size = 8

    with DvfsCallback(device="jetson", freq=612, avg_seq_len=13.0, announce=None, observe=True, torch_device="cpu") as dvfs:
        dvfs.on_train_begin(Args(), None, None, model=build_model(w.model_config, seed=0))
        assert orin6.range_hz == (306000000, 1300500000)
    assert not list(state_dir.iterdir()) and dvfs.report.clock_held is None and dvfs.report.clock_mhz_measured is not None


def test_dvfs_callback_restores_when_training_raises(orin6, tracking_env):
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=32, dev_size=8)
    from dvfs_mlops.job.finetune import build_model

    model = build_model(w.model_config, seed=0)

    class Args:
        per_device_train_batch_size = 8

    with pytest.raises(ValueError, match="diverged"):
        with DvfsCallback(device="jetson", freq=612, avg_seq_len=13.0, announce=None, torch_device="cpu") as dvfs:
            dvfs.on_train_begin(Args(), None, None, model=model)
            assert orin6.range_hz == (612000000, 612000000)
            raise ValueError("loss diverged")
    assert orin6.range_hz == (306000000, 1300500000)


def _log_point(c, exp, sweep, model, task, freq, energy, time_s, params_m, split, acc=0.8, util=60.0, extra=None):
    run = c.create_run(exp, tags={"dvfs.point": f"{model}/{task}@{freq}#0", "dvfs.sweep_id": sweep, "dvfs.workload": f"{model}/{task}",
                                  "dvfs.simulated": "true"})
    from dvfs_mlops.mlops import tracking

    tracking.log_run_batch(c, run.info.run_id, params={"model": model, "task": task, "freq_mhz": freq, "model_type": "encoder",
                                                       "num_layers": 12, "hidden_size": 768, "num_params": params_m, "avg_seq_len": 40.0,
                                                       "split": split, "repeat": 0, "device_profile": "sim-orin"},
                           metrics={"energy_j": energy, "time_s": time_s, "gpu_util_pct": util, "eval_accuracy": acc, **(extra or {})})
    c.set_terminated(run.info.run_id, "FINISHED")


def test_evaluate_on_hand_made_sweep_gives_hand_computed_savings(tmp_path, empty_store):
    from mlflow.tracking import MlflowClient

    uri = empty_store
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("dvfs-sweep")
    # energies at maxn, 612, 816 (J), time (s)
    table = {
        ("big", "sst2", "train"): ({"maxn": 100, "612": 70, "816": 80}, 200_000_000),
        ("small", "sst2", "train"): ({"maxn": 10, "612": 9, "816": 8}, 10_000_000),
        ("big", "rte", "eval"): ({"maxn": 200, "612": 150, "816": 120}, 200_000_000),
        ("small", "rte", "eval"): ({"maxn": 20, "612": 19, "816": 15}, 10_000_000),
    }
    for (model, task, split), (energy, params) in table.items():
        for freq, e in energy.items():
            _log_point(c, exp, "hand", model, task, freq, e, 1.0, params, split)
    r = run_cli("evaluate", "--sweep-id", "hand", "--policies", "ffg,maxn,oracle", "--json", env={"MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert isinstance(d, list) and [x["policy"] for x in d] == ["ffg", "maxn", "oracle"]
    s = {x["policy"]: x for x in d}
    # FFG on train, per-workload normalised: 612 -> 1 + 9/8, 816 -> 80/70 + 1 => 612. eval: big 150/200 -> 25 % saving, small 5 %
    assert s["ffg"]["saving"] == pytest.approx((0.25 + 0.05) / 2) and s["ffg"]["n"] == 2
    assert s["ffg"]["saving_big"] == pytest.approx(0.25) and s["ffg"]["saving_small"] == pytest.approx(0.05)
    assert s["ffg"]["max_saving"] == pytest.approx(0.25) and s["ffg"]["worst_saving"] == pytest.approx(0.05)
    assert s["ffg"]["regret"] == pytest.approx((150 / 120 - 1 + 19 / 15 - 1) / 2)
    lo, hi = s["ffg"]["regret_ci"]  # no expected curves (as on hardware): the interval is of the measured regret
    assert s["ffg"]["regret_expected"] is None and lo <= s["ffg"]["regret"] <= hi
    assert lo == pytest.approx(150 / 120 - 1) and hi == pytest.approx(19 / 15 - 1)  # two workloads: the bootstrap's extremes
    # oracle: 816 for both eval workloads: 40 % and 25 %
    assert s["oracle"]["saving"] == pytest.approx((0.4 + 0.25) / 2) and s["oracle"]["regret"] == 0
    assert s["maxn"]["saving"] == 0 and s["maxn"]["regret"] == pytest.approx((200 / 120 - 1 + 20 / 15 - 1) / 2)
    runs = c.search_runs([c.get_experiment_by_name("dvfs-evaluate").experiment_id])
    assert len(runs) == 1 and runs[0].data.metrics["ffg_regret_ci_high"] == pytest.approx(hi)
    assert {a.path for a in c.list_artifacts(runs[0].info.run_id)} >= {"evaluation.csv", "summary.csv", "savings.png"}


def test_evaluate_judges_against_the_expected_oracle_where_logged(tmp_path, empty_store):
    """A twin sweep with expected (noise-free) values: the oracle is the expected one, the measured one is a lucky draw."""
    from mlflow.tracking import MlflowClient

    uri = empty_store
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("dvfs-sweep")
    # (measured, expected) energy per clock; time 1 s everywhere
    table = {
        ("big", "sst2", "train"): {"maxn": (100, 100), "612": (70, 70), "816": (80, 80)},
        ("big", "rte", "eval"): {"maxn": (200, 200), "612": (120, 130), "816": (125, 125)},  # the draw favours 612; truth 816
    }
    for (model, task, split), points in table.items():
        for freq, (e, ee) in points.items():
            _log_point(c, exp, "twin", model, task, freq, e, 1.0, 200_000_000, split,
                       extra={"energy_expected_j": ee, "time_expected_s": 1.0})
    r = run_cli("evaluate", "--sweep-id", "twin", "--policies", "ffg,oracle", "--json", env={"MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, r.stderr
    s = {x["policy"]: x for x in json.loads(r.stdout)}
    # FFG (fit on train) picks 612: measured oracle 612 -> regret 0; expected oracle 816 -> 130/125 - 1
    assert s["ffg"]["regret"] == 0 and s["ffg"]["regret_expected"] == pytest.approx(130 / 125 - 1)
    assert s["ffg"]["regret_ci"] == pytest.approx([130 / 125 - 1] * 2) and s["ffg"]["simulated"] is True
    # the oracle is the expected one: 816, which the measured draw charges 125/120 - 1
    assert s["oracle"]["regret_expected"] == 0 and s["oracle"]["regret"] == pytest.approx(125 / 120 - 1)
    assert s["ffg"]["saving"] == pytest.approx(1 - 130 / 200)  # savings on the expected curve


def test_evaluate_unknown_policy(tmp_path, empty_store):
    from mlflow.tracking import MlflowClient

    uri = empty_store
    r = run_cli("evaluate", "--policies", "magic", env={"MLFLOW_TRACKING_URI": uri})  # the name, cheapest first
    assert _error_line(r).startswith("Error: unknown policy 'magic'; valid policies: ")
    r = run_cli("evaluate", env={"MLFLOW_TRACKING_URI": uri})
    assert _error_line(r) == "Error: experiment 'dvfs-sweep' does not exist; run a sweep first (dvfs-mlops sweep)"
    c = MlflowClient(tracking_uri=uri)  # with a sweep, the policy name itself is what is refused
    exp = c.create_experiment("dvfs-sweep")
    for model, task, split in (("big", "sst2", "train"), ("big", "rte", "eval")):
        for freq, e in {"maxn": 100, "612": 70}.items():
            _log_point(c, exp, "hand", model, task, freq, e, 1.0, 200_000_000, split)
    r = run_cli("evaluate", "--sweep-id", "hand", "--policies", "ffg,magic", env={"MLFLOW_TRACKING_URI": uri})
    line = _error_line(r)
    assert line.startswith("Error: unknown policy 'magic'; valid policies: ") and "models:/NAME@ALIAS" in line
    assert c.get_experiment_by_name("dvfs-evaluate") is None  # nothing was logged


def _launch(device, workload, config, say=print, **options):
    """`finetune` as the CLI runs it: the board resolved from the device, the job, the launch options."""
    from dvfs_mlops.app.finetune import LaunchOptions, run_finetune
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.run import Job

    board = board_of(device)
    return run_finetune(device, board, Job(workload, config, board.torch_device), LaunchOptions(**options), say=say)
