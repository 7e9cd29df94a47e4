"""Throw-away users and groups for tests that attack the root clock service as real, unprivileged accounts.

Each name is unique (`dvt` + random hex, within useradd's 32 characters), made with useradd/groupadd as system
accounts without a home or a login shell, and removed (userdel/groupdel) when the block ends, however it ends. Root
only: a caller checks `can_make_users()` and skips with its reason otherwise.
"""
from __future__ import annotations

import contextlib
import dataclasses
import grp
import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterator

TOOLS = ("useradd", "userdel", "groupadd", "groupdel")


def can_make_users() -> str:
    """'' where this process can make throw-away users, else why not."""
    if os.geteuid() != 0:
        return "making throw-away users and groups needs root (CI runs the suite as root)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"no {', '.join(missing)} here (apt-get install passwd)" if missing else ""


@dataclasses.dataclass(frozen=True)
class Account:
    """A throw-away user: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int


def _unique(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(5)}"


@contextlib.contextmanager
def throwaway_group() -> Iterator[tuple[str, int]]:
    """A new system group (name, gid), deleted afterwards."""
    name = _unique("dvg")
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    try:
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def throwaway_user(groups: tuple[str, ...] = ()) -> Iterator[Account]:
    """A new system user with its own group, in `groups` too; deleted (with its group) afterwards."""
    name = _unique("dvt")
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name]
    if groups:
        argv[1:1] = ["--groups", ",".join(groups)]
    subprocess.run(argv, check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield Account(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        with contextlib.suppress(KeyError):
            grp.getgrnam(name)
            subprocess.run(["groupdel", name], check=False, capture_output=True)
