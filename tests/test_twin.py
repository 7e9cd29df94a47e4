"""The sim-orin twin: trace capture, physics, and each calibration target of DESIGN §4."""
from __future__ import annotations

import numpy as np
import pytest

from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import estimate_step
from dvfs_mlops.hw.twin.trace import KIND_KERNEL, TraceCache, capture_step_trace
from dvfs_mlops.job.workloads.zoo import PRESETS, resolve_model
from testkit.calibration import calibrate


@pytest.fixture(scope="module")
def report(trace_cache_dir):
    return calibrate(cache=TraceCache(trace_cache_dir))


@pytest.fixture(scope="module")
def summary(report):
    return report.summary()


def _failed(report, prefix):
    return {k: v for k, v in report.check().items() if k.startswith(prefix)}


# --- calibration targets, one test each ---------------------------------------------------------
def test_energy_u_shaped_minimum_inside_table(report):
    assert _failed(report, "u_shape") == {}
    for p in report.points:
        e = p.energy_by_freq_j
        assert e[306.0] > e[p.optimal_mhz] < e[1300.5]


def test_no_optimum_at_306(report):
    assert all(p.optimal_mhz != 306.0 for p in report.points)


def test_big_models_optimum_within_510_1020(report):
    assert _failed(report, "big_optimum") == {}
    assert report.big and all(510 <= p.optimal_mhz <= 1020 for p in report.big)


def test_at_least_four_distinct_optima(summary):
    assert summary["workloads"] >= 27
    assert len(summary["distinct_optima_mhz"]) >= 4, summary["distinct_optima_mhz"]


def test_deeper_models_optimum_higher(summary):
    assert summary["mean_opt_deep_mhz"] > summary["mean_opt_shallow_mhz"]


def test_savings_big_models_15_to_30_percent(summary):
    assert 0.15 <= summary["saving_big_mean"] <= 0.30


def test_savings_small_models_lower_0_to_20_percent(summary):
    assert 0.0 <= summary["saving_small_mean"] <= 0.20
    assert summary["saving_small_mean"] < summary["saving_big_mean"]


def test_compute_bound_time_ratio_3_to_4(summary):
    assert 3.0 <= summary["compute_bound_time_ratio"] <= 4.0


def test_bert_large_maxn_power_45_to_65_w(summary):
    assert 45 <= summary["bert_large_maxn_power_w"] <= 65


def test_maxn_never_costs_more_than_pinned_max(report):
    assert _failed(report, "maxn_le_pinned") == {}


def test_every_target_holds(report):
    assert report.check() == {}


# --- every built-in profile: the board's physics (the study's targets above are sim-orin's alone) ---
@pytest.fixture(scope="module")
def measured_report(trace_cache_dir):
    from dvfs_mlops.hw.twin.profiles import builtin_profile

    return calibrate(builtin_profile("sim-orin-measured"), cache=TraceCache(trace_cache_dir))


@pytest.fixture(params=["sim-orin", "sim-orin-measured"])
def any_report(request, report, measured_report):
    return {"sim-orin": report, "sim-orin-measured": measured_report}[request.param]


def test_physics_targets_hold_on_every_profile(any_report):
    assert any_report.check(study=False) == {}
    s = any_report.summary()
    for p in any_report.points:  # U-shaped, minimum strictly inside the table
        e = p.energy_by_freq_j
        assert e[306.0] > e[p.optimal_mhz] < e[1300.5] and p.optimal_mhz not in (306.0, 1300.5)
    assert len(s["distinct_optima_mhz"]) >= 4 and s["mean_opt_deep_mhz"] > s["mean_opt_shallow_mhz"]
    assert 3.0 <= s["compute_bound_time_ratio"] <= 4.0 and 45 <= s["bert_large_maxn_power_w"] <= 65


def test_measured_profile_gpu_rail_follows_public_measurements():
    from dvfs_mlops.hw.twin.physics import rail_power
    from dvfs_mlops.hw.twin.profiles import builtin_profile

    def ratio(p):
        return rail_power(306.0, 1.0, 1.0, 0.5, p)["VDD_GPU_SOC"] / rail_power(1300.5, 1.0, 1.0, 0.5, p)["VDD_GPU_SOC"]

    assert 0.41 <= ratio(builtin_profile("sim-orin-measured")) <= 0.45  # public Orin figure: ~43 %
    assert ratio(builtin_profile("sim-orin")) < 0.25  # the study-shaped default is much steeper


def test_flatter_power_curve_moves_optima_up_never_down(report, measured_report):
    default = {(p.model, p.task): p.optimal_mhz for p in report.points}
    measured = {(p.model, p.task): p.optimal_mhz for p in measured_report.points}
    assert default.keys() == measured.keys()
    assert all(measured[k] >= default[k] for k in default)
    assert np.mean(list(measured.values())) > np.mean(list(default.values()))


def test_profiles_by_name_and_params_files(tmp_path):
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.twin.profiles import builtin_profile, load_twin_params

    assert load_twin_params() == OrinTwinParams() and load_twin_params("sim-orin-measured").profile == "sim-orin-measured"
    f = tmp_path / "over.yaml"
    f.write_text("gpu_k: 20\n")  # overrides on the chosen profile, named after it and its constants
    a = load_twin_params("sim-orin-measured", f)
    assert a.gpu_k == 20 and a.gpu_static_w == builtin_profile("sim-orin-measured").gpu_static_w
    assert a.profile.startswith("sim-orin-measured+") and a.profile != load_twin_params(None, f).profile
    f.write_text("profile: sim-orin-measured\n")  # naming a built-in with its own constants is fine ...
    assert load_twin_params("sim-orin-measured", f) == builtin_profile("sim-orin-measured")
    with pytest.raises(DvfsError, match="names the built-in profile 'sim-orin-measured' but changes gpu_k"):
        load_twin_params("sim-orin", f)  # ... on another base it would mislabel sim-orin's constants
    f.write_text("profile: sim-orin\ngpu_k: 1\n")
    with pytest.raises(DvfsError, match="names the built-in profile 'sim-orin' but changes gpu_k"):
        load_twin_params(None, f)
    with pytest.raises(DvfsError, match="unknown twin profile 'orin-nano'"):
        load_twin_params("orin-nano")


def test_sweep_id_tells_profiles_apart(tmp_path):
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.twin.profiles import load_twin_params
    from dvfs_mlops.mlops.sweep.spec import SweepRequest, build_spec

    f = tmp_path / "board.yaml"
    f.write_text("profile: my-board\ngpu_k: 20\n")
    default = SimDevice()
    ids = {name: build_spec(board_of(SimDevice(params=load_twin_params(*args))), SweepRequest("smoke")).sweep_id
           for name, args in {"default": (), "measured": ("sim-orin-measured",), "file": (None, f)}.items()}
    assert len(set(ids.values())) == 3
    assert build_spec(board_of(default), SweepRequest("smoke")).twin_digest == "" and "twin_digest" not in build_spec(board_of(default), SweepRequest("smoke")).definition()
    f.write_text("profile: my-board\ngpu_k: 21\n")  # the same name, other constants: another sweep
    assert build_spec(board_of(SimDevice(params=load_twin_params(None, f))), SweepRequest("smoke")).sweep_id != ids["file"]


# --- mechanics ------------------------------------------------------------------------------------
def test_trace_counts_attention_matmuls(trace_cache_dir):
    """Eager attention: QK^T and AV bmm appear, so FLOPs exceed the 6*N*T dense estimate's matmul part."""
    spec = resolve_model("bert-tiny")
    t = capture_step_trace(spec.config, batch_size=4, seq_len=32)
    matmul = t.flops[t.has_flop_formula].sum()
    dense_params = 2 * (4 * 128 * 128 + 2 * 128 * 512)  # per layer, 2 layers
    tokens = 4 * 32
    assert matmul > 6 * dense_params * tokens  # attention adds on top
    assert t.n_kernels > 50 and t.n_views > 0
    assert t.bytes[-1] == 7 * 4 * t.num_params  # fused AdamW: 7x parameter bytes, fp32


def test_trace_cache_roundtrip(tmp_path):
    spec = resolve_model("bert-tiny")
    cache = TraceCache(tmp_path)
    a = cache.get(spec.config, 4, 16)
    b = TraceCache(tmp_path).get(spec.config, 4, 16)  # from disk
    assert a.key == b.key and np.array_equal(a.flops, b.flops) and np.array_equal(a.kinds, b.kinds)
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_small_models_launch_bound_big_compute_bound(trace_cache_dir):
    cache, p = TraceCache(trace_cache_dir), OrinTwinParams()
    tiny = cache.get(PRESETS["bert-tiny"].config(), 16, 13)
    big = cache.get(PRESETS["bert-large"].config(), 32, 128)
    tiny_ratio = estimate_step(tiny, 306, p).time_s / estimate_step(tiny, 1300.5, p).time_s
    big_ratio = estimate_step(big, 306, p).time_s / estimate_step(big, 1300.5, p).time_s
    assert tiny_ratio < 1.6 < 3.0 < big_ratio
    assert estimate_step(tiny, 1300.5, p).gpu_util < 0.4 < 0.9 < estimate_step(big, 1300.5, p).gpu_util


def test_queue_matches_explicit_loop(trace_cache_dir):
    """The vectorised queue equals the kernel-by-kernel recurrence."""
    from dvfs_mlops.hw.twin.physics import kernel_durations

    p = OrinTwinParams()
    t = TraceCache(trace_cache_dir).get(PRESETS["bert-mini"].config(), 16, 31)
    d = kernel_durations(t, 612, p)
    clock_host, end, k = 0.0, 0.0, 0
    for kind in t.kinds:
        clock_host += p.host_per_kernel_s if kind == KIND_KERNEL else p.host_per_view_s
        if kind == KIND_KERNEL:
            end = max(clock_host, end) + d[k]
            k += 1
    assert estimate_step(t, 612, p).time_s == pytest.approx(end + p.host_per_step_s, rel=1e-9)


def test_sim_sessions_deterministic_with_seed_and_noisy_across_repeats(trace_cache_dir):
    t = TraceCache(trace_cache_dir).get(PRESETS["bert-mini"].config(), 16, 31)

    def run(seed, key):
        s = SimDevice(seed=seed).session(714, label=key)
        with s:
            for _ in range(5):
                s.step(t)
        return s.report()

    a, b, c = run(1, "r0"), run(1, "r0"), run(1, "r1")
    assert a.to_dict() == b.to_dict()
    assert a.energy_j != c.energy_j
    assert abs(a.energy_j / c.energy_j - 1) < 0.1
    assert a.simulated and a.samples == 5 and len(a.power_series_w) == 5


def test_sim_maxn_session_uses_load_tracking_clock(trace_cache_dir):
    t = TraceCache(trace_cache_dir).get(PRESETS["bert-tiny"].config(), 16, 13)
    s = SimDevice().session("maxn")
    with s:
        s.step(t)
    assert s.effective_mhz < 1300.5  # launch-bound work: podgov clocks down


def test_params_from_yaml_and_unknown_key(tmp_path):
    from dvfs_mlops.errors import DvfsError

    f = tmp_path / "board.yaml"
    f.write_text("gpu_k: 20\nfrequencies_mhz: [900, 300, 600]\nprofile: my-board\n")
    p = OrinTwinParams.from_yaml(f)
    assert p.gpu_k == 20 and p.frequencies_mhz == (300.0, 600.0, 900.0) and p.profile == "my-board"
    f.write_text("gpu_kk: 20\n")
    with pytest.raises(DvfsError, match="gpu_kk"):
        OrinTwinParams.from_yaml(f)


# --- truth that knows its noise -------------------------------------------------------------------
def _sim_report(trace, seed, key, params=None, freq=714):
    s = SimDevice(params=params, seed=seed).session(freq, label=key)
    with s:
        with s.window("train"):
            for _ in range(5):
                s.step(trace)
        s.step(trace)  # outside the window: in the session, not in the training window
    return s.report(), s.session_report()


def test_sim_logs_expected_beside_measured_and_only_the_noise_differs(trace_cache_dir):
    t = TraceCache(trace_cache_dir).get(PRESETS["bert-mini"].config(), 16, 31)
    p = OrinTwinParams()
    (a, _), (b, _), (c, _) = _sim_report(t, 1, "r0"), _sim_report(t, 1, "r1"), _sim_report(t, 7, "r0")
    # the expected values are the noise-free physics, the same for every draw
    est = estimate_step(t, 714, p)
    assert a.time_expected_s == b.time_expected_s == c.time_expected_s == pytest.approx(5 * est.time_s, rel=1e-12)
    assert a.energy_expected_j == b.energy_expected_j == c.energy_expected_j == pytest.approx(5 * est.energy_j, rel=1e-12)
    for r, seed, key in ((a, 1, "r0"), (b, 1, "r1"), (c, 7, "r0")):  # measured = expected x the draw's noise, nothing else
        s = SimDevice(seed=seed).session(714, label=key)
        assert r.duration_s == pytest.approx(r.time_expected_s * s.time_factor, rel=1e-12)
        assert r.energy_j == pytest.approx(r.energy_expected_j * s.time_factor * s.power_factor, rel=1e-12)
        assert r.duration_s != r.time_expected_s and abs(r.energy_j / r.energy_expected_j - 1) < 0.1
    assert len({a.energy_j, b.energy_j, c.energy_j}) == 3


def test_sim_without_noise_measures_the_expected_values(trace_cache_dir):
    import dataclasses

    t = TraceCache(trace_cache_dir).get(PRESETS["bert-mini"].config(), 16, 31)
    quiet = dataclasses.replace(OrinTwinParams(), noise_time=0.0, noise_power=0.0)
    for freq in (306, "maxn"):
        train, whole = _sim_report(t, 3, "r0", quiet, freq)
        assert train.energy_j == train.energy_expected_j and train.duration_s == train.time_expected_s
        assert whole.energy_j == whole.energy_expected_j and whole.time_expected_s == pytest.approx(6 / 5 * train.time_expected_s)


def test_real_reports_carry_no_expected_values():
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.mlops.records import report_metrics

    r = EnergyReport(1.0, 2.0, 3.0, {"VDD_GPU_SOC": 2.0}, 3.0, 3.0, 50.0, 10, False)
    assert "energy_expected_j" not in r.to_dict()
    m = report_metrics(r)
    assert m["energy_expected_j"] is None and m["time_expected_s"] is None  # None metrics are not logged


# --- twin fit: a round trip through a known profile -----------------------------------------------
FIT_MODELS = ("bert-tiny", "bert-mini", "pythia-14m", "bert-base")
FIT_CLOCKS = (306.0, 510.0, 816.0, 1122.0, 1300.5)


def _known_board():
    """sim-orin-measured with two timing constants moved too: the fit must find timing and power."""
    import dataclasses

    from dvfs_mlops.hw.twin.profiles import builtin_profile

    return dataclasses.replace(builtin_profile("sim-orin-measured"), profile="board-a", host_per_step_s=12e-3, kernel_fixed_s=1e-5)


def _simulated_points(cache, board, steps=10, clocks=FIT_CLOCKS):
    from dvfs_mlops.hw.twin.fit import FitPoint
    from dvfs_mlops.job.workloads.tasks import TASKS

    points = []
    for m in FIT_MODELS:
        for task in ("sst2", "qnli", "mrpc"):
            trace = cache.get(PRESETS[m].config(), 16, TASKS[task].mean_tokens)
            for f in clocks:
                s = SimDevice(board, seed=5).session(f, label=f"{m}/{task}")
                with s:
                    for _ in range(steps):
                        s.step(trace)
                r = s.report()
                points.append(FitPoint(f"{m}/{task}", f, ((trace, steps),), r.duration_s, r.energy_j / r.duration_s,
                                       r.time_expected_s, r.energy_expected_j))
    return points


def test_fit_recovers_a_noise_free_profile_exactly(trace_cache_dir):
    import dataclasses

    from dvfs_mlops.hw.twin.fit import fit_profile, predict
    from dvfs_mlops.hw.twin.profiles import builtin_profile

    board = dataclasses.replace(_known_board(), noise_time=0.0, noise_power=0.0)
    points = _simulated_points(TraceCache(trace_cache_dir), board)
    result = fit_profile(points, builtin_profile("sim-orin"), "fit-a")
    assert result.n_points == len(FIT_MODELS) * 3 * len(FIT_CLOCKS)
    assert result.errors_before["energy"].mean > 0.1  # the base profile is far from board A ...
    for q, e in result.errors.items():  # ... the fitted one reproduces it
        assert e.max < 2e-3, (q, e)
    truth, fitted = predict(points, board), predict(points, result.params)
    assert np.allclose(fitted["energy"], truth["energy"], rtol=2e-3)
    p = result.params  # only k V^2 is observable: compare the rail's power, not k and V apart
    for f in (306.0, 816.0, 1300.5):
        assert p.gpu_k * p.voltage(f) ** 2 == pytest.approx(board.gpu_k * board.voltage(f) ** 2, rel=0.02)
    assert p.host_per_step_s == pytest.approx(12e-3, rel=0.02) and p.profile == "fit-a"


def test_fit_of_noisy_points_is_within_the_noise_of_the_truth(trace_cache_dir):
    from dvfs_mlops.hw.twin.fit import fit_profile
    from dvfs_mlops.hw.twin.profiles import builtin_profile

    points = _simulated_points(TraceCache(trace_cache_dir), _known_board())
    result = fit_profile(points, builtin_profile("sim-orin"), "fit-a")
    truth = result.errors_expected  # against the points' noise-free values
    assert truth is not None
    assert truth["time"].mean < 0.005 and truth["power"].mean < 0.01 and truth["energy"].mean < 0.01, truth
    assert truth["energy"].max < 0.03
    assert result.errors["power"].mean < 0.03  # against the draws: about the noise (2 % power)
    assert result.errors_before["energy"].mean > 5 * result.errors["energy"].mean


def _grid_csv(path, points, steps, *, with_steps=True, cpu_mhz=None, board=None):
    """The points as a measured grid in the replay format: time and energy of `steps` steps per row (`steps` column
    unless `with_steps` is False); `cpu_mhz` = (top, low) adds a CPU column: each point's row at the top, and a row of
    the same work at the lower CPU clock with `board`'s noise-free values (the fit reads every row at its clocks)."""
    from dvfs_mlops.hw.replay import Setting

    head = "workload,gpu_mhz,time_s,energy_j,power_w" + (",steps" if with_steps else "") + ",seq_len" + (",cpu_mhz" if cpu_mhz else "")
    rows = [head]
    for i, p in enumerate(points):  # every other row states its power too
        cells = [p.workload, f"{p.freq_mhz:g}", repr(p.time_s), repr(p.energy_j), repr(p.power_w) if i % 2 else ""]
        cells += [str(steps)] if with_steps else []
        cells += [str(p.steps[0][0].seq_len)]
        if cpu_mhz:
            top, low = cpu_mhz
            rows.append(",".join([*cells, f"{top:g}"]))
            e = SimDevice(board).expected(p.steps[0][0], Setting(p.freq_mhz, low, None), steps=steps)
            cells[2:5] = [repr(e.time_expected_s), repr(e.energy_expected_j), ""]
            rows.append(",".join([*cells, f"{low:g}"]))
        else:
            rows.append(",".join(cells))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_twin_fit_csv_writes_a_loadable_profile(trace_cache_dir, tmp_path):
    import json

    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    points = _simulated_points(TraceCache(trace_cache_dir), _known_board(), steps=3)
    csv = _grid_csv(tmp_path / "board-a.csv", points, 3, cpu_mhz=(2201.6, 1113.6), board=_known_board())
    out = tmp_path / "fitted" / "a.yaml"
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    # every row is a point at its clocks, those below the CPU's top too: the host's CPU-bound share is fitted with them
    assert report["profile"] == "fit-board-a" and report["n_points"] == 2 * len(points) and report["simulated_input"] is False
    assert "cpu_bound_share" in report["fitted"]
    assert set(report["errors"]) == {"time", "power", "energy"} and report["errors"]["energy"]["mean_rel"] < 0.03
    assert report["errors_base"]["energy"]["mean_rel"] > 0.1
    loaded = load_twin_params(None, out)  # loadable by --twin-params, under its own name
    assert loaded.profile == "fit-board-a" and loaded.gpu_static_w == pytest.approx(report["constants"]["gpu_static_w"])
    # every clock of the grid is one of the AGX Orin's: the same board, measured (its family and table kept)
    assert loaded.family == "jetson-agx-orin-64gb" and loaded.frequencies_mhz == OrinTwinParams().frequencies_mhz
    r = CliRunner().invoke(main, ["simulate", "bert-tiny", "--seq-len", "16", "--twin-params", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["device_profile"] == "fit-board-a"


def test_twin_fit_csv_of_another_board_is_named_after_its_grid(trace_cache_dir, tmp_path):
    """A grid measured at clocks the base profile does not have is another board: the profile takes the grid's name as its
    family and the grid's clocks as its table, and fits them."""
    import dataclasses
    import json

    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main
    from dvfs_mlops.hw.board import board_family
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    table = (300.0, 500.0, 700.0, 900.0, 1100.0, 1400.0)
    board = dataclasses.replace(_known_board(), frequencies_mhz=table)
    cache = TraceCache(trace_cache_dir)
    points = [p for p in _simulated_points(cache, board, steps=2, clocks=table) if p.workload.startswith(("bert-tiny", "bert-base"))]
    csv = _grid_csv(tmp_path / "jetson-board-x.csv", points, 2)
    out = tmp_path / "x.yaml"
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["profile"] == "fit-jetson-board-x" and report["errors"]["energy"]["mean_rel"] < 0.05, report["errors"]
    loaded = load_twin_params(None, out)
    assert loaded.family == "jetson-board-x" and loaded.frequencies_mhz == table
    assert board_family(loaded.profile, loaded) == "jetson-board-x"
    assert "board family jetson-board-x" in out.read_text()


def test_twin_fit_csv_a_bad_fit_writes_nothing_without_force(trace_cache_dir, tmp_path):
    """time_s and energy_j of a 100-step run without the `steps` column are read per step: no constant within its bounds
    (30x the base's) makes a step that long, the fit is far off, so nothing is written (one line with the errors, fitted
    and base) unless --force."""
    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main

    points = _simulated_points(TraceCache(trace_cache_dir), _known_board(), steps=100)
    csv = _grid_csv(tmp_path / "board-a.csv", points, 100, with_steps=False)
    out = tmp_path / "a.yaml"
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out)])
    assert r.exit_code == 2 and not out.exists(), r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and "is not written: mean error energy" in lines[0] and "(base " in lines[0] and "--force" in lines[0], r.stderr
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out), "--force"])
    assert r.exit_code == 0 and out.exists(), r.output


def test_twin_fit_csv_refuses_workloads_it_cannot_trace(tmp_path):
    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main

    csv = tmp_path / "grid.csv"
    csv.write_text("workload,gpu_mhz,time_s,energy_j\nLSTM_IMDB_bs8,905.25,0.39,5.3\nLSTM_IMDB_bs8,1377,0.29,6.4\n")
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "MODEL/TASK" in r.stderr and "'LSTM_IMDB_bs8'" in r.stderr and not (tmp_path / "x.yaml").exists()
