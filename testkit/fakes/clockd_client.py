"""A clock-service client as an unprivileged user: start as root, load everything, drop to UID/GIDs, then act.

The test interpreter may live where only root can read it (e.g. under /root), so `subprocess.Popen(user=...)` could
not even start it; instead this process imports every module it will need, then drops its credentials for good
(setgroups, setgid, setuid: the order setuid(2) requires, since a process that gave up root can no longer change its
groups). The kernel then sees a real unprivileged client: the socket file's mode and SO_PEERCRED apply to it.

usage: python -m testkit.fakes.clockd_client UID GID GROUPS(comma-separated, or -) session BACKEND FREQ ACTION [UUID]
       python -m testkit.fakes.clockd_client UID GID GROUPS cli ARGS...
ACTION: wait (pin, print PINNED, sleep), exit (pin, print PINNED, leave the block normally, print RESTORED), context
(as exit, then print CONTEXT and the session's context as JSON).
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import time

import dvfs_mlops.app
import dvfs_mlops.hw
from dvfs_mlops.app import cli
from dvfs_mlops.hw.jetson import JetsonDevice
from dvfs_mlops.hw.nvml import NvmlDevice
from testkit.fakes import fake_pynvml


def preload() -> None:
    """Import every module of the app and hw layers (what a command run here imports lazily) and the tracking helpers
    the CLI's error path uses: after the drop, a checkout only root can read (a clone under /root, a 0700 temporary
    folder) could not be read any more. Neither imports torch or mlflow."""
    for pkg in (dvfs_mlops.app, dvfs_mlops.hw):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(m.name)
    importlib.import_module("dvfs_mlops.mlops.tracking")


def drop(uid: int, gid: int, groups: list[int]) -> None:
    """Become `uid`:`gid` with exactly `groups` as supplementary groups, irreversibly."""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    assert os.geteuid() == uid and os.getegid() == gid and sorted(os.getgroups()) == sorted(groups)


def session(backend: str, freq: str, action: str, uuid: str = "") -> None:
    if backend == "jetson":
        dev = JetsonDevice(above_mode_cap=True)  # a pin above the power mode's cap is the caller's to allow
    else:
        dev = NvmlDevice(nvml=fake_pynvml.make_module([fake_pynvml.FakeGPU(uuid=uuid)]), assume_unlocked=True)
    with dev.session(freq) as s:
        print("PINNED", flush=True)
        if action == "wait":
            time.sleep(120)
    print("RESTORED", flush=True)
    if action == "context":  # what the run would log besides energy
        print("CONTEXT " + json.dumps(s.context, sort_keys=True), flush=True)


def main() -> None:
    uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    preload()
    drop(uid, gid, [] if groups == "-" else [int(g) for g in groups.split(",")])
    if sys.argv[4] == "session":
        session(*sys.argv[5:])
    else:
        cli.main(sys.argv[5:], prog_name="dvfs-mlops")


if __name__ == "__main__":
    main()
