"""The twin with CPU and memory (EMC) clocks: today's figures unchanged at the tops, time and rails along each clock,
the published CPU/EMC tables, the joint energy per board, and the twin fitted on BoFL's real grid."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.replay import Setting, read_grid
from dvfs_mlops.hw.twin.params import CPU_EMC_FIELDS, OrinTwinParams
from dvfs_mlops.hw.twin.physics import (
    RAILS,
    StepEstimate,
    energy_curve,
    estimate_maxn,
    estimate_step,
    estimate_work,
    joint_energy,
    rail_power,
    work_grid,
)
from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES, load_twin_params
from dvfs_mlops.hw.twin.trace import KIND_KERNEL, StepTrace, StepWork, TraceCache
from dvfs_mlops.job.workloads.zoo import PRESETS

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
BOFL = DATA / "public" / "bofl-agx-xavier.csv"
XAVIER_BOARD = DATA / "twin-bofl-agx-xavier.yaml"
XAVIER_WORK = DATA / "twin-bofl-agx-xavier-work.yaml"


# --- the GPU-only twin as it was before the CPU and EMC clocks: the oracle the tops must reproduce bit for bit -----------
def _gpu_only_rails(f_mhz, gpu_util, host_share, dram_share, p):
    u = min(1.0, max(0.0, gpu_util))
    dyn = p.gpu_k * p.voltage(f_mhz) ** 2 * (f_mhz / 1000.0)
    gpu_w = p.gpu_static_w + u * dyn + (1.0 - u) * p.gpu_idle_dynamic_share * dyn
    cpu_w = p.cpu_base_w + p.cpu_busy_w * min(1.0, host_share)
    ddr_w = p.ddr_base_w + p.ddr_per_bw_w * min(1.0, dram_share)
    return {"VDD_GPU_SOC": gpu_w, "VDD_CPU_CV": cpu_w, "VIN_SYS_5V0": p.sys_5v0_w, "VDDQ_VDD2_1V8AO": ddr_w}


def _gpu_only_step(trace, f_mhz, p):
    k = trace.kinds == KIND_KERNEL
    peak = p.cuda_cores * p.flops_per_core_cycle * f_mhz * 1e6
    formula = trace.has_flop_formula[k]
    peak_per_op = np.where(formula, peak * p.tensor_core_speedup, peak) if trace.dtype in ("float16", "bfloat16") else np.full(formula.shape, peak)
    eta = np.where(formula, p.eta_compute_flop_ops, p.eta_compute_other)
    d = np.maximum(trace.flops[k] / (eta * peak_per_op), trace.bytes[k] / (p.eta_memory * p.dram_bw_bytes_s)) + p.kernel_fixed_s * p.max_mhz / f_mhz
    host_cost = np.where(k, p.host_per_kernel_s, p.host_per_view_s)
    launch_done = np.cumsum(host_cost)[k]
    s = np.cumsum(d)
    s_prev = np.concatenate(([0.0], s[:-1]))
    end_last = float(s[-1] + np.max(launch_done - s_prev)) if d.size else float(host_cost.sum())
    step_time = end_last + p.host_per_step_s
    busy, host_busy = float(d.sum()), float(host_cost.sum()) + p.host_per_step_s
    u = min(1.0, busy / step_time)
    rails = _gpu_only_rails(f_mhz, u, host_busy / step_time, float(trace.bytes.sum()) / (step_time * p.dram_bw_bytes_s), p)
    return step_time, busy, host_busy, u, rails


def _figures(e: StepEstimate):
    return e.time_s, e.gpu_busy_s, e.host_busy_s, e.gpu_util, e.power_by_rail_w


def _synthetic_trace(key, n, dtype, seed):
    """Kernels of log-normal FLOPs and bytes (compute- and memory-bound ones), views between them."""
    rng = np.random.default_rng(seed)
    kinds = (rng.random(n) < 0.7).astype(np.int8)
    return StepTrace(key, kinds, rng.lognormal(20, 2.5, n) * kinds, rng.lognormal(16, 2.5, n) * kinds, rng.random(n) < 0.4,
                     10**7, 8, 128, dtype)


@pytest.fixture(scope="module")
def traces(trace_cache_dir):
    cache = TraceCache(trace_cache_dir)
    return [cache.get(PRESETS["bert-tiny"].config(), 16, 13), cache.get(PRESETS["bert-mini"].config(), 16, 31),
            _synthetic_trace("fp32-mixed", 400, "float32", 1), _synthetic_trace("bf16-mixed", 1500, "bfloat16", 2)]


@pytest.mark.parametrize("profile", sorted(BUILTIN_PROFILES))
def test_every_figure_is_todays_with_cpu_and_emc_at_their_tops(traces, profile):
    """Every built-in profile, every GPU clock: a bare clock, a Setting with CPU and EMC left out, and one naming their
    tops give the GPU-only twin's time, busy times, load and rails exactly; so do MAXN and the rails alone."""
    p = BUILTIN_PROFILES[profile]
    for trace in traces:
        for f in p.frequencies_mhz:
            expected = _gpu_only_step(trace, f, p)
            for config in (f, Setting(f, None, None), Setting(f, p.cpu_max_mhz, p.emc_max_mhz)):
                assert _figures(estimate_step(trace, config, p)) == expected
        curve = energy_curve(trace, p)
        old_curve = {f: StepEstimate(f, *_gpu_only_step(trace, f, p)) for f in p.frequencies_mhz}
        assert dataclasses.astuple(estimate_maxn(trace, p, curve)) == dataclasses.astuple(estimate_maxn(trace, p, old_curve))
    for f, u, h, d in [(p.max_mhz, 1.0, 1.0, 0.5), (min(p.frequencies_mhz), 0.3, 0.2, 0.0), (p.max_mhz, 0.5, 1.0, 0.0)]:
        assert rail_power(f, u, h, d, p) == _gpu_only_rails(f, u, h, d, p)


@pytest.mark.parametrize("profile", sorted(BUILTIN_PROFILES))
def test_time_falls_as_each_clock_rises(traces, profile):
    """Along each clock's table, the others at their tops: a step never gets slower as the clock rises, and the host's
    clock and the memory clock each matter to some trace (strictly faster from bottom to top)."""
    p = BUILTIN_PROFILES[profile]
    for trace in traces:
        gpu = [estimate_step(trace, f, p).time_s for f in p.frequencies_mhz]
        cpu = [estimate_step(trace, Setting(p.max_mhz, c, None), p).time_s for c in p.cpu_frequencies_mhz]
        emc = [estimate_step(trace, Setting(p.max_mhz, None, m), p).time_s for m in p.emc_frequencies_mhz]
        for series in (gpu, cpu, emc):
            assert all(a >= b for a, b in itertools.pairwise(series))
        assert cpu[0] > cpu[-1]  # the host's dispatch and per-step overhead stretch at the lowest CPU clock
    bandwidth_bound = traces[-1]
    slow, fast = (estimate_step(bandwidth_bound, Setting(p.max_mhz, None, m), p) for m in (min(p.emc_frequencies_mhz), p.emc_max_mhz))
    assert slow.time_s > fast.time_s and slow.gpu_busy_s > fast.gpu_busy_s


@pytest.mark.parametrize("profile", sorted(BUILTIN_PROFILES))
def test_cpu_and_dram_rails_draw_more_at_higher_clocks(profile):
    """At a fixed load, VDD_CPU_CV rises with the CPU clock and VDDQ_VDD2_1V8AO with the EMC clock (step by step); the
    other rails do not move with either clock."""
    p = BUILTIN_PROFILES[profile]
    f = p.max_mhz
    cpu = [rail_power(Setting(f, c, None), 0.8, 0.6, 0.3, p) for c in p.cpu_frequencies_mhz]
    emc = [rail_power(Setting(f, None, m), 0.8, 0.6, 0.3, p) for m in p.emc_frequencies_mhz]
    assert all(a["VDD_CPU_CV"] < b["VDD_CPU_CV"] for a, b in itertools.pairwise(cpu))
    assert all(a["VDDQ_VDD2_1V8AO"] < b["VDDQ_VDD2_1V8AO"] for a, b in itertools.pairwise(emc))
    for rail in set(RAILS) - {"VDD_CPU_CV"}:
        assert len({r[rail] for r in cpu}) == 1
    for rail in set(RAILS) - {"VDDQ_VDD2_1V8AO"}:
        assert len({r[rail] for r in emc}) == 1
    # the CPU's switching power follows V^2 f: from the top to the bottom of the table it falls by more than the clock
    top, bottom = cpu[-1]["VDD_CPU_CV"] - p.cpu_base_w * (1 - p.cpu_clock_share), cpu[0]["VDD_CPU_CV"] - p.cpu_base_w * (1 - p.cpu_clock_share)
    assert bottom / top < min(p.cpu_frequencies_mhz) / p.cpu_max_mhz


def test_each_module_has_its_published_cpu_and_emc_ceilings():
    """The CPU ceilings of the modules' top power modes, and EMC ceilings that give each data sheet's LPDDR5 bandwidth
    (EMC MHz x 2 transfers x bus bytes); every table on the A78AE's 76.8 MHz grid below its ceiling."""
    expected = {"sim-orin": (2201.6, 3199.0, 32), "sim-orin-measured": (2201.6, 3199.0, 32), "sim-orin-32gb": (2201.6, 3199.0, 32),
                "sim-orin-nx-16gb": (1984.0, 3199.0, 16), "sim-orin-nx-8gb": (1984.0, 3199.0, 16),
                "sim-orin-nano-8gb": (1510.4, 2133.0, 16), "sim-orin-nano-8gb-super": (1728.0, 3199.0, 16)}
    assert set(expected) == set(BUILTIN_PROFILES)
    for name, (cpu_top, emc_top, bus_bytes) in expected.items():
        p = BUILTIN_PROFILES[name]
        assert p.cpu_max_mhz == cpu_top and p.emc_max_mhz == emc_top
        assert emc_top * 1e6 * 2 * bus_bytes == pytest.approx(p.dram_bw_bytes_s, rel=0.005)
        steps = p.cpu_frequencies_mhz[:-1]
        assert steps[0] == 115.2 and all(b - a == pytest.approx(76.8) for a, b in itertools.pairwise(steps))
        assert p.emc_frequencies_mhz[0] == 204.0


def test_joint_energy_names_the_rails_each_board_compares_on():
    """AGX Orin: GPU/SoC + CPU + DRAM, not VIN_SYS_5V0 that feeds the DRAM; Orin NX/Nano: the module input; AGX Xavier:
    BoFL's four rails; a discrete GPU's one rail cannot be judged jointly."""
    agx = joint_energy(RAILS)
    assert agx.rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VDDQ_VDD2_1V8AO") and agx.dram_rails == ("VDDQ_VDD2_1V8AO",)
    assert agx.total({"VDD_GPU_SOC": 10.0, "VDD_CPU_CV": 3.0, "VIN_SYS_5V0": 7.0, "VDDQ_VDD2_1V8AO": 2.0}) == 15.0
    nx = joint_energy(["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"])
    assert nx.rails == ("VDD_IN",) and nx.cpu_rails == ("VDD_CPU_GPU_CV",)
    assert joint_energy(["GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"]).rails == ("GPU", "CPU", "VDDRQ", "SYS5V")
    with pytest.raises(DvfsError, match="cannot be compared on one energy"):
        joint_energy(["gpu"])


def test_a_configuration_the_twin_cannot_run_is_one_line(traces):
    p = OrinTwinParams()
    for bad in (Setting(612.0, 0.0, None), Setting(612.0, None, -1.0), Setting(0.0, None, None)):
        with pytest.raises(DvfsError, match="every clock must be positive"):
            estimate_step(traces[0], bad, p)


def test_params_files_check_the_new_constants(tmp_path):
    f = tmp_path / "b.yaml"
    for text, message in [("cpu_clock_share: 1.5\n", "is a share and must be at most 1"),
                          ("cpu_reserved_mhz: 200\n", "must be below the lowest CPU clock"),
                          ("emc_frequencies_mhz: []\n", "emc_frequencies_mhz must be a non-empty list"),
                          ("cpu_frequencies_mhz: [1000, true]\n", "cpu_frequencies_mhz must be a non-empty list")]:
        f.write_text(text)
        with pytest.raises(DvfsError, match=message):
            load_twin_params(None, f)
    f.write_text("cpu_frequencies_mhz: [729.6, 1497.6]\n")
    changed = load_twin_params(None, f)
    f.write_text("gpu_k: 35.0\n")  # sim-orin's own value: the same board
    assert changed.cpu_max_mhz == 1497.6 and changed.profile != load_twin_params(None, f).profile


def test_a_params_file_keeps_its_digest_unless_it_moves_a_cpu_or_emc_constant(tmp_path):
    """A file written before the CPU and EMC constants (they stay at its base profile's) names the board as before; one
    that changes them is another board."""
    import hashlib
    import json

    f = tmp_path / "b.yaml"
    f.write_text("gpu_k: 20\n")
    for base in ("sim-orin-nano-8gb", "sim-orin-nx-16gb"):
        p = load_twin_params(base, f)
        fields = {k: v for k, v in p.to_dict().items() if k not in ("profile", *CPU_EMC_FIELDS)}
        assert p.profile == f"{base}+" + hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    f.write_text("gpu_k: 20\nddr_clock_share: 0.25\n")
    assert load_twin_params("sim-orin-nano-8gb", f).profile != p.profile


# --- the aggregate form, and the twin fitted to BoFL's AGX Xavier grid ------------------------------------------------------
def test_step_work_is_the_same_physics_at_one_or_many_configurations():
    p = OrinTwinParams()
    w = StepWork("w", 0.004, 0.03, 0.08, 3e9, 3.0, 8.0)
    settings = [Setting(f, c, m) for f in (306.0, 1300.5) for c in (729.6, 2201.6) for m in (665.6, 3199.0)]
    grid = work_grid(w, *(np.array([getattr(s, a) for s in settings]) for a in ("gpu_mhz", "cpu_mhz", "emc_mhz")), p)
    for i, s in enumerate(settings):
        one = estimate_work(w, s, p)
        assert one.time_s == pytest.approx(grid.time_s[i], rel=1e-12)
        assert one.total_power_w == pytest.approx(grid.total_power_w[i], rel=1e-12)
    assert estimate_work(w, Setting(1300.5, 729.6, None), p).time_s > estimate_work(w, 1300.5, p).time_s
    with pytest.raises(DvfsError, match="kernel_overlap of 'w' must be at least 1"):
        StepWork.from_dict({**w.to_dict(), "kernel_overlap": 0.5})
    with pytest.raises(DvfsError, match="missing dram_bytes"):
        StepWork.from_dict({k: v for k, v in w.to_dict().items() if k != "dram_bytes"})


def test_fit_grid_recovers_a_board_and_its_work_from_the_twins_own_grid(tmp_path):
    """A grid made by the twin itself (two workloads, every setting): fitted on 30 % of it, the judged settings'
    energy error is below 0.1 %, and the fitted host share and reserved clock are the board's."""
    from dvfs_mlops.hw.twin.fit import fit_grid

    board = dataclasses.replace(OrinTwinParams(), profile="known", cpu_reserved_mhz=30.0, cpu_bound_share=0.9, sys_5v0_w=0.0,
                                cpu_clock_share=1.0, ddr_clock_share=1.0, cpu_volt_min=0.0, frequencies_mhz=(306.0, 612.0, 918.0, 1300.5),
                                cpu_frequencies_mhz=(345.6, 729.6, 1190.4, 1651.2, 2201.6), emc_frequencies_mhz=(665.6, 2133.0, 3199.0))
    works = [StepWork("host-heavy", 0.01, 0.05, 0.04, 1e9, 4.0, 12.0), StepWork("gpu-heavy", 0.002, 0.01, 0.2, 8e9, 2.5, 20.0)]
    lines = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j"]
    for w in works:
        for g in board.frequencies_mhz:
            for c in board.cpu_frequencies_mhz:
                for m in board.emc_frequencies_mhz:
                    e = estimate_work(w, Setting(g, c, m), board)
                    lines.append(f"{w.key},{g},{c},{m},{e.time_s!r},{e.energy_total_j!r}")
    path = tmp_path / "known-board.csv"
    path.write_text("\n".join(lines) + "\n")
    fit = fit_grid(read_grid(path), OrinTwinParams(), "fit-known", "lab", share=0.3, seed=1)
    assert fit.judged.overall["energy"].max < 1e-3 and fit.judged.overall["time"].max < 1e-3
    assert fit.params.cpu_bound_share == pytest.approx(0.9, abs=0.01) and fit.params.cpu_reserved_mhz == pytest.approx(30.0, abs=1.0)
    assert [w.key for w in fit.work] == ["host-heavy", "gpu-heavy"] and len(fit.split.fitted) == round(0.3 * 60)


def test_the_shipped_xavier_twin_loads_and_reproduces_its_reported_error():
    """The fitted board loads through the twin's params loader, and with its work file it gives, on the grid's judged
    settings, exactly the errors the file reports (overall, per workload, per domain)."""
    from dvfs_mlops.hw.twin.fit import grid_errors, grid_settings, load_grid_work, split_settings

    board = load_twin_params(None, XAVIER_BOARD)
    shipped = load_grid_work(XAVIER_WORK)
    grid = read_grid(BOFL)
    assert board.profile == "twin-bofl-agx-xavier" and board.family == "jetson-agx-xavier" and shipped.board == XAVIER_BOARD.name
    assert shipped.grid_sha256 == grid.sha256 and [w.key for w in shipped.work] == list(grid.workloads)
    assert (board.frequencies_mhz, board.cpu_frequencies_mhz, board.emc_frequencies_mhz) == (grid.gpu_mhz, grid.cpu_mhz, grid.emc_mhz)
    split = split_settings(grid_settings(grid), shipped.share, shipped.seed)
    got = grid_errors(grid, board, shipped.work, split.judged).to_dict()
    reported = shipped.errors_judged
    assert got["n"] == reported["n"] == len(split.judged) * len(grid.workloads)
    for section in ("workloads", "domains"):
        assert set(got[section]) == set(reported[section])
    for table, want in [(got["overall"], reported["overall"]), *((got["workloads"][w], reported["workloads"][w]) for w in grid.workloads),
                        *((got["domains"][d], reported["domains"][d]) for d in reported["domains"])]:
        for quantity in ("time", "power", "energy"):
            assert table[quantity]["mean_rel"] == pytest.approx(want[quantity]["mean_rel"], rel=1e-9)
            assert table[quantity]["max_rel"] == pytest.approx(want[quantity]["max_rel"], rel=1e-9)
    # the twin drives the same clocks the grid measured: a step at the grid's top is the work file's own estimate
    top = estimate_work(shipped.work[0], grid.top, board)
    assert top.time_s > 0 and top.cpu_mhz == grid.top.cpu_mhz and top.emc_mhz == grid.top.emc_mhz


def test_twin_fit_finds_the_cpu_bound_share_from_points_below_the_cpu_top(trace_cache_dir):
    """Points of a joint sweep (some at lower CPU clocks) on a board whose host is 60 % CPU-bound: the timing fit adds
    cpu_bound_share to what it fits and finds it; a GPU-only sweep leaves it alone."""
    from dvfs_mlops.hw.twin.fit import FitPoint, fit_profile

    cache = TraceCache(trace_cache_dir)
    board = dataclasses.replace(OrinTwinParams(), profile="board-cpu", cpu_bound_share=0.6)
    traces = [cache.get(PRESETS[m].config(), 16, 13) for m in ("bert-tiny", "bert-mini")]
    points = []
    for trace in traces:
        for f in (306.0, 816.0, 1300.5):
            for c in (None, 729.6, 1497.6):
                e = estimate_step(trace, Setting(f, c, None), board)
                points.append(FitPoint(trace.key, f, ((trace, 10),), 10 * e.time_s, e.energy_j / e.time_s, cpu_mhz=c))
    start = dataclasses.replace(board, cpu_bound_share=1.0)
    fit = fit_profile(points, start, "fit-cpu", fit_power=False)
    assert "cpu_bound_share" in fit.fitted and fit.params.cpu_bound_share == pytest.approx(0.6, rel=0.02)
    assert fit.errors["time"].mean < 0.01
    gpu_only = fit_profile([pt for pt in points if pt.cpu_mhz is None], start, "fit-gpu", fit_power=False)
    assert "cpu_bound_share" not in gpu_only.fitted and gpu_only.params.cpu_bound_share == 1.0
