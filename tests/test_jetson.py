from __future__ import annotations

import time

import pytest

from dvfs_mlops.errors import DevicePermissionError, DvfsError, UnknownNameError
from dvfs_mlops.hw import open_device
from dvfs_mlops.hw.jetson import JetsonDevice, find_gpu_devfreq, find_rails
from testkit.fakes.sysfs import NX_RAILS_W, ORIN_MODULES, ORIN_TABLE_HZ, make_old_ina_tree, make_orin_tree, set_gpc_clock_hz

TABLE_MHZ = [h / 1e6 for h in ORIN_TABLE_HZ]


def test_detects_gpu_node_not_other_devfreq(orin):
    node = find_gpu_devfreq()
    assert node is not None and node.name in ("17000000.ga10b", "17000000.gpu")
    assert "vic" not in str(node)


def test_auto_picks_jetson_and_says_so(orin):
    said: list[str] = []
    dev = open_device("auto", announce=said.append)
    assert dev.name == "jetson" and dev.profile == "jetson-agx-orin-64gb"
    assert "jetson" in said[0]


def test_frequency_table(orin):
    assert JetsonDevice().frequencies_mhz == TABLE_MHZ


def test_rails_skip_nc_and_channel_7(orin):
    names = sorted(r.name for r in find_rails())
    assert names == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC", "VIN_SYS_5V0"]


def test_old_iio_rail_layout(tmp_path):
    make_old_ina_tree(tmp_path)
    rails = {r.name: r.watts() for r in find_rails(tmp_path)}
    assert rails == pytest.approx({"GPU": 5.0, "CPU": 3.0, "SOC": 1.0})


# The kernel-rule tests run on orin_kernel: a FUSE-served tree whose daemon enforces devfreq's rules
# (testkit/fakes/kernelfs.py), so JetsonDevice writes real files and the kernel fake judges each write(2).
def test_pin_lowering_writes_min_first_and_restores(orin_kernel):
    k = orin_kernel
    with JetsonDevice().session(612):
        assert k.range_hz == (612000000, 612000000)
        assert k.read("cur_freq") == "612000000"
    assert k.writes[:2] == [("min_freq", 612000000), ("max_freq", 612000000)]
    assert k.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
    assert k.read("governor") == "nvhost_podgov"
    assert all(err == 0 for _, _, err in k.log)  # the kernel refused nothing


def test_pin_raising_writes_max_first(orin_kernel):
    k = orin_kernel
    dev = JetsonDevice()
    dev.write_range(306000000, 408000000)  # someone capped the GPU low, by hand (not through a power mode)
    k.log.clear()
    with dev.session(1020):
        assert k.range_hz == (1020000000, 1020000000)
    assert k.writes[:2] == [("max_freq", 1020000000), ("min_freq", 1020000000)]
    # restored to the user-level range of the power mode in force (MAXN: the whole table), never to a read
    assert k.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
    assert k.writes[2:] == [("min_freq", ORIN_TABLE_HZ[0]), ("max_freq", ORIN_TABLE_HZ[-1])]
    assert all(err == 0 for _, _, err in k.log)


def test_the_kernel_tree_refuses_min_above_max(orin_kernel):
    import errno

    k = orin_kernel
    (k.node / "min_freq").write_text("1020000000")  # max is 1300.5 MHz: fine
    with pytest.raises(OSError) as e:
        (k.node / "max_freq").write_text("612000000")  # now max < min
    assert e.value.errno == errno.EINVAL and k.range_hz == (1020000000, 1300500000)
    with pytest.raises(OSError) as e:
        (k.node / "governor").write_text("turbo")
    assert e.value.errno == errno.EINVAL


def test_naive_write_order_is_refused_by_the_kernel(orin_kernel):
    """The order write_range uses is what makes a raise legal: max first."""
    k = orin_kernel
    dev = JetsonDevice()
    dev.write_range(306000000, 408000000)
    with pytest.raises(DvfsError, match="Invalid argument"):
        dev._write("min_freq", "1020000000")  # min before max while raising: EINVAL
    assert k.range_hz == (306000000, 408000000)
    assert ("min_freq", "1020000000", 22) in k.log


def test_maxn_writes_nothing_and_keeps_the_range_found(orin_kernel):
    k = orin_kernel
    dev = JetsonDevice()
    dev.write_range(306000000, 816000000)  # e.g. a lower power mode's cap
    k.log.clear()
    with dev.session("maxn") as s:
        assert k.range_hz == (306000000, 816000000)
    assert k.log == [] and k.range_hz == (306000000, 816000000)
    assert s.report().clock_mhz_measured == pytest.approx(816)


def test_throttled_clock_does_not_hold(orin_kernel):
    k = orin_kernel
    k.set_throttle_cap_hz(510000000)  # thermal throttling: QoS max below the pin wins
    with JetsonDevice(sample_hz=200).session(918) as s:
        # the reads are get_freq_range()'s: the cap, not the 918 MHz the session wrote
        assert k.range_hz == (510000000, 510000000) and k.read("cur_freq") == "510000000"
        time.sleep(0.1)
    assert s.report().clock_held is False and s.report().clock_mhz_measured == pytest.approx(510)
    assert s.context["cap_at_start_mhz"] == pytest.approx(510)  # the cap was there before the pin


# -- the power mode (issue 42 items 1 and 2): nvpmodel's GPU cap is devfreq's own max_freq ---------------------------
def test_a_pin_above_the_modes_cap_is_refused_in_one_line_and_nothing_is_written(orin6_kernel, state_dir):
    k = orin6_kernel
    k.set_nvpmodel_mode(2)  # MODE_30W: GPU MAX_FREQ 612 MHz, written into max_freq as nvpmodel does
    k.clear_log()
    with pytest.raises(DvfsError) as e, JetsonDevice(sample_hz=200).session(918):
        pass
    message = str(e.value)
    assert "above the 612 MHz GPU cap of power mode 2:MODE_30W" in message and "--above-mode-cap" in message
    assert "\n" not in message and k.log == [] and not list(state_dir.iterdir())  # nothing written, no lock, no journal
    assert k.range_hz == (ORIN_TABLE_HZ[0], 612000000)


def test_a_pin_above_the_modes_cap_runs_there_when_allowed_and_restore_puts_the_mode_back(orin6_kernel):
    k = orin6_kernel
    k.set_nvpmodel_mode(2)
    with JetsonDevice(sample_hz=200, above_mode_cap=True).session(918) as s:
        time.sleep(0.1)
        assert k.read("cur_freq") == "918000000"  # the mode's cap is the file just written: the GPU runs at 918 MHz
    assert s.context.get("above_mode_cap") is True and s.context["nvpmodel_mode"] == "2:MODE_30W"
    assert s.report().clock_held is True and s.report().clock_mhz_measured == pytest.approx(918)
    assert k.range_hz == (ORIN_TABLE_HZ[0], 612000000)  # the mode's range again
    assert "cap_at_start_mhz" not in s.context  # 612 MHz is the mode's own top: no cap beyond the mode


def test_restore_never_writes_back_a_thermal_cap_read_at_the_start(orin_kernel):
    """A point started under a thermal cap must not keep the cap for good: the cap reads back in max_freq
    (get_freq_range), and writing that read back would make it the user's own limit."""
    k = orin_kernel
    k.set_throttle_cap_hz(816000000)
    with JetsonDevice(sample_hz=200).session(612) as s:
        pass
    assert s.context["cap_at_start_mhz"] == pytest.approx(816)
    k.set_throttle_cap_hz(None)  # the board cooled down
    assert k.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1]) and k.read("cur_freq") == str(ORIN_TABLE_HZ[-1])
    with JetsonDevice(sample_hz=200).session("maxn") as s:  # the next MAXN baseline runs uncapped
        pass
    assert "cap_at_start_mhz" not in s.context and s.report().clock_mhz_measured == pytest.approx(1300.5)


def test_a_maxn_point_under_a_cap_is_marked_and_writes_nothing(orin6_kernel):
    k = orin6_kernel
    k.set_throttle_cap_hz(918000000)
    k.clear_log()
    with JetsonDevice(sample_hz=200).session("maxn") as s:
        time.sleep(0.05)
    assert k.log == [] and s.context["cap_at_start_mhz"] == pytest.approx(918)
    with JetsonDevice(sample_hz=200).session(510, observe=True) as s:  # observe says so too
        pass
    assert s.context["cap_at_start_mhz"] == pytest.approx(918)


def test_nvpmodel_run_during_a_session_stands_after_the_restore(orin6_kernel):
    k = orin6_kernel
    with JetsonDevice(sample_hz=200).session(816):
        k.set_nvpmodel_mode(1)  # the administrator switches to MODE_15W while the point runs
    assert k.range_hz == (ORIN_TABLE_HZ[0], 408000000)  # the restore honours the mode in force, not the one found


def test_the_restore_range_is_the_modes_min_and_max(tmp_path, monkeypatch):
    from testkit.fakes.sysfs import FakeKernel

    fake = make_orin_tree(tmp_path / "root")
    conf = fake.root / "etc/nvpmodel.conf"
    conf.write_text(conf.read_text().replace("< POWER_MODEL ID=3 NAME=MODE_50W >", "< POWER_MODEL ID=3 NAME=MODE_50W >\n"
                                             "GPU MIN_FREQ 408000000").replace("GPU MIN_FREQ 0\nGPU MAX_FREQ 816000000",
                                                                               "GPU MAX_FREQ 816000000"))
    kernel = FakeKernel(fake)
    kernel.set_nvpmodel_mode(3)
    dev = JetsonDevice(root=fake.root, writer=kernel.write)
    assert dev.power_mode().gpu_min_mhz == 408 and dev.user_range_hz() == (408000000, 816000000)
    with dev.session(612):
        assert fake.range_hz == (612000000, 612000000)
    assert fake.range_hz == (408000000, 816000000)
    (fake.root / "etc/nvpmodel.conf").unlink()  # no mode readable: the table's ends
    assert dev.user_range_hz() == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])


def test_the_power_mode_is_one_record_on_the_board_and_in_the_session(orin6_kernel):
    from dvfs_mlops.hw.board import Board, PowerMode, board_of

    k = orin6_kernel
    k.set_nvpmodel_mode(1)
    dev = JetsonDevice(sample_hz=200)
    mode = dev.power_mode()
    cpu = ((0, 729600, 1113600), (4, 729600, 1113600), (8, 729600, 1113600))  # each cluster's CPU_A78_<k> range, kHz
    assert mode == PowerMode(1, "MODE_15W", gpu_max_mhz=408.0, gpu_min_mhz=None, tpc_pg_mask=0xC, cpu_ranges=cpu,
                             emc_max_mhz=2133.0)
    board = board_of(dev, "cpu")
    assert board.power_mode == mode and Board.from_json(board.to_json()).power_mode == mode
    assert board.power_mode_key == "nvpmodel 1:MODE_15W gpu_max_mhz=408 tpc_pg_mask=12"
    with dev.session(306) as s:
        pass
    assert s.power_mode == mode and s.context["nvpmodel_tpc_pg_mask"] == 0xC
    k.set_nvpmodel_mode(0)
    assert JetsonDevice().power_mode().identity() == "" and board_of(JetsonDevice(), "cpu").power_mode_key == ""


def test_read_only_devfreq_is_a_permission_error_and_nothing_changes(orin_kernel, state_dir):
    k = orin_kernel
    k.read_only = True
    with pytest.raises(DevicePermissionError, match="--observe"), JetsonDevice().session(612):
        pass
    assert k.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1]) and k.writes == []
    assert not list(state_dir.glob("restore-*.json"))  # nothing pinned, nothing to restore


def test_meter_retries_one_eio_and_counts_a_sample_lost_to_two(orin6_kernel):
    k = orin6_kernel
    with JetsonDevice(sample_hz=100).session(816) as s:
        time.sleep(0.1)
        k.fail_rail_reads(1)  # a transient error: the retry reads the rail
        time.sleep(0.1)
        k.fail_rail_reads(2)  # the retry fails too: the sample is lost
        time.sleep(0.1)
    r = s.report()
    assert r.samples_failed == 1  # one lost in ~30: the counter sees it (and may flag the run degraded)
    assert r.energy_by_rail_j["VDD_GPU_SOC"] == pytest.approx(12.0 * r.duration_s, rel=0.05)


def test_invalid_frequency_lists_valid_ones(orin):
    with pytest.raises(UnknownNameError) as e:
        JetsonDevice().session(700)
    assert "612" in str(e.value) and "1300.5" in str(e.value) and "maxn" in str(e.value)


def test_energy_of_constant_rails_within_2_percent(orin):
    dev = JetsonDevice(sample_hz=50)
    t0 = time.monotonic()
    with dev.session(816) as s:
        time.sleep(1.0)
    wall = time.monotonic() - t0
    r = s.report()
    # The meter's interval is the session's, not the pin and restore around it (which a loaded machine can
    # stretch by tens of ms): energy is judged over that interval, and the interval against the wall clock.
    assert 1.0 <= r.duration_s <= wall
    # VDD_GPU_SOC 5 V * 2.4 A = 12 W, VDD_CPU_CV 6.5 W: the study's CPU+GPU energy
    assert r.energy_j == pytest.approx(18.5 * r.duration_s, rel=0.02)
    assert r.energy_by_rail_j["VDD_GPU_SOC"] == pytest.approx(12.0 * r.duration_s, rel=0.02)
    # VIN_SYS_5V0 feeds VDDQ_VDD2_1V8AO: the DRAM rail (1.5 W) is read and logged, not added again
    assert r.energy_total_j == pytest.approx((12.0 + 6.5 + 2.5) * r.duration_s, rel=0.02)
    assert r.energy_by_rail_j["VDDQ_VDD2_1V8AO"] == pytest.approx(1.5 * r.duration_s, rel=0.02)
    assert r.energy_source == "samples" and s.context["energy_source"] == "samples"
    assert 40 <= r.samples <= 60 and r.simulated is False
    assert r.gpu_util_pct == pytest.approx(52.3)
    assert r.peak_power_w == pytest.approx(21.0)


def test_energy_tracks_changing_power(orin):
    dev = JetsonDevice(sample_hz=100)
    with dev.session(816) as s:
        time.sleep(0.5)
        orin.set_rail("VDD_GPU_SOC", 5000, 4400)  # 22 W
        time.sleep(0.5)
    e = s.report().energy_by_rail_j["VDD_GPU_SOC"]
    assert e == pytest.approx(12 * 0.5 + 22 * 0.5, rel=0.05)


def test_permission_error_is_clear(orin_kernel):
    orin_kernel.read_only = True  # as for a user who is not root (chmod cannot show that to root)
    with pytest.raises(DevicePermissionError, match="run as root"):
        with JetsonDevice().session(612):
            pass
    assert orin_kernel.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])


def test_refuses_symlink_out_of_node(orin, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (orin.node / "min_freq").unlink()
    (orin.node / "min_freq").symlink_to(victim)
    with pytest.raises(DvfsError, match="outside the GPU devfreq node"):
        JetsonDevice()._write("min_freq", "612000000")
    assert victim.read_text() == "keep\n"


def test_no_jetson_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(tmp_path))
    with pytest.raises(DvfsError, match="no Jetson GPU devfreq node"):
        open_device("jetson")


# -- which module (issue 31, item 4): the device tree's compatible names it -------------------------------------------
@pytest.mark.parametrize(("module", "profile"), [
    ("p3701-0005", "jetson-agx-orin-64gb"),  # keeps its name: its sweeps keep their ids
    ("p3701-0000", "jetson-agx-orin-64gb"),  # the first developer kit's module: the same GPU, the name it always had
    ("p3701-0004", "jetson-agx-orin-32gb"),
    ("p3767-0000", "jetson-orin-nx-16gb"),
    ("p3767-0001", "jetson-orin-nx-8gb"),
    ("p3767-0003", "jetson-orin-nano-8gb"),
    ("p3767-0005", "jetson-orin-nano-8gb"),  # the developer kit's module
    ("p3767-0004", "jetson-orin-nano-4gb"),
])
def test_the_module_is_named_from_the_device_tree(tmp_path, monkeypatch, module, profile):
    fake = make_orin_tree(tmp_path / "root", module=module)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    dev = open_device("jetson")
    assert dev.profile == profile and dev.module == module and dev.info().detail["module"] == module
    # the clock table is the board's devfreq node's, not a constant: this module's ceiling (its data sheet's)
    table = sorted(int(x) / 1e6 for x in fake.read("available_frequencies").split())
    assert dev.frequencies_mhz == table and max(table) <= ORIN_MODULES[module].gpu_max_hz / 1e6


def test_the_32gb_agx_orin_is_not_taken_for_the_64gb_one(tmp_path):
    """Both modules sit on the same developer-kit carrier and show the same model string: only compatible tells."""
    small, big = make_orin_tree(tmp_path / "32", module="p3701-0004"), make_orin_tree(tmp_path / "64")
    assert (small.root / "proc/device-tree/model").read_text() == (big.root / "proc/device-tree/model").read_text()
    assert JetsonDevice(root=small.root).profile == "jetson-agx-orin-32gb"
    assert JetsonDevice(root=big.root).profile == "jetson-agx-orin-64gb"


def test_a_super_device_tree_and_the_sysfs_path_of_the_device_tree(tmp_path):
    fake = make_orin_tree(tmp_path / "root", module="p3767-0005", super_dt=True)
    assert JetsonDevice(root=fake.root).profile == "jetson-orin-nano-8gb-super"
    (fake.root / "proc/device-tree").unlink()  # only /sys/firmware/devicetree/base left
    assert JetsonDevice(root=fake.root).profile == "jetson-orin-nano-8gb-super"


def test_another_board_is_named_by_its_model(tmp_path):
    fake = make_orin_tree(tmp_path / "root")
    base = fake.root / "sys/firmware/devicetree/base"
    # A Xavier NX on its developer-kit carrier (NVIDIA/jetson-gpio gpio_pin_data.py, compats_nx)
    (base / "compatible").write_bytes(b"nvidia,p3509-0000+p3668-0001\x00nvidia,p3668-0001\x00nvidia,tegra194\x00")
    (base / "model").write_text("NVIDIA Jetson Xavier NX Developer Kit\x00")
    assert JetsonDevice(root=fake.root).profile == "jetson-nvidia-jetson-xavier-nx-developer-kit"  # as before
    (base / "compatible").write_bytes(b"nvidia,p3737-0000+p3701-0008\x00nvidia,p3701-0008\x00nvidia,tegra234\x00")
    assert JetsonDevice(root=fake.root).profile == "jetson-agx-orin-p3701-0008"  # an AGX Orin module the table lacks


# -- energy per rail set (issue 31, item 3) ---------------------------------------------------------------------------
def test_agx_orin_energy_is_gpu_soc_plus_cpu_cv_and_says_so(orin6):
    with JetsonDevice(sample_hz=100).session(816) as s:
        time.sleep(0.3)
    r = s.report()
    assert r.energy_rails == ("VDD_GPU_SOC", "VDD_CPU_CV") and not r.cpu_gpu_combined
    # no input rail: the rails no other rail feeds (VIN_SYS_5V0 feeds VDDQ_VDD2_1V8AO: energymon JetsonPowerRails.md)
    assert r.total_rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
    assert r.energy_gpu_j == pytest.approx(12.0 * r.duration_s, rel=0.03)
    assert r.energy_cpu_j == pytest.approx(6.5 * r.duration_s, rel=0.03)
    assert r.to_dict()["energy_rails"] == ("VDD_GPU_SOC", "VDD_CPU_CV")


@pytest.mark.parametrize("module", ["p3767-0000", "p3767-0003"])
def test_orin_nx_and_nano_energy_is_cpu_gpu_cv_plus_soc_and_the_total_is_vdd_in(tmp_path, monkeypatch, module):
    fake = make_orin_tree(tmp_path / "root", module=module)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    assert sorted(r.name for r in find_rails()) == ["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"]
    with JetsonDevice(sample_hz=100).session(612) as s:
        time.sleep(0.4)
    r = s.report()
    d = r.duration_s
    # CPU, GPU, CV and SoC on every family: VDD_SOC joins the combined rail (the AGX Orin's VDD_GPU_SOC carries it)
    assert r.energy_j == pytest.approx((NX_RAILS_W["VDD_CPU_GPU_CV"] + NX_RAILS_W["VDD_SOC"]) * d, rel=0.03)
    # VDD_IN feeds the other two: the total is VDD_IN alone, never VDD_IN + its sub-rails
    assert r.energy_total_j == pytest.approx(NX_RAILS_W["VDD_IN"] * d, rel=0.03)
    assert r.peak_power_w == pytest.approx(NX_RAILS_W["VDD_IN"]) and r.avg_power_w == pytest.approx(NX_RAILS_W["VDD_IN"], rel=0.03)
    assert r.energy_rails == ("VDD_CPU_GPU_CV", "VDD_SOC") and r.total_rails == ("VDD_IN",)
    assert r.cpu_gpu_combined and r.energy_gpu_j is None and r.energy_cpu_j is None  # one rail: not separable
    out = r.to_dict()
    assert out["energy_rails"] == ("VDD_CPU_GPU_CV", "VDD_SOC") and out["cpu_gpu_combined"] is True


def test_the_kernel_trees_measured_clock_is_read_and_judged(orin6_kernel):
    k = orin6_kernel
    set_gpc_clock_hz(k.backing.root, 1)  # BPMP's GPC counters exist (root): the kernel tree serves the clock run at
    k.set_throttle_cap_hz(510000000)
    with JetsonDevice(sample_hz=200).session(918) as s:
        time.sleep(0.1)
    r = s.report()
    assert r.clock_source == "measured" and s.context["clock_source"] == "measured"
    assert r.clock_mhz_measured == pytest.approx(510) and r.clock_held is False
