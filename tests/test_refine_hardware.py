"""Refine on hardware (issue 31, items 5 and 8): probes spaced in MHz on any clock table, the voltage shape fitted
from the probes where the board's is only assumed, windows sized to the meter, a settling step after each re-pin
and a noise floor from each window's own samples."""
from __future__ import annotations

import itertools
import types

import pytest

from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE, Board
from dvfs_mlops.job import refine as refine_mod
from dvfs_mlops.job.refine import ProbePlan, Refiner, probe_grid
from dvfs_mlops.model.curve import Measurement
from tests.test_refine import _drive

ORIN_TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]
# An A100-like table: 15 MHz steps from 210 to 1410 MHz (nvidia-smi -q -d SUPPORTED_CLOCKS lists such a table).
FINE_TABLE = [210.0 + 15.0 * k for k in range(81)]
SHAPE = 0.85  # this "GPU"'s voltage-curve shape: far from the Orin's


def _truth(f: float, f_max: float = FINE_TABLE[-1], shape: float = SHAPE) -> Measurement:
    """Per-step time and energy of a workload following the curve model with voltage shape `shape`."""
    g, v = f / 1000.0, 1 + shape * (f / f_max) ** 2
    t = 0.05 + 0.04 / g
    return Measurement(f, t, t * (20.0 + 60.0 * v * v * g))


def test_probe_grid_is_the_orin_table_itself_and_thins_a_15_mhz_table_to_about_100_mhz():
    assert probe_grid(ORIN_TABLE, 816.0) == ORIN_TABLE
    grid = probe_grid(FINE_TABLE, 1110.0)
    assert 1110.0 in grid and set(grid) <= set(FINE_TABLE)
    steps = [b - a for a, b in itertools.pairwise(grid)]
    assert all(90.0 <= s <= 110.0 for s in steps) and grid[0] <= 260.0 and grid[-1] >= 1360.0


def test_first_probes_on_a_15_mhz_table_are_about_200_mhz_either_side_not_30():
    p = ProbePlan(1110.0, FINE_TABLE, 30, voltage_shape=None, noise=(0.01, 0.02))
    first = sorted(p.queue)
    assert len(first) == 3 and first[1] == 1110.0
    assert 190.0 <= first[1] - first[0] <= 210.0 and 190.0 <= first[2] - first[1] <= 210.0


def test_an_assumed_voltage_shape_is_fitted_from_the_probes_not_taken_from_the_orin():
    p = ProbePlan(1110.0, FINE_TABLE, 40, voltage_shape=None, noise=(0.001, 0.001))
    _drive(p, _truth)
    assert p.chosen_mhz is not None and abs(p.shape() - SHAPE) <= 0.1 and abs(p.shape() - ORIN_VOLTAGE_SHAPE) > 0.2
    # its predictions track the workload's true energy on the whole table (fitted with the right shape)
    worst = max(abs(c.energy_j / _truth(c.freq_mhz).energy_j - 1) for c in p.predicted if c.freq_mhz >= 700)
    assert [c.freq_mhz for c in p.predicted] == FINE_TABLE
    assert worst < 0.02


def test_an_assumed_shape_with_two_probes_stays_at_the_start_and_says_why():
    p = ProbePlan(1110.0, FINE_TABLE, 8, voltage_shape=None, noise=(0.01, 0.02))
    assert len(_drive(p, _truth)) == 2
    assert p.chosen_mhz == 1110.0 and "voltage curve is unknown" in p.reason


def test_refine_on_a_board_with_an_assumed_shape_fits_it_and_on_a_known_one_keeps_it():
    session = _Session(1110.0)
    assumed = _board(FINE_TABLE, min_window_s=0.0, known=False)
    assert Refiner(session, 30, 100, assumed, warmup=0).plan.voltage_shape is None
    known = _board(FINE_TABLE, min_window_s=0.0, known=True)
    assert Refiner(session, 30, 100, known, warmup=0).plan.voltage_shape == 0.5


STEP_S = 0.1  # the test's step time (the `clock` fixture advances by it)
SAMPLES_PER_STEP = 10


def _phases(steps: int, p: float) -> list[float]:
    """A steady job's power at 100 Hz: every step the same phases (forward +20 %, backward -20 %), no step unlike
    another: the window's mean is exact, although its samples spread by 20 %."""
    return [p * (1 + 0.2 * (1 if k % SAMPLES_PER_STEP < SAMPLES_PER_STEP // 2 else -1)) for k in range(steps * SAMPLES_PER_STEP)]


def _step_levels(steps: int, p: float) -> list[float]:
    """Steps whose mean power differs (+5 %, -5 %, ...), each flat within the step."""
    return [p * (1 + 0.05 * (-1) ** (k // SAMPLES_PER_STEP)) for k in range(steps * SAMPLES_PER_STEP)]


def _nvml_average(steps: int, p: float) -> list[float]:
    """nvmlDeviceGetPowerUsage on Ampere and later: each sample a ~1 s average (NVML API reference), so a 0.8 s
    window's samples are one smoothed value's lag, not independent draws: step levels seen through a 1 s moving mean."""
    raw = [p * (1 + 0.05 * (-1) ** (k // SAMPLES_PER_STEP)) for k in range(-100, steps * SAMPLES_PER_STEP)]
    return [sum(raw[k:k + 100]) / 100 for k in range(steps * SAMPLES_PER_STEP)]


class _Session:
    """A pinned session as the Refiner drives it, with windows whose reports follow `_truth` and whose power samples
    (100 Hz) follow `series`."""

    def __init__(self, mhz: float, series=_phases):
        self.pinned_mhz = self.freq = mhz
        self.calls: list[tuple[str, object]] = []
        self.series = series
        self._open: dict[str, int] = {}
        self._steps = 0

    def repin(self, mhz: float) -> None:
        self.freq = mhz
        self.calls.append(("repin", mhz))

    def begin_window(self, name: str) -> None:
        self.calls.append(("begin", name))
        self._open[name] = self._steps

    def step(self) -> None:
        self._steps += 1
        self.calls.append(("step", self._steps))

    def end_window(self, name: str) -> None:
        self.calls.append(("end", name))
        self._open[name] = self._steps - self._open[name]

    def window_report(self, name: str):
        steps = self._open[name]
        m = _truth(float(self.freq))
        return types.SimpleNamespace(duration_s=steps * STEP_S, energy_j=steps * m.energy_j, gpu_util_pct=None,
                                     power_series_w=self.series(steps, m.power_w))


def _board(table, *, min_window_s: float, known: bool = False, simulated: bool = False, power_average_s: float = 0.0) -> Board:
    return Board(backend="nvml", profile="nvml-test", family="nvml-test", device_id="GPU-test", simulated=simulated,
                 frequencies_mhz=tuple(table), voltage_shape=0.5, voltage_shape_known=known, min_window_s=min_window_s,
                 power_average_s=power_average_s)


@pytest.fixture
def clock(monkeypatch):
    """refine's monotonic clock, advanced 0.1 s per training step by the test."""
    now = types.SimpleNamespace(t=0.0)
    monkeypatch.setattr(refine_mod, "time", types.SimpleNamespace(monotonic=lambda: now.t))
    return now


def _run(refiner: Refiner, session: _Session, clock, steps: int) -> None:
    for step in range(steps):
        clock.t += STEP_S
        session.step()
        refiner.on_step(step)
        if not refiner.active:
            return


def test_windows_are_sized_to_the_meter_from_the_warmup_step_time_and_open_a_step_after_each_repin(clock):
    session = _Session(1110.0)
    r = Refiner(session, 60, 400, _board(FINE_TABLE, min_window_s=1.0), warmup=3)
    assert r.per_probe == 60 // refine_mod.MAX_PROBE_CLOCKS  # before the warm-up has shown the step time
    _run(r, session, clock, 400)
    assert r.per_probe == 10  # 1.0 s of meter at 0.1 s a step
    assert all(p.steps == 10 for p in r.result.probes)
    # every re-pin is followed by one settling step before its window opens
    calls = [c[0] for c in session.calls]
    repins = [k for k, c in enumerate(calls) if c == "repin"]
    assert len(repins) >= 2
    for k in repins[:-1]:  # the last re-pin is the settled clock's
        assert calls[k + 1:k + 3] == ["step", "begin"], session.calls[k - 1:k + 4]
    # the settling steps are counted and said beside the probe steps
    assert r.result.settle_steps == len(repins) - 1 and "settling after re-pins" in r.result.lines()[0]


def test_a_budget_too_small_for_meter_sized_windows_leaves_the_clock_and_says_so(clock):
    session = _Session(1110.0)
    r = Refiner(session, 30, 400, _board(FINE_TABLE, min_window_s=2.0), warmup=3)
    _run(r, session, clock, 10)
    assert not r.active and r.result.chosen_mhz == 1110.0 and "meter" in r.result.reason
    assert not any(c[0] == "repin" for c in session.calls)


def _first_window_noise(clock, series, **board) -> tuple[float, float]:
    session = _Session(1110.0, series)
    r = Refiner(session, 60, 400, _board(FINE_TABLE, min_window_s=0.0, **board), warmup=0)
    _run(r, session, clock, 9)  # one window of 60 // 7 = 8 steps
    assert len(r._probes) == 1
    return r.plan.noise


def test_the_noise_floor_on_hardware_comes_from_each_windows_own_samples(clock):
    # a steady job: its samples spread by 20 % within every step, yet its steps are alike: the floor, not 0.2 / sqrt(80)
    assert _first_window_noise(clock, _phases)[1] == refine_mod.NOISE_FLOOR
    # steps +-5 % apart: the standard error of 8 step means
    means = [1.05, 0.95] * 4
    mean = sum(means) / 8
    se = (sum((x - mean) ** 2 for x in means) / 7 / 8) ** 0.5 / mean
    assert _first_window_noise(clock, _step_levels)[1] == pytest.approx(se, rel=1e-6)
    # NVML's 1 s average: a 0.8 s window holds no independent batch, so the board's own per-window noise stands in
    board = _board(FINE_TABLE, min_window_s=0.0, power_average_s=1.0)
    assert _first_window_noise(clock, _nvml_average, power_average_s=1.0)[1] == board.noise_power
    # on the twin the board's own noise stays (its meter is exact per step)
    twin = _Session(1110.0, _step_levels)
    r_twin = Refiner(twin, 60, 400, _board(FINE_TABLE, min_window_s=0.0, simulated=True), warmup=0)
    _run(r_twin, twin, clock, 9)
    assert r_twin.plan.noise == _board(FINE_TABLE, min_window_s=0.0).noise()
