"""The fake kernel tree itself (testkit/fakes/kernelfs.py), by plain file I/O: no dvfs_mlops code involved."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.fakes import kernelfs
from testkit.fakes.sysfs import (
    BOOT_ID,
    EMC_ISO_CAP,
    EMC_POSSIBLE_RATES,
    EMC_RATE_HZ,
    GPC_CLOCK_FILES,
    NVPMODEL_MODES,
    ORIN_TABLE_HZ,
    TPC_PG_MASK_FILE,
    make_orin_tree,
    nvpmodel_mode,
    set_gpc_clock_hz,
)

TMIN, TMAX = ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1]
REPO = Path(__file__).resolve().parents[1]


def write(path: Path, value: str) -> None:
    """One write(2), as echo > file does."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def refused(path: Path, value: str) -> int:
    with pytest.raises(OSError) as e:
        write(path, value)
    return e.value.errno


# -- the min_freq <= max_freq rule ----------------------------------------------------------------
def test_min_above_max_is_einval_and_keeps_the_old_value(orin_kernel):
    k = orin_kernel
    write(k.node / "max_freq", "612000000")
    assert refused(k.node / "min_freq", "1020000000") == errno.EINVAL
    assert k.range_hz == (TMIN, 612000000)
    write(k.node / "min_freq", "408000000")
    assert refused(k.node / "max_freq", "306000000") == errno.EINVAL  # max below min
    assert k.range_hz == (408000000, 612000000)
    assert (k.backing.node / "min_freq").read_text() == "408000000\n"  # the backing file holds the accepted value


def test_write_order_decides_whether_a_raise_is_legal(orin6_kernel):
    k = orin6_kernel
    write(k.node / "min_freq", "306000000")
    write(k.node / "max_freq", "408000000")
    assert refused(k.node / "min_freq", "1020000000") == errno.EINVAL  # min first while raising
    write(k.node / "max_freq", "1020000000")  # max first: fine
    write(k.node / "min_freq", "1020000000")
    assert k.range_hz == (1020000000, 1020000000)


def test_values_parse_like_sscanf_and_read_clamped_into_the_table(orin6_kernel):
    k = orin6_kernel
    for bad in ("abc", "-1", "x612", " "):
        assert refused(k.node / "max_freq", bad) == errno.EINVAL
    write(k.node / "max_freq", "816000000\n")  # echo's newline
    assert k.read("max_freq") == "816000000"
    write(k.node / "max_freq", "2000000000")  # above the table: accepted, reads as the table's top
    assert k.read("max_freq") == str(TMAX)
    write(k.node / "min_freq", "1")
    assert k.read("min_freq") == str(TMIN)
    write(k.node / "max_freq", "0")  # 0: no limit
    assert k.range_hz == (TMIN, TMAX)


def test_qos_rule_accepts_min_above_max_and_max_wins(orin6_kernel):
    k = orin6_kernel
    k.rule = "qos"
    write(k.node / "max_freq", "612000000")
    write(k.node / "min_freq", "1020000000")  # accepted, as on Linux >= 5.7
    assert k.range_hz == (612000000, 612000000)
    assert k.read("cur_freq") == "612000000"


# -- cur_freq -----------------------------------------------------------------------------------
def test_cur_freq_is_the_top_of_the_range_under_the_caps(orin6_kernel):
    k = orin6_kernel
    assert k.read("cur_freq") == str(TMAX)
    write(k.node / "min_freq", "612000000")
    write(k.node / "max_freq", "612000000")
    assert k.read("cur_freq") == "612000000"
    k.set_throttle_cap_hz(510000000)  # below the user's min: the cap wins
    assert k.read("cur_freq") == "510000000"
    k.set_throttle_cap_hz(None)
    write(k.node / "max_freq", "700000000")  # not a table entry: the GPU runs at the one below
    assert k.read("cur_freq") == "612000000"
    k.set_throttle_cap_hz(100)  # below the table: the lowest clock the GPU has
    assert k.read("cur_freq") == str(TMIN)


def test_reads_are_get_freq_range_not_the_users_request(orin6_kernel):
    """devfreq.c: min_freq_show/max_freq_show print get_freq_range() (every QoS request together, min never above max);
    a thermal cap (devfreq_cooling's QoS max request) reads back in max_freq, and lifting it brings the request back."""
    k = orin6_kernel
    write(k.node / "min_freq", "612000000")
    write(k.node / "max_freq", "1020000000")
    k.set_throttle_cap_hz(816000000)
    assert k.range_hz == (612000000, 816000000)
    assert (k.backing.node / "max_freq").read_text() == "1020000000\n"  # the request itself is kept as written
    k.set_throttle_cap_hz(510000000)  # below the user's min: min reads as max
    assert k.range_hz == (510000000, 510000000)
    k.set_throttle_cap_hz(None)
    assert k.range_hz == (612000000, 1020000000)


def test_max_freq_requests_are_rounded_up_to_khz_like_pm_qos(orin6_kernel):
    k = orin6_kernel
    write(k.node / "max_freq", "612000001")  # DIV_ROUND_UP(value, HZ_PER_KHZ): 612001 kHz
    write(k.node / "min_freq", "408000999")  # value / HZ_PER_KHZ: 408000 kHz
    assert k.range_hz == (408000000, 612001000)


def test_nvpmodel_writes_the_modes_range_into_the_same_files(orin6_kernel):
    """NVIDIA's nvpmodel template maps GPU MAX_FREQ/MIN_FREQ onto devfreq's max_freq/min_freq: the mode's cap is the
    user's max_freq request, no second cap. A later write of max_freq replaces it."""
    k = orin6_kernel
    k.set_nvpmodel_mode(1)  # MODE_15W: GPU MAX_FREQ 408 MHz
    assert (k.root / "var/lib/nvpmodel/status").read_text() == "pmode:0001 fmode:quiet\n"
    assert k.range_hz == (TMIN, 408000000) and k.read("cur_freq") == "408000000"
    assert (k.root / TPC_PG_MASK_FILE).read_text() == "12\n"
    write(k.node / "max_freq", "816000000")  # a user's write replaces the mode's cap: the GPU runs above it
    assert k.read("cur_freq") == "816000000"
    k.set_nvpmodel_mode(0)  # MAXN: GPU MAX_FREQ -1, no cap
    assert k.range_hz == (TMIN, TMAX) and (k.root / TPC_PG_MASK_FILE).read_text() == "0\n"
    k.set_throttle_cap_hz(918000000)
    assert k.read("cur_freq") == "918000000"


def test_tree_built_in_a_capped_mode(tmp_path):
    ok, why = kernelfs.fuse_available()
    if not ok:
        pytest.skip(why)
    with kernelfs.mount_orin(tmp_path, jetpack=5, nvpmodel_mode=2) as k:  # MODE_30W
        assert k.range_hz == (TMIN, 612000000) and k.read("cur_freq") == "612000000"
        write(k.node / "max_freq", str(TMAX))  # the mode's cap is this very file: raising it lifts the cap
        assert k.read("cur_freq") == str(TMAX)


def test_bpmp_gpc_counters_read_the_clock_the_gpu_runs_at(orin6_kernel):
    k = orin6_kernel
    set_gpc_clock_hz(k.backing.root, 1)  # the counters exist; their value is the daemon's
    gpc = [k.root / rel for rel in GPC_CLOCK_FILES]
    assert [p.read_text() for p in gpc] == [f"{TMAX}\n"] * 2
    write(k.node / "min_freq", "612000000")
    write(k.node / "max_freq", "612000000")
    assert [p.read_text() for p in gpc] == ["612000000\n"] * 2
    k.set_throttle_cap_hz(510000000)
    assert gpc[0].read_text() == "510000000\n" == k.read("cur_freq") + "\n"


def test_pread_on_an_open_fd_returns_the_current_value(orin6_kernel):
    k = orin6_kernel
    fd = os.open(k.node / "cur_freq", os.O_RDONLY)
    try:
        assert os.pread(fd, 32, 0) == f"{TMAX}\n".encode()
        k.set_throttle_cap_hz(408000000)
        assert os.pread(fd, 32, 0) == b"408000000\n"
        assert os.pread(fd, 32, 3) == b"000000\n"
    finally:
        os.close(fd)


# -- other attributes and knobs -------------------------------------------------------------------
def test_governor_must_be_an_available_one(orin_kernel):
    k = orin_kernel
    assert refused(k.node / "governor", "turbo") == errno.EINVAL
    assert k.read("governor") == "nvhost_podgov"
    write(k.node / "governor", "performance\n")
    assert k.read("governor") == "performance"


def test_read_only_attributes_refuse_writes_even_for_root(orin6_kernel):
    k = orin6_kernel
    for name in ("cur_freq", "available_frequencies", "available_governors"):
        assert refused(k.node / name, "1") == errno.EACCES
        assert oct((k.node / name).stat().st_mode & 0o777) == "0o444"
    assert k.read("available_frequencies").split() == [str(h) for h in ORIN_TABLE_HZ]


def test_read_only_knob_refuses_every_write_to_the_node(orin6_kernel):
    k = orin6_kernel
    k.read_only = True
    assert k.read_only is True
    for name, value in (("min_freq", "612000000"), ("max_freq", "612000000"), ("governor", "performance")):
        assert refused(k.node / name, value) == errno.EACCES
    with pytest.raises(PermissionError):
        (k.node / "max_freq").write_text("612000000")
    assert k.range_hz == (TMIN, TMAX) and k.read("governor") == "nvhost_podgov"
    assert k.writes == [] and {err for _n, _v, err in k.log} == {errno.EACCES}
    k.read_only = False
    write(k.node / "min_freq", "612000000")
    assert k.read("min_freq") == "612000000"


def test_fail_writes_is_eio_for_the_named_files_only(orin6_kernel):
    k = orin6_kernel
    k.fail_writes = {"max_freq"}
    assert k.fail_writes == {"max_freq"}
    assert refused(k.node / "max_freq", "612000000") == errno.EIO
    write(k.node / "min_freq", "408000000")
    assert k.range_hz == (408000000, TMAX)
    k.fail_writes = set()
    write(k.node / "max_freq", "612000000")
    assert k.range_hz == (408000000, 612000000)


def test_rail_reads_fail_with_eio_the_next_n_times(orin6_kernel):
    k = orin6_kernel
    curr = k.hwmon[0] / "curr1_input"  # VDD_GPU_SOC
    fd = os.open(curr, os.O_RDONLY)
    try:
        assert os.pread(fd, 32, 0) == b"2400\n"
        k.fail_rail_reads(2)
        for _ in range(2):
            with pytest.raises(OSError) as e:
                os.pread(fd, 32, 0)
            assert e.value.errno == errno.EIO
        assert os.pread(fd, 32, 0) == b"2400\n"
        k.set_rail("VDD_GPU_SOC", 5000, 4400)  # through the backing dir; the open fd sees it
        assert os.pread(fd, 32, 0) == b"4400\n"
        k.fail_rail_reads(1)
        assert (k.hwmon[0] / "in1_label").read_text() == "VDD_GPU_SOC\n"  # labels are not rail inputs
        with pytest.raises(OSError):
            (k.hwmon[1] / "in2_input").read_text()  # any rail input takes the next failure
    finally:
        os.close(fd)


def test_write_log_records_every_attempt(orin6_kernel):
    k = orin6_kernel
    write(k.node / "min_freq", "612000000")
    refused(k.node / "max_freq", "408000000")
    refused(k.node / "governor", "turbo")
    assert k.log == [("min_freq", "612000000", 0), ("max_freq", "408000000", errno.EINVAL),
                     ("governor", "turbo", errno.EINVAL)]
    assert k.writes == [("min_freq", 612000000)]
    k.log.clear()
    assert k.log == []
    k.set_throttle_cap_hz(510000000)
    k.reset()  # knobs off, log empty, values kept
    assert k.read("cur_freq") == str(TMAX) and k.read("min_freq") == "612000000" and k.log == []


# -- passthrough and lifecycle -------------------------------------------------------------------
def test_symlinks_resolve_inside_the_mount(orin_kernel):
    k = orin_kernel
    cls = next((k.root / "sys/class/devfreq").iterdir())
    link = k.root / "sys/class/devfreq" / k.node.name
    assert os.path.realpath(link) == str(k.node)
    assert (link / "device/of_node/name").read_bytes().endswith(b"\x00")
    assert str(os.path.realpath(cls)).startswith(str(k.root))
    assert {p.name for p in (k.root / "sys/bus/i2c/drivers/ina3221").iterdir()} == {"1-0040", "1-0041"}


def test_other_files_pass_through_to_the_backing_dir(orin6_kernel):
    k = orin6_kernel
    (k.root / "etc/extra").mkdir()
    (k.root / "etc/extra/f").write_text("hello\n")
    assert (k.backing.root / "etc/extra/f").read_text() == "hello\n"
    (k.backing.root / "etc/extra/g").write_text("from the backing dir\n")
    assert (k.root / "etc/extra/g").read_text() == "from the backing dir\n"
    (k.root / "etc/extra/f").unlink()
    assert sorted(os.listdir(k.root / "etc/extra")) == ["g"]


def test_unmount_leaves_nothing_mounted(tmp_path):
    ok, why = kernelfs.fuse_available()
    if not ok:
        pytest.skip(why)
    k = kernelfs.mount_orin(tmp_path)
    proc = k._proc
    assert k.mounted
    fd = os.open(k.node / "cur_freq", os.O_RDONLY)  # a busy mount: fusermount3 -u fails, -uz detaches
    try:
        k.unmount()
        assert not k.mounted
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # ENOTCONN: its daemon is gone
    assert not k.mounted and proc.poll() is not None and k not in kernelfs._LIVE
    k.unmount()  # idempotent
    with pytest.raises(RuntimeError, match="not mounted"):
        k.set_throttle_cap_hz(1)


def test_a_dead_daemon_is_still_unmounted(tmp_path):
    ok, why = kernelfs.fuse_available()
    if not ok:
        pytest.skip(why)
    k = kernelfs.mount_orin(tmp_path)
    k._proc.kill()
    k._proc.wait(5)
    k.unmount()
    assert not k.mounted


def test_fuse_available_says_why_not(monkeypatch):
    if not os.path.exists("/dev/fuse") or kernelfs.shutil.which("fusermount3") is None:
        pytest.skip("the checks before the mfusepy import fail here already")
    monkeypatch.setattr(kernelfs, "_available", None)
    monkeypatch.setitem(sys.modules, "mfusepy", None)  # import mfusepy raises ImportError
    assert kernelfs.fuse_available() == (False, "mfusepy is not installed (pip install mfusepy)")
    assert kernelfs.fuse_available() == (False, "mfusepy is not installed (pip install mfusepy)")  # cached
    monkeypatch.setattr(kernelfs, "_available", None)
    monkeypatch.setattr(kernelfs.shutil, "which", lambda _name: None)
    assert kernelfs.fuse_available() == (False, "no fusermount3 (apt-get install fuse3)")


def test_module_imports_where_libfuse_is_missing():
    """Collection must survive a machine without libfuse: mfusepy is imported only inside functions."""
    code = ("import sys; sys.modules['mfusepy'] = None\n"
            "import testkit.fakes.kernelfs as k, tests.conftest\n"
            "ok, why = k.fuse_available(); assert not ok, why; print(why)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "mfusepy" in r.stdout or "fuse" in r.stdout.lower()


# -- the plain tree's additions (no FUSE) --------------------------------------------------------
@pytest.mark.parametrize(("jetpack", "gpu_type"), [(5, "GPU-therm"), (6, "gpu-thermal")])
def test_plain_tree_has_thermal_zones_emc_and_nvpmodel(tmp_path, jetpack, gpu_type):
    fake = make_orin_tree(tmp_path, jetpack=jetpack)
    zones = {(z / "type").read_text().strip(): int((z / "temp").read_text()) for z in (tmp_path / "sys/class/thermal").iterdir()}
    assert zones[gpu_type] == 45500 and len(zones) == 2
    assert int((tmp_path / "sys/kernel/debug/bpmp/debug/clk/emc/rate").read_text()) == EMC_RATE_HZ
    assert (tmp_path / "var/lib/nvpmodel/status").read_text() == "pmode:0000 fmode:quiet\n"
    conf = (tmp_path / "etc/nvpmodel.conf").read_text()
    heads = re.findall(r"< POWER_MODEL ID=(\d+) NAME=(\S+) >", conf)
    assert [(int(i), n) for i, n in heads] == [(m.mode_id, m.name) for m in NVPMODEL_MODES]
    assert re.findall(r"GPU MAX_FREQ (-?\d+)", conf) == ["-1", "408000000", "612000000", "816000000"]
    assert re.findall(r"TPC_POWER_GATING TPC_PG_MASK (\d+)", conf) == ["0", "12", "8", "0"]
    # the PARAM section names each knob's file: the GPU's clock is this tree's devfreq node
    assert f"MAX_FREQ /{fake.node.relative_to(tmp_path)}/max_freq" in conf and f"TPC_PG_MASK /{TPC_PG_MASK_FILE}" in conf
    assert fake.range_hz == (TMIN, TMAX) and (tmp_path / TPC_PG_MASK_FILE).read_text() == "0\n"


def test_plain_tree_in_a_capped_mode(tmp_path):
    fake = make_orin_tree(tmp_path, nvpmodel_mode=3)
    assert (tmp_path / "var/lib/nvpmodel/status").read_text().startswith("pmode:0003")
    assert fake.range_hz == (TMIN, 816000000)
    with pytest.raises(KeyError):
        make_orin_tree(tmp_path / "other", nvpmodel_mode=9)


def test_plain_tree_has_the_module_device_tree_boot_id_and_throttle_counters(tmp_path):
    fake = make_orin_tree(tmp_path / "nx", module="p3767-0000")
    dt = fake.root / "proc/device-tree"
    assert dt.is_symlink() and dt.resolve() == (fake.root / "sys/firmware/devicetree/base").resolve()
    assert (dt / "compatible").read_bytes().split(b"\x00") == [b"nvidia,p3768-0000+p3767-0000", b"nvidia,p3767-0000",
                                                                b"nvidia,tegra234", b""]
    assert (dt / "model").read_text() == "NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00"
    assert (fake.root / "proc/sys/kernel/random/boot_id").read_text().strip() == BOOT_ID
    hw = fake.root / "sys/class/hwmon/hwmon3"
    assert (hw / "name").read_text() == "soctherm_oc\n" and (hw / "oc3_event_cnt").read_text() == "0\n"
    labels = sorted((h / f"in{n}_label").read_text().strip() for h in fake.hwmon for n in (1, 2, 3))
    assert labels == ["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"]
    assert not any((fake.root / rel).exists() for rel in GPC_CLOCK_FILES)  # only as root, added by set_gpc_clock_hz


# -- cpufreq policies (drivers/cpufreq/cpufreq.c) ------------------------------------------------------------------------
def _policy(k, name: str = "policy4") -> Path:
    return k.policy(name)


def test_cpufreq_accepts_min_above_max_and_reads_the_max_for_both(orin6_kernel):
    k = orin6_kernel
    pol = _policy(k)
    write(pol / "scaling_max_freq", "1420800")
    write(pol / "scaling_min_freq", "2201600")  # freq QoS: no EINVAL; verify makes min the max
    assert k.cpu_range_khz("policy4") == (1420800, 1420800)
    assert (k.backing.policy("policy4") / "scaling_min_freq").read_text() == "2201600\n"  # the request as written
    write(pol / "scaling_max_freq", "2201600")
    assert k.cpu_range_khz("policy4") == (2201600, 2201600)


def test_cpufreq_values_parse_like_sscanf_and_resolve_to_the_table(orin6_kernel):
    k = orin6_kernel
    pol = _policy(k, "policy0")
    for bad in ("abc", "-1", " "):
        assert refused(pol / "scaling_max_freq", bad) == errno.EINVAL
    write(pol / "scaling_max_freq", "1000000\n")  # between two table clocks: down to 960000 (CPUFREQ_RELATION_H)
    write(pol / "scaling_min_freq", "900000")  # up to 960000 (CPUFREQ_RELATION_L)
    assert k.cpu_range_khz("policy0") == (960000, 960000)
    write(pol / "scaling_max_freq", "9999999")  # above cpuinfo_max_freq: the table's top
    write(pol / "scaling_min_freq", "0")
    assert k.cpu_range_khz("policy0") == (115200, 2201600)


def test_cpufreq_reads_aggregate_a_cooling_devices_cap_and_cur_is_the_top(orin6_kernel):
    k = orin6_kernel
    pol = _policy(k)
    write(pol / "scaling_min_freq", "1420800")
    write(pol / "scaling_max_freq", "1420800")
    k.set_cpu_cap_khz("policy4", 1036800)
    assert k.cpu_range_khz("policy4") == (1036800, 1036800)  # the cap, never the user's request
    assert int((pol / "scaling_cur_freq").read_text()) == 1036800 == int((pol / "cpuinfo_cur_freq").read_text())
    assert (k.backing.policy("policy4") / "scaling_max_freq").read_text() == "1420800\n"
    k.set_cpu_cap_khz("policy4", None)
    assert k.cpu_range_khz("policy4") == (1420800, 1420800)
    assert k.cpu_range_khz("policy0") == (115200, 2201600)  # another policy's range is its own


def test_cpufreq_read_only_attributes_and_the_cpu_links(orin6_kernel):
    k = orin6_kernel
    pol = _policy(k, "policy8")
    for name in ("scaling_available_frequencies", "cpuinfo_max_freq", "scaling_cur_freq", "related_cpus"):
        assert refused(pol / name, "1") == errno.EACCES
    assert stat.S_IMODE(os.stat(pol / "cpuinfo_cur_freq").st_mode) == 0o400  # cpufreq.rst: "only root can read it"
    assert (pol / "related_cpus").read_text().split() == ["8", "9", "10", "11"]
    assert os.path.realpath(k.mountpoint / "sys/devices/system/cpu/cpu10/cpufreq") == str(pol)
    write(k.mountpoint / "sys/devices/system/cpu/cpu10/cpufreq/scaling_max_freq", "960000")
    assert k.cpu_range_khz("policy8") == (115200, 960000)
    assert ("policy8/scaling_max_freq", "960000", 0) in k.log
    assert refused(pol / "scaling_governor", "turbo") == errno.EINVAL


# -- BPMP's EMC clock (jetson_clocks' files) -----------------------------------------------------------------------------
def test_emc_rate_written_holds_only_while_mrq_rate_locked(orin6_kernel):
    k = orin6_kernel
    assert k.emc_state() == (0, EMC_RATE_HZ)
    write(k.emc / "rate", "665600000")  # unlocked: the kernel's choice shows
    assert k.emc_state() == (0, EMC_RATE_HZ)
    write(k.emc / "mrq_rate_locked", "1")
    assert k.emc_state() == (1, 665600000)  # the rate written last holds
    k.set_emc_kernel_rate_hz(2133000000)
    assert k.emc_state() == (1, 665600000)
    write(k.emc / "mrq_rate_locked", "0")
    assert k.emc_state() == (0, 2133000000)  # given back to the kernel


def test_emc_files_refuse_what_bpmp_would(orin6_kernel):
    k = orin6_kernel
    assert refused(k.emc / "mrq_rate_locked", "2") == errno.EINVAL
    assert refused(k.emc / "rate", "fast") == errno.EINVAL
    for name in ("min_rate", "max_rate"):
        assert refused(k.emc / name, "204000000") == errno.EACCES
    assert refused(k.mountpoint / EMC_POSSIBLE_RATES, "1") == errno.EACCES
    write(k.emc / "mrq_rate_locked", "1")
    write(k.emc / "rate", "1000000000")  # between two rates of BPMP's table: the fake's BPMP takes the one above
    assert k.emc_state() == (1, 2133000000)
    k.set_emc_floor_hz(665600000)
    write(k.emc / "rate", "204000000")  # below min_rate: held at the floor
    assert k.emc_state() == (1, 665600000)


def test_nvpmodel_writes_each_clusters_cpu_range_and_the_emc_cap(orin6_kernel):
    k = orin6_kernel
    k.set_nvpmodel_mode(2)
    mode = nvpmodel_mode(2)
    assert {n: k.cpu_range_khz(n) for n in ("policy0", "policy4", "policy8")} == \
        {n: (mode.cpu_min_khz, mode.cpu_max_khz) for n in ("policy0", "policy4", "policy8")}
    assert int((k.mountpoint / EMC_ISO_CAP).read_text()) == mode.emc_max_hz == 2133000000
    k.set_nvpmodel_mode(0)  # MAXN: CPU MIN_FREQ 0 and MAX_FREQ -1, EMC MAX_FREQ 0: no limits
    assert k.cpu_range_khz("policy0") == (115200, 2201600) and (k.mountpoint / EMC_ISO_CAP).read_text() == "0\n"
