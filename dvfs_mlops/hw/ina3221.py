"""The INA3221 power monitors of a Jetson: find the rails under sysfs and read their watts cheaply.

Two layouts: hwmon (`ina3221/*/hwmon/hwmon*`: in{N}_label, in{N}_input mV, curr{N}_input mA) and
the older iio one (`ina3221x/*/iio:device*`: rail_name_N, in_voltageN/in_currentN or in_powerN).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from dvfs_mlops.hw.sysfs import read_sysfs as _read
from dvfs_mlops.hw.sysfs import sysfs_root

SUM_CHANNEL = 7  # INA3221 "sum of shunts" pseudo channel on Orin kernels


class Rail:
    """One INA3221 channel: label, voltage (mV) and current (mA) files, kept open for cheap pread."""

    def __init__(self, name: str, volt: Path, curr: Path | None = None, power: Path | None = None):
        self.name = name
        self._fds = [os.open(p, os.O_RDONLY) for p in (volt, curr) if p is not None] if power is None else [os.open(power, os.O_RDONLY)]
        self._power_mw = power is not None

    def watts(self) -> float:
        if self._power_mw:
            return int(os.pread(self._fds[0], 32, 0)) / 1e3
        return int(os.pread(self._fds[0], 32, 0)) * int(os.pread(self._fds[1], 32, 0)) / 1e6

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


def find_rails(root: Path | None = None) -> list[Rail]:
    """INA3221 rails: hwmon layout (in{N}_label/_input, curr{N}_input) or the old iio layout."""
    root = root or sysfs_root()
    rails: list[Rail] = []
    drivers = root / "sys/bus/i2c/drivers"
    for hw in sorted(drivers.glob("ina3221/*/hwmon/hwmon*")):
        for n in range(1, 9):
            label_file = hw / f"in{n}_label"
            if n == SUM_CHANNEL or not label_file.exists():
                continue
            label = _read(label_file)
            if "NC" in label:  # not connected
                continue
            volt, curr = hw / f"in{n}_input", hw / f"curr{n}_input"
            if volt.exists() and curr.exists():
                rails.append(Rail(label, volt, curr))
    for iio in sorted(drivers.glob("ina3221x/*/iio:device*")):
        for n in range(8):
            label_file = iio / f"rail_name_{n}"
            if not label_file.exists():
                continue
            label = _read(label_file)
            if "NC" in label:
                continue
            power = iio / f"in_power{n}_input"
            volt, curr = iio / f"in_voltage{n}_input", iio / f"in_current{n}_input"
            if volt.exists() and curr.exists():
                rails.append(Rail(label, volt, curr))
            elif power.exists():
                rails.append(Rail(label, volt, power=power))
    return rails
