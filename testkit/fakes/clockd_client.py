"""A clock-service client as an unprivileged user: start as root, load everything, drop to UID/GIDs, then act.

The test interpreter may live where only root can read it (e.g. under /root), so `subprocess.Popen(user=...)` could
not even start it; instead this process imports every module it will need, then drops its credentials for good
(setgroups, setgid, setuid: the order setuid(2) requires, since a process that gave up root can no longer change its
groups). The kernel then sees a real unprivileged client: the socket file's mode and SO_PEERCRED apply to it.

usage: python -m testkit.fakes.clockd_client UID GID GROUPS(comma-separated, or -) ACTION ARGS...
  session BACKEND FREQ MODE [UUID|- [CPU_MHZ|- [EMC_MHZ|-]]]
                                    pin through a session (the CPU and memory clocks too where given); MODE: wait
                                    (print PINNED, sleep), exit (PINNED, leave the
                                    block, RESTORED), context (as exit, then CONTEXT and the session's context as JSON),
                                    train (PINNED, then a step every 20 ms until told on stdin, then RESTORED and the
                                    context and clock_held as JSON; a lost clock prints LOST and its line instead)
  fork FREQ RENEWS                  pin jetson FREQ through the service, fork; the child renews RENEWS times (0.2 s
                                    apart, printing CHILD PID first) then holds the socket without a word; the parent
                                    exits at once without restoring
  flood SOCKET N                    open N connections, print OPEN k REFUSED m (refused: answered and closed at once,
                                    or connect failed), then hold them until stdin closes
  flock PATH                        try to open PATH and flock it; print HELD or the error
  swap DIR A B SECONDS              exchange DIR/A and DIR/B (renameat2 RENAME_EXCHANGE) in a loop for SECONDS
  cli ARGS...                       run `dvfs-mlops ARGS...`
A session refused prints ERROR and its line (exit 2). $CLOCKD_TEST_REPIN_S: how long a lost pin waits for the
service to come back (the package's 30 s is a test's eternity).
"""
from __future__ import annotations

import ctypes
import fcntl
import importlib
import json
import os
import pkgutil
import socket
import sys
import time

import dvfs_mlops.app
import dvfs_mlops.hw
from dvfs_mlops.app import cli
from dvfs_mlops.errors import ClockLostError, DvfsError
from dvfs_mlops.hw.clockd import client as clockd_client
from dvfs_mlops.hw.clockd.client import ServicePin
from dvfs_mlops.hw.clockd.protocol import Request
from dvfs_mlops.hw.jetson import JetsonDevice
from dvfs_mlops.hw.nvml import NvmlDevice
from testkit.fakes import fake_pynvml

RENAME_EXCHANGE = 2  # linux/fs.h: atomically exchange the two names (renameat2(2))
AT_FDCWD = -100


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


def session(backend: str, freq: str, mode: str, uuid: str = "", cpu: str = "-", emc: str = "-") -> None:
    uuid = "" if uuid == "-" else uuid
    knobs = {k: float(v) for k, v in (("cpu_mhz", cpu), ("emc_mhz", emc)) if v != "-"}
    try:
        if backend == "jetson":
            dev = JetsonDevice(above_mode_cap=True)  # a pin above the power mode's cap is the caller's to allow
        else:
            gpu = fake_pynvml.FakeGPU(uuid=uuid, mem_clocks=[9501, 5001, 810] if "emc_mhz" in knobs else None)
            dev = NvmlDevice(nvml=fake_pynvml.make_module([gpu]), assume_unlocked=True)
        s = dev.session(freq, **knobs)
    except DvfsError as e:  # refused before the session: the one line a command would print
        print("ERROR " + str(e), flush=True)
        sys.exit(2)
    try:
        with s:
            print("PINNED", flush=True)
            if mode == "wait":
                time.sleep(120)
            elif mode == "train":
                _train(s)
    except ClockLostError as e:
        print("LOST " + str(e), flush=True)
        print("CONTEXT " + json.dumps(s.context, sort_keys=True), flush=True)
        return
    except DvfsError as e:  # refused: the one line a command would print
        print("ERROR " + str(e), flush=True)
        sys.exit(2)
    print("RESTORED", flush=True)
    if mode in ("context", "train"):  # what the run would log besides energy
        print("CONTEXT " + json.dumps(s.context, sort_keys=True), flush=True)
    if mode == "train":
        print("HELD " + json.dumps({"train": s.windows["train"].clock_held, "session": s.session_report().clock_held}),
              flush=True)


def _train(s) -> None:
    """Steps every 20 ms in a "train" window until a line (or the end) comes on stdin."""
    os.set_blocking(sys.stdin.fileno(), False)
    with s.window("train"):
        while True:
            s.step()
            try:
                if os.read(sys.stdin.fileno(), 64) is not None:
                    return
            except BlockingIOError:
                pass
            time.sleep(0.02)


def fork_holder(freq: str, renews: int) -> None:
    from dvfs_mlops import settings

    pin = ServicePin("jetson", settings.clockd_socket())
    pin.pin(freq)
    pin._stop.set()  # the renew thread stops: only the forked child speaks from here
    print("PINNED", flush=True)
    if os.fork():
        os._exit(0)  # the parent exits at once, restoring nothing: its child keeps the socket
    print(f"CHILD {os.getpid()}", flush=True)
    client = pin._client
    assert client is not None
    for _ in range(renews):
        client.request(Request("renew")).raise_for_error()
        time.sleep(0.2)
    print("SILENT", flush=True)
    time.sleep(60)


def flood(path: str, n: int) -> None:
    opened, failed = [], 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if _connect_within(s, path, 2.0):
            opened.append(s)
            continue
        s.close()  # refused, or the backlog stayed full (nobody accepts): give up after a few
        failed += 1
        if failed >= 3:
            break
    time.sleep(1.0)  # the service answers a connection over a limit at once, then closes it
    held, refused, lines = [], failed, set()
    for s in opened:
        s.setblocking(False)
        try:
            data = s.recv(4096)
        except BlockingIOError:
            held.append(s)
            continue
        except OSError:
            data = b""
        refused += 1
        if data:
            lines.add(json.loads(data.splitlines()[0])["error"])
        s.close()
    print(f"OPEN {len(held)} REFUSED {refused}", flush=True)
    for line in sorted(lines):
        print(f"ANSWER {line}", flush=True)
    sys.stdin.read()


def _connect_within(s: socket.socket, path: str, seconds: float) -> bool:
    """connect() as a blocking client does it (waiting while the listen backlog is full: a non-blocking AF_UNIX connect
    says EAGAIN instead, unix(7)), for at most `seconds`."""
    s.setblocking(False)
    deadline = time.monotonic() + seconds
    while True:
        try:
            s.connect(path)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        except OSError:
            return False


def try_flock(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        print(f"ERROR {e.strerror}", flush=True)
        return
    print("HELD", flush=True)
    sys.stdin.read()


def swap(folder: str, a: str, b: str, seconds: float) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    ea, eb = a.encode(), b.encode()
    swaps, end = 0, time.monotonic() + seconds
    print("SWAPPING", flush=True)
    while time.monotonic() < end:
        if libc.renameat2(dfd, ea, dfd, eb, RENAME_EXCHANGE) == 0:
            swaps += 1
    print(f"SWAPS {swaps}", flush=True)


def main() -> None:
    uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if os.environ.get("CLOCKD_TEST_REPIN_S"):  # how long a lost pin waits for the service (a test's seconds, not 30)
        clockd_client.REPIN_WITHIN_S = float(os.environ["CLOCKD_TEST_REPIN_S"])
    preload()
    drop(uid, gid, [] if groups == "-" else [int(g) for g in groups.split(",")])
    action, args = sys.argv[4], sys.argv[5:]
    if action == "session":
        session(*args)
    elif action == "fork":
        fork_holder(args[0], int(args[1]))
    elif action == "flood":
        flood(args[0], int(args[1]))
    elif action == "flock":
        try_flock(args[0])
    elif action == "swap":
        swap(args[0], args[1], args[2], float(args[3]))
    else:
        cli.main(args, prog_name="dvfs-mlops")


if __name__ == "__main__":
    main()
