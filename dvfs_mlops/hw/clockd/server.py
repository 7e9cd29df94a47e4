"""The clock service: a root process that pins GPU clocks for the members of one group, one pin per connection.

Who may ask: the socket file is root:GROUP mode 0660, so the kernel refuses connect() to anyone else; the service
also reads each client's credentials from the socket (SO_PEERCRED: pid, uid, gid; SO_PEERGROUPS, Linux >= 4.13, for
the supplementary groups, else /proc/PID/status "Groups:"; socket(7)) and refuses, with one line and a log line,
a client outside the group even where the file's mode was loosened. Root is always served.

What it does: the operations of `protocol` only. The device is its own choice: the Jetson devfreq node it finds
under $DVFS_SYSFS_ROOT, or the NVML GPU whose UUID the client names, looked up among the GPUs NVML enumerates here.
It pins with the backends' own code (`JetsonPin`, `NvmlPin`): the lock (one owner per GPU, across users) and the
journal (naming the client's PID and uid) are the same as a root session's, in the root state folders.

A pin lives as long as its connection: when a client closes it, exits or is killed, the kernel closes its end, the
connection's thread reads end-of-file at once and restores. A client that wants the acknowledgement asks "restore"
first. On start the service applies any journal a dead run (or a killed service) left, before it listens; on
SIGTERM/SIGINT it restores every pin it holds, then exits.
"""
from __future__ import annotations

import contextlib
import dataclasses
import grp
import logging
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DeviceBusyError, DevicePermissionError, DvfsError
from dvfs_mlops.hw.clockd.protocol import MAX_LINE, PinStatus, Reply, Request, user_name
from dvfs_mlops.hw.device import MAXN, parse_freq

log = logging.getLogger(__name__)

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h; Python does not name it
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
    """The connected client's pid, uid, gid (SO_PEERCRED) and supplementary groups (SO_PEERGROUPS, else /proc)."""
    pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    groups: tuple[int, ...] | None = None
    with contextlib.suppress(OSError):
        raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 65536)
        groups = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    if groups is None:
        groups = ()
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Groups:"):
                    groups = tuple(int(g) for g in line.split()[1:])
    return Peer(pid, uid, gid, tuple(groups))


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """How the service runs.

    Attributes:
        socket_path: where it listens.
        group: the group whose members it serves (the socket file's group).
        nvml_module: a `pynvml`-compatible module (None: nvidia-ml-py where installed; tests pass a fake).
    """

    socket_path: Path
    group: str
    nvml_module: Any = None


@dataclasses.dataclass
class Lease:
    """One GPU pinned for one connection."""

    key: str
    pin: Any  # JetsonPin or NvmlPin
    device: Any
    status: PinStatus
    guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    ended: bool = False


def group_id(name: str) -> int:
    """The gid of group `name` (a number is taken as a gid).

    Raises:
        DvfsError: no such group; the line says how to create it.
    """
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise DvfsError(f"no group {name!r}: create it (sudo groupadd --system {name}; `clockd install` does) or pass --group") from None


class ClockService:
    """The service: `start()` (journals first, then the socket), `serve_forever()`, `stop()` (restores every pin).

    Args:
        config: where it listens and for whom.
    """

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.gid = group_id(config.group)
        self._sock: socket.socket | None = None
        self._leases: dict[str, Lease] = {}
        self._reserved: dict[str, PinStatus] = {}
        self._lock = threading.Lock()
        self._jetson: Any = None
        self._stopping = False

    # lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Apply dead runs' journals, then bind the socket root:GROUP 0660 and listen.

        Raises:
            DvfsError: not root, another service answers on the socket, or a journal could not be applied.
        """
        if os.geteuid() != 0:
            raise DvfsError("the clock service writes clocks, so it runs as root (sudo dvfs-mlops clockd install runs it "
                            "under systemd)")
        from dvfs_mlops.hw import restore_journals

        restore_journals(announce=lambda m: log.info("clockd: on start: %s", m), nvml_module=self.config.nvml_module)
        path = self.config.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600: nobody else can connect before the group and mode are set
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chown(path, 0, self.gid)
        os.chmod(path, 0o660)
        sock.listen(64)
        self._sock = sock
        log.info("clockd: listening on %s (group %s, gid %d, mode 0660); sysfs root %s", path, self.config.group, self.gid,
                 _sysfs_root())

    @staticmethod
    def _clear_stale(path: Path) -> None:
        if not (path.exists() or path.is_symlink()):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a socket file nobody listens on: a service that died
            return
        finally:
            probe.close()
        raise DvfsError(f"a clock service already listens on {path}; stop it first (sudo systemctl stop dvfs-clockd)")

    def serve_forever(self) -> None:
        """Accept clients until `stop()` (or a signal's SystemExit), one thread each."""
        assert self._sock is not None
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping:
                    return
                raise
            threading.Thread(target=self._serve_client, args=(conn,), daemon=True, name="clockd-client").start()

    def stop(self) -> None:
        """Stop listening, restore every pin held, remove the socket file."""
        self._stopping = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            with contextlib.suppress(OSError):
                self.config.socket_path.unlink()
        for lease in list(self._leases.values()):
            with contextlib.suppress(DvfsError):  # logged by _end; the journal is kept for the next start
                self._end(lease, "the service stopped")

    # one client ----------------------------------------------------------------------------------
    def _serve_client(self, conn: socket.socket) -> None:
        lease: Lease | None = None
        try:
            peer = peer_of(conn)
            if not self._allowed(peer):
                log.warning("clockd: refused uid %d (%s) PID %d: not in group %s", peer.uid, peer.user, peer.pid, self.config.group)
                conn.sendall(Reply.failure(DevicePermissionError(
                    f"uid {peer.uid} ({peer.user}) is not in group {self.config.group!r}: ask an administrator to run "
                    f"'sudo usermod -aG {self.config.group} {peer.user}' (then log in again), or run as root")).encode())
                return
            reader = conn.makefile("rb")
            while True:
                line = reader.readline(MAX_LINE + 1)
                if not line:
                    break  # end of file: the client closed, exited or was killed
                try:
                    reply, lease = self._do(Request.decode(line), peer, lease)
                except Exception as e:  # noqa: BLE001 - every error is a reply, the service goes on
                    reply = Reply.failure(e)
                conn.sendall(reply.encode())
        except OSError:
            pass  # ECONNRESET and the like: the client is gone
        finally:
            if lease is not None:
                with contextlib.suppress(DvfsError):  # logged by _end; the journal is kept for the next start
                    self._end(lease, "its client disconnected")
            with contextlib.suppress(OSError):
                conn.close()

    def _allowed(self, peer: Peer) -> bool:
        return peer.uid == 0 or peer.gid == self.gid or self.gid in peer.groups

    def _do(self, req: Request, peer: Peer, lease: Lease | None) -> tuple[Reply, Lease | None]:
        if req.op == "status":
            return Reply(True, pins=[x.status for x in list(self._leases.values())]), lease
        if req.op == "restore":
            if lease is not None:
                self._end(lease, "its client asked")
                return Reply(True), None
            lines: list[str] = []
            from dvfs_mlops.hw import restore_journals

            restore_journals(announce=lines.append, nvml_module=self.config.nvml_module)
            log.info("clockd: uid %d (%s) PID %d asked to restore journals: %s", peer.uid, peer.user, peer.pid, "; ".join(lines))
            return Reply(True, lines=lines), None
        if req.op == "table":
            dev = self._device(req)
            try:
                return Reply(True, frequencies_mhz=dev.frequencies_mhz, current_mhz=dev.current_mhz()), lease
            finally:
                self._close(dev)
        if req.op == "repin":
            if lease is None:
                raise DvfsError("nothing pinned on this connection: pin first")
            mhz = parse_freq(req.freq, lease.device.frequencies_mhz)
            if mhz == MAXN:
                raise DvfsError("repin needs a clock of the table, not maxn")
            with lease.guard:
                lease.pin.repin(float(mhz))
            lease.status = dataclasses.replace(lease.status, requested=f"{float(mhz):g}")
            log.info("clockd: uid %d (%s) PID %d moved %s to %g MHz", peer.uid, peer.user, peer.pid, lease.key, mhz)
            return Reply(True, pinned_mhz=float(mhz), current_mhz=lease.device.current_mhz()), lease
        if lease is not None:
            raise DvfsError(f"this connection already pins {lease.key}; repin to move it, restore to end it")
        new = self._pin(req, peer)
        return Reply(True, pinned_mhz=new.pin_mhz, current_mhz=new.lease.device.current_mhz(),
                     above_mode_cap=new.above_mode_cap), new.lease

    def _pin(self, req: Request, peer: Peer) -> _Pinned:
        dev = self._device(req)
        try:
            freq = parse_freq(req.freq, dev.frequencies_mhz)
            key = dev.device_key
            label = "maxn" if freq == MAXN else f"{float(freq):g}"
            status = PinStatus(dev.name, key, label, peer.uid, peer.pid, peer.user, time.time())
            self._reserve(key, status)
        except BaseException:
            self._close(dev)
            raise
        pin = self._pin_for(dev, peer)
        try:
            context = pin.pin(freq)
        except BaseException:
            try:
                pin.restore()
            finally:
                self._release(key)
                self._close(dev)
            raise
        lease = Lease(key, pin, dev, status)
        with self._lock:
            self._reserved.pop(key, None)
            self._leases[key] = lease
        log.info("clockd: uid %d (%s) PID %d pinned %s at %s", peer.uid, peer.user, peer.pid, key,
                 "maxn (nothing written)" if freq == MAXN else f"{float(freq):g} MHz")
        return _Pinned(lease, None if freq == MAXN else float(freq), bool(context.get("above_mode_cap")))

    def _reserve(self, key: str, status: PinStatus) -> None:
        with self._lock:
            owner = (self._leases[key].status if key in self._leases else None) or self._reserved.get(key)
            if owner is not None:
                raise DeviceBusyError(f"the GPU clocks of {key} are in use by uid {owner.uid} ({owner.user}), PID "
                                      f"{owner.pid}, through the clock service; wait for it to finish, then retry")
            self._reserved[key] = status

    def _release(self, key: str) -> None:
        with self._lock:
            self._reserved.pop(key, None)
            self._leases.pop(key, None)

    def _end(self, lease: Lease, why: str) -> None:
        """Restore `lease` once (the connection's thread and `stop` may both try); a failure is logged, the journal kept."""
        with lease.guard:
            if lease.ended:
                return
            lease.ended = True
            try:
                lease.pin.restore()
                log.info("clockd: restored %s (pinned at %s for uid %d, PID %d): %s", lease.key, lease.status.requested,
                         lease.status.uid, lease.status.pid, why)
            except DvfsError as e:
                log.error("clockd: %s", e)
                raise
            finally:
                self._release(lease.key)
                self._close(lease.device)

    # devices -------------------------------------------------------------------------------------
    def _device(self, req: Request) -> Any:
        """The device a request is about, as the service finds it (never a path from the client)."""
        if req.backend == "jetson":
            from dvfs_mlops.hw.jetson import JetsonDevice

            if self._jetson is None:
                self._jetson = JetsonDevice()
            return self._jetson
        if req.backend == "nvml":
            from dvfs_mlops.hw.nvml import NvmlDevice

            if not req.gpu_uuid.startswith("GPU-"):
                raise DvfsError("an nvml request names its GPU by UUID (GPU-...)")
            return NvmlDevice(nvml=self.config.nvml_module, uuid=req.gpu_uuid, assume_unlocked=req.assume_unlocked)
        raise DvfsError("a request names its backend: jetson or nvml")

    @staticmethod
    def _pin_for(dev: Any, peer: Peer) -> Any:
        if dev.name == "jetson":
            from dvfs_mlops.hw.jetson import JetsonPin

            return JetsonPin(dev, owner_pid=peer.pid, owner_uid=peer.uid)
        from dvfs_mlops.hw.nvml import NvmlPin

        return NvmlPin(dev, owner_pid=peer.pid, owner_uid=peer.uid)

    @staticmethod
    def _close(dev: Any) -> None:
        if dev is not None and dev.name == "nvml":
            dev.close()


@dataclasses.dataclass(frozen=True)
class _Pinned:
    lease: Lease
    pin_mhz: float | None
    above_mode_cap: bool = False


def _sysfs_root() -> Path:
    from dvfs_mlops.hw.sysfs import sysfs_root

    return sysfs_root()


def serve(config: ServiceConfig) -> None:
    """Run the service in the foreground until SIGTERM or SIGINT, then restore every pin and return.

    Raises:
        DvfsError: it cannot start (not root, no such group, a service already on the socket, a journal that fails).
    """
    service = ClockService(config)
    service.start()

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        service.serve_forever()
    except SystemExit as e:
        log.info("clockd: stopping (signal %d)", int(e.code or 0) - 128)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        service.stop()
