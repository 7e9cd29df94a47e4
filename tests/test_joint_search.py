"""The joint (GPU, CPU, EMC) search (`dvfs_mlops.model.joint`): within its budget, inside the tables, the same choices
from the same measurements, the optimum of a separable surface found, `max-slowdown` honoured, every bad input one
line; and one search on the shipped BoFL grid through the replay device."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.replay import ReplayDevice, Setting
from dvfs_mlops.model.curve import Measurement, next_clock
from dvfs_mlops.model.joint import DEFAULT_BUDGET, JointSearch, JointSpace, Measured, search

REPO = Path(__file__).resolve().parents[1]
GPU = (300.0, 450.0, 600.0, 750.0, 900.0, 1050.0, 1200.0, 1350.0)
CPU = (400.0, 700.0, 1000.0, 1300.0, 1600.0, 1900.0, 2200.0)
EMC = (600.0, 1200.0, 1800.0, 2400.0)
WORKLOAD = "toy"


def _time(g: float, c: float, m: float) -> float:
    """A made-up separable step: a product of one factor per clock, each falling as its clock rises."""
    return (0.05 + 300.0 / g) * (1.0 + (500.0 / c) ** 2) * (1.0 + 200.0 / m)


def _power(g: float, c: float, m: float) -> float:
    """Its power: a product of one factor per clock, each rising with its clock (the GPU's steepest)."""
    return (3.0 + 6.0 * (g / 1000.0) ** 3) * (1.0 + 0.25 * (c / 1000.0) ** 2) * (1.0 + 0.06 * (m / 1000.0))


SURFACE = {Setting(g, c, m): (_time(g, c, m), _time(g, c, m) * _power(g, c, m)) for g, c, m in itertools.product(GPU, CPU, EMC)}
TOP = Setting(GPU[-1], CPU[-1], EMC[-1])


def _optimum(limit: float | None = None) -> Setting:
    """The surface's least-energy setting (no slower than `limit` x the top setting's time where given)."""
    fast = [s for s, (t, _) in SURFACE.items() if limit is None or t <= limit * SURFACE[TOP][0]]
    return min(fast, key=lambda s: SURFACE[s][1])


@pytest.fixture
def grid(tmp_path) -> Path:
    """The separable surface as a replay grid, one measurement per setting."""
    rows = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j"]
    rows += [f"{WORKLOAD},{s.gpu_mhz:g},{s.cpu_mhz:g},{s.emc_mhz:g},{t!r},{e!r}" for s, (t, e) in SURFACE.items()]
    path = tmp_path / "board-sep.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _replayed(path: Path, objective: str = "energy", knobs: tuple[str, ...] = ("gpu", "cpu", "emc"), **options):
    dev = ReplayDevice(path)
    space = JointSpace.from_grid(dev.grid, knobs)
    result = search(lambda s: dev.measure_setting(WORKLOAD, s), JointSearch(space, objective, **options))
    return dev, result


def _proposals(proposer: JointSearch, measure=lambda s: SURFACE[s]) -> list[Setting]:
    measured: list[Measured] = []
    while (s := proposer.next_configuration(measured)) is not None:
        measured.append(Measured(s, *measure(s)))
    return [m.setting for m in measured]


def test_the_surface_is_a_fair_test():
    # the optimum is inside every table (not a corner the search would reach by walking one way), and it is not the
    # GPU-only optimum: the CPU and EMC clocks matter
    best = _optimum()
    assert GPU[0] < best.gpu_mhz < GPU[-1] and CPU[0] < best.cpu_mhz < CPU[-1] and EMC[0] < best.emc_mhz < EMC[-1]
    gpu_only = min((Setting(g, CPU[-1], EMC[-1]) for g in GPU), key=lambda s: SURFACE[s][1])
    assert SURFACE[best][1] < 0.8 * SURFACE[gpu_only][1]


def test_it_finds_the_optimum_of_a_separable_surface_measuring_few(grid):
    dev, result = _replayed(grid)
    assert result.pick == _optimum()
    assert result.objective == "energy"
    # what it measured is what the replay device looked up (a sweep's points_measured)
    assert result.configurations == len(dev.looked_up(WORKLOAD)) == len({m.setting for m in result.measured})
    assert result.configurations <= DEFAULT_BUDGET < len(SURFACE)
    assert result.measured[0].setting == TOP  # the reference comes first


@pytest.mark.parametrize("limit", [1.1, 1.3, 1.5])
def test_max_slowdown_is_honoured(grid, limit):
    dev, result = _replayed(grid, f"max-slowdown:{limit}")
    assert SURFACE[result.pick][0] <= limit * SURFACE[TOP][0]
    assert result.pick == _optimum(limit)
    # a slack the energy optimum would break
    assert SURFACE[_optimum()][0] > limit * SURFACE[TOP][0]
    assert result.configurations == len(dev.looked_up(WORKLOAD)) <= DEFAULT_BUDGET


@pytest.mark.parametrize("budget", [1, 2, 5, 9])
def test_it_never_measures_past_its_budget(grid, budget):
    dev, result = _replayed(grid, budget=budget)
    assert result.configurations == len(dev.looked_up(WORKLOAD)) == budget  # the search wants more than 9
    measured = list(result.measured)
    assert JointSearch(JointSpace(GPU, CPU, EMC), budget=budget).next_configuration(measured) is None
    assert result.pick == min(dev.looked_up(WORKLOAD), key=lambda s: SURFACE[s][1])


def test_extra_measurements_count_against_the_budget():
    proposer = JointSearch(JointSpace(GPU, CPU, EMC), budget=3)
    extra = [Measured(Setting(g, CPU[0], EMC[0]), *SURFACE[Setting(g, CPU[0], EMC[0])]) for g in GPU[:3]]
    assert proposer.next_configuration(extra) is None
    assert proposer.pick(extra) == min((m.setting for m in extra), key=lambda s: SURFACE[s][1])


@pytest.mark.parametrize("objective", ["energy", "max-slowdown:1.2", "edp"])
def test_every_proposal_is_a_new_setting_of_the_tables(objective):
    space = JointSpace(GPU, CPU, EMC)
    proposed = _proposals(JointSearch(space, objective))
    assert len(proposed) == len(set(proposed))
    assert set(proposed) <= set(space) and len(set(space)) == len(SURFACE)


def test_a_knob_not_tuned_is_held_at_the_grids_top(grid):
    dev = ReplayDevice(grid)
    space = JointSpace.from_grid(dev.grid, ("gpu", "cpu"))
    assert space.emc_mhz == (EMC[-1],) and space.size == len(GPU) * len(CPU)
    proposed = _proposals(JointSearch(space))
    assert {s.emc_mhz for s in proposed} == {EMC[-1]}
    assert len({s.cpu_mhz for s in proposed}) > 1


def test_a_gpu_only_grid_is_searched_along_its_one_axis(tmp_path):
    path = tmp_path / "gpu-only.csv"
    path.write_text("workload,gpu_mhz,time_s,energy_j\n" + "".join(
        f"{WORKLOAD},{g:g},{_time(g, CPU[-1], EMC[-1])!r},{SURFACE[Setting(g, CPU[-1], EMC[-1])][1]!r}\n" for g in GPU))
    dev, result = _replayed(path, knobs=("gpu",))
    assert result.pick == Setting(_optimum_gpu(), None, None)
    assert all(s.cpu_mhz is None and s.emc_mhz is None for s in dev.looked_up(WORKLOAD))


def _optimum_gpu() -> float:
    return min(GPU, key=lambda g: SURFACE[Setting(g, CPU[-1], EMC[-1])][1])


def test_the_gpu_axis_comes_first_as_the_adaptive_sweep_measures_it():
    proposed = _proposals(JointSearch(JointSpace(GPU, CPU, EMC)))
    assert proposed[0] == TOP
    cut: list[Measurement] = []
    expected = []
    while (f := next_clock(cut, GPU, GPU[len(GPU) // 2])) is not None:
        s = Setting(f, CPU[-1], EMC[-1])
        expected.append(s)
        cut.append(Measurement(f, *SURFACE[s]))
    assert [s for s in proposed[1:] if (s.cpu_mhz, s.emc_mhz) == (CPU[-1], EMC[-1])][:len(expected) - 1] == \
        [s for s in expected if s != TOP]
    assert proposed[1] == Setting(GPU[len(GPU) // 2], CPU[-1], EMC[-1])
    # the governor's clock, where given, is where the GPU axis starts
    assert _proposals(JointSearch(JointSpace(GPU, CPU, EMC), start_mhz=1040.0))[1] == Setting(1050.0, CPU[-1], EMC[-1])


def test_the_same_measurements_give_the_same_choices_in_any_order():
    space = JointSpace(GPU, CPU, EMC)
    first = _proposals(JointSearch(space, "max-slowdown:1.3"))
    assert first == _proposals(JointSearch(space, "max-slowdown:1.3"))
    # stateless: a fresh proposer told the first k measurements (shuffled, as a store returns them) asks for the k+1-th
    rng = random.Random(7)
    for k in range(len(first)):
        told = [Measured(s, *SURFACE[s]) for s in first[:k]]
        rng.shuffle(told)
        assert JointSearch(space, "max-slowdown:1.3").next_configuration(told) == first[k]


def test_repeats_of_a_setting_are_averaged():
    space = JointSpace(GPU, CPU, EMC)
    a, b = Setting(600.0, 1000.0, 1800.0), Setting(750.0, 1000.0, 1800.0)
    # a's two repeats average to 11 J, b's one to 10.5 J: b is picked, though a's first repeat is the lowest draw
    measured = [Measured(a, 1.0, 10.0), Measured(a, 1.0, 12.0), Measured(b, 1.0, 10.5)]
    assert JointSearch(space).pick(measured) == b
    # and a setting measured again is never asked for: the proposer looks at what it has
    top = [Measured(TOP, *SURFACE[TOP]), Measured(TOP, *SURFACE[TOP])]
    assert JointSearch(space).next_configuration(top) == Setting(GPU[len(GPU) // 2], CPU[-1], EMC[-1])


def test_the_pick_of_max_slowdown_is_the_cheapest_fast_enough():
    space = JointSpace(GPU, CPU, EMC)
    slow = _optimum()  # the cheapest, and far too slow for 1.2
    fast = Setting(1200.0, 2200.0, 2400.0)
    measured = [Measured(s, *SURFACE[s]) for s in (TOP, slow, fast)]
    assert SURFACE[slow][0] > 1.2 * SURFACE[TOP][0] >= SURFACE[fast][0] and SURFACE[fast][1] < SURFACE[TOP][1]
    assert JointSearch(space, "max-slowdown:1.2").pick(measured) == fast
    assert JointSearch(space, "energy").pick(measured) == slow


@pytest.mark.parametrize(("make", "words"), [
    (lambda: JointSpace(()), "at least one GPU clock"),
    (lambda: JointSpace((900.0, 300.0)), "ascending"),
    (lambda: JointSpace(GPU, (700.0, 700.0)), "distinct"),
    (lambda: JointSpace(GPU, (-1.0, 700.0)), "positive"),
    (lambda: JointSearch(JointSpace(GPU), budget=0), "budget"),
    (lambda: JointSearch(JointSpace(GPU), gpu_clocks=1), "gpu_clocks"),
    (lambda: JointSearch(JointSpace(GPU), "fastest"), "unknown objective"),
    (lambda: JointSearch(JointSpace(GPU), "max-slowdown:0.9"), "max-slowdown"),
    (lambda: JointSearch(JointSpace(GPU, CPU, EMC)).next_configuration([Measured(Setting(333.0, CPU[0], EMC[0]), 1.0, 1.0)]),
     "gpu clock 333"),
    (lambda: JointSearch(JointSpace(GPU, CPU, EMC)).next_configuration([Measured(Setting(GPU[0]), 1.0, 1.0)]), "cpu clock None"),
    (lambda: JointSearch(JointSpace(GPU, CPU, EMC)).next_configuration([Measured(TOP, 1.0, 0.0)]), "energy"),
    (lambda: JointSearch(JointSpace(GPU, CPU, EMC)).next_configuration([Measured(TOP, float("nan"), 1.0)]), "time"),
    (lambda: JointSearch(JointSpace(GPU)).pick([]), "nothing measured"),
    (lambda: JointSearch(JointSpace(GPU, CPU, EMC), "max-slowdown:1.1").pick([Measured(Setting(GPU[0], CPU[0], EMC[0]), 1.0, 1.0)]),
     "measure it first"),
])
def test_bad_input_is_one_line(make, words):
    with pytest.raises(DvfsError) as e:
        make()
    assert words.lower() in str(e.value).lower() and "\n" not in str(e.value)


@pytest.mark.parametrize(("knobs", "words"), [(("gpu", "fan"), "tune gpu"), (("cpu",), "tune gpu"), (("gpu", "cpu"), "no cpu_mhz column")])
def test_knobs_a_grid_cannot_tune_are_one_line(tmp_path, knobs, words):
    path = tmp_path / "gpu-only.csv"
    path.write_text(f"workload,gpu_mhz,time_s,energy_j\n{WORKLOAD},500,1.0,2.0\n{WORKLOAD},900,0.8,2.5\n")
    with pytest.raises(DvfsError) as e:
        JointSpace.from_grid(ReplayDevice(path).grid, knobs)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def bofl() -> ReplayDevice:
    return ReplayDevice(REPO / "benchmarks" / "data" / "public" / "bofl-agx-xavier.csv")


@pytest.mark.parametrize("objective", ["energy", "max-slowdown:1.10"])
def test_on_the_shipped_bofl_grid_it_beats_the_gpu_knob_alone(bofl, objective):
    # REPLAYED: one workload of the real Jetson AGX Xavier grid (benchmarks/joint.py reports the figures of all three)
    grid, workload = bofl.grid, "ViT-B16_CIFAR10_bs32"
    space = JointSpace.from_grid(grid)
    looked: list[Setting] = []

    def measure(s: Setting):
        looked.append(s)
        return grid.mean(workload, s)

    proposer = JointSearch(space, objective)
    result = search(measure, proposer)
    assert result.configurations == len(set(looked)) <= DEFAULT_BUDGET
    top = grid.mean(workload, space.top)
    limit = proposer.objective.max_slowdown or float("inf")
    gpu_only = [grid.mean(workload, grid.slice_setting(g)) for g in grid.gpu_mhz]
    best_gpu_only = min((m for m in gpu_only if m.time_s <= limit * top.time_s), key=lambda m: m.energy_j)
    picked = grid.mean(workload, result.pick)
    assert picked.time_s <= limit * top.time_s
    assert picked.energy_j < best_gpu_only.energy_j
    assert result.pick.cpu_mhz < space.cpu_mhz[-1]  # the CPU clock was tuned, not left at its top
