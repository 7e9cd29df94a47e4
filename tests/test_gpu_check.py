"""scripts/gpu-check --board on fake boards: it prints the power mode, the cap held at the start and the energy source,
and changes nothing (observe only)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testkit.fakes.fake_pynvml import FakeGPU, read_shared_state, write_shared_state
from testkit.fakes.sysfs import apply_nvpmodel_mode, make_orin_tree
from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu-check"


def _check(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "LOAD_S": "0.5", "OUT": str(tmp_path), **env}
    return subprocess.run([str(SCRIPT), "--board"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)


def test_gpu_check_on_a_jetson_prints_the_mode_the_cap_at_start_and_the_energy_source(tmp_path):
    fake = make_orin_tree(tmp_path / "root")
    apply_nvpmodel_mode(fake, 2)  # MODE_30W: GPU cap 612 MHz, TPC_PG_MASK 8
    (fake.node / "max_freq").write_text("510000000\n")  # something else holds the GPU at 510 MHz
    before = {p: p.read_bytes() for p in fake.node.iterdir() if p.is_file()}
    r = _check({"DEVICE": "jetson", "DVFS_SYSFS_ROOT": str(fake.root)}, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "power mode: 2:MODE_30W (GPU cap 612 MHz, TPC_PG_MASK 8)"
    assert lines[1] == "cap at start: 510 MHz (max_freq read below the power mode's range)"
    assert lines[2].startswith("energy source: samples; ") and "observe only" in lines[2]
    assert {p: p.read_bytes() for p in fake.node.iterdir() if p.is_file()} == before


def test_gpu_check_on_nvml_reads_the_counters_period_and_locks_nothing(tmp_path):
    state = str(tmp_path / "nvml.json")
    write_shared_state(state, [FakeGPU(power_mw=120_000)])
    shim = os.pathsep.join([str(REPO / "testkit" / "fakes" / "nvml_shim"), str(REPO)])
    r = _check({"DEVICE": "nvml", "PYTHONPATH": shim, "DVFS_FAKE_NVML_STATE": state}, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "power mode: none (nvml: no nvpmodel)" and lines[1] == "cap at start: none"
    source, rest = lines[2].removeprefix("energy source: ").split(", counter update period ")
    period_ms, seconds = float(rest.split(" ms; ")[0]), float(rest.split(" J over ")[1].split(" s")[0])
    assert 90 <= period_ms <= 120  # the fake's 100 ms counter, inferred
    # the counter where the run spans at least 20 of its periods (the load's python start-up counts), else the samples
    assert source == ("counter" if seconds >= 20 * period_ms / 1000 else "samples")
    assert read_shared_state(state)["calls"] == []  # observe: no lock, no reset
