"""The clock service attacked as issue 38's review did, with real processes and real, throw-away accounts: the service
runs as root (as under systemd) on a fake Orin tree; its members and an attacker are unprivileged users
(testkit/users.py, removed afterwards). Each test is an attack that worked on the service before, and must not now.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dvfs_mlops.hw.clockd.protocol import Request
from dvfs_mlops.hw.guard import Journal, open_private_dir, write_journal
from testkit.clockd_rig import NOBODY, REPO, Rig, wait_for
from testkit.fakes.sysfs import BOOT_ID, ORIN_TABLE_HZ
from testkit.users import Account, can_make_users, throwaway_group, throwaway_user

DEFAULT = (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
KEY = "jetson-17000000.gpu"

pytestmark = pytest.mark.skipif(bool(can_make_users()), reason=can_make_users() or "-")


@pytest.fixture
def group() -> Iterator[tuple[str, int]]:
    with throwaway_group() as g:
        yield g


@pytest.fixture
def rig(group) -> Iterator[Rig]:
    r = Rig.make(*group)
    try:
        yield r
    finally:
        r.remove()


@pytest.fixture
def attacker(group) -> Iterator[Account]:
    """A local user in the service's group (a member may attack too)."""
    with throwaway_user(groups=(group[0],)) as account:
        yield account


def _as(rig: Rig, who: Account, *args: str, stdin=None) -> subprocess.Popen:
    return rig.client(str(rig.gid), *args, uid=who.uid, gid=who.gid, stdin=stdin)


def _session(rig: Rig, freq: str = "612") -> subprocess.CompletedProcess[str]:
    proc = rig.client(str(rig.gid), "session", "jetson", freq, "exit")
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_symlink_planted_in_a_premade_run_lock_folder_truncates_nothing_and_every_pin_works(rig, attacker):
    """/run/lock is 1777 and emptied at boot: a user made /run/lock/dvfs-mlops first, with the lock file's name linked
    to a root-only file. Neither the service nor a root session may follow it (they do not use /run/lock at all)."""
    secret = rig.base / "shadow"
    secret.write_text("root:$6$secret:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    run_lock = rig.prefix / "run/lock"
    run_lock.mkdir(parents=True)
    run_lock.chmod(0o1777)
    planted = run_lock / "dvfs-mlops"
    planted.mkdir()
    (planted / f"lock-{KEY}.pid").symlink_to(secret)
    (planted / f"restore-{KEY}.json").symlink_to(secret)
    for p in (planted, planted / f"lock-{KEY}.pid", planted / f"restore-{KEY}.json"):
        os.chown(p, attacker.uid, attacker.gid, follow_symlinks=False)  # the attacker's, as if made by them
    rig.start()
    done = _session(rig)
    assert done.returncode == 0 and done.stdout.split() == ["PINNED", "RESTORED"], done.stderr
    root_session = subprocess.run([sys.executable, "-m", "testkit.fakes.session_child", "816", "exit"], cwd=REPO,
                                  env=rig.env(), capture_output=True, text=True, timeout=60)
    assert root_session.returncode == 0, root_session.stderr
    assert secret.read_text() == "root:$6$secret:19000:0:99999:7:::\n" and secret.stat().st_uid == 0
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []


def test_a_foreign_flock_cannot_hold_the_services_lock_nor_stop_a_restart_restoring(rig, attacker):
    service = rig.start()
    member = rig.pinned_client("408")
    lock = rig.lock_dir / f"lock-{KEY}.pid"
    assert lock.exists()
    tries = _as(rig, attacker, "flock", str(lock))
    assert tries.communicate(timeout=30)[0].strip() == "ERROR Permission denied"
    service.kill()  # the service dies with the pin held: its journal is left
    service.wait(timeout=10)
    member.kill()
    member.wait(timeout=10)
    assert rig.fake.range_hz == (408000000, 408000000) and len(rig.journals()) == 1
    tries = _as(rig, attacker, "flock", str(lock))
    assert tries.communicate(timeout=30)[0].strip() == "ERROR Permission denied"
    rig.start()
    assert rig.fake.range_hz == DEFAULT and rig.journals() == []
    assert "on start: restored jetson-17000000.gpu" in rig.log.read_text()


def _flood(rig: Rig, attacker: Account, n: int) -> tuple[subprocess.Popen, list[str]]:
    flood = _as(rig, attacker, "flood", str(rig.socket), str(n), stdin=subprocess.PIPE)
    first = flood.stdout.readline().strip()
    assert first.startswith("OPEN "), flood.stderr.read()
    answers = [first]
    while True:  # the ANSWER lines come at once after OPEN
        flood.stdout.flush()
        line = _readline_within(flood, 0.5)
        if not line:
            break
        answers.append(line.strip())
    return flood, answers


def _readline_within(proc: subprocess.Popen, seconds: float) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    return got[0] if got else ""


@pytest.mark.parametrize("limits", ["per-uid cap", "caps above LimitNOFILE"])
def test_1100_idle_connections_under_limitnofile_1024_neither_stop_the_service_nor_a_running_pin(rig, attacker, limits):
    if limits == "caps above LimitNOFILE":  # the administrator allows more connections than descriptors
        rig.configure("[service]\nconnections_per_uid = 5000\nconnections_total = 5000\n")
    service = rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group, "--nofile", "1024")
    member = rig.pinned_client("612", mode="train")
    flood, answers = _flood(rig, attacker, 1100)
    try:
        opened = int(answers[0].split()[1])
        if limits == "per-uid cap":
            assert opened == 32 and any("already has 32 connections open" in a for a in answers), answers
        else:  # the config's caps are lowered to leave 64 descriptors for restores; the member holds one connection
            assert opened == 1024 - 64 - 1 and any("connections open, the most it allows" in a for a in answers), answers
            assert rig.logged("serving 960 connections at most")
        assert service.poll() is None and rig.fake.range_hz == (612000000, 612000000)  # the member's pin holds
        time.sleep(0.5)
        out, err = member.communicate("done\n", timeout=60)
        assert member.returncode == 0 and "RESTORED" in out, err
        if limits == "per-uid cap":  # another member pins while the attacker still holds every connection it may
            done = _session(rig, "816")
            assert done.returncode == 0 and done.stdout.split() == ["PINNED", "RESTORED"], done.stderr
    finally:
        flood.stdin.close()
        flood.wait(timeout=60)
    assert wait_for(lambda: rig.answers(), 10)
    done = _session(rig, "714")  # and once the flood is gone
    assert done.returncode == 0 and done.stdout.split() == ["PINNED", "RESTORED"], done.stderr
    assert service.poll() is None and rig.fake.range_hz == DEFAULT


def test_a_journal_the_service_cannot_apply_is_kept_and_the_rest_is_served(rig):
    """A pin of an NVML GPU that is gone now (removed, or the driver lost it) left a journal: the service starts,
    says so, keeps the journal, and serves the Jetson."""
    gone = "GPU-00000000-dead-4c2e-9a8d-1f2e3d4c5b6a"
    os.close(open_private_dir(rig.journal_dir))
    write_journal(Journal("nvml", "nvml-0", 999999, 0.0, {"index": 0, "uuid": gone, "action": "reset_locked_clocks"}, "900",
                          BOOT_ID, NOBODY), rig.journal_dir)
    rig.start(sys.executable, "-m", "testkit.fakes.clockd_service", str(rig.socket), rig.group,
              "--gpu", "GPU-5e7a6d1c-3b0f-4c2e-9a8d-1f2e3d4c5b6a")
    assert rig.logged(f"no GPU with UUID {gone}") and rig.logged("that device is refused until its journal is applied")
    done = _session(rig)
    assert done.returncode == 0 and done.stdout.split() == ["PINNED", "RESTORED"], done.stderr
    assert [j.device_key for j in rig.journals()] == ["nvml-0"]  # kept for `dvfs-mlops restore`


@pytest.mark.parametrize("where", ["under a file", "another user's folder", "a folder others may write"])
def test_a_socket_folder_that_cannot_exist_or_is_not_roots_alone_is_one_line(rig, attacker, where):
    if where == "under a file":
        (rig.base / "afile").write_text("")
        sock = rig.base / "afile" / "s.sock"
    else:
        folder = rig.base / "sockdir"
        folder.mkdir()
        if where == "another user's folder":
            os.chown(folder, attacker.uid, attacker.gid)
        else:
            folder.chmod(0o777)
        sock = folder / "s.sock"
    out = subprocess.run([sys.executable, "-m", "dvfs_mlops", "clockd", "serve", "--socket", str(sock), "--group", rig.group],
                         cwd=REPO, env=rig.env(), capture_output=True, text=True, timeout=60)
    errors = [x for x in out.stderr.strip().splitlines() if x.startswith("Error: ")]  # beside the service's log lines
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert {"under a file": "refusing the socket folder", "another user's folder": f"owned by uid {attacker.uid}",
            "a folder others may write": "writable by root alone"}[where] in errors[0]
    assert not sock.exists()


def test_a_socket_folder_made_by_the_service_is_root_group_0750_and_the_socket_0660(rig):
    sock = rig.base / "made" / "s.sock"
    rig.socket = sock
    rig.start()
    st = sock.parent.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, rig.gid, 0o750)
    st = sock.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, rig.gid, 0o660)


def test_a_thread_that_cannot_start_refuses_that_client_in_one_line_and_the_service_goes_on(rig, monkeypatch):
    from dvfs_mlops.hw.clockd.client import ClockdClient
    from dvfs_mlops.hw.clockd.config import ServiceConfig
    from dvfs_mlops.hw.clockd.server import ClockService

    for name, value in rig.env().items():
        monkeypatch.setenv(name, value)
    service = ClockService(ServiceConfig(rig.socket, rig.group))
    service.start()
    loop = threading.Thread(target=service.serve_forever, daemon=True)
    loop.start()
    real_start = threading.Thread.start
    failures = [1]

    def start(self):
        if self.name == "clockd-client" and failures:
            failures.pop()
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    try:
        refused = ClockdClient(rig.socket).request(Request("status"))
        assert not refused.ok and "cannot take another client now" in refused.error
        assert ClockdClient(rig.socket).request(Request("status")).ok  # the next one is served
    finally:
        service.request_stop(signal.SIGTERM)
        loop.join(timeout=10)
        service.stop()


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder of root's under /tmp that other users may enter (a pytest tmp_path is in a 0700 folder)."""
    base = Path(tempfile.mkdtemp(prefix="ckdo", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _swapping(folder: Path, a: str, b: str, who: Account, seconds: float) -> int:
    """A child, dropped to `who`, exchanging `folder`/`a` and `folder`/`b` (renameat2 RENAME_EXCHANGE) in a loop for
    `seconds`; returns its PID (forked, not spawned: a round must cost milliseconds, not an interpreter's start)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setgroups([])
        os.setgid(who.gid)
        os.setuid(who.uid)
        libc = ctypes.CDLL(None, use_errno=True)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            libc.renameat2(dfd, a.encode(), dfd, b.encode(), 2)  # RENAME_EXCHANGE, linux/fs.h
    finally:
        os._exit(0)


def test_the_sudo_hand_back_cannot_be_raced_into_giving_a_root_file_away(open_base, attacker, monkeypatch):
    """While root hands back what a command made in the user's folder, the user swaps that folder for a link to a
    root-only folder holding files of the same names (renameat2 RENAME_EXCHANGE in a loop). Nothing outside the user's
    tree may change owner; what the command made there still goes back to the user."""
    from dvfs_mlops.app import ownership

    home = open_base / "home"
    home.mkdir()
    os.chown(home, attacker.uid, attacker.gid)
    secret = open_base / "secret"  # root's, 0700: stands for /etc or /root
    secret.mkdir(mode=0o700)
    names = ["a.db", *(f"sub/f{i}" for i in range(300))]
    monkeypatch.chdir(home)
    monkeypatch.setenv("SUDO_UID", str(attacker.uid))
    monkeypatch.setenv("SUDO_GID", str(attacker.gid))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    monkeypatch.setenv("DVFS_CACHE_DIR", str(home / ".cache"))
    for d in (home / "made", secret):
        (d / "sub").mkdir(parents=True)
    (home / "link").symlink_to(secret)
    os.chown(home / "link", attacker.uid, attacker.gid, follow_symlinks=False)
    given = rounds = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        rounds += 1
        give_back = ownership.after_command()  # the command starts
        made = home / "made" if not (home / "made").is_symlink() else home / "link"
        fresh = made.with_name("new")
        os.mkdir(fresh)  # the command makes its folder (and files) afresh: root's, new
        (fresh / "sub").mkdir()
        for name in names:
            (fresh / name).write_text("x")
            (secret / name).write_text("s")
        shutil.rmtree(made)  # last round's folder, given back already
        os.rename(fresh, made)
        swapper = _swapping(home, "made", "link", attacker, 0.15)
        time.sleep(0.02)  # the swapper runs
        give_back()  # the command ends while the user swaps
        os.waitpid(swapper, 0)
        leaked = [p for p in (secret, *secret.rglob("*")) if p.lstat().st_uid != 0]
        assert not leaked, f"{leaked[0]} was given away in round {rounds}"
        real = home / "made" if not (home / "made").is_symlink() else home / "link"
        given += (real / "a.db").lstat().st_uid == attacker.uid
    assert rounds >= 3 and given > 0  # the hand-back still gives what the command made in the user's tree


_OUT_OF_DESCRIPTORS = """
import os, resource, socket, sys
from pathlib import Path
from dvfs_mlops.hw.clockd.listener import Listener
from dvfs_mlops.hw.clockd.server import ClockService

path = Path(sys.argv[1]) / "s.sock"
listener = Listener(path, 0)
listener.open()
first, second = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
filler = []
while True:  # every descriptor this process may open, taken
    try:
        filler.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
first.connect(str(path))
print("accepted" if listener.accept(ClockService._refuse) else "not accepted")
print(first.recv(4096).decode().strip())
for fd in filler:
    os.close(fd)
second.connect(str(path))
print("accepted" if listener.accept(ClockService._refuse) else "not accepted")
"""


def test_a_connection_the_service_has_no_descriptor_for_is_answered_and_closed_not_left_queued(tmp_path):
    """accept(2) fails with EMFILE and leaves the connection queued (a full backlog blocks every connect()): the
    listener frees its spare descriptor, accepts, answers in one line, closes, and takes the spare again."""
    out = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS, str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "not accepted" and "out of file descriptors" in lines[1] and lines[2] == "accepted"
