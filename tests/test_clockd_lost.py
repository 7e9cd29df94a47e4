"""Issue 42, items 7 and 8, with real processes: the clock service relays the clock BPMP measures to a member who
cannot read debugfs, and a member notices when the service goes away under its job: it marks the window, pins again
through the restarted service, or ends the job with one line. The service runs as root on a fake Orin tree; members
are uid 65534 in the served group `users` (testkit/clockd_rig.py). Without root these skip.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from testkit.clockd_rig import ROOT_ONLY, Rig, served_rig, wait_for
from testkit.fakes.sysfs import GPC_CLOCK_FILES, ORIN_TABLE_HZ, set_gpc_clock_hz

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
PINNED = (612000000, 612000000)
FAST = "[service]\nidle_timeout = 2\n"  # a renew every 1/6 s

pytestmark = ROOT_ONLY


@pytest.fixture
def rig() -> Iterator[Rig]:
    with served_rig() as r:
        r.configure(FAST)
        yield r


def _root_only_gpc_counters(rig: Rig, hz: int) -> None:
    """BPMP's GPC counters as a board has them: debugfs, which the kernel mounts 0700 root (fs/debugfs/inode.c,
    DEBUGFS_DEFAULT_MODE), so only root reads them (jetson-stats reads them as root: rbonghi/jetson_stats
    jtop/core/gpu.py, igpu_read_freq)."""
    set_gpc_clock_hz(rig.fake.root, hz)
    debug = rig.fake.root / "sys/kernel/debug"
    debug.chmod(0o700)
    for rel in GPC_CLOCK_FILES:
        (rig.fake.root / rel).chmod(0o600)


def _finish(member: subprocess.Popen) -> tuple[list[str], dict, dict]:
    out, err = member.communicate("done\n", timeout=120)
    lines = out.splitlines()
    assert member.returncode == 0, out + err
    context = json.loads(next(x for x in lines if x.startswith("CONTEXT ")).removeprefix("CONTEXT "))
    held = json.loads(next((x for x in lines if x.startswith("HELD ")), "HELD {}").removeprefix("HELD "))
    return lines, context, held


def test_a_member_gets_the_clock_bpmp_measures_through_the_service(rig):
    _root_only_gpc_counters(rig, 612000000)
    rig.start()
    member = rig.pinned_client("612", mode="train")
    assert wait_for(lambda: rig.logged("pinned jetson-17000000.gpu at 612 MHz"), 5)
    lines, context, held = _finish(member)
    assert "RESTORED" in lines
    assert context["clock_source"] == "measured"  # not devfreq's cur_freq, the rate the driver was asked for
    assert held == {"train": True, "session": True}  # judged on the measured clock: 612 MHz, held
    set_gpc_clock_hz(rig.fake.root, 408000000)  # the board ran slower than pinned (a cap the request does not show)
    member = rig.pinned_client("612", mode="train")
    _lines, context, held = _finish(member)
    assert context["clock_source"] == "measured" and held == {"train": False, "session": False}


def test_a_restarted_service_is_noticed_and_the_clock_pinned_again_with_the_gap_marked(rig):
    service = rig.start()
    member = rig.pinned_client("612", mode="train")
    service.kill()  # a crash: nothing restored, the journal stays
    service.wait(timeout=10)
    rig.start()  # systemd's Restart=on-failure: the journal is applied, then the socket listens again
    assert "on start: restored jetson-17000000.gpu" in rig.log.read_text()
    assert wait_for(lambda: rig.log.read_text().count("pinned jetson-17000000.gpu at 612 MHz") == 2, 30)  # pinned again
    assert rig.fake.range_hz == PINNED
    lines, context, held = _finish(member)
    assert "RESTORED" in lines and rig.fake.range_hz == DEFAULT and rig.journals() == []
    assert "pinned again each time" in context["clock_lost"] and context["clock_unheld_s"] > 0
    assert held == {"train": False, "session": False}  # the run's windows span the gap: not labelled as held


def test_a_service_that_does_not_come_back_ends_the_job_with_one_line(rig):
    service = rig.start()
    member = rig.pinned_client("612", mode="train", CLOCKD_TEST_REPIN_S="1")
    service.send_signal(signal.SIGTERM)  # stopped for good: it restores every pin and closes every connection
    assert service.wait(timeout=30) == 0 and rig.fake.range_hz == DEFAULT
    out = member.stdout.read()
    member.wait(timeout=60)
    lost = next(x for x in out.splitlines() if x.startswith("LOST "))
    assert "it could not be pinned again within 1 s" in lost and "does not answer" in lost
    assert "this run is not a measurement at that clock" in lost
    context = json.loads(next(x for x in out.splitlines() if x.startswith("CONTEXT ")).removeprefix("CONTEXT "))
    assert context["clock_lost"] == lost.removeprefix("LOST ")


def test_a_run_command_whose_service_goes_away_fails_with_one_line_not_a_clock_it_did_not_hold(rig):
    service = rig.start()
    run = rig.client(str(rig.gid), "cli", "run", "--device", "jetson", "--freq", "612", "--", "sleep", "3",
                     CLOCKD_TEST_REPIN_S="1")
    assert wait_for(lambda: rig.fake.range_hz == PINNED, 30)
    time.sleep(0.5)  # the pin's reply is on its way: `sleep` runs under the pin
    service.kill()
    service.wait(timeout=10)
    out, err = run.communicate(timeout=60)
    errors = [x for x in err.strip().splitlines() if x.startswith("Error: ")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "was not held from" in errors[0] and "not a measurement at that clock" in errors[0]
    assert out == ""  # no result printed for a clock it did not hold
