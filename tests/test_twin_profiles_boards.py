"""The twin's profiles for the Orin modules people own: each is its board (family, table, cores, bandwidth), runs the
study's workloads, and a params file keeps its base's family."""
from __future__ import annotations

import dataclasses

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import board_family, board_of, legacy_board
from dvfs_mlops.hw.jetson import ORIN_MODULE_PROFILES, SUPER_SUFFIX
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.params import CPU_EMC_FIELDS
from dvfs_mlops.hw.twin.profiles import _MODULES, BUILTIN_PROFILES, builtin_profile, load_twin_params, twin_digest

MODULES = sorted(_MODULES)


def test_every_agx_orin_64gb_profile_keeps_its_family():
    for name in ("sim-orin", "sim-orin-measured"):
        assert builtin_profile(name).family == "jetson-agx-orin-64gb" == board_family(name)
        assert board_of(SimDevice(builtin_profile(name))).family == "jetson-agx-orin-64gb"


@pytest.mark.parametrize("name", MODULES)
def test_module_profile_is_the_board_it_names(name):
    p, m = builtin_profile(name), _MODULES[name]
    # the family a real module of that kind gets from its P-number (hw/jetson.py), -super on a Super device tree
    assert p.family.removesuffix(SUPER_SUFFIX) in set(ORIN_MODULE_PROFILES.values())
    assert p.max_mhz == m.gpu_max_mhz and p.cuda_cores == 128 * m.sms and p.dram_bw_bytes_s == m.dram_bw_gb_s * 1e9
    agx = set(BUILTIN_PROFILES["sim-orin"].frequencies_mhz)
    assert set(p.frequencies_mhz) - agx <= {m.gpu_max_mhz} and list(p.frequencies_mhz) == sorted(p.frequencies_mhz)
    # the same silicon's voltage curve, read up to this module's ceiling
    agx_volts = BUILTIN_PROFILES["sim-orin-measured"]
    assert [p.voltage(f) for f in p.frequencies_mhz] == pytest.approx([agx_volts.voltage(f) for f in p.frequencies_mhz])
    board = board_of(SimDevice(p))
    assert (board.family, board.profile, board.frequencies_mhz) == (p.family, name, tuple(p.frequencies_mhz))
    assert board.voltage_shape_known and twin_digest(p) == ""
    assert legacy_board(name, []).family == p.family == board_family(name)


def test_unknown_profile_names_every_valid_one():
    with pytest.raises(DvfsError) as e:
        builtin_profile("sim-orin-nano")
    message = str(e.value)
    assert "valid twin profiles: " + ", ".join(BUILTIN_PROFILES) in message


def test_params_file_inherits_its_base_family_unless_it_names_one(tmp_path):
    f = tmp_path / "nano.yaml"
    f.write_text("gpu_k: 12\n")
    p = load_twin_params("sim-orin-nano-8gb", f)
    assert p.profile.startswith("sim-orin-nano-8gb+") and p.family == "jetson-orin-nano-8gb"
    assert board_of(SimDevice(p)).family == "jetson-orin-nano-8gb" == board_family(p.profile)
    f.write_text("gpu_k: 12\nfamily: my-lab-board\n")
    named = load_twin_params("sim-orin-nano-8gb", f)
    assert named.family == "my-lab-board" and board_of(SimDevice(named)).family == "my-lab-board"
    assert named.profile != p.profile  # another family is another board
    f.write_text("family: ''\n")
    with pytest.raises(DvfsError, match="family must be a non-empty name"):
        load_twin_params("sim-orin", f)


def test_a_params_file_on_the_agx_twin_keeps_its_name(tmp_path):
    """Twins built on sim-orin before profiles named a family keep their digest (their sweeps' identity)."""
    f = tmp_path / "b.yaml"
    f.write_text("gpu_k: 20\n")
    p = load_twin_params(None, f)
    fields = dataclasses.asdict(p)
    fields.pop("family")
    for key in CPU_EMC_FIELDS:  # at a built-in profile's values they stay out of the digest (params_digest)
        fields.pop(key)
    import hashlib
    import json

    fields.pop("profile")
    fields["frequencies_mhz"] = list(p.frequencies_mhz)
    assert p.profile == "sim-orin+" + hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]


@pytest.fixture(scope="module")
def module_reports(trace_cache_dir):
    from dvfs_mlops.hw.twin.trace import TraceCache
    from testkit.calibration import calibrate

    cache = TraceCache(trace_cache_dir)
    return {name: calibrate(builtin_profile(name), cache=cache) for name in ["sim-orin-measured", *MODULES]}


@pytest.mark.parametrize("name", MODULES)
def test_study_workloads_run_on_every_module(module_reports, name):
    """The paper preset's models on the characterisation tasks: finite curves on the module's own table, MAXN settles on
    it, bert-large's whole-board power stays inside the module's published budget, and the smaller GPU is slower."""
    p, report, agx = builtin_profile(name), module_reports[name], module_reports["sim-orin-measured"]
    for pt in report.points:
        assert set(pt.energy_by_freq_j) == set(p.frequencies_mhz) and all(e > 0 for e in pt.energy_by_freq_j.values())
        assert pt.maxn_mhz in p.frequencies_mhz and pt.optimal_mhz in p.frequencies_mhz
    s = report.summary()
    assert 0 < s["bert_large_maxn_power_w"] <= _MODULES[name].max_power_w
    assert s["bert_large_maxn_power_w"] < agx.summary()["bert_large_maxn_power_w"]
    assert s["compute_bound_time_ratio"] > 1.0  # time still falls with the clock on the module's own table


# -- the twin's rails follow the real module's rail plan (issue 42 item 6) -----------------------------------------------
def _one_point(profile: str, freq: str = "816"):
    from dvfs_mlops.hw.twin.physics import energy_curve, estimate_maxn
    from dvfs_mlops.hw.twin.trace import capture_step_trace
    from dvfs_mlops.job.workloads.zoo import resolve_model

    trace = capture_step_trace(resolve_model("bert-tiny").config, batch_size=4, seq_len=32)
    dev = SimDevice(builtin_profile(profile))
    with dev.session(freq, label="rails") as s:
        for _ in range(3):
            s.step(trace)
    curve = energy_curve(trace, dev.params)
    est = estimate_maxn(trace, dev.params, curve) if freq == "maxn" else curve[float(freq)]
    return s, est


@pytest.mark.parametrize("profile", ["sim-orin", "sim-orin-measured", "sim-orin-32gb"])
def test_agx_orin_twins_keep_every_figure_and_count_no_rail_twice(profile):
    """energy_j and energy_total_j are what the twin's physics gives (its four terms), so no figure of an AGX Orin twin
    changes; the total is VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 with the DRAM inside VIN_SYS_5V0, which feeds it."""
    for freq in ("816", "maxn"):
        s, est = _one_point(profile, freq)
        r, scale = s.report(), 3 * s.time_factor * s.power_factor
        assert r.energy_rails == ("VDD_GPU_SOC", "VDD_CPU_CV") and r.total_rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
        assert r.energy_j == pytest.approx(est.energy_j * scale, rel=1e-12)
        assert r.energy_total_j == pytest.approx(est.energy_total_j * scale, rel=1e-12)
        rails = r.energy_by_rail_j
        assert rails["VIN_SYS_5V0"] > rails["VDDQ_VDD2_1V8AO"] > 0
        assert r.energy_gpu_j == pytest.approx(rails["VDD_GPU_SOC"]) and r.energy_cpu_j == pytest.approx(rails["VDD_CPU_CV"])


@pytest.mark.parametrize("profile", ["sim-orin-nx-16gb", "sim-orin-nx-8gb", "sim-orin-nano-8gb", "sim-orin-nano-8gb-super"])
def test_orin_nx_and_nano_twins_report_their_modules_rails(profile):
    s, est = _one_point(profile, "612")
    r, scale = s.report(), 3 * s.time_factor * s.power_factor
    assert set(r.energy_by_rail_j) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert r.energy_rails == ("VDD_CPU_GPU_CV", "VDD_SOC") and r.total_rails == ("VDD_IN",) and r.cpu_gpu_combined
    # CPU, GPU, CV and SoC, as on the AGX Orin twin; the total is the module's input rail alone
    assert r.energy_j == pytest.approx(est.energy_j * scale, rel=1e-12)
    assert r.energy_total_j == pytest.approx(est.energy_total_j * scale, rel=1e-12) == pytest.approx(r.energy_by_rail_j["VDD_IN"])
    assert r.energy_gpu_j is None and r.energy_cpu_j is None
    assert board_of(SimDevice(builtin_profile(profile))).rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
    assert SimDevice(builtin_profile(profile)).info().rails == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
