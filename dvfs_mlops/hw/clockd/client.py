"""The clock service's client side: one connection per session, the pin living as long as the connection.

`route_pin` decides who writes a session's clock, before anything is touched: root writes itself (the backend's own
pin); anyone else goes through the service where its socket exists ($DVFS_CLOCKD_SOCKET, else the default); with no
service, a user who cannot write the clock gets one line naming both ways out.
"""
from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.clocks import freq_label
from dvfs_mlops.errors import DevicePermissionError, DvfsError, RestoreFailedError
from dvfs_mlops.hw.clockd.protocol import MAX_LINE, Reply, Request, group_name, user_name

INSTALL_HINT = "install the clock service once (sudo dvfs-mlops clockd install)"


def _group_of(path: Path) -> str:
    try:
        gid = os.stat(path).st_gid
    except OSError:
        return "dvfs"
    return group_name(gid)


def _me() -> str:
    return user_name(os.geteuid())


class ClockdClient:
    """One connection to the service; `request` sends a `Request` and waits for its `Reply`.

    Args:
        path: the service's socket.
        timeout: seconds to wait for a reply (a clock write takes milliseconds).

    Raises:
        DevicePermissionError: the kernel or the service refused this user (not in the socket's group).
        DvfsError: no service answers at `path`.
    """

    def __init__(self, path: Path, timeout: float = 30.0):
        self.path = Path(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(self.path))
        except PermissionError:
            self._sock.close()
            raise DevicePermissionError(refused(self.path)) from None
        except OSError as e:
            self._sock.close()
            raise DvfsError(f"the clock service at {self.path} does not answer ({e.strerror or e}): start it "
                            "(sudo systemctl start dvfs-clockd, or sudo dvfs-mlops clockd install), or run as root") from None
        self._reader = self._sock.makefile("rb")

    def request(self, req: Request) -> Reply:
        """Send `req`, return the service's reply (errors are in the reply; `Reply.raise_for_error` raises them).

        Raises:
            DvfsError: the connection broke (the service stopped).
        """
        broken: OSError | None = None
        try:
            self._sock.sendall(req.encode())
        except OSError as e:
            broken = e  # a service that refused this user answered and closed before reading: its line is still there
        line = b""
        with contextlib.suppress(OSError):
            line = self._reader.readline(MAX_LINE * 64)
        if not line:
            why = f" ({broken.strerror or broken})" if broken is not None else ""
            raise DvfsError(f"the clock service at {self.path} closed the connection{why}")
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


def no_service(path: Path) -> str:
    """The one line for a user who cannot write the clock and has no service to ask."""
    return (f"changing the GPU clock needs root, and no clock service listens at {path}: {INSTALL_HINT}, or run this "
            "command as root; --observe meters without changing the clock")


class ServicePin:
    """A pin the clock service holds for this process for as long as the connection lives.

    Same calls as a backend's own pin (`JetsonPin`, `NvmlPin`): `pin`, `repin`, `restore`, `held`. Should this process
    die, the service sees the connection close and restores at once.

    Args:
        backend: "jetson" or "nvml".
        path: the service's socket.
        gpu_uuid: nvml: the GPU's UUID.
        assume_unlocked: nvml: the caller vouches nobody locked the clocks.
    """

    def __init__(self, backend: str, path: Path, gpu_uuid: str = "", assume_unlocked: bool = False):
        self.backend = backend
        self.path = Path(path)
        self.gpu_uuid = gpu_uuid
        self.assume_unlocked = assume_unlocked
        self._client: ClockdClient | None = None
        self.pinned_mhz: float | None = None

    @property
    def held(self) -> bool:
        return self._client is not None

    def _ask(self, op: str, freq: str = "") -> Reply:
        assert self._client is not None
        return self._client.request(Request(op, self.backend, self.gpu_uuid, freq, self.assume_unlocked)).raise_for_error()

    def pin(self, freq: Any) -> dict[str, Any]:
        """Connect and ask the service to pin `freq` (a clock of the table, or "maxn").

        Returns:
            What the session logs besides energy, as a pin written directly says it: {"above_mode_cap": True} where
            the service found the clock above the nvpmodel mode's GPU cap, else {}.

        Raises:
            DeviceBusyError: another client or process holds the GPU (the line names its uid and PID).
            DevicePermissionError: this user is not in the service's group. DvfsError: the service cannot pin.
        """
        self._client = ClockdClient(self.path)
        try:
            reply = self._ask("pin", freq_label(freq))
        except BaseException:
            self._client.close()
            self._client = None
            raise
        self.pinned_mhz = reply.pinned_mhz
        return {"above_mode_cap": True} if reply.above_mode_cap else {}

    def repin(self, mhz: float) -> None:
        """Ask the service to move the pin to `mhz` (the service's journal keeps the settings found first)."""
        self.pinned_mhz = self._ask("repin", freq_label(mhz)).pinned_mhz

    def restore(self) -> None:
        """Ask for the restore and wait for its acknowledgement, then close the connection.

        Raises:
            RestoreFailedError: the service could not restore (its journal is kept), or went away before answering
                (it restores what it journalled when it starts again).
        """
        if self._client is None:
            return
        client, self._client = self._client, None
        try:
            self._ask_on(client)
        finally:
            client.close()

    def _ask_on(self, client: ClockdClient) -> None:
        try:
            reply = client.request(Request("restore", self.backend, self.gpu_uuid))
        except DvfsError as e:
            raise RestoreFailedError(f"{e} before acknowledging the restore; it restores from its journal when it "
                                     "starts again (sudo systemctl restart dvfs-clockd)") from None
        reply.raise_for_error()


def service_socket() -> Path | None:
    """The service's socket where one exists ($DVFS_CLOCKD_SOCKET, else the default), None otherwise."""
    path = settings.clockd_socket()
    return path if path.exists() else None


def use_service() -> Path | None:
    """The socket to go through: None for root (it writes itself) or where no service runs."""
    return None if os.geteuid() == 0 else service_socket()


def route_pin(backend: str, local: Callable[[], Any], writable: Callable[[], bool] | None = None, gpu_uuid: str = "",
              assume_unlocked: bool = False) -> Any:
    """Who pins a session's clock: root itself; others the clock service; refused in one line when neither can.

    Args:
        backend: "jetson" or "nvml".
        local: makes the backend's own pin (`JetsonPin`, `NvmlPin`).
        writable: whether this process may write the clock itself without root (a udev rule, a fake tree); None: it
            may not (NVML's clock locks need root).
        gpu_uuid: nvml: the GPU's UUID, for the service.
        assume_unlocked: nvml: passed on to the service.

    Returns:
        A pin with `pin`, `repin`, `restore` and `held`, nothing written yet.

    Raises:
        DevicePermissionError: not root, no service, and the clock is not writable (the line names both ways out).
    """
    if os.geteuid() == 0:
        return local()
    path = service_socket()
    if path is not None:
        return ServicePin(backend, path, gpu_uuid, assume_unlocked)
    if writable is not None and writable():
        return local()
    raise DevicePermissionError(no_service(settings.clockd_socket()))


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
