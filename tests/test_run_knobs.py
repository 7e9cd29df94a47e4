"""`dvfs-mlops run --cpu-freq MHZ --emc-freq MHZ` (with `--freq`), `devices` showing the CPU and EMC tables, and
`dvfs-mlops restore` putting back every domain a killed run left pinned, on a fake Orin served like sysfs
(testkit/fakes/kernelfs.py). Bad input is one line each, nothing touched."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dvfs_mlops.hw.guard import list_journals
from testkit.fakes.sysfs import ORIN_TABLE_HZ, cpu_table_khz
from tests.conftest import REPO, run_cli

CPU = cpu_table_khz(2201600)
POLICIES = ("policy0", "policy4", "policy8")
CHILD = ["--", sys.executable, "-c", "import time; time.sleep(0.3)"]


def _restored(k) -> bool:
    return (k.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1]) and all(k.cpu_range_khz(p) == (CPU[0], CPU[-1])
                                                                       for p in POLICIES) and k.emc_state()[0] == 0)


def test_run_pins_the_cpu_and_emc_clocks_with_the_gpus_and_says_what_held(orin6_kernel, state_dir):
    k = orin6_kernel
    r = run_cli("run", "--device", "jetson", "--freq", "612", "--cpu-freq", "1420.8", "--emc-freq", "2133", "--json", *CHILD,
                env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["freq"], out["cpu_freq"], out["emc_freq"]) == ("612", 1420.8, 2133.0)
    assert out["cpu_mhz_measured"] == pytest.approx(1420.8) and out["cpu_held"] is True
    assert out["emc_mhz"] == pytest.approx(2133) and out["emc_held"] is True and out["clock_held"] is True
    assert out["cpu_khz_by_policy"] == "policy0:1420800,policy4:1420800,policy8:1420800"
    assert _restored(k) and list_journals(state_dir) == []
    plain = run_cli("run", "--device", "jetson", "--freq", "612", "--cpu-freq", "1420.8", *CHILD, env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert plain.returncode == 0 and ", CPU 1421 MHz (held); exit code 0" in plain.stderr.splitlines()[-1], plain.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--device", "jetson", "--freq", "612", "--cpu-freq", "1500"), "unknown CPU clock '1500'; valid CPU clocks: 115.2,"),
    (("--device", "jetson", "--freq", "612", "--emc-freq", "3000"),
     "unknown memory (EMC) clock '3000'; valid memory (EMC) clocks: 204, 665.6, 2133, 3199"),
    (("--device", "jetson", "--freq", "612", "--cpu-freq", "-5"), "--cpu-freq is a clock in MHz of the device's table"),
    (("--device", "jetson", "--observe", "--cpu-freq", "960"), "--observe pins nothing, so it cannot pin the CPU clock"),
    (("--device", "sim", "--freq", "612", "--emc-freq", "2500"),
     "EMC clock 2500.0 MHz is not in the sim-orin twin's EMC table; its EMC clocks (MHz): 204, 665.6, 2133, 3199"),
])
def test_bad_knobs_are_one_line_and_nothing_is_touched(orin6_kernel, state_dir, args, message):
    k = orin6_kernel
    k.clear_log()
    r = run_cli("run", *args, "--", "true", env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert k.log == [] and _restored(k) and not list(state_dir.iterdir())


def test_an_emc_clock_above_the_modes_cap_is_refused_before_the_command_runs(orin6_kernel, state_dir, tmp_path):
    k = orin6_kernel
    k.set_nvpmodel_mode(2)  # MODE_30W: EMC cap 2133 MHz, CPU cap 1728 MHz
    k.clear_log()
    marker = tmp_path / "ran"
    r = run_cli("run", "--device", "jetson", "--freq", "612", "--emc-freq", "3199", "--", "touch", str(marker),
                env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "above the 2133 MHz EMC cap of power mode 2:MODE_30W" in r.stderr and "--above-mode-cap" in r.stderr
    assert not marker.exists() and k.log == []
    allowed = run_cli("run", "--device", "jetson", "--freq", "612", "--emc-freq", "3199", "--cpu-freq", "960",
                      "--above-mode-cap", "--json", *CHILD, env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert allowed.returncode == 0, allowed.stderr
    out = json.loads(allowed.stdout)
    assert out["above_mode_cap"] is True and out["nvpmodel_emc_max_mhz"] == 2133.0 and out["nvpmodel_cpu_max_mhz"] == 1728.0
    assert "power mode 2:MODE_30W (GPU cap 612 MHz, CPU cap 1728 MHz, EMC cap 2133 MHz)" in allowed.stderr
    assert k.emc_state()[0] == 0 and k.cpu_range_khz("policy0") == (729600, 1728000)  # the mode's range, put back


def test_devices_shows_the_cpu_and_emc_tables_and_where_they_come_from(orin6_kernel):
    r = run_cli("devices", "--device", "jetson", env={"DVFS_SYSFS_ROOT": str(orin6_kernel.root)})
    assert r.returncode == 0, r.stderr
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in r.stdout.splitlines()}
    assert lines["cpu_frequencies"].startswith("115.2, 192, 268.8,") and "(3 cpufreq policies: policy0, policy4, policy8)" in \
        lines["cpu_frequencies"]
    assert lines["emc_frequencies"] == "204, 665.6, 2133, 3199 MHz (from bpmp possible_rates)"
    as_json = json.loads(run_cli("devices", "--device", "jetson", "--json", env={"DVFS_SYSFS_ROOT": str(orin6_kernel.root)}).stdout)
    assert as_json["detail"]["emc_frequencies"].endswith("(from bpmp possible_rates)")


def test_restore_puts_back_every_domain_a_killed_run_left_pinned(orin6_kernel, state_dir):
    k = orin6_kernel
    proc = subprocess.Popen([sys.executable, "-m", "dvfs_mlops", "run", "--device", "jetson", "--freq", "510", "--cpu-freq",
                             "960", "--emc-freq", "665.6", "--", "sleep", "30"], cwd=REPO, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while k.emc_state() != (1, 665600000) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    assert k.cpu_range_khz("policy4") == (960000, 960000) and k.range_hz == (510000000, 510000000)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its command, at once: nothing restores
    proc.wait(timeout=10)
    proc.stderr.close()
    assert len(list_journals(state_dir)) == 3
    r = run_cli("restore", env={"DVFS_SYSFS_ROOT": str(k.root)})
    assert r.returncode == 0, r.stderr
    restored = [line for line in r.stdout.splitlines() if line.startswith("restored ")]
    assert sorted(line.split()[1] for line in restored) == ["jetson-17000000.gpu", "jetson-cpufreq", "jetson-emc"]
    assert _restored(k) and list_journals(state_dir) == []
