"""The `replay` backend: a device that plays a measured grid instead of measuring.

A grid is a CSV of what a board measured for a fixed unit of work (one training step, say) at each clock setting:

    workload, gpu_mhz, time_s, energy_j           required: time (s) and energy (J) of the same unit of work
    cpu_mhz, emc_mhz                              optional: the CPU and memory (EMC) clocks of the setting
    power_w                                       optional: energy_j / time_s (checked against them)
    repeat                                        optional: the repeat's number, where a setting was measured more than once

plus, where the caller allows them, per-workload columns (the governor's features) and per-row columns (`twin fit`'s
`steps`, ...). `freq_mhz` is accepted as the name of the GPU clock column (the name sweeps and `curve fit` use).
The clock table is the file's distinct GPU clocks; `maxn` is the file's top setting (the highest GPU clock, with the
highest CPU and EMC clocks), not an extra point. With the GPU knob alone a file that has CPU and EMC columns plays
its slice at their highest values. A session "measures" by looking its setting up: the n-th look-up of one
(workload, setting) plays its n-th recorded repeat, and once they are used up, their mean. Nothing is run, written or
locked; what is reported is REPLAYED (neither SIMULATED nor live). Every fault of the file is one line before
anything runs (`read_grid`).

Judging a policy on recorded measurements instead of live runs is what Zeus's trace-driven simulator does
(ml-energy/zeus, zeus/_legacy/simulate.py, `Simulator`: it looks up each (batch size, power limit) in the recorded
train and power traces); here the recorded unit is one setting of one workload.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.device import KNOBS, MAXN, DeviceInfo, FreqRequest, FreqSession, parse_freq, parse_knob
from dvfs_mlops.hw.meter import EnergyReport

if TYPE_CHECKING:
    from _csv import Reader

    from dvfs_mlops.hw.twin.trace import StepTrace

REPLAYED = "REPLAYED"
REQUIRED_COLUMNS = ("workload", "gpu_mhz", "time_s", "energy_j")
OPTIONAL_COLUMNS = ("cpu_mhz", "emc_mhz", "power_w", "repeat")
GPU_COLUMN_ALIAS = "freq_mhz"  # what sweeps' params and `curve fit` files call the GPU clock
# The one "rail" of a replayed report: the energy as the file gives it (whatever rails the board summed into it).
RECORDED_RAIL = "recorded"
# power_w, where given, must agree with energy_j / time_s this closely (a file whose columns disagree is refused).
POWER_TOLERANCE = 0.01
# Two GPU clocks closer than this cannot be told apart by `--freq` (`device.parse_freq`'s tolerance).
CLOCK_RESOLUTION_MHZ = 0.5


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One row of a grid: one measurement of one workload at one setting.

    Attributes:
        workload: the workload's name, exactly as written.
        setting: the clocks.
        time_s: the time of the unit of work.
        energy_j: the energy of the same unit of work.
        repeat: the row's `repeat` number; None where the file has no `repeat` column.
        line: the row's line in the file (for messages).
        extra: the caller's per-row columns (`read_grid`'s `row_columns`) that the row fills in, as text.
    """

    workload: str
    setting: Setting
    time_s: float
    energy_j: float
    repeat: int | None
    line: int
    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s


@dataclasses.dataclass(frozen=True)
class Lookup:
    """What one look-up of a (workload, setting) played.

    Attributes:
        workload: the workload, as written in the file.
        setting: the setting looked up.
        time_s: the time of one unit of work.
        energy_j: the energy of one unit of work.
        repeat: the index (0-based, in the file's repeat order) of the recorded repeat played; None where it is the
            mean of every recorded repeat (the look-ups went past them).
        recorded: how many repeats the file holds for this (workload, setting).
    """

    workload: str
    setting: Setting
    time_s: float
    energy_j: float
    repeat: int | None
    recorded: int

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s


@dataclasses.dataclass(frozen=True)
class ReplayGrid:
    """A measured grid, read and checked (`read_grid`).

    Attributes:
        path: the file it was read from.
        name: the file's name without its suffix: the board the grid was measured on, by convention.
        sha256: the SHA-256 of the file's bytes.
        workloads: the workloads, in the order the file first names them.
        gpu_mhz: the distinct GPU clocks, ascending (the device's clock table).
        cpu_mhz: the distinct CPU clocks, ascending; () where the file has no `cpu_mhz` column.
        emc_mhz: the distinct EMC clocks, ascending; () where the file has no `emc_mhz` column.
        rows: every row, in file order (identical duplicates dropped).
        features: per workload, its per-workload columns (`read_grid`'s `workload_columns`) that the file fills in.
    """

    path: str
    name: str
    sha256: str
    workloads: tuple[str, ...]
    gpu_mhz: tuple[float, ...]
    cpu_mhz: tuple[float, ...]
    emc_mhz: tuple[float, ...]
    rows: tuple[Recorded, ...]
    features: Mapping[str, Mapping[str, str]]
    _runs: Mapping[tuple[str, Setting], tuple[Recorded, ...]] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    def slice_setting(self, gpu_mhz: float) -> Setting:
        """The setting the GPU knob alone plays at `gpu_mhz`: CPU and EMC at the file's highest (None without them).

        Args:
            gpu_mhz: a GPU clock of the file, as written.

        Returns:
            The `Setting`.
        """
        return Setting(float(gpu_mhz), self.cpu_mhz[-1] if self.cpu_mhz else None, self.emc_mhz[-1] if self.emc_mhz else None)

    @property
    def top(self) -> Setting:
        """The file's top setting: what `maxn` plays."""
        return self.slice_setting(self.gpu_mhz[-1])

    def recorded(self, workload: str, setting: Setting) -> tuple[Recorded, ...]:
        """The rows of (workload, setting), in repeat order.

        Raises:
            DvfsError: the workload is not in the file, or the file has no row for it at that setting.
        """
        self.check_workload(workload)
        runs = self._runs.get((workload, setting))
        if not runs:
            raise DvfsError(f"{self.path} has no row for workload {workload!r} at {setting.label()}; "
                            f"a replay plays only the settings the file measured")
        return runs

    def lookup(self, workload: str, setting: Setting, repeat: int) -> Lookup:
        """The `repeat`-th recorded measurement of (workload, setting), or their mean past the last one.

        Args:
            workload: a workload of the file.
            setting: a setting of the file.
            repeat: 0 for the first recorded repeat, 1 for the second, ...; at or past their number, their mean.

        Returns:
            The `Lookup`.

        Raises:
            DvfsError: the file has no row for (workload, setting).
        """
        runs = self.recorded(workload, setting)
        if 0 <= repeat < len(runs):
            r = runs[repeat]
            return Lookup(workload, setting, r.time_s, r.energy_j, repeat, len(runs))
        return Lookup(workload, setting, math.fsum(r.time_s for r in runs) / len(runs),
                      math.fsum(r.energy_j for r in runs) / len(runs), None, len(runs))

    def mean(self, workload: str, setting: Setting) -> Lookup:
        """The mean of every recorded repeat of (workload, setting) (the repeat played after the recorded ones)."""
        return self.lookup(workload, setting, len(self.recorded(workload, setting)))

    def gpu_slice(self, workload: str) -> list[Lookup]:
        """The workload's GPU-only slice (CPU and EMC at the file's highest), one mean per GPU clock it has, ascending."""
        self.check_workload(workload)
        settings = [self.slice_setting(f) for f in self.gpu_mhz]
        return [self.mean(workload, s) for s in settings if (workload, s) in self._runs]

    def check_workload(self, workload: str) -> None:
        """Raises DvfsError (one line, the file's workloads listed) where `workload` is not in the file."""
        if workload not in self.workloads:
            raise DvfsError(f"workload {workload!r} is not in {self.path}; its workloads: {', '.join(self.workloads)}")

    def describe(self) -> str:
        """The grid's shape in one line: rows, workloads and clocks, and the slice the GPU knob alone plays."""
        clocks = f"{len(self.gpu_mhz)} GPU"
        clocks += f" x {len(self.cpu_mhz)} CPU" if self.cpu_mhz else ""
        clocks += f" x {len(self.emc_mhz)} EMC" if self.emc_mhz else ""
        fixed = [f"CPU {self.cpu_mhz[-1]:g}"] if self.cpu_mhz else []
        fixed += [f"EMC {self.emc_mhz[-1]:g}"] if self.emc_mhz else []
        slice_ = f"; the GPU knob alone plays {' / '.join(fixed)} MHz" if fixed else ""
        return f"{len(self.rows)} rows, {len(self.workloads)} workload(s), {clocks} clocks{slice_}"


def read_grid(path: str | Path, *, workload_columns: Collection[str] = (), row_columns: Collection[str] = ()) -> ReplayGrid:
    """Read and check a measured grid: every fault is one `DvfsError` line naming the file (and its line).

    Args:
        path: the CSV.
        workload_columns: further columns the caller allows that describe a workload (the governor's features): one
            value per workload (an empty cell says nothing).
        row_columns: further columns the caller allows per row (kept as text on `Recorded.extra`).

    Returns:
        The `ReplayGrid`.

    Raises:
        DvfsError: the file cannot be read, is empty, lacks a required column, has a column no one reads, a row of the
            wrong length, a value that is not a number (or not a positive one; a repeat that is not a whole number),
            a power_w that disagrees with energy_j / time_s, two rows of one setting (and repeat) with different
            values, GPU clocks too close to tell apart, or a workload whose per-workload column changes.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DvfsError(f"cannot read the trace {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DvfsError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save the grid as a UTF-8 CSV") from None
    reader = csv.reader(io.StringIO(text))
    try:
        return _parse(path, data, reader, workload_columns, row_columns)
    except csv.Error as e:
        raise DvfsError(f"{path} line {reader.line_num}: not a CSV row ({e})") from None


def _parse(path: Path, data: bytes, reader: Reader, workload_columns: Collection[str], row_columns: Collection[str]) -> ReplayGrid:
    header = [h.strip() for h in next(reader, [])]
    columns = _columns(path, header, set(workload_columns), set(row_columns))
    rows: list[Recorded] = []
    seen: dict[tuple[str, Setting, int | None], Recorded] = {}
    features: dict[str, dict[str, tuple[str, int]]] = {}
    for cells in reader:
        if not any(c.strip() for c in cells):
            continue  # a blank line
        line = reader.line_num
        if len(cells) != len(header):
            raise DvfsError(f"{path} line {line}: {len(cells)} fields, the header has {len(header)}")
        row = {name: cell.strip() for name, cell in zip(header, cells)}
        rec = _row(path, line, row, columns, row_columns)
        key = (rec.workload, rec.setting, rec.repeat)
        before = seen.get(key)
        if before is not None:
            if (before.time_s, before.energy_j) != (rec.time_s, rec.energy_j):
                again = "" if rec.repeat is None else f" repeat {rec.repeat}"
                raise DvfsError(f"{path} lines {before.line} and {line}: workload {rec.workload!r} at {rec.setting.label()}{again} "
                                f"twice with different values ({before.time_s:g} s / {before.energy_j:g} J, then "
                                f"{rec.time_s:g} s / {rec.energy_j:g} J); keep one, or number them in a `repeat` column")
            continue
        seen[key] = rec
        rows.append(rec)
        for name in workload_columns:
            value = row.get(name, "")
            if not value:
                continue
            known = features.setdefault(rec.workload, {}).get(name)
            if known is not None and known[0] != value:
                raise DvfsError(f"{path} lines {known[1]} and {line}: workload {rec.workload!r} has {name} {known[0]!r}, then "
                                f"{value!r}; a workload's {name} is one value")
            features[rec.workload][name] = (value, line)
    if not rows:
        raise DvfsError(f"{path} has no rows; a replay grid needs a header ({', '.join(REQUIRED_COLUMNS)}) and one row per "
                        "workload and setting")
    gpu = _distinct(r.setting.gpu_mhz for r in rows)
    _check_resolution(path, gpu)
    runs: dict[tuple[str, Setting], list[Recorded]] = {}
    for r in rows:
        runs.setdefault((r.workload, r.setting), []).append(r)
    ordered = {k: tuple(sorted(v, key=lambda r: (r.repeat if r.repeat is not None else -1, r.line))) for k, v in runs.items()}
    return ReplayGrid(
        path=str(path), name=path.stem, sha256=hashlib.sha256(data).hexdigest(),
        workloads=tuple(dict.fromkeys(r.workload for r in rows)), gpu_mhz=gpu,
        cpu_mhz=_distinct(r.setting.cpu_mhz for r in rows if r.setting.cpu_mhz is not None),
        emc_mhz=_distinct(r.setting.emc_mhz for r in rows if r.setting.emc_mhz is not None),
        rows=tuple(rows), features={w: {k: v for k, (v, _) in f.items()} for w, f in features.items()}, _runs=ordered)


def _columns(path: Path, header: list[str], workload_columns: set[str], row_columns: set[str]) -> dict[str, str]:
    """The format's column -> the header's name for it; refuses a missing, an unknown or a repeated column."""
    if not header or header == [""]:
        raise DvfsError(f"{path} is empty; a replay grid needs a header ({', '.join(REQUIRED_COLUMNS)}) and one row per "
                        "workload and setting")
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise DvfsError(f"{path}: column(s) {', '.join(repeated)} appear more than once in the header")
    names = {h: h for h in header}  # the format's column -> its name in this header
    if GPU_COLUMN_ALIAS in names:
        if "gpu_mhz" in names:
            raise DvfsError(f"{path} has both gpu_mhz and {GPU_COLUMN_ALIAS}; they name the same clock, keep one")
        names["gpu_mhz"] = GPU_COLUMN_ALIAS
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise DvfsError(f"{path} lacks column(s) {', '.join(missing)}; a replay grid has {', '.join(REQUIRED_COLUMNS)} "
                        f"(optional: {', '.join(OPTIONAL_COLUMNS)})")
    known = set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS) | workload_columns | row_columns | {GPU_COLUMN_ALIAS}
    unknown = [h for h in header if h not in known]
    if unknown:
        extra = sorted(workload_columns | row_columns)
        allowed = ", ".join([*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *extra])
        raise DvfsError(f"{path}: unknown column(s) {', '.join(unknown)}; the columns read here are {allowed}")
    return {c: names[c] for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in names}


def _row(path: Path, line: int, row: dict[str, str], columns: dict[str, str], row_columns: Collection[str]) -> Recorded:
    def number(column: str) -> float:
        raw = row[columns[column]]
        try:
            value = float(raw)
        except ValueError:
            raise DvfsError(f"{path} line {line}: {columns[column]} must be a number, got {raw!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise DvfsError(f"{path} line {line}: {columns[column]} must be a positive number, got {raw!r}")
        return value

    workload = row[columns["workload"]]
    if not workload:
        raise DvfsError(f"{path} line {line}: the workload is empty; name the workload each row measured")
    setting = Setting(number("gpu_mhz"), number("cpu_mhz") if "cpu_mhz" in columns else None,
                      number("emc_mhz") if "emc_mhz" in columns else None)
    time_s, energy_j = number("time_s"), number("energy_j")
    if "power_w" in columns and row[columns["power_w"]]:
        power = number("power_w")
        if abs(power / (energy_j / time_s) - 1.0) > POWER_TOLERANCE:
            raise DvfsError(f"{path} line {line}: power_w {power:g} disagrees with energy_j / time_s = {energy_j / time_s:g} "
                            f"(more than {POWER_TOLERANCE:.0%} apart); time_s and energy_j must be of the same unit of work")
    repeat = None
    if "repeat" in columns:
        raw = row[columns["repeat"]]
        if not raw.isdigit():
            raise DvfsError(f"{path} line {line}: repeat must be a whole number (0, 1, ...), got {raw!r}")
        repeat = int(raw)
    extra = {c: row[c] for c in row_columns if row.get(c)}
    return Recorded(workload, setting, time_s, energy_j, repeat, line, extra)


def _distinct(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(sorted(set(values)))


def _check_resolution(path: Path, gpu: Sequence[float]) -> None:
    for a, b in itertools.pairwise(gpu):
        if b - a < CLOCK_RESOLUTION_MHZ:
            raise DvfsError(f"{path}: GPU clocks {a:g} and {b:g} MHz are closer than {CLOCK_RESOLUTION_MHZ:g} MHz, so a "
                            "--freq cannot tell them apart; write each clock once, the same way on every row")


class ReplayDevice:
    """A `Device` that plays a measured grid (module doc): its table is the file's GPU clocks, `maxn` its top setting.

    Args:
        trace: the grid's CSV.
        workload_columns: per-workload columns the file may carry besides the format's (the governor's features).

    Attributes:
        grid: the `ReplayGrid` it plays.
        profile: the grid's name (the file's stem: the board it was measured on).
        device_id: `replay@<first 12 hex digits of the file's SHA-256>`.

    Raises:
        DvfsError: the file is not a valid grid (`read_grid`).
    """

    name = "replay"
    simulated = False  # measured on a real board, but not now: REPLAYED
    replayed = True
    torch_device = "cpu"  # nothing trains on a replay device

    def __init__(self, trace: str | Path, workload_columns: Collection[str] = ()):
        self.grid = read_grid(trace, workload_columns=workload_columns)
        self.profile = self.grid.name
        self.device_id = f"replay@{self.grid.sha256[:12]}"
        self._lookups: dict[tuple[str, Setting], int] = {}
        self._order: dict[str, list[Setting]] = {}

    @property
    def frequencies_mhz(self) -> list[float]:
        return list(self.grid.gpu_mhz)

    @property
    def cpu_frequencies_mhz(self) -> list[float]:
        """The file's CPU clocks ([] where it has no `cpu_mhz` column)."""
        return list(self.grid.cpu_mhz)

    @property
    def emc_frequencies_mhz(self) -> list[float]:
        """The file's EMC clocks ([] where it has no `emc_mhz` column)."""
        return list(self.grid.emc_mhz)

    def setting(self, freq: FreqRequest, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> Setting:
        """The setting a clock request plays: `maxn` the file's top setting, a GPU clock its slice's; a CPU or EMC clock
        given replaces the slice's (the file's top one).

        Raises:
            UnknownNameError: `freq` is not "maxn" nor a GPU clock of the file, or a CPU or EMC clock not in it (the
                message lists them).
            DvfsError: a CPU or EMC clock on a file without that column.
        """
        f = parse_freq(freq, self.frequencies_mhz)
        found = self.grid.top if f == MAXN else self.grid.slice_setting(float(f))
        knobs = {}
        for knob, value in (("cpu_mhz", cpu_mhz), ("emc_mhz", emc_mhz)):
            if value is None:
                continue
            table = list(getattr(self.grid, knob))
            if not table:
                raise DvfsError(f"{self.grid.path} has no {knob} column: its {KNOBS[knob][0]} was not varied, so "
                                f"{KNOBS[knob][2]} has nothing to play; drop {KNOBS[knob][2]}")
            knobs[knob] = parse_knob(value, table, knob)
        return dataclasses.replace(found, **knobs) if knobs else found

    def workload_of(self, label: str = "", workload: str | None = None) -> tuple[str, int | None]:
        """Which workload (and which repeat, where named) a session plays.

        Args:
            label: the session's label; a sweep point's `WORKLOAD#REPEAT` names both.
            workload: the workload, named outright (wins over the label).

        Returns:
            (the workload, the repeat the label names or None).

        Raises:
            DvfsError: a workload not in the file, or none named where the file has several.
        """
        repeat = None
        if workload is None and label:
            name, sep, number = label.rpartition("#")
            if sep and number.isdigit():
                workload, repeat = name, int(number)
            elif label in self.grid.workloads:
                workload = label
        if workload is None:
            if len(self.grid.workloads) > 1:
                raise DvfsError(f"{self.grid.path} holds {len(self.grid.workloads)} workloads ({', '.join(self.grid.workloads)}); "
                                "name the one to replay")
            workload = self.grid.workloads[0]
        self.grid.check_workload(workload)
        return workload, repeat

    def measure(self, workload: str, freq: FreqRequest, repeat: int | None = None) -> Lookup:
        """Look one measurement up, counted as a measurement of this device (`looked_up`).

        Args:
            workload: a workload of the file.
            freq: a GPU clock of the file, or "maxn".
            repeat: which recorded repeat to play (past the last: their mean); None: the next one of this
                (workload, setting), counting this device's earlier look-ups.

        Returns:
            The `Lookup`.

        Raises:
            UnknownNameError: `freq` is not a clock of the file.
            DvfsError: the workload is not in the file, or has no row at that setting.
        """
        return self.measure_setting(workload, self.setting(freq), repeat)

    def measure_setting(self, workload: str, setting: Setting, repeat: int | None = None) -> Lookup:
        """`measure` at a setting of the grid (every clock given: the CPU and EMC knobs too)."""
        key = (workload, setting)
        count = self._lookups.get(key, 0)
        found = self.grid.lookup(workload, setting, count if repeat is None else repeat)
        self._lookups[key] = count + 1
        order = self._order.setdefault(workload, [])
        if setting not in order:
            order.append(setting)
        return found

    def looked_up(self, workload: str) -> tuple[Setting, ...]:
        """The distinct settings of `workload` looked up on this device so far, in the order first looked up (a sweep's
        `points_measured` is their number)."""
        return tuple(self._order.get(workload, ()))

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "", *, workload: str | None = None,
                repeat: int | None = None, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> ReplaySession:
        """A session that plays `workload` at `freq`: each `step()` charges one unit of work as recorded (one look-up
        when the session starts and one after each `repin`); a session that charges no step charges one unit.

        Args:
            freq: a GPU clock of the file, or "maxn" (the top setting).
            observe: play the top setting (what a board runs as found); nothing is written either way.
            label: the session's label: a sweep point's `WORKLOAD#REPEAT` names the workload and the repeat.
            workload: the workload to play (default: the label's, else the file's only one).
            repeat: the recorded repeat to play (default: the label's, else the next one of this device's look-ups).
            cpu_mhz: a CPU clock of the file (None: the GPU clock's slice's, the file's top CPU clock).
            emc_mhz: an EMC clock of the file (None: the slice's).

        Returns:
            The `ReplaySession`, not yet entered.

        Raises:
            UnknownNameError: `freq`, `cpu_mhz` or `emc_mhz` is not a clock of the file.
            DvfsError: the workload is unknown or not named, a knob the file has no column for, or the file has no row
                for it at that setting.
        """
        name, named_repeat = self.workload_of(label, workload)
        if observe and (cpu_mhz is not None or emc_mhz is not None):
            raise DvfsError("--observe pins nothing, so it cannot pin the CPU or EMC clock; drop one of them")
        setting = self.setting(freq, cpu_mhz, emc_mhz)  # a knob the file lacks is refused before entering
        session = ReplaySession(self, MAXN if observe else parse_freq(freq, self.frequencies_mhz), name,
                                repeat if repeat is not None else named_repeat, observe=observe,
                                cpu_mhz=setting.cpu_mhz if cpu_mhz is not None else None,
                                emc_mhz=setting.emc_mhz if emc_mhz is not None else None)
        self.grid.recorded(name, self.setting(session.freq, session.cpu_mhz, session.emc_mhz))  # before entering
        return session

    def close(self) -> None:
        """Nothing to release."""

    def info(self) -> DeviceInfo:
        g = self.grid
        detail: dict[str, Any] = {
            "measurements": f"{REPLAYED}: looked up in the trace, nothing is run or measured",
            "trace": g.path, "trace_name": g.name, "trace_sha256": g.sha256,
            "grid": g.describe(), "workloads": ", ".join(g.workloads), "maxn": f"the top setting, {g.top.label()}",
        }
        return DeviceInfo("replay", self.profile, self.frequencies_mhz, None, None, [RECORDED_RAIL], False, detail)


class ReplaySession(FreqSession):
    """One replayed session (`ReplayDevice.session`): no lock, no journal, no write; the meter is the grid.

    Attributes:
        workload: the workload it plays.
        lookups: each look-up it made, in order (the start, then one per `repin`).
        context: `trace_name`, `trace_sha256`, `workload`, and the setting's `cpu_mhz`/`emc_mhz` where the file has them.
    """

    device: ReplayDevice

    def __init__(self, device: ReplayDevice, freq: FreqRequest, workload: str, repeat: int | None, observe: bool = False,
                 cpu_mhz: float | None = None, emc_mhz: float | None = None):
        super().__init__(device, freq, observe=observe, cpu_mhz=cpu_mhz, emc_mhz=emc_mhz)
        self.workload = workload
        self._repeat = repeat
        self.lookups: list[Lookup] = []
        self._units: list[Lookup] = []  # one per charged unit of work

    def _apply(self) -> None:
        """Nothing on the host is changed."""

    def _restore(self) -> None:
        """Nothing on the host was changed."""

    def _repin(self, mhz: float) -> None:
        self._look_up(mhz)  # with the session's knobs, already the new ones (`FreqSession.repin`)

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        """Nothing more: `_repin` looked the new setting up, the CPU and EMC clocks with it."""

    def _look_up(self, freq: FreqRequest) -> None:
        found = self.device.measure_setting(self.workload, self.device.setting(freq, self.cpu_mhz, self.emc_mhz), self._repeat)
        self.lookups.append(found)
        g = self.device.grid
        self.context.update({"trace_name": g.name, "trace_sha256": g.sha256, "workload": self.workload,
                             "repeat": "mean" if found.repeat is None else str(found.repeat)})
        for knob in ("cpu_mhz", "emc_mhz"):
            value = getattr(found.setting, knob)
            if value is not None:
                self.context[knob] = value

    def _start_meter(self) -> None:
        self._look_up(self.freq)

    def step(self, profile: StepTrace | None = None) -> None:
        """Charge one unit of work as the current look-up recorded it (`profile` is not read)."""
        self._units.append(self.lookups[-1])

    def _mark(self) -> int:
        return len(self._units)

    def _window_report(self, start: int, end: int) -> EnergyReport:
        return self._build(self._units[start:end])

    def _stop_meter(self) -> EnergyReport:
        if not self._units:
            self.step()
        return self._build(self._units)

    def _snapshot(self) -> EnergyReport:
        return self._build(self._units)

    def _build(self, units: Sequence[Lookup]) -> EnergyReport:
        time_s = math.fsum(u.time_s for u in units)
        energy = math.fsum(u.energy_j for u in units)
        clock = math.fsum(u.setting.gpu_mhz * u.time_s for u in units) / time_s if time_s > 0 else None
        emc = [(u.setting.emc_mhz, u.time_s) for u in units if u.setting.emc_mhz is not None]
        emc_mhz = math.fsum(f * t for f, t in emc) / math.fsum(t for _, t in emc) if emc else None
        return EnergyReport(
            duration_s=time_s, energy_j=energy, energy_total_j=energy, energy_by_rail_j={RECORDED_RAIL: energy},
            avg_power_w=energy / time_s if time_s > 0 else 0.0, peak_power_w=max((u.power_w for u in units), default=0.0),
            gpu_util_pct=None, samples=len(units), simulated=False, clock_mhz_measured=clock,
            power_series_w=[u.power_w for u in units], energy_rails=(RECORDED_RAIL,), total_rails=(RECORDED_RAIL,),
            cpu_gpu_combined=True, emc_mhz=emc_mhz)


def replay_statement(device: ReplayDevice) -> str:
    """What `describe_device` says of a replay device: the grid, and that its measurements are REPLAYED."""
    g = device.grid
    return f"replay ({g.name}: {len(g.workloads)} workload(s) from {g.path}, measurements are {REPLAYED})"


__all__ = ["REPLAYED", "Lookup", "Recorded", "ReplayDevice", "ReplayGrid", "ReplaySession", "Setting", "read_grid", "replay_statement"]
