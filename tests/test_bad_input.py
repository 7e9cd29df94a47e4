"""The bad-input matrix: every command, one line on stderr, exit code 2, no traceback, nothing half-written."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.hw.guard import list_journals
from testkit.fakes.sysfs import make_orin_tree

DEFAULT = (306000000, 1300500000)

CASES = [
    (["devices", "--device", "gpu"], "'gpu' is not one of"),
    (["fly"], "No such command 'fly'"),
    (["simulate", "bert-huge", "--seq-len", "8"], "unknown model 'bert-huge'"),
    (["simulate", "bert-tiny"], "Missing option '--seq-len'"),
    (["simulate", "--model-config", "/nonexistent/config.json", "--seq-len", "8"], "does not exist"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-params", "{bad_yaml}"], "unknown twin parameter(s) gpu_kk"),
    (["run", "--freq", "700", "--device", "jetson", "--", "true"], "unknown frequency '700'; valid frequencies: 306"),
    (["run", "--freq", "816", "--device", "jetson", "--", "no-such-program-xyz"], "command not found"),
    (["run", "--freq", "816", "--device", "nvml", "--", "true"], "NVML"),
    (["run", "--device", "sim", "--", "true"], "give --freq MHZ (or maxn), or --observe"),
    (["sweep", "--preset", "huge"], "unknown preset 'huge'"),
    (["sweep", "--models", "bert-xl", "--device", "jetson"], "unknown model 'bert-xl'"),
    (["sweep", "--tasks", "squad", "--device", "jetson"], "unknown task 'squad'"),
    (["sweep", "--freqs", "700", "--device", "jetson"], "unknown frequency '700'"),
    (["sweep", "--steps", "x"], "--steps must be a whole number"),
    (["sweep", "--preset", "smoke", "--steps", "0", "--device", "jetson"], "only on the sim device"),
    (["sweep", "--preset", "smoke", "--tasks", "sst2", "--data-dir", "{empty_dir}", "--device", "jetson"], "has no SST-2/ folder"),
    (["sweep", "--preset", "smoke", "--device", "jetson", "@unreachable"], "is unreachable"),
    (["train", "--objective", "power"], "unknown objective 'power'"),
    (["train", "--objective", "max-slowdown:0.5"], "must be a number >= 1"),
    (["train"], "experiment 'dvfs-sweep' does not exist"),
    (["registry", "promote", "99"], "has no version"),
    (["registry", "show", "3"], "has no version 3"),
    (["registry", "rollback"], "no 'previous-jetson-agx-orin-64gb' version to roll back to"),
    (["finetune", "--task", "sst2"], "name the model"),
    (["finetune", "--model", "bert-tiny", "--task", "squad"], "unknown task 'squad'"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "jetson", "--dry-run", "--train-size", "16"],
     "no dvfs-governor version has alias 'production'"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--governor", "models:/nope/1", "--dry-run", "--train-size", "16"],
     "nope has no version 1"),
    (["evaluate", "--policies", "magic"], "unknown policy 'magic'; valid policies: production, ffg"),
    (["evaluate"], "experiment 'dvfs-sweep' does not exist"),
    (["evaluate", "--objective", "power"], "unknown objective 'power'"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-profile", "sim-xavier"], "unknown twin profile 'sim-xavier'; valid twin profiles: sim-orin, sim-orin-measured"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-params", "{broken_yaml}"], "is not valid YAML (line 2)"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-params", "{list_yaml}"], "must hold a mapping of twin parameters"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-params", "{typed_yaml}"], "gpu_k must be a number, got 'fast'"),
    (["simulate", "bert-tiny", "--seq-len", "8", "--twin-params", "{builtin_yaml}"], "names the built-in profile 'sim-orin' but changes gpu_k"),
    (["sweep", "--preset", "smoke", "--device", "sim", "--twin-profile", "orin"], "unknown twin profile 'orin'"),
    (["sweep", "--preset", "smoke", "--device", "jetson", "--twin-profile", "sim-orin-measured"], "describe the simulated twin"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--twin-params", "{broken_yaml}"], "is not valid YAML"),
    (["run", "--freq", "816", "--device", "sim", "--twin-profile", "x", "--", "true"], "unknown twin profile 'x'"),
    (["twin", "fit", "--csv", "{bad_csv}"], "lacks column(s) time_s"),
    # checked from the text, before the store or a clock is touched (it used to end in a torch traceback after both)
    (["sweep", "--preset", "smoke", "--device", "jetson", "--torch-device", "quantum:7", "@unreachable"], "--torch-device 'quantum:7' is not a torch device"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "jetson", "--torch-device", "cuda:x"], "is not a torch device"),
]


@pytest.fixture
def env(tmp_path, monkeypatch, empty_store):
    fake = make_orin_tree(tmp_path / "root", jetpack=6)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_kk: 1\n")
    (tmp_path / "empty").mkdir()
    files = {"broken_yaml": "gpu_k: [1\n", "list_yaml": "- gpu_k\n", "typed_yaml": "gpu_k: fast\n",
             "builtin_yaml": "profile: sim-orin\ngpu_k: 3\n", "bad_csv": "workload,freq_mhz,energy_j\nbert-tiny/sst2,816,1.0\n"}
    subs = {"{bad_yaml}": str(bad), "{empty_dir}": str(tmp_path / "empty")}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
        subs[f"{{{name}}}"] = str(tmp_path / f"{name}.txt")
    return fake, subs


def test_matrix_has_at_least_20_cases_across_commands():
    assert len(CASES) >= 20
    assert {c[0][0] for c in CASES} >= {"devices", "simulate", "run", "sweep", "train", "registry", "finetune", "evaluate"}


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input(env, monkeypatch, state_dir, args, message):
    fake, subs = env
    if "@unreachable" in args:
        args = [a for a in args if a != "@unreachable"]
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    args = [subs.get(a, a) for a in args]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output
    # nothing half-written: clocks untouched, no journal, no orphan RUNNING run of ours
    assert fake.range_hz == DEFAULT and list_journals(state_dir) == []
    import os

    if os.environ["MLFLOW_TRACKING_URI"].startswith("sqlite"):
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        exps = [e.experiment_id for e in c.search_experiments()]
        running = [r.info.run_name for r in c.search_runs(exps, filter_string="attributes.status = 'RUNNING'")] if exps else []
        assert running == [], f"runs left RUNNING: {running}"


def test_a_torch_device_from_the_environment_or_the_callback_is_checked_before_any_clock(env, monkeypatch, state_dir):
    """DVFS_TORCH_DEVICE and DvfsCallback(torch_device=...) take the same check as --torch-device (one line, no clock)."""
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.integrations.transformers import DvfsCallback

    fake, _ = env
    monkeypatch.setenv("DVFS_TORCH_DEVICE", "quantum:7")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # unreachable: the check comes before the store
    result = CliRunner().invoke(main, ["sweep", "--preset", "smoke", "--device", "jetson"], catch_exceptions=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "DVFS_TORCH_DEVICE 'quantum:7' is not a torch device" in lines[0]
    monkeypatch.delenv("DVFS_TORCH_DEVICE")
    with pytest.raises(DvfsError, match="'quantum:7' is not a torch device"):
        board_of(JetsonDevice(), "quantum:7")
    callback = DvfsCallback(device="jetson", torch_device="quantum:7", freq=612.0, announce=None)
    with pytest.raises(DvfsError, match="'quantum:7' is not a torch device"):
        callback.on_train_begin(args=None, state=None, control=None, model=None)
    assert fake.range_hz == DEFAULT and list_journals(state_dir) == []
