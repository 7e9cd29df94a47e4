"""The device interface every backend implements, and the records that cross module lines.

A backend exposes its frequency table and hands out `FreqSession`s: a context manager that pins
the GPU clock (or leaves the default governor for "maxn"), meters energy, and restores exactly what
it found on every exit path. Backends differ only in how they read, write and meter; the ordering
(lock -> journal -> write -> meter -> restore -> unjournal -> unlock) lives here once.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from dvfs_mlops.clocks import MAXN, FreqRequest, freq_label
from dvfs_mlops.errors import unknown
from dvfs_mlops.hw.guard import TerminationGuard
from dvfs_mlops.hw.meter import EnergyReport

__all__ = ["MAXN", "Device", "DeviceInfo", "FreqRequest", "FreqSession", "freq_label", "parse_freq"]


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


class FreqSession(abc.ABC):
    """Pin a clock for the duration of a `with` block, meter it, restore on exit.

    Subclasses implement the hooks; `__enter__`/`__exit__` enforce the safe ordering.
    `step(profile)` is called once per training step: a no-op on real hardware, the way the
    simulated twin advances its virtual clock. `window(name)` meters a part of the session on its
    own (the fine-tune loop uses "train" and "eval"); `report()` is the "train" window when there
    is one, so `energy_j` means the training steps on every backend. With `observe=True` the
    session writes nothing at all (no lock, no journal, no clock): it only meters.
    """

    def __init__(self, device: Device, freq: FreqRequest, observe: bool = False):
        self.device = device
        self.freq = freq
        self.observe = observe
        self._report: EnergyReport | None = None
        self._signals = TerminationGuard()
        self._open_windows: dict[str, Any] = {}
        self._window_marks: list[tuple[str, Any, Any]] = []
        self.windows: dict[str, EnergyReport] = {}
        self.pins: list[float] = []  # clocks pinned inside the session by repin(), in order
        # What the backend observed besides energy (GPU temperature, EMC clock, nvpmodel mode,
        # above_mode_cap ...): logged with the run as params/metrics.
        self.context: dict[str, Any] = {}

    @property
    def pinned_mhz(self) -> float | None:
        """The clock this session pins, or None (maxn, observe)."""
        return None if self.observe or self.freq == MAXN else float(self.freq)

    # hooks -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def _apply(self) -> None:
        """Record the original settings (journal) and pin the clock. Not called when observing."""

    @abc.abstractmethod
    def _restore(self) -> None:
        """Put back what `_apply` found. Must be idempotent; raises when the restore failed."""

    @abc.abstractmethod
    def _start_meter(self) -> None: ...

    @abc.abstractmethod
    def _stop_meter(self) -> EnergyReport: ...

    @abc.abstractmethod
    def _mark(self) -> Any:
        """A window boundary (an opaque position in the meter's record)."""

    @abc.abstractmethod
    def _window_report(self, start: Any, end: Any) -> EnergyReport:
        """The report between two marks (called after the meter stopped)."""

    def _repin(self, mhz: float) -> None:
        """Move the pin to `mhz` inside the session (the journal keeps the original settings)."""
        raise NotImplementedError(f"the {self.device.name} backend cannot change the clock inside a session")

    # public ----------------------------------------------------------------------------------
    def repin(self, freq: FreqRequest) -> float:
        """Pin another clock of the table inside the open session (refine's probes); returns it.

        The restore guarantees are unchanged: the journal written on entry holds the settings found
        BEFORE the session, whatever was pinned since, and the exit restores those. The write is
        shielded from SIGTERM/SIGHUP like the first one. Observing sessions pin nothing and refuse.
        """
        from dvfs_mlops.errors import DvfsError

        if self.observe:
            raise DvfsError("an observing session pins no clock, so it cannot move one (drop --observe to refine)")
        new = parse_freq(freq, self.device.frequencies_mhz)
        if new == MAXN:
            raise DvfsError("repin needs a clock of the table, not maxn")
        with self._signals.deferring():
            self._repin(float(new))
            self.freq = new
        self.pins.append(float(new))
        return float(new)

    def step(self, profile: Any = None) -> None:  # noqa: B027 - an optional hook, not abstract
        """Called once per training step; real hardware needs nothing."""

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[None]:
        """Meter the block as window `name` (one window per name per session)."""
        self.begin_window(name)
        try:
            yield
        finally:
            self.end_window(name)

    def begin_window(self, name: str) -> None:
        """Start window `name` (for callers without a block to wrap, e.g. a Trainer callback)."""
        if name in self._open_windows or any(w == name for w, _, _ in self._window_marks):
            raise ValueError(f"window {name!r} was already metered in this session")
        self._open_windows[name] = self._mark()

    def end_window(self, name: str) -> None:
        """End window `name` (a no-op if it is not open); a window still open at exit ends there."""
        if name in self._open_windows:
            self._window_marks.append((name, self._open_windows.pop(name), self._mark()))

    def window_report(self, name: str) -> EnergyReport:
        """Window `name`, ended earlier, read while the session is still open (refine's probes)."""
        for w, a, b in self._window_marks:
            if w == name:
                return self._finish(self._window_report(a, b))
        raise KeyError(f"window {name!r} has not ended in this session")

    def report(self) -> EnergyReport:
        """The training window's report (the whole session when no window was metered)."""
        if self._report is None:
            return self._snapshot()
        return self.windows.get("train", self._report)

    def session_report(self) -> EnergyReport:
        """The whole session, set-up and evaluation included."""
        if self._report is None:
            return self._snapshot()
        return self._report

    def _snapshot(self) -> EnergyReport:
        raise RuntimeError("report() is available after the session has exited")

    def _finish(self, report: EnergyReport) -> EnergyReport:
        """Judge whether the clock held (None where nothing was pinned)."""
        if self.pinned_mhz is None:
            report.clock_held = None
        elif report.clock_held is None and report.clock_mhz_measured is not None:
            report.clock_held = self._held(report)
        return report

    def _held(self, report: EnergyReport) -> bool | None:
        """Backends with per-sample clocks override this; the default judges the mean."""
        table = sorted(self.device.frequencies_mhz)
        steps = [b - a for a, b in itertools.pairwise(table)]
        assert report.clock_mhz_measured is not None and self.pinned_mhz is not None
        return abs(report.clock_mhz_measured - self.pinned_mhz) <= (max(steps) if steps else 0.0) + 0.5

    def __enter__(self) -> FreqSession:
        self._signals.install()
        try:
            with self._signals.deferring():
                if not self.observe:
                    self._apply()
                self._start_meter()
        except BaseException:
            try:
                with self._signals.deferring():
                    self._restore()
            finally:
                self._signals.uninstall()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            with self._signals.deferring():
                try:
                    for name in list(self._open_windows):
                        self.end_window(name)
                    self._report = self._finish(self._stop_meter())
                    self.windows = {name: self._finish(self._window_report(a, b)) for name, a, b in self._window_marks}
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
    torch_device: str  # where training runs: jetson "cuda", nvml "cuda:<index>", sim "cpu"
    device_id: str  # which board: the Jetson's serial, the NVML GPU's UUID, the host on the twin

    @property
    def frequencies_mhz(self) -> list[float]: ...

    def session(self, freq: FreqRequest, observe: bool = False) -> FreqSession: ...

    def info(self) -> DeviceInfo: ...
