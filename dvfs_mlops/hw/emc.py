"""The memory (EMC) clock of a Jetson through BPMP's debugfs, pinned as `jetson_clocks` pins it, and restored.

How it is set (NVIDIA's jetson_clocks, /usr/bin/jetson_clocks of Jetson Linux r35/r36, do_emc, for tegra186, tegra194
and tegra234): the files are /sys/kernel/debug/bpmp/debug/clk/emc/{min_rate, max_rate, rate, mrq_rate_locked}, Hz;
jetson_clocks writes 1 to mrq_rate_locked, then the rate it wants to `rate`, and `--store` keeps mrq_rate_locked
("FreqOverride" in `--show`) to restore. While mrq_rate_locked is 1 the rate written holds; writing 0 gives the clock
back to the kernel's bandwidth manager ("Unlock EMC frequency, allowing DVFS dynamic adjustment"). debugfs is root's
(/sys/kernel/debug is 0700): without root, the EMC clock is set through the clock service or not at all.

Restore: what the journal found. mrq_rate_locked 0 (the usual case): write 0 back and let the kernel choose the rate
again, never the rate read at the start (that was the kernel's choice of that moment, as a devfreq or cpufreq read is an
aggregate). mrq_rate_locked 1 (someone, e.g. jetson_clocks, locked a rate): write that rate back and keep the lock.

The table (`table`): BPMP's own list of the rates it runs the EMC at, debugfs emc/possible_rates (kHz) where the
firmware has it; else the rates the board names: the clock's min_rate and max_rate and the power modes' EMC caps
between them (nvpmodel.conf's EMC MAX_FREQ). `DeviceInfo` and `dvfs-mlops devices` name which (`EmcTable.source`).

The power mode's cap (`cap_hz`): nvpmodel writes a mode's EMC MAX_FREQ to /sys/kernel/nvpmodel_emc_cap/emc_iso_cap
(NVIDIA's Orin template: `< PARAM TYPE=FILE NAME=EMC > MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap`). It is a
ceiling, not a floor: NVIDIA's nvpmodel_emc_cap driver passes it to the interconnect as the nvpmodel client's peak
bandwidth, which tegra23x_icc.c applies with clk_set_max_rate on the DRAM clock ("the peak_bw 0 is considered an
uncapped request"; an isochronous request above it fails: "iso req failed due to emc_cap"), and jetson_clocks sets the
EMC to emc_iso_cap instead of max_rate where it is lower. A pin above it is refused unless allowed, as for the GPU.

The floor (`floor_hz`): the isochronous clients' floor (display, camera) is BPMP's to compute (tegra23x_icc.c,
determine_rate: the la_rate_floor and iso_rate_min BPMP returns) and no file shows it; a locked rate takes the EMC out of
the kernel's hands, those floors included. What the board does show is the clock's own min_rate (jetson_clocks'
"EMC MinFreq"): a pin below it is refused in one line, before anything is written.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DevicePermissionError, DvfsError, unknown
from dvfs_mlops.hw.board import PowerMode
from dvfs_mlops.hw.sysfs import read_sysfs as _read
from dvfs_mlops.hw.sysfs import write_sysfs

log = logging.getLogger(__name__)

EMC_CLK_DIR = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_POSSIBLE_RATES = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
EMC_ISO_CAP = "sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
DOMAIN_KEY = "jetson-emc"  # the EMC clock domain's lock and journal (`guard.ClockOwnership`)
JOURNAL_BACKEND = "emc"
SOURCE_POSSIBLE_RATES = "bpmp possible_rates"
SOURCE_LIMITS = "bpmp min_rate/max_rate and the power modes' EMC caps"


@dataclasses.dataclass(frozen=True)
class EmcTable:
    """The rates the EMC can be pinned at (Hz, ascending) and where they come from (`SOURCE_POSSIBLE_RATES`,
    `SOURCE_LIMITS`)."""

    rates_hz: tuple[int, ...]
    source: str

    @property
    def mhz(self) -> list[float]:
        return [r / 1e6 for r in self.rates_hz]


def _number(text: str) -> int:
    """A rate file's number (debugfs prints a plain integer)."""
    return int(text.split()[0])


class EmcClock:
    """BPMP's EMC clock under a sysfs root.

    Args:
        root: the sysfs root.
        writer: performs each write (default: one write(2)); tests pass a fake kernel's.
    """

    def __init__(self, root: Path, writer: Callable[[Path, str], None] | None = None):
        self.root = root
        self.dir = root / EMC_CLK_DIR
        self._writer = writer or write_sysfs

    def present(self) -> bool:
        """Whether this process can read BPMP's EMC clock (debugfs: root only)."""
        try:
            return (self.dir / "mrq_rate_locked").is_file() and os.access(self.dir / "rate", os.R_OK)
        except OSError:
            return False

    def _read_hz(self, name: str) -> int:
        return _number(_read(self.dir / name))

    def rate_hz(self) -> int:
        return self._read_hz("rate")

    def locked(self) -> int:
        return self._read_hz("mrq_rate_locked")

    def floor_hz(self) -> int:
        """The clock's min_rate: the lowest rate BPMP runs it at now."""
        return self._read_hz("min_rate")

    def iso_cap_hz(self) -> int | None:
        """nvpmodel's EMC cap (emc_iso_cap), None where unset (0), unreadable or not below the clock's max_rate."""
        try:
            cap = _number(_read(self.root / EMC_ISO_CAP))
            top = self._read_hz("max_rate")
        except (OSError, ValueError, IndexError):
            return None
        return cap if 0 < cap < top else None

    def cap_hz(self, mode: PowerMode | None) -> int | None:
        """The power mode's EMC cap: the lower of emc_iso_cap and the mode's EMC MAX_FREQ (None: neither caps it)."""
        caps = [c for c in (self.iso_cap_hz(), round(mode.emc_max_mhz * 1e6) if mode and mode.emc_max_mhz else None) if c]
        return min(caps) if caps else None

    def table(self, modes_caps_hz: tuple[int, ...] = ()) -> EmcTable:
        """BPMP's possible_rates where present, else min_rate, max_rate and the modes' caps between them (module doc).

        Args:
            modes_caps_hz: the EMC MAX_FREQ of every power mode of nvpmodel.conf.
        """
        try:
            rates = sorted({int(x) * 1000 for x in _read(self.root / EMC_POSSIBLE_RATES).split() if x.isdigit()})
            if rates:
                return EmcTable(tuple(rates), SOURCE_POSSIBLE_RATES)
        except OSError:
            pass
        lo, hi = self.floor_hz(), self._read_hz("max_rate")
        return EmcTable(tuple(sorted({lo, hi, *(c for c in modes_caps_hz if lo < c < hi)})), SOURCE_LIMITS)

    def target_hz(self, mhz: float, table: EmcTable) -> int:
        """The rate of the table a request in MHz names.

        Raises:
            UnknownNameError: not within half a MHz of a rate of the table (the message lists them).
        """
        for hz in table.rates_hz:
            if abs(hz / 1e6 - mhz) <= 0.5:
                return hz
        raise unknown("memory (EMC) clock", f"{mhz:g}", [f"{r:g}" for r in table.mhz])

    def check_floor(self, hz: int) -> None:
        """Refuse a rate below the clock's floor in one line (module doc).

        Raises:
            DvfsError: `hz` is below min_rate.
        """
        floor = self.floor_hz()
        if hz < floor:
            raise DvfsError(f"{hz / 1e6:g} MHz is below the EMC floor of {floor / 1e6:g} MHz the board holds now (BPMP's "
                            f"min_rate); pin {floor / 1e6:g} MHz or more")

    def settings(self) -> dict[str, Any]:
        """What a journal records: mrq_rate_locked and the rate found (the rate is put back only where it was locked)."""
        return {"mrq_rate_locked": self.locked(), "rate_hz": self.rate_hz()}

    # writing ---------------------------------------------------------------------------------------------------------
    def writable(self) -> bool:
        return os.access(self.dir / "rate", os.W_OK) and os.access(self.dir / "mrq_rate_locked", os.W_OK)

    def _write(self, name: str, value: str) -> None:
        path = self.dir / name
        real = Path(os.path.realpath(path))
        if path.is_symlink() or real.parent != Path(os.path.realpath(self.dir)):
            raise DvfsError(f"refusing to write {path}: it resolves to {real}, outside BPMP's EMC clock {self.dir}")
        try:
            self._writer(path, value)
        except PermissionError:
            raise DevicePermissionError(f"no permission to write {path}: BPMP's debugfs is root's; install the clock "
                                        "service once (sudo dvfs-mlops clockd install) or run as root") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DevicePermissionError(f"no permission to write {path}; run as root") from None
            raise DvfsError(f"BPMP refused {value} for {path}: {e.strerror or e}") from None

    def pin(self, hz: int) -> None:
        """Lock the EMC at `hz`: mrq_rate_locked 1, then the rate (jetson_clocks' order).

        Raises:
            DvfsError: a write failed; `partial` says whether the lock went through before.
        """
        try:
            self._write("mrq_rate_locked", "1")
        except DvfsError as e:
            e.partial = False  # type: ignore[attr-defined]
            raise
        try:
            self._write("rate", str(hz))
        except DvfsError as e:
            e.partial = True  # type: ignore[attr-defined]
            raise

    def move(self, hz: int) -> None:
        """Another rate while locked (the journal keeps what was found first)."""
        self._write("rate", str(hz))

    def restore_settings(self, settings: dict[str, Any]) -> None:
        """Put back what the journal found (module doc): unlocked, give the clock back to the kernel; locked, the rate
        that was locked, still locked.

        Raises:
            DvfsError: a write failed.
        """
        if int(settings.get("mrq_rate_locked", 0)) == 1:
            self._write("rate", str(int(settings["rate_hz"])))
            self._write("mrq_rate_locked", "1")
        else:
            self._write("mrq_rate_locked", "0")
