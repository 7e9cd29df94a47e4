from __future__ import annotations

import time

import pytest

from dvfs_mlops.errors import (
    DeviceNotFoundError,
    DevicePermissionError,
    UnknownNameError,
)
from dvfs_mlops.hw import open_device, restore_journals
from dvfs_mlops.hw.guard import list_journals
from dvfs_mlops.hw.nvml import NvmlDevice
from testkit.fakes.fake_pynvml import FakeGPU, make_module


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
    from dvfs_mlops.hw.guard import Journal, write_journal

    m = make_module()
    m._gpus[0].locked = (900, 900)
    write_journal(Journal("nvml", "nvml-0", 999999, 0.0, {"index": 0, "action": "reset_locked_clocks"}, "900"), state_dir)
    said = []
    assert restore_journals(announce=said.append, nvml_module=m) == 1
    assert m._gpus[0].locked is None and "restored nvml-0" in said[0]


def test_observe_writes_nothing_and_takes_no_lock(state_dir):
    m = make_module()
    with NvmlDevice(nvml=m, sample_hz=200).session(900, observe=True) as s:
        time.sleep(0.05)
    assert m._gpus[0].calls == [] and not list(state_dir.iterdir())
    r = s.report()
    assert r.clock_held is None and r.clock_mhz_measured == 1410 and r.energy_j > 0


def test_maxn_writes_nothing_and_an_admin_lock_stays():
    m = make_module()
    gpu = m._gpus[0]
    gpu.locked = (1005, 1005)  # an administrator locked the clocks
    with NvmlDevice(nvml=m, sample_hz=200).session("maxn") as s:
        time.sleep(0.02)
    assert gpu.calls == [] and gpu.locked == (1005, 1005)
    assert s.report().clock_mhz_measured == 1005 and s.report().clock_held is None


def test_pinned_session_refuses_over_an_admin_lock_before_any_write(state_dir):
    from dvfs_mlops.errors import DvfsError

    m = make_module()
    gpu = m._gpus[0]
    gpu.locked = (1005, 1005)
    with pytest.raises(DvfsError, match="already locked"), NvmlDevice(nvml=m).session(900):
        pass
    assert gpu.calls == [] and gpu.locked == (1005, 1005) and list_journals(state_dir) == []


def test_capped_clock_does_not_hold():
    m = make_module()
    m._gpus[0].cap_mhz = 600  # power/thermal capping below the lock
    with NvmlDevice(nvml=m, sample_hz=200).session(1200) as s:
        time.sleep(0.05)
    assert s.report().clock_mhz_measured == pytest.approx(600) and s.report().clock_held is False
    with NvmlDevice(nvml=make_module(), sample_hz=200).session(1200) as s:
        time.sleep(0.05)
    assert s.report().clock_held is True


def test_windows_use_the_energy_counter_difference():
    m = make_module([FakeGPU(power_mw=100_000)])
    with NvmlDevice(nvml=m, sample_hz=100).session(900) as s:
        time.sleep(0.02)
        with s.window("train"):
            time.sleep(0.2)
        time.sleep(0.05)
    train, whole = s.report(), s.session_report()
    assert train is s.windows["train"]
    assert train.energy_j == pytest.approx(100.0 * train.duration_s, rel=0.1)  # 100 W for the window only
    assert whole.energy_j > train.energy_j


def test_close_shuts_nvml_down_once_and_uuid_names_the_gpu():
    m = make_module()
    dev = NvmlDevice(nvml=m)
    assert dev.device_id.startswith("GPU-") and dev.torch_device == "cuda:0"  # no CUDA torch here: the NVML index
    dev.close()
    dev.close()
    assert m._shutdowns == 1


def test_gpu_index_picks_the_gpu():
    m = make_module([FakeGPU(name="NVIDIA L4"), FakeGPU(name="NVIDIA H100")])
    dev = open_device("nvml", nvml_module=m, gpu_index=1)
    assert dev.gpu_name == "NVIDIA H100" and dev.device_key == "nvml-1" and dev.torch_device == "cuda:1"
    with pytest.raises(DeviceNotFoundError, match=r"--gpu-index 0\.\.1"):
        open_device("nvml", nvml_module=m, gpu_index=2)
