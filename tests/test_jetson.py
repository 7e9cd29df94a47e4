from __future__ import annotations

import time

import pytest

from dvfs_mlops.device import open_device
from dvfs_mlops.device.jetson import JetsonDevice, find_gpu_devfreq, find_rails
from dvfs_mlops.errors import DevicePermissionError, DvfsError, UnknownNameError
from tests.fakes.sysfs import ORIN_TABLE_HZ, make_old_ina_tree

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


def test_pin_lowering_writes_min_first_and_restores(orin, devfreq_writes):
    dev = JetsonDevice()
    with dev.session(612):
        assert orin.range_hz == (612000000, 612000000)
    assert devfreq_writes[:2] == [("min_freq", 612000000), ("max_freq", 612000000)]
    assert orin.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
    # restore raised max first? max was already 612 -> 1300.5 is raising, min 306 lowering: min first is valid
    assert orin.read("governor") == "nvhost_podgov"


def test_pin_raising_writes_max_first(orin, devfreq_writes):
    dev = JetsonDevice()
    dev.write_range(306000000, 408000000)  # someone capped the GPU low
    devfreq_writes.clear()
    with dev.session(1020):
        assert orin.range_hz == (1020000000, 1020000000)
    assert devfreq_writes[:2] == [("max_freq", 1020000000), ("min_freq", 1020000000)]
    assert orin.range_hz == (306000000, 408000000)  # restored exactly what it found
    assert devfreq_writes[2:] == [("min_freq", 306000000), ("max_freq", 408000000)]


def test_maxn_opens_the_full_range(orin, devfreq_writes):
    dev = JetsonDevice()
    dev.write_range(816000000, 816000000)
    devfreq_writes.clear()
    with dev.session("maxn"):
        assert orin.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
    assert orin.range_hz == (816000000, 816000000)


def test_maxn_on_default_state_writes_nothing(orin, devfreq_writes):
    with JetsonDevice().session("maxn"):
        pass
    assert devfreq_writes == []


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
    # VDD_GPU_SOC 5 V * 2.4 A = 12 W, VDD_CPU_CV 6.5 W: the study's CPU+GPU energy
    assert r.energy_j == pytest.approx(18.5 * wall, rel=0.02)
    assert r.energy_by_rail_j["VDD_GPU_SOC"] == pytest.approx(12.0 * wall, rel=0.02)
    assert r.energy_total_j == pytest.approx((12.0 + 6.5 + 2.5 + 1.5) * wall, rel=0.02)
    assert 40 <= r.samples <= 60 and r.simulated is False
    assert r.gpu_util_pct == pytest.approx(52.3)
    assert r.peak_power_w == pytest.approx(22.5)


def test_energy_tracks_changing_power(orin):
    dev = JetsonDevice(sample_hz=100)
    with dev.session(816) as s:
        time.sleep(0.5)
        orin.set_rail("VDD_GPU_SOC", 5000, 4400)  # 22 W
        time.sleep(0.5)
    e = s.report().energy_by_rail_j["VDD_GPU_SOC"]
    assert e == pytest.approx(12 * 0.5 + 22 * 0.5, rel=0.05)


def test_permission_error_is_clear(orin, monkeypatch):
    import builtins

    from dvfs_mlops.device import jetson

    real_open = builtins.open

    def deny(path, mode="r", *a, **k):
        if "w" in mode and str(path).endswith(("min_freq", "max_freq")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(jetson, "open", deny, raising=False)
    with pytest.raises(DevicePermissionError, match="run as root"):
        with JetsonDevice().session(612):
            pass
    assert orin.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])


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
