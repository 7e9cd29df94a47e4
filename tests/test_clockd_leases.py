"""Issue 39 with real processes: leases a client renews, root's release, a clean shutdown, NVML's scope in root's
config. The service runs as root on a fake Orin tree (and a fake NVML where a test needs GPUs); members are uid 65534
in the served group `users` (testkit/clockd_rig.py). Without root these skip.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dvfs_mlops.hw.clockd.client import ClockdClient
from dvfs_mlops.hw.clockd.connection import pid_alive
from dvfs_mlops.hw.clockd.protocol import Request
from testkit.clockd_rig import REPO, ROOT_ONLY, Rig, served_rig, wait_for
from testkit.fakes.sysfs import ORIN_TABLE_HZ

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
KEY = "jetson-17000000.gpu"
U1, U2, U3 = ("GPU-11111111-3b0f-4c2e-9a8d-1f2e3d4c5b6a", "GPU-22222222-3b0f-4c2e-9a8d-1f2e3d4c5b6a",
              "GPU-33333333-3b0f-4c2e-9a8d-1f2e3d4c5b6a")
FAST = "[service]\nidle_timeout = 1.5\n"  # a renew every 0.125 s; a silent client is ended within 1.5 s

pytestmark = ROOT_ONLY


@pytest.fixture
def rig() -> Iterator[Rig]:
    with served_rig() as r:
        yield r


def _lost(proc: subprocess.Popen) -> tuple[str, dict]:
    """The LOST line a training member prints when its pin ends under it (its stdin stays open: it trains on until its
    next step hears), and its session's context."""
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    lines = out.splitlines()
    lost = next((x for x in lines if x.startswith("LOST ")), "")
    assert lost, out + err
    return lost, json.loads(next(x for x in lines if x.startswith("CONTEXT ")).removeprefix("CONTEXT "))


def test_a_forked_holder_whose_parent_exits_is_named_while_it_renews_and_restored_once_it_stops(rig):
    rig.configure(FAST)
    rig.start()
    holder = rig.client(str(rig.gid), "fork", "612", "10")
    assert holder.stdout.readline().strip() == "PINNED", holder.stderr.read()
    child = int(holder.stdout.readline().split()[1])
    holder.wait(timeout=10)  # the parent has exited, restoring nothing
    try:
        assert wait_for(lambda: not pid_alive(holder.pid), 5)
        assert wait_for(lambda: rig.ask(Request("status")).pins[0].last_pid == child, 3)  # its first renew came
        [pin] = rig.ask(Request("status")).pins
        assert (pin.pid, pin.last_pid, pin.alive) == (holder.pid, child, True)  # the live renewer, as the kernel says
        assert rig.fake.range_hz == (612000000, 612000000)
        assert holder.stdout.readline().strip() == "SILENT"  # the child keeps the socket and stops renewing
        t0 = time.monotonic()
        assert wait_for(lambda: rig.fake.range_hz == DEFAULT, 5), "the silent holder kept the GPU"
        assert time.monotonic() - t0 < 3.0 and pid_alive(child)  # the lease ran out; the child still holds the socket
        assert wait_for(lambda: rig.ask(Request("status")).pins == [] and rig.journals() == [], 2)
        assert rig.logged("(no renew)")
    finally:
        os.kill(child, signal.SIGKILL)


def test_root_releases_a_members_pin_and_the_member_is_told_in_one_line_a_member_may_not(rig):
    rig.configure(FAST)
    rig.start()
    member = rig.pinned_client("612", mode="train")
    refused = rig.cli(str(rig.gid), "clockd", "release", KEY)
    errors = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(errors) == 1 and "only root releases" in errors[0], refused.stderr
    assert rig.fake.range_hz == (612000000, 612000000)
    released = subprocess.run([sys.executable, "-m", "dvfs_mlops", "clockd", "release", KEY, "--socket", str(rig.socket)],
                              cwd=REPO, env=rig.env(), capture_output=True, text=True, timeout=60)
    assert released.returncode == 0, released.stderr
    assert released.stdout.startswith(f"released {KEY} (pinned at 612 by uid 65534 (nobody), PID {member.pid}): restored")
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []
    lost, context = _lost(member)  # the member's next renew hears it, and its job ends
    assert "root released it" in lost and "\n" not in lost and "not a measurement at that clock" in lost
    assert context["clock_lost"] == lost.removeprefix("LOST ") and rig.fake.range_hz == DEFAULT
    unknown = subprocess.run([sys.executable, "-m", "dvfs_mlops", "clockd", "release", "nvml-9", "--socket", str(rig.socket)],
                             cwd=REPO, env=rig.env(), capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "(none pinned)" in unknown.stderr


def test_a_pin_ends_with_the_maximum_lease_and_its_holder_hears_why(rig):
    rig.configure(FAST)
    rig.start(sys.executable, "-m", "dvfs_mlops", "clockd", "serve", "--socket", str(rig.socket), "--group", rig.group,
              "--max-lease", "2s")
    member = rig.pinned_client("612", mode="train")
    assert wait_for(lambda: rig.fake.range_hz == DEFAULT, 6)
    lost, _ = _lost(member)
    assert "its lease ran out (the service's maximum, 2 s)" in lost


def test_a_second_sigterm_during_stop_is_ignored_and_every_pin_is_restored(rig):
    rig.configure("[nvml]\nassume_unlocked = yes\n")
    service = rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--gpu", U1,
                        "--reset-delay", "1.5")
    gpu = rig.pinned_client("1215", "nvml", U1)  # restored first, slowly: the signals land during its reset
    board = rig.pinned_client("612")
    assert len(rig.journals()) == 2
    service.send_signal(signal.SIGTERM)
    assert rig.logged("stopping (signal 15)")
    service.send_signal(signal.SIGTERM)
    service.send_signal(signal.SIGINT)
    assert service.wait(timeout=30) == 0
    log = rig.log.read_text()
    assert "signal 15 while stopping: ignored" in log and "signal 2 while stopping: ignored" in log
    assert "restored nvml-0" in log and f"restored {KEY}" in log
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []  # a journal goes only once its restore succeeded
    for p in (gpu, board):
        p.kill()
        p.wait(timeout=10)


def test_sighup_rereads_the_config_and_keeps_every_pin(rig):
    rig.configure("[nvml]\ngpus = all\n")
    service = rig.start()
    member = rig.pinned_client("612")
    rig.configure(f"[nvml]\ngpus = {U1}\n")
    service.send_signal(signal.SIGHUP)
    assert rig.logged(f"reloaded {rig.prefix}/etc/dvfs-mlops/clockd.conf: NVML: {U1}")
    assert rig.logged("every pin kept")
    assert service.poll() is None and rig.fake.range_hz == (612000000, 612000000)
    assert rig.ask(Request("status")).scope.startswith(f"NVML: {U1},")
    member.kill()
    member.wait(timeout=10)


def test_no_operation_of_a_pin_whose_restore_failed_writes_a_clock(rig, orin6_kernel):
    """After a restore that failed (journal kept, lock released) the connection can no longer move the clock: the
    repin is refused and nothing is written, even once the node takes writes again."""
    rig.sysfs_root = orin6_kernel.root
    rig.start()
    client = ClockdClient(rig.socket)
    try:
        assert client.request(Request("pin", "jetson", freq="612")).ok
        orin6_kernel.fail_writes = {"min_freq"}
        failed = client.request(Request("restore", "jetson"))
        assert not failed.ok and failed.error_kind == "restore_failed"
        orin6_kernel.fail_writes = set()
        orin6_kernel.clear_log()
        repin = client.request(Request("repin", "jetson", freq="816"))
        assert not repin.ok and repin.error_kind == "lease_ended" and "its restore failed" in repin.error
        assert orin6_kernel.writes == [] and orin6_kernel.range_hz == (612000000, 612000000)
        assert len(rig.journals()) == 1  # `dvfs-mlops restore` finishes it
    finally:
        client.close()


def test_a_members_assume_unlocked_is_ignored_root_config_decides(rig):
    rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--gpu", U1)
    proc = rig.client(str(rig.gid), "session", "nvml", "1215", "exit", U1)  # the member's NvmlDevice says assume_unlocked
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out.startswith("ERROR "), out + err
    assert "has not said that nobody locks the clocks of GPU" in out and "assume_unlocked = yes" in out
    assert rig.ask(Request("table", "nvml", U1)).current_mhz == max(rig.ask(Request("table", "nvml", U1)).frequencies_mhz)
    raw = ClockdClient(rig.socket)  # and the wire has no field for it
    try:
        raw._sock.sendall(json.dumps({"op": "pin", "backend": "nvml", "gpu_uuid": U1, "freq": "1215",
                                      "assume_unlocked": True}).encode() + b"\n")
        assert b'"ok": false' in raw._reader.readline()
    finally:
        raw.close()
    assert rig.journals() == []


def test_a_gpu_outside_the_groups_list_is_refused_in_one_line_naming_only_what_it_may_use(rig):
    rig.configure(f"[nvml]\ngpus = {U1}\nassume_unlocked = yes\n")
    rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--gpu", U1, "--gpu", U2,
              "--gpu", U3)
    proc = rig.client(str(rig.gid), "session", "nvml", "1215", "exit", U2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(out.strip().splitlines()) == 1, out + err
    assert f"GPU {U2} is not one group users may lock" in out and f"it may lock: {U1}" in out and U3 not in out
    gone = "GPU-44444444-3b0f-4c2e-9a8d-1f2e3d4c5b6a"
    rig.configure(f"[nvml]\ngpus = {U1}, {gone}\nassume_unlocked = yes\n")
    rig.service.send_signal(signal.SIGHUP)
    assert rig.logged(f"NVML: {U1}, {gone}")
    proc = rig.client(str(rig.gid), "session", "nvml", "1215", "exit", gone)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "is not on this machine now" in out and U2 not in out and U3 not in out
    member = rig.pinned_client("1215", "nvml", U1)  # the one it may use
    assert rig.ask(Request("table", "nvml", U1)).current_mhz == 1215.0
    member.kill()
    member.wait(timeout=10)


def test_a_pin_in_progress_when_the_service_stops_is_finished_then_restored_and_no_new_pin_starts(rig):
    rig.configure("[nvml]\nassume_unlocked = yes\n")
    service = rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--gpu", U1,
                        "--lock-delay", "2")
    member = rig.client(str(rig.gid), "session", "nvml", "1215", "wait", U1)
    assert wait_for(lambda: len(rig.journals()) == 1, 10)  # journalled: the lock call is under way
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0
    assert rig.logged("the service stopped while pinning") and rig.journals() == []  # restored once the write ended
    out, _err = member.communicate(timeout=60)
    assert "PINNED" not in out and "stopped while pinning" in out  # the member was told, not pinned
    assert not rig.socket.exists()  # nothing listens: no new pin can start


def test_a_connection_that_holds_no_pin_and_says_nothing_is_closed_at_the_idle_timeout(rig):
    rig.configure("[service]\nidle_timeout = 1\n")
    rig.start()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        idle.connect(str(rig.socket))
        idle.settimeout(10)
        t0 = time.monotonic()
        assert idle.recv(1) == b""  # the service closed it
        assert 0.9 < time.monotonic() - t0 < 3
    finally:
        idle.close()
