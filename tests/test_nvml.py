from __future__ import annotations

import time

import pytest

from dvfs_mlops.device import open_device, restore_journals
from dvfs_mlops.device.guard import list_journals
from dvfs_mlops.device.nvml import NvmlDevice
from dvfs_mlops.errors import (
    DeviceNotFoundError,
    DevicePermissionError,
    UnknownNameError,
)
from tests.fakes.fake_pynvml import FakeGPU, make_module


def test_table_is_ascending_unique_mhz():
    dev = NvmlDevice(nvml=make_module())
    table = dev.frequencies_mhz
    assert table == sorted(set(table)) and table[0] == 210 and table[-1] == 1410


def test_lock_and_reset(state_dir):
    m = make_module()
    gpu = m._gpus[0]
    dev = NvmlDevice(nvml=m)
    with dev.session(1005):
        assert gpu.locked == (1005, 1005)
        assert len(list_journals(state_dir)) == 1
    assert gpu.locked is None
    assert gpu.calls == [("lock", 1005, 1005), ("reset",)]
    assert list_journals(state_dir) == []


def test_restore_after_exception():
    m = make_module()
    with pytest.raises(ValueError), NvmlDevice(nvml=m).session(900):
        raise ValueError("x")
    assert m._gpus[0].locked is None


def test_energy_counter_used():
    m = make_module([FakeGPU(power_mw=200_000)])
    with NvmlDevice(nvml=m, sample_hz=20).session(1200) as s:
        time.sleep(0.5)
    r = s.report()
    assert r.energy_j == pytest.approx(200 * r.duration_s, rel=0.05)
    assert r.energy_by_rail_j.keys() == {"gpu"} and r.gpu_util_pct == 87


def test_power_sampling_when_counter_unsupported():
    m = make_module([FakeGPU(power_mw=100_000, energy_counter=False)])
    with NvmlDevice(nvml=m, sample_hz=50).session("maxn") as s:
        time.sleep(0.4)
    assert s.report().energy_j == pytest.approx(100 * s.report().duration_s, rel=0.02)


def test_permission_error_is_clear_and_resets():
    m = make_module()
    m._gpus[0].permission = False
    with pytest.raises(DevicePermissionError, match="run as root"):
        with NvmlDevice(nvml=m).session(900):
            pass


def test_invalid_clock_lists_table():
    with pytest.raises(UnknownNameError, match="1410"):
        NvmlDevice(nvml=make_module()).session(1411)


def test_auto_prefers_nvml_over_sim_when_driver_loaded():
    said = []
    dev = open_device("auto", nvml_module=make_module(), announce=said.append)
    assert dev.name == "nvml" and "A100" in said[0]


def test_auto_falls_back_to_sim_without_driver():
    dev = open_device("auto", nvml_module=make_module(driver_loaded=False))
    assert dev.name == "sim" and dev.simulated


def test_explicit_nvml_without_driver_is_an_error():
    with pytest.raises(DeviceNotFoundError, match="driver"):
        open_device("nvml", nvml_module=make_module(driver_loaded=False))


def test_restore_journal_resets_locked_clocks(state_dir):
    from dvfs_mlops.device.guard import Journal, write_journal

    m = make_module()
    m._gpus[0].locked = (900, 900)
    write_journal(Journal("nvml", "nvml-0", 999999, 0.0, {"index": 0, "action": "reset_locked_clocks"}, "900"), state_dir)
    said = []
    assert restore_journals(announce=said.append, nvml_module=m) == 1
    assert m._gpus[0].locked is None and "restored nvml-0" in said[0]
