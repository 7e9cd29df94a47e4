"""`sweep --knobs gpu,cpu[,emc]`: a configuration (GPU, CPU, memory clock) is a sweep's point, end to end on a replayed
grid (written here) and on the twin, grid and adaptive, `--json`; today's sweeps keep their ids; bad input is one line
and writes nothing."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli

GPU = (306.0, 612.0, 918.75)
CPU = (1000.0, 2201.6)
EMC = (800.0, 3199.0)
WORKLOAD = "bert-tiny/sst2"
# a point trains a few steps of the tiny model on the CPU; the replay device charges each step as the grid records it
TRAIN = ["--workloads", WORKLOAD, "--claims", "none"]  # a replayed grid names its workloads; each point looks one unit up


def _time(g: float, c: float, e: float) -> float:
    """A made-up workload where every clock matters: time falls with each clock."""
    return 0.1 + 100.0 / g + 50.0 / c + 20.0 / e


def _energy(g: float, c: float, e: float) -> float:
    return _time(g, c, e) * (5.0 + 0.01 * g + 0.002 * c + 0.001 * e)


def _grid(tmp_path: Path, columns: tuple[str, ...] = ("cpu_mhz", "emc_mhz")) -> Path:
    """The workload at every GPU x CPU x EMC setting (or without the columns left out), one measurement each."""
    rows = ["workload,gpu_mhz," + "".join(f"{c}," for c in columns) + "time_s,energy_j"]
    for g, c, e in itertools.product(GPU, CPU if "cpu_mhz" in columns else CPU[-1:], EMC if "emc_mhz" in columns else EMC[-1:]):
        clocks = [f"{g:g}"] + [f"{v:g}" for k, v in (("cpu_mhz", c), ("emc_mhz", e)) if k in columns]
        rows.append(f"{WORKLOAD},{','.join(clocks)},{_time(g, c, e)!r},{_energy(g, c, e)!r}")
    path = tmp_path / "board-k.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()], max_results=1000)


def _points(uri: str) -> list:
    return [r for r in _runs(uri) if "dvfs.point" in r.data.tags]


def test_a_joint_grid_sweep_on_a_replayed_grid_measures_every_configuration_and_json_names_the_best(tmp_path, empty_store):
    grid = _grid(tmp_path)
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), *TRAIN, "--knobs", "gpu,cpu,emc", "--freqs", "612,918.75",
                "--json", env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 0, r.stderr[-2000:]
    picks = [json.loads(line) for line in r.stdout.splitlines()]  # one JSON object per workload
    points = _points(empty_store)
    assert len(points) == 1 + 2 * len(CPU) * len(EMC)  # maxn, then every configuration of the two GPU clocks
    assert f"ran {len(points)} points" in r.stderr
    keys = {p.data.tags["dvfs.point"] for p in points}
    assert f"{WORKLOAD}@612/cpu1000/emc800#0" in keys and f"{WORKLOAD}@maxn#0" in keys
    pinned = [p for p in points if p.data.params["freq_mhz"] != "maxn"]
    assert {(float(p.data.params["freq_mhz"]), float(p.data.params["cpu_freq_mhz"]), float(p.data.params["emc_freq_mhz"]))
            for p in pinned} == set(itertools.product((612.0, 918.75), CPU, EMC))
    # the best is the grid's own least-energy configuration among those swept, as the file writes it
    g, c, e = min(itertools.product((612.0, 918.75), CPU, EMC), key=lambda s: _energy(*s))
    (w,) = picks
    assert w["workload"] == WORKLOAD and w["points_measured"] == 8
    assert (w["best"]["gpu_mhz"], w["best"]["cpu_mhz"], w["best"]["emc_mhz"]) == (g, c, e)
    assert w["best"]["energy_j"] == pytest.approx(_energy(g, c, e), rel=1e-6)


def test_a_joint_adaptive_sweep_on_a_replayed_grid_measures_what_the_joint_search_asks_and_picks(tmp_path, empty_store):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.model.joint import JointSearch, JointSpace, search

    grid = _grid(tmp_path)
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), *TRAIN, "--knobs", "gpu,cpu,emc", "--strategy", "adaptive",
                "--json", env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 0, r.stderr[-2000:]
    (w,) = [json.loads(line) for line in r.stdout.splitlines()]
    # what the search run on its own measures and picks from the same grid (the sweep's start: mid-table, no governor)
    dev = ReplayDevice(grid)
    board = board_of(dev)
    proposer = JointSearch(JointSpace.from_grid(dev.grid), budget=20, start_mhz=GPU[len(GPU) // 2], voltage_shape=board.voltage_shape,
                           noise=board.noise(1))
    alone = search(lambda s: dev.measure_setting(WORKLOAD, s), proposer)
    assert w["points_measured"] == alone.configurations <= 20
    assert (w["best"]["gpu_mhz"], w["best"]["cpu_mhz"], w["best"]["emc_mhz"]) == (alone.pick.gpu_mhz, alone.pick.cpu_mhz, alone.pick.emc_mhz)
    points = _points(empty_store)
    assert all(p.data.tags["dvfs.strategy"] == "adaptive" for p in points)
    parent = next(r for r in _runs(empty_store) if "dvfs.point" not in r.data.tags)
    text = Path(MlflowClient(tracking_uri=empty_store).download_artifacts(parent.info.run_id, "configurations.csv", str(tmp_path))).read_text()
    lines = text.splitlines()
    assert lines[0] == "workload,freq_mhz,cpu_mhz,emc_mhz,time_s,energy_j,picked" and len(lines) == 1 + alone.configurations
    assert sum(line.endswith(",1") for line in lines[1:]) == 1
    # the same command again resumes it: every configuration is read back by its point key, nothing is measured again
    again = run_cli("sweep", "--device", "replay", "--trace", str(grid), *TRAIN, "--knobs", "gpu,cpu,emc", "--strategy", "adaptive",
                    "--json", env={"MLFLOW_TRACKING_URI": empty_store})
    assert again.returncode == 0, again.stderr[-2000:]
    (resumed,) = [json.loads(line) for line in again.stdout.splitlines()]
    assert f"ran 0 points, {len(points)} were already finished" in again.stderr and resumed["best"] == w["best"]


@pytest.mark.parametrize("strategy", ["grid", "adaptive"])
def test_a_joint_sweep_on_the_twin_pins_each_configuration(strategy, empty_store):
    """Profile-only points of the twin (SIMULATED): each run records the CPU clock it pinned beside the GPU's."""
    r = run_cli("sweep", "--device", "sim", "--models", "bert-tiny", "--tasks", "sst2", "--steps", "0", "--profile-steps", "20",
                "--claims", "none", "--knobs", "gpu,cpu", "--cpu-freqs", "729.6,1190.4,2201.6", "--freqs", "612,918,1300.5",
                "--strategy", strategy, "--json", env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(" (SIMULATED): ran " in line for line in r.stderr.splitlines()), r.stderr[-2000:]
    (w,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert w["best"]["cpu_mhz"] in (729.6, 1190.4, 2201.6) and "emc_mhz" not in w["best"]
    pinned = [p for p in _points(empty_store) if p.data.params["freq_mhz"] != "maxn"]
    assert {p.data.params["cpu_freq_mhz"] for p in pinned} <= {"729.6", "1190.4", "2201.6"} and "emc_freq_mhz" not in pinned[0].data.params
    assert w["points_measured"] == len({(p.data.params["freq_mhz"], p.data.params["cpu_freq_mhz"]) for p in pinned})
    if strategy == "grid":
        assert w["points_measured"] == 9
        # train makes a governor of configurations of it, judged by holding tasks out: one task is refused in one line
        sweep_id = re.search(r"sweep (sweep-\w+) \(SIMULATED\): ran", r.stderr).group(1)
        t = run_cli("train", "--sweep-id", sweep_id, env={"MLFLOW_TRACKING_URI": empty_store})
        assert t.returncode == 2 and "have 1 task(s) (sst2); sweep at least two training tasks" in t.stderr, t.stderr[-2000:]
    # one energy for both: every point of a joint sweep on the twin carries the energy of the rails every clock feeds
    # (AGX Orin: GPU/SoC, CPU and DRAM), and its configurations are compared on it
    points = _points(empty_store)
    assert all(p.data.params["energy_joint_rails"] == "VDD_GPU_SOC,VDD_CPU_CV,VDDQ_VDD2_1V8AO" for p in points)
    assert all(p.data.metrics["energy_joint_j"] > p.data.metrics["energy_j"] for p in points)  # the DRAM rail's share on top
    best = min(pinned, key=lambda p: p.data.metrics["energy_joint_j"])
    assert (float(best.data.params["freq_mhz"]), float(best.data.params["cpu_freq_mhz"])) == (w["best"]["gpu_mhz"], w["best"]["cpu_mhz"])


@pytest.mark.parametrize(("args", "message"), [
    (["--knobs", "gpu,fan"], "unknown clock knob (--knobs) 'fan'"),
    (["--knobs", "cpu"], "the GPU clock is always tuned"),
    (["--knobs", "gpu,cpu", "--cpu-freqs", "1500"], "unknown CPU clock '1500'"),
    (["--cpu-freqs", "1000"], "--cpu-freqs names CPU clocks for a sweep that does not tune the CPU clock"),
])
def test_bad_knobs_are_one_line_and_write_nothing(tmp_path, empty_store, args, message):
    r = run_cli("sweep", "--device", "replay", "--trace", str(_grid(tmp_path)), *TRAIN, *args, env={"MLFLOW_TRACKING_URI": empty_store})
    lines = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not _runs(empty_store)


def test_a_clock_the_backend_cannot_set_is_one_line_and_writes_nothing(tmp_path, empty_store):
    """A grid measured without a CPU column has no CPU clock to tune."""
    grid = _grid(tmp_path, columns=("emc_mhz",))
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), *TRAIN, "--knobs", "gpu,cpu,emc",
                env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 2 and "the replay backend cannot set the CPU clock; drop cpu from --knobs" in r.stderr, r.stderr
    assert not _runs(empty_store)


def test_a_joint_sweeps_figure_draws_a_line_per_cpu_and_memory_pair(tmp_path, monkeypatch):
    import pandas as pd

    from dvfs_mlops.mlops.sweep.plots import _draw

    drawn: dict = {}
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        drawn.setdefault(self.get_ylabel() or len(drawn), []).append(kwargs.get("label"))
        return real_plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    rows = [{"freq_mhz": "maxn", "cpu_freq_mhz": None, "emc_freq_mhz": None, "energy_j": 10.0, "time_s": 1.0, "avg_power_w": 10.0}]
    rows += [{"freq_mhz": f"{g:g}", "cpu_freq_mhz": c, "emc_freq_mhz": e, "energy_j": _energy(g, c, e), "time_s": _time(g, c, e),
              "avg_power_w": _energy(g, c, e) / _time(g, c, e)} for g, c, e in itertools.product(GPU, CPU, EMC)]
    _draw("w", pd.DataFrame(rows), tmp_path / "w.png")
    assert (tmp_path / "w.png").stat().st_size > 0
    labels = [label for labels in drawn.values() for label in labels if label]
    assert "CPU 1000.0 / EMC 800.0 MHz" in labels and len([x for x in labels if x.startswith("CPU")]) == 3 * len(CPU) * len(EMC)
    g, c, e = min(itertools.product(GPU, CPU, EMC), key=lambda s: _energy(*s))
    assert f"optimum {g:g} MHz (CPU {c} / EMC {e} MHz)" in labels
