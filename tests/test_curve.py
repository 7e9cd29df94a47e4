"""The curve model: physically shaped fits from a few clocks, and `dvfs-mlops curve fit`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
from dvfs_mlops.model.curve import Measurement, fit_curve, fit_voltage_shape, read_measurements_csv

TABLE = (306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5)


def _truth(f: float, a=0.05, b=0.04, c=9.0, d=12.0, r=ORIN_VOLTAGE_SHAPE) -> tuple[float, float]:
    """time and power of a workload whose curves have exactly the model's shape."""
    g = f / 1000.0
    v = 1 + r * (f / 1300.5) ** 2
    return a + b / g, c + d * v * v * g


def _measure(freqs, rng=None, noise=(0.0, 0.0), **kw) -> list[Measurement]:
    out = []
    for f in freqs:
        t, p = _truth(f, **kw)
        if rng is not None:
            t *= 1 + noise[0] * rng.standard_normal()
            p *= 1 + noise[1] * rng.standard_normal()
        out.append(Measurement(f, t, t * p))
    return out


def test_noise_free_four_clocks_recover_every_clock_and_the_optimum():
    fit = fit_curve(_measure((306, 612, 918, 1300.5)), f_max_mhz=1300.5)
    assert (fit.a, fit.b, fit.c, fit.d) == pytest.approx((0.05, 0.04, 9.0, 12.0), rel=1e-9)
    truth = {f: _truth(f) for f in TABLE}
    energies = {f: t * p for f, (t, p) in truth.items()}
    for pt in fit.predict(list(TABLE)):
        assert pt.energy_j == pytest.approx(energies[pt.freq_mhz], rel=1e-9)
    assert fit.optimum(TABLE).freq_mhz == min(energies, key=energies.__getitem__)


def test_parameters_stay_non_negative_and_a_flat_time_curve_fits_a_constant():
    # time that does not fall with the clock (launch-bound): the unconstrained b would be negative
    pts = [Measurement(f, 1.0 + 0.01 * (f / 1300.5), 10.0 * (1.0 + 0.01 * (f / 1300.5))) for f in (306, 612, 918, 1300.5)]
    fit = fit_curve(pts, f_max_mhz=1300.5)
    assert fit.a > 0 and fit.b == 0.0 and fit.c >= 0 and fit.d >= 0


def test_uncertainty_comes_from_the_residuals_and_covers_the_noise():
    rng = np.random.default_rng(3)
    inside = total = 0
    for _ in range(60):
        pts = _measure((306, 510, 714, 918, 1122, 1300.5), rng, (0.01, 0.02))
        fit = fit_curve(pts, f_max_mhz=1300.5)
        for pt in fit.predict((408.0, 816.0, 1224.0)):
            t, p = _truth(pt.freq_mhz)
            assert pt.energy_std_j is not None and pt.energy_std_j > 0
            inside += abs(pt.energy_j - t * p) <= 2 * pt.energy_std_j
            total += 1
    assert inside / total > 0.8  # a 2-sigma band holds the truth most of the time (few dof: not exactly 95 %)


def test_two_clocks_have_no_residual_uncertainty_unless_a_noise_level_is_stated():
    pts = _measure((306, 1300.5))
    assert fit_curve(pts).predict([816.0])[0].energy_std_j is None
    assert fit_curve(pts, noise=(0.01, 0.02)).predict([816.0])[0].energy_std_j > 0


def test_voltage_shape_is_recovered_across_workloads():
    workloads = [_measure(TABLE, d=d, c=c, r=0.3) for d, c in ((8.0, 6.0), (15.0, 11.0), (20.0, 4.0))]
    assert fit_voltage_shape(workloads, 1300.5) == pytest.approx(0.3, abs=0.02)


def test_one_clock_is_refused():
    with pytest.raises(DvfsError, match="two or more distinct clocks"):
        fit_curve(_measure((612, 612)))


def _csv(tmp_path: Path, header: str, rows: list[str]) -> str:
    path = tmp_path / "points.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.fixture
def points_csv(tmp_path: Path) -> str:
    return _csv(tmp_path, "freq_mhz,time_s,energy_j", [f"{m.freq_mhz:g},{m.time_s!r},{m.energy_j!r}" for m in _measure(TABLE)])


def test_cli_fits_on_the_given_clocks_and_prints_every_clock_as_json(points_csv: str):
    out = CliRunner().invoke(main, ["curve", "fit", points_csv, "--clocks", "306,612,918,1300.5", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [p["freq_mhz"] for p in data["points"]] == list(TABLE)
    energies = {f: t * p for f, (t, p) in ((f, _truth(f)) for f in TABLE)}
    for p in data["points"]:
        assert {"freq_mhz", "time_s", "power_w", "energy_j"} <= set(p)
        assert p["energy_j"] == pytest.approx(energies[p["freq_mhz"]], rel=1e-9)
        assert p["power_w"] == pytest.approx(_truth(p["freq_mhz"])[1], rel=1e-9)
    assert data["optimal_freq_mhz"] == min(energies, key=energies.__getitem__)


def test_cli_reads_power_instead_of_energy_and_prints_a_table(tmp_path: Path):
    rows = [f"{m.freq_mhz:g},{m.time_s!r},{m.power_w!r}" for m in _measure((306, 816, 1300.5))]
    out = CliRunner().invoke(main, ["curve", "fit", _csv(tmp_path, "freq_mhz,time_s,power_w", rows)])
    assert out.exit_code == 0, out.output
    assert "optimal_freq_mhz:" in out.output and "(fitted on)" in out.output


@pytest.mark.parametrize(("header", "rows", "args", "message"), [
    ("freq_mhz,time_s", ["306,1", "612,2"], [], "lacks the column(s) energy_j (or power_w)"),
    ("freq_mhz,time_s,energy_j", ["306,1,2", "612,1,2"], ["--clocks", "306,700"], "clock 700 MHz was not measured"),
    ("freq_mhz,time_s,energy_j", ["306,1,2", "612,1,2"], ["--clocks", "306"], "two or more distinct clocks"),
    ("freq_mhz,time_s,energy_j", ["306,x,2", "612,1,2"], [], "must be numbers"),
])
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, header, rows, args, message):
    from tests.conftest import run_cli

    out = run_cli("curve", "fit", _csv(tmp_path, header, rows), *args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_reader_takes_repeats_as_extra_rows(tmp_path: Path):
    pts = read_measurements_csv(_csv(tmp_path, "freq_mhz,time_s,energy_j", ["306,1,2", "306,1.1,2.1", "612,1,2"]))
    assert [m.freq_mhz for m in pts] == [306, 306, 612]


def test_adaptive_next_clock_starts_at_the_governor_then_ends_then_the_optimum_and_stops_at_four():
    from dvfs_mlops.model.curve import next_clock

    measured: list[Measurement] = []
    order = []
    while (f := next_clock(measured, TABLE, 816.0)) is not None:
        order.append(f)
        measured += _measure([f])
    energies = {f: t * p for f, (t, p) in ((f, _truth(f)) for f in TABLE)}
    assert order[:3] == [816.0, 1300.5, 306.0] and len(order) <= 4
    assert fit_curve(measured, f_max_mhz=1300.5).optimum(TABLE).freq_mhz == min(energies, key=energies.__getitem__)


def test_adaptive_fill_ins_use_the_voltage_shape_fitted_across_the_sweep():
    """A board whose voltage curve is not the Orin default (r = 1/3, as sim-orin-measured): workloads measured at
    four clocks are filled at the others with the shape fitted across the sweep, close to the truth, where the
    Orin default would bias them."""
    from dvfs_mlops.model.governor.dataset import fill_from_curves

    r = 0.2 / 0.6
    kinds = [{"a": 0.05, "b": 0.04, "c": 9.0, "d": 12.0}, {"a": 0.01, "b": 0.08, "c": 6.0, "d": 20.0}, {"a": 0.1, "b": 0.02, "c": 12.0, "d": 5.0}]
    four = (306.0, 816.0, 1020.0, 1300.5)
    gaps = []
    for kw in kinds:
        ms = _measure(four, r=r, **kw)
        gaps.append(({m.freq_mhz: m.energy_j for m in ms}, {m.freq_mhz: m.time_s for m in ms}, {}))
    shape = fill_from_curves(gaps, TABLE, range(len(gaps)))
    assert shape == pytest.approx(r, abs=0.02)
    worst = 0.0
    for (energy, time, _), kw in zip(gaps, kinds):
        assert sorted(energy) == sorted(TABLE) and sorted(time) == sorted(TABLE)
        for f in TABLE:
            t, p = _truth(f, r=r, **kw)
            worst = max(worst, abs(energy[f] / (t * p) - 1))
    default = fit_curve(_measure(four, **kinds[1], r=r), f_max_mhz=1300.5)  # the Orin shape on this board
    default_err = max(abs(pt.energy_j / (_truth(pt.freq_mhz, r=r, **kinds[1])[0] * _truth(pt.freq_mhz, r=r, **kinds[1])[1]) - 1)
                      for pt in default.predict(TABLE))
    assert worst < 0.002 < default_err


def test_adaptive_fill_ins_fall_back_to_the_orin_shape_with_two_clocks():
    from dvfs_mlops.model.governor.dataset import fill_from_curves

    ms = _measure((306.0, 1300.5))
    gap = ({m.freq_mhz: m.energy_j for m in ms}, {m.freq_mhz: m.time_s for m in ms}, {})
    assert fill_from_curves([gap], TABLE, [0]) == ORIN_VOLTAGE_SHAPE
    assert len(gap[0]) == len(TABLE)


def test_voltage_shape_is_the_twin_profiles_own_and_the_orins_on_a_board():
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.job.refine import Refiner

    measured = board_of(SimDevice(builtin_profile("sim-orin-measured")))
    assert measured.voltage_shape == pytest.approx(0.20 / 0.60) and measured.voltage_shape_known
    assert board_of(SimDevice(builtin_profile("sim-orin"))).voltage_shape == pytest.approx(ORIN_VOLTAGE_SHAPE)
    class Jetson:  # a real board's device as board_of sees it: nothing of its voltage curve to read
        name, profile, device_id, simulated, frequencies_mhz = "jetson", "jetson-agx-orin-64gb", "serial", False, list(TABLE)

        def info(self):
            return type("Info", (), {"rails": ["VDD_GPU_SOC"]})()

    on_board = board_of(Jetson(), "cpu")
    assert on_board.voltage_shape == ORIN_VOLTAGE_SHAPE and not on_board.voltage_shape_known and on_board.rails == ("VDD_GPU_SOC",)
    with SimDevice(builtin_profile("sim-orin-measured")).session(816.0, label="shape") as s:
        assert Refiner(s, 20, 100, measured, say=lambda m: None).voltage_shape == pytest.approx(0.20 / 0.60)


def test_adaptive_fill_ins_use_a_twin_boards_own_voltage_shape():
    """On a board whose record knows its curve (the twin's profile), the fills use that shape, not one fitted from a
    few noisy workloads."""
    import dataclasses

    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.model.governor.dataset import fill_from_curves

    board = board_of(SimDevice(builtin_profile("sim-orin-measured")))
    ms = _measure((306.0, 816.0, 1300.5), r=0.35)  # what a fit across this sweep would take for the shape
    gap = ({m.freq_mhz: m.energy_j for m in ms}, {m.freq_mhz: m.time_s for m in ms}, {})
    assert fill_from_curves([gap], TABLE, [0], board) == pytest.approx(0.20 / 0.60)
    assert fill_from_curves([gap], TABLE, [0], dataclasses.replace(board, voltage_shape_known=False)) == pytest.approx(0.35, abs=0.02)


def test_gain_is_the_predicted_saving_with_the_deviation_of_the_difference():
    rng = np.random.default_rng(5)
    pts = _measure((408, 612, 816), rng, (0.01, 0.02))
    fit = fit_curve(pts, f_max_mhz=1300.5, noise=(0.01, 0.02))
    by = {pt.freq_mhz: pt for pt in fit.predict((612.0, 714.0))}
    g, sd = fit.gain(612.0, 714.0)
    assert g == pytest.approx(by[612.0].energy_j - by[714.0].energy_j, rel=1e-9)
    # the two predictions share the fit's parameters: their difference is far surer than either one
    assert 0 < sd < by[714.0].energy_std_j
    assert fit.gain(714.0, 612.0) == pytest.approx((-g, sd))
    # noise-free and no stated noise on two clocks: no covariance, no deviation
    assert fit_curve(_measure((306, 1300.5))).gain(612.0, 816.0)[1] == 0.0


def test_board_noise_is_the_twin_profiles_own_and_the_default_on_a_board():
    import dataclasses

    from dvfs_mlops.hw.board import DEFAULT_NOISE, Board, board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES

    noisy = dataclasses.replace(BUILTIN_PROFILES["sim-orin"], noise_time=0.03, noise_power=0.05)
    assert board_of(SimDevice(noisy)).noise() == (0.03, 0.05)  # the profile's own, not the board default
    assert board_of(SimDevice()).noise() == (0.01, 0.02)
    assert Board("jetson", "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "x", False, tuple(TABLE)).noise() == DEFAULT_NOISE
    assert board_of(SimDevice(noisy)).noise(repeats=4) == pytest.approx((0.015, 0.025))  # the mean of 4 runs


def test_a_noise_free_twin_board_fits_with_the_assumed_noise_and_shape():
    """A --twin-params board may state no noise (a deterministic twin) or a curve without v0: its record keeps the
    floors a fit needs (the default noise, the Orin's shape), as the curve model's own defaults are."""
    import dataclasses

    from dvfs_mlops.hw.board import DEFAULT_NOISE, board_of, legacy_board
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES

    quiet = dataclasses.replace(BUILTIN_PROFILES["sim-orin"], profile="quiet", noise_time=0.0, noise_power=0.0)
    assert board_of(SimDevice(quiet)).noise() == DEFAULT_NOISE and board_of(SimDevice(quiet)).voltage_shape_known
    flat = dataclasses.replace(quiet, volt_v0=0.0)
    assert board_of(SimDevice(flat)).voltage_shape == ORIN_VOLTAGE_SHAPE and not board_of(SimDevice(flat)).voltage_shape_known
    old = legacy_board("sim-orin-measured", [510.0, 816.0])  # a sweep from before board.json: its built-in profile's own
    assert old.voltage_shape == pytest.approx(0.20 / 0.60) and old.frequencies_mhz == TABLE and old.rails


def test_a_board_record_round_trips_and_a_foreign_one_is_refused():
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.board import Board, board_of
    from dvfs_mlops.hw.sim import SimDevice

    board = board_of(SimDevice())
    assert Board.from_json(board.to_json()) == board
    with pytest.raises(DvfsError, match="not a board record"):
        Board.from_json('{"format": "something-else/1"}')
    with pytest.raises(DvfsError, match="malformed"):
        Board.from_json('{"format": "dvfs-board/1", "backend": "sim"}')


def _old_next_clock(measured, start):
    """The earlier design: start, both ends, then the fitted optimum, then its cheaper neighbour (4 clocks)."""
    have = {m.freq_mhz for m in measured}
    if not have:
        return start
    for end in (TABLE[-1], TABLE[0]):
        if end not in have:
            return end
    if len(have) >= 4:
        return None
    pred = fit_curve(measured, f_max_mhz=1300.5).predict(TABLE)
    i = min(range(len(TABLE)), key=lambda k: pred[k].energy_j)
    if TABLE[i] not in have:
        return TABLE[i]
    free = [j for j in (i - 1, i + 1) if 0 <= j < len(TABLE) and TABLE[j] not in have]
    return min(free, key=lambda j: pred[j].energy_j, default=None) and TABLE[min(free, key=lambda j: pred[j].energy_j)]


def test_adaptive_design_pins_the_optimum_more_often_than_measuring_at_it():
    """Under 1 %/2 % noise the c-optimal next clock (least variance of the optimum-vs-neighbour differences)
    lands within 0.2 % of the true optimum more often than measuring the fitted optimum and its neighbour."""
    from dvfs_mlops.model.curve import next_clock

    kinds = [{"a": 0.05, "b": 0.04, "c": 9.0, "d": 12.0}, {"a": 0.01, "b": 0.08, "c": 14.0, "d": 9.0},
             {"a": 0.03, "b": 0.06, "c": 20.0, "d": 8.0}]
    rng = np.random.default_rng(11)
    ok = {"new": 0, "old": 0}
    clocks = []
    for kw in kinds:
        e = {f: _truth(f, **kw)[0] * _truth(f, **kw)[1] for f in TABLE}
        emin = min(e.values())
        start = min(e, key=e.__getitem__)
        for _ in range(150):
            draws = {f: _measure([f], rng, (0.01, 0.02), **kw)[0] for f in TABLE}  # the same draw for both designs
            for name in ok:
                got: list[Measurement] = []
                while (f := (next_clock(got, TABLE, start, noise=(0.01, 0.02)) if name == "new" else _old_next_clock(got, start))) is not None:
                    got.append(draws[f])
                if name == "new":
                    clocks.append(len(got))
                ok[name] += e[fit_curve(got, f_max_mhz=1300.5).optimum(TABLE).freq_mhz] / emin - 1 <= 0.002
    assert max(clocks) <= 4 and min(clocks) >= 3
    assert ok["new"] > ok["old"]


def test_adaptive_design_stops_once_both_neighbours_are_clearly_dearer():
    from dvfs_mlops.model.curve import next_clock

    # a sharply curved workload measured noise-free at the start and both ends: the fit, with the board's noise
    # as its floor, already puts both neighbours of the optimum more than two deviations above it
    kw = {"a": 0.0, "b": 0.08, "c": 40.0, "d": 6.0}
    e = {f: _truth(f, **kw)[0] * _truth(f, **kw)[1] for f in TABLE}
    got = _measure([min(e, key=e.__getitem__), 1300.5, 306.0], **kw)
    assert next_clock(got, TABLE, got[0].freq_mhz, noise=(0.001, 0.002)) is None
    # a flatter one under the twin's 1 %/2 % per window is not pinned yet: it asks for a fourth clock not yet measured
    e = {f: _truth(f)[0] * _truth(f)[1] for f in TABLE}
    got = _measure([min(e, key=e.__getitem__), 1300.5, 306.0])
    f = next_clock(got, TABLE, got[0].freq_mhz, noise=(0.01, 0.02))
    assert f in TABLE and f not in {m.freq_mhz for m in got}


def test_curve_fit_reads_a_sweeps_workload_with_the_boards_power_prior(tmp_path, smoke_sweep_master):
    """`curve fit --sweep-id ID --workload M/T` on the smoke sweep (6 workloads x 3 clocks, with GPU utilisation): the
    workload's points, its power curve leaning on the prior of the other 5, as the adaptive sweep's predicted.csv."""
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.model.power_prior import leave_one_out_priors
    from tests.conftest import run_cli, smoke_sweep_copy

    smoke_sweep_copy(smoke_sweep_master, tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    runs = c.search_runs([c.get_experiment_by_name("dvfs-sweep").experiment_id], filter_string="tags.`dvfs.point` != ''", max_results=500)
    sid = runs[0].data.tags["dvfs.sweep_id"]
    env = {"MLFLOW_TRACKING_URI": uri}
    r = run_cli("curve", "fit", "--sweep-id", sid, "--workload", "bert-tiny/rte", "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert [p["freq_mhz"] for p in out["points"]] == list(TABLE) and out["power_prior"]["workloads"] == 5  # the board's whole table
    assert [p["freq_mhz"] for p in out["points"] if p["measured"]] == [510.0, 816.0, 1300.5]

    # the same fit by hand: every workload's pinned runs, the leave-one-out prior, the fit with it
    by = {}
    for run in runs:
        if run.data.params["freq_mhz"] != "maxn":
            m = run.data.metrics
            by.setdefault(f"{run.data.params['model']}/{run.data.params['task']}", []).append(
                Measurement(float(run.data.params["freq_mhz"]), m["time_s"], m["energy_j"], m["gpu_util_pct"] / 100.0))
    names = sorted(by)
    prior = leave_one_out_priors([by[n] for n in names], voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)[names.index("bert-tiny/rte")]
    fit = fit_curve(by["bert-tiny/rte"], f_max_mhz=1300.5, prior=prior, noise=(0.01, 0.02))  # the twin's noise, one run a point
    assert out["power_prior"]["log_ratio_mean"] == pytest.approx(prior.log_ratio_mean)
    assert [p["energy_j"] for p in out["points"]] == pytest.approx([p.energy_j for p in fit.predict(list(TABLE))])
    assert [p["energy_std_j"] for p in out["points"]] == pytest.approx([p.energy_std_j for p in fit.predict(list(TABLE))])
    assert out["optimal_freq_mhz"] == fit.optimum(TABLE).freq_mhz

    r = run_cli("curve", "fit", "--sweep-id", sid, "--workload", "bert-tiny/rte", env=env)
    assert r.returncode == 0 and "power prior from 5 other workloads of the sweep" in r.stdout
    r = run_cli("curve", "fit", "--sweep-id", sid, "--workload", "bert-tiny/squad", env=env)
    assert r.returncode != 0 and "has no pinned points of workload 'bert-tiny/squad'; it has bert-tiny/mrpc" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_sweeps_fits_skip_a_workload_with_one_clock_and_curve_fit_finds_a_variant_by_its_plain_name():
    """An interrupted sweep may hold a workload with one clock: it has no curve, the others still fit (curve fit of
    another workload of that sweep works). A LoRA sweep's workloads are named with their variant; MODEL/TASK finds
    the one variant the sweep has."""
    from dvfs_mlops.app.curve_fit import _workload_name
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.model.power_prior import sweep_fits

    board = Board("sim", "sim-orin", "jetson-agx-orin-64gb", "t", True, TABLE, ORIN_VOLTAGE_SHAPE, True)
    fits = sweep_fits([_measure((306.0, 816.0, 1300.5)), _measure((816.0,))], board)
    assert fits[0] is not None and fits[1] is None
    names = ["bert-tiny/sst2+lora-r8a16", "pythia-14m/sst2+lora-r8a16"]
    assert _workload_name("bert-tiny/sst2", names, "s") == "bert-tiny/sst2+lora-r8a16"
    assert _workload_name("pythia-14m/sst2+lora-r8a16", names, "s") == "pythia-14m/sst2+lora-r8a16"
    with pytest.raises(DvfsError, match="has no pinned points of workload 'bert-tiny/rte'"):
        _workload_name("bert-tiny/rte", names, "s")
