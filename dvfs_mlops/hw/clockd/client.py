"""The clock service's client side: one connection per session, the pin renewed while the session runs.

`route_pin` decides who writes a session's clock, before anything is touched: root writes itself (the backend's own
pin); anyone else goes through the service where its socket exists ($DVFS_CLOCKD_SOCKET, else the default); with no
service, a user who cannot write the clock gets one line naming both ways out (the lock and journal folders are root's,
so a user whom a udev rule lets write the clock files cannot pin them directly either).

While a pin holds, a thread renews its lease every few seconds (the service restores a pin whose client goes silent).
A renew that finds the connection gone (the service stopped, crashed or restarted) marks the moment the clock was last
known held and pins the same clock again through the service as soon as it answers; the gap is kept
(`ServicePin.lost_windows`) so the session judges every window it touches as not held. Where the pin cannot be taken
again (the service stays away, someone else holds the GPU now) or root released it or its maximum lease ran out, the
pin fails for good (`ServicePin.failure`): the session raises that `ClockLostError` at its next step, and no run is
labelled with a clock it did not run at.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.clocks import FreqRequest, freq_label
from dvfs_mlops.errors import ClockLostError, ClockServiceGoneError, DevicePermissionError, DvfsError, RestoreFailedError
from dvfs_mlops.hw.clockd.protocol import FINAL_KINDS, MAX_LINE, Reply, Request, group_name, user_name

log = logging.getLogger(__name__)

INSTALL_HINT = "install the clock service once (sudo dvfs-mlops clockd install)"
REPIN_WITHIN_S = 30.0  # how long a client waits for a restarted service (systemd restarts it after 1 s)
REPIN_POLL_S = 0.25


def _group_of(path: Path) -> str:
    try:
        gid = os.stat(path).st_gid
    except OSError:
        return "dvfs"
    return group_name(gid)


def _me() -> str:
    return user_name(os.geteuid())


class ClockdClient:
    """One connection to the service; `request` sends a `Request` and waits for its `Reply` (one at a time: the
    session's threads share it).

    Args:
        path: the service's socket.
        timeout: seconds to wait for a reply (a clock write takes milliseconds).

    Raises:
        DevicePermissionError: the kernel or the service refused this user (not in the socket's group).
        ClockServiceGoneError: no service answers at `path`.
    """

    def __init__(self, path: Path, timeout: float = 30.0):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(self.path))
        except PermissionError:
            self._sock.close()
            raise DevicePermissionError(refused(self.path)) from None
        except OSError as e:
            self._sock.close()
            raise ClockServiceGoneError(f"the clock service at {self.path} does not answer ({e.strerror or e}): start it "
                            "(sudo systemctl start dvfs-clockd, or sudo dvfs-mlops clockd install), or run as root") from None
        self._reader = self._sock.makefile("rb")

    def request(self, req: Request) -> Reply:
        """Send `req`, return the service's reply (errors are in the reply; `Reply.raise_for_error` raises them).

        Raises:
            ClockServiceGoneError: the connection broke (the service stopped).
        """
        with self._lock:
            broken: OSError | None = None
            try:
                self._sock.sendall(req.encode())
            except OSError as e:
                broken = e  # a service that refused this connection answered and closed before reading: its line is there
            line = b""
            with contextlib.suppress(OSError, ValueError):
                line = self._reader.readline(MAX_LINE * 64)
        if not line:
            why = f" ({broken.strerror or broken})" if broken is not None else ""
            raise ClockServiceGoneError(f"the clock service at {self.path} closed the connection{why}")
        return Reply.decode(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._reader.close()
        with contextlib.suppress(OSError):
            self._sock.close()


def refused(path: Path) -> str:
    """The one line for a user the service does not serve: join its group, or run as root."""
    group = _group_of(path)
    return (f"the clock service at {path} serves group {group!r} only, and {_me()} is not in it: ask an administrator to "
            f"run 'sudo usermod -aG {group} {_me()}' (then log in again), or run as root")


def no_service(path: Path, what: str = "the GPU clock") -> str:
    """The one line for a user who cannot write the clock (`what`: the clocks asked for) and has no service to ask."""
    return (f"changing {what} needs root, and no clock service listens at {path}: {INSTALL_HINT}, or run this "
            "command as root; --observe meters without changing the clock")


class ServicePin:
    """A pin the clock service holds for this process while the connection lives and this process renews it.

    Same calls as a backend's own pin (`JetsonPin`, `NvmlPin`): `pin`, `repin`, `repin_knobs`, `restore`, `held`; and
    what only a pin through the service has: `check` (raise if the clock was lost for good), `lost_windows` (when it was
    not held), `measured_clock_reader` and `emc_reader` (the GPU clock and the memory clock the service reads as root).
    Should this process die, the service sees the connection close and restores every domain at once.

    Args:
        backend: "jetson" or "nvml".
        path: the service's socket.
        gpu_uuid: nvml: the GPU's UUID.
    """

    def __init__(self, backend: str, path: Path, gpu_uuid: str = ""):
        self.backend = backend
        self.path = Path(path)
        self.gpu_uuid = gpu_uuid
        self._client: ClockdClient | None = None
        self._generation = 0  # which connection `_client` is: a recovery replaces it once, however many noticed
        self._recovering = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._freq = ""
        self._knobs: dict[str, str] = {}  # the request's cpu_freq / emc_freq, re-sent when the pin is taken again
        self._renew_every_s = 5.0
        self._measured = False
        self._emc = False
        self._clocks: Reply | None = None  # the last `clock` reply, shared by the GPU and EMC readers of one sample
        self._clocks_used: set[str] = set()
        self._last_held = 0.0  # monotonic: the last moment the service said the pin holds
        self.pinned_mhz: float | None = None
        self.lost_windows: list[tuple[float, float | None]] = []  # monotonic (from, to); to None: never held again
        self.failure: ClockLostError | None = None

    @property
    def held(self) -> bool:
        return self._client is not None and self.failure is None

    def _ask_on(self, client: ClockdClient, op: str, freq: str = "", knobs: dict[str, str] | None = None) -> Reply:
        knobs = knobs or {}
        return client.request(Request(op, self.backend, self.gpu_uuid, freq, cpu_freq=knobs.get("cpu_mhz", ""),
                                      emc_freq=knobs.get("emc_mhz", ""))).raise_for_error()

    def pin(self, freq: FreqRequest, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Connect, ask the service to pin `freq` (a clock of the table, or "maxn") and the CPU and memory clocks where
        given, and start renewing it.

        Returns:
            What the session logs besides energy, as a pin written directly says it: {"above_mode_cap": True} where
            the service found a clock above the nvpmodel mode's cap, and what the pin observed (`Reply.context`).

        Raises:
            DeviceBusyError: another client or process holds a domain (the line names its uid and PID).
            DevicePermissionError: this user is not in the service's group. DvfsError: the service cannot pin.
        """
        self._freq = freq_label(freq)
        self._knobs = {k: f"{v:g}" for k, v in (("cpu_mhz", cpu_mhz), ("emc_mhz", emc_mhz)) if v is not None}
        client = ClockdClient(self.path)
        try:
            reply = self._ask_on(client, "pin", self._freq, self._knobs)
        except ClockServiceGoneError as e:
            client.close()
            raise ClockServiceGoneError(f"{e} before answering the pin; a restarted service restores what it wrote from its "
                                        "journal") from None
        except BaseException:
            client.close()
            raise
        self._take(client, reply)
        self._renew_every_s = reply.renew_every_s or self._renew_every_s
        self._measured = reply.measured_clock
        self._emc = reply.emc_clock
        self._beat = threading.Thread(target=self._renew_loop, daemon=True, name="clockd-renew")
        self._beat.start()
        return {**reply.context, **({"above_mode_cap": True} if reply.above_mode_cap else {})}

    def _take(self, client: ClockdClient, reply: Reply) -> None:
        old, self._client = self._client, client
        self._generation += 1
        self.pinned_mhz = reply.pinned_mhz
        self._last_held = time.monotonic()
        if old is not None:
            old.close()

    def repin(self, mhz: float) -> None:
        """Ask the service to move the pin to `mhz` (its journal keeps the settings found first); where the connection is
        gone, the pin is taken again at `mhz`.

        Raises:
            ClockLostError: the pin was lost for good. DvfsError: the service refused the clock.
        """
        self._freq = freq_label(mhz)
        self._move()

    def repin_knobs(self, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Ask the service to move the CPU and memory clocks (None: as they are) with the GPU clock pinned now; a domain
        not pinned before is locked and journalled by the service first.

        Returns:
            What the pin observed (`Reply.context`).

        Raises:
            ClockLostError: the pin was lost for good. DvfsError: the service refused a clock.
        """
        self._knobs.update({k: f"{v:g}" for k, v in (("cpu_mhz", cpu_mhz), ("emc_mhz", emc_mhz)) if v is not None})
        reply = self._move()
        return dict(reply.context) if reply is not None else {}

    def _move(self) -> Reply | None:
        """A repin of everything this pin holds now; where the connection is gone, the pin is taken again with it."""
        self.check()
        client, generation = self._client, self._generation
        assert client is not None
        reply = None
        try:
            reply = self._ask_on(client, "repin", self._freq, self._knobs)
            self.pinned_mhz = reply.pinned_mhz
        except ClockLostError as e:
            self._fail(str(e))
            raise self.failure from None  # type: ignore[misc]
        except ClockServiceGoneError as e:
            if not self._recover(str(e), generation):
                raise self.failure from None  # type: ignore[misc]
        self._last_held = time.monotonic()
        return reply

    def restore(self) -> None:
        """Stop renewing, ask for the restore and wait for its acknowledgement, then close the connection (nothing to ask
        where the pin was lost for good: the service restored it when it ended).

        Raises:
            RestoreFailedError: the service could not restore (its journal is kept), or went away before answering
                (it restores what it journalled when it starts again).
        """
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=REPIN_WITHIN_S + 5)
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self.failure is None:
                self._restore_on(client)
        finally:
            client.close()

    def _restore_on(self, client: ClockdClient) -> None:
        try:
            reply = client.request(Request("restore", self.backend, self.gpu_uuid))
        except DvfsError as e:
            raise RestoreFailedError(f"{e} before acknowledging the restore; it restores from its journal when it "
                                     "starts again (sudo systemctl restart dvfs-clockd)") from None
        reply.raise_for_error()

    # while it holds --------------------------------------------------------------------------------------------------
    def confirm(self, recover: bool = True) -> None:
        """Ask the service now whether the pin still holds (a renew, as the renew thread sends), so a window that ends
        here is judged on what the service says at its end, not at the last periodic renew.

        Args:
            recover: where the connection is gone, pin the clock again (a window in the middle of a job); False: mark it
                lost for good (the session is ending).
        """
        client, generation = self._client, self._generation
        if client is None or self.failure is not None:
            return
        try:
            self._ask_on(client, "renew")
            self._last_held = time.monotonic()
        except ClockLostError as e:
            self._fail(str(e))
        except ClockServiceGoneError as e:
            if recover:
                self._recover(str(e), generation)
            else:
                self._fail(f"the clock service went away ({' '.join(str(e).split())})")

    def check(self) -> None:
        """Raise the `ClockLostError` of a pin lost for good (nothing where it holds, or was taken again)."""
        if self.failure is not None:
            raise self.failure

    def _clock_reply(self, reader: str) -> Reply | None:
        """The service's `clock` answer for one sample: one request serves the GPU and the EMC reader of the same sample
        (a reader that asks again first sends a new request)."""
        client = self._client
        if client is None or self.failure is not None:
            return None
        if self._clocks is None or reader in self._clocks_used:
            try:
                reply = client.request(Request("clock"))
            except DvfsError:
                return None  # the renew thread finds the lost connection and deals with it
            self._clocks, self._clocks_used = (reply if reply.ok else None), set()
        self._clocks_used.add(reader)
        return self._clocks

    def measured_clock_reader(self) -> Callable[[], float | None] | None:
        """A reader of the GPU clock the service measures (BPMP's counters on a Jetson, read as root), None where the
        service cannot measure it on this device. The reader answers None while the pin is lost."""
        if not self._measured:
            return None

        def read() -> float | None:
            reply = self._clock_reply("gpu")
            return reply.measured_mhz if reply is not None else None

        return read

    def emc_reader(self) -> Callable[[], float | None] | None:
        """A reader of the memory clock the service reads (BPMP's EMC rate on a Jetson: debugfs, root only), None where
        the service cannot read it on this device. The reader answers None while the pin is lost."""
        if not self._emc:
            return None

        def read() -> float | None:
            reply = self._clock_reply("emc")
            return reply.emc_mhz if reply is not None else None

        return read

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_every_s):
            client, generation = self._client, self._generation
            if client is None:
                return
            try:
                self._ask_on(client, "renew")
                self._last_held = time.monotonic()
            except ClockLostError as e:  # root released it, or its lease ran out: never pinned again from here
                self._fail(str(e))
                return
            except ClockServiceGoneError as e:
                if not self._recover(str(e), generation):
                    return
            except DvfsError as e:  # any other refusal of a renew: the service no longer holds it for us
                self._fail(str(e))
                return

    def _recover(self, reason: str, generation: int) -> bool:
        """Pin the clock again through the service after connection `generation` broke; False: lost for good."""
        with self._recovering:
            if self._generation != generation or self.failure is not None:
                return self.failure is None  # another thread already took it again (or gave up)
            lost_at = self._last_held
            log.warning("the clock service stopped holding %s (%s): pinning it again through the service", self._freq,
                        " ".join(reason.split()))
            deadline = time.monotonic() + REPIN_WITHIN_S
            last = reason
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    client = ClockdClient(self.path)
                except DevicePermissionError as e:
                    last = str(e)
                    break
                except ClockServiceGoneError as e:
                    last = str(e)
                    self._stop.wait(REPIN_POLL_S)
                    continue
                try:
                    reply = client.request(Request("pin", self.backend, self.gpu_uuid, self._freq,
                                                   cpu_freq=self._knobs.get("cpu_mhz", ""), emc_freq=self._knobs.get("emc_mhz", "")))
                except ClockServiceGoneError as e:
                    reply = Reply(False, str(e), "error")
                if reply.ok:
                    self._take(client, reply)
                    self.lost_windows.append((lost_at, self._last_held))
                    log.warning("pinned %s again through the clock service after %.1f s", self._freq, self._last_held - lost_at)
                    return True
                client.close()
                last = reply.error
                if reply.error_kind in FINAL_KINDS:
                    break
                self._stop.wait(REPIN_POLL_S)
            if self._stop.is_set():  # the session is ending: the gap stays marked, its restore finds the service gone
                self.lost_windows.append((lost_at, None))
                return True
            self._fail(f"the clock service stopped holding it ({' '.join(reason.split())}) and it could not be pinned "
                       f"again within {REPIN_WITHIN_S:.0f} s: {' '.join(last.split())}")
            return False

    def _fail(self, why: str) -> None:
        """The pin is lost for good: from the last moment it was known held on, the clock is not this run's."""
        if self.failure is None:
            self.lost_windows.append((self._last_held, None))
            since = time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - self._last_held)))
            self.failure = ClockLostError(f"the GPU clock {self._freq} MHz was not held from {since} on: {why}; this run "
                                          "is not a measurement at that clock")
            log.error("%s", self.failure)
        client, self._client = self._client, None
        if client is not None:
            client.close()


def service_socket() -> Path | None:
    """The service's socket where one exists ($DVFS_CLOCKD_SOCKET, else the default), None otherwise."""
    path = settings.clockd_socket()
    return path if path.exists() else None


def use_service() -> Path | None:
    """The socket to go through: None for root (it writes itself) or where no service runs."""
    return None if os.geteuid() == 0 else service_socket()


def route_pin(backend: str, local: Callable[[], Any], writable: Callable[[], bool] | None = None, gpu_uuid: str = "",
              what: str = "the GPU clock") -> Any:
    """Who pins a session's clocks: root itself; others the clock service; refused in one line when neither can.

    Args:
        backend: "jetson" or "nvml".
        local: makes the backend's own pin (`JetsonPin`, `NvmlPin`).
        writable: whether this process may write the clocks itself without root (a udev rule, a fake tree); None: it
            may not (NVML's clock locks need root). Such a writer still needs the state folders' lock and journal,
            which only their owner reaches (`guard.open_private_dir`): root's on a real machine.
        gpu_uuid: nvml: the GPU's UUID, for the service.
        what: the clocks the session pins, for the refusal's line ("the GPU clock and the CPU clock").

    Returns:
        A pin with `pin`, `repin`, `repin_knobs`, `restore` and `held`, nothing written yet.

    Raises:
        DevicePermissionError: not root, no service, and the clocks are not writable (the line names both ways out).
    """
    if os.geteuid() == 0:
        return local()
    path = service_socket()
    if path is not None:
        return ServicePin(backend, path, gpu_uuid)
    if writable is not None and writable():
        return local()
    raise DevicePermissionError(no_service(settings.clockd_socket(), what))


def service_emc_table(backend: str = "jetson", gpu_uuid: str = "") -> list[float]:
    """The memory clocks the clock service can pin on this device ([] for root, where no service runs, or where it
    cannot say): what a member whose debugfs is closed to it may ask for.

    Args:
        backend: "jetson" or "nvml".
        gpu_uuid: nvml: the GPU's UUID.
    """
    path = use_service()
    if path is None:
        return []
    try:
        client = ClockdClient(path, timeout=10.0)
    except DvfsError:
        return []
    try:
        reply = client.request(Request("table", backend, gpu_uuid))
    except DvfsError:
        return []
    finally:
        client.close()
    return list(reply.emc_frequencies_mhz) if reply.ok else []


def restore_through_service(path: Path, announce: Callable[[str], None]) -> int:
    """`dvfs-mlops restore` for a user other than root: the service applies the journals of dead runs it keeps.

    Args:
        path: the service's socket.
        announce: called with each line the service returns.

    Returns:
        How many journals it restored.

    Raises:
        RestoreFailedError: a restore failed (the service keeps that journal). DevicePermissionError: not in its group.
    """
    client = ClockdClient(path)
    try:
        reply = client.request(Request("restore")).raise_for_error()
    finally:
        client.close()
    for line in reply.lines:
        announce(line)
    return sum(1 for line in reply.lines if line.startswith("restored "))
