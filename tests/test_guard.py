from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from dvfs_mlops.errors import DeviceBusyError
from dvfs_mlops.hw.guard import DeviceLock, list_journals, open_private_dir
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


def test_stale_lock_of_dead_pid_is_taken_over(orin6):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = DeviceLock(JetsonDevice().device_key)
    os.close(open_private_dir(lock.directory))
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
    lock = DeviceLock(dev.device_key)
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


def test_two_processes_with_different_homes_and_state_dir_settings_share_one_owner(orin6, tmp_path):
    """One owner per clock domain whatever HOME or the old DVFS_STATE_DIR say (a per-user folder never holds the lock
    of a system-wide resource): both use the state folders under the one system prefix."""
    prefix = tmp_path / "system"
    env = {**os.environ, "DVFS_SYSTEM_STATE_PREFIX": str(prefix)}
    first = subprocess.Popen([sys.executable, "-m", "testkit.fakes.session_child", "612", "wait"], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "HOME": str(tmp_path / "home-a"), "DVFS_STATE_DIR": str(tmp_path / "own-a")})
    try:
        assert first.stdout.readline().strip() == "PINNED", first.stderr.read()
        assert list((prefix / "run/dvfs-mlops/state").glob("lock-*.pid"))
        assert list((prefix / "var/lib/dvfs-mlops").glob("restore-*.json"))
        second = subprocess.run([sys.executable, "-m", "testkit.fakes.session_child", "816", "exit"], cwd=REPO, text=True,
                                capture_output=True, env={**env, "HOME": str(tmp_path / "home-b"),
                                                          "DVFS_STATE_DIR": str(tmp_path / "own-b")}, timeout=60)
        assert second.returncode != 0 and f"in use by PID {first.pid}" in second.stderr
        assert orin6.range_hz == (612000000, 612000000)
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert orin6.range_hz == DEFAULT
    assert not any((tmp_path / p).exists() for p in ("home-a/.cache", "home-b/.cache", "own-a", "own-b"))


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


# -- state folders nobody else can redirect (issue 38, item 1) ---------------------------------------------------------
def test_the_state_folders_are_private_and_their_files_0600(orin6, state_dir):
    from dvfs_mlops.hw.guard import journal_dir, lock_dir

    with JetsonDevice().session(612):
        [lock] = lock_dir().glob("lock-*.pid")
        [journal] = journal_dir().glob("restore-*.json")
        modes = {p: stat.S_IMODE(os.lstat(p).st_mode) for p in (lock_dir(), journal_dir(), lock, journal)}
    assert modes == {lock_dir(): 0o700, journal_dir(): 0o700, lock: 0o600, journal: 0o600}
    assert lock_dir().parent.name == "dvfs-mlops" and lock_dir().parent.parent.name == "run"  # not /run/lock


@pytest.mark.parametrize("attack", ["a symlink", "a symlink above it", "others may write", "another owner",
                                    "a symlinked lock file"])
def test_a_state_folder_that_is_not_ours_alone_is_refused_in_one_line_and_nothing_is_followed(orin6, tmp_path, attack,
                                                                                              caplog):
    from dvfs_mlops.errors import StateFolderError
    from dvfs_mlops.hw.guard import lock_dir

    if attack == "another owner" and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    lock = lock_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    secret = elsewhere / "secret"
    secret.write_text("root's own\n")
    lock.parent.parent.mkdir(parents=True, exist_ok=True)
    if attack == "a symlink above it":
        lock.parent.parent.rename(tmp_path / "run-real")
        lock.parent.parent.symlink_to(tmp_path / "run-real")
    else:
        lock.parent.mkdir(exist_ok=True)
    if attack == "a symlink":
        lock.symlink_to(elsewhere)
    elif attack == "others may write":
        lock.mkdir()
        lock.chmod(0o777)
    elif attack == "another owner":
        lock.mkdir(mode=0o700)
        os.chown(lock, 65534, 65534)
    elif attack == "a symlinked lock file":  # a 0700 folder of ours with a link in it (made by a careless root)
        os.close(open_private_dir(lock))
        (lock / f"lock-{JetsonDevice().device_key}.pid").symlink_to(secret)
    with pytest.raises(StateFolderError) as e, JetsonDevice().session(612):
        pass
    assert "\n" not in str(e.value) and "refusing the state folder" in str(e.value)
    assert orin6.range_hz == DEFAULT and secret.read_text() == "root's own\n" and sorted(os.listdir(elsewhere)) == ["secret"]
    assert any("refusing the state folder" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
