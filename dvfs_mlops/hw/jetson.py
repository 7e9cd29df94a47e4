"""Jetson backend: GPU devfreq in sysfs for the clock, INA3221 rails (`ina3221.py`) for power.

Every path is read under `$DVFS_SYSFS_ROOT` (default `/`) so the backend runs on a fake tree in
tests and inside chroots. Writes go only to files inside the devfreq node that discovery found;
a file that resolves outside it (a planted symlink) is refused.

Which board: the module's P-number in the device tree's `compatible` names the profile (`board_profile`).
What the meter samples besides the rails: the GPU clock (BPMP's measured GPC clock where readable, as root, else
devfreq cur_freq, the clock requested), the GPU load and the EMC clock; at window edges, the board's over-current
throttling counters.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DeviceNotFoundError, DevicePermissionError, DvfsError
from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    PinnedSession,
    freq_label,
    parse_freq,
)
from dvfs_mlops.hw.guard import ClockOwnership, restore_failed
from dvfs_mlops.hw.ina3221 import Rail, find_rails
from dvfs_mlops.hw.meter import CLOCK_MEASURED, CLOCK_REQUESTED, EnergyReport, PowerSampler
from dvfs_mlops.hw.sysfs import read_sysfs as _read
from dvfs_mlops.hw.sysfs import sysfs_root

GPU_OF_NODE_NAMES = ("ga10b", "gpu", "gv11b", "gp10b")
KNOWN_NODES = (
    "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",  # JetPack 5 (Orin)
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",  # JetPack 6 (Orin)
    "sys/devices/17000000.gpu/devfreq/17000000.gpu",
)

log = logging.getLogger(__name__)


def write_sysfs(path: Path, value: str) -> None:
    """One sysfs write, as the kernel sees it: a single write(2) of the value."""
    with open(path, "w") as f:
        f.write(value)


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


def _open_or_none(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _pread_int(fd: int | None, size: int = 32) -> int | None:
    if fd is None:
        return None
    try:
        return int(os.pread(fd, size, 0).replace(b"\x00", b"").strip())
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class PowerMode:
    """The board's nvpmodel mode and the GPU clock cap it sets (None: no cap)."""

    mode_id: int
    name: str
    gpu_max_mhz: float | None


def read_power_mode(root: Path) -> PowerMode | None:
    """nvpmodel's current mode (var/lib/nvpmodel/status) and its GPU MAX_FREQ in etc/nvpmodel.conf.

    Read from the files nvpmodel itself keeps, so neither jtop nor the nvpmodel binary is needed.
    """
    try:
        status = (root / "var/lib/nvpmodel/status").read_text()
        conf = (root / "etc/nvpmodel.conf").read_text()
    except OSError:
        return None
    m = re.search(r"pmode:(\d+)", status)
    if not m:
        return None
    mode_id = int(m.group(1))
    name, cap = f"mode {mode_id}", None
    current = None
    for line in conf.splitlines():
        head = re.match(r"\s*<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>", line)
        if head:
            current = int(head.group(1))
            if current == mode_id:
                name = head.group(2)
            continue
        if current == mode_id:
            gpu = re.match(r"\s*GPU\s+MAX_FREQ\s+(-?\d+)", line)
            if gpu and int(gpu.group(1)) > 0:
                cap = int(gpu.group(1)) / 1e6
    return PowerMode(mode_id, name, cap)


def read_gpu_temp_c(root: Path) -> float | None:
    """The GPU thermal zone ("gpu-thermal" on JetPack 6, "GPU-therm" on JetPack 5), in degrees C."""
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        try:
            if _read(zone / "type").lower().startswith("gpu"):
                return int(_read(zone / "temp")) / 1000.0
        except (OSError, ValueError):
            continue
    return None


# The EMC (memory controller) clock in Hz, debugfs (root only). JetPack 5/6 (Orin): the BPMP clock's rate, as jetson-stats
# reads it (rbonghi/jetson_stats jtop/core/memory.py @f41d5ca, read_emc(), l.132-137: /sys/kernel/debug/bpmp/debug/clk/
# emc/rate); older kernels: the common clock framework's debugfs clk_rate of "emc".
EMC_RATE_FILES = ("sys/kernel/debug/bpmp/debug/clk/emc/rate", "sys/kernel/debug/clk/emc/clk_rate")
# The GPU clock BPMP measures on each GPC's NAFLL (Hz), debugfs (root only): jetson-stats reads nafll_gpc0 and
# nafll_gpc1 (rbonghi/jetson_stats jtop/core/gpu.py @f41d5ca, igpu_read_freq(), l.120-129). devfreq cur_freq is the
# rate the driver set (the request); these count the clock the GPCs actually ran at.
GPC_CLOCK_FILES = ("sys/kernel/debug/bpmp/debug/clk/nafll_gpc0/pto_counter",
                   "sys/kernel/debug/bpmp/debug/clk/nafll_gpc1/pto_counter")
# Over-current throttling the board counts: NVIDIA's tegra23x_oc_event driver (Jetson Linux r35/r36 kernel sources,
# tegra23x_oc_event.c) registers a hwmon device named "soctherm_oc" with cumulative, read-only counters
# oc{1,2,3}_event_cnt (BPMP MRQ_OC_STATUS event_cnt: under-voltage, average and instantaneous over-current, as the
# Jetson Linux Developer Guide's Orin "Platform Power and Performance" page lists them). Each event throttles the clocks
# in hardware. Read at window edges only (each read is a BPMP request).
OC_HWMON_NAME = "soctherm_oc"
OC_COUNTERS = ("oc1_event_cnt", "oc2_event_cnt", "oc3_event_cnt")


def _read_hz_mhz(path: Path) -> float | None:
    """One debugfs read of a rate in Hz (opened each time, as jetson-stats does), in MHz; None where unreadable."""
    try:
        return int(_read(path)) / 1e6
    except (OSError, ValueError):
        return None


def read_emc_mhz(root: Path) -> float | None:
    """The memory controller clock (debugfs, root only); None where it cannot be read."""
    for rel in EMC_RATE_FILES:
        mhz = _read_hz_mhz(root / rel)
        if mhz is not None:
            return mhz
    return None


def emc_reader(root: Path) -> Callable[[], float | None] | None:
    """A reader of the EMC clock (MHz) from the first `EMC_RATE_FILES` entry readable now; None where none is."""
    for rel in EMC_RATE_FILES:
        path = root / rel
        if _read_hz_mhz(path) is not None:
            return lambda: _read_hz_mhz(path)
    return None


def gpc_clock_reader(root: Path) -> Callable[[], float | None] | None:
    """A reader of the GPU clock BPMP measures (MHz, the mean of the readable GPCs); None where no GPC counter is
    readable (not root, or no BPMP debugfs). A GPC reading 0 (clock gated: the GPU idles) is left out of the mean."""
    paths = [root / rel for rel in GPC_CLOCK_FILES if _read_hz_mhz(root / rel) is not None]
    if not paths:
        return None

    def read() -> float | None:
        values = [v for v in (_read_hz_mhz(p) for p in paths) if v]
        return sum(values) / len(values) if values else None

    return read


def oc_throttle_reader(root: Path) -> Callable[[], int | None] | None:
    """A reader of the total of the board's over-current throttling counters (`OC_COUNTERS` of the "soctherm_oc" hwmon
    device); None where the board has none readable."""
    for hw in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        try:
            if _read(hw / "name") != OC_HWMON_NAME:
                continue
        except OSError:
            continue
        files = [hw / n for n in OC_COUNTERS if (hw / n).exists()]

        def read(files: list[Path] = files) -> int | None:
            try:
                return sum(int(_read(f)) for f in files)
            except (OSError, ValueError):
                return None

        if files and read() is not None:
            return read
    return None


class JetsonDevice:
    name = "jetson"
    simulated = False
    torch_device = "cuda"  # the Orin's integrated GPU is CUDA device 0

    def __init__(self, node: Path | None = None, root: Path | None = None, sample_hz: float = 50.0,
                 writer: Callable[[Path, str], None] | None = None):
        """`writer` performs each sysfs write (default: a plain write); tests pass a fake kernel's."""
        self.root = root or sysfs_root()
        self._writer = writer or write_sysfs
        found = node or find_gpu_devfreq(self.root)
        if found is None:
            raise DeviceNotFoundError(f"no Jetson GPU devfreq node under {self.root}sys/class/devfreq; use --device sim or nvml")
        self.node = Path(found)
        self._node_real = Path(os.path.realpath(self.node))
        self.sample_hz = sample_hz
        self.module = module_part_number(self.root)  # e.g. "p3701-0005"; None where the device tree does not say
        self.profile = board_profile(self.root)
        self.device_key = f"jetson-{self.node.name}"
        self.device_id = _board_serial(self.root) or self.device_key

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

    def current_mhz(self) -> float | None:
        """The clock the GPU runs at now (devfreq cur_freq), not the one requested."""
        try:
            return int(self.read("cur_freq")) / 1e6
        except (OSError, ValueError):
            return None

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

    def power_mode(self) -> PowerMode | None:
        return read_power_mode(self.root)

    def conditions(self) -> dict[str, Any]:
        """What else sets the speed: GPU temperature, EMC clock, nvpmodel mode (each where present)."""
        out: dict[str, Any] = {}
        temp = read_gpu_temp_c(self.root)
        if temp is not None:
            out["gpu_temp_c"] = temp
        emc = read_emc_mhz(self.root)
        if emc is not None:
            out["emc_mhz"] = emc
        mode = self.power_mode()
        if mode is not None:
            out["nvpmodel_mode"] = f"{mode.mode_id}:{mode.name}"
            if mode.gpu_max_mhz is not None:
                out["nvpmodel_gpu_max_mhz"] = mode.gpu_max_mhz
        return out

    # writing -----------------------------------------------------------------------------------
    def _write(self, name: str, value: str) -> None:
        path = self._file(name)
        real = Path(os.path.realpath(path))
        if path.is_symlink() or real.parent != self._node_real:
            raise DvfsError(f"refusing to write {path}: it resolves to {real}, outside the GPU devfreq node {self._node_real}")
        try:
            self._writer(path, value)
        except PermissionError:
            raise DevicePermissionError(f"no permission to write {path}; install the clock service once (sudo dvfs-mlops clockd "
                                        "install) or run as root to change the GPU clock, or meter only (--observe)") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DevicePermissionError(f"no permission to write {path}; run as root, or use --observe") from None
            raise DvfsError(f"the kernel refused {value} for {path}: {e.strerror or e}") from None

    def clock_writable(self) -> bool:
        """Whether this process may write the node's clock range itself (root, or a udev rule granting write)."""
        return all(os.access(self._file(n), os.W_OK) for n in ("min_freq", "max_freq"))

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
    def session(self, freq: FreqRequest, observe: bool = False, label: str = "") -> JetsonSession:
        """A session at `freq` (`label` names the measurement; real hardware needs nothing of it)."""
        return JetsonSession(self, parse_freq(freq, self.frequencies_mhz), observe=observe)

    def close(self) -> None:
        """Nothing to release: sessions close their own files."""

    def info(self) -> DeviceInfo:
        rails = find_rails(self.root)
        names = [r.name for r in rails]
        for r in rails:
            r.close()
        gov = None
        with contextlib.suppress(OSError):
            gov = self.read("governor")
        detail = {"devfreq": str(self.node), "serial": self.device_id, **self.conditions()}
        if self.module is not None:
            detail["module"] = self.module
        return DeviceInfo("jetson", self.profile, self.frequencies_mhz, self.current_mhz(), gov, names, False, detail)


# The device tree, read under the sysfs root: /proc/device-tree is the stable path, a link to
# /sys/firmware/devicetree/base (Linux Documentation/ABI/testing/sysfs-firmware-ofw); both are tried.
DEVICE_TREE_DIRS = ("proc/device-tree", "sys/firmware/devicetree/base")
# Module P-number -> profile. The P-numbers are jetson-stats' module table (rbonghi/jetson_stats
# jtop/core/jetson_variables.py @f41d5ca, MODULE_NAME_TABLE, l.150-156): p3767-0005 "Orin Nano (Developer kit)",
# p3767-0004 "Orin Nano (4GB ram)", p3767-0003 "Orin Nano (8GB ram)", p3767-0001 "Orin NX (8GB ram)",
# p3767-0000 "Orin NX (16GB ram)", p3701-0005 "AGX Orin (64GB ram)", p3701-0004 "AGX Orin (32GB ram)". The developer
# kit's Orin Nano (p3767-0005) is an 8 GB module. p3701-0000, "NVIDIA Jetson AGX Orin" in that table, is the first AGX
# Orin Developer Kit's module (Linux tegra234-p3737-0000+p3701-0000.dts): the 64 GB module's GPU (2048 cores, 1.3 GHz)
# with 32 GB of memory; it keeps the name every AGX Orin had before modules were told apart, so its sweeps keep their
# ids and its governors their family.
ORIN_MODULE_PROFILES = {
    "p3701-0005": "jetson-agx-orin-64gb",
    "p3701-0000": "jetson-agx-orin-64gb",
    "p3701-0004": "jetson-agx-orin-32gb",
    "p3767-0000": "jetson-orin-nx-16gb",
    "p3767-0001": "jetson-orin-nx-8gb",
    "p3767-0003": "jetson-orin-nano-8gb",
    "p3767-0005": "jetson-orin-nano-8gb",
    "p3767-0004": "jetson-orin-nano-4gb",
}
# Module families for a P-number the table lacks (e.g. p3701-0008, AGX Orin Industrial): the profile names its family
# and its P-number.
ORIN_MODULE_FAMILIES = {"p3701": "jetson-agx-orin", "p3767": "jetson-orin"}
_PNUMBER = re.compile(r"p\d{4}-\d{4}")
# JetPack 6.2's "Super" device trees mark the module with a -super suffix (e.g. "nvidia,p3768-0000+p3767-0005-super",
# NVIDIA/jetson-gpio lib/python/Jetson/GPIO/gpio_pin_data.py @8e5f0a0, l.85-101): the same module with higher clock
# ceilings and power modes, so its profile says so.
SUPER_SUFFIX = "-super"


def read_compatible(root: Path) -> list[str]:
    """The device tree's root `compatible` strings, most specific first (NUL-separated in the file; NVIDIA/jetson-gpio
    gpio_pin_data.py @8e5f0a0, get_compatibles(), l.594-597, splits it the same way); [] where unreadable."""
    for rel in DEVICE_TREE_DIRS:
        try:
            raw = (root / rel / "compatible").read_bytes()
        except OSError:
            continue
        return [c for c in raw.decode(errors="replace").split("\x00") if c]
    return []


def _module_entry(root: Path) -> tuple[str, bool] | None:
    """(module P-number, Super device tree) from `compatible`: the module of the first "carrier+module" entry (Jetson
    device trees name the carrier first, "nvidia,p3737-0000+p3701-0005"; NVIDIA/jetson-gpio gpio_pin_data.py @8e5f0a0,
    l.80-135), else the first entry that is a known module on its own ("nvidia,p3701-0005")."""
    entries = [c.partition(",")[2] or c for c in read_compatible(root)]
    for entry in entries:
        if "+" in entry:
            module = entry.rpartition("+")[2]
            super_dt = module.endswith(SUPER_SUFFIX)
            module = module.removesuffix(SUPER_SUFFIX)
            if _PNUMBER.fullmatch(module):
                return module, super_dt
    for entry in entries:
        module = entry.removesuffix(SUPER_SUFFIX)
        if module in ORIN_MODULE_PROFILES:
            return module, entry.endswith(SUPER_SUFFIX)
    return None


def module_part_number(root: Path) -> str | None:
    """The module's P-number from the device tree's `compatible` (e.g. "p3701-0005"); None where it names none."""
    found = _module_entry(root)
    return found[0] if found else None


def _read_model(root: Path) -> str | None:
    for rel in DEVICE_TREE_DIRS:
        try:
            return _read(root / rel / "model")
        except OSError:
            continue
    return None


def board_profile(root: Path) -> str:
    """The device profile: the Orin module's name from its P-number (`ORIN_MODULE_PROFILES`, "-super" on a Super device
    tree); another Orin module: its family and P-number; any other board: its device-tree model, as before."""
    found = _module_entry(root)
    if found is not None:
        module, super_dt = found
        name = ORIN_MODULE_PROFILES.get(module) or (
            f"{ORIN_MODULE_FAMILIES[module[:5]]}-{module}" if module[:5] in ORIN_MODULE_FAMILIES else None)
        if name is not None:
            return name + (SUPER_SUFFIX if super_dt else "")
    model = _read_model(root)
    if not model:
        return "jetson"
    return "jetson-" + "-".join(model.lower().split())[:40]



def _board_serial(root: Path) -> str | None:
    try:
        serial = (root / "proc/device-tree/serial-number").read_text().replace("\x00", "").strip()
    except OSError:
        return None
    return serial or None


class JetsonPin:
    """This process's own pin of the devfreq range: lock, journal, write; restore what it found.

    The one place the Jetson pin is spelt out: a session running as root uses it, and so does the clock service
    (`clockd.server`) for its clients, journalling the client's PID and uid.

    Args:
        device: the Jetson whose devfreq node is pinned.
        owner_pid: the PID the journal names (None: this process).
        owner_uid: the uid the journal names (None: this process's).
    """

    def __init__(self, device: JetsonDevice, owner_pid: int | None = None, owner_uid: int | None = None):
        self.device = device
        self._ownership = ClockOwnership("jetson", device.device_key, device.restore_settings)
        self._owner = (owner_pid, owner_uid)
        self._original: dict[str, Any] | None = None

    @property
    def held(self) -> bool:
        return self._ownership.lock.held

    def pin(self, freq: FreqRequest) -> dict[str, Any]:
        """Claim the GPU, journal the range found, pin `freq` ("maxn": write nothing).

        Returns:
            What the session logs besides energy: {"above_mode_cap": True} where `freq` is above nvpmodel's cap.

        Raises:
            DeviceBusyError: another process holds the GPU. DevicePermissionError, DvfsError: the write failed.
        """
        dev = self.device
        self._ownership.claim()
        self._original = dev.settings()
        self._ownership.record(self._original, freq_label(freq), *self._owner)  # before any write
        if freq == MAXN:
            return {}  # the board's default: leave the range nvpmodel (or its administrator) set
        hz = self._table_hz(float(freq))
        context: dict[str, Any] = {}
        mode = dev.power_mode()
        if mode is not None and mode.gpu_max_mhz is not None and hz / 1e6 > mode.gpu_max_mhz + 0.5:
            context["above_mode_cap"] = True
            log.warning("pinning %g MHz above the %g MHz GPU cap of nvpmodel mode %s: the board may not hold it",
                        hz / 1e6, mode.gpu_max_mhz, mode.name)
        if (hz, hz) != dev.current_range_hz():
            dev.write_range(hz, hz)
        return context

    def _table_hz(self, mhz: float) -> int:
        table_hz = [int(x) for x in self.device.read("available_frequencies").split()]
        return min(table_hz, key=lambda h: abs(h / 1e6 - mhz))

    def repin(self, mhz: float) -> None:
        """Another clock of the table; the journal still holds the range found before the first pin."""
        hz = self._table_hz(mhz)
        if (hz, hz) != self.device.current_range_hz():
            self.device.write_range(hz, hz)

    def restore(self) -> None:
        """Put back the range found, remove the journal, unlock (a no-op when nothing is held).

        Raises:
            RestoreFailedError: the write failed; the journal is kept and the lock released.
        """
        if not self._ownership.lock.held:
            return
        original, self._original = self._original, None
        try:
            if original is not None and self.device.current_range_hz() != (int(original["min_freq"]), int(original["max_freq"])):
                self.device.restore_settings(original)
        except Exception as e:  # noqa: BLE001 - whatever failed, the journal must survive it
            self._ownership.abandon()  # the journal stays: `dvfs-mlops restore` can finish the job
            raise restore_failed(self.device.device_key, e, self._ownership.journal_path) from None
        self._ownership.release()


class JetsonSession(PinnedSession):
    """Pin devfreq [f, f]; meter the INA3221 rails, GPU load and cur_freq; restore the range found.

    "maxn" writes nothing: the board's default is whatever range nvpmodel left, and opening the
    full table would override a lower power mode's cap. Who writes: this process as root (`JetsonPin`), else the
    clock service where one runs (`clockd.client.route_pin`); metering stays in this process either way.
    """

    device: JetsonDevice

    def __init__(self, device: JetsonDevice, freq: FreqRequest, observe: bool = False):
        super().__init__(device, freq, observe=observe)
        self._sampler: PowerSampler | None = None
        self._rails: list[Rail] = []
        self._fds: list[int] = []
        self._oc_read: Callable[[], int | None] | None = None
        self._oc_at: dict[int, int | None] = {}  # sample index of a window edge -> throttling counter total there

    def _new_pin(self) -> Any:
        from dvfs_mlops.hw.clockd.client import route_pin

        return route_pin("jetson", lambda: JetsonPin(self.device), writable=self.device.clock_writable)

    def _start_meter(self) -> None:
        dev = self.device
        self.context.update(dev.conditions())
        self._rails = find_rails(dev.root)
        if not self._rails:
            raise DvfsError(f"no INA3221 power rails under {dev.root}sys/bus/i2c/drivers; cannot meter energy")
        readers = [r.watts for r in self._rails]
        load_fd = _open_or_none(dev.node / "device/load")
        measured = gpc_clock_reader(dev.root) or self._relayed_clock_reader()  # BPMP's GPC clock: as root, or the service's
        clock_fd = _open_or_none(dev.node / "cur_freq") if measured is None else None
        self._fds = [fd for fd in (load_fd, clock_fd) if fd is not None]

        def read_load() -> float | None:
            v = _pread_int(load_fd, 16)
            return v / 10.0 if v is not None else None  # per mille

        def read_requested() -> float | None:
            v = _pread_int(clock_fd)
            return v / 1e6 if v is not None else None

        read_clock = measured or read_requested
        self.context["clock_source"] = CLOCK_MEASURED if measured is not None else CLOCK_REQUESTED
        self._sampler = PowerSampler(lambda: [read() for read in readers], [r.name for r in self._rails], read_load, dev.sample_hz,
                                     read_clock=read_clock, clock_source=self.context["clock_source"],
                                     read_emc=emc_reader(dev.root))
        self._oc_read = oc_throttle_reader(dev.root)
        self._oc_at = {}
        self._sampler.start()
        self._oc_edge(0)

    def _oc_edge(self, index: int) -> None:
        """Read the throttling counters at a window edge (sample `index`), once per edge."""
        if self._oc_read is not None and index not in self._oc_at:
            self._oc_at[index] = self._oc_read()

    def _oc_events(self, start: int, end: int) -> int | None:
        a, b = self._oc_at.get(start), self._oc_at.get(end)
        return b - a if a is not None and b is not None else None

    def _mark(self) -> Any:
        if self._sampler is None:
            return 0
        index = self._sampler.mark()
        self._oc_edge(index)
        return index

    def _stop_meter(self) -> EnergyReport:
        if self._sampler is None:
            raise DvfsError("meter was not started")
        self._sampler.stop()
        temp = read_gpu_temp_c(self.device.root)
        if temp is not None:
            self.context["gpu_temp_c_end"] = temp
        for r in self._rails:
            r.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        report = self._sampler.report(**self._judge())
        last = report.samples - 1
        self._oc_edge(last)
        report.oc_throttle_events = self._oc_events(0, last)
        if report.oc_throttle_events is not None:
            self.context["oc_throttle_events"] = report.oc_throttle_events
        if report.emc_mhz is not None:
            self.context["emc_mhz"] = report.emc_mhz  # the session's mean, not one read before it
        return report

    def _window_report(self, start: Any, end: Any) -> EnergyReport:
        assert self._sampler is not None
        report = self._sampler.report(start, end, **self._judge())
        report.oc_throttle_events = self._oc_events(start, end)
        return report

    def _judge(self) -> dict[str, Any]:
        """Per-sample clock_held needs the pinned clock and the table."""
        return {"pinned_mhz": self.pinned_mhz, "table_mhz": self.device.frequencies_mhz}
