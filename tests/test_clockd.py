"""The clock service (`dvfs-mlops clockd`) with real processes: the service as root on a fake sysfs tree (or with a
fake NVML), its clients dropped to uid 65534 in and out of the service's group (testkit/clockd_rig.py).

Each test has its own folder, socket, state folders and config under /tmp (readable by uid 65534; AF_UNIX paths stay
short). The group is `users` (gid 100 on Debian-family systems): no user or group is created. Without root these skip.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator

import pytest

from dvfs_mlops.hw.clockd.client import ClockdClient
from dvfs_mlops.hw.clockd.protocol import Request
from testkit.clockd_rig import NOBODY, ROOT_ONLY, Rig, served_rig, wait_for
from testkit.fakes.sysfs import ORIN_TABLE_HZ

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])

pytestmark = ROOT_ONLY


@pytest.fixture
def rig() -> Iterator[Rig]:
    with served_rig() as r:
        yield r


def _wait_for(cond, limit_s: float) -> float:
    import time

    t0 = time.monotonic()
    wait_for(cond, limit_s)
    return time.monotonic() - t0


def test_a_member_pins_through_the_service_and_the_restore_is_acknowledged(rig):
    rig.start()
    proc = rig.client(str(rig.gid), "session", "jetson", "612", "exit")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["PINNED", "RESTORED"]
    assert rig.fake.range_hz == DEFAULT  # RESTORED is printed after the service acknowledged the restore
    assert rig.journals() == []
    log = rig.log.read_text()
    assert "uid 65534 (nobody)" in log and "pinned jetson-17000000.gpu at 612 MHz" in log and "its client asked" in log


def test_a_pin_above_the_nvpmodel_modes_cap_is_recorded_on_the_clients_run_as_a_direct_pin_records_it(rig):
    status = rig.base / "root" / "var/lib/nvpmodel/status"
    status.write_text("pmode:0002 fmode:quiet\n")  # MODE_30W of the fake board's nvpmodel.conf: GPU capped at 612 MHz
    status.chmod(0o644)
    rig.start()
    proc = rig.client(str(rig.gid), "session", "jetson", "918", "context")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[:2] == ["PINNED", "RESTORED"]
    assert json.loads(out.splitlines()[2].removeprefix("CONTEXT ")).get("above_mode_cap") is True
    below = rig.client(str(rig.gid), "session", "jetson", "612", "context")
    out, err = below.communicate(timeout=60)
    assert below.returncode == 0, err
    assert "above_mode_cap" not in json.loads(out.splitlines()[2].removeprefix("CONTEXT "))  # at the cap: nothing to say
    assert rig.fake.range_hz == (DEFAULT[0], 612000000)  # restored to the mode's range (its GPU MAX_FREQ), not the table


def test_sigkill_of_a_client_restores_within_a_second(rig):
    rig.start()
    proc = rig.pinned_client("408")
    assert rig.fake.range_hz == (408000000, 408000000)
    [journal] = rig.journals()
    assert (journal.pid, journal.uid, journal.requested) == (proc.pid, NOBODY, "408")
    status = rig.ask(Request("status"))
    assert [(p.device_key, p.uid, p.pid, p.requested) for p in status.pins] == [("jetson-17000000.gpu", NOBODY, proc.pid, "408")]
    proc.kill()
    took = _wait_for(lambda: rig.fake.range_hz == DEFAULT, 5.0)
    proc.wait(timeout=10)
    assert rig.fake.range_hz == DEFAULT and took < 1.0, f"restored after {took:.3f} s"
    assert _wait_for(lambda: not rig.journals(), 2.0) < 2.0
    assert _wait_for(lambda: "its client disconnected" in rig.log.read_text(), 2.0) < 2.0


def test_a_second_client_gets_one_line_naming_the_owner(rig):
    rig.start()
    first = rig.pinned_client("612")
    out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "816", "--", "true")
    assert out.returncode == 2
    lines = [x for x in out.stderr.strip().splitlines() if not x.startswith("device: ")]  # `run` names its device first
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"uid {NOBODY} (nobody), PID {first.pid}" in lines[0]
    assert rig.fake.range_hz == (612000000, 612000000)  # the owner's pin is untouched
    first.kill()
    first.wait(timeout=10)


@pytest.mark.parametrize("why", ["not in the group", "no service"])
def test_a_user_who_cannot_pin_gets_two_lines_at_most_and_nothing_is_touched(rig, why):
    if why == "not in the group":
        rig.start()
        out = rig.cli("-", "run", "--device", "jetson", "--freq", "612", "--", "true")
        expected = ["usermod -aG users nobody", "or run as root"]
    else:
        out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "612", "--", "true")
        expected = ["clockd install", "or run this command as root"]
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2 and "Traceback" not in out.stderr, out.stderr
    assert all(e in out.stderr for e in expected), out.stderr
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []
    assert not any(rig.home.iterdir())  # no lock or journal of the user's own either


def test_the_service_itself_refuses_a_non_member_where_the_socket_mode_was_loosened(rig):
    rig.start()
    rig.socket.chmod(0o666)
    out = rig.cli("-", "run", "--device", "jetson", "--freq", "612", "--", "true")
    errors = [x for x in out.stderr.strip().splitlines() if not x.startswith("device: ")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr
    assert "is not in group 'users'" in errors[0]
    assert rig.fake.range_hz == DEFAULT
    assert "refused uid 65534 (nobody)" in rig.log.read_text()


def test_a_killed_service_applies_its_journal_when_it_starts_again(rig):
    service = rig.start()
    client = rig.pinned_client("510")
    service.kill()
    service.wait(timeout=10)
    client.kill()
    client.wait(timeout=10)
    assert rig.fake.range_hz == (510000000, 510000000)  # nobody was left to restore
    assert len(rig.journals()) == 1
    rig.start()
    assert rig.fake.range_hz == DEFAULT  # applied before the socket was bound
    assert rig.journals() == []
    assert "on start: restored jetson-17000000.gpu" in rig.log.read_text()


def test_a_stopped_service_restores_every_pin_and_removes_its_socket(rig):
    service = rig.start()
    client = rig.pinned_client("714")
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0
    assert rig.fake.range_hz == DEFAULT and not rig.socket.exists()
    client.kill()
    client.wait(timeout=10)


def test_restore_as_a_member_asks_the_service(rig):
    rig.start()
    out = rig.cli(str(rig.gid), "restore")
    assert out.returncode == 0, out.stderr
    assert "nothing to restore" in out.stdout


def test_status_names_the_socket_and_the_owner(rig):
    rig.start()
    client = rig.pinned_client("612")
    out = rig.cli(str(rig.gid), "clockd", "status")
    assert out.returncode == 0, out.stderr
    assert f"{rig.socket} (group users, mode 0660)" in out.stdout
    assert f"jetson-17000000.gpu (jetson) pinned at 612 by uid {NOBODY} (nobody), PID {client.pid} (alive)" in out.stdout
    assert "lease left 23 h 59 min" in out.stdout and "scope:    NVML: every GPU, not assumed unlocked" in out.stdout
    client.kill()
    client.wait(timeout=10)


def test_nvml_pins_by_uuid_through_the_service_and_a_killed_client_is_reset(rig):
    uuid = "GPU-5e7a6d1c-3b0f-4c2e-9a8d-1f2e3d4c5b6a"
    rig.configure("[nvml]\nassume_unlocked = yes\n")  # the administrator's word, not the client's
    rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--gpu", uuid)
    table = rig.ask(Request("table", "nvml", uuid))
    assert 1215.0 in table.frequencies_mhz and table.current_mhz == max(table.frequencies_mhz)
    client = rig.pinned_client("1215", "nvml", uuid)
    assert rig.ask(Request("table", "nvml", uuid)).current_mhz == 1215.0  # the service's GPU holds the lock
    [journal] = rig.journals()
    assert journal.settings["uuid"] == uuid and journal.uid == NOBODY and journal.pid == client.pid
    client.kill()
    took = _wait_for(lambda: rig.ask(Request("table", "nvml", uuid)).current_mhz != 1215.0, 5.0)
    client.wait(timeout=10)
    assert took < 1.0 and _wait_for(lambda: not rig.journals(), 2.0) < 2.0
    with pytest.raises(Exception, match="no GPU with UUID GPU-00000000"):  # the service's own enumeration decides
        rig.ask(Request("pin", "nvml", "GPU-00000000-0000-0000-0000-000000000000", "1215"))


def test_the_service_answers_only_its_operations(rig):
    rig.start()
    client = ClockdClient(rig.socket)
    try:
        client._sock.sendall(json.dumps({"op": "pin", "backend": "jetson", "freq": "612", "path": "/etc/shadow"}).encode() + b"\n")
        reply = client._reader.readline()
    finally:
        client.close()
    assert b'"ok": false' in reply and rig.fake.range_hz == DEFAULT
    with pytest.raises(Exception, match="unknown frequency '613'"):
        rig.ask(Request("pin", "jetson", freq="613"))
    with pytest.raises(Exception, match="names its GPU by UUID"):
        rig.ask(Request("table", "nvml", "0"))


def test_without_a_service_a_user_whom_the_clock_files_let_write_is_refused_in_one_line(rig):
    """The lock and journal of a system-wide clock live in root's folders: a udev rule that lets a group write the
    devfreq files does not let its members pin around the service (a per-user lock would be a second owner)."""
    for name in ("min_freq", "max_freq"):  # as a udev rule granting the group write access would
        (rig.fake.node / name).chmod(0o666)
    from dvfs_mlops.hw.guard import open_private_dir

    os.close(open_private_dir(rig.lock_dir))  # root's state folders exist, as on a board where root or the service pinned
    out = rig.cli(str(rig.gid), "run", "--device", "jetson", "--freq", "612", "--", "true",
                  DVFS_CLOCKD_SOCKET=str(rig.base / "none.sock"))
    errors = [x for x in out.stderr.strip().splitlines() if not x.startswith("device: ")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "is root's" in errors[0] and "clockd install" in errors[0] and "or run as root" in errors[0]
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []
    assert not any(rig.home.iterdir())  # no lock or journal of the user's own
