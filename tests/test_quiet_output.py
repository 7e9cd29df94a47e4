"""`make run`'s loop prints only what we print: no warnings, no ANSI colour codes, no progress-bar redraws.

The main commands run end to end as a user runs them (subprocesses, the sweep through `mlflow run -P ...` as
scripts/main-job does) on a tiny sim sweep against a fresh SQLite store, and each one that writes runs ends
with the MLflow UI deep link to open. About 40 s on 2 cores.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

BIN = Path(sys.executable).parent
NOISE = re.compile(r"Warning|warnings\.warn|\x1b|\r")
LOCAL_LINK = re.compile(r"^then open: (http://127\.0\.0\.1:5000/#/\S+)$")


def _noise(name: str, r: subprocess.CompletedProcess[str]) -> list[str]:
    return [f"{name}: {line!r}" for line in (r.stdout + r.stderr).split("\n") if NOISE.search(line) or "Traceback" in line]


def _link(name: str, r: subprocess.CompletedProcess[str], store: str) -> str:
    """The last two stdout lines: the command that starts the UI on this store, then the link."""
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) >= 2 and lines[-2] == f"start the MLflow UI: mlflow ui --backend-store-uri {store}", (name, lines[-3:])
    m = LOCAL_LINK.match(lines[-1])
    assert m, (name, lines[-1])
    return m.group(1)


@pytest.mark.skipif(not (BIN / "mlflow").exists(), reason="needs the mlflow entry point beside this interpreter")
def test_main_loop_prints_no_warnings_and_ends_with_ui_links(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    env = {"MLFLOW_TRACKING_URI": store, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    noise: list[str] = []

    # 1. sweep via the MLproject, with -P parameters (2 models x sst2/mrpc/rte at 510 MHz + maxn, 1 step each)
    sweep = subprocess.run([str(BIN / "mlflow"), "run", str(REPO), "-e", "sweep", "--env-manager", "local", "--experiment-name",
                            "dvfs-sweep", "-P", "preset=smoke", "-P", "freqs=510", "-P", "steps=1", "-P", "device=sim"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=300, cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    noise += _noise("sweep", sweep)
    link = _link("sweep", sweep, store)
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs\?workflowType=machine_learning", link), link

    steps = [
        ("train", ["train", "--trials", "3"], r"models/dvfs-governor/versions/1\?workflowType=machine_learning"),
        # one clock: no governor can beat FFG strictly (the beats-ffg gate), so this loop promotes with --force
        ("promote", ["registry", "promote", "latest", "--force"], r"models/dvfs-governor/versions/1\?workflowType=machine_learning"),
        ("finetune", ["finetune", "--model", "bert-tiny", "--task", "rte", "--device", "sim", "--steps", "1", "--probe-steps", "1",
                      "--train-size", "32"], r"experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning"),
        ("evaluate", ["evaluate"], r"experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning"),
    ]
    for name, args, tail in steps:
        r = run_cli(*args, env=env, timeout=300, process=True)  # warnings are a process's
        assert r.returncode == 0, (name, r.stderr[-3000:])
        noise += _noise(name, r)
        link = _link(name, r, store)
        assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/" + tail, link), (name, link)
    assert noise == [], "\n".join(noise)
