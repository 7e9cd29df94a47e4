"""The twin as a backend of (GPU, CPU, EMC) configurations: sessions at a configuration on every profile, today's figures
unchanged where the CPU and EMC are left alone, the joint energy beside `energy_j`, the expected oracle, bad clocks in
one line, and `twin fit --csv` on a grid with CPU and EMC columns. Every figure here is SIMULATED."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from dvfs_mlops.errors import DvfsError, UnknownNameError
from dvfs_mlops.hw.replay import Setting
from dvfs_mlops.hw.sim import SimDevice, board_watts
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import energy_curve, estimate_maxn, estimate_step, joint_energy
from dvfs_mlops.hw.twin.profiles import AGX_ORIN_RAILS, BUILTIN_PROFILES, rail_names
from dvfs_mlops.hw.twin.trace import TraceCache
from dvfs_mlops.job.workloads.zoo import PRESETS

PROFILES = sorted(BUILTIN_PROFILES)


@pytest.fixture(scope="module")
def traces(trace_cache_dir):
    cache = TraceCache(trace_cache_dir)
    return [cache.get(PRESETS["bert-tiny"].config(), 16, 13), cache.get(PRESETS["bert-mini"].config(), 16, 31)]


def _quiet(profile: str) -> OrinTwinParams:
    return dataclasses.replace(BUILTIN_PROFILES[profile], noise_time=0.0, noise_power=0.0)


def _run(device, freq, traces, *, label="w#0", steps=2, **knobs):
    """A session with a "train" window of `steps` steps of every trace, then one step outside it."""
    s = device.session(freq, label=label, **knobs)
    with s:
        with s.window("train"):
            for _ in range(steps):
                for t in traces:
                    s.step(t)
        s.step(traces[0])
    return s


# --- the GPU-only twin as it charged steps before sessions had CPU and EMC clocks: the oracle for `None` -----------------
def _todays_train_window(p, seed, label, freq, traces, steps):
    """The "train" window of `_run` as the GPU-only twin computed it: each step at the GPU clock's (or maxn's) estimate
    with CPU and EMC at their tops, on the module's rails, times the draw seeded by (seed, clock, label)."""
    digest = hashlib.sha256(f"{seed}|{'maxn' if freq == 'maxn' else f'{float(freq):g}'}|{label}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    time_factor = 1.0 + p.noise_time * rng.standard_normal()
    power_factor = 1.0 + p.noise_power * rng.standard_normal()
    time_s = busy = time_expected = 0.0
    joules = {r: 0.0 for r in rail_names(p)}
    for _ in range(steps):
        for trace in traces:
            curve = energy_curve(trace, p)
            est = estimate_maxn(trace, p, curve) if freq == "maxn" else curve[float(freq)]
            t = est.time_s
            time_expected += t
            t *= time_factor
            time_s += t
            busy += est.gpu_util * t
            for r, w in board_watts(est.power_by_rail_w, p).items():
                joules[r] += w * power_factor * t
    return time_s, busy, joules, time_expected


@pytest.mark.parametrize("profile", PROFILES)
def test_without_cpu_and_emc_every_figure_and_context_key_is_todays(traces, profile):
    """Every profile, pinned and maxn: a session that leaves the CPU and EMC out measures what the GPU-only twin
    measured (time, rails, load, the expected values; same draw), has today's report keys and an empty context; a
    session naming the tables' tops gives the same figures bit for bit, its context naming the clocks."""
    p = BUILTIN_PROFILES[profile]
    device = SimDevice(p, seed=3)
    for freq in (p.frequencies_mhz[0], p.max_mhz, "maxn"):
        plain = _run(device, freq, traces)
        time_s, busy, joules, time_expected = _todays_train_window(p, 3, "w#0", freq, traces, 2)
        r = plain.report()
        assert r.duration_s == time_s and r.energy_by_rail_j == joules and r.time_expected_s == time_expected
        assert r.gpu_util_pct == 100.0 * busy / time_s and r.emc_mhz is None
        assert plain.context == {}
        assert set(r.to_dict()) == {f.name for f in dataclasses.fields(r)} - {"power_series_w"} | {"meter_degraded"}
        spelled = _run(device, freq, traces, cpu_mhz=None, emc_mhz=None)
        assert spelled.report().to_dict(True) == r.to_dict(True) and spelled.context == {}
        tops = _run(device, freq, traces, cpu_mhz=p.cpu_max_mhz, emc_mhz=p.emc_max_mhz)
        for a, b in [(tops.report(), r), (tops.session_report(), plain.session_report()), (tops.windows["train"], plain.windows["train"])]:
            assert a.emc_mhz == p.emc_max_mhz
            assert {**a.to_dict(True), "emc_mhz": None} == b.to_dict(True)
        assert tops.context["cpu_mhz"] == p.cpu_max_mhz and tops.context["emc_mhz"] == p.emc_max_mhz
        assert tops.effective_mhz == plain.effective_mhz and tops.time_factor == plain.time_factor


@pytest.mark.parametrize("profile", PROFILES)
def test_time_and_the_cpu_and_dram_rails_move_with_their_clocks(traces, profile):
    """GPU at its top: the lowest CPU clock makes the steps slower and the CPU's rail draw less; the lowest EMC clock
    makes them slower and the DRAM draw less (AGX Orin: VDDQ_VDD2_1V8AO; Orin NX/Nano, whose DRAM has no rail of its
    own: VDD_IN less the CPU/GPU and SoC rails). The joint energy is its rails' sum, as `joint_energy` names them."""
    p = _quiet(profile)
    device = SimDevice(p)
    cpu_low, emc_low = min(p.cpu_frequencies_mhz), min(p.emc_frequencies_mhz)
    agx = rail_names(p) == AGX_ORIN_RAILS
    cpu_rail = "VDD_CPU_CV" if agx else "VDD_CPU_GPU_CV"

    def watts(s, rail):
        r = s.report()
        if rail == "dram":
            by = r.energy_by_rail_j
            joules = by["VDDQ_VDD2_1V8AO"] if agx else by["VDD_IN"] - by["VDD_CPU_GPU_CV"] - by["VDD_SOC"]
            return joules / r.duration_s
        return r.energy_by_rail_j[rail] / r.duration_s

    top = _run(device, p.max_mhz, traces, cpu_mhz=p.cpu_max_mhz, emc_mhz=p.emc_max_mhz)
    slow_cpu = _run(device, p.max_mhz, traces, cpu_mhz=cpu_low)
    slow_emc = _run(device, p.max_mhz, traces, emc_mhz=emc_low)
    assert slow_cpu.report().duration_s > top.report().duration_s
    assert watts(slow_cpu, cpu_rail) < watts(top, cpu_rail)
    assert slow_emc.report().duration_s > top.report().duration_s
    assert watts(slow_emc, "dram") < watts(top, "dram")
    assert slow_cpu.context["cpu_mhz"] == cpu_low and slow_cpu.context["emc_mhz"] == p.emc_max_mhz
    assert slow_emc.context["emc_mhz"] == emc_low == slow_emc.report().emc_mhz
    rule = joint_energy(rail_names(p))
    for s in (top, slow_cpu, slow_emc):
        train = s.windows["train"]
        assert s.context["energy_joint_rails"] == ",".join(rule.rails)
        assert s.context["energy_joint_j"] == pytest.approx(sum(train.energy_by_rail_j[r] for r in rule.rails), rel=1e-12)
        assert s.context["energy_joint_expected_j"] == s.context["energy_joint_j"]  # no noise on this board
        assert s.joint("train").energy_joint_j == s.context["energy_joint_j"]
    # the step's own physics at the configuration, per step
    est = estimate_step(traces[1], Setting(p.max_mhz, cpu_low, None), p)
    one = device.session(p.max_mhz, cpu_mhz=cpu_low)
    with one:
        one.step(traces[1])
    assert one.report().duration_s == est.time_s and one.report().energy_j == pytest.approx(est.energy_j, rel=1e-12)


def test_the_joint_energy_holds_the_dram_where_energy_j_does_not(traces):
    """AGX Orin: `energy_j` is GPU/SoC + CPU; the joint energy adds the DRAM rail (not VIN_SYS_5V0, which feeds it), so a
    lower memory clock's DRAM saving shows in it. Orin NX: the module input VDD_IN, which holds every rail."""
    agx = SimDevice(_quiet("sim-orin"))
    s = _run(agx, 1300.5, traces, emc_mhz=665.6)
    r = s.windows["train"]
    assert s.context["energy_joint_j"] == pytest.approx(r.energy_j + r.energy_by_rail_j["VDDQ_VDD2_1V8AO"], rel=1e-12)
    nx = SimDevice(_quiet("sim-orin-nx-16gb"))
    s = _run(nx, 918.0, traces, cpu_mhz=729.6)
    assert s.context["energy_joint_rails"] == "VDD_IN" and s.context["energy_joint_j"] == s.windows["train"].energy_by_rail_j["VDD_IN"]


@pytest.mark.parametrize("profile", ["sim-orin", "sim-orin-nano-8gb"])
def test_maxn_tracks_the_load_at_the_given_cpu_and_emc_clocks(traces, profile):
    """maxn stays the load-tracking GPU governor: at a low CPU clock a launch-bound step keeps the GPU less busy, and
    podgov settles where the curve at that CPU and EMC clock says (never above where it settles at the tops)."""
    p = _quiet(profile)
    device = SimDevice(p)
    cpu, emc = p.cpu_frequencies_mhz[2], p.emc_frequencies_mhz[1]
    s = _run(device, "maxn", traces[:1], cpu_mhz=cpu, emc_mhz=emc, steps=1)
    want = estimate_maxn(traces[0], p, energy_curve(traces[0], p, cpu, emc))
    assert s.effective_mhz == want.settled_mhz and s.pinned_mhz is None
    assert s.windows["train"].duration_s == pytest.approx(want.time_s, rel=1e-12)
    at_tops = estimate_maxn(traces[0], p, energy_curve(traces[0], p))
    assert want.settled_mhz <= at_tops.settled_mhz and want.gpu_util < at_tops.gpu_util


def test_repin_moves_the_gpu_and_keeps_the_cpu_and_emc(traces):
    p = _quiet("sim-orin")
    device = SimDevice(p)
    s = device.session(1300.5, label="probe", cpu_mhz=1497.6, emc_mhz=2133.0)
    with s:
        with s.window("a"):
            s.step(traces[1])
        s.repin(612.0)
        with s.window("b"):
            s.step(traces[1])
    assert s.windows["b"].duration_s == estimate_step(traces[1], Setting(612.0, 1497.6, 2133.0), p).time_s
    assert s.windows["a"].duration_s == estimate_step(traces[1], Setting(1300.5, 1497.6, 2133.0), p).time_s
    assert s.config.freq == 612.0 and (s.cpu_mhz, s.emc_mhz) == (1497.6, 2133.0) and s.pins == [612.0]
    assert s.context["cpu_mhz"] == 1497.6 and s.context["emc_mhz"] == 2133.0
    for window, gpu in (("a", 1300.5), ("b", 612.0)):
        want = device.expected(traces[1], Setting(gpu, 1497.6, 2133.0))
        assert s.joint(window).energy_joint_j == pytest.approx(want.energy_joint_expected_j, rel=1e-12)
    with pytest.raises(KeyError, match="'c' has not ended"):
        s.joint("c")


def test_the_knobs_hook_moves_the_cpu_and_emc_inside_a_session(traces):
    """`_repin_knobs` (what `FreqSession.repin` calls for the CPU and EMC clocks): the next steps run at the new clocks,
    the one not given stays, a session that started at the tops names its clocks from then on, and a clock off its
    table moves nothing."""
    p = _quiet("sim-orin")
    device = SimDevice(p)
    s = device.session(816.0, label="refine")
    with s:
        with s.window("a"):
            s.step(traces[1])
        assert s.context == {}
        s._repin_knobs(1190.4, None)
        with s.window("b"):
            s.step(traces[1])
        s._repin_knobs(None, 665.6)
        with s.window("c"):
            s.step(traces[1])
        with pytest.raises(UnknownNameError, match="EMC table"):
            s._repin_knobs(None, 1000.0)
    for window, setting in (("a", Setting(816.0)), ("b", Setting(816.0, 1190.4)), ("c", Setting(816.0, 1190.4, 665.6))):
        assert s.windows[window].duration_s == estimate_step(traces[1], setting, p).time_s
    assert (s.cpu_mhz, s.emc_mhz) == (1190.4, 665.6) and s.context["cpu_mhz"] == 1190.4 and s.context["emc_mhz"] == 665.6
    noisy = SimDevice(seed=2).session(816.0, label="x")
    fresh = SimDevice(seed=2).session(816.0, label="x", cpu_mhz=1190.4)
    noisy._repin_knobs(1190.4, None)
    assert (noisy.time_factor, noisy.power_factor) == (fresh.time_factor, fresh.power_factor)


def test_the_draw_is_seeded_by_the_whole_configuration():
    device = SimDevice(seed=4)
    draw = {knobs: device.session(612.0, label="w#0", **dict(knobs)) for knobs in
            [(), (("cpu_mhz", 2201.6), ("emc_mhz", 3199.0)), (("cpu_mhz", 729.6),), (("emc_mhz", 665.6),)]}
    factors = {k: (s.time_factor, s.power_factor) for k, s in draw.items()}
    assert factors[()] == factors[(("cpu_mhz", 2201.6), ("emc_mhz", 3199.0))]  # the tops: the GPU clock's own draw
    assert len(set(factors.values())) == 3
    again = device.session(612.0, label="w#0", cpu_mhz=729.6)
    assert (again.time_factor, again.power_factor) == factors[(("cpu_mhz", 729.6),)]


@pytest.mark.parametrize("profile", ["sim-orin", "sim-orin-nano-8gb", "sim-orin-nx-8gb"])
def test_a_clock_not_in_its_table_is_one_line(profile):
    """A CPU or EMC clock outside the profile's table names that table and lists it, before anything runs; a clock
    within 0.5 MHz of an entry is that entry; an observing session refuses any CPU or EMC clock."""
    p = BUILTIN_PROFILES[profile]
    device = SimDevice(p)
    for knobs, domain in [({"cpu_mhz": 1000.0}, "CPU"), ({"emc_mhz": 1000.0}, "EMC"), ({"cpu_mhz": "fast"}, "CPU"),
                          ({"emc_mhz": p.emc_max_mhz + 100}, "EMC")]:
        with pytest.raises(UnknownNameError) as e:
            device.session(p.max_mhz, **knobs)
        message = str(e.value)
        assert "\n" not in message and f"not in the {profile} twin's {domain} table" in message
        table = p.cpu_frequencies_mhz if domain == "CPU" else p.emc_frequencies_mhz
        assert message.endswith(", ".join(f"{f:g}" for f in table))
    near = device.session(p.max_mhz, cpu_mhz=p.cpu_frequencies_mhz[3] + 0.3, emc_mhz=p.emc_frequencies_mhz[0] - 0.4)
    assert (near.config.cpu_mhz, near.config.emc_mhz) == (p.cpu_frequencies_mhz[3], p.emc_frequencies_mhz[0])
    with pytest.raises(DvfsError, match="an observing session sets no clock") as e:
        device.session(p.max_mhz, observe=True, cpu_mhz=p.cpu_max_mhz)
    assert "\n" not in str(e.value)
    assert device.cpu_frequencies_mhz == tuple(sorted(p.cpu_frequencies_mhz))
    assert device.emc_frequencies_mhz == tuple(sorted(p.emc_frequencies_mhz))


@pytest.mark.parametrize("profile", PROFILES)
def test_expected_is_what_a_session_measures_without_noise(traces, profile):
    """`SimDevice.expected` at a configuration (a Setting, or a GPU clock / maxn with CPU and EMC keywords) gives the
    noise-free time, energy_j, energy_total_j and joint energy a session there reports; a noisy session's own expected
    values are the same."""
    p = BUILTIN_PROFILES[profile]
    quiet, noisy = SimDevice(_quiet(profile)), SimDevice(p, seed=9)
    cpu, emc = p.cpu_frequencies_mhz[len(p.cpu_frequencies_mhz) // 2], p.emc_frequencies_mhz[1]
    for freq, knobs in [(p.frequencies_mhz[1], {"cpu_mhz": cpu, "emc_mhz": emc}), ("maxn", {"cpu_mhz": cpu}), (p.max_mhz, {})]:
        want = noisy.expected(traces[1], freq, steps=3, **knobs)
        s = quiet.session(freq, **knobs)
        with s:
            for _ in range(3):
                s.step(traces[1])
        r = s.report()
        assert want.time_expected_s == pytest.approx(r.duration_s, rel=1e-12)
        assert want.energy_expected_j == pytest.approx(r.energy_j, rel=1e-12)
        assert want.energy_total_expected_j == pytest.approx(r.energy_total_j, rel=1e-12)
        assert want.energy_joint_expected_j == pytest.approx(s.joint().energy_joint_j, rel=1e-12)
        assert want.joint_rails == joint_energy(rail_names(p)).rails and want.settled_mhz == s.effective_mhz
        n = noisy.session(freq, label="x", **knobs)
        with n:
            for _ in range(3):
                n.step(traces[1])
        assert n.report().energy_expected_j == pytest.approx(want.energy_expected_j, rel=1e-12)
        assert n.report().energy_j != pytest.approx(want.energy_expected_j, rel=1e-9)  # a draw is not its expectation
        if knobs:
            assert n.context["energy_joint_expected_j"] == pytest.approx(want.energy_joint_expected_j, rel=1e-12)
    setting = Setting(p.frequencies_mhz[1], cpu, emc)
    by_setting = noisy.expected(traces[0], setting)
    assert by_setting == noisy.expected(traces[0], setting.gpu_mhz, cpu_mhz=cpu, emc_mhz=emc)
    assert by_setting.setting == setting
    with pytest.raises(DvfsError, match="give them once"):
        noisy.expected(traces[0], setting, cpu_mhz=cpu)


def test_a_joint_oracle_over_configurations_beats_the_gpu_only_one(traces):
    """The twin's expected joint energy over every (GPU, CPU, EMC) configuration of a profile: its optimum is at most
    the GPU-only optimum's (CPU and EMC at their tops), both judged on the same joint energy."""
    device = SimDevice(BUILTIN_PROFILES["sim-orin-nano-8gb"])
    p = device.params
    joint = {(f, c, m): device.expected(traces[1], Setting(f, c, m)).energy_joint_expected_j
             for f in p.frequencies_mhz for c in (*p.cpu_frequencies_mhz[::4], p.cpu_max_mhz) for m in p.emc_frequencies_mhz}
    gpu_only = {f: e for (f, c, m), e in joint.items() if c == p.cpu_max_mhz and m == p.emc_max_mhz}
    assert min(joint.values()) < min(gpu_only.values())
    assert all(device.expected(traces[1], f).energy_joint_expected_j == e for f, e in gpu_only.items())


# --- twin fit --csv on a grid with CPU and EMC columns ------------------------------------------------------------------
def _joint_grid(path, board, cache, clocks):
    """A grid measured on `board` (noise-free twin): bert-tiny and bert-mini on sst2, 4 steps per row, at each
    (GPU, CPU, EMC) of `clocks`; energy_j is CPU + GPU (the study's, as `twin fit --csv` reads it)."""
    from dvfs_mlops.job.workloads.tasks import TASKS

    device = SimDevice(board)
    rows = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j,steps,seq_len"]
    for model in ("bert-tiny", "bert-mini"):
        seq = TASKS["sst2"].mean_tokens
        trace = cache.get(PRESETS[model].config(), 16, seq)
        for g, c, m in clocks:
            e = device.expected(trace, Setting(g, c, m), steps=4)
            rows.append(f"{model}/sst2,{g:g},{c:g},{m:g},{e.time_expected_s!r},{e.energy_expected_j!r},4,{seq}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_twin_fit_csv_fits_every_configuration_and_the_cpu_bound_share(trace_cache_dir, tmp_path):
    """A grid of one board with the CPU and EMC below their tops: every row is a point at its configuration, the fit
    adds cpu_bound_share and finds the board's, and the profile keeps the base's family and tables (every clock is one
    of them)."""
    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    base = OrinTwinParams()
    board = dataclasses.replace(base, profile="board-cpu", cpu_bound_share=0.6, host_per_step_s=12e-3, noise_time=0.0, noise_power=0.0)
    clocks = [(g, c, m) for g in (306.0, 816.0, 1300.5) for c in (729.6, 1497.6, 2201.6) for m in (665.6, 3199.0)]
    csv = _joint_grid(tmp_path / "orin-lab.csv", board, TraceCache(trace_cache_dir), clocks)
    out = tmp_path / "fit.yaml"
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["n_points"] == 2 * len(clocks) and "cpu_bound_share" in report["fitted"]
    assert report["constants"]["cpu_bound_share"] == pytest.approx(0.6, rel=0.03)
    assert report["errors"]["time"]["mean_rel"] < 0.01 and report["errors"]["energy"]["mean_rel"] < 0.02
    loaded = load_twin_params(None, out)
    assert loaded.family == base.family and loaded.cpu_frequencies_mhz == base.cpu_frequencies_mhz
    assert loaded.emc_frequencies_mhz == base.emc_frequencies_mhz and loaded.cpu_bound_share == pytest.approx(0.6, rel=0.03)


def test_twin_fit_csv_of_cpu_clocks_off_the_tables_is_another_board(trace_cache_dir, tmp_path):
    """CPU clocks the base profile's table lacks: another board, its GPU, CPU and EMC tables the grid's, its family the
    grid's name."""
    from dvfs_mlops.app.twin_fit import csv_points

    board = dataclasses.replace(OrinTwinParams(), profile="xavier-like", cpu_frequencies_mhz=(652.8, 1420.8, 2265.6),
                                emc_frequencies_mhz=(1065.6, 2133.0), noise_time=0.0, noise_power=0.0)
    clocks = [(g, c, m) for g in (306.0, 1300.5) for c in board.cpu_frequencies_mhz for m in board.emc_frequencies_mhz]
    grid = csv_points(str(_joint_grid(tmp_path / "lab-xavier.csv", board, TraceCache(trace_cache_dir), clocks)))
    assert len(grid.points) == 2 * len(clocks)
    assert {(pt.cpu_mhz, pt.emc_mhz) for pt in grid.points} == {(c, m) for _, c, m in clocks}
    moved = grid.board(OrinTwinParams())
    assert moved.family == "lab-xavier" and moved.cpu_frequencies_mhz == board.cpu_frequencies_mhz
    assert moved.emc_frequencies_mhz == board.emc_frequencies_mhz and moved.frequencies_mhz == (306.0, 1300.5)


def test_twin_fit_csv_gate_still_refuses_a_bad_joint_fit(trace_cache_dir, tmp_path):
    """Rows whose time and energy are of 100 times the steps they say: no timing within the fit's bounds (30x the
    base's) makes a step that long, so the fit is worse than the base and nothing is written without --force."""
    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main

    board = dataclasses.replace(OrinTwinParams(), noise_time=0.0, noise_power=0.0)
    clocks = [(g, c, 3199.0) for g in (306.0, 1300.5) for c in (729.6, 2201.6)]
    csv = _joint_grid(tmp_path / "odd.csv", board, TraceCache(trace_cache_dir), clocks)
    lines = csv.read_text().splitlines()
    scaled = [lines[0]] + [",".join([*cells[:4], repr(100 * float(cells[4])), repr(100 * float(cells[5])), *cells[6:]])
                           for cells in (ln.split(",") for ln in lines[1:])]
    csv.write_text("\n".join(scaled) + "\n")
    out = tmp_path / "odd.yaml"
    r = CliRunner().invoke(main, ["twin", "fit", "--csv", str(csv), "--out", str(out)])
    assert r.exit_code == 2 and not out.exists() and "is not written: mean error energy" in r.stderr, r.output


def test_an_external_command_is_charged_its_wall_time_at_the_session_clocks():
    """A session with no step trace (`dvfs-mlops run CMD`) charges its wall time at the assumed load, with the CPU rail
    at the session's CPU clock and the DRAM's background at its EMC clock; the context names the clocks and the joint
    energy as for steps."""
    import time

    p = _quiet("sim-orin")
    watts = {}
    for knobs in ({}, {"cpu_mhz": 729.6, "emc_mhz": 665.6}):
        s = SimDevice(p).session(816.0, label="cmd", **knobs)
        with s:
            time.sleep(0.02)
        r = s.report()
        watts[bool(knobs)] = {rail: j / r.duration_s for rail, j in r.energy_by_rail_j.items()}
        if knobs:
            assert s.context["cpu_mhz"] == 729.6 and r.emc_mhz == 665.6
            assert s.context["energy_joint_j"] == pytest.approx(sum(r.energy_by_rail_j[x] for x in joint_energy(AGX_ORIN_RAILS).rails))
    assert watts[True]["VDD_CPU_CV"] < watts[False]["VDD_CPU_CV"]
    assert watts[True]["VDDQ_VDD2_1V8AO"] < watts[False]["VDDQ_VDD2_1V8AO"]
    assert watts[True]["VDD_GPU_SOC"] == pytest.approx(watts[False]["VDD_GPU_SOC"], rel=1e-12)
