"""The clock service: a root process that pins GPU clocks for the members of one group, one pin per connection.

Who may ask: the socket file is root:GROUP 0660 in a folder only root controls (`listener`), so the kernel refuses
connect() to anyone else; the service also reads each client's credentials from the socket (`connection.peer_of`) and
refuses, with one line and a log line, a client outside the group even where the file's mode was loosened. Root is
always served. A uid may hold `connections_per_uid` connections and all uids `connections_total` (the root-owned
config, `config.RootConfig`): one more is accepted, answered in one line and closed, never left queued.

What it does: the operations of `protocol` only. The device is its own choice: the Jetson devfreq node, cpufreq
policies and BPMP EMC clock it finds under $DVFS_SYSFS_ROOT, or an NVML GPU of the config's list whose UUID the client
names, looked up among the GPUs NVML enumerates here; whether NVML GPUs may be assumed unlocked is the config's word.
A CPU or memory clock a client asks for must be one of the service's own tables for that knob. It pins with the
backends' own code (`JetsonPin`, `NvmlPin`): the locks (one owner per clock domain, across users: the GPU, the CPU, the
EMC) and the journals (naming the client's PID and uid) are a root session's, in the root state folders. It reads for
its clients what they cannot read themselves: BPMP's measured GPU clock and the EMC rate (debugfs, root only).

How long a pin lives: while its connection is open and its client renews it. End of file on the connection (the
client exited or was killed) restores at once; so does a connection silent for the idle timeout (a client that stopped
renewing: a forked child holding an exited parent's socket); and a pin older than the maximum lease (`--max-lease`)
is restored, its client told on its next call. Root releases any pin (`clockd release DEVICE`). Whatever ended a pin,
every later operation on it is refused with that reason: nothing is written for a pin that ended.

Start and stop: on start the service applies the journals a dead run (or a killed service) left, before it listens; a
journal it cannot apply is logged and kept, and that device refused until it is, while the rest is served. SIGTERM
and SIGINT stop it: no new pin is taken, a pin in progress is finished and then restored with every other, and a repeat
signal is logged and ignored. SIGHUP re-reads the config file (NVML scope, limits) and keeps every pin.
"""
from __future__ import annotations

import contextlib
import dataclasses
import grp
import logging
import os
import resource
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops.errors import (
    ClockLostError,
    DeviceBusyError,
    DeviceNotFoundError,
    DevicePermissionError,
    DvfsError,
    RestoreFailedError,
    unknown,
)
from dvfs_mlops.hw.clockd.config import RENEWS_PER_TIMEOUT, RootConfig, ServiceConfig, config_path, load_root_config
from dvfs_mlops.hw.clockd.connection import LineReader, Peer, peer_of, pid_alive
from dvfs_mlops.hw.clockd.listener import Listener
from dvfs_mlops.hw.clockd.protocol import PinStatus, Reply, Request, duration
from dvfs_mlops.hw.device import MAXN, parse_freq, parse_knob

if TYPE_CHECKING:
    from typing import TypeAlias

    from dvfs_mlops.hw.jetson import JetsonDevice, JetsonPin
    from dvfs_mlops.hw.nvml import NvmlDevice, NvmlPin

    # The backends the service pins for its clients.
    ServiceDevice: TypeAlias = JetsonDevice | NvmlDevice

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0  # how long stop() waits for pins in progress before restoring what it holds
# Descriptors kept free of connections, whatever the config allows: a restore opens sysfs files, a journal and its
# folder, NVML its device nodes. Clients that hold every descriptor must never make a restore fail.
FD_RESERVE = 64


@dataclasses.dataclass
class Lease:
    """One GPU pinned for one connection.

    Attributes:
        key: the device key (the GPU's). pin: the backend's pin (`JetsonPin`, `NvmlPin`). device: its device.
        status: who pinned what, when. deadline: when the maximum lease ends it (monotonic).
        last_seen: the last message on its connection (monotonic). last_pid: the PID that sent it.
        idle_timeout_s: how long its connection may stay silent.
        measured: reads the GPU clock the hardware measures (None where the service cannot).
        emc: reads the memory clock for the client (None where the service cannot).
        keys: every clock domain the lease holds (the GPU's key first; the CPU's and EMC's where pinned).
        knobs: the CPU and memory clocks pinned (`Device.session` keywords).
        ended: why it ended ("" while it holds).
    """

    key: str
    pin: JetsonPin | NvmlPin
    device: ServiceDevice
    status: PinStatus
    deadline: float
    last_seen: float
    last_pid: int
    idle_timeout_s: float
    measured: Callable[[], float | None] | None = None
    emc: Callable[[], float | None] | None = None
    keys: list[str] = dataclasses.field(default_factory=list)
    knobs: dict[str, float] = dataclasses.field(default_factory=dict)
    guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    ended: str = ""

    def snapshot(self) -> PinStatus:
        now = time.monotonic()
        return dataclasses.replace(self.status, last_pid=self.last_pid, alive=pid_alive(self.last_pid),
                                   lease_left_s=self.deadline - now, idle_left_s=self.last_seen + self.idle_timeout_s - now)


@dataclasses.dataclass
class _Client:
    """One connection's state: who, its pin, when it last spoke, and the idle timeout it was told (a reload that
    shortens the timeout applies to later connections: a client renews at the period its pin's reply gave)."""

    peer: Peer
    last_seen: float
    idle_timeout_s: float
    lease: Lease | None = None


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
        config: where it listens, for whom, the maximum lease.
    """

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.gid = group_id(config.group)
        self.config_file = config.config_file or config_path()
        self.root_config = RootConfig()
        self._listener = Listener(config.socket_path, self.gid)
        self._leases: dict[str, Lease] = {}
        self._reserved: dict[str, PinStatus] = {}
        self._connections: dict[int, int] = {}  # uid -> open connections
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when a pin in progress ends
        self._in_progress = 0
        self._jetson: Any = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._reload_asked = False

    # lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Read the config, apply dead runs' journals, then bind the socket root:GROUP 0660 and listen.

        Raises:
            DvfsError: not root, the config or the socket's folder is not root's alone, or another service answers on
                the socket (a journal that cannot be applied is logged and kept instead: its device is refused).
        """
        if os.geteuid() != 0:
            raise DvfsError("the clock service writes clocks, so it runs as root (sudo dvfs-mlops clockd install runs it "
                            "under systemd)")
        self.root_config = load_root_config(self.config_file)
        from dvfs_mlops.hw import restore_journals

        try:
            restore_journals(announce=lambda m: log.info("clockd: on start: %s", m), nvml_module=self.config.nvml_module)
        except DvfsError as e:
            log.error("clockd: on start: %s; that device is refused until its journal is applied, every other is served", e)
        self._listener.open()
        if self.connections_total() < self.root_config.connections_total:
            log.warning("clockd: connections_total %d leaves too few of the %d file descriptors this process may open; "
                        "serving %d connections at most", self.root_config.connections_total,
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0], self.connections_total())
        from dvfs_mlops.hw.sysfs import sysfs_root

        log.info("clockd: listening on %s (group %s, gid %d, mode 0660); sysfs root %s; max lease %s; config: %s; %s",
                 self._listener.path, self.config.group, self.gid, sysfs_root(), duration(self.config.max_lease_s),
                 self.root_config.source, self.root_config.nvml.describe())

    def request_stop(self, signum: int) -> None:
        """Ask `serve_forever` to return (a signal handler's call: it never raises). A repeat is logged and ignored."""
        if self._stopping:
            log.warning("clockd: signal %d while stopping: ignored, every pin is still being restored", signum)
            return
        log.info("clockd: stopping (signal %d): no new pins; restoring every pin", signum)
        self._stopping = True
        self._wake()

    def request_reload(self) -> None:
        """Ask `serve_forever` to re-read the config file (SIGHUP's call); pins are kept."""
        self._reload_asked = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def reload(self) -> None:
        """Re-read the config file; one that cannot be read is logged and the one in force kept."""
        try:
            self.root_config = load_root_config(self.config_file)
        except DvfsError as e:
            log.error("clockd: reload: %s; keeping the config in force", e)
            return
        log.info("clockd: reloaded %s: %s; every pin kept", self.root_config.source, self.root_config.nvml.describe())

    def serve_forever(self) -> None:
        """Accept clients, one thread each, until `request_stop` (or `stop`)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener.fileno(), selectors.EVENT_READ, "accept")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            while not self._stopping:
                for key, _ in sel.select(timeout=1.0):
                    if key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 512)
                        if self._reload_asked:
                            self._reload_asked = False
                            self.reload()
                    elif not self._stopping:
                        try:
                            self._accept_one()
                        except OSError as e:  # whatever accept or a peer's credentials failed with: log, back off, go on
                            log.error("clockd: accepting a connection failed: %s", e)
                            time.sleep(0.1)

    def stop(self) -> None:
        """Stop listening, finish a pin in progress, restore every pin held, remove the socket file."""
        with self._lock:
            self._stopping = True
        self._listener.close()
        with self._lock:
            if not self._settled.wait_for(lambda: self._in_progress == 0, timeout=STOP_WAIT_S):
                log.error("clockd: a pin was still in progress after %.0f s; restoring what is held", STOP_WAIT_S)
        for lease in self._held_leases():
            with contextlib.suppress(DvfsError):  # logged by _end; the journal is kept for the next start
                self._end(lease, "the service stopped")
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # connections -----------------------------------------------------------------------------------
    def _accept_one(self) -> None:
        conn = self._listener.accept(self._refuse)
        if conn is None:
            return
        try:
            peer = peer_of(conn)
        except OSError:
            conn.close()
            return
        if not self._allowed(peer):
            log.warning("clockd: refused uid %d (%s) PID %d: not in group %s", peer.uid, peer.user, peer.pid, self.config.group)
            self._refuse(conn, DevicePermissionError(
                f"uid {peer.uid} ({peer.user}) is not in group {self.config.group!r}: ask an administrator to run "
                f"'sudo usermod -aG {self.config.group} {peer.user}' (then log in again), or run as root"))
            return
        over = self._count_in(peer)
        if over:
            log.warning("clockd: refused a connection of uid %d (%s) PID %d: %s", peer.uid, peer.user, peer.pid, over)
            self._refuse(conn, over)
            return
        try:
            threading.Thread(target=self._serve_client, args=(conn, peer), daemon=True, name="clockd-client").start()
        except RuntimeError as e:  # the system is out of threads: answer, back off, keep serving
            self._count_out(peer)
            log.error("clockd: cannot start a thread for uid %d PID %d (%s); refused it", peer.uid, peer.pid, e)
            self._refuse(conn, "the clock service cannot take another client now; retry in a moment")
            time.sleep(0.05)

    @staticmethod
    def _refuse(conn: socket.socket, why: str | DvfsError) -> None:
        """Answer a connection the service does not take in one line, then close it."""
        err = why if isinstance(why, DvfsError) else DvfsError(why)
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.sendall(Reply.failure(err).encode())
        with contextlib.suppress(OSError):
            conn.close()

    def _allowed(self, peer: Peer) -> bool:
        return peer.uid == 0 or peer.gid == self.gid or self.gid in peer.groups

    def connections_total(self) -> int:
        """The config's total, lowered to leave `FD_RESERVE` of this process's descriptors free (RLIMIT_NOFILE)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = soft - FD_RESERVE if soft != resource.RLIM_INFINITY else self.root_config.connections_total
        return max(1, min(self.root_config.connections_total, room))

    def _count_in(self, peer: Peer) -> str:
        """Count a new connection of `peer`, or say which limit it is over ('' where it fits; root is not counted)."""
        if peer.uid == 0:
            return ""
        limits = self.root_config
        with self._lock:
            mine, total = self._connections.get(peer.uid, 0), sum(self._connections.values())
            if mine >= limits.connections_per_uid:
                return (f"uid {peer.uid} ({peer.user}) already has {mine} connections open, the most the clock service "
                        "allows one user: close some sessions and retry")
            if total >= self.connections_total():
                return f"the clock service has {total} connections open, the most it allows: retry in a moment"
            self._connections[peer.uid] = mine + 1
        return ""

    def _count_out(self, peer: Peer) -> None:
        if peer.uid == 0:
            return
        with self._lock:
            left = self._connections.get(peer.uid, 0) - 1
            if left > 0:
                self._connections[peer.uid] = left
            else:
                self._connections.pop(peer.uid, None)

    def _serve_client(self, conn: socket.socket, peer: Peer) -> None:
        client = _Client(peer, time.monotonic(), self.root_config.idle_timeout_s)
        reader = LineReader(conn)
        why = "its client disconnected"
        try:
            while True:
                try:
                    got = reader.readline(self._wait_s(client))
                except TimeoutError:
                    if self._lease_ran_out(client):
                        continue  # the connection stays until its client hears why, or goes silent
                    why = f"its client sent nothing for {duration(client.idle_timeout_s)} (no renew)"
                    break
                if got is None:
                    break  # end of file: the client closed, exited or was killed
                line, sender = got
                self._heard(client, sender)
                try:
                    reply = self._do(Request.decode(line), client)
                except Exception as e:  # noqa: BLE001 - every error is a reply, the service goes on
                    reply = Reply.failure(e)
                conn.sendall(reply.encode())
        except DvfsError as e:  # a line too long
            with contextlib.suppress(OSError):
                conn.sendall(Reply.failure(e).encode())
        except OSError:
            pass  # ECONNRESET and the like: the client is gone
        finally:
            if client.lease is not None and not client.lease.ended:
                with contextlib.suppress(DvfsError):  # logged by _end; the journal is kept for the next start
                    self._end(client.lease, why)
            with contextlib.suppress(OSError):
                conn.close()
            self._count_out(peer)

    def _wait_s(self, client: _Client) -> float:
        """How long to wait for the next line: until the idle timeout, or the lease's end if sooner."""
        until = client.last_seen + client.idle_timeout_s
        lease = client.lease
        if lease is not None and not lease.ended:
            until = min(until, lease.deadline)
        return max(0.01, until - time.monotonic())

    def _lease_ran_out(self, client: _Client) -> bool:
        lease = client.lease
        if lease is None or lease.ended or time.monotonic() < lease.deadline:
            return False
        with contextlib.suppress(DvfsError):
            self._end(lease, f"its lease ran out (the service's maximum, {duration(self.config.max_lease_s)})")
        return True

    @staticmethod
    def _heard(client: _Client, sender: int | None) -> None:
        client.last_seen = time.monotonic()
        lease = client.lease
        if lease is not None and not lease.ended:
            lease.last_seen = client.last_seen
            lease.last_pid = sender or lease.last_pid

    # operations ------------------------------------------------------------------------------------
    def _do(self, req: Request, client: _Client) -> Reply:
        handlers: dict[str, Callable[[Request, _Client], Reply]] = {
            "status": self._status, "restore": self._restore, "table": self._table, "pin": self._pin_op,
            "renew": self._renew, "repin": self._repin, "clock": self._clock, "release": self._release}
        return handlers[req.op](req, client)

    def _held_leases(self) -> list[Lease]:
        """Every lease held, once each (a lease is filed under each of its domains' keys)."""
        seen: dict[int, Lease] = {}
        for lease in list(self._leases.values()):
            seen.setdefault(id(lease), lease)
        return list(seen.values())

    def _status(self, _req: Request, _client: _Client) -> Reply:
        idle = self.root_config.idle_timeout_s
        limits = (f"limits: max lease {duration(self.config.max_lease_s)}, idle timeout {duration(idle)}, "
                  f"{self.root_config.connections_per_uid} connections per user, {self.connections_total()} in "
                  f"all; config: {self.root_config.source}")
        return Reply(True, pins=[x.snapshot() for x in self._held_leases()],
                     scope=self.root_config.nvml.describe(), lines=[limits])

    def _held(self, client: _Client) -> Lease:
        lease = client.lease
        if lease is None:
            raise DvfsError("nothing pinned on this connection: pin first")
        if lease.ended:
            raise ClockLostError(f"the pin of {lease.key} at {lease.status.requested} ended: {lease.ended}")
        return lease

    def _renew(self, _req: Request, client: _Client) -> Reply:
        lease = self._held(client)
        return Reply(True, lease_left_s=lease.deadline - time.monotonic())

    def _clock(self, _req: Request, client: _Client) -> Reply:
        lease = self._held(client)
        return Reply(True, measured_mhz=lease.measured() if lease.measured is not None else None,
                     emc_mhz=lease.emc() if lease.emc is not None else None)

    @staticmethod
    def _knobs(req: Request, dev: ServiceDevice) -> dict[str, float]:
        """The CPU and memory clocks a request asks for, each a clock of the service's own table for it."""
        knobs: dict[str, float] = {}
        for knob, text in (("cpu_mhz", req.cpu_freq), ("emc_mhz", req.emc_freq)):
            if text:
                table = list(getattr(dev, "cpu_frequencies_mhz" if knob == "cpu_mhz" else "emc_frequencies_mhz", []))
                knobs[knob] = parse_knob(text, table, knob) if table else _refuse_knob(dev, knob)
        return knobs

    def _repin(self, req: Request, client: _Client) -> Reply:
        lease = self._held(client)
        mhz = parse_freq(req.freq, lease.device.frequencies_mhz)
        if mhz == MAXN:
            raise DvfsError("repin needs a clock of the table, not maxn")
        knobs = self._knobs(req, lease.device)
        context: dict[str, Any] = {}
        with lease.guard:
            if lease.ended:  # ended (released, restored, ran out) while this request waited: write nothing
                raise ClockLostError(f"the pin of {lease.key} ended: {lease.ended}")
            new_keys = [k for k in _domain_keys(lease.device, knobs) if k not in lease.keys]
            self._reserve_more(lease, new_keys)
            try:
                lease.pin.repin(float(mhz))
                if knobs:
                    context = lease.pin.repin_knobs(**knobs) or {}
            except BaseException:
                with self._lock:  # domains the pin did not take are free again
                    for k in new_keys:
                        if k not in getattr(lease.pin, "domain_keys", [k]) and self._leases.get(k) is lease:
                            del self._leases[k]
                            lease.keys.remove(k)
                raise
            lease.knobs.update(knobs)
            lease.status = dataclasses.replace(lease.status, requested=_label(float(mhz), lease.knobs))
        log.info("clockd: uid %d (%s) PID %d moved %s to %s", client.peer.uid, client.peer.user, lease.last_pid,
                 lease.key, lease.status.requested)
        return Reply(True, pinned_mhz=float(mhz), current_mhz=lease.device.current_mhz(), context=_plain(context))

    def _reserve_more(self, lease: Lease, keys: list[str]) -> None:
        """File `lease` under more domains (a repin that pins the CPU or memory clock the first time), or refuse one
        another client holds."""
        with self._lock:
            for k in keys:
                other = self._leases.get(k)
                owner = (other.status if other is not None else None) or self._reserved.get(k)
                if owner is not None:
                    raise DeviceBusyError(f"the clocks of {k} are in use by uid {owner.uid} ({owner.user}), PID "
                                          f"{other.last_pid if other is not None else owner.pid}, through the clock "
                                          "service; wait for it to finish, then retry")
            for k in keys:
                self._leases[k] = lease
                lease.keys.append(k)

    def _restore(self, _req: Request, client: _Client) -> Reply:
        lease = client.lease
        if lease is not None:
            if lease.ended:
                client.lease = None
                return Reply(True, lines=[f"the pin of {lease.key} had already ended: {lease.ended}"])
            self._end(lease, "its client asked")  # a failed restore keeps the ended lease: later operations hear why
            client.lease = None
            return Reply(True)
        lines: list[str] = []
        from dvfs_mlops.hw import restore_journals

        peer = client.peer
        try:
            restore_journals(announce=lines.append, nvml_module=self.config.nvml_module)
        finally:
            log.info("clockd: uid %d (%s) PID %d asked to restore journals: %s", peer.uid, peer.user, peer.pid, "; ".join(lines))
        return Reply(True, lines=lines)

    def _release(self, req: Request, client: _Client) -> Reply:
        peer = client.peer
        if peer.uid != 0:
            raise DevicePermissionError("only root releases another client's pin (sudo dvfs-mlops clockd release DEVICE)")
        lease = self._leases.get(req.device)
        if lease is None:
            raise unknown("pinned device", req.device, sorted({x.key for x in self._held_leases()}) or ["(none pinned)"])
        self._end(lease, f"root released it (PID {peer.pid})")
        said = (f"released {lease.key} (pinned at {lease.status.requested} by uid {lease.status.uid} ({lease.status.user}), "
                f"PID {lease.last_pid}): restored")
        return Reply(True, lines=[said])

    def _table(self, req: Request, _client: _Client) -> Reply:
        dev = self._device(req)
        try:
            emc_table = cast("JetsonDevice", dev).emc_table() if dev.name == "jetson" else None
            return Reply(True, frequencies_mhz=dev.frequencies_mhz, current_mhz=dev.current_mhz(),
                         cpu_frequencies_mhz=list(dev.cpu_frequencies_mhz), emc_frequencies_mhz=list(dev.emc_frequencies_mhz),
                         emc_table_source=emc_table.source if emc_table is not None else "")
        finally:
            self._close(dev)

    def _pin_op(self, req: Request, client: _Client) -> Reply:
        if client.lease is not None and not client.lease.ended:
            raise DvfsError(f"this connection already pins {client.lease.key}; repin to move it, restore to end it")
        lease, pinned, context = self._pin(req, client.peer, client.idle_timeout_s)
        client.lease = lease
        return Reply(True, pinned_mhz=pinned, current_mhz=lease.device.current_mhz(),
                     above_mode_cap=bool(context.get("above_mode_cap")), measured_clock=lease.measured is not None,
                     emc_clock=lease.emc is not None, context=_plain(context),
                     renew_every_s=client.idle_timeout_s / RENEWS_PER_TIMEOUT, idle_timeout_s=client.idle_timeout_s,
                     lease_left_s=lease.deadline - time.monotonic())

    def _pin(self, req: Request, peer: Peer, idle_timeout_s: float) -> tuple[Lease, float | None, dict[str, Any]]:
        dev = self._device(req)
        try:
            freq = parse_freq(req.freq, dev.frequencies_mhz)
            knobs = self._knobs(req, dev)
            if dev.name == "nvml" and (freq != MAXN or knobs):
                self._check_nvml_unlocked(dev)
            key = dev.device_key
            keys = [key, *_domain_keys(dev, knobs)]
            label = _label(None if freq == MAXN else float(freq), knobs)
            status = PinStatus(dev.name, key, label, peer.uid, peer.pid, peer.user, time.time())
            self._reserve(keys, status)
        except BaseException:
            self._close(dev)
            raise
        lease: Lease | None = None
        try:
            pin = self._pin_for(dev, peer)
            try:
                context = pin.pin(freq, **knobs)
            except BaseException:
                pin.restore()
                raise
            now = time.monotonic()
            lease = Lease(key, pin, dev, status, now + self.config.max_lease_s, now, peer.pid, idle_timeout_s,
                          self._measured_reader(dev), self._emc_reader(dev), list(keys), dict(knobs))
            with self._lock:
                stopping = self._stopping
                if not stopping:
                    for k in keys:
                        self._leases[k] = lease
            if stopping:  # stop() began while the clock was written: undo it here, stop() does not know this pin
                self._end(lease, "the service stopped while pinning")
                raise DvfsError("the clock service stopped while pinning; the clock is restored: retry when it is back")
        except BaseException:
            with self._lock:
                for k in keys:
                    self._reserved.pop(k, None)
                    if lease is None or self._leases.get(k) is lease:
                        self._leases.pop(k, None)
            if lease is not None and lease.emc is not None:
                _close_reader(lease.emc)
            self._close(dev)
            raise
        finally:
            with self._lock:
                for k in keys:
                    self._reserved.pop(k, None)
                self._in_progress -= 1
                self._settled.notify_all()
        log.info("clockd: uid %d (%s) PID %d pinned %s at %s", peer.uid, peer.user, peer.pid, key,
                 "maxn (nothing written)" if freq == MAXN and not knobs else
                 label + ("" if freq == MAXN else " MHz"))
        return lease, None if freq == MAXN else float(freq), context

    def _reserve(self, keys: list[str], status: PinStatus) -> None:
        """Reserve every domain a pin asks for, or refuse (one line naming who holds it) with none reserved."""
        with self._lock:
            if self._stopping:
                raise DvfsError("the clock service is stopping; retry when it is back")
            for key in keys:
                lease = self._leases.get(key)
                owner = (lease.status if lease is not None else None) or self._reserved.get(key)
                if owner is not None:
                    pid = lease.last_pid if lease is not None else owner.pid
                    raise DeviceBusyError(f"the clocks of {key} are in use by uid {owner.uid} ({owner.user}), PID "
                                          f"{pid}, through the clock service; wait for it to finish, then retry")
            for key in keys:
                self._reserved[key] = status
            self._in_progress += 1

    def _end(self, lease: Lease, why: str) -> None:
        """Restore `lease` once (its connection, root's release, a timeout and `stop` may all try); every later operation
        on it is refused with `why`. A failed restore is logged and raised, the journal kept."""
        with lease.guard:
            if lease.ended:
                return
            lease.ended = why
            try:
                lease.pin.restore()
                log.info("clockd: restored %s (pinned at %s for uid %d, PID %d): %s", lease.key, lease.status.requested,
                         lease.status.uid, lease.last_pid, why)
            except RestoreFailedError as e:
                lease.ended = f"{why}, and its restore failed: {e}"
                log.error("clockd: %s", e)
                raise
            finally:
                with self._lock:
                    for k in lease.keys or [lease.key]:
                        if self._leases.get(k) is lease:
                            del self._leases[k]
                if lease.emc is not None:
                    _close_reader(lease.emc)
                self._close(lease.device)

    # devices -------------------------------------------------------------------------------------
    def _device(self, req: Request) -> ServiceDevice:
        """The device a request is about, as the service finds it (never a path from the client)."""
        if req.backend == "jetson":
            from dvfs_mlops.hw.jetson import JetsonDevice

            if self._jetson is None:
                self._jetson = JetsonDevice()
            return self._jetson
        if req.backend == "nvml":
            return self._nvml_device(req.gpu_uuid)
        raise DvfsError("a request names its backend: jetson or nvml")

    def _nvml_device(self, uuid: str) -> NvmlDevice:
        from dvfs_mlops.hw.nvml import NvmlDevice

        scope = self.root_config.nvml
        if not uuid.startswith("GPU-"):
            raise DvfsError("an nvml request names its GPU by UUID (GPU-...)")
        allowed = "any GPU of this machine" if scope.gpus is None else (", ".join(scope.gpus) or "none")
        if not scope.allows(uuid):
            raise DevicePermissionError(f"GPU {uuid} is not one group {self.config.group} may lock through this clock "
                                        f"service; it may lock: {allowed} (the administrator's {self.config_file})")
        try:
            return NvmlDevice(nvml=self.config.nvml_module, uuid=uuid, assume_unlocked=scope.assume_unlocked)
        except DeviceNotFoundError:
            if scope.gpus is None:
                raise
            raise DeviceNotFoundError(f"GPU {uuid} is not on this machine now; group {self.config.group} may lock: "
                                      f"{allowed}") from None

    def _check_nvml_unlocked(self, dev: ServiceDevice) -> None:
        if not self.root_config.nvml.assume_unlocked:
            raise DevicePermissionError(
                f"the clock service's administrator has not said that nobody locks the clocks of GPU {dev.device_id} by "
                "hand (nvidia-smi -lgc), and a pin's restore would remove such a lock: ask them to set assume_unlocked = "
                f"yes under [nvml] in {self.config_file} (then systemctl reload dvfs-clockd), or meter only with --observe")

    @staticmethod
    def _measured_reader(dev: ServiceDevice) -> Callable[[], float | None] | None:
        """How the service reads the clock the GPU runs at: BPMP's GPC counters on a Jetson (debugfs, root only); NVML's
        graphics clock, itself a measurement."""
        if dev.name == "jetson":
            from dvfs_mlops.hw.jetson import gpc_clock_reader

            return gpc_clock_reader(cast("JetsonDevice", dev).root)
        return dev.current_mhz

    @staticmethod
    def _emc_reader(dev: ServiceDevice) -> Callable[[], float | None] | None:
        """How the service reads the memory clock for a client: BPMP's EMC rate (debugfs, held open) on a Jetson; NVML's
        memory clock where the GPU has a memory knob."""
        if dev.name == "jetson":
            from dvfs_mlops.hw.jetson import emc_reader

            return emc_reader(cast("JetsonDevice", dev).root)
        return cast("NvmlDevice", dev).memory_clock_mhz if dev.emc_frequencies_mhz else None

    @staticmethod
    def _pin_for(dev: ServiceDevice, peer: Peer) -> JetsonPin | NvmlPin:
        if dev.name == "jetson":
            from dvfs_mlops.hw.jetson import JetsonPin

            return JetsonPin(cast("JetsonDevice", dev), owner_pid=peer.pid, owner_uid=peer.uid)
        from dvfs_mlops.hw.nvml import NvmlPin

        return NvmlPin(cast("NvmlDevice", dev), owner_pid=peer.pid, owner_uid=peer.uid)

    @staticmethod
    def _close(dev: ServiceDevice | None) -> None:
        if dev is not None and dev.name == "nvml":
            cast("NvmlDevice", dev).close()


def _refuse_knob(dev: ServiceDevice, knob: str) -> float:
    """Refuse a knob the service's device has no table for, in the backend's own words."""
    reason = getattr(dev, "cpu_unavailable" if knob == "cpu_mhz" else "emc_unavailable", None)
    raise DvfsError(reason() if reason is not None else f"the {dev.name} backend cannot set that clock")


def _domain_keys(dev: ServiceDevice, knobs: dict[str, float]) -> list[str]:
    """The lock keys of the clock domains `knobs` pin besides the GPU's."""
    if dev.name == "jetson":
        from dvfs_mlops.hw import cpufreq, emc

        keys = {"cpu_mhz": cpufreq.DOMAIN_KEY, "emc_mhz": emc.DOMAIN_KEY}
        return [keys[k] for k in ("cpu_mhz", "emc_mhz") if k in knobs]
    return [cast("NvmlDevice", dev).memory_key] if "emc_mhz" in knobs else []


def _label(gpu_mhz: float | None, knobs: dict[str, float]) -> str:
    """What `status` shows a pin at: the GPU clock ("maxn" where none), then the CPU and EMC clocks pinned."""
    names = {"cpu_mhz": "CPU", "emc_mhz": "EMC"}
    return ("maxn" if gpu_mhz is None else f"{gpu_mhz:g}") + "".join(
        f", {names[k]} {knobs[k]:g}" for k in ("cpu_mhz", "emc_mhz") if k in knobs)


def _plain(context: dict[str, Any]) -> dict[str, Any]:
    """A pin's context as JSON keeps it (numbers, text and flags only)."""
    return {k: v for k, v in context.items() if isinstance(v, (str, int, float, bool))}


def _close_reader(reader: object) -> None:
    close = getattr(reader, "close", None)
    if close is not None:
        with contextlib.suppress(OSError):
            close()


def serve(config: ServiceConfig) -> None:
    """Run the service in the foreground until SIGTERM or SIGINT, then restore every pin and return; SIGHUP re-reads
    the config file and keeps every pin.

    Raises:
        DvfsError: it cannot start (not root, no such group, an unsafe folder or config, a service already on the socket).
    """
    service = ClockService(config)
    service.start()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            service.request_reload()
        else:
            service.request_stop(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        service.serve_forever()
    finally:
        service.stop()  # the handlers stay: a repeat signal is logged and ignored, never cuts a restore short
        for s, h in previous.items():
            signal.signal(s, h)
