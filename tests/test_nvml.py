from __future__ import annotations

import time
import types
from typing import Any

import pytest

from dvfs_mlops.errors import (
    DeviceNotFoundError,
    DevicePermissionError,
    DvfsError,
    UnknownNameError,
)
from dvfs_mlops.hw import open_device, restore_journals
from dvfs_mlops.hw.guard import list_journals
from dvfs_mlops.hw.nvml import NvmlDevice
from testkit.fakes import fake_pynvml
from testkit.fakes.fake_pynvml import FakeCuda, FakeGPU, make_module


def test_table_is_ascending_unique_mhz():
    dev = NvmlDevice(nvml=make_module())
    table = dev.frequencies_mhz
    assert table == sorted(set(table)) and table[0] == 210 and table[-1] == 1410


def test_lock_and_reset(state_dir):
    m = make_module()
    gpu = m._gpus[0]
    dev = NvmlDevice(nvml=m, assume_unlocked=True)
    with dev.session(1005):
        assert gpu.locked == (1005, 1005)
        assert len(list_journals(state_dir)) == 1
    assert gpu.locked is None
    assert gpu.calls == [("lock", 1005, 1005), ("reset",)]
    assert list_journals(state_dir) == []


def test_restore_after_exception():
    m = make_module()
    with pytest.raises(ValueError), NvmlDevice(nvml=m, assume_unlocked=True).session(900):
        raise ValueError("x")
    assert m._gpus[0].locked is None


def test_energy_counter_used():
    m = make_module([FakeGPU(power_mw=200_000, energy_period_s=0.01)])
    with NvmlDevice(nvml=m, sample_hz=20, assume_unlocked=True).session(1200) as s:
        time.sleep(0.5)
    r = s.report()
    assert r.energy_j == pytest.approx(200 * r.duration_s, rel=0.05)
    assert r.energy_by_rail_j.keys() == {"gpu"} and r.gpu_util_pct == 87
    assert r.energy_source == "counter" and s.context["energy_source"] == "counter"  # 0.5 s is 50 counter periods


def test_power_sampling_when_counter_unsupported():
    m = make_module([FakeGPU(power_mw=100_000, energy_counter=False)])
    with NvmlDevice(nvml=m, sample_hz=50).session("maxn") as s:
        time.sleep(0.4)
    assert s.report().energy_j == pytest.approx(100 * s.report().duration_s, rel=0.02)


def test_permission_error_is_clear_and_resets():
    m = make_module()
    m._gpus[0].permission = False
    with pytest.raises(DevicePermissionError, match="run as root"):
        with NvmlDevice(nvml=m, assume_unlocked=True).session(900):
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
    m = make_module()
    gpu = m._gpus[0]
    gpu.locked = (1005, 1005)
    with pytest.raises(DvfsError, match="already locked"), NvmlDevice(nvml=m).session(900):
        pass
    assert gpu.calls == [] and gpu.locked == (1005, 1005) and list_journals(state_dir) == []


def test_capped_clock_does_not_hold():
    m = make_module()
    m._gpus[0].cap_mhz = 600  # power/thermal capping below the lock
    with NvmlDevice(nvml=m, sample_hz=200, assume_unlocked=True).session(1200) as s:
        time.sleep(0.05)
    assert s.report().clock_mhz_measured == pytest.approx(600) and s.report().clock_held is False
    with NvmlDevice(nvml=make_module(), sample_hz=200, assume_unlocked=True).session(1200) as s:
        time.sleep(0.05)
    assert s.report().clock_held is True


def test_windows_use_the_energy_counter_difference():
    m = make_module([FakeGPU(power_mw=100_000, energy_period_s=0.005)])
    with NvmlDevice(nvml=m, sample_hz=100, assume_unlocked=True).session(900) as s:
        time.sleep(0.02)
        with s.window("train"):
            time.sleep(0.2)
        time.sleep(0.05)
    train, whole = s.report(), s.session_report()
    assert train is s.windows["train"] and train.energy_source == "counter"
    assert train.energy_j == pytest.approx(100.0 * train.duration_s, rel=0.1)  # 100 W for the window only
    assert whole.energy_j > train.energy_j


# -- a counter that advances in steps (issue 42 item 5; Zeus: NVML counters "can update as slow as 10 Hz") --------------
def test_the_counters_update_period_is_inferred_once_as_zeus_does():
    from dvfs_mlops.hw.meter import infer_update_period

    gpu = FakeGPU(energy_period_s=0.05)
    m = make_module([gpu])
    dev = NvmlDevice(nvml=m)
    assert dev.counter_period_s() == pytest.approx(0.05, abs=0.012)
    gpu.energy_period_s = 0.2  # inferred once per device: a later session does not wait for it again
    assert dev.counter_period_s() == pytest.approx(0.05, abs=0.012)
    assert infer_update_period(lambda: 7, limit_s=0.05) is None  # a value that never changes: no period
    once = time.monotonic() + 0.02
    assert infer_update_period(lambda: time.monotonic() > once, limit_s=0.05) == 0.05  # one change: at least the limit


def test_a_window_shorter_than_a_few_counter_periods_is_integrated_from_the_power_samples():
    """A 100 ms counter step over a 0.25 s window: its difference reads 20 or 30 J for 25 J, so the samples are used."""
    m = make_module([FakeGPU(power_mw=100_000, energy_period_s=0.1)])
    with NvmlDevice(nvml=m, sample_hz=100, assume_unlocked=True).session(900) as s:
        with s.window("warmup"):
            time.sleep(0.25)
        with s.window("train"):
            time.sleep(0.25)
    for name in ("warmup", "train"):
        r = s.windows[name]
        assert r.energy_source == "samples" and r.energy_j == pytest.approx(100.0 * r.duration_s, rel=0.03)
    assert s.context["energy_source"] == "samples" and s.context["energy_counter_period_s"] == pytest.approx(0.1, abs=0.02)


def test_a_counter_that_does_not_advance_is_not_trusted():
    gpu = FakeGPU(power_mw=150_000, energy_period_s=0.01)
    gpu.energy_stalled = True
    m = make_module([gpu])
    with NvmlDevice(nvml=m, sample_hz=100, assume_unlocked=True).session(900) as s:
        time.sleep(0.4)
    r = s.report()
    assert r.energy_source == "samples" and r.energy_j == pytest.approx(150.0 * r.duration_s, rel=0.03)
    assert "energy_counter_period_s" not in s.context


def test_a_counter_that_stops_mid_run_falls_back_to_the_samples():
    gpu = FakeGPU(power_mw=150_000, energy_period_s=0.01)
    m = make_module([gpu])
    with NvmlDevice(nvml=m, sample_hz=100, assume_unlocked=True).session(900) as s:
        gpu.energy_stalled = True  # after the period was inferred
        with s.window("train"):
            time.sleep(0.3)
    r = s.report()
    assert r.energy_source == "samples" and r.energy_j == pytest.approx(150.0 * r.duration_s, rel=0.03)


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


# ---- issue 31, item 1: the GPU that trains is the GPU pinned and metered (CUDA device <-> NVML GPU by UUID) ----------

A, B, C = ("GPU-aaaa1111-8a1d-4c3b-9f6e-2d7a5b4c3e10", "GPU-bbbb2222-8a1d-4c3b-9f6e-2d7a5b4c3e10",
           "GPU-aaab3333-8a1d-4c3b-9f6e-2d7a5b4c3e10")  # A and C share the prefix GPU-aaa: "GPU-aaa" names neither alone
FASTEST_FIRST = [2, 0, 1]  # CUDA's default order on this box: NVML GPU 2 is the fastest, so it is CUDA's physical 0


def _three_gpus() -> Any:
    return make_module([FakeGPU(name="NVIDIA A100", uuid=A), FakeGPU(name="NVIDIA A100", uuid=B), FakeGPU(name="NVIDIA H100", uuid=C)])


def _cuda(monkeypatch, m, visible: str | None, order: str = "FASTEST_FIRST", **kw) -> FakeCuda:
    """A CUDA build of torch on the fake GPUs, CUDA_VISIBLE_DEVICES=`visible` (None: unset); no --torch-device override."""
    monkeypatch.delenv("DVFS_TORCH_DEVICE", raising=False)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return FakeCuda(m, fastest_first=FASTEST_FIRST, device_order=order, **kw).install(monkeypatch)


@pytest.mark.parametrize(("visible", "order", "expected"), [
    (None, "FASTEST_FIRST", {0: "cuda:1", 1: "cuda:2", 2: "cuda:0"}),  # every GPU, fastest first
    ("2,1", "FASTEST_FIRST", {0: "cuda:1", 1: "cuda:0", 2: None}),  # CUDA's physical 2 and 1: NVML GPUs 1 and 0
    ("0,2", "PCI_BUS_ID", {0: "cuda:0", 1: None, 2: "cuda:1"}),  # CUDA_DEVICE_ORDER=PCI_BUS_ID: indices in bus order
    ("1,-1,0", "FASTEST_FIRST", {0: "cuda:0", 1: None, 2: None}),  # an invalid index hides itself and what follows
    (f"{B},{C}", "FASTEST_FIRST", {0: None, 1: "cuda:0", 2: "cuda:1"}),  # full UUIDs, in the order given
    ("GPU-bbbb,GPU-aaab", "FASTEST_FIRST", {0: None, 1: "cuda:0", 2: "cuda:1"}),  # abbreviated UUIDs
    ("GPU-aaab,GPU-aaa,GPU-bbbb", "FASTEST_FIRST", {0: None, 1: None, 2: "cuda:0"}),  # an ambiguous prefix ends the list
], ids=["unset", "indices", "pci-bus-order", "invalid-index", "uuids", "uuid-prefixes", "ambiguous-prefix"])
def test_the_cuda_device_is_the_one_with_the_gpus_uuid(monkeypatch, visible, order, expected):
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.placement import TorchDeviceError

    m = _three_gpus()
    _cuda(monkeypatch, m, visible, order)
    for index, want in expected.items():
        dev = NvmlDevice(index=index, nvml=m, assume_unlocked=True)
        if want is not None:
            assert dev.torch_device == want and board_of(dev).torch_device == want
            continue
        with pytest.raises(TorchDeviceError) as e:
            board_of(dev)  # where every command resolves its board, before any clock
        msg = str(e.value)
        assert f"GPU {index}" in msg and dev.device_id in msg and f"CUDA_VISIBLE_DEVICES={visible!r}" in msg and "\n" not in msg
        assert m._gpus[index].calls == []


def test_cuda_visible_devices_2_on_a_three_gpu_box_pins_nothing_on_gpu_0(monkeypatch):
    """Issue 31: --gpu-index 0 with CUDA_VISIBLE_DEVICES=2 trained on physical GPU 2 while GPU 0 was pinned and metered."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.placement import TorchDeviceError

    m = _three_gpus()
    _cuda(monkeypatch, m, "2", order="PCI_BUS_ID")
    dev = open_device("nvml", nvml_module=m, gpu_index=0)
    with pytest.raises(TorchDeviceError, match=r"GPU 0 .*cuda:0 is NVML GPU 2.*--gpu-index 2"):
        board_of(dev)
    assert all(g.calls == [] for g in m._gpus)
    assert board_of(open_device("nvml", nvml_module=m, gpu_index=2)).torch_device == "cuda:0"


def test_a_gpu_in_mig_mode_is_its_mig_devices_cuda_device(monkeypatch):
    m = _three_gpus()
    migs = m._gpus[1].enable_mig(2)
    _cuda(monkeypatch, m, "MIG-" + migs[1].uuid.split("-")[1])  # CUDA names MIG devices by MIG UUID (or a prefix)
    dev = NvmlDevice(index=1, nvml=m)
    assert dev.torch_device == "cuda:0"  # torch reports the MIG UUID, which is one of NVML GPU 1's MIG devices


def test_without_uuids_from_torch_only_uuid_entries_tell_the_device(monkeypatch):
    from dvfs_mlops.hw.placement import TorchDeviceError

    m = _three_gpus()
    _cuda(monkeypatch, m, "GPU-aaab,GPU-aaaa", report_uuid=False)
    assert NvmlDevice(index=0, nvml=m).torch_device == "cuda:1"  # entry 1 names A alone: visible devices keep that order
    _cuda(monkeypatch, m, "1,0", report_uuid=False)  # indices are CUDA's fastest-first order: not NVML's
    with pytest.raises(TorchDeviceError, match="fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        _ = NvmlDevice(index=0, nvml=m).torch_device


class _ModelOn:
    """A stand-in for a Trainer's model: its parameters sit on `where`."""

    def __init__(self, where: str):
        import torch

        self.where = torch.device(where)

    def parameters(self) -> Any:
        return iter([types.SimpleNamespace(device=self.where)])


def test_dvfs_callback_compares_the_uuid_of_the_cuda_device_the_model_is_on(monkeypatch):
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.placement import TorchDeviceError
    from dvfs_mlops.integrations.transformers import DvfsCallback

    m = _three_gpus()
    _cuda(monkeypatch, m, None)
    dev = NvmlDevice(index=0, nvml=m)  # GPU A, CUDA's cuda:1 (fastest-first)
    cb = DvfsCallback(device=dev)
    cb.device, cb.board = dev, board_of(dev)
    assert cb.board.torch_device == "cuda:1"
    cb._check_placement(_ModelOn("cuda:1"))  # the model trains on A: fine
    with pytest.raises(TorchDeviceError, match=r"the model is on cuda:0 \(aaab3333-.*\) but the nvml backend pins and meters GPU-aaaa1111"):
        cb._check_placement(_ModelOn("cuda:0"))  # same device type, another GPU (C)
    assert all(g.calls == [] for g in m._gpus)


# ---- item 2: never remove a lock the session did not set ------------------------------------------------------------

def test_an_lgc_lock_reads_no_event_reason_and_is_never_reset(state_dir):
    m = make_module()
    gpu = m._gpus[0]
    gpu.locked = (915, 915)  # an administrator ran nvidia-smi -lgc 915
    dev = NvmlDevice(nvml=m)
    assert dev.clocks_event_reasons() == 0 and dev.current_mhz() == 915  # CUDA.jl's GPU: 915 MHz, every reason clear
    assert dev.clocks_locked() is None  # NVML cannot tell
    with pytest.raises(DvfsError, match=r"cannot tell whether .* already locked.*--assume-unlocked"), dev.session(900):
        pass
    with dev.session("maxn", observe=False) as s:  # maxn writes nothing; a refine that would move the clock refuses
        with pytest.raises(DvfsError, match="--assume-unlocked"):
            s.repin(900)
    assert gpu.calls == [] and gpu.locked == (915, 915) and list_journals(state_dir) == []


@pytest.mark.parametrize(("running", "getters"), [(True, True), (False, True), (True, False)],
                         ids=["busy", "idle", "busy-no-getters"])
def test_application_clocks_are_refused_even_with_the_opt_in(state_dir, running, getters):
    m = make_module()
    gpu = m._gpus[0]
    gpu.app_clock_mhz, gpu.running, gpu.app_clocks_api = 1200, running, getters  # nvidia-smi -ac 1215,1200
    dev = NvmlDevice(nvml=m, assume_unlocked=True)
    # the applications clock differs from its default; busy: the ApplicationsClocksSetting reason too (all there is where
    # the getters do not answer); idle: GpuIdle instead
    expected = m.nvmlClocksEventReasonApplicationsClocksSetting if running else m.nvmlClocksEventReasonGpuIdle
    assert dev.clocks_event_reasons() == expected and dev.clocks_locked() is True
    with pytest.raises(DvfsError, match=r"application clocks, nvidia-smi -ac.*-rac"), dev.session(900):
        pass
    assert gpu.calls == [] and gpu.app_clock_mhz == 1200 and list_journals(state_dir) == []


def test_an_unlocked_gpu_is_pinned_only_with_the_opt_in(state_dir):
    m = make_module()
    gpu = m._gpus[0]
    with pytest.raises(DvfsError, match="--assume-unlocked"), NvmlDevice(nvml=m).session(900):
        pass
    assert gpu.calls == []
    with NvmlDevice(nvml=m, assume_unlocked=True).session(900):
        assert gpu.locked == (900, 900) and len(list_journals(state_dir)) == 1
    assert gpu.calls == [("lock", 900, 900), ("reset",)] and gpu.locked is None


@pytest.mark.parametrize(("setup", "reasons", "clock"), [
    (lambda g: setattr(g, "running", False), ["GpuIdle"], 210),
    (lambda g: setattr(g, "app_clock_mhz", 1095), ["ApplicationsClocksSetting"], 1095),
    (lambda g: setattr(g, "power_cap_mhz", 1005), ["SwPowerCap"], 1005),
    (lambda g: setattr(g, "hw_slowdown", "thermal"), ["HwSlowdown", "HwThermalSlowdown"], 705),
    (lambda g: setattr(g, "hw_slowdown", "power_brake"), ["HwSlowdown", "HwPowerBrakeSlowdown"], 705),
    (lambda g: setattr(g, "sync_boost_mhz", 1305), ["SyncBoost"], 1305),
    (lambda g: setattr(g, "cap_mhz", 990), ["SwThermalSlowdown"], 990),
    (lambda g: setattr(g, "display_clock_mhz", 1350), ["DisplayClockSetting"], 1350),
    (lambda g: setattr(g, "locked", (915, 915)), [], 915),
], ids=["idle", "app-clocks", "sw-power-cap", "hw-thermal", "hw-power-brake", "sync-boost", "sw-thermal", "display", "lgc"])
def test_the_fake_reports_each_event_reason_as_nvml_documents_it(setup, reasons, clock):
    m = make_module()
    setup(m._gpus[0])
    dev = NvmlDevice(nvml=m)
    expected = 0
    for name in reasons:
        expected |= getattr(m, f"nvmlClocksEventReason{name}")
    assert dev.clocks_event_reasons() == expected and dev.current_mhz() == clock


# ---- item 9: instantaneous power where the GPU has it; MIG mode --------------------------------------------------------

def test_power_samples_read_the_instantaneous_field():
    m = make_module([FakeGPU(power_mw=100_000)])
    dev = NvmlDevice(nvml=m)
    m._gpus[0].power_mw = 300_000  # a step in the draw: the 1 s average of nvmlDeviceGetPowerUsage still reads ~100 W
    assert dev.power_w() == pytest.approx(300.0) and dev.power_source == "instant"
    with dev.session("maxn", observe=True) as s:
        pass
    assert s.context["power_source"] == "instant"


@pytest.mark.parametrize(("arch", "source"), [("AMPERE", "average_1s"), ("TURING", "instant")])
def test_without_the_field_the_power_series_says_what_it_is(arch, source):
    m = make_module([FakeGPU(power_mw=100_000, architecture=getattr(fake_pynvml, f"NVML_DEVICE_ARCH_{arch}"), ga100=False)])
    m._gpus[0].instant_power = False  # a driver that does not answer NVML_FI_DEV_POWER_INSTANT
    dev = NvmlDevice(nvml=m)
    m._gpus[0].power_mw = 300_000
    assert dev.power_source == source
    assert (dev.power_w() < 150) if source == "average_1s" else dev.power_w() == pytest.approx(300.0)
    with dev.session("maxn", observe=True) as s:
        pass
    assert s.context["power_source"] == source
    # the board record says how long each sample already averages (refine's noise estimate batches by it)
    from dvfs_mlops.hw.board import board_of

    assert board_of(dev, "cpu").power_average_s == (1.0 if source == "average_1s" else 0.0)


def test_mig_mode_refuses_to_pin_and_observe_meters_the_whole_gpu(state_dir):
    m = make_module()
    gpu = m._gpus[0]
    gpu.enable_mig(2)
    dev = NvmlDevice(nvml=m, assume_unlocked=True)
    with pytest.raises(DvfsError, match=r"MIG mode.*every MIG tenant's clock"), dev.session(900):
        pass
    assert gpu.calls == [] and list_journals(state_dir) == []
    with dev.session(900, observe=True) as s:
        time.sleep(0.02)
    assert s.context["mig_mode"] == "enabled" and s.context["energy_scope"] == "whole_gpu" and s.report().energy_j > 0
    assert gpu.calls == []


# ---- item 10 (NVML): journals restore by UUID --------------------------------------------------------------------------

X, Y, Z = ("GPU-0000aaaa-1111-4c3b-9f6e-2d7a5b4c3e10", "GPU-0000bbbb-1111-4c3b-9f6e-2d7a5b4c3e10",
           "GPU-0000cccc-1111-4c3b-9f6e-2d7a5b4c3e10")


def _journal_for_x_at_index_0(state_dir) -> None:
    from dvfs_mlops.hw.guard import Journal, write_journal

    write_journal(Journal("nvml", "nvml-0", 999999, 0.0, {"index": 0, "uuid": X, "action": "reset_locked_clocks"}, "900"), state_dir)


def _x_moved_to_index_2() -> Any:
    m = make_module([FakeGPU(uuid=Y), FakeGPU(uuid=Z), FakeGPU(uuid=X)])  # a GPU was added, or NVML's order changed
    m._gpus[2].locked = (900, 900)  # X: still pinned by the killed run
    m._gpus[0].locked = (1005, 1005)  # Y, now NVML GPU 0: an administrator's lock
    return m


def test_restore_resets_the_journals_gpu_by_uuid_not_by_index(state_dir):
    _journal_for_x_at_index_0(state_dir)
    m = _x_moved_to_index_2()
    said = []
    assert restore_journals(announce=said.append, nvml_module=m) == 1
    assert m._gpus[2].locked is None and m._gpus[2].calls == [("reset",)]
    assert m._gpus[0].locked == (1005, 1005) and m._gpus[0].calls == [] and "restored nvml-0" in said[0]
    assert list_journals(state_dir) == []


def test_a_session_applies_a_leftover_journal_to_the_journals_gpu(state_dir):
    _journal_for_x_at_index_0(state_dir)
    m = _x_moved_to_index_2()
    with NvmlDevice(index=0, nvml=m).session("maxn"):  # a session on Y, now nvml-0, finds X's journal under nvml-0
        pass
    assert m._gpus[2].locked is None and m._gpus[0].locked == (1005, 1005) and m._gpus[0].calls == []


def test_a_journal_whose_gpu_is_gone_fails_in_one_line_and_is_kept(state_dir):
    from dvfs_mlops.errors import RestoreFailedError

    _journal_for_x_at_index_0(state_dir)
    m = make_module([FakeGPU(uuid=Y), FakeGPU(uuid=Z)])
    m._gpus[0].locked = (1005, 1005)
    with pytest.raises(RestoreFailedError, match=f"no GPU with UUID {X} on this machine.*{Y}.*is kept") as e:
        restore_journals(announce=lambda _m: None, nvml_module=m)
    assert "\n" not in str(e.value) and len(list_journals(state_dir)) == 1
    assert all(g.calls == [] for g in m._gpus) and m._gpus[0].locked == (1005, 1005)


def test_the_cli_pins_an_nvml_gpu_only_with_assume_unlocked(state_dir, monkeypatch):
    import sys

    from click.testing import CliRunner

    from dvfs_mlops.app.cli import main

    m = make_module()
    gpu = m._gpus[0]
    monkeypatch.setitem(sys.modules, "pynvml", m)
    command = ["run", "--device", "nvml", "--freq", "900", "--", sys.executable, "-c", "pass"]
    refused = CliRunner().invoke(main, command)
    assert refused.exit_code == 2 and "--assume-unlocked" in refused.output and gpu.calls == []
    pinned = CliRunner().invoke(main, [*command[:5], "--assume-unlocked", *command[5:]])
    assert pinned.exit_code == 0, pinned.output
    assert gpu.calls == [("lock", 900, 900), ("reset",)] and gpu.locked is None


def test_a_limiting_clock_reason_at_the_start_is_recorded():
    gpu = FakeGPU()
    gpu.cap_mhz, gpu.power_cap_mhz = 1200, 1100  # thermal slowdown, then a lower power cap, hold the clock below its top
    m = make_module([gpu])
    with NvmlDevice(nvml=m, sample_hz=100).session("maxn") as s:
        pass
    assert s.context["clock_limits_at_start"] == "sw_power_cap,sw_thermal_slowdown"
    with NvmlDevice(nvml=make_module([FakeGPU()]), sample_hz=100).session("maxn") as s:
        pass
    assert "clock_limits_at_start" not in s.context


# ---- the memory clock where the GPU offers more than one; no CPU clock --------------------------------------------------
def _memory_gpu(**kw: Any) -> FakeGPU:
    return FakeGPU(name="NVIDIA RTX A6000", mem_clocks=[8001, 5001, 810, 405], **kw)  # several memory clocks


def test_the_memory_clock_is_locked_in_its_own_domain_read_back_and_reset(state_dir):
    m = make_module([_memory_gpu()])
    gpu = m._gpus[0]
    dev = NvmlDevice(nvml=m, sample_hz=100, assume_unlocked=True)
    assert dev.emc_frequencies_mhz == [405.0, 810.0, 5001.0, 8001.0] and dev.cpu_frequencies_mhz == []
    with dev.session(1005, emc_mhz=5001) as s:
        assert gpu.locked == (1005, 1005) and gpu.mem_locked == (5001, 5001)
        assert {j.device_key for _p, j in list_journals(state_dir)} == {"nvml-0", "nvml-0-memory"}
        with s.window("train"):
            time.sleep(0.1)
    assert gpu.locked is None and gpu.mem_locked is None and list_journals(state_dir) == []
    assert gpu.calls == [("lock", 1005, 1005), ("lock_memory", 5001, 5001), ("reset_memory",), ("reset",)]
    r = s.report()
    assert r.emc_mhz == pytest.approx(5001) and r.emc_held is True and s.context["emc_held"] is True


def test_a_gpu_with_one_memory_clock_refuses_a_memory_clock_in_one_line_and_nvml_has_no_cpu_clock(state_dir):
    m = make_module()  # an A100: HBM at one clock, 1215 MHz
    dev = NvmlDevice(nvml=m, assume_unlocked=True)
    assert dev.emc_frequencies_mhz == []
    with pytest.raises(DvfsError) as e:
        dev.session(1005, emc_mhz=1215)
    assert "offers one memory clock (1215 MHz, nvmlDeviceGetSupportedMemoryClocks)" in str(e.value)
    assert "drop --emc-freq" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DvfsError, match=r"NVML sets GPU clocks only.*drop --cpu-freq"):
        dev.session(1005, cpu_mhz=1000)
    assert m._gpus[0].calls == [] and list_journals(state_dir) == []
    with pytest.raises(UnknownNameError, match=r"unknown memory .EMC. clock '5000'"):
        NvmlDevice(nvml=make_module([_memory_gpu()])).session(1005, emc_mhz=5000)


def test_a_memory_lock_left_by_a_dead_run_is_reset_by_restore(state_dir):
    from dvfs_mlops.hw.nvml import NvmlPin

    m = make_module([_memory_gpu()])
    gpu = m._gpus[0]
    pin = NvmlPin(NvmlDevice(nvml=m, assume_unlocked=True))
    pin.pin(1005, emc_mhz=810)
    pin._memory._ownership.abandon()  # the process dies: the locks go (flock), the journals stay
    pin._ownership.abandon()
    assert gpu.mem_locked == (810, 810) and len(list_journals(state_dir)) == 2
    assert restore_journals(announce=lambda _m: None, nvml_module=m) == 2
    assert gpu.mem_locked is None and gpu.locked is None and list_journals(state_dir) == []


def test_the_memory_clock_needs_ampere_and_a_refused_lock_leaves_nothing_to_restore(state_dir):
    turing = make_module([_memory_gpu(architecture=fake_pynvml.NVML_DEVICE_ARCH_TURING)])
    with pytest.raises(DvfsError, match="older than Ampere: NVML locks memory clocks on Ampere or newer only"):
        NvmlDevice(nvml=turing, assume_unlocked=True).session(1005, emc_mhz=5001)
    m = make_module([_memory_gpu()])
    gpu = m._gpus[0]
    real = m.nvmlDeviceSetMemoryLockedClocks

    def refused(h: Any, lo: int, hi: int) -> None:
        real(h, lo, hi)
        raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_NOT_SUPPORTED)  # the driver says no after all

    m.nvmlDeviceSetMemoryLockedClocks = refused
    with pytest.raises(DvfsError, match="NVML could not lock the memory clock on GPU 0: Not Supported"), \
            NvmlDevice(nvml=m, assume_unlocked=True).session(1005, emc_mhz=5001):
        pass
    assert gpu.locked is None and gpu.mem_locked is None and list_journals(state_dir) == []
