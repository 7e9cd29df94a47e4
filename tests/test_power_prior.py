"""The board's power prior (power_prior.py) and the curve fit that leans on it (curve.fit_curve(prior=...))."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dvfs_mlops.model.curve import ORIN_VOLTAGE_SHAPE, Measurement, PowerPrior, fit_curve
from dvfs_mlops.model.power_prior import MIN_SPREAD, fit_idle_share, leave_one_out_priors, log_ratio, usable
from testkit.boards import IDLE, TABLE, board_workload, run_spread, truth


def _workload(i: int, ratio_spread: float = 0.03, seed: int = 0) -> dict[str, float]:
    """Workload i of a synthetic board (testkit/boards.py; benchmarks/prior_robustness.py measures what the prior costs on them)."""
    return board_workload(i, ratio_spread, seed)


def _measure(w: dict[str, float], freqs, rng=None, noise=(0.0, 0.0), with_util: bool = True) -> list[Measurement]:
    out = []
    for f in freqs:
        t, p, u = truth(w, f)
        if rng is not None:
            t *= 1 + noise[0] * rng.standard_normal()
            p *= 1 + noise[1] * rng.standard_normal()
        out.append(Measurement(f, t, t * p, u if with_util else None))
    return out


def _energies(w: dict[str, float]) -> dict[float, float]:
    return {f: truth(w, f)[0] * truth(w, f)[1] for f in TABLE}


def test_the_idle_share_is_the_one_under_which_the_boards_workloads_agree():
    board = [_measure(_workload(i), (306.0, 612.0, 918.0, 1300.5)) for i in range(12)]
    assert fit_idle_share(board, ORIN_VOLTAGE_SHAPE, 1300.5) == pytest.approx(IDLE, abs=0.05)
    priors = leave_one_out_priors(board, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=1e-6)
    assert all(p is not None and p.workloads == 11 for p in priors)
    assert priors[0].log_ratio_mean == pytest.approx(math.log(0.8), abs=0.03)
    # noise-free points, a board whose log k spreads 0.1: the prior's spread is that (plus its median's own uncertainty)
    wide = [_measure(_workload(i, ratio_spread=0.1), (306.0, 612.0, 918.0, 1300.5)) for i in range(12)]
    prior = leave_one_out_priors(wide, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=1e-6)[0]
    truth_sd = float(np.std([math.log(_workload(i, ratio_spread=0.1)["k"]) for i in range(1, 12)], ddof=1))
    assert prior.log_ratio_sd == pytest.approx(truth_sd * math.sqrt(1 + math.pi / 2 / 11), rel=0.15)


def test_each_workloads_prior_is_the_others_only():
    board = [_measure(_workload(i), (306.0, 612.0, 918.0, 1300.5)) for i in range(8)]
    odd = dict(_workload(99), k=8.0)  # a workload whose ratio is nothing like the board's
    board.append(_measure(odd, (306.0, 612.0, 918.0, 1300.5)))
    priors = leave_one_out_priors(board, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5)
    share = priors[-1].idle_share
    own = log_ratio(board[-1], share, ORIN_VOLTAGE_SHAPE, 1300.5)
    others = [log_ratio(w, share, ORIN_VOLTAGE_SHAPE, 1300.5) for w in board[:-1]]
    assert priors[-1].log_ratio_mean == pytest.approx(float(np.median(others)))
    assert abs(own - priors[-1].log_ratio_mean) > 1.5
    # the odd one widens every other workload's prior: a board whose workloads differ is trusted less
    assert priors[0].log_ratio_sd > 0.5


def test_a_workload_whose_power_ignores_the_clock_says_nothing_about_the_board():
    """One workload whose own k is not pinned (its power barely moves with the clock) must neither pull the idle
    share to the end of its range nor, through its huge fit variance, shrink every other workload's prior."""
    board = [_measure(_workload(i, ratio_spread=0.2), (306.0, 612.0, 918.0, 1300.5)) for i in range(12)]
    flat = [Measurement(f, 0.05, 0.05 * 10.0 * (1 + 1e-5 * f / 1300.5), 0.5) for f in (306.0, 612.0, 918.0, 1300.5)]
    before = leave_one_out_priors(board, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)
    after = leave_one_out_priors([*board, flat], voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)
    assert after[0].idle_share == before[0].idle_share and after[0].workloads == before[0].workloads
    assert after[0].log_ratio_sd == pytest.approx(before[0].log_ratio_sd) and before[0].log_ratio_sd > 0.1


def test_no_prior_without_enough_usable_workloads():
    few = [_measure(_workload(i), (306.0, 612.0, 1300.5)) for i in range(5)]
    assert leave_one_out_priors(few, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5) == [None] * 5  # 4 others each
    no_util = [_measure(_workload(i), (306.0, 612.0, 1300.5), with_util=False) for i in range(8)]
    two_clocks = [_measure(_workload(i), (306.0, 1300.5)) for i in range(8)]
    assert not usable(no_util[0]) and not usable(two_clocks[0]) and usable(few[0])
    assert leave_one_out_priors(no_util + two_clocks, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5) == [None] * 16


def test_a_prior_is_ignored_without_the_utilisation():
    w = _workload(3)
    prior = PowerPrior(IDLE, math.log(0.8), 0.05, 10)
    plain = fit_curve(_measure(w, (306.0, 612.0, 1300.5), with_util=False), f_max_mhz=1300.5)
    leaning = fit_curve(_measure(w, (306.0, 612.0, 1300.5), with_util=False), f_max_mhz=1300.5, prior=prior)
    assert leaning.prior is None and (leaning.a, leaning.b, leaning.c, leaning.d) == (plain.a, plain.b, plain.c, plain.d)


def test_noise_free_points_with_the_prior_recover_every_clock():
    w = _workload(4)
    fit = fit_curve(_measure(w, (306.0, 612.0, 918.0, 1300.5)), f_max_mhz=1300.5, prior=PowerPrior(IDLE, math.log(w["k"]), 0.05, 10))
    e = _energies(w)
    for pt in fit.predict(TABLE):
        assert pt.energy_j == pytest.approx(e[pt.freq_mhz], rel=1e-3)
        assert pt.energy_std_j is not None and pt.energy_std_j > 0
    assert fit.utilisation([612.0]) == pytest.approx([truth(w, 612.0)[2]], abs=1e-6)
    g, sd = fit.gain(306.0, 612.0)
    assert g == pytest.approx(e[306.0] - e[612.0], rel=1e-3) and sd > 0


def test_a_narrow_prior_holds_the_ratio_and_a_wide_one_lets_the_points_speak():
    w = _workload(5)
    pts = _measure(w, (306.0, 918.0, 1300.5))
    narrow = fit_curve(pts, f_max_mhz=1300.5, prior=PowerPrior(IDLE, math.log(2.0), 1e-3, 10))
    wide = fit_curve(pts, f_max_mhz=1300.5, prior=PowerPrior(IDLE, math.log(2.0), 100.0, 10))
    assert narrow.d / narrow.c == pytest.approx(2.0, rel=0.01)
    assert wide.d / wide.c == pytest.approx(w["k"], rel=0.01)


def test_the_prior_pins_the_optimum_more_often_under_the_twins_noise():
    """Adaptive sweeps of three boards whose workloads share their power ratio (as the twin's do, up to the CPU's
    share): each workload measured at the clocks next_clock asks for, under 1 %/2 % noise. With the prior from the
    other workloads, the predicted optimum lands within 0.2 % of the true one more often than with each workload's
    points alone (the same draws). What it costs where the workloads differ is `python -m benchmarks prior`."""
    alone, prior, n = run_spread(0.0, boards=3, sweeps=8)
    assert n == 3 * 8 * 14
    assert prior > alone + 0.02  # measured: 98.2 % against 94.0 %


def test_the_priors_spread_is_the_boards_with_each_fits_noise_taken_out():
    """The spread of the workloads' own k has two parts, the board's and each fit's noise; the prior keeps the
    board's. A board whose workloads share k gets the floor; one whose workloads differ by 20 % gets about that."""
    rng = np.random.default_rng(4)
    for spread, lo, hi in ((0.0, MIN_SPREAD, 0.05), (0.2, 0.12, 0.3)):  # 0.05: the floor, or its median's own uncertainty
        board = [_measure(_workload(i, ratio_spread=spread, seed=4), (306.0, 612.0, 918.0, 1300.5), rng, (0.01, 0.02)) for i in range(30)]
        naive = float(np.std([log_ratio(w, IDLE, ORIN_VOLTAGE_SHAPE, 1300.5) for w in board], ddof=1))
        prior = leave_one_out_priors(board, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)[0]
        assert lo <= prior.log_ratio_sd <= hi and prior.log_ratio_sd < naive


def test_the_sweeps_predictions_lean_on_the_prior_and_say_so(tmp_path, empty_store):
    """sweep/adaptive.py's predicted.csv: with seven workloads of three or more clocks each has a prior from the
    other six; the parent run's tag names it, and each workload's predicted optimum is the prior fit's."""
    import csv
    import io

    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.mlops.sweep.adaptive import log_predictions

    c = MlflowClient(tracking_uri=empty_store)
    run = c.create_run(c.create_experiment("s"))
    rng = np.random.default_rng(2)
    workloads = [(f"m{i}/sst2", _measure(_workload(i), (816.0, 1300.5, 306.0, 612.0), rng, (0.01, 0.02))) for i in range(7)]
    board = Board("sim", "sim-orin", "jetson-agx-orin-64gb", "test", True, tuple(TABLE), ORIN_VOLTAGE_SHAPE, True, 0.01, 0.02)
    log_predictions(c, run.info.run_id, workloads, board, repeats=1)
    tags = c.get_run(run.info.run_id).data.tags
    assert tags["dvfs.power_prior"].startswith("7 of 7 workloads, each from the others; idle share ")
    rows = list(csv.DictReader(io.StringIO(open(c.download_artifacts(run.info.run_id, "predicted.csv", str(tmp_path))).read())))
    priors = leave_one_out_priors([m for _, m in workloads], voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)
    for (name, got), prior in zip(workloads, priors):
        best = fit_curve(got, f_max_mhz=1300.5, noise=(0.01, 0.02), prior=prior).optimum(TABLE).freq_mhz
        assert [float(r["freq_mhz"]) for r in rows if r["workload"] == name and r["predicted_optimum"] == "1"] == [best]

    # two workloads say nothing about a board: no prior, and the tag says what one needs
    run = c.create_run(run.info.experiment_id)
    log_predictions(c, run.info.run_id, workloads[:2], board, repeats=1)
    assert c.get_run(run.info.run_id).data.tags["dvfs.power_prior"].startswith("none (it needs the GPU utilisation of at least 6")


def test_the_governors_fill_ins_lean_on_the_prior_with_the_utilisation_in_percent():
    """`train`'s fill-ins of an adaptive sweep (governor/dataset.py): the runs log gpu_util_pct (0..100); each gap
    is filled from its fit with the prior of the other workloads, the utilisation taken as a share."""
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.model.governor.dataset import fill_from_curves

    rng = np.random.default_rng(6)
    workloads = [_measure(_workload(i), (816.0, 1300.5, 306.0, 612.0), rng, (0.01, 0.02)) for i in range(8)]
    measured = [({m.freq_mhz: m.energy_j for m in w}, {m.freq_mhz: m.time_s for m in w}, {m.freq_mhz: 100.0 * m.gpu_util for m in w})
                for w in workloads]
    unknown = Board("jetson", "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "x", False, tuple(TABLE))  # noise 1 %, 2 %
    shape = fill_from_curves(measured, TABLE, range(8), unknown)  # its curve unknown: the shape fitted across the sweep
    priors = leave_one_out_priors(workloads, voltage_shape=shape, f_max_mhz=1300.5, noise=0.02)
    for w, (energy, _, util), prior in zip(workloads, measured, priors):
        assert sorted(energy) == sorted(TABLE) and len(util) == 4  # filled; the utilisation stays measured-only
        fit = fit_curve(w, voltage_shape=shape, f_max_mhz=1300.5, noise=(0.01, 0.02), prior=prior)
        assert fit.prior is not None
        for pt in fit.predict([408.0, 1020.0]):
            assert energy[pt.freq_mhz] == pytest.approx(pt.energy_j, rel=1e-9)


def test_next_clock_stops_sooner_with_the_prior_of_the_workloads_measured_before():
    """The adaptive sweep's next_clock leans on the prior of the workloads measured before this one: measured
    noise-free at its optimum and both ends, a workload whose neighbours its own three points cannot yet tell apart
    under 1 %/2 % noise needs a fourth clock alone, and none with the board's prior (`python -m benchmarks
    measure_less`: 3.70 -> 3.40 clocks per workload on sim-orin, 3.96 -> 3.75 on sim-orin-measured)."""
    from dvfs_mlops.model.curve import next_clock

    w = _workload(0, ratio_spread=0.0, seed=3)
    e = _energies(w)
    best = min(e, key=e.__getitem__)
    got = _measure(w, [best, 1300.5, 306.0])
    assert next_clock(got, TABLE, best, noise=(0.01, 0.02)) == 408.0
    assert next_clock(got, TABLE, best, noise=(0.01, 0.02), prior=PowerPrior(IDLE, math.log(w["k"]), 0.03, 13)) is None
    # a prior without this workload's utilisation is not used: the fourth clock again
    bare = [Measurement(m.freq_mhz, m.time_s, m.energy_j) for m in got]
    assert next_clock(bare, TABLE, best, noise=(0.01, 0.02), prior=PowerPrior(IDLE, math.log(w["k"]), 0.03, 13)) == 408.0
