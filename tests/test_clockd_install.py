"""`clockd install/uninstall` round trip without systemctl, the rendered unit, and files given back under sudo."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from dvfs_mlops.app import ownership
from dvfs_mlops.app.clockd_command import UNIT_NAME, ClockdOptions, clockd_command, render_unit
from dvfs_mlops.hw.clockd.protocol import Reply, Request
from tests.conftest import run_cli

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="install writes a unit and chowns files: needs root (CI runs as root)")


def test_the_unit_runs_this_installation_as_a_service_restarted_on_failure(tmp_path):
    unit = render_unit(ClockdOptions(Path("/run/dvfs-mlops/clockd.sock"), "dvfs", tmp_path))
    lines = unit.splitlines()
    exec_start = next(x for x in lines if x.startswith("ExecStart="))
    program = exec_start.split("=", 1)[1].split()[0]
    assert Path(program).parent == Path(sys.executable).parent  # this interpreter's dvfs-mlops (or python -m)
    assert exec_start.endswith("clockd serve --socket /run/dvfs-mlops/clockd.sock --group dvfs")
    assert "RuntimeDirectory=dvfs-mlops" in lines and "Restart=on-failure" in lines and "WantedBy=multi-user.target" in lines
    other = render_unit(ClockdOptions(Path("/srv/clockd.sock"), "gpu", tmp_path))
    assert "RuntimeDirectory" not in other and "--group gpu" in other  # only a folder under /run is systemd's to make


@root_only
def test_install_and_uninstall_round_trip_without_systemctl(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no systemctl, groupadd or usermod: a container
    monkeypatch.delenv("SUDO_USER", raising=False)
    options = ClockdOptions(tmp_path / "s.sock", "users", tmp_path / "units")
    lines = clockd_command("install", options, say=lambda _m: None)
    unit = tmp_path / "units" / UNIT_NAME
    assert unit.read_text() == render_unit(options) and oct(unit.stat().st_mode & 0o777) == "0o644"
    assert any("systemctl not found" in x for x in lines) and len(lines) == 2, lines
    lines = clockd_command("uninstall", options, say=lambda _m: None)
    assert not unit.exists() and any("removed" in x for x in lines)
    assert "no unit at" in clockd_command("uninstall", options, say=lambda _m: None)[1]


def test_status_without_a_service_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    out = run_cli("clockd", "status", "--socket", str(tmp_path / "none.sock"))
    expected = f"socket:   {tmp_path / 'none.sock'} missing: no service (sudo dvfs-mlops clockd install)"
    assert out.returncode == 0 and out.stdout.strip().splitlines() == [expected]


def test_the_protocol_refuses_what_it_does_not_know():
    assert Request.decode(Request("pin", "jetson", freq="612").encode()) == Request("pin", "jetson", freq="612")
    for bad in (b'{"op": "pin", "path": "/sys/x"}', b'{"op": "write", "backend": "jetson"}', b'[1]', b"not json",
                b'{"op": "pin", "backend": "jetson", "freq": 612}', b'{"op": "pin", "backend": "rocm"}'):
        with pytest.raises(Exception):  # noqa: B017 - each is a DvfsError with its own line
            Request.decode(bad)
    busy = Reply.decode(Reply(False, "in use by uid 1000", "busy").encode())
    with pytest.raises(Exception, match="clock service: in use by uid 1000") as e:
        busy.raise_for_error()
    assert type(e.value).__name__ == "DeviceBusyError"


@root_only
def test_files_made_under_sudo_go_back_to_the_user(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    (home / "before.txt").write_text("root's, from before this command")
    time.sleep(1.1)
    elsewhere = tmp_path / "root-owned"
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    monkeypatch.setenv("DVFS_CACHE_DIR", str(home / ".cache" / "dvfs-mlops"))
    give_back = ownership.after_command()
    (home / "mlflow.db").write_text("")
    (home / "mlruns" / "0" / "abc").mkdir(parents=True)
    (home / "mlruns" / "0" / "abc" / "meta.yaml").write_text("")
    (home / ".cache" / "dvfs-mlops" / "traces").mkdir(parents=True)
    (elsewhere / "x").write_text("")
    give_back()
    for p in ("mlflow.db", "mlruns", "mlruns/0/abc/meta.yaml", ".cache", ".cache/dvfs-mlops/traces"):
        assert (home / p).stat().st_uid == 65534, p
    assert (home / "before.txt").stat().st_uid == 0  # older than the command: not its doing
    assert (elsewhere / "x").stat().st_uid == 0  # not the user's tree


@root_only
def test_sudo_and_sudo_e_take_one_lock_whatever_dvfs_state_dir_says(tmp_path, monkeypatch):
    from dvfs_mlops.hw.guard import journal_dir, lock_dir

    monkeypatch.setenv("DVFS_SYSTEM_STATE_PREFIX", str(tmp_path))
    monkeypatch.setenv("DVFS_STATE_DIR", str(tmp_path / "users-own"))  # what `sudo -E` keeps and plain `sudo` drops
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert lock_dir() == journal_dir() == tmp_path / "users-own"  # root's own shell: the variable holds
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.setenv("SUDO_GID", "1000")
    sudo_e = (lock_dir(), journal_dir())
    monkeypatch.delenv("DVFS_STATE_DIR")
    assert sudo_e == (lock_dir(), journal_dir()) == (tmp_path / "run/lock/dvfs-mlops", tmp_path / "var/lib/dvfs-mlops")
