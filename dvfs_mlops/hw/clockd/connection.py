"""One client connection as the kernel describes it: who connected (`peer_of`), and who sent each line (`LineReader`).

Credentials come from the kernel, never from what a client says: SO_PEERCRED gives the pid, uid and gid of the process
that connected, SO_PEERGROUPS (Linux >= 4.13) its supplementary groups, else /proc/PID/status "Groups:" (socket(7)).
With SO_PASSCRED set on the connection, every message carries an SCM_CREDENTIALS message naming the process that sent
it (unix(7): "the credentials of the sending process"; the kernel fills in the sender's own PID where the sender
gives none, and a stream read never joins the data of two senders), so the service knows which process renews a
pin now: a forked child that inherited the socket is named as itself, not as its exited parent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import time
from pathlib import Path

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.clockd.protocol import MAX_LINE, user_name

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h; Python does not name it
PEERGROUPS_BUFLEN = 1024  # the most socket.getsockopt takes ("buflen out of range" above): 256 groups; more -> /proc
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (socket(7), SO_PEERCRED)


@dataclasses.dataclass(frozen=True)
class Peer:
    """A client, as the kernel tells it (not as it says)."""

    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]

    @property
    def user(self) -> str:
        return user_name(self.uid)


def peer_of(conn: socket.socket) -> Peer:
    """The connected client's pid, uid, gid (SO_PEERCRED) and supplementary groups (SO_PEERGROUPS, which needs no file
    descriptor, so a service out of them still knows its members; else /proc/PID/status)."""
    pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    groups: tuple[int, ...] | None = None
    with contextlib.suppress(OSError):
        raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, PEERGROUPS_BUFLEN)
        groups = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    if groups is None:
        groups = ()
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Groups:"):
                    groups = tuple(int(g) for g in line.split()[1:])
    return Peer(pid, uid, gid, tuple(groups))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (its /proc entry; the service may not signal another user's process)."""
    return pid > 0 and Path(f"/proc/{pid}").exists()


class LineReader:
    """Lines from a connection, each with the PID the kernel says sent it.

    Args:
        conn: the accepted connection; SO_PASSCRED is set on it here.
    """

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self._buffer = b""
        self._sender: int | None = None
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def readline(self, timeout_s: float) -> tuple[bytes, int | None] | None:
        """The next line (with its newline) and its sender's PID (None where the kernel attached none), or None at end of
        file.

        Raises:
            TimeoutError: no whole line within `timeout_s`.
            DvfsError: a line longer than `MAX_LINE`.
            OSError: the connection broke.
        """
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise DvfsError(f"a line is at most {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            data, ancillary, _flags, _addr = self.conn.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            if not data:
                return None
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(value) >= _UCRED.size:
                    self._sender = _UCRED.unpack(value[: _UCRED.size])[0] or None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n", self._sender
