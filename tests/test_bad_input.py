"""The bad-input matrix: every command, one line on stderr, exit code 2, no traceback, nothing half-written."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from dvfs_mlops.cli import main
from dvfs_mlops.device.guard import list_journals
from tests.fakes.sysfs import make_orin_tree

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
    (["registry", "rollback"], "no 'previous' version"),
    (["finetune", "--task", "sst2"], "name the model"),
    (["finetune", "--model", "bert-tiny", "--task", "squad"], "unknown task 'squad'"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--device", "jetson", "--dry-run", "--train-size", "16"],
     "no dvfs-governor version has alias 'production'"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--governor", "models:/nope/1", "--dry-run", "--train-size", "16"],
     "nope has no version 1"),
    (["evaluate", "--policies", "magic"], "experiment 'dvfs-sweep' does not exist"),
    (["evaluate", "--objective", "power"], "unknown objective 'power'"),
]


@pytest.fixture
def env(tmp_path, monkeypatch):
    fake = make_orin_tree(tmp_path / "root", jetpack=6)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_kk: 1\n")
    (tmp_path / "empty").mkdir()
    return fake, {"{bad_yaml}": str(bad), "{empty_dir}": str(tmp_path / "empty")}


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
