"""The clock service pins the CPU and memory (EMC) clocks with the GPU's for its members, with real processes: the
service as root on a fake Orin tree, its clients dropped to uid 65534 (testkit/clockd_rig.py). One owner per domain,
restore on disconnect, the EMC read back for a member who cannot read debugfs, and every refusal one line with nothing
touched. Without root these skip."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from dvfs_mlops.hw.clockd.protocol import Request
from testkit.clockd_rig import NOBODY, ROOT_ONLY, Rig, served_rig, wait_for
from testkit.fakes.sysfs import ORIN_TABLE_HZ, cpu_table_khz

GPU_DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
CPU = cpu_table_khz(2201600)
CPU_DEFAULT = (CPU[0], CPU[-1])
POLICIES = ("policy0", "policy4", "policy8")

pytestmark = ROOT_ONLY


@pytest.fixture
def rig() -> Iterator[Rig]:
    with served_rig() as r:
        # The rig opens its whole tree to the clients; debugfs and cpuinfo_cur_freq are root's on a board (debugfs 0700;
        # cpufreq.rst: cpuinfo_cur_freq "only root can read it"), which is what these tests are about: closed again.
        (r.fake.root / "sys/kernel/debug").chmod(0o700)
        for pol in r.fake.policies:
            (pol / "cpuinfo_cur_freq").chmod(0o400)
        yield r


def _cpu(rig: Rig) -> dict[str, tuple[int, int]]:
    return {p: rig.fake.cpu_range_khz(p) for p in POLICIES}


def _restored(rig: Rig) -> bool:
    return (rig.fake.range_hz == GPU_DEFAULT and _cpu(rig) == {p: CPU_DEFAULT for p in POLICIES}
            and rig.fake.emc_state()[0] == 0)


def test_the_service_table_offers_the_cpu_and_emc_clocks_it_can_pin(rig):
    rig.start()
    table = rig.ask(Request("table", "jetson"))
    assert table.cpu_frequencies_mhz[-1] == 2201.6 and 1420.8 in table.cpu_frequencies_mhz
    assert table.emc_frequencies_mhz == [204.0, 665.6, 2133.0, 3199.0] and table.emc_table_source == "bpmp possible_rates"


def test_a_member_pins_cpu_and_emc_through_the_service_and_reads_the_emc_it_cannot(rig):
    rig.start()
    for name in POLICIES:  # a plain tree: play the kernel, whose scaling_cur_freq shows the clock about to be pinned
        (rig.fake.policy(name) / "scaling_cur_freq").write_text("960000\n")
    proc = rig.client(str(rig.gid), "session", "jetson", "612", "train", "-", "960", "665.6")
    assert proc.stdout.readline().strip() == "PINNED", proc.stderr.read()
    assert wait_for(lambda: rig.fake.emc_state() == (1, 665600000), 5.0)
    assert _cpu(rig) == {p: (960000, 960000) for p in POLICIES} and rig.fake.range_hz == (612000000, 612000000)
    journals = {j.device_key: j for j in rig.journals()}
    assert set(journals) == {"jetson-17000000.gpu", "jetson-cpufreq", "jetson-emc"}
    assert {(j.uid, j.pid) for j in journals.values()} == {(NOBODY, proc.pid)}  # the member's, written by root
    [pin] = rig.ask(Request("status")).pins
    assert pin.requested == "612, CPU 960, EMC 665.6" and pin.uid == NOBODY
    time.sleep(0.1)
    out, err = proc.communicate("stop\n", timeout=60)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "RESTORED", out
    context = json.loads(lines[1].removeprefix("CONTEXT "))
    assert context["emc_mhz"] == pytest.approx(665.6) and context["emc_held"] is True  # relayed by the service
    assert context["cpu_mhz_measured"] == pytest.approx(960) and context["cpu_held"] is True
    assert context["cpu_clock_source"] == "requested"  # cpuinfo_cur_freq is root's: scaling_cur_freq
    assert _restored(rig) and rig.journals() == []


def test_a_members_cpu_and_emc_pins_are_lost_when_it_is_killed(rig):
    rig.start()
    proc = rig.pinned_client("612", "jetson", "-", "960", "2133")
    assert rig.fake.emc_state() == (1, 2133000000) and _cpu(rig)["policy8"] == (960000, 960000)
    proc.kill()
    assert wait_for(lambda: _restored(rig), 5.0), (rig.fake.emc_state(), _cpu(rig))
    proc.wait(timeout=10)
    assert wait_for(lambda: not rig.journals(), 2.0)
    assert rig.logged("its client disconnected")


def test_one_owner_per_domain_across_members(rig):
    rig.start()
    first = rig.pinned_client("612", "jetson", "-", "960")
    out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "612", "--cpu-freq", "1420.8", "--", "true")
    assert out.returncode == 2
    errors = [x for x in out.stderr.strip().splitlines() if not x.startswith("device: ")]
    assert len(errors) == 1 and f"PID {first.pid}" in errors[0] and "Traceback" not in out.stderr, out.stderr
    assert _cpu(rig)["policy0"] == (960000, 960000)  # the owner's pin untouched
    first.kill()
    first.wait(timeout=10)


@pytest.mark.parametrize("what", ["below the floor", "not in the table"])
def test_a_member_asking_for_a_bad_emc_clock_gets_one_line_and_nothing_is_touched(rig, what):
    (rig.fake.emc / "min_rate").write_text("665600000\n")  # BPMP holds a floor: only the service can read it
    rig.start()
    emc = "204" if what == "below the floor" else "1000"
    out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "612", "--emc-freq", emc, "--", "true")
    errors = [x for x in out.stderr.strip().splitlines() if not x.startswith("device: ")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    expected = "below the EMC floor of 665.6 MHz" if what == "below the floor" else "unknown memory (EMC) clock '1000'"
    assert expected in errors[0], errors[0]
    assert _restored(rig) and rig.journals() == [] and not rig.logged("pinned jetson", within_s=0.2)


def test_without_root_or_service_an_emc_clock_is_one_line_and_nothing_is_touched(rig):
    out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "612", "--emc-freq", "2133", "--", "true")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "setting the memory (EMC) clock needs root" in lines[0] and "clockd install" in lines[0]
    assert _restored(rig) and not any(rig.home.iterdir())


def test_a_member_moves_the_cpu_clock_through_the_service_and_the_journal_keeps_the_first_state(rig):
    from dvfs_mlops.hw.clockd.client import ClockdClient

    rig.start()
    client = ClockdClient(rig.socket)  # root's own connection, as a member's session makes it
    try:
        client.request(Request("pin", "jetson", freq="612")).raise_for_error()
        reply = client.request(Request("repin", "jetson", freq="510", cpu_freq="960", emc_freq="2133")).raise_for_error()
        assert reply.context["cpu_khz_by_policy"] == "policy0:960000,policy4:960000,policy8:960000"
        assert _cpu(rig)["policy4"] == (960000, 960000) and rig.fake.emc_state() == (1, 2133000000)
        keys = {j.device_key for j in rig.journals()}
        assert keys == {"jetson-17000000.gpu", "jetson-cpufreq", "jetson-emc"}
        client.request(Request("repin", "jetson", freq="510", cpu_freq="1420.8")).raise_for_error()
        assert _cpu(rig)["policy4"] == (1420800, 1420800) and rig.fake.emc_state() == (1, 2133000000)
        client.request(Request("restore")).raise_for_error()
    finally:
        client.close()
    assert _restored(rig) and rig.journals() == []
