"""The clock service's wire format: one JSON object per line each way, over an AF_UNIX stream socket.

A client sends a `Request`, the service answers one `Reply`. The operations are the only things a client can ask:
the clock tables, the status, pin a clock of the table (or "maxn") with the CPU and memory clocks where asked, renew
the pin's lease, move the pin, read the clocks the client cannot (the measured GPU clock, the EMC rate), restore; root
alone may release another client's pin. A request names no path and no raw value: a clock is a label of the device's
own table for that knob, and the device is the service's choice (the devfreq node, cpufreq policies and BPMP clock it
found; for NVML, a GPU of its administrator's list whose UUID it enumerates itself). Whether an NVML GPU may be assumed
unlocked is the administrator's word in the service's config, never the client's.
"""
from __future__ import annotations

import dataclasses
import grp
import json
import pwd
import time
from typing import Any

from dvfs_mlops.errors import (
    ClockLostError,
    DeviceBusyError,
    DevicePermissionError,
    DvfsError,
    RestoreFailedError,
    UnknownNameError,
)

OPS = ("table", "status", "pin", "renew", "repin", "clock", "restore", "release")
BACKENDS = ("jetson", "nvml")
MAX_LINE = 4096  # a request is a few dozen bytes; anything longer is refused

# The error class a reply's `error_kind` stands for, so a client raises what a local session would have raised.
ERROR_KINDS: dict[str, type[DvfsError]] = {
    "busy": DeviceBusyError,
    "permission": DevicePermissionError,
    "restore_failed": RestoreFailedError,
    "unknown": UnknownNameError,
    "lease_ended": ClockLostError,
    "error": DvfsError,
}
# Kinds that say the service answered and will not pin this (a client stops trying again); others may pass.
FINAL_KINDS = ("busy", "permission", "unknown", "lease_ended")


@dataclasses.dataclass(frozen=True)
class Request:
    """One request.

    Attributes:
        op: one of `OPS`.
        backend: "jetson" or "nvml" (table, pin).
        gpu_uuid: nvml: the GPU's UUID, matched against the GPUs the service enumerates itself.
        freq: pin, repin: a clock of the table in MHz as text, or "maxn" (pin only).
        device: release: the device key whose pin root releases (as `status` names it).
        cpu_freq: pin, repin: a CPU clock of the service's own CPU table in MHz as text ("": leave the CPU clock alone).
        emc_freq: pin, repin: a memory clock of the service's own table (Jetson EMC, NVML memory) ("": leave it alone).
    """

    op: str
    backend: str = ""
    gpu_uuid: str = ""
    freq: str = ""
    device: str = ""
    cpu_freq: str = ""
    emc_freq: str = ""

    def encode(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, line: bytes) -> Request:
        """Parse one line.

        Raises:
            DvfsError: not a JSON object of known keys and string values, or an unknown op or backend.
        """
        data = _object(line)
        known = [f.name for f in dataclasses.fields(cls)]
        if set(data) - set(known) or "op" not in data:
            raise DvfsError(f"a request holds op and {', '.join(k for k in known if k != 'op')} only")
        if not all(isinstance(v, str) for v in data.values()):
            raise DvfsError("a request's fields are strings")
        req = cls(**data)
        if req.op not in OPS or (req.backend and req.backend not in BACKENDS):
            raise DvfsError(f"unknown op {req.op!r} or backend {req.backend!r}; ops: {', '.join(OPS)}")
        return req


@dataclasses.dataclass(frozen=True)
class PinStatus:
    """One GPU the service holds for a client: which, at what clock, for whom, and for how much longer.

    Attributes:
        backend: "jetson" or "nvml".
        device_key: the clock domain (`release` takes it).
        requested: the clock pinned ("maxn", or MHz as text).
        uid: the client's uid (SO_PEERCRED). user: its name.
        pid: the PID that pinned. last_pid: the PID whose message the service read last (SCM_CREDENTIALS: the kernel's
            word, so a forked child that renews is named, not its exited parent).
        alive: whether `last_pid` runs now.
        since: when it was pinned (seconds since the epoch).
        lease_left_s: until the maximum lease ends it. idle_left_s: until the idle timeout ends it without a renew.
    """

    backend: str
    device_key: str
    requested: str
    uid: int
    pid: int
    user: str
    since: float
    last_pid: int = 0
    alive: bool = True
    lease_left_s: float = 0.0
    idle_left_s: float = 0.0

    def line(self) -> str:
        pid = self.last_pid or self.pid
        state = "alive" if self.alive else "exited"
        first = "" if pid == self.pid else f", pinned by PID {self.pid}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return (f"{self.device_key} ({self.backend}) pinned at {self.requested} by uid {self.uid} ({self.user}), PID {pid} "
                f"({state}){first}, since {when}, lease left {duration(self.lease_left_s)}, ends in "
                f"{duration(self.idle_left_s)} without a renew")


@dataclasses.dataclass(frozen=True)
class Reply:
    """The service's answer.

    Attributes:
        ok: the request was done.
        error: the one-line reason when not.
        error_kind: which `ERROR_KINDS` class the error is.
        frequencies_mhz: table: the device's clock table.
        cpu_frequencies_mhz: table: the CPU clocks the service can pin ([] where none).
        emc_frequencies_mhz: table: the memory clocks the service can pin ([] where none), and `emc_table_source`
            where they come from.
        pinned_mhz: pin, repin: the clock pinned (None for maxn).
        current_mhz: table, pin, repin: the clock the device reports now, read by the service.
        measured_mhz: clock: the GPU clock BPMP measures (Jetson, read as root), None where the service cannot read it.
        emc_mhz: clock: the memory clock the service reads (Jetson: BPMP's EMC rate, debugfs), None where it cannot.
        measured_clock: pin: whether `clock` answers with a measured clock on this device.
        emc_clock: pin: whether `clock` answers with the memory clock on this device.
        context: pin, repin: what the pin observed besides the clocks (each CPU policy's clock, the mode's caps).
        renew_every_s: pin: how often the client renews (a connection silent for `idle_timeout_s` is ended).
        idle_timeout_s: pin: how long the service waits for a renew before it restores.
        lease_left_s: pin, renew: how long the pin may still last (the service's maximum lease).
        pins: status: every GPU held, with its owner.
        scope: status: which NVML GPUs members may lock, and whether they are assumed unlocked (the config's word).
        lines: restore without a pin: what the service restored from journals of dead runs; status: its limits.
        above_mode_cap: pin: the clock is above the GPU cap of the board's nvpmodel mode (the board may not hold it;
            the client's run records it as a pin written directly would).
    """

    ok: bool
    error: str = ""
    error_kind: str = ""
    frequencies_mhz: list[float] = dataclasses.field(default_factory=list)
    cpu_frequencies_mhz: list[float] = dataclasses.field(default_factory=list)
    emc_frequencies_mhz: list[float] = dataclasses.field(default_factory=list)
    emc_table_source: str = ""
    pinned_mhz: float | None = None
    current_mhz: float | None = None
    measured_mhz: float | None = None
    emc_mhz: float | None = None
    measured_clock: bool = False
    emc_clock: bool = False
    context: dict[str, Any] = dataclasses.field(default_factory=dict)
    renew_every_s: float = 0.0
    idle_timeout_s: float = 0.0
    lease_left_s: float = 0.0
    pins: list[PinStatus] = dataclasses.field(default_factory=list)
    scope: str = ""
    lines: list[str] = dataclasses.field(default_factory=list)
    above_mode_cap: bool = False

    @classmethod
    def failure(cls, err: BaseException, kind: str = "") -> Reply:
        """The reply for an error: a DvfsError's own class and line (or `kind`); anything else as a plain error."""
        kind = kind or next((k for k, c in ERROR_KINDS.items() if type(err) is c), "error")
        text = " ".join(str(err).split()) or type(err).__name__
        return cls(False, text, kind)

    def encode(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, line: bytes) -> Reply:
        data = _object(line)
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        pin_fields = {f.name for f in dataclasses.fields(PinStatus)}
        data["pins"] = [PinStatus(**{k: v for k, v in p.items() if k in pin_fields}) for p in data.get("pins", [])]
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


def duration(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3 h 20 min."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"


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
