"""User-facing errors.

Everything a user can cause (a bad name, a missing permission, a busy GPU) is raised as a
`DvfsError` subclass with a message that says what was wrong and what to do. The CLI prints the
message as one line and exits with code 2; library users catch the class they care about.
"""
from __future__ import annotations


class DvfsError(Exception):
    """Base class of errors meant to be shown to a user as one line."""


class UnknownNameError(DvfsError, ValueError):
    """A model, task, frequency, objective or backend name that does not exist."""


class DevicePermissionError(DvfsError, PermissionError):
    """The clock controls need privileges this process does not have."""


class DeviceBusyError(DvfsError):
    """Another live process owns the GPU's clocks."""


class RestoreFailedError(DvfsError):
    """The original clocks could not be put back; the journal is kept for `dvfs-mlops restore`."""


class TrackingStoreError(DvfsError):
    """The MLflow tracking store failed mid-sweep (after MLflow's bounded retries); a resume redoes the point."""

    def __init__(self, message: str, cause: str = "", transient: bool = True):
        super().__init__(message)
        self.cause = cause
        self.transient = transient  # the store did not answer (worth trying again), rather than refused the request


class DeviceNotFoundError(DvfsError):
    """The requested backend found no device on this machine."""


_PLURALS = {"frequency": "frequencies", "policy": "policies"}


def unknown(kind: str, value: object, valid: list[object] | tuple[object, ...]) -> UnknownNameError:
    """Build the standard 'unknown X; valid Xs: ...' error."""
    shown = ", ".join(str(v) for v in valid)
    return UnknownNameError(f"unknown {kind} {value!r}; valid {_PLURALS.get(kind, kind + 's')}: {shown}")
