"""Jetson backend: GPU devfreq in sysfs for the clock, INA3221 rails (`ina3221.py`) for power.

Every path is read under `$DVFS_SYSFS_ROOT` (default `/`) so the backend runs on a fake tree in
tests and inside chroots. Writes go only to files inside the devfreq node that discovery found;
a file that resolves outside it (a planted symlink) is refused.

Which board: the module's P-number in the device tree's `compatible` names the profile (`board_profile`).
What the meter samples besides the rails: the GPU clock (BPMP's measured GPC clock where readable, as root, else
devfreq cur_freq, the clock requested), the GPU load and the EMC clock; at window edges, the board's over-current
throttling counters.

What a read of min_freq/max_freq says. devfreq's min_freq_show/max_freq_show print get_freq_range(): the table's
range narrowed by every PM QoS request on the GPU, the user's and a thermal cap's alike (torvalds/linux
drivers/devfreq/devfreq.c; nvgpu registers the GPU's devfreq as a cooling device, and drivers/thermal/
devfreq_cooling.c caps it through dev_pm_qos_update_request). So a read is never "the user's setting": restore writes
back the user-level range nvpmodel set, the current power mode's GPU MIN_FREQ/MAX_FREQ from etc/nvpmodel.conf (the
table's lowest and highest clock where no mode can be read), read at restore time, so `nvpmodel -m` during a session
stands. A max_freq read below that range's top when a session starts is a cap someone else holds (thermal, PM QoS,
an administrator): the session records it (`context["cap_at_start_mhz"]`). nvpmodel's GPU cap is that same max_freq
(NVIDIA's Orin nvpmodel template, mlcommons/inference_results_v3.0 closed/Neuchips/code/common/nvpmodel_orin.py,
maps `GPU MAX_FREQ` onto devfreq max_freq): a pin above it really runs above it, so it is refused unless the caller
allows it (`JetsonDevice(above_mode_cap=True)`, recorded as `context["above_mode_cap"]`).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DeviceNotFoundError, DevicePermissionError, DvfsError
from dvfs_mlops.hw import cpufreq, emc
from dvfs_mlops.hw.board import PowerMode
from dvfs_mlops.hw.cpufreq import CpuClocks
from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    PinnedSession,
    freq_label,
    parse_freq,
    parse_knob,
)
from dvfs_mlops.hw.emc import EmcClock, EmcTable
from dvfs_mlops.hw.ina3221 import Rail, find_rails
from dvfs_mlops.hw.meter import CLOCK_MEASURED, CLOCK_REQUESTED, ENERGY_SAMPLES, EnergyReport, KnobPins, PowerSampler
from dvfs_mlops.hw.pins import DomainPin, claim_all, restore_all
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


NVPMODEL_CONF = "etc/nvpmodel.conf"
NVPMODEL_STATUS = "var/lib/nvpmodel/status"
_MODE_HEAD = re.compile(r"\s*<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>")
_SECTION_HEAD = re.compile(r"\s*<\s*(\w+)")
_PARAM_HEAD = re.compile(r"\s*<\s*PARAM\s+TYPE=\w+\s+NAME=(\w+)\s*>")


_CPU_FILE = re.compile(r"/sys/devices/system/cpu/cpu(\d+)/cpufreq/scaling_(?:max|min)_freq$")


def _parse_conf(conf: str, mode_id: int | None) -> tuple[str | None, dict[tuple[str, str], int], dict[str, int], str | None,
                                                          list[int]]:
    """One pass over nvpmodel.conf: (the mode's name, its (knob, arg) -> value, each CPU clock PARAM's CPU number, the
    TPC_POWER_GATING file, every mode's EMC MAX_FREQ). A mode's values come from its own block only."""
    name: str | None = None
    found: dict[tuple[str, str], int] = {}
    param_cpu: dict[str, int] = {}
    tpc_file: str | None = None
    emc_caps: list[int] = []
    param: str | None = None
    current: int | None = None
    for line in conf.splitlines():
        if _SECTION_HEAD.match(line):
            head, param_head = _MODE_HEAD.match(line), _PARAM_HEAD.match(line)
            current = int(head.group(1)) if head else None
            if head and current == mode_id:
                name = head.group(2)
            param = param_head.group(1) if param_head else None
            continue
        words = line.split()
        if param == "TPC_POWER_GATING" and len(words) == 2 and words[0] == "TPC_PG_MASK":
            tpc_file = words[1]
        cpu = _CPU_FILE.search(words[1]) if param is not None and len(words) == 2 else None
        if cpu is not None and param is not None:
            param_cpu[param] = int(cpu.group(1))
        if current is not None and len(words) == 3 and re.fullmatch(r"-?\d+", words[2]):
            if current == mode_id:
                found[(words[0], words[1])] = int(words[2])
            if (words[0], words[1]) == ("EMC", "MAX_FREQ"):
                emc_caps.append(int(words[2]))
    return name, found, param_cpu, tpc_file, emc_caps


def read_power_mode(root: Path) -> PowerMode | None:
    """nvpmodel's current mode (var/lib/nvpmodel/status) and its GPU range, TPC mask, CPU ranges and EMC cap in
    etc/nvpmodel.conf.

    Read from the files nvpmodel itself keeps, so neither jtop nor the nvpmodel binary is needed. A mode's values come
    from its own `< POWER_MODEL ... >` block only (the PARAM section above the modes holds bare `MAX_FREQ /sys/...`
    lines too). The TPC mask is the live one where the PARAM section's TPC_POWER_GATING file is readable under `root`,
    else the mode's `TPC_POWER_GATING TPC_PG_MASK` (jetson-stats reads the same key: rbonghi/jetson_stats
    jtop/core/nvpmodel.py, TPC_POWER_GATING_RE). A CPU cluster's range is the mode's `<NAME> MIN_FREQ`/`MAX_FREQ` (kHz)
    for a clock PARAM whose files are a CPU's cpufreq scaling_min_freq/scaling_max_freq (NVIDIA's template: CPU_A78_<k>,
    the cluster's first CPU); the EMC cap the mode's `EMC MAX_FREQ` (Hz).

    Returns:
        The mode; None where either file is missing or the status names no mode.
    """
    try:
        status = (root / NVPMODEL_STATUS).read_text()
        conf = (root / NVPMODEL_CONF).read_text()
    except OSError:
        return None
    m = re.search(r"pmode:(\d+)", status)
    if not m:
        return None
    mode_id = int(m.group(1))
    name, found, param_cpu, tpc_file, _caps = _parse_conf(conf, mode_id)
    gpu_max, gpu_min = found.get(("GPU", "MAX_FREQ"), -1), found.get(("GPU", "MIN_FREQ"), 0)
    live = _live_tpc_mask(root, tpc_file)
    cpu_ranges = []
    for param, cpu in sorted(param_cpu.items(), key=lambda kv: kv[1]):
        lo, hi = found.get((param, "MIN_FREQ"), 0), found.get((param, "MAX_FREQ"), -1)
        if (param, "MIN_FREQ") in found or (param, "MAX_FREQ") in found:
            cpu_ranges.append((cpu, lo if lo > 0 else None, hi if hi > 0 else None))
    emc_max = found.get(("EMC", "MAX_FREQ"), 0)
    return PowerMode(mode_id, name or f"mode {mode_id}", gpu_max / 1e6 if gpu_max > 0 else None,
                     gpu_min / 1e6 if gpu_min > 0 else None,
                     live if live is not None else found.get(("TPC_POWER_GATING", "TPC_PG_MASK")), tuple(cpu_ranges),
                     emc_max / 1e6 if emc_max > 0 else None)


def modes_emc_caps_hz(root: Path) -> tuple[int, ...]:
    """Every power mode's EMC MAX_FREQ in nvpmodel.conf (Hz, the positive ones); () where there is no conf."""
    try:
        conf = (root / NVPMODEL_CONF).read_text()
    except OSError:
        return ()
    return tuple(sorted({c for c in _parse_conf(conf, None)[4] if c > 0}))


def _live_tpc_mask(root: Path, rel: str | None) -> int | None:
    """The TPC power-gating mask the GPU holds now (the PARAM section's file, under `root`); None where unreadable."""
    if not rel:
        return None
    try:
        return int(_read(root / rel.lstrip("/")), 0)
    except (OSError, ValueError):
        return None


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


class HeldFile:
    """A file of one number in Hz held open and read with pread at offset 0, in MHz: a sampler's cheap read.

    A read at offset 0 shows the value now on sysfs attributes and on debugfs seq_files alike: seq_read_iter resets a
    seq_file for a read "from zero offset" (torvalds/linux fs/seq_file.c), and BPMP's debugfs files are seq_files
    (drivers/firmware/tegra/bpmp-debugfs.c, bpmp_debug_fops: single_open_size, seq_read), so each pread asks BPMP anew.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = os.open(path, os.O_RDONLY)

    def __call__(self) -> float | None:
        value = _pread_int(self.fd)
        return value / 1e6 if value is not None else None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def emc_reader(root: Path) -> HeldFile | None:
    """A reader of the EMC clock (MHz) from the first `EMC_RATE_FILES` entry readable now, held open; None where none
    is. Close it when done."""
    for rel in EMC_RATE_FILES:
        path = root / rel
        if _read_hz_mhz(path) is not None:
            with contextlib.suppress(OSError):
                return HeldFile(path)
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


class KernelRefusedError(DvfsError):
    """The kernel refused a value written to the devfreq node (`errno` says why)."""

    def __init__(self, message: str, errno_: int | None):
        super().__init__(message)
        self.errno = errno_


class JetsonDevice:
    """A Jetson's GPU through its devfreq node (clock) and INA3221 rails (power); its CPU clocks through cpufreq
    (`cpufreq.CpuClocks`) and its memory clock through BPMP's debugfs (`emc.EmcClock`), the knobs a session may pin
    besides the GPU's.

    Args:
        node: the GPU's devfreq node (None: found under `root`).
        root: the sysfs root every path is read under (None: `$DVFS_SYSFS_ROOT`, default `/`).
        sample_hz: the meter thread's sampling rate.
        writer: performs each sysfs write (default: a plain write); tests pass a fake kernel's.
        above_mode_cap: allow a pin above the power mode's GPU, CPU or EMC cap (refused otherwise; recorded in the
            session's context).

    Raises:
        DeviceNotFoundError: no GPU devfreq node under `root`.
    """

    name = "jetson"
    simulated = False
    torch_device = "cuda"  # the Orin's integrated GPU is CUDA device 0

    def __init__(self, node: Path | None = None, root: Path | None = None, sample_hz: float = 50.0,
                 writer: Callable[[Path, str], None] | None = None, above_mode_cap: bool = False):
        self.root = root or sysfs_root()
        self._writer = writer or write_sysfs
        found = node or find_gpu_devfreq(self.root)
        if found is None:
            raise DeviceNotFoundError(f"no Jetson GPU devfreq node under {self.root}sys/class/devfreq; use --device sim or nvml")
        self.node = Path(found)
        self._node_real = Path(os.path.realpath(self.node))
        self.sample_hz = sample_hz
        self.above_mode_cap = above_mode_cap
        self.module = module_part_number(self.root)  # e.g. "p3701-0005"; None where the device tree does not say
        self.profile = board_profile(self.root)
        self.device_key = f"jetson-{self.node.name}"
        self.device_id = _board_serial(self.root) or self.device_key
        self.emc = EmcClock(self.root, self._writer)
        self._cpu: CpuClocks | None = None
        self._service_emc: list[float] | None = None

    # the CPU and memory clocks -----------------------------------------------------------------------------------------
    @property
    def cpu(self) -> CpuClocks:
        """The board's cpufreq policies (discovered once)."""
        if self._cpu is None:
            self._cpu = CpuClocks(self.root, self._writer)
        return self._cpu

    @property
    def cpu_frequencies_mhz(self) -> list[float]:
        """Every clock some cpufreq policy's table has ([] where the kernel shows none)."""
        return self.cpu.frequencies_mhz

    def emc_table(self) -> EmcTable | None:
        """BPMP's EMC table and its source (`emc.EmcClock.table`), None where this process cannot read debugfs."""
        if not self.emc.present():
            return None
        return self.emc.table(modes_emc_caps_hz(self.root))

    @property
    def emc_frequencies_mhz(self) -> list[float]:
        """The memory clocks a session can pin: BPMP's table read here (root), else the clock service's (which reads it
        as root), else [] (`emc_unavailable` says why)."""
        table = self.emc_table()
        if table is not None:
            return table.mhz
        if self._service_emc is None:
            from dvfs_mlops.hw.clockd.client import service_emc_table

            self._service_emc = service_emc_table()
        return list(self._service_emc)

    def emc_unavailable(self) -> str:
        """Why no memory clock can be pinned here, in one line with what to do."""
        if os.geteuid() != 0:
            from dvfs_mlops import settings

            return (f"setting the memory (EMC) clock needs root: BPMP's debugfs (/sys/kernel/debug) is root's, and no clock "
                    f"service listens at {settings.clockd_socket()}: install it once (sudo dvfs-mlops clockd install), or "
                    "run this command as root; drop --emc-freq to leave the memory clock alone")
        return (f"no BPMP EMC clock under {self.root / emc.EMC_CLK_DIR} (debugfs not mounted, or not a Jetson with BPMP): "
                "the memory clock cannot be pinned; drop --emc-freq")

    def cpu_unavailable(self) -> str:
        """Why no CPU clock can be pinned here, in one line with what to do."""
        return (f"no cpufreq policy under {self.root / cpufreq.CPUFREQ_DIR} (a kernel without cpufreq, or every cluster "
                "offline): the CPU clock cannot be pinned; drop --cpu-freq")

    def check_knobs(self, cpu_mhz: float | None, emc_mhz: float | None, mode: PowerMode | None,
                    refuse_above_cap: bool) -> dict[str, Any]:
        """Every check of the CPU and memory clocks before anything is written: each in its table, the EMC not below its
        floor (where this process can read it), neither above the power mode's cap unless `above_mode_cap` (or
        `refuse_above_cap` is False: the clock service pins what its client's session allowed).

        Returns:
            What the session records: "above_mode_cap" where a knob is above the mode's cap and allowed;
            "nvpmodel_cpu_max_mhz", "nvpmodel_emc_max_mhz" (the mode's caps).

        Raises:
            UnknownNameError: a clock not in its table. DvfsError: no such knob here, below the EMC floor, or above the
                mode's cap and not allowed, in one line each.
        """
        context: dict[str, Any] = {}
        if cpu_mhz is not None:
            if not self.cpu.policies:
                raise DvfsError(self.cpu_unavailable())
            targets = self.cpu.targets_khz(cpu_mhz)
            over = self.cpu.above_mode_cap(targets, mode)
            if over and self._cap_refused(f"{cpu_mhz:g} MHz is above the {min(over.values()):g} MHz CPU cap", mode,
                                          refuse_above_cap):
                context["above_mode_cap"] = True
            cap = self.cpu.mode_cap_mhz(mode)
            if cap is not None:
                context["nvpmodel_cpu_max_mhz"] = cap
        if emc_mhz is not None:
            table = self.emc_table()
            if table is not None:
                hz = self.emc.target_hz(emc_mhz, table)
                self.emc.check_floor(hz)
            elif not self.emc_frequencies_mhz:
                raise DvfsError(self.emc_unavailable())
            cap_hz = self.emc.cap_hz(mode)
            if cap_hz is not None:
                context["nvpmodel_emc_max_mhz"] = cap_hz / 1e6
                if emc_mhz > cap_hz / 1e6 + 0.5 and self._cap_refused(f"{emc_mhz:g} MHz is above the {cap_hz / 1e6:g} MHz "
                                                                      "EMC cap", mode, refuse_above_cap):
                    context["above_mode_cap"] = True
        return context

    def _cap_refused(self, what: str, mode: PowerMode | None, refuse: bool) -> bool:
        """A knob above the mode's cap: refused in one line unless allowed (True: allowed, recorded)."""
        label = mode.label if mode is not None else "?"
        if refuse and not self.above_mode_cap:
            raise DvfsError(f"{what} of power mode {label}; pin that or less, switch the mode (sudo nvpmodel -m <id>), "
                            "or pass --above-mode-cap to run above the mode's power budget on purpose")
        log.warning("%s of power mode %s (--above-mode-cap): the board leaves the mode's power budget", what, label)
        return True

    def restore_cpu_settings(self, settings: dict[str, Any]) -> None:
        """Put back the CPU journal's policies at the user-level range of the mode in force now (`CpuClocks`)."""
        self.cpu.restore_settings(settings, self.power_mode())

    # reading -----------------------------------------------------------------------------------
    def _file(self, name: str) -> Path:
        return self.node / name

    def read(self, name: str) -> str:
        return _read(self._file(name))

    @property
    def frequencies_mhz(self) -> list[float]:
        return sorted(int(x) / 1e6 for x in self.read("available_frequencies").split())

    def _table_hz(self) -> list[int]:
        return sorted(int(x) for x in self.read("available_frequencies").split())

    def current_range_hz(self) -> tuple[int, int]:
        """min_freq and max_freq as devfreq shows them: every limit on the GPU together (module doc), not the user's."""
        return int(self.read("min_freq")), int(self.read("max_freq"))

    def user_range_hz(self, mode: PowerMode | None = None) -> tuple[int, int]:
        """The user-level range restore puts back: the power mode's GPU MIN_FREQ/MAX_FREQ within the table (no limit: the
        table's end), or the table's lowest and highest clock where no mode can be read.

        Args:
            mode: the power mode (None: read it now).
        """
        table = self._table_hz()
        mode = mode or self.power_mode()
        lo, hi = table[0], table[-1]
        if mode is not None and mode.gpu_min_mhz is not None:
            lo = min(max(round(mode.gpu_min_mhz * 1e6), table[0]), table[-1])
        if mode is not None and mode.gpu_max_mhz is not None:
            hi = min(max(round(mode.gpu_max_mhz * 1e6), table[0]), table[-1])
        return min(lo, hi), hi

    def cap_at_start_mhz(self, mode: PowerMode | None = None) -> float | None:
        """A cap someone else holds now: max_freq read below the top of `user_range_hz` (a thermal or PM QoS cap, an
        administrator's limit), in MHz; None where the read is the range's top (or unreadable)."""
        try:
            read = int(self.read("max_freq"))
        except (OSError, ValueError):
            return None
        return read / 1e6 if read < self.user_range_hz(mode)[1] - 500_000 else None

    def current_mhz(self) -> float | None:
        """The clock the GPU runs at now (devfreq cur_freq), not the one requested."""
        try:
            return int(self.read("cur_freq")) / 1e6
        except (OSError, ValueError):
            return None

    def settings(self) -> dict[str, Any]:
        """What a journal records: the node, the user-level range restore writes (`user_range_hz`), the governor, and the
        range as read (`read_min_freq`, `read_max_freq`: every limit together, for the record only)."""
        lo, hi = self.user_range_hz()
        s: dict[str, Any] = {"node": str(self.node), "min_freq": str(lo), "max_freq": str(hi),
                             "read_min_freq": self.read("min_freq"), "read_max_freq": self.read("max_freq")}
        with contextlib.suppress(OSError):
            s["governor"] = self.read("governor")
        return s

    def gpu_load_pct(self) -> float | None:
        try:
            return int(_read(self.node / "device/load")) / 10.0  # per mille
        except (OSError, ValueError):
            return None

    def power_mode(self) -> PowerMode | None:
        """The power mode nvpmodel set (`read_power_mode`); None where the board has no nvpmodel files."""
        return read_power_mode(self.root)

    def conditions(self) -> dict[str, Any]:
        """What else sets the speed: GPU temperature and EMC clock (each where present)."""
        out: dict[str, Any] = {}
        temp = read_gpu_temp_c(self.root)
        if temp is not None:
            out["gpu_temp_c"] = temp
        emc = read_emc_mhz(self.root)
        if emc is not None:
            out["emc_mhz"] = emc
        return out

    def start_context(self, mode: PowerMode | None) -> dict[str, Any]:
        """What a session records before anything is written: the power mode and a cap held at the start."""
        out: dict[str, Any] = {}
        if mode is not None:
            out["nvpmodel_mode"] = mode.label
            if mode.gpu_max_mhz is not None:
                out["nvpmodel_gpu_max_mhz"] = mode.gpu_max_mhz
            if mode.tpc_pg_mask is not None:
                out["nvpmodel_tpc_pg_mask"] = mode.tpc_pg_mask
        cap = self.cap_at_start_mhz(mode)
        if cap is not None:
            out["cap_at_start_mhz"] = cap
        return out

    def check_mode_cap(self, mhz: float, mode: PowerMode | None) -> bool:
        """Whether a pin at `mhz` is above the power mode's GPU cap, refused unless `above_mode_cap` allows it.

        Returns:
            True where it is above the cap and allowed (the session records it); False where it is not above.

        Raises:
            DvfsError: above the cap and not allowed, in one line, before anything is written.
        """
        if mode is None or not mode.above_cap(mhz):
            return False
        if not self.above_mode_cap:
            raise DvfsError(f"{mhz:g} MHz is above the {mode.gpu_max_mhz:g} MHz GPU cap of power mode {mode.label}; pin "
                            f"{mode.gpu_max_mhz:g} MHz or less, switch the mode (sudo nvpmodel -m <id>), or pass "
                            "--above-mode-cap to run above the mode's power budget on purpose")
        log.warning("pinning %g MHz above the %g MHz GPU cap of power mode %s (--above-mode-cap): the board leaves the "
                    "mode's power budget", mhz, mode.gpu_max_mhz, mode.label)
        return True

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
            raise KernelRefusedError(f"the kernel refused {value} for {path}: {e.strerror or e}", e.errno) from None

    def clock_writable(self) -> bool:
        """Whether this process may write the node's clock range itself (root, or a udev rule granting write)."""
        return all(os.access(self._file(n), os.W_OK) for n in ("min_freq", "max_freq"))

    def write_range(self, min_hz: int, max_hz: int) -> None:
        """Set the user's [min, max] request, in an order that keeps the user's min <= max at every moment (the kernel
        refuses otherwise, before Linux 5.7).

        The order comes from the range read now: raising (min above the max read) writes max first, else min first. The
        read aggregates every limit (module doc), so under a cap it can suggest the wrong order: a first write the
        kernel refuses with EINVAL is then made in the other order.

        Raises:
            DevicePermissionError, DvfsError: a write failed; its `partial` says whether one write went through before.
        """
        _cur_min, cur_max = self.current_range_hz()
        order = [("max_freq", max_hz), ("min_freq", min_hz)] if min_hz > cur_max else [("min_freq", min_hz), ("max_freq", max_hz)]
        try:
            try:
                self._write(order[0][0], str(order[0][1]))
            except KernelRefusedError as e:
                if e.errno != errno.EINVAL:
                    raise
                order.reverse()
                self._write(order[0][0], str(order[0][1]))
        except DvfsError as e:
            e.partial = False  # type: ignore[attr-defined]  # nothing was written
            raise
        try:
            self._write(order[1][0], str(order[1][1]))
        except DvfsError as e:
            e.partial = True  # type: ignore[attr-defined]  # the first write went through
            raise

    def restore_settings(self, settings: dict[str, Any]) -> None:
        """Put back the user-level range as it is now (`user_range_hz`: the mode in force at restore, so an `nvpmodel -m`
        made during the session stands) and the governor the journal found."""
        self.write_range(*self.user_range_hz())
        gov = settings.get("governor")
        with contextlib.suppress(OSError, DvfsError):
            if gov and self.read("governor") != gov:
                self._write("governor", gov)

    # API ---------------------------------------------------------------------------------------
    def session(self, freq: FreqRequest, observe: bool = False, label: str = "", *, cpu_mhz: float | None = None,
                emc_mhz: float | None = None) -> JetsonSession:
        """A session at `freq`, and at `cpu_mhz` and `emc_mhz` where given (`label` names the measurement; real hardware
        needs nothing of it).

        Raises:
            UnknownNameError: a clock not in its table. DvfsError: a knob this board (or this user) cannot set, in one
                line, before anything is touched.
        """
        if cpu_mhz is not None:
            if not self.cpu_frequencies_mhz:
                raise DvfsError(self.cpu_unavailable())
            cpu_mhz = parse_knob(cpu_mhz, self.cpu_frequencies_mhz, "cpu_mhz")
        if emc_mhz is not None:
            table = self.emc_frequencies_mhz
            if not table:
                raise DvfsError(self.emc_unavailable())
            emc_mhz = parse_knob(emc_mhz, table, "emc_mhz")
        return JetsonSession(self, parse_freq(freq, self.frequencies_mhz), observe=observe, cpu_mhz=cpu_mhz, emc_mhz=emc_mhz)

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
        mode = self.power_mode()
        detail = {"devfreq": str(self.node), "serial": self.device_id, **self.conditions(), **self.start_context(mode)}
        if self.module is not None:
            detail["module"] = self.module
        cpu = self.cpu_frequencies_mhz
        detail["cpu_frequencies"] = (f"{', '.join(f'{f:g}' for f in cpu)} MHz ({len(self.cpu.policies)} cpufreq policies: "
                                     f"{', '.join(p.name for p in self.cpu.policies)})") if cpu else self.cpu_unavailable()
        table = self.emc_table()
        if table is not None:
            detail["emc_frequencies"] = f"{', '.join(f'{f:g}' for f in table.mhz)} MHz (from {table.source})"
        elif self.emc_frequencies_mhz:
            detail["emc_frequencies"] = f"{', '.join(f'{f:g}' for f in self.emc_frequencies_mhz)} MHz (from the clock service)"
        else:
            detail["emc_frequencies"] = self.emc_unavailable()
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
    """This process's own pin of a Jetson's clocks: the GPU's devfreq range, and the CPU's cpufreq policies and BPMP's
    EMC clock where asked; each domain its own lock and journal (`pins.DomainPin`), restored to what it found.

    The one place the Jetson pin is spelt out: a session running as root uses it, and so does the clock service
    (`clockd.server`) for its clients, journalling the client's PID and uid. Every domain's lock is claimed before any
    write, so a domain someone else holds refuses the pin with nothing touched.

    Args:
        device: the Jetson whose clocks are pinned.
        owner_pid: the PID the journals name (None: this process).
        owner_uid: the uid the journals name (None: this process's).
    """

    def __init__(self, device: JetsonDevice, owner_pid: int | None = None, owner_uid: int | None = None):
        self.device = device
        owner = (owner_pid, owner_uid)
        self._gpu = DomainPin("jetson", device.device_key, device.settings, device.restore_settings, owner)
        self._cpu = DomainPin(cpufreq.JOURNAL_BACKEND, cpufreq.DOMAIN_KEY, lambda: device.cpu.settings(device.power_mode()),
                              device.restore_cpu_settings, owner)
        self._emc = DomainPin(emc.JOURNAL_BACKEND, emc.DOMAIN_KEY, device.emc.settings, device.emc.restore_settings, owner)
        self._domains: list[DomainPin] = []
        self._cpu_targets: dict[str, int] = {}

    @property
    def held(self) -> bool:
        return self._gpu.held

    @property
    def domain_keys(self) -> list[str]:
        """The keys of the domains this pin holds (GPU first)."""
        return [d.key for d in self._domains]

    def _plan(self, cpu_mhz: float | None, emc_mhz: float | None) -> tuple[dict[str, Any], dict[str, int], int | None]:
        """Every check before anything is touched (`JetsonDevice.check_knobs`, the cap only flagged): (context, each
        policy's CPU target, the EMC rate)."""
        dev = self.device
        context = dev.check_knobs(cpu_mhz, emc_mhz, dev.power_mode(), refuse_above_cap=False)
        targets = dev.cpu.targets_khz(cpu_mhz) if cpu_mhz is not None else {}
        emc_hz = None
        if emc_mhz is not None:
            table = dev.emc_table()
            if table is None:
                raise DvfsError(dev.emc_unavailable())
            emc_hz = dev.emc.target_hz(emc_mhz, table)
        return context, targets, emc_hz

    def pin(self, freq: FreqRequest, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Claim the domains asked for, journal each before its first write, pin `freq` ("maxn": write nothing on the
        GPU) and the CPU and memory clocks where given.

        Returns:
            What the session logs besides energy: {"above_mode_cap": True} where a clock is above the power mode's cap
            (whoever asked for it: a session refuses that unless its device allows it), "cpu_khz_by_policy" (each
            policy's clock) where the CPU clock was pinned, the mode's CPU and EMC caps.

        Raises:
            DeviceBusyError: another process holds a domain (nothing is touched). UnknownNameError, DvfsError: a knob's
                clock is not in its table or below the EMC floor (nothing is touched), or a write failed.
        """
        dev = self.device
        context, targets, emc_hz = self._plan(cpu_mhz, emc_mhz)
        domains = [self._gpu, *([self._cpu] if targets else []), *([self._emc] if emc_hz is not None else [])]
        claim_all(domains)
        self._domains = domains
        self._gpu.record(freq_label(freq))  # before any write
        if freq != MAXN:
            hz = self._table_hz(float(freq))
            mode = dev.power_mode()
            # Always written: a read that equals the pin may be a cap's, not the user's request (module doc).
            self._gpu.write(lambda: dev.write_range(hz, hz))
            if mode is not None and mode.above_cap(hz / 1e6):
                context["above_mode_cap"] = True
        if targets:
            self._pin_cpu(targets, cpu_mhz)
            context["cpu_khz_by_policy"] = ",".join(f"{k}:{v}" for k, v in targets.items())
        if emc_hz is not None:
            self._emc.record(f"{emc_hz / 1e6:g}")
            self._emc.write(lambda: dev.emc.pin(emc_hz))
        return context

    def _pin_cpu(self, targets: dict[str, int], cpu_mhz: float | None) -> None:
        self._cpu_targets = targets
        if not self._cpu.recorded:
            self._cpu.record(f"{cpu_mhz:g}")
        self._cpu.write(lambda: self.device.cpu.pin(targets))

    def _table_hz(self, mhz: float) -> int:
        table_hz = [int(x) for x in self.device.read("available_frequencies").split()]
        return min(table_hz, key=lambda h: abs(h / 1e6 - mhz))

    def repin(self, mhz: float) -> None:
        """Another GPU clock of the table; the journal still holds the range found before the first pin."""
        hz = self._table_hz(mhz)
        self._gpu.write(lambda: self.device.write_range(hz, hz))

    def repin_knobs(self, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Move the CPU and memory clocks (None: leave that one as it is). A domain not pinned before is claimed and
        journalled first, so its restore puts back what it found before this move.

        Returns:
            What the session logs (as `pin`).

        Raises:
            DeviceBusyError: another process holds a domain asked for. UnknownNameError, DvfsError: as `pin`.
        """
        dev = self.device
        context, targets, emc_hz = self._plan(cpu_mhz, emc_mhz)
        new = [d for d, asked in ((self._cpu, bool(targets)), (self._emc, emc_hz is not None)) if asked and d not in self._domains]
        claim_all(new)
        self._domains += new
        if targets:
            self._pin_cpu(targets, cpu_mhz)
            context["cpu_khz_by_policy"] = ",".join(f"{k}:{v}" for k, v in targets.items())
        if emc_hz is not None:
            if not self._emc.recorded:
                self._emc.record(f"{emc_hz / 1e6:g}")
                self._emc.write(lambda: dev.emc.pin(emc_hz))
            else:
                self._emc.write(lambda: dev.emc.move(emc_hz))
        return context

    def restore(self) -> None:
        """Put back every domain this pin holds, EMC first, GPU last (`pins.restore_all`: each domain's own journal is
        kept where its restore failed, the others are still restored); a no-op when nothing is held. A maxn pin wrote
        nothing on the GPU and writes nothing back there.

        Raises:
            RestoreFailedError: a domain's restore failed (its journal is kept, every lock released).
        """
        domains, self._domains = self._domains or [self._gpu], []
        restore_all(domains)


class JetsonSession(PinnedSession):
    """Pin devfreq [f, f] (and the CPU policies and the EMC clock where asked); meter the INA3221 rails, GPU load, the
    GPU clock, the EMC clock (and each CPU policy's clock where pinned); restore the user-level ranges.

    "maxn" writes nothing: the board's default is whatever range nvpmodel left, and opening the
    full table would override a lower power mode's cap. Who writes: this process as root (`JetsonPin`), else the
    clock service where one runs (`clockd.client.route_pin`); metering stays in this process either way (the EMC rate,
    debugfs, through the service where this process cannot read it). Before anything is written the session reads the
    power mode once (`power_mode`) and a cap held at the start (`context["cap_at_start_mhz"]`), and refuses a pin above
    the mode's GPU, CPU or EMC cap unless the device allows it.
    """

    device: JetsonDevice

    def __init__(self, device: JetsonDevice, freq: FreqRequest, observe: bool = False, *, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None):
        super().__init__(device, freq, observe=observe, cpu_mhz=cpu_mhz, emc_mhz=emc_mhz)
        self._cpu_close: Callable[[], None] | None = None
        self._sampler: PowerSampler | None = None
        self._rails: list[Rail] = []
        self._fds: list[int] = []
        self._held_files: list[HeldFile] = []
        self._oc_read: Callable[[], int | None] | None = None
        self._oc_at: dict[int, int | None] = {}  # sample index of a window edge -> throttling counter total there
        self.power_mode: PowerMode | None = None  # read once, when the session starts
        self._started = False

    def _new_pin(self) -> Any:
        from dvfs_mlops.hw.clockd.client import route_pin

        dev = self.device
        knobs = self.knobs()

        def writable() -> bool:
            return dev.clock_writable() and ("cpu_mhz" not in knobs or dev.cpu.writable()) and \
                ("emc_mhz" not in knobs or dev.emc.writable())

        what = "the GPU clock" + "".join(f" and the {name}" for knob, name in (("cpu_mhz", "CPU clock"),
                                                                            ("emc_mhz", "memory (EMC) clock")) if knob in knobs)
        return route_pin("jetson", lambda: JetsonPin(dev), writable=writable, what=what)

    def _read_start(self) -> None:
        """The power mode and a cap held now, once, before anything is written."""
        if not self._started:
            self._started = True
            self.power_mode = self.device.power_mode()
            self.context.update(self.device.start_context(self.power_mode))

    def _apply(self) -> None:
        self._read_start()
        if self.pinned_mhz is not None and self.device.check_mode_cap(self.pinned_mhz, self.power_mode):
            self.context["above_mode_cap"] = True
        if self.knobs():
            self.context.update(self.device.check_knobs(self.pinned_cpu_mhz, self.pinned_emc_mhz, self.power_mode,
                                                        refuse_above_cap=True))
        super()._apply()

    def _repin(self, mhz: float) -> None:
        if self.device.check_mode_cap(mhz, self.power_mode):
            self.context["above_mode_cap"] = True
        super()._repin(mhz)

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        self.context.update(self.device.check_knobs(cpu_mhz, emc_mhz, self.power_mode, refuse_above_cap=True))
        super()._repin_knobs(cpu_mhz, emc_mhz)
        if self._sampler is not None:  # later windows are judged against the new pins
            if cpu_mhz is not None and self._cpu_close is None:  # the CPU clock pinned the first time: read it from here on
                read_cpu, self._cpu_close, self.context["cpu_clock_source"] = self.device.cpu.reader(measured=True)
                self._sampler.read_cpu_from(read_cpu)
            self._sampler.knobs = self._knob_pins(cpu_mhz if cpu_mhz is not None else self.pinned_cpu_mhz,
                                                  emc_mhz if emc_mhz is not None else self.pinned_emc_mhz)

    def _knob_pins(self, cpu_mhz: float | None, emc_mhz: float | None) -> KnobPins | None:
        """The CPU and memory clocks pinned, each policy's with its own table, for the meter's judgement."""
        if cpu_mhz is None and emc_mhz is None:
            return None
        cpu = self.device.cpu
        targets = cpu.targets_khz(cpu_mhz) if cpu_mhz is not None else {}
        cpu_pins = tuple((targets[p.name] / 1000.0, p.table_mhz) for p in cpu.policies) if targets else ()
        emc_pin = (emc_mhz, tuple(self.device.emc_frequencies_mhz)) if emc_mhz is not None else None
        return KnobPins(cpu_pins, emc_pin)

    def _start_meter(self) -> None:
        dev = self.device
        self._read_start()
        self.context.update(dev.conditions())
        self.context["energy_source"] = ENERGY_SAMPLES  # the INA3221 rails, integrated
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
        emc_read = emc_reader(dev.root)
        self._held_files = [emc_read] if emc_read is not None else []
        read_emc = emc_read or self._relayed_emc_reader()  # debugfs: as root, or the service's read
        read_cpu = None
        if self.pinned_cpu_mhz is not None:
            read_cpu, self._cpu_close, source = dev.cpu.reader(measured=True)
            self.context["cpu_clock_source"] = source
        self._sampler = PowerSampler(lambda: [read() for read in readers], [r.name for r in self._rails], read_load, dev.sample_hz,
                                     read_clock=read_clock, clock_source=self.context["clock_source"], read_emc=read_emc,
                                     read_cpu=read_cpu, knobs=self._knob_pins(self.pinned_cpu_mhz, self.pinned_emc_mhz))
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

    def _mark(self) -> int:
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
        for held in self._held_files:
            held.close()
        if self._cpu_close is not None:
            self._cpu_close()
        self._fds, self._held_files, self._cpu_close = [], [], None
        report = self._sampler.report(**self._judge())
        last = report.samples - 1
        self._oc_edge(last)
        report.oc_throttle_events = self._oc_events(0, last)
        if report.oc_throttle_events is not None:
            self.context["oc_throttle_events"] = report.oc_throttle_events
        if report.emc_mhz is not None:
            self.context["emc_mhz"] = report.emc_mhz  # the session's mean, not one read before it
        return report

    def _window_report(self, start: int, end: int) -> EnergyReport:
        assert self._sampler is not None
        report = self._sampler.report(start, end, **self._judge())
        report.oc_throttle_events = self._oc_events(start, end)
        return report

    def _judge(self) -> dict[str, Any]:
        """Per-sample clock_held needs the pinned clock and the table."""
        return {"pinned_mhz": self.pinned_mhz, "table_mhz": self.device.frequencies_mhz}
