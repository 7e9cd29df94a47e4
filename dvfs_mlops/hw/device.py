"""The device interface every backend implements, and the records that cross module lines.

A backend exposes its frequency table and hands out `FreqSession`s: a context manager that pins
the GPU clock (or leaves the default governor for "maxn"), meters energy, and restores exactly what
it found on every exit path. Backends differ only in how they read, write and meter; the ordering
(lock -> journal -> write -> meter -> restore -> unjournal -> unlock) lives here once.

Besides the GPU clock a session may pin the CPU clock (`cpu_mhz`) and the memory clock (`emc_mhz`: a Jetson's EMC, an
NVML GPU's memory clock), each a clock of the device's own table for that knob (`cpu_frequencies_mhz`,
`emc_frequencies_mhz`; empty where the backend has no such knob). None leaves that domain alone: nothing of it is
locked, journalled or written. A backend that cannot set a knob refuses it in one line before anything is touched
(`open_session`).
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, runtime_checkable

from dvfs_mlops.clocks import MAXN, FreqRequest, freq_label
from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.hw.guard import TerminationGuard
from dvfs_mlops.hw.meter import EnergyReport, at_pin

if TYPE_CHECKING:
    from dvfs_mlops.hw.twin.trace import StepTrace

__all__ = ["KNOBS", "MAXN", "Device", "DeviceInfo", "FreqRequest", "FreqSession", "KnobKeywords", "freq_label", "knob_keywords",
           "knob_table", "open_session", "parse_freq", "parse_knob"]

# The knobs a session may pin besides the GPU clock: keyword -> (its name in messages, the table attribute, the option).
KNOBS = {"cpu_mhz": ("CPU clock", "cpu_frequencies_mhz", "--cpu-freq"),
         "emc_mhz": ("memory (EMC) clock", "emc_frequencies_mhz", "--emc-freq")}


class KnobKeywords(TypedDict, total=False):
    """The knobs a session pins besides the GPU clock, as `Device.session` keywords: only those pinned are present."""

    cpu_mhz: float
    emc_mhz: float


def knob_keywords(cpu_mhz: float | None, emc_mhz: float | None) -> KnobKeywords:
    """`KnobKeywords` of the knobs given (None: left out)."""
    knobs = KnobKeywords()
    if cpu_mhz is not None:
        knobs["cpu_mhz"] = cpu_mhz
    if emc_mhz is not None:
        knobs["emc_mhz"] = emc_mhz
    return knobs


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
    """Turn '816', 816.0 or 'maxn' into a clock request of the table.

    Args:
        value: a clock in MHz (a number or its text), or "maxn" (any case).
        frequencies_mhz: the device's clock table.
        tolerance_mhz: how far `value` may be from a table entry and still name it.

    Returns:
        The table's entry (float), or `MAXN`.

    Raises:
        UnknownNameError: `value` is neither "maxn" nor within `tolerance_mhz` of a clock; the message lists the table.
    """
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


def parse_knob(value: str | float, frequencies_mhz: Sequence[float], knob: str, tolerance_mhz: float = 0.5) -> float:
    """A CPU or memory clock of a knob's table (no "maxn": a knob is pinned or left alone).

    Args:
        value: a clock in MHz (a number or its text).
        frequencies_mhz: the knob's table.
        knob: "cpu_mhz" or "emc_mhz" (`KNOBS`), for the message.
        tolerance_mhz: how far `value` may be from a table entry and still name it.

    Returns:
        The table's entry.

    Raises:
        UnknownNameError: `value` is not within `tolerance_mhz` of a clock of the table; the message lists the table.
    """
    what = KNOBS[knob][0]
    try:
        mhz = float(value)
    except (TypeError, ValueError):
        raise unknown(what, value, _fmt_table(frequencies_mhz)) from None
    for f in frequencies_mhz:
        if math.isclose(f, mhz, abs_tol=tolerance_mhz):
            return float(f)
    raise unknown(what, f"{mhz:g}", _fmt_table(frequencies_mhz))


def knob_table(device: Device, knob: str) -> list[float]:
    """A device's table for `knob` ("cpu_mhz", "emc_mhz"); [] where the backend has no such knob."""
    return list(getattr(device, KNOBS[knob][1], ()) or ())


def open_session(device: Device, freq: FreqRequest, observe: bool = False, label: str = "", *, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None) -> FreqSession:
    """`device.session(...)` with the CPU and memory clocks checked first: the one way in for code that may pin knobs.

    The keywords reach the backend only where given, so a backend without knobs is called as before.

    Args:
        device: an open `Device`.
        freq, observe, label: as `Device.session`.
        cpu_mhz: the CPU clock to pin (None: leave it alone).
        emc_mhz: the memory clock to pin (None: leave it alone).

    Returns:
        The session, not yet entered.

    Raises:
        DvfsError: a knob with `observe` (nothing is pinned), or a knob the backend has no table for (one line naming
            it and what to do), before anything is touched.
        UnknownNameError: a clock not in its table.
    """
    knobs = knob_keywords(cpu_mhz, emc_mhz)
    for knob in knobs:
        what, attr, option = KNOBS[knob]
        if observe:
            raise DvfsError(f"--observe pins nothing, so it cannot pin the {what}; drop {option} or --observe")
        if not hasattr(device, attr):
            raise DvfsError(f"the {device.name} backend cannot set the {what} ({option}); drop {option}, or use a backend "
                            "that sets it (jetson, or replay for a grid measured with it)")
    return device.session(freq, observe=observe, label=label, **knobs)


class FreqSession(abc.ABC):
    """Pin a clock for the duration of a `with` block, meter it, restore on exit.

    `Device.session(freq, observe, label)` makes one; use it as a context manager. Subclasses
    implement the hooks; `__enter__`/`__exit__` enforce the safe ordering. On enter: lock, journal,
    write the clock, start metering. On exit, whatever happened inside: stop metering, restore,
    remove the journal, unlock. SIGTERM/SIGHUP inside the block become `SystemExit`, so the restore
    runs; they are deferred during the write and the restore.
    `step(profile)` is called once per training step: a no-op on real hardware, the way the
    simulated twin advances its virtual clock. `window(name)` meters a part of the session on its
    own (the fine-tune loop uses "train" and "eval"); `report()` is the "train" window when there
    is one, so `energy_j` means the training steps on every backend. With `observe=True` the
    session writes nothing at all (no lock, no journal, no clock): it only meters.

    Args:
        device: the backend that opened the session (its table, its name in messages).
        freq: a clock of `device.frequencies_mhz` in MHz, or "maxn" (write nothing: the board's default governor).
        observe: meter only: no lock, no journal, no clock write (no root needed).
        cpu_mhz: a clock of `device.cpu_frequencies_mhz` to pin the CPUs at (None: the CPU clock is left alone).
        emc_mhz: a clock of `device.emc_frequencies_mhz` to pin the memory clock at (None: left alone).

    Attributes:
        windows: each named window's `EnergyReport`, filled on exit.
        pins: the clocks `repin` pinned inside the session, in order.
        context: what the backend observed besides energy (GPU temperature, EMC clock, nvpmodel mode; with a CPU or
            memory clock pinned, `cpu_mhz_measured`, `cpu_held`, `emc_mhz`, `emc_held` of the whole session).

    Raises:
        DeviceBusyError: on enter, another process owns the GPU's clock.
        DevicePermissionError: on enter, the clock write needs root.
        DvfsError: on enter, another reason the backend cannot pin or meter (e.g. NVML clocks locked by someone else,
            no power rails to read).
        RestoreFailedError: on exit (or when enter fails), the clock could not be put back; the journal is kept.
    """

    def __init__(self, device: Device, freq: FreqRequest, observe: bool = False, *, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None):
        self.device = device
        self.freq = freq
        self.observe = observe
        self.cpu_mhz = cpu_mhz
        self.emc_mhz = emc_mhz
        self._report: EnergyReport | None = None
        self._signals = TerminationGuard()
        self._open_windows: dict[str, Any] = {}
        self._window_marks: list[tuple[str, Any, Any]] = []
        self._spans: dict[str, tuple[float, float]] = {}  # each window's (begin, end), monotonic; "" the whole session
        self._opened_at: dict[str, float] = {}
        self.windows: dict[str, EnergyReport] = {}
        self.pins: list[float] = []  # clocks pinned inside the session by repin(), in order
        # What the backend observed besides energy (GPU temperature, EMC clock, nvpmodel mode,
        # above_mode_cap ...): logged with the run as params/metrics.
        self.context: dict[str, Any] = {}

    @property
    def pinned_mhz(self) -> float | None:
        """The clock this session pins, or None (maxn, observe)."""
        return None if self.observe or self.freq == MAXN else float(self.freq)

    @property
    def pinned_cpu_mhz(self) -> float | None:
        """The CPU clock this session pins, or None (left alone, observe)."""
        return None if self.observe or self.cpu_mhz is None else float(self.cpu_mhz)

    @property
    def pinned_emc_mhz(self) -> float | None:
        """The memory clock this session pins, or None (left alone, observe)."""
        return None if self.observe or self.emc_mhz is None else float(self.emc_mhz)

    def knobs(self) -> KnobKeywords:
        """The knobs this session pins besides the GPU clock, as `Device.session` keywords ({} where none)."""
        return knob_keywords(self.pinned_cpu_mhz, self.pinned_emc_mhz)

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

    @abc.abstractmethod
    def _repin(self, mhz: float) -> None:
        """Move the pin to `mhz` inside the session (the journal keeps the original settings)."""

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        """Move the CPU and memory clocks (None: leave that one as it is) inside the session; a backend that pins them
        overrides this (a domain first pinned here is locked and journalled first)."""
        knob = "cpu_mhz" if cpu_mhz is not None else "emc_mhz"
        raise DvfsError(f"the {self.device.name} backend cannot set the {KNOBS[knob][0]}")

    # public ----------------------------------------------------------------------------------
    def repin(self, freq: FreqRequest, *, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> float:
        """Pin another clock of the table inside the open session (refine's probes), and the CPU and memory clocks where
        given.

        The journal written on entry holds the settings found BEFORE the session, whatever is pinned
        since, and the exit restores those. The write is shielded from SIGTERM/SIGHUP like the first one.

        Args:
            freq: a clock of the device's table (MHz, or its text).
            cpu_mhz: a CPU clock of `device.cpu_frequencies_mhz` (None: the CPU clock stays as it is).
            emc_mhz: a memory clock of `device.emc_frequencies_mhz` (None: stays as it is).

        Returns:
            The clock pinned, as the table writes it.

        Raises:
            DvfsError: the session observes (it pins nothing), `freq` is "maxn", or the backend cannot set a knob given.
            UnknownNameError: `freq` (or a knob's clock) is not a clock of its table.
        """
        if self.observe:
            raise DvfsError("an observing session pins no clock, so it cannot move one (drop --observe to refine)")
        new = parse_freq(freq, self.device.frequencies_mhz)
        if new == MAXN:
            raise DvfsError("repin needs a clock of the table, not maxn")
        cpu = parse_knob(cpu_mhz, knob_table(self.device, "cpu_mhz"), "cpu_mhz") if cpu_mhz is not None else None
        emc = parse_knob(emc_mhz, knob_table(self.device, "emc_mhz"), "emc_mhz") if emc_mhz is not None else None
        before = (self.cpu_mhz, self.emc_mhz)
        with self._signals.deferring():
            # the knobs are the session's before the GPU moves: a backend that looks a configuration up (replay) looks up
            # the new one once
            self.cpu_mhz = cpu if cpu is not None else self.cpu_mhz
            self.emc_mhz = emc if emc is not None else self.emc_mhz
            try:
                self._repin(float(new))
                self.freq = new
                if cpu is not None or emc is not None:
                    self._repin_knobs(cpu, emc)
            except BaseException:
                self.cpu_mhz, self.emc_mhz = before
                raise
        self.pins.append(float(new))
        return float(new)

    def step(self, profile: StepTrace | None = None) -> None:  # noqa: B027 - an optional hook, not abstract
        """Call once per training step: the twin charges the step's time and energy; real hardware does nothing.

        Args:
            profile: the step's trace (the twin's `StepTrace`); None charges nothing.
        """

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[None]:
        """Meter the block as window `name` (`begin_window` on entry, `end_window` on exit, also when it raises).

        Args:
            name: the window's name, e.g. "train" or "eval"; `windows[name]` holds its report after the session.

        Raises:
            ValueError: a window of that name was already metered in this session.
        """
        self.begin_window(name)
        try:
            yield
        finally:
            self.end_window(name)

    def begin_window(self, name: str) -> None:
        """Start window `name` (for callers without a block to wrap, e.g. a Trainer callback).

        Args:
            name: the window's name; one window per name per session.

        Raises:
            ValueError: a window of that name is open or was already metered in this session.
        """
        if name in self._open_windows or any(w == name for w, _, _ in self._window_marks):
            raise ValueError(f"window {name!r} was already metered in this session")
        self._open_windows[name] = self._mark()
        self._opened_at[name] = time.monotonic()

    def end_window(self, name: str) -> None:
        """End window `name`; a no-op when it is not open. A window still open at the session's exit ends there.

        Args:
            name: the window's name, as given to `begin_window`.
        """
        if name in self._open_windows:
            self._confirm_held(recover=True)
            self._window_marks.append((name, self._open_windows.pop(name), self._mark()))
            self._spans[name] = (self._opened_at.pop(name), time.monotonic())

    def window_report(self, name: str) -> EnergyReport:
        """The report of a window that has ended, readable while the session is still open (refine's probes).

        Args:
            name: the window's name.

        Returns:
            The window's `EnergyReport`, `clock_held` judged against the clock pinned now.

        Raises:
            KeyError: no window of that name has ended in this session.
        """
        for w, a, b in self._window_marks:
            if w == name:
                return self._finish(self._window_report(a, b), name)
        raise KeyError(f"window {name!r} has not ended in this session")

    def report(self) -> EnergyReport:
        """The report of the "train" window, so `energy_j` means the training steps on every backend.

        Returns:
            The "train" window's `EnergyReport`, or the whole session's when no "train" window was metered.

        Raises:
            RuntimeError: the session has not exited yet (the twin returns its running totals instead).
        """
        if self._report is None:
            return self._snapshot()
        return self.windows.get("train", self._report)

    def session_report(self) -> EnergyReport:
        """The report of the whole session, set-up and evaluation included.

        Returns:
            The session's `EnergyReport`.

        Raises:
            RuntimeError: the session has not exited yet (the twin returns its running totals instead).
        """
        if self._report is None:
            return self._snapshot()
        return self._report

    def _snapshot(self) -> EnergyReport:
        raise RuntimeError("report() is available after the session has exited")

    def _finish(self, report: EnergyReport, window: str = "") -> EnergyReport:
        """Judge whether each clock held (None where it was not pinned): never where the pin was lost during `window`
        (`_unheld`), else from the clock read back."""
        lost = self._lost_during(window)
        if self.pinned_mhz is None:
            report.clock_held = None
        elif lost:
            report.clock_held = False
        elif report.clock_held is None and report.clock_mhz_measured is not None:
            report.clock_held = self._held(report)
        if self.pinned_cpu_mhz is None:
            report.cpu_held = None
        elif lost:
            report.cpu_held = False
        if self.pinned_emc_mhz is None:
            report.emc_held = None
        elif lost:
            report.emc_held = False
        return report

    def _say_knobs(self) -> None:
        """Put the whole session's CPU and memory clocks read back, and whether each held, in `context`."""
        if self._report is None:
            return
        for key, value in (("cpu_mhz_measured", self._report.cpu_mhz_measured), ("cpu_held", self._report.cpu_held),
                           ("emc_held", self._report.emc_held)):
            if value is not None:
                self.context[key] = value

    def _lost_during(self, window: str) -> bool:
        begin, end = self._spans.get(window, (-math.inf, math.inf))
        return any(a <= end and (b is None or b >= begin) for a, b in self._unheld())

    def _unheld(self) -> list[tuple[float, float | None]]:
        """Spans (monotonic; an end of None: never held again) in which the pinned clock was not held; none by default."""
        return []

    def _clock_failure(self) -> BaseException | None:
        """The error that ends a session whose clock was lost for good (None by default: a backend's own pin cannot be)."""
        return None

    def _confirm_held(self, recover: bool) -> None:  # noqa: B027 - an optional hook, not abstract
        """Before a window's report: make sure whoever holds the pin still does (nothing to ask by default)."""

    def _held(self, report: EnergyReport) -> bool | None:
        """Backends with per-sample clocks judge each sample (`meter.clock_held`); the default judges the mean: held
        when it is the pinned table clock, within half the gap to the neighbouring table clock (`meter.at_pin`)."""
        assert report.clock_mhz_measured is not None and self.pinned_mhz is not None
        return at_pin(report.clock_mhz_measured, self.pinned_mhz, self.device.frequencies_mhz)

    def __enter__(self) -> FreqSession:
        self._signals.install()
        self._opened_at[""] = time.monotonic()
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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        try:
            with self._signals.deferring():
                try:
                    for name in list(self._open_windows):
                        self.end_window(name)
                    self._confirm_held(recover=False)
                    self._spans[""] = (self._opened_at.pop(""), time.monotonic())
                    self._report = self._finish(self._stop_meter())
                    self.windows = {name: self._finish(self._window_report(a, b), name) for name, a, b in self._window_marks}
                    self._say_knobs()
                finally:
                    self._restore()
        finally:
            self._signals.uninstall()
        lost = self._clock_failure()
        if lost is not None and exc_type is None:
            raise lost
        return False


class PinnedSession(FreqSession):
    """A hardware session whose clock writes all go through one pin object (`_new_pin`): the backend's own writer as
    root (`JetsonPin`, `NvmlPin`), else the clock service's client (`clockd.client.route_pin`); metering stays in this
    process either way.

    A pin through the service can be lost while the session runs (`clockd.client.ServicePin`): where it was pinned
    again, every window that overlaps the gap is judged not held and `context` says so (`clock_lost`,
    `clock_unheld_s`); where it was lost for good, the next `step` (or the exit) raises its `ClockLostError`."""

    def __init__(self, device: Device, freq: FreqRequest, observe: bool = False, *, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None):
        super().__init__(device, freq, observe=observe, cpu_mhz=cpu_mhz, emc_mhz=emc_mhz)
        self._pin: Any = None

    @abc.abstractmethod
    def _new_pin(self) -> Any:
        """The pin this session writes through (pin, repin, restore)."""

    def _apply(self) -> None:
        self._pin = self._new_pin()
        self.context.update(self._pin.pin(self.freq, **self.knobs()))

    def _repin(self, mhz: float) -> None:
        """Another clock of the table; the journal still holds what was found before the session."""
        self._pin.repin(mhz)

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        """Move the CPU and memory clocks through the same pin (a domain pinned the first time here is locked and
        journalled first)."""
        self._pin.repin_knobs(**knob_keywords(cpu_mhz, emc_mhz))

    def _restore(self) -> None:
        if self._pin is not None:
            self._pin.restore()
        self._say_lost()

    # a pin through the clock service can be lost while the session runs (`clockd.client.ServicePin`) --------------
    def step(self, profile: StepTrace | None = None) -> None:
        """Once per training step: end the job at once where the clock service lost the pin for good.

        Raises:
            ClockLostError: the clock was not held from some moment on (the line says why and since when).
        """
        failure = self._clock_failure()
        if failure is not None:
            self._say_lost()
            raise failure

    def _unheld(self) -> list[tuple[float, float | None]]:
        return list(getattr(self._pin, "lost_windows", []))

    def _clock_failure(self) -> BaseException | None:
        return getattr(self._pin, "failure", None)

    def _confirm_held(self, recover: bool) -> None:
        confirm = None if self.observe else getattr(self._pin, "confirm", None)
        if confirm is not None:
            confirm(recover)

    def _say_lost(self) -> None:
        """Put in `context` that (and for how long) the clock was not held, where it was not."""
        spans = self._unheld()
        if not spans:
            return
        now = time.monotonic()
        self.context["clock_unheld_s"] = round(sum((b if b is not None else now) - a for a, b in spans), 3)
        failure = self._clock_failure()
        self.context["clock_lost"] = str(failure) if failure is not None else (
            f"the clock service lost the pin {len(spans)} time(s); pinned again each time")

    def _relayed_clock_reader(self) -> Any:
        """The clock the clock service measures for this session (`ServicePin.measured_clock_reader`), None where the
        pin is this process's own or the service cannot measure it."""
        reader = getattr(self._pin, "measured_clock_reader", None)
        return reader() if reader is not None else None

    def _relayed_emc_reader(self) -> Any:
        """The memory clock the clock service reads for this session (`ServicePin.emc_reader`: BPMP's debugfs, root
        only), None where the pin is this process's own or the service cannot read it."""
        reader = getattr(self._pin, "emc_reader", None)
        return reader() if reader is not None else None


@runtime_checkable
class Device(Protocol):
    """A GPU whose clock can be pinned and whose energy can be metered (`open_device` returns one).

    Attributes:
        name: the backend: jetson, nvml or sim.
        profile: the board profile, e.g. jetson-agx-orin-64gb, sim-orin.
        simulated: True for the twin, whose measurements are simulated.
        torch_device: where training runs: jetson "cuda", nvml "cuda:<k>" (the CUDA device with the GPU's UUID), sim "cpu".
        device_id: which board: the Jetson's serial, the NVML GPU's UUID, the host on the twin.
        frequencies_mhz: the clock table, ascending, read from the hardware (the twin: its profile's table).
    """

    name: str  # backend name: jetson | nvml | sim
    profile: str  # e.g. jetson-agx-orin-64gb, sim-orin
    simulated: bool
    device_id: str  # which board: the Jetson's serial, the NVML GPU's UUID, the host on the twin

    @property
    def torch_device(self) -> str:
        """Where training runs: jetson "cuda", nvml "cuda:<index>", sim "cpu"."""
        ...

    @property
    def frequencies_mhz(self) -> list[float]: ...

    @property
    def cpu_frequencies_mhz(self) -> Sequence[float]:
        """The CPU clocks a session can pin (`cpu_mhz`), ascending; empty where the backend has no CPU knob."""
        ...

    @property
    def emc_frequencies_mhz(self) -> Sequence[float]:
        """The memory clocks a session can pin (`emc_mhz`), ascending; empty where the backend has no memory knob."""
        ...

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "", *, cpu_mhz: float | None = None,
                emc_mhz: float | None = None) -> FreqSession:
        """A session that pins `freq` (and the CPU and memory clocks where given) for a `with` block and meters it.

        Args:
            freq: a clock of `frequencies_mhz` in MHz, or "maxn" (write nothing: the board's default).
            observe: meter only: no lock, no journal, no clock write.
            label: names what the session measures (a sweep point, a probe); the twin seeds its run-to-run noise
                from it, hardware ignores it.
            cpu_mhz: a clock of `cpu_frequencies_mhz` (None: leave the CPU clock alone).
            emc_mhz: a clock of `emc_frequencies_mhz` (None: leave the memory clock alone).

        Returns:
            The `FreqSession`, not yet entered.

        Raises:
            UnknownNameError: `freq` (or a knob's clock) is not a clock of its table.
            DvfsError: a knob the backend cannot set, in one line naming it, before anything is touched.
        """
        ...

    def info(self) -> DeviceInfo: ...
