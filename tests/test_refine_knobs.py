"""Refine tunes the CPU and memory clocks online after the GPU's (`--knobs gpu,cpu[,emc]` on finetune and
`DvfsCallback`): each axis walked down from its top while the energy per step falls, within the step budget."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import board_of
from dvfs_mlops.hw.replay import ReplayDevice
from dvfs_mlops.job.refine import AxisWalk, Refiner, axis_grid
from tests.conftest import run_cli

GPU = (306.0, 612.0, 918.75)
CPU = (1000.0, 1600.0, 2201.6)
EMC = (800.0, 3199.0)


def _time(g: float, c: float, e: float) -> float:
    return 0.1 + 100.0 / g + 50.0 / c + 20.0 / e


def _energy(g: float, c: float, e: float) -> float:
    """Lower CPU and memory clocks save energy here at every GPU clock (the power they draw outweighs the time)."""
    return _time(g, c, e) * (5.0 + 0.01 * g + 0.002 * c + 0.001 * e)


@pytest.fixture
def grid(tmp_path) -> Path:
    rows = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j"]
    rows += [f"w,{g:g},{c:g},{e:g},{_time(g, c, e)!r},{_energy(g, c, e)!r}" for g, c, e in itertools.product(GPU, CPU, EMC)]
    path = tmp_path / "board-r.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _refine(path: Path, budget: int, steps: int = 200) -> tuple[Refiner, object]:
    dev = ReplayDevice(path)
    with dev.session(612, workload="w", cpu_mhz=CPU[-1], emc_mhz=EMC[-1]) as s:
        refiner = Refiner(s, budget=budget, total_steps=steps, board=board_of(dev), say=lambda _line: None,
                          knobs={"cpu_mhz": CPU, "emc_mhz": EMC})
        step = 0
        while refiner.active and step < steps:
            s.step()
            refiner.on_step(step)
            step += 1
    return refiner, s


def test_refine_walks_the_cpu_and_memory_axes_to_the_grids_best_at_the_gpu_clock_it_settled_on(grid):
    refiner, session = _refine(grid, budget=120)
    result = refiner.result
    assert result is not None and result.chosen_mhz in GPU
    best_cpu, best_emc = min(itertools.product(CPU, EMC), key=lambda ce: _energy(result.chosen_mhz, *ce))
    assert result.chosen_knobs == {"cpu_mhz": best_cpu, "emc_mhz": best_emc}
    assert (session.cpu_mhz, session.emc_mhz) == (best_cpu, best_emc)  # the rest of the job ran there
    walked = [p for p in result.probes if (p.cpu_mhz, p.emc_mhz) != (CPU[-1], EMC[-1])]
    assert walked and all(p.freq_mhz == result.chosen_mhz for p in walked)
    for p in result.probes:  # each window is the grid's own value at its configuration (the GPU's at the knobs' tops)
        assert p.per_step().energy_j == pytest.approx(_energy(p.freq_mhz, p.cpu_mhz, p.emc_mhz))
    assert result.probe_steps <= 120
    csv = result.to_csv().splitlines()
    assert csv[0].endswith(",gpu_util,cpu_mhz,emc_mhz") and sum(line.split(",")[8] == "1" for line in csv if line.startswith("probe")) == 1
    assert any("then CPU 1000 MHz, EMC 800 MHz" in line for line in result.lines())


def test_the_walk_stays_within_its_budget(grid):
    small = _refine(grid, budget=40)[0].result
    assert small is not None and small.probe_steps <= 40
    walk = AxisWalk([("cpu_mhz", CPU), ("emc_mhz", EMC)], windows=1, noise=0.01)
    assert walk.next_knobs() == {"cpu_mhz": 2201.6, "emc_mhz": 3199.0}  # the start at the tops
    walk.record(1.0)
    assert walk.next_knobs() is None and walk.chosen == {"cpu_mhz": 2201.6, "emc_mhz": 3199.0}


def test_an_axis_is_walked_on_a_few_clocks_of_its_table_top_included():
    table = [115.2 + 76.8 * k for k in range(29)]
    grid = axis_grid(table)
    assert len(grid) == 6 and grid[-1] == table[-1] and grid[0] == table[0] and grid == sorted(grid)
    assert axis_grid([1.0, 2.0]) == [1.0, 2.0]


def test_a_small_fall_within_the_noise_does_not_move():
    walk = AxisWalk([("cpu_mhz", (1000.0, 2000.0))], windows=5, noise=0.05, start=1.0)
    assert walk.next_knobs() == {"cpu_mhz": 1000.0}
    walk.record(0.99)  # 1 % below, the windows' noise 5 %
    assert walk.next_knobs() is None and walk.chosen == {"cpu_mhz": 2000.0}


def test_knobs_are_checked_before_anything_runs():
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.mlops.launch import LaunchOptions

    with pytest.raises(DvfsError, match="unknown clock knob"):
        DvfsCallback.tuning("gpu,fan", device="sim")
    assert DvfsCallback.tuning("gpu,cpu", device="sim").options.tuned_knobs == ("gpu", "cpu")
    with pytest.raises(DvfsError, match="the GPU clock is always tuned"):
        LaunchOptions(tuned="cpu")
    from dvfs_mlops.hw.sim import SimDevice

    assert LaunchOptions(tuned="gpu,emc").knob_tables(SimDevice()) == {"emc_mhz": sorted(SimDevice().emc_frequencies_mhz)}
    with pytest.raises(DvfsError, match="--observe pins nothing"):
        LaunchOptions(tuned="gpu,cpu", observe=True).knob_tables(SimDevice())


@pytest.fixture
def production(empty_store) -> str:
    env = {"MLFLOW_TRACKING_URI": empty_store}
    assert run_cli("registry", "bootstrap", env=env).returncode == 0
    assert run_cli("registry", "promote", "1", env=env).returncode == 0
    return empty_store


FINETUNE = ["finetune", "--device", "sim", "--model", "bert-tiny", "--task", "sst2", "--steps", "80", "--train-size", "64",
            "--no-save-model", "--probe-steps", "0"]


def test_finetune_on_the_twin_tunes_the_cpu_clock_and_records_the_configuration(production):
    r = run_cli(*FINETUNE, "--knobs", "gpu,cpu", "--refine", "60", "--json", env={"MLFLOW_TRACKING_URI": production})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["decision"]["cpu_mhz"] == 2201.6 and "emc_mhz" not in out["decision"]  # refine starts at the CPU's top
    refined = out["refine"]
    assert refined["simulated"] is True and "cpu_mhz" in refined and "emc_mhz" not in refined
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=production).get_run(out["run_id"])
    assert float(run.data.params["cpu_freq_mhz"]) == refined["cpu_mhz"] and "emc_freq_mhz" not in run.data.params
    assert float(run.data.params["freq_mhz"]) == refined["chosen_mhz"]
    assert "refine: then CPU" in r.stderr and run.data.tags["mlflow.runName"].endswith(f"/cpu{refined['cpu_mhz']:g}")


@pytest.mark.parametrize(("args", "message"), [
    (["--knobs", "gpu,cpu", "--refine", "0"], "--knobs gpu,cpu: refine tunes the CPU and memory clocks online, and --refine 0 turns it off"),
    (["--knobs", "emc"], "the GPU clock is always tuned"),
])
def test_finetune_bad_knobs_are_one_line_and_write_nothing(production, args, message):
    r = run_cli(*FINETUNE, *args, env={"MLFLOW_TRACKING_URI": production})
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=production)
    exp = c.get_experiment_by_name("dvfs-finetune")
    assert exp is None or not c.search_runs([exp.experiment_id])
