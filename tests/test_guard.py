from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dvfs_mlops.errors import DeviceBusyError
from dvfs_mlops.hw.guard import DeviceLock, list_journals
from dvfs_mlops.hw.jetson import JetsonDevice
from testkit.fakes.sysfs import BOOT_ID, ORIN_TABLE_HZ, reboot
from tests.conftest import REPO, run_cli

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])


def _child(freq: str, action: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "testkit.fakes.session_child", freq, action], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout.readline().strip() == "PINNED", proc.stderr.read()
    return proc


def test_restore_after_exception_in_process(orin6):
    with pytest.raises(RuntimeError), JetsonDevice().session(510):
        assert orin6.range_hz == (510000000, 510000000)
        raise RuntimeError("training crashed")
    assert orin6.range_hz == DEFAULT


def test_restore_after_keyboard_interrupt_in_process(orin6):
    with pytest.raises(KeyboardInterrupt), JetsonDevice().session(510):
        raise KeyboardInterrupt
    assert orin6.range_hz == DEFAULT


def test_restore_after_exception_in_child(orin6, state_dir):
    proc = _child("714", "raise")
    assert proc.wait(timeout=30) == 1
    assert orin6.range_hz == DEFAULT
    assert list_journals(state_dir) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_restore_after_signal(orin6, state_dir, sig, code):
    proc = _child("612", "wait")
    assert orin6.range_hz == (612000000, 612000000)
    assert len(list_journals(state_dir)) == 1
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == code
    assert orin6.range_hz == DEFAULT
    assert list_journals(state_dir) == []


def test_sigkill_then_restore_command(orin6, state_dir):
    proc = _child("408", "wait")
    journal = list_journals(state_dir)[0][1]
    assert journal.pid == proc.pid and journal.settings["min_freq"] == str(ORIN_TABLE_HZ[0])
    proc.kill()
    proc.wait(timeout=30)
    assert orin6.range_hz == (408000000, 408000000)  # a killed process cannot restore
    out = run_cli("restore")
    assert out.returncode == 0, out.stderr
    assert "restored" in out.stdout and "408" in out.stdout and str(proc.pid) in out.stdout
    assert orin6.range_hz == DEFAULT
    assert list_journals(state_dir) == []
    again = run_cli("restore")
    assert "nothing to restore" in again.stdout


def test_next_session_recovers_a_killed_run_before_recording(orin6, state_dir, caplog):
    proc = _child("408", "wait")
    proc.kill()
    proc.wait(timeout=30)
    with JetsonDevice().session(816):
        assert orin6.range_hz == (816000000, 816000000)
    assert orin6.range_hz == DEFAULT  # not the killed run's 408 MHz
    # announced as a WARNING of the guard's logger (library code logs; stderr when logging is unconfigured)
    assert [r.levelname for r in caplog.records if "left pinned at 408" in r.getMessage()] == ["WARNING"]


def test_second_process_gets_busy_error_naming_owner(orin6):
    proc = _child("612", "wait")
    try:
        with pytest.raises(DeviceBusyError, match=f"PID {proc.pid}"):
            with JetsonDevice().session(816):
                pass
        assert orin6.range_hz == (612000000, 612000000)  # the owner's pin is untouched
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert orin6.range_hz == DEFAULT


def test_stale_lock_of_dead_pid_is_taken_over(orin6, state_dir):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = DeviceLock(JetsonDevice().device_key, state_dir)
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    lock.path.write_text(f"{dead.pid}\n")
    lock.acquire()
    assert lock.took_over_pid == dead.pid
    assert lock.path.read_text().strip() == str(os.getpid())
    lock.release()


def test_journal_written_before_first_clock_write(orin6, state_dir, monkeypatch):
    seen = []
    original = JetsonDevice._write

    def spy(self, name, value):
        seen.append([json.loads(p.read_text())["requested"] for p in state_dir.glob("restore-*.json")])
        original(self, name, value)

    monkeypatch.setattr(JetsonDevice, "_write", spy)
    with JetsonDevice().session(918):
        pass
    assert seen and seen[0] == ["918"]


def test_failed_restore_keeps_the_journal_and_restore_finishes_later(orin6, kernel6, state_dir):
    from dvfs_mlops.errors import RestoreFailedError
    from dvfs_mlops.hw import restore_journals
    from dvfs_mlops.hw.guard import DeviceLock

    dev = JetsonDevice(writer=kernel6.write)
    with pytest.raises(RestoreFailedError) as e, dev.session(612):
        kernel6.fail_writes = {"min_freq", "max_freq"}  # the restore's writes will fail with EIO
    message = str(e.value)
    journal = state_dir / f"restore-{dev.device_key}.json"
    assert str(journal) in message and "dvfs-mlops restore" in message and "\n" not in message
    assert journal.exists() and orin6.range_hz == (612000000, 612000000)  # still pinned, and remembered
    lock = DeviceLock(dev.device_key, state_dir)
    lock.acquire()  # the failed session released its lock
    lock.release()
    kernel6.fail_writes = set()  # the cause is fixed
    assert restore_journals(announce=lambda _m: None) == 1
    assert orin6.range_hz == DEFAULT and not journal.exists()


def test_restore_command_exits_nonzero_while_the_cause_persists(orin6, state_dir):
    from dvfs_mlops.hw.guard import Journal, write_journal

    dev = JetsonDevice()
    write_journal(Journal("jetson", dev.device_key, 999999, 0.0, {"node": str(orin6.node), "min_freq": "306000000",
                                                                 "max_freq": "1300500000"}, "612"), state_dir)
    (orin6.node / "max_freq").unlink()
    (orin6.node / "max_freq").mkdir()  # unwritable even for root
    r = run_cli("restore")
    assert r.returncode == 2 and r.stderr.startswith("Error: could not restore") and "Traceback" not in r.stderr
    assert list_journals(state_dir)  # kept
    (orin6.node / "max_freq").rmdir()
    (orin6.node / "max_freq").write_text("612000000\n")
    r = run_cli("restore")
    assert r.returncode == 0 and "restored" in r.stdout and not list_journals(state_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="system lock locations are used only as root")
def test_two_root_processes_with_different_homes_share_one_owner(orin6, tmp_path):
    prefix = tmp_path / "system"
    env = {k: v for k, v in os.environ.items() if k != "DVFS_STATE_DIR"}
    env["DVFS_SYSTEM_STATE_PREFIX"] = str(prefix)
    first = subprocess.Popen([sys.executable, "-m", "testkit.fakes.session_child", "612", "wait"], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**env, "HOME": str(tmp_path / "home-a")})
    try:
        assert first.stdout.readline().strip() == "PINNED", first.stderr.read()
        assert list((prefix / "run/lock/dvfs-mlops").glob("lock-*.pid"))
        assert list((prefix / "var/lib/dvfs-mlops").glob("restore-*.json"))
        second = subprocess.run([sys.executable, "-m", "testkit.fakes.session_child", "816", "exit"], cwd=REPO, text=True,
                                capture_output=True, env={**env, "HOME": str(tmp_path / "home-b")}, timeout=60)
        assert second.returncode != 0 and f"in use by PID {first.pid}" in second.stderr
        assert orin6.range_hz == (612000000, 612000000)
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert orin6.range_hz == DEFAULT
    assert not (tmp_path / "home-a/.cache").exists() and not (tmp_path / "home-b/.cache").exists()


# -- a journal from an earlier boot (issue 31, item 10) ------------------------------------------------------------------
def _journal_of_an_earlier_boot(fake, state_dir) -> None:
    """What a session killed in the previous boot left (the file as ClockOwnership.record writes it): the range it
    found then, a 612 MHz power-mode cap, to restore."""
    key = JetsonDevice().device_key
    journal = {"backend": "jetson", "device_key": key, "pid": 999999, "created": 0.0, "requested": "408", "boot_id": BOOT_ID,
               "settings": {"node": str(fake.node), "min_freq": str(ORIN_TABLE_HZ[0]), "max_freq": "612000000"}}
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"restore-{key}.json").write_text(json.dumps(journal))
    reboot(fake.root)  # the board rebooted since: a new boot id, and the clocks are the new boot's (MAXN here)


def test_a_journal_records_the_boot_it_was_written_in(orin6, state_dir):
    with JetsonDevice().session(612):
        assert [j.boot_id for _, j in list_journals(state_dir)] == [BOOT_ID]


def test_the_next_session_removes_a_journal_of_an_earlier_boot_unapplied(orin6, state_dir, caplog):
    _journal_of_an_earlier_boot(orin6, state_dir)
    with JetsonDevice().session(816):
        assert orin6.range_hz == (816000000, 816000000)
    assert orin6.range_hz == DEFAULT  # this boot's range, not the earlier boot's 612 MHz cap
    assert list_journals(state_dir) == []
    lines = [r.getMessage() for r in caplog.records if "earlier boot" in r.getMessage()]
    assert len(lines) == 1 and "unapplied" in lines[0] and "\n" not in lines[0]


def test_restore_removes_a_journal_of_an_earlier_boot_unapplied(orin6, state_dir, caplog):
    from dvfs_mlops.hw import restore_journals

    _journal_of_an_earlier_boot(orin6, state_dir)
    said: list[str] = []
    assert restore_journals(announce=said.append) == 0
    assert orin6.range_hz == DEFAULT and list_journals(state_dir) == [] and not list(state_dir.glob("restore-*.json"))
    assert said == ["nothing to restore: no journal left by a killed run"]
    assert len([r for r in caplog.records if "earlier boot" in r.getMessage()]) == 1
