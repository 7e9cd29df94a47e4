"""A clock service under test and its clients, as real processes: the service as root (as under systemd) on a fake
Orin sysfs tree, its clients dropped to unprivileged uids (testkit/fakes/clockd_client.py).

Each rig has its own folder under /tmp (root's, 0755: readable by the clients; AF_UNIX paths stay short) holding the
fake tree, the socket, a home for the clients and the system prefix ($DVFS_SYSTEM_STATE_PREFIX: the state folders and
the service's config file under it).
"""
from __future__ import annotations

import grp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dvfs_mlops.hw.clockd.client import ClockdClient
from dvfs_mlops.hw.clockd.config import CONFIG_FILE
from dvfs_mlops.hw.clockd.protocol import Reply, Request
from dvfs_mlops.hw.guard import SYSTEM_JOURNAL_DIR, SYSTEM_LOCK_DIR, Journal, list_journals
from testkit.fakes.sysfs import FakeJetson, make_orin_tree

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534


def users_group() -> tuple[str, int] | None:
    """The group `users` (gid 100 on Debian-family systems), which the rigs serve; None where there is none."""
    try:
        return "users", grp.getgrnam("users").gr_gid
    except KeyError:
        return None


class Rig:
    """One service and its clients.

    Args:
        base: the rig's folder (root's, 0755).
        group: the group the service serves. gid: its gid.
    """

    def __init__(self, base: Path, group: str, gid: int):
        self.base = base
        self.group, self.gid = group, gid
        self.socket = base / "s.sock"
        self.prefix = base / "system"
        self.prefix.mkdir(mode=0o755)
        self.home = base / "home"
        self.home.mkdir()
        self.home.chmod(0o1777)
        self.fake: FakeJetson = make_orin_tree(base / "root", jetpack=6)
        for d, dirs, files in os.walk(base / "root"):
            for name in [*dirs, *files]:
                p = Path(d) / name
                if not p.is_symlink():
                    p.chmod(p.stat().st_mode | 0o444 | (0o111 if p.is_dir() else 0))
        self.service: subprocess.Popen | None = None
        self.log = base / "service.log"
        self.sysfs_root = base / "root"  # a test may serve a FUSE tree instead
        self.journal_dir = self.prefix / SYSTEM_JOURNAL_DIR
        self.lock_dir = self.prefix / SYSTEM_LOCK_DIR

    @classmethod
    def make(cls, group: str, gid: int) -> Rig:
        base = Path(tempfile.mkdtemp(prefix="ckd", dir="/tmp"))
        base.chmod(0o755)
        return cls(base, group, gid)

    def configure(self, text: str) -> Path:
        """Write the service's config file (root's, 0644), as `clockd install` does."""
        path = self.prefix / CONFIG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DVFS_SYSFS_ROOT": str(self.sysfs_root), "DVFS_SYSTEM_STATE_PREFIX": str(self.prefix),
                "DVFS_CLOCKD_SOCKET": str(self.socket), "HOME": str(self.home), "DVFS_CACHE_DIR": str(self.home), **extra}

    def start(self, *argv: str) -> subprocess.Popen:
        """Start the service (`dvfs-mlops clockd serve` by default, else `argv`) and wait until it answers."""
        cmd = list(argv) or [sys.executable, "-m", "dvfs_mlops", "clockd", "serve", "--socket", str(self.socket),
                             "--group", self.group]
        self.service = subprocess.Popen(cmd, cwd=REPO, env=self.env(), stdout=subprocess.DEVNULL,
                                        stderr=open(self.log, "a"))
        deadline = time.monotonic() + 30
        while not self.answers():  # a killed service's socket file stays until the new one replaces it
            assert self.service.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the service did not listen within 30 s"
            time.sleep(0.02)
        return self.service

    def answers(self) -> bool:
        try:
            ClockdClient(self.socket, timeout=5).request(Request("status")).raise_for_error()
        except Exception:  # noqa: BLE001 - not listening yet
            return False
        return True

    def client(self, groups: str, *args: str, uid: int = NOBODY, gid: int = NOBODY, stdin: Any = None,
               **env: str) -> subprocess.Popen:
        """A client process dropped to `uid`:`gid` with supplementary `groups` (comma-separated gids, or -)."""
        return subprocess.Popen([sys.executable, "-m", "testkit.fakes.clockd_client", str(uid), str(gid), groups, *args],
                                cwd=REPO, env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=stdin)

    def pinned_client(self, freq: str = "612", backend: str = "jetson", *extra: str, mode: str = "wait",
                      **kw: Any) -> subprocess.Popen:
        """A member's session that pinned `freq` and waits (or trains: `mode="train"`)."""
        proc = self.client(str(self.gid), "session", backend, freq, mode, *extra,
                           stdin=subprocess.PIPE if mode == "train" else None, **kw)
        line = proc.stdout.readline().strip()
        assert line == "PINNED", proc.stderr.read()
        return proc

    def cli(self, groups: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        proc = self.client(groups, "cli", *args, **env)
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def ask(self, req: Request) -> Reply:
        """A request from this (root) process."""
        client = ClockdClient(self.socket)
        try:
            return client.request(req).raise_for_error()
        finally:
            client.close()

    def journals(self) -> list[Journal]:
        return [j for _p, j in list_journals(self.journal_dir)]

    def logged(self, text: str, within_s: float = 5.0) -> bool:
        """Whether the service's log says `text` (waiting up to `within_s`)."""
        return wait_for(lambda: text in self.log.read_text(), within_s)

    def stop(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            self.service.wait(timeout=60)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


# Every clock-service test file's mark: the service runs as root and drops its clients to another uid.
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the clock service runs as root and its clients are dropped "
                               "to uid 65534 from root; run the suite as root (CI does)")


@contextmanager
def served_rig() -> Iterator[Rig]:
    """A `Rig` serving the group 'users' (skips the test where there is none: the tests create no groups), removed
    after the test."""
    group = users_group()
    if group is None:
        pytest.skip("no group 'users' to serve (these tests create no groups)")
    r = Rig.make(*group)
    try:
        yield r
    finally:
        r.remove()


def wait_for(cond: Any, limit_s: float) -> bool:
    """Poll `cond` every millisecond until it holds (True) or `limit_s` passed (False)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
