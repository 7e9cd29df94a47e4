"""The device interface every backend implements, and the records that cross module lines.

A backend exposes its frequency table and hands out `FreqSession`s: a context manager that pins
the GPU clock (or leaves the default governor for "maxn"), meters energy, and restores exactly what
it found on every exit path. Backends differ only in how they read, write and meter; the ordering
(lock -> journal -> write -> meter -> restore -> unjournal -> unlock) lives here once.
"""
from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from dvfs_mlops.device.guard import TerminationGuard
from dvfs_mlops.errors import unknown
from dvfs_mlops.meter import EnergyReport

MAXN = "maxn"
FreqRequest = float | str  # a clock in MHz or "maxn"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What `dvfs-mlops devices` shows about a backend."""

    backend: str
    profile: str
    frequencies_mhz: list[float]
    current_mhz: float | None
    governor: str | None
    rails: list[str]
    simulated: bool
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_freq(value: str | float, frequencies_mhz: Sequence[float], tolerance_mhz: float = 0.5) -> FreqRequest:
    """Turn '816', 816.0 or 'maxn' into a table entry; anything else lists the valid clocks."""
    if isinstance(value, str) and value.strip().lower() == MAXN:
        return MAXN
    try:
        mhz = float(value)
    except (TypeError, ValueError):
        raise unknown("frequency", value, [*_fmt_table(frequencies_mhz), MAXN]) from None
    for f in frequencies_mhz:
        if math.isclose(f, mhz, abs_tol=tolerance_mhz):
            return float(f)
    raise unknown("frequency", value, [*_fmt_table(frequencies_mhz), MAXN])


def _fmt_table(frequencies_mhz: Sequence[float]) -> list[str]:
    return [f"{f:g}" for f in frequencies_mhz]


def freq_label(freq: FreqRequest) -> str:
    """How a frequency appears in params, tags and tables: '816' or 'maxn'."""
    return MAXN if freq == MAXN else f"{float(freq):g}"


class FreqSession(abc.ABC):
    """Pin a clock for the duration of a `with` block, meter it, restore on exit.

    Subclasses implement the four hooks; `__enter__`/`__exit__` enforce the safe ordering.
    `step(profile)` is called once per training step: a no-op on real hardware, the way the
    simulated twin advances its virtual clock.
    """

    def __init__(self, device: Device, freq: FreqRequest):
        self.device = device
        self.freq = freq
        self._report: EnergyReport | None = None
        self._signals = TerminationGuard()

    # hooks -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def _apply(self) -> None:
        """Record the original settings (journal) and pin the clock."""

    @abc.abstractmethod
    def _restore(self) -> None:
        """Put back what `_apply` found. Must be idempotent."""

    @abc.abstractmethod
    def _start_meter(self) -> None: ...

    @abc.abstractmethod
    def _stop_meter(self) -> EnergyReport: ...

    # public ----------------------------------------------------------------------------------
    def step(self, profile: Any = None) -> None:  # noqa: B027 - an optional hook, not abstract
        """Called once per training step; real hardware needs nothing."""

    def report(self) -> EnergyReport:
        """The energy report of the finished session (or a running snapshot while inside)."""
        if self._report is None:
            return self._snapshot()
        return self._report

    def _snapshot(self) -> EnergyReport:
        raise RuntimeError("report() is available after the session has exited")

    def __enter__(self) -> FreqSession:
        self._signals.install()
        try:
            with self._signals.deferring():
                self._apply()
                self._start_meter()
        except BaseException:
            with self._signals.deferring():
                self._restore()
            self._signals.uninstall()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            with self._signals.deferring():
                try:
                    self._report = self._stop_meter()
                finally:
                    self._restore()
        finally:
            self._signals.uninstall()
        return False


@runtime_checkable
class Device(Protocol):
    """A GPU whose clock can be pinned and whose energy can be metered."""

    name: str  # backend name: jetson | nvml | sim
    profile: str  # e.g. jetson-agx-orin-64gb, sim-orin
    simulated: bool

    @property
    def frequencies_mhz(self) -> list[float]: ...

    def session(self, freq: FreqRequest) -> FreqSession: ...

    def info(self) -> DeviceInfo: ...
