from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dvfs_mlops.device.guard import DeviceLock, list_journals
from dvfs_mlops.device.jetson import JetsonDevice
from dvfs_mlops.errors import DeviceBusyError
from tests.conftest import REPO, run_cli
from tests.fakes.sysfs import ORIN_TABLE_HZ

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])


def _child(freq: str, action: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.session_child", freq, action], cwd=REPO,
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


def test_next_session_recovers_a_killed_run_before_recording(orin6, state_dir, capsys):
    proc = _child("408", "wait")
    proc.kill()
    proc.wait(timeout=30)
    with JetsonDevice().session(816):
        assert orin6.range_hz == (816000000, 816000000)
    assert orin6.range_hz == DEFAULT  # not the killed run's 408 MHz
    assert "left pinned at 408" in capsys.readouterr().err


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
