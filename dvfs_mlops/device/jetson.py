"""Jetson backend: GPU devfreq in sysfs for the clock, INA3221 hwmon rails for power.

Every path is read under `$DVFS_SYSFS_ROOT` (default `/`) so the backend runs on a fake tree in
tests and inside chroots. Writes go only to files inside the devfreq node that discovery found;
a file that resolves outside it (a planted symlink) is refused.
"""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

from dvfs_mlops.device.base import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    FreqSession,
    freq_label,
    parse_freq,
)
from dvfs_mlops.device.guard import ClockOwnership
from dvfs_mlops.errors import DeviceNotFoundError, DevicePermissionError, DvfsError
from dvfs_mlops.meter import EnergyReport, PowerSampler

GPU_OF_NODE_NAMES = ("ga10b", "gpu", "gv11b", "gp10b")
KNOWN_NODES = (
    "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",  # JetPack 5 (Orin)
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",  # JetPack 6 (Orin)
    "sys/devices/17000000.gpu/devfreq/17000000.gpu",
)
SUM_CHANNEL = 7  # INA3221 "sum of shunts" pseudo channel on Orin kernels
AGX_ORIN_RAILS = {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}


def sysfs_root() -> Path:
    return Path(os.environ.get("DVFS_SYSFS_ROOT", "/"))


def _read(path: Path) -> str:
    return path.read_text().replace("\x00", "").strip()


def find_gpu_devfreq(root: Path | None = None) -> Path | None:
    """The devfreq node whose device's of_node is the GPU, or None."""
    root = root or sysfs_root()
    cls = root / "sys/class/devfreq"
    candidates: list[Path] = sorted(cls.iterdir()) if cls.is_dir() else []
    candidates += [root / k for k in KNOWN_NODES]
    for node in candidates:
        name_file = node / "device/of_node/name"
        try:
            if _read(name_file) in GPU_OF_NODE_NAMES and (node / "available_frequencies").exists():
                return node
        except OSError:
            continue
    return None


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


def _open_or_none(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


class JetsonDevice:
    name = "jetson"
    simulated = False

    def __init__(self, node: Path | None = None, root: Path | None = None, sample_hz: float = 50.0):
        self.root = root or sysfs_root()
        found = node or find_gpu_devfreq(self.root)
        if found is None:
            raise DeviceNotFoundError(f"no Jetson GPU devfreq node under {self.root}sys/class/devfreq; use --device sim or nvml")
        self.node = Path(found)
        self._node_real = Path(os.path.realpath(self.node))
        self.sample_hz = sample_hz
        self.profile = _board_profile(self.root)
        self.device_key = f"jetson-{self.node.name}"

    # reading -----------------------------------------------------------------------------------
    def _file(self, name: str) -> Path:
        return self.node / name

    def read(self, name: str) -> str:
        return _read(self._file(name))

    @property
    def frequencies_mhz(self) -> list[float]:
        return sorted(int(x) / 1e6 for x in self.read("available_frequencies").split())

    def current_range_hz(self) -> tuple[int, int]:
        return int(self.read("min_freq")), int(self.read("max_freq"))

    def settings(self) -> dict[str, Any]:
        s: dict[str, Any] = {"node": str(self.node), "min_freq": self.read("min_freq"), "max_freq": self.read("max_freq")}
        with contextlib.suppress(OSError):
            s["governor"] = self.read("governor")
        return s

    def gpu_load_pct(self) -> float | None:
        try:
            return int(_read(self.node / "device/load")) / 10.0  # per mille
        except (OSError, ValueError):
            return None

    # writing -----------------------------------------------------------------------------------
    def _write(self, name: str, value: str) -> None:
        path = self._file(name)
        real = Path(os.path.realpath(path))
        if path.is_symlink() or real.parent != self._node_real:
            raise DvfsError(f"refusing to write {path}: it resolves to {real}, outside the GPU devfreq node {self._node_real}")
        try:
            with open(path, "w") as f:
                f.write(value)
        except PermissionError:
            raise DevicePermissionError(f"no permission to write {path}; run as root (sudo -E dvfs-mlops ...) to change the GPU clock") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DevicePermissionError(f"no permission to write {path}; run as root") from None
            raise DvfsError(f"the kernel refused {value} for {path}: {e.strerror}") from None

    def write_range(self, min_hz: int, max_hz: int) -> None:
        """Set [min, max]; the write order keeps min <= max at every moment (kernel rule)."""
        _cur_min, cur_max = self.current_range_hz()
        if min_hz > cur_max:  # raising: max first
            self._write("max_freq", str(max_hz))
            self._write("min_freq", str(min_hz))
        else:  # lowering (or within): min first
            self._write("min_freq", str(min_hz))
            self._write("max_freq", str(max_hz))

    def restore_settings(self, settings: dict[str, Any]) -> None:
        self.write_range(int(settings["min_freq"]), int(settings["max_freq"]))
        gov = settings.get("governor")
        with contextlib.suppress(OSError, DvfsError):
            if gov and self.read("governor") != gov:
                self._write("governor", gov)

    # API ---------------------------------------------------------------------------------------
    def session(self, freq: FreqRequest) -> JetsonSession:
        return JetsonSession(self, parse_freq(freq, self.frequencies_mhz))

    def info(self) -> DeviceInfo:
        rails = find_rails(self.root)
        names = [r.name for r in rails]
        for r in rails:
            r.close()
        cur = None
        with contextlib.suppress(OSError, ValueError):
            cur = int(self.read("cur_freq")) / 1e6
        gov = None
        with contextlib.suppress(OSError):
            gov = self.read("governor")
        return DeviceInfo("jetson", self.profile, self.frequencies_mhz, cur, gov, names, False, {"devfreq": str(self.node)})


def _board_profile(root: Path) -> str:
    try:
        model = (root / "proc/device-tree/model").read_text().replace("\x00", "").strip().lower()
    except OSError:
        return "jetson"
    if "orin" in model:
        return "jetson-agx-orin-64gb" if "agx" in model else "jetson-orin"
    return "jetson-" + "-".join(model.split())[:40]


class JetsonSession(FreqSession):
    device: JetsonDevice

    def __init__(self, device: JetsonDevice, freq: FreqRequest):
        super().__init__(device, freq)
        self._ownership = ClockOwnership("jetson", device.device_key, device.restore_settings)
        self._original: dict[str, Any] | None = None
        self._sampler: PowerSampler | None = None
        self._rails: list = []
        self._load_fd: int | None = None

    def _apply(self) -> None:
        dev = self.device
        self._ownership.claim()
        self._original = dev.settings()
        self._ownership.record(self._original, freq_label(self.freq))  # before any write
        table_hz = [int(x) for x in dev.read("available_frequencies").split()]
        if self.freq == MAXN:
            target = (min(table_hz), max(table_hz))  # the default governor's full range
        else:
            hz = min(table_hz, key=lambda h: abs(h / 1e6 - float(self.freq)))
            target = (hz, hz)
        if target != dev.current_range_hz():
            dev.write_range(*target)

    def _restore(self) -> None:
        if self._original is not None:
            try:
                if self.device.current_range_hz() != (int(self._original["min_freq"]), int(self._original["max_freq"])):
                    self.device.restore_settings(self._original)
            finally:
                self._original = None
                self._ownership.release()
        elif self._ownership.lock.held:
            self._ownership.release()

    def _start_meter(self) -> None:
        self._rails = find_rails(self.device.root)
        if not self._rails:
            raise DvfsError(f"no INA3221 power rails under {self.device.root}sys/bus/i2c/drivers; cannot meter energy")
        readers = [r.watts for r in self._rails]
        self._load_fd = _open_or_none(self.device.node / "device/load")
        load_fd = self._load_fd

        def read_load() -> float | None:
            try:
                return int(os.pread(load_fd, 16, 0)) / 10.0 if load_fd is not None else None  # per mille
            except (OSError, ValueError):
                return None

        self._sampler = PowerSampler(lambda: [read() for read in readers], [r.name for r in self._rails], read_load, self.device.sample_hz)
        self._sampler.start()

    def _stop_meter(self) -> EnergyReport:
        if self._sampler is None:
            raise DvfsError("meter was not started")
        report = self._sampler.report()
        for r in self._rails:
            r.close()
        if self._load_fd is not None:
            os.close(self._load_fd)
        return report
