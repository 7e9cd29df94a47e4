"""User-facing errors.

Everything a user can cause (a bad name, a missing permission, a busy GPU) is raised as a
`DvfsError` subclass with a message that says what was wrong and what to do. The CLI prints the
message as one line and exits with code 2; library users catch the class they care about.
"""
from __future__ import annotations

from collections.abc import Sequence


class DvfsError(Exception):
    """Base class of errors meant to be shown to a user as one line."""


class UnknownNameError(DvfsError, ValueError):
    """Raised when a name is not one of the known ones (a device backend, model, task, preset, frequency, policy,
    precision, strategy, data source or twin profile); the message lists the valid names (`unknown`)."""


class DevicePermissionError(DvfsError, PermissionError):
    """Raised when a clock write needs privileges this process does not have (run as root, or meter only)."""


class DeviceBusyError(DvfsError):
    """Raised when another live process owns the GPU's clocks (the message names its PID where the lock holds one)."""


class RestoreFailedError(DvfsError):
    """Raised when the original clocks could not be put back; the journal is kept for `dvfs-mlops restore`."""


class StateFolderError(DvfsError):
    """Raised when a folder of locks or restore journals (or a file in it) is not this user's own private one: a
    symbolic link on its path, another owner, or a mode that lets others in. Nothing is read or written there."""


class ClockServiceGoneError(DvfsError):
    """Raised when the clock service does not answer at its socket, or closed the connection (it stopped, crashed or
    restarted)."""


class ClockLostError(DvfsError):
    """Raised inside a session whose clock stopped being held by the clock service (the service went away and the
    pin could not be taken again, or root released it, or its lease ran out); the run did not hold its clock."""


class TrackingStoreError(DvfsError):
    """Raised when the MLflow tracking store fails mid-sweep (after MLflow's bounded retries); a resume redoes the point.

    Args:
        message: the one-line message.
        cause: the first line of the underlying error.
        transient: the store did not answer (worth trying again), rather than refused the request.
    """

    def __init__(self, message: str, cause: str = "", transient: bool = True):
        super().__init__(message)
        self.cause = cause
        self.transient = transient  # the store did not answer (worth trying again), rather than refused the request


class DeviceNotFoundError(DvfsError):
    """Raised when a hardware backend (`jetson`, `nvml`) finds no device, or no GPU at the index asked for, on this
    machine; `open_device("auto")` falls back to the next backend instead."""


_PLURALS = {"frequency": "frequencies", "policy": "policies"}


def unknown(kind: str, value: object, valid: Sequence[object]) -> UnknownNameError:
    """Build the standard 'unknown X; valid Xs: ...' error.

    Args:
        kind: what was named, e.g. "device" or "frequency".
        value: the name given.
        valid: the valid names, in the order shown.

    Returns:
        The `UnknownNameError`, for the caller to raise.
    """
    shown = ", ".join(str(v) for v in valid)
    return UnknownNameError(f"unknown {kind} {value!r}; valid {_PLURALS.get(kind, kind + 's')}: {shown}")
