"""A clock-service client as an unprivileged user: start as root, load everything, drop to UID/GIDs, then act.

The test interpreter may live where only root can read it (e.g. under /root), so `subprocess.Popen(user=...)` could
not even start it; instead this process imports every module it will need, then drops its credentials for good
(setgroups, setgid, setuid: the order setuid(2) requires, since a process that gave up root can no longer change its
groups). The kernel then sees a real unprivileged client: the socket file's mode and SO_PEERCRED apply to it.

usage: python -m testkit.fakes.clockd_client UID GID GROUPS(comma-separated, or -) session BACKEND FREQ ACTION [UUID]
       python -m testkit.fakes.clockd_client UID GID GROUPS cli ARGS...
ACTION: wait (pin, print PINNED, sleep), exit (pin, print PINNED, leave the block normally, print RESTORED).
"""
from __future__ import annotations

import os
import sys
import time

import dvfs_mlops.app.cli as cli
import dvfs_mlops.app.devices  # noqa: F401 - loaded before the drop: the stdlib may be unreadable afterwards
import dvfs_mlops.app.run  # noqa: F401
import dvfs_mlops.hw.clockd.client  # noqa: F401
import dvfs_mlops.hw.ina3221  # noqa: F401
import dvfs_mlops.hw.meter  # noqa: F401
import dvfs_mlops.hw.sim  # noqa: F401
from dvfs_mlops.hw.jetson import JetsonDevice
from dvfs_mlops.hw.nvml import NvmlDevice
from testkit.fakes import fake_pynvml


def drop(uid: int, gid: int, groups: list[int]) -> None:
    """Become `uid`:`gid` with exactly `groups` as supplementary groups, irreversibly."""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    assert os.geteuid() == uid and os.getegid() == gid and sorted(os.getgroups()) == sorted(groups)


def session(backend: str, freq: str, action: str, uuid: str = "") -> None:
    if backend == "jetson":
        dev = JetsonDevice()
    else:
        dev = NvmlDevice(nvml=fake_pynvml.make_module([fake_pynvml.FakeGPU(uuid=uuid)]), assume_unlocked=True)
    with dev.session(freq):
        print("PINNED", flush=True)
        if action == "wait":
            time.sleep(120)
    print("RESTORED", flush=True)


def main() -> None:
    uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    drop(uid, gid, [] if groups == "-" else [int(g) for g in groups.split(",")])
    if sys.argv[4] == "session":
        session(*sys.argv[5:])
    else:
        cli.main(sys.argv[5:], prog_name="dvfs-mlops")


if __name__ == "__main__":
    main()
