"""The clock service's wire format: one JSON object per line each way, over an AF_UNIX stream socket.

A client sends a `Request`, the service answers one `Reply`. The operations are the only things a client can ask:
the clock table, the status, pin a clock of the table (or "maxn"), move the pin, restore. A request names no path
and no raw value: a clock is a label of the device's own table, and the device is the service's choice (the
devfreq node it found; for NVML, the GPU whose UUID it enumerates itself).
"""
from __future__ import annotations

import dataclasses
import grp
import json
import pwd
from typing import Any

from dvfs_mlops.errors import DeviceBusyError, DevicePermissionError, DvfsError, RestoreFailedError, UnknownNameError

OPS = ("table", "status", "pin", "repin", "restore")
BACKENDS = ("jetson", "nvml")
MAX_LINE = 4096  # a request is a few dozen bytes; anything longer is refused

# The error class a reply's `error_kind` stands for, so a client raises what a local session would have raised.
ERROR_KINDS: dict[str, type[DvfsError]] = {
    "busy": DeviceBusyError,
    "permission": DevicePermissionError,
    "restore_failed": RestoreFailedError,
    "unknown": UnknownNameError,
    "error": DvfsError,
}


@dataclasses.dataclass(frozen=True)
class Request:
    """One request.

    Attributes:
        op: one of `OPS`.
        backend: "jetson" or "nvml" (table, pin).
        gpu_uuid: nvml: the GPU's UUID, matched against the GPUs the service enumerates itself.
        freq: pin, repin: a clock of the table in MHz as text, or "maxn" (pin only).
        assume_unlocked: nvml pin: the client vouches that nobody locked the clocks (`NvmlDevice.assume_unlocked`).
    """

    op: str
    backend: str = ""
    gpu_uuid: str = ""
    freq: str = ""
    assume_unlocked: bool = False

    def encode(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, line: bytes) -> Request:
        """Parse one line.

        Raises:
            DvfsError: not a JSON object of known keys and types, or an unknown op or backend.
        """
        data = _object(line)
        known = {f.name: f for f in dataclasses.fields(cls)}
        if set(data) - set(known) or "op" not in data:
            raise DvfsError(f"a request holds op and {', '.join(k for k in known if k != 'op')} only")
        req = cls(**data)
        if req.op not in OPS or (req.backend and req.backend not in BACKENDS):
            raise DvfsError(f"unknown op {req.op!r} or backend {req.backend!r}; ops: {', '.join(OPS)}")
        if not all(isinstance(getattr(req, k), str) for k in ("op", "backend", "gpu_uuid", "freq")) or \
                not isinstance(req.assume_unlocked, bool):
            raise DvfsError("a request's fields are strings, and assume_unlocked a boolean")
        return req


@dataclasses.dataclass(frozen=True)
class PinStatus:
    """One GPU the service holds for a client: which, at what clock, for whom."""

    backend: str
    device_key: str
    requested: str
    uid: int
    pid: int
    user: str
    since: float

    def line(self) -> str:
        return f"{self.device_key} ({self.backend}) pinned at {self.requested} by uid {self.uid} ({self.user}), PID {self.pid}"


@dataclasses.dataclass(frozen=True)
class Reply:
    """The service's answer.

    Attributes:
        ok: the request was done.
        error: the one-line reason when not.
        error_kind: which `ERROR_KINDS` class the error is.
        frequencies_mhz: table: the device's clock table.
        pinned_mhz: pin, repin: the clock pinned (None for maxn).
        current_mhz: table, pin, repin, status: the clock the device reports now, read by the service.
        pins: status: every GPU held, with its owner.
        lines: restore without a pin: what the service restored from journals of dead runs.
        above_mode_cap: pin: the clock is above the GPU cap of the board's nvpmodel mode (the board may not hold it;
            the client's run records it as a pin written directly would).
    """

    ok: bool
    error: str = ""
    error_kind: str = ""
    frequencies_mhz: list[float] = dataclasses.field(default_factory=list)
    pinned_mhz: float | None = None
    current_mhz: float | None = None
    pins: list[PinStatus] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)
    above_mode_cap: bool = False

    @classmethod
    def failure(cls, err: BaseException) -> Reply:
        """The reply for an error: a DvfsError's own class and line; anything else as a plain error."""
        kind = next((k for k, c in ERROR_KINDS.items() if type(err) is c), "error")
        text = " ".join(str(err).split()) or type(err).__name__
        return cls(False, text, kind)

    def encode(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, line: bytes) -> Reply:
        data = _object(line)
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["pins"] = [PinStatus(**p) for p in data.get("pins", [])]
        return cls(**data)

    def raise_for_error(self) -> Reply:
        """This reply, or the error it carries raised as its class."""
        if not self.ok:
            raise ERROR_KINDS.get(self.error_kind, DvfsError)(f"clock service: {self.error}")
        return self


def _object(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise DvfsError(f"a line is at most {MAX_LINE} bytes")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise DvfsError("not a JSON line") from None
    if not isinstance(data, dict):
        raise DvfsError("not a JSON object")
    return data


def user_name(uid: int) -> str:
    """The user's name, or the number where the system has no name for it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The group's name, or the number where the system has no name for it."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
