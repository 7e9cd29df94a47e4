"""A Jetson's CPU (cpufreq) and memory (EMC) clocks pinned with the GPU's, as root, on fake trees that follow the kernel
and NVIDIA's sources (testkit/fakes/sysfs.py `FakeKernel` in process, testkit/fakes/kernelfs.py across processes): one
lock and journal per domain, written before the first write; restore of the user-level setting, never a read-back
aggregate; the power mode's cap per domain; the EMC floor; every refusal one line with nothing touched."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dvfs_mlops.errors import DeviceBusyError, DvfsError, RestoreFailedError, UnknownNameError
from dvfs_mlops.hw import restore_journals
from dvfs_mlops.hw.device import open_session
from dvfs_mlops.hw.guard import DeviceLock, list_journals
from dvfs_mlops.hw.jetson import JetsonDevice
from testkit.fakes.sysfs import EMC_POSSIBLE_RATES, ORIN_TABLE_HZ, cpu_table_khz

REPO = Path(__file__).resolve().parents[1]
CPU = cpu_table_khz(2201600)  # the AGX Orin 64 GB's fake CPU table, kHz
CPU_DEFAULT = (CPU[0], CPU[-1])  # cpuinfo_min_freq..cpuinfo_max_freq: the user-level range where no mode names one
GPU_DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
POLICIES = ("policy0", "policy4", "policy8")


def _cpu_ranges(tree) -> dict[str, tuple[int, int]]:
    return {p: tree.cpu_range_khz(p) for p in POLICIES}


def _journals() -> dict[str, object]:
    return {j.device_key: j for _p, j in list_journals()}


# -- CPU clocks ----------------------------------------------------------------------------------------------------------
def test_a_cpu_clock_is_pinned_on_every_policy_read_back_and_the_user_range_restored(kernel6, orin6, state_dir):
    dev = JetsonDevice(sample_hz=200, writer=kernel6.write)
    with dev.session(612, cpu_mhz=1420.8) as s:
        assert _cpu_ranges(orin6) == {p: (1420800, 1420800) for p in POLICIES}
        assert set(_journals()) == {"jetson-17000000.gpu", "jetson-cpufreq"}
        time.sleep(0.05)
    assert _cpu_ranges(orin6) == {p: CPU_DEFAULT for p in POLICIES} and orin6.range_hz == GPU_DEFAULT
    assert _journals() == {}
    r = s.report()
    assert r.cpu_mhz_measured == pytest.approx(1420.8) and r.cpu_held is True
    assert s.context["cpu_mhz_measured"] == pytest.approx(1420.8) and s.context["cpu_held"] is True
    assert s.context["cpu_khz_by_policy"] == "policy0:1420800,policy4:1420800,policy8:1420800"
    assert s.context["cpu_clock_source"] == "measured"  # cpuinfo_cur_freq, root's read of the hardware's clock


def test_the_restore_writes_the_user_level_range_not_a_thermal_caps_read_back(kernel6, orin6, state_dir):
    kernel6.set_cpu_cap_khz("policy4", 1036800)  # a CPU cooling device's cap: scaling_max_freq reads it
    assert orin6.cpu_range_khz("policy4") == (CPU[0], 1036800)
    dev = JetsonDevice(sample_hz=200, writer=kernel6.write)
    with dev.session(612, cpu_mhz=1420.8) as s:
        time.sleep(0.05)
    assert kernel6.cpu_requests["policy4"] == CPU_DEFAULT  # the user's request put back, never the read 1036800
    assert orin6.cpu_range_khz("policy4") == (CPU[0], 1036800)  # the cap still shows in the aggregate
    assert s.report().cpu_held is False  # policy4 ran at the cap, not the pin
    assert s.context["cpu_held"] is False


def test_the_power_modes_cpu_range_is_what_the_restore_puts_back(tmp_path, monkeypatch, state_dir):
    from testkit.fakes.sysfs import FakeKernel, make_orin_tree

    fake = make_orin_tree(tmp_path / "root", nvpmodel_mode=2)  # MODE_30W: CPU 729600..1728000 kHz on every cluster
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    kernel = FakeKernel(fake)
    dev = JetsonDevice(writer=kernel.write)
    with dev.session(306, cpu_mhz=729.6):
        assert _cpu_ranges(fake) == {p: (729600, 729600) for p in POLICIES}
        kernel.set_nvpmodel_mode(1)  # `nvpmodel -m 1` during the session: MODE_15W, CPU 729600..1113600
        kernel.write(fake.policy("policy0") / "scaling_min_freq", "729600")  # the session's pin holds on
        kernel.write(fake.policy("policy0") / "scaling_max_freq", "729600")
    assert _cpu_ranges(fake) == {p: (729600, 1113600) for p in POLICIES}  # the mode in force at the restore stands


def test_a_cpu_clock_in_no_policys_table_is_one_line_and_nothing_is_touched(kernel6, orin6, state_dir):
    dev = JetsonDevice(writer=kernel6.write)
    with pytest.raises(UnknownNameError) as e:
        dev.session(612, cpu_mhz=1500)
    assert "unknown CPU clock '1500'" in str(e.value) and "1420.8" in str(e.value) and "\n" not in str(e.value)
    assert kernel6.log == [] and not list(state_dir.iterdir())


def test_a_cpu_clock_above_the_modes_cap_is_refused_unless_allowed(tmp_path, monkeypatch, state_dir):
    from testkit.fakes.sysfs import FakeKernel, make_orin_tree

    fake = make_orin_tree(tmp_path / "root", nvpmodel_mode=2)  # CPU cap 1728000 kHz
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    kernel = FakeKernel(fake)
    with pytest.raises(DvfsError, match="above the 1728 MHz CPU cap of power mode 2:MODE_30W") as e, \
            JetsonDevice(writer=kernel.write).session(306, cpu_mhz=2201.6):
        pass
    assert "--above-mode-cap" in str(e.value) and kernel.log == [] and not list_journals()
    with JetsonDevice(writer=kernel.write, above_mode_cap=True).session(306, cpu_mhz=2201.6) as s:
        assert _cpu_ranges(fake)["policy0"] == (2201600, 2201600)
    assert s.context["above_mode_cap"] is True and s.context["nvpmodel_cpu_max_mhz"] == 1728.0


def test_the_cpu_journal_is_written_before_the_first_cpufreq_write(kernel6, orin6, state_dir):
    seen: list[set[str]] = []

    def writer(path: Path, value: str) -> None:
        if path.parent.name.startswith("policy") or "cpufreq" in str(path):
            seen.append(set(_journals()))
        kernel6.write(path, value)

    with JetsonDevice(writer=writer).session("maxn", cpu_mhz=960):
        pass
    assert seen and all("jetson-cpufreq" in s for s in seen[:6])  # the six pin writes (two per policy)


def test_a_busy_cpu_domain_refuses_the_pin_with_nothing_touched(kernel6, orin6, state_dir):
    other = DeviceLock("jetson-cpufreq")  # another process's lock of the CPU domain (flock: a second open file)
    other.acquire()
    try:
        with pytest.raises(DeviceBusyError, match="jetson-cpufreq"), JetsonDevice(writer=kernel6.write).session(612, cpu_mhz=960):
            pass
    finally:
        other.release()
    assert kernel6.log == [] and _journals() == {} and orin6.range_hz == GPU_DEFAULT


def test_repin_moves_the_cpu_clock_and_claims_it_first_where_the_session_had_not(kernel6, orin6, state_dir):
    with JetsonDevice(sample_hz=200, writer=kernel6.write).session(612) as s:
        assert "jetson-cpufreq" not in _journals()
        s.repin(510, cpu_mhz=960)
        assert set(_journals()) == {"jetson-17000000.gpu", "jetson-cpufreq"}
        assert _cpu_ranges(orin6)["policy8"] == (960000, 960000) and orin6.range_hz == (510000000, 510000000)
        time.sleep(0.05)
        s.repin(510, cpu_mhz=1113.6)
        assert _cpu_ranges(orin6)["policy0"] == (1113600, 1113600)
        with s.window("train"):
            time.sleep(0.05)
    assert _cpu_ranges(orin6) == {p: CPU_DEFAULT for p in POLICIES} and _journals() == {}
    # judged against the clock pinned last, as the GPU's: the window after the last move held, the whole session not
    assert s.cpu_mhz == pytest.approx(1113.6) and s.windows["train"].cpu_held is True
    assert s.windows["train"].cpu_mhz_measured == pytest.approx(1113.6) and s.session_report().cpu_held is False


def test_a_failed_cpu_restore_keeps_its_journal_restores_the_rest_and_restore_finishes_it(kernel6, orin6, state_dir):
    with pytest.raises(RestoreFailedError, match="jetson-cpufreq"):  # the failure comes on the way out
        with JetsonDevice(writer=kernel6.write).session(612, cpu_mhz=960, emc_mhz=2133):
            kernel6.fail_writes = {"scaling_max_freq"}
    assert orin6.range_hz == GPU_DEFAULT and orin6.emc_state() == (0, 3199000000)  # GPU and EMC restored
    assert set(_journals()) == {"jetson-cpufreq"}  # the CPU's journal kept
    kernel6.fail_writes = set()
    restore_journals(announce=lambda _m: None)
    assert _cpu_ranges(orin6) == {p: CPU_DEFAULT for p in POLICIES} and _journals() == {}


# -- the EMC clock -------------------------------------------------------------------------------------------------------
def test_the_emc_clock_is_locked_as_jetson_clocks_does_and_given_back_to_the_kernel(kernel6, orin6, state_dir):
    dev = JetsonDevice(sample_hz=200, writer=kernel6.write)
    assert dev.emc_frequencies_mhz == [204.0, 665.6, 2133.0, 3199.0]
    with dev.session(612, emc_mhz=2133) as s:
        assert orin6.emc_state() == (1, 2133000000)
        assert _journals()["jetson-emc"].settings == {"mrq_rate_locked": 0, "rate_hz": 3199000000}
        kernel6.set_emc_kernel_rate_hz(665600000)  # the kernel's bandwidth manager would pick another rate meanwhile
        time.sleep(0.05)
    assert orin6.emc_state() == (0, 665600000)  # unlocked: the kernel's choice, never the rate read at the start
    assert [(n, v) for n, v, err in kernel6.log if n in ("mrq_rate_locked", "rate")] == \
        [("mrq_rate_locked", "1"), ("rate", "2133000000"), ("mrq_rate_locked", "0")]
    assert s.report().emc_mhz == pytest.approx(2133) and s.report().emc_held is True
    assert s.context["emc_mhz"] == pytest.approx(2133) and s.context["emc_held"] is True


def test_an_emc_rate_someone_had_locked_is_locked_again_at_that_rate(kernel6, orin6, state_dir):
    kernel6.write(orin6.emc / "mrq_rate_locked", "1")  # jetson_clocks left the EMC locked at 3199 MHz
    kernel6.write(orin6.emc / "rate", "3199000000")
    with JetsonDevice(writer=kernel6.write).session(612, emc_mhz=665.6):
        assert orin6.emc_state() == (1, 665600000)
    assert orin6.emc_state() == (1, 3199000000)


def test_an_emc_clock_below_the_floor_is_one_line_and_nothing_is_touched(kernel6, orin6, state_dir):
    kernel6.set_emc_floor_hz(665600000)  # BPMP's min_rate: a floor it holds now
    kernel6.log.clear()
    with pytest.raises(DvfsError) as e, JetsonDevice(writer=kernel6.write).session(612, emc_mhz=204):
        pass
    assert "below the EMC floor of 665.6 MHz" in str(e.value) and "\n" not in str(e.value)
    assert kernel6.log == [] and _journals() == {} and orin6.range_hz == GPU_DEFAULT and orin6.emc_state() == (0, 3199000000)


def test_an_emc_clock_above_the_modes_cap_is_refused_unless_allowed(tmp_path, monkeypatch, state_dir):
    from testkit.fakes.sysfs import FakeKernel, make_orin_tree

    fake = make_orin_tree(tmp_path / "root", nvpmodel_mode=2)  # MODE_30W: EMC MAX_FREQ 2133 MHz into emc_iso_cap
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    kernel = FakeKernel(fake)
    with pytest.raises(DvfsError, match="above the 2133 MHz EMC cap of power mode 2:MODE_30W"), \
            JetsonDevice(writer=kernel.write).session(306, emc_mhz=3199):
        pass
    assert kernel.log == [] and not list_journals()
    with JetsonDevice(writer=kernel.write).session(306, emc_mhz=2133) as s:  # the cap itself is fine
        pass
    assert "above_mode_cap" not in s.context and s.context["nvpmodel_emc_max_mhz"] == 2133.0
    with JetsonDevice(writer=kernel.write, above_mode_cap=True).session(306, emc_mhz=3199) as s:
        assert fake.emc_state() == (1, 3199000000)
    assert s.context["above_mode_cap"] is True


def test_the_emc_table_names_its_source(kernel6, orin6, state_dir):
    dev = JetsonDevice()
    assert dev.emc_table().source == "bpmp possible_rates"
    (orin6.root / EMC_POSSIBLE_RATES).unlink()  # firmware without possible_rates: min_rate, max_rate and the modes' caps
    table = dev.emc_table()
    assert table.source == "bpmp min_rate/max_rate and the power modes' EMC caps" and table.mhz == [204.0, 2133.0, 3199.0]
    info = dev.info().detail
    assert info["emc_frequencies"] == "204, 2133, 3199 MHz (from bpmp min_rate/max_rate and the power modes' EMC caps)"
    assert info["cpu_frequencies"].endswith("MHz (3 cpufreq policies: policy0, policy4, policy8)")


def test_three_domains_are_locked_before_any_write_and_a_busy_emc_touches_nothing(kernel6, orin6, state_dir):
    other = DeviceLock("jetson-emc")
    other.acquire()
    try:
        with pytest.raises(DeviceBusyError, match="jetson-emc"), \
                JetsonDevice(writer=kernel6.write).session(612, cpu_mhz=960, emc_mhz=2133):
            pass
    finally:
        other.release()
    assert kernel6.log == [] and _journals() == {}


# -- a knob a backend cannot set -----------------------------------------------------------------------------------------
def test_a_knob_with_observe_or_on_a_kernel_without_cpufreq_is_one_line(orin6, tmp_path):
    """(NVML, which has no CPU knob, refuses --cpu-freq in tests/test_nvml.py; the twin models every knob.)"""
    with pytest.raises(DvfsError, match="--observe pins nothing"):
        open_session(JetsonDevice(), 510, observe=True, emc_mhz=2133)
    shutil.rmtree(orin6.root / "sys/devices/system/cpu/cpufreq")  # a kernel without cpufreq: the Jetson has no CPU knob
    with pytest.raises(DvfsError, match=r"no cpufreq policy under .* drop --cpu-freq"):
        JetsonDevice().session(510, cpu_mhz=1420.8)


# -- killed mid-run: every domain comes back -----------------------------------------------------------------------------
def _child(freq: str, action: str, *knobs: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testkit.fakes.session_child", freq, action, *knobs], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_run_then_restore_puts_back_all_three_domains(orin6_kernel, state_dir):
    k = orin6_kernel
    proc = _child("510", "wait", "960", "665.6")
    assert proc.stdout.readline().strip() == "PINNED", proc.stderr.read()
    assert k.range_hz == (510000000, 510000000) and _cpu_ranges(k) == {p: (960000, 960000) for p in POLICIES}
    assert k.emc_state() == (1, 665600000)
    journals = _journals()
    assert set(journals) == {"jetson-17000000.gpu", "jetson-cpufreq", "jetson-emc"}
    assert {j.pid for j in journals.values()} == {proc.pid}
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert k.emc_state() == (1, 665600000)  # nothing ran the restore
    lines: list[str] = []
    assert restore_journals(announce=lines.append) == 3
    assert k.range_hz == GPU_DEFAULT and _cpu_ranges(k) == {p: CPU_DEFAULT for p in POLICIES} and k.emc_state()[0] == 0
    assert _journals() == {} and any(line.startswith("restored jetson-emc (emc): mrq_rate_locked=0") for line in lines)


def test_sigterm_mid_run_restores_all_three_domains_in_the_child(orin6_kernel, state_dir):
    k = orin6_kernel
    proc = _child("510", "wait", "960", "665.6")
    assert proc.stdout.readline().strip() == "PINNED", proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert k.range_hz == GPU_DEFAULT and _cpu_ranges(k) == {p: CPU_DEFAULT for p in POLICIES} and k.emc_state()[0] == 0
    assert _journals() == {}


def test_the_next_session_applies_a_killed_runs_cpu_and_emc_journals_first(orin6_kernel, state_dir, caplog):
    k = orin6_kernel
    proc = _child("510", "wait", "960", "665.6")
    assert proc.stdout.readline().strip() == "PINNED", proc.stderr.read()
    proc.kill()
    proc.wait(timeout=10)
    with caplog.at_level("WARNING"), JetsonDevice().session(612, cpu_mhz=1420.8, emc_mhz=2133) as s:
        recorded = _journals()
    assert recorded["jetson-cpufreq"].settings["policies"]["policy0"]["read_max_khz"] == CPU_DEFAULT[1]  # not the dead pin
    assert recorded["jetson-emc"].settings["mrq_rate_locked"] == 0
    assert sum("left pinned" in m for m in caplog.messages) == 3 and s.context["cpu_held"] is True
    assert os.path.exists(k.mountpoint)
