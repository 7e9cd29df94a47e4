"""A fake `pynvml` (nvidia-ml-py) with the real module's names, return types and error classes, and a fake CUDA
runtime (`FakeCuda`: what `torch.cuda` reports on a CUDA build) that sees the same GPUs.

Every behaviour below follows a source, cited beside it; where no source says how the hardware behaves, the fake
does the least it can and says so. The sources:

- [NVML] NVIDIA's NVML API reference, https://docs.nvidia.com/deploy/nvml-api/ (nvml.h), and nvidia-ml-py's
  pynvml.py (13.615) for the Python names, return types and constants.
- [REASONS] NVML "ClocksEventReasons", https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html
  (the nvml.h comment of each bit is quoted beside it below).
- [CUDAJL] CUDA.jl's NVML clock-query work, https://github.com/JuliaGPU/CUDA.jl/pull/2194: a GPU whose clocks were
  locked with `nvidia-smi` read 915 MHz with every event reason clear, ApplicationsClocksSetting and GpuIdle included;
  after a reboot (no lock) the idle GPU read GpuIdle.
- [CUDA-ENV] CUDA Programming Guide, "CUDA Environment Variables",
  https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html (CUDA_VISIBLE_DEVICES)
  and the CUDA C++ Programming Guide's table of the same name (CUDA_DEVICE_ORDER: FASTEST_FIRST, the default, or
  PCI_BUS_ID).
- [TORCH] PyTorch: torch/cuda/__init__.py (`_parse_visible_devices`, `_transform_uuid_to_ordinals`: how torch reads
  CUDA_VISIBLE_DEVICES as CUDA does) and torch/csrc/cuda/Module.cpp (`_CUuuid.__str__`: the 16 UUID bytes as
  8-4-4-4-12 hex, no GPU-/MIG- prefix).
- [CUUUID] CUDA driver API, cuDeviceGetUuid_v2: "If the device is in MIG mode, returns its MIG UUID".
- [CUPTI] CUPTI Clock Control API, https://docs.nvidia.com/cupti/api/group__CUPTI__CLOCK__CONTROL__API.html: clock
  locking is device-global and "not supported ... such as MIG-partitioned devices".
- [ZEUS] Zeus (ml-energy/zeus) zeus/monitor/power.py, infer_counter_update_period: NVML's power and energy counters
  "can update as slow as 10 Hz depending on the GPU model"; a reading holds its value between updates, so the counter
  advances in steps (zeus/monitor/energy.py warns where a window's energy reads zero).
- [MEMCLK] NVML nvmlDeviceGetSupportedMemoryClocks ("the list of possible memory clocks that can be used as an argument
  for nvmlDeviceSetMemoryLockedClocks"), nvmlDeviceSetMemoryLockedClocks ("Set memory clocks that device will lock to
  ... in the range of minMemClockMHz to maxMemClockMHz ... Requires root/admin permissions. After system reboot or
  driver reload memory clocks go back to their default value ... For Ampere or newer fully supported devices") and
  nvmlDeviceResetMemoryLockedClocks ("Resets the memory clock to the default value"); nvmlDeviceGetClockInfo with
  NVML_CLOCK_MEM reads the memory clock. An A100's HBM lists one memory clock (1215 MHz, the fake's default); a GPU
  with several is made with `mem_clocks`.
- [PROC] NVML nvmlDeviceGetComputeRunningProcesses: "Get information about processes with a compute context on a
  device ... (e.g. CUDA application which have active context)"; "the number of elements might change in time";
  nvidia-ml-py returns c_nvmlProcessInfo_t structs (pid, usedGpuMemory, gpuInstanceId, computeInstanceId). A
  process's context ends with the process, and so does its entry.

Several processes (each rank of a `torchrun` job, `dvfs-mlops run` and its child) see one set of fake GPUs through a
state file (`write_shared_state`, `shared_module`, and the `nvml_shim/pynvml.py` a child imports as `pynvml`): a clock
lock and every lock/reset call are the GPU's, not the process's ([NVML] nvmlDeviceSetGpuLockedClocks "Sets the clocks
that the device will be running at" and "After system reboot or driver reload GPU clocks go back to their default
value": the lock outlives the process that set it; [CUPTI] "Clock locking is device-global — affects all contexts on
the GPU"). Each process integrates its own energy counter
from the GPU's power level (a counter's differences are what a meter reads).

Real behaviour mimicked: `NVMLError(value)` instantiates the subclass registered for that value
(`NVMLError_NoPermission`, `NVMLError_NotSupported`, ...); calls before `nvmlInit` raise
NVML_ERROR_UNINITIALIZED; clocks are ints in MHz; energy is a monotonically increasing mJ counter that advances in
steps of `energy_period_s` ([ZEUS]: 0.1 s, the slow end, by default; 0 makes it continuous); power is in mW;
utilisation is a struct with `.gpu` and `.memory`; the compute processes are the live PIDs with a context on the GPU
([PROC]).
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
import types
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0x0  # [NVML] nvmlDeviceGetMigMode: current/pending mode values
NVML_DEVICE_MIG_ENABLE = 0x1
NVML_DEVICE_ARCH_VOLTA = 5  # [NVML] nvmlDeviceArchitecture_t (pynvml's values)
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9
# [NVML] nvml.h field ids: "NVML_FI_DEV_POWER_AVERAGE 185: GPU power averaged over 1 sec interval, supported on Ampere
# (except GA100) or newer architectures"; "NVML_FI_DEV_POWER_INSTANT 186: Current GPU power, supported on all
# architectures", both in milliwatts.
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_DOUBLE = 0  # [NVML] nvmlValueType_t: which member of the value union holds a field's value
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
# [REASONS] the clocks event reason bits, each with the nvml.h text it follows in `_clock` below
nvmlClocksEventReasonGpuIdle = 0x1  # "Nothing is running on the GPU and the clocks are dropping to Idle state"
nvmlClocksEventReasonApplicationsClocksSetting = 0x2  # "GPU clocks are limited by current setting of applications clocks"
nvmlClocksEventReasonSwPowerCap = 0x4  # "The clocks have been optimized to ensure not to exceed currently set power limits"
nvmlClocksEventReasonHwSlowdown = 0x8  # "HW Slowdown (reducing the core clocks by a factor of 2 or more) is engaged"
nvmlClocksEventReasonSyncBoost = 0x10  # "This GPU has been added to a Sync boost group ... will boost to the minimum possible clocks across the entire group"
nvmlClocksEventReasonSwThermalSlowdown = 0x20  # "current clocks have been optimized to ensure ... temperature does not exceed ... Max Operating Temperature"
nvmlClocksEventReasonHwThermalSlowdown = 0x40  # "HW Thermal Slowdown (reducing the core clocks by a factor of 2 or more) is engaged"
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80  # "HW Power Brake Slowdown (reducing the core clocks by a factor of 2 or more) is engaged"
nvmlClocksEventReasonDisplayClockSetting = 0x100  # "GPU clocks are limited by current setting of Display clocks"
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2  # the older name, still exported

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
}


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls == NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, f"Unknown Error {self.value}")

    def __eq__(self, other: object) -> bool:
        return getattr(other, "value", None) == self.value

    __hash__ = Exception.__hash__


def _subclass(name: str, value: int) -> type:
    def new(typ, *args):
        obj = NVMLError.__new__(typ, value)
        return obj

    cls = type("NVMLError_" + name, (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[value] = cls
    return cls


NVMLError_Uninitialized = _subclass("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _subclass("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int):
        self.gpu = gpu
        self.memory = memory


class c_nvmlValue_t:
    """[NVML] the value union of a field value: every integer view holds the same number, as a C union of a small
    positive value does."""

    def __init__(self, number: int):
        self.uiVal = self.ulVal = self.ullVal = self.sllVal = self.siVal = self.usVal = int(number)
        self.dVal = float(number)


class c_nvmlProcessInfo_t:
    """[PROC] one process with a compute context on the GPU."""

    def __init__(self, pid: int, used_gpu_memory: int = 0):
        self.pid = pid
        self.usedGpuMemory = used_gpu_memory
        self.gpuInstanceId = 0xFFFFFFFF  # not a MIG device
        self.computeInstanceId = 0xFFFFFFFF


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a context ends with its process, [PROC]); a zombie has ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class c_nvmlFieldValue_t:
    """[NVML] nvmlFieldValue_t: fieldId, scopeId, the per-field nvmlReturn, valueType and value."""

    def __init__(self, field_id: int, scope_id: int, ret: int, value: int = 0):
        self.fieldId, self.scopeId, self.nvmlReturn = field_id, scope_id, ret
        self.valueType = NVML_VALUE_TYPE_UNSIGNED_INT  # milliwatts, unsigned like nvmlDeviceGetPowerUsage's
        self.value = c_nvmlValue_t(value)
        self.timestamp = int(time.time() * 1e6)
        self.latencyUsec = 0


_UUIDS = itertools.count(1)


def _new_uuid(prefix: str = "GPU") -> str:
    """A distinct UUID in nvidia-smi's format (prefix, then 8-4-4-4-12 hex), distinct from its first hex digits on."""
    n = next(_UUIDS)
    return f"{prefix}-{(0x6b1f0c2e + n * 0x10203041) & 0xFFFFFFFF:08x}-8a1d-4c3b-9f6e-{n:012x}"


class FakeMig:
    """A MIG device (a compute instance of a GPU instance): [NVML] nvmlDeviceGetUUID on a MIG handle returns its own
    globally unique UUID; [CUUUID] CUDA reports that MIG UUID for it."""

    def __init__(self, parent: FakeGPU, uuid: str | None = None):
        self.parent = parent
        self.uuid = uuid or _new_uuid("MIG")


class FakeGPU:
    """One GPU. What a test may set, each read back through the NVML calls as the cited source says:

    locked: a locked clock range (nvmlDeviceSetGpuLockedClocks / nvidia-smi -lgc); it governs the clock and raises no
        event reason ([CUDAJL]); NVML has no call that reads it back.
    mem_clocks: the memory clocks the GPU lists ([MEMCLK]); mem_locked: a locked memory clock range
        (nvmlDeviceSetMemoryLockedClocks), which the memory clock then reads (its top).
    app_clock_mhz: application clocks someone set (nvmlDeviceSetApplicationsClocks / nvidia-smi -ac), else None;
        app_clocks_api False makes their getters answer NOT_SUPPORTED.
    running: work is running on the GPU (False: GpuIdle, the clock drops to the idle clock).
    cap_mhz, power_cap_mhz, sync_boost_mhz, display_clock_mhz: the clock SW thermal slowdown, the SW power cap, a sync
        boost group or the display clock setting holds it at (None: none does).
    hw_slowdown: "thermal" or "power_brake" (HW slowdown engaged: the clock at half or less), or None.
    power_mw: the draw now (setting it starts a new level; nvmlDeviceGetPowerUsage averages it over 1 s where NVML says so).
    instant_power: the driver answers NVML_FI_DEV_POWER_INSTANT.
    mig: MIG mode enabled, with `mig_devices`.
    energy_period_s: the energy counter's update period ([ZEUS]; 0: it follows every read); energy_stalled: it stops.
    processes: PIDs with a compute context on the GPU ([PROC]: those still running are listed);
        process_list_api False makes nvmlDeviceGetComputeRunningProcesses answer NOT_SUPPORTED.
    """

    def __init__(self, name: str = "NVIDIA A100-SXM4-40GB", power_mw: int = 250_000, energy_counter: bool = True,
                 uuid: str | None = None, architecture: int = NVML_DEVICE_ARCH_AMPERE, ga100: bool | None = None,
                 energy_period_s: float = 0.1, mem_clocks: list[int] | None = None):
        self.name = name
        self.mem_clocks = list(mem_clocks) if mem_clocks else [1215]  # descending where several, as NVML lists them
        self.mem_locked: tuple[int, int] | None = None
        self.graphics_clocks = list(range(1410, 200, -15))  # descending, as NVML returns them
        self.idle_clock_mhz = min(self.graphics_clocks)
        self.locked: tuple[int, int] | None = None
        self.app_clock_mhz: int | None = None
        self.default_app_clock_mhz = max(self.graphics_clocks)  # the fake's factory default (no source gives A100's)
        self.app_clocks_api = True  # the applications clock getters answer (False: a GPU NVML does not fully support)
        self.running = True
        self.energy_counter = energy_counter
        self.util = 87
        self.permission = True
        self.uuid = uuid or _new_uuid()
        self.architecture = architecture
        self.ga100 = ("A100" in name) if ga100 is None else ga100
        self.cap_mhz: int | None = None  # SW thermal slowdown holding the clock below the lock
        self.power_cap_mhz: int | None = None
        self.sync_boost_mhz: int | None = None
        self.display_clock_mhz: int | None = None
        self.hw_slowdown: str | None = None
        self.instant_power = True
        self.mig = False
        self.mig_devices: list[FakeMig] = []
        self.temperature_c = 41
        self.energy_period_s = energy_period_s
        self.energy_stalled = False
        self.processes: list[int] = []
        self.process_list_api = True
        self._stalled_mj: int | None = None
        self._t0 = time.monotonic()
        self._power: list[tuple[float, int]] = [(self._t0 - 10.0, int(power_mw))]  # (since, mW) levels
        self.calls: list[tuple] = []

    @property
    def power_mw(self) -> int:
        return self._power[-1][1]

    @power_mw.setter
    def power_mw(self, mw: int) -> None:
        self._power.append((time.monotonic(), int(mw)))

    def _energy_between(self, t0: float, t1: float) -> float:
        """mJ drawn between two monotonic times (the power levels integrated)."""
        total = 0.0
        for (since, mw), (until, _) in itertools.pairwise([*self._power, (float("inf"), 0)]):
            lo, hi = max(since, t0), min(until, t1)
            if hi > lo:
                total += (hi - lo) * mw
        return total

    def energy_mj(self) -> int:
        """The counter now: the energy up to its last update ([ZEUS]: it advances every `energy_period_s`)."""
        now = time.monotonic()
        if self.energy_period_s > 0:
            now = self._t0 + (now - self._t0) // self.energy_period_s * self.energy_period_s
        value = int(self._energy_between(self._t0, now)) + 1_000_000
        if self.energy_stalled:
            self._stalled_mj = self._stalled_mj if self._stalled_mj is not None else value
            return self._stalled_mj
        self._stalled_mj = None
        return value

    def running_pids(self) -> list[int]:
        """[PROC] the listed PIDs whose process still runs."""
        return [pid for pid in self.processes if _alive(pid)]

    def average_mw(self, window_s: float = 1.0) -> float:
        """The mean draw over the last `window_s` seconds."""
        now = time.monotonic()
        return self._energy_between(now - window_s, now) / window_s

    def enable_mig(self, instances: int = 2) -> list[FakeMig]:
        """MIG mode on with `instances` MIG devices (what `nvidia-smi -mig 1` and instance creation leave)."""
        self.mig = True
        self.mig_devices = [FakeMig(self) for _ in range(instances)]
        return self.mig_devices

    def _clock(self) -> tuple[int, int]:
        """(graphics clock MHz, event reasons): why the clock is where it is, bit by bit as [REASONS] documents them."""
        reasons = 0
        if self.locked:
            clock = self.locked[1]  # [CUDAJL]: a locked GPU reads the lock with every reason clear, idle or not
        elif not self.running:
            return self.idle_clock_mhz, nvmlClocksEventReasonGpuIdle  # GpuIdle: nothing runs, clocks drop to idle
        elif self.app_clock_mhz is not None:
            clock, reasons = self.app_clock_mhz, nvmlClocksEventReasonApplicationsClocksSetting  # limited by -ac
        else:
            clock = max(self.graphics_clocks)
        # The NVML reference gives no precedence among limiters: each one that holds the clock below where it would
        # be raises its own bit, and the clock is the lowest of them.
        for limit, bit in ((self.cap_mhz, nvmlClocksEventReasonSwThermalSlowdown),
                           (self.power_cap_mhz, nvmlClocksEventReasonSwPowerCap),
                           (self.sync_boost_mhz, nvmlClocksEventReasonSyncBoost),
                           (self.display_clock_mhz, nvmlClocksEventReasonDisplayClockSetting)):
            if limit is not None and limit < clock:
                clock, reasons = limit, reasons | bit
        if self.hw_slowdown:  # "reducing the core clocks by a factor of 2 or more"; the specific bit beside HwSlowdown
            specific = {"thermal": nvmlClocksEventReasonHwThermalSlowdown,
                        "power_brake": nvmlClocksEventReasonHwPowerBrakeSlowdown}[self.hw_slowdown]
            clock, reasons = clock // 2, reasons | nvmlClocksEventReasonHwSlowdown | specific
        return clock, reasons


def make_module(gpus: list[FakeGPU] | None = None, driver_loaded: bool = True) -> types.ModuleType:
    """A fresh fake `pynvml` module holding `gpus` (attribute `_gpus` for assertions), in NVML index order."""
    gpus = gpus if gpus is not None else [FakeGPU()]
    m = types.ModuleType("pynvml")
    state = {"init": 0}
    for k, v in dict(globals()).items():
        if k.startswith(("NVML", "c_nvml", "nvmlClocks")):
            setattr(m, k, v)
    m._gpus = gpus

    def need_init():
        if not state["init"]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit():
        if not driver_loaded:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        state["init"] += 1  # [NVML] nvmlInit: "A reference count of the number of initializations is maintained"

    m._shutdowns = 0

    def nvmlShutdown():
        # [NVML] nvmlShutdown: "Shutdown only occurs when the reference count reaches zero. For backwards
        # compatibility, no error is reported if nvmlShutdown() is called more times than nvmlInit()."
        state["init"] = max(0, state["init"] - 1)
        m._shutdowns += 1

    def nvmlDeviceGetCount():
        need_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i):
        need_init()
        if not 0 <= i < len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpus[i]

    def nvmlDeviceGetHandleByUUID(uuid):
        need_init()  # [NVML] "NVML_ERROR_NOT_FOUND if uuid does not match a valid device on the system"
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for g in gpus:
            if g.uuid == text:
                return g
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(h):
        return gpus.index(h)  # [NVML] the NVML index of a GPU handle

    def nvmlDeviceGetName(h):
        return h.name

    def nvmlDeviceGetSupportedMemoryClocks(h):
        return list(h.mem_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(h, mem):
        if mem not in h.mem_clocks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return list(h.graphics_clocks)

    def nvmlDeviceSetGpuLockedClocks(h, lo, hi):
        h.calls.append(("lock", lo, hi))
        if not h.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if h.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # [CUPTI]: clock control is unavailable on MIG-partitioned GPUs
        if lo > hi:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        h.locked = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(h):
        h.calls.append(("reset",))
        if not h.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        h.locked = None  # whoever set the lock: NVML keeps no owner of it

    def nvmlDeviceSetMemoryLockedClocks(h, lo, hi):
        h.calls.append(("lock_memory", lo, hi))
        if h.architecture < NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # [MEMCLK] "For Ampere or newer fully supported devices"
        if not h.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)  # [MEMCLK] "Requires root/admin permissions"
        if lo > hi:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        h.mem_locked = (lo, hi)

    def nvmlDeviceResetMemoryLockedClocks(h):
        h.calls.append(("reset_memory",))
        if h.architecture < NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not h.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        h.mem_locked = None  # [MEMCLK] "Resets the memory clock to the default value"

    def nvmlDeviceGetApplicationsClock(h, kind):
        # [NVML] "the current setting of a clock that applications will use" (deprecated, still exported);
        # "For Kepler or newer fully supported devices": NOT_SUPPORTED elsewhere (`app_clocks_api=False`)
        if not h.app_clocks_api:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.app_clock_mhz if h.app_clock_mhz is not None else h.default_app_clock_mhz

    def nvmlDeviceGetDefaultApplicationsClock(h, kind):
        # [NVML] "the default applications clock that GPU boots with or defaults to after nvmlDeviceResetApplicationsClocks"
        if not h.app_clocks_api:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.default_app_clock_mhz

    def nvmlDeviceGetTotalEnergyConsumption(h):
        if not h.energy_counter:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.energy_mj()

    def nvmlDeviceGetPowerUsage(h):
        # [NVML] nvmlDeviceGetPowerUsage: "On Ampere (except GA100) or newer GPUs, the API returns power averaged over
        # 1 sec interval. On GA100 and older architectures, instantaneous power is returned."
        if h.architecture >= NVML_DEVICE_ARCH_AMPERE and not h.ga100:
            return int(h.average_mw())
        return h.power_mw

    def nvmlDeviceGetFieldValues(h, field_ids):
        out = []
        for item in field_ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)  # pynvml takes an id or (id, scopeId)
            if fid == NVML_FI_DEV_POWER_INSTANT and h.instant_power:
                out.append(c_nvmlFieldValue_t(fid, scope, NVML_SUCCESS, h.power_mw))
            elif fid == NVML_FI_DEV_POWER_AVERAGE and h.instant_power and h.architecture >= NVML_DEVICE_ARCH_AMPERE and not h.ga100:
                out.append(c_nvmlFieldValue_t(fid, scope, NVML_SUCCESS, int(h.average_mw())))
            else:  # a field this driver or GPU does not answer: the call succeeds, the field's own return says so
                out.append(c_nvmlFieldValue_t(fid, scope, NVML_ERROR_NOT_SUPPORTED))
        return out

    def nvmlDeviceGetArchitecture(h):
        return h.architecture

    def nvmlDeviceGetMigMode(h):
        if h.architecture < NVML_DEVICE_ARCH_AMPERE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # [NVML] "For Ampere or newer fully supported devices"
        mode = NVML_DEVICE_MIG_ENABLE if h.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(h):
        # the fake's slot count; "Returns zero if MIG is not supported or enabled" (cuda-python's cuda.core
        # MigInfo.device_count, which wraps nvmlDeviceGetMaxMigDeviceCount)
        return 7 if h.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
        if not h.mig or not 0 <= i < 7:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if i >= len(h.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # [NVML] an index with no MIG device: NVML_ERROR_NOT_FOUND
        return h.mig_devices[i]

    def nvmlDeviceGetComputeRunningProcesses(h):
        if not h.process_list_api:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [c_nvmlProcessInfo_t(pid, 512 * 2**20) for pid in h.running_pids()]

    def nvmlDeviceGetUtilizationRates(h):
        return c_nvmlUtilization_t(h.util, 30)

    def nvmlDeviceGetClockInfo(h, kind):
        if kind == NVML_CLOCK_MEM:  # [MEMCLK] the memory clock: a lock's top, else the highest listed
            return h.mem_locked[1] if h.mem_locked else max(h.mem_clocks)
        return h._clock()[0]

    def nvmlDeviceGetUUID(h):
        return h.uuid

    def nvmlDeviceGetCurrentClocksEventReasons(h):
        return h._clock()[1]

    def nvmlDeviceGetTemperature(h, sensor):
        return h.temperature_c

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(m, fn.__name__, fn)
    m.NVMLError = NVMLError
    return m


class _CUuuid:
    """[TORCH] torch's `_CudaDeviceProperties.uuid`: `bytes`, and `str()` as 8-4-4-4-12 hex without a prefix."""

    def __init__(self, nvidia_smi_uuid: str):
        self._text = nvidia_smi_uuid.split("-", 1)[1].lower()  # drop GPU- / MIG-
        self.bytes = list(bytes.fromhex(self._text.replace("-", "")))

    def __str__(self) -> str:
        return self._text


class FakeCuda:
    """`torch.cuda` of a CUDA build on the fake NVML's GPUs: the visible devices as CUDA numbers them.

    CUDA's own order of the GPUs ([CUDA-ENV], CUDA_DEVICE_ORDER): FASTEST_FIRST, the default, is a heuristic no
    document spells out, so a test gives it as `fastest_first` (NVML indices, fastest first); PCI_BUS_ID is ascending
    PCI bus id, which the fake takes to be NVML's index order. CUDA_VISIBLE_DEVICES is read as CUDA reads it
    ([CUDA-ENV], as torch's `_parse_visible_devices` models it [TORCH]): unset, every GPU; empty, none; indices into
    CUDA's order, or GPU-/MIG- UUIDs or any prefix naming one device alone; the list ends at the first entry that names
    none (an invalid index, an unknown or ambiguous UUID); a repeated entry leaves nothing visible. A GPU in MIG mode
    is visible only through its MIG devices named as MIG-<uuid> (the fake models no other MIG enumeration).
    """

    def __init__(self, nvml: types.ModuleType, fastest_first: list[int] | None = None, device_order: str = "FASTEST_FIRST",
                 visible: str | None = None, read_environment: bool = True, report_uuid: bool = True):
        gpus: list[FakeGPU] = list(nvml._gpus)
        order = fastest_first if fastest_first is not None else list(range(len(gpus)))
        self.physical = gpus if device_order == "PCI_BUS_ID" else [gpus[i] for i in order]
        value = os.environ.get("CUDA_VISIBLE_DEVICES") if read_environment and visible is None else visible
        self.visible: list[Any] = self._visible(value)
        self.report_uuid = report_uuid  # False: a torch build whose device properties carry no `uuid`

    def _visible(self, value: str | None) -> list[Any]:
        whole = [g for g in self.physical if not g.mig]
        if value is None:
            return whole
        entries = [e.strip() for e in value.split(",")] if value.strip() else []
        if entries and entries[0].startswith(("GPU-", "MIG-")):
            units = whole + [d for g in self.physical if g.mig for d in g.mig_devices]
            picked = []
            for e in entries:
                matches = [u for u in units if u.uuid.lower().startswith(e.lower())]
                if len(matches) != 1:
                    break  # unknown or ambiguous: the list ends here
                picked.append(matches[0])
        else:
            picked = []
            for e in entries:
                if not e.isdigit() or int(e) >= len(self.physical) or self.physical[int(e)].mig:
                    break  # an invalid index ends the list ("-1" included; the fake takes plain digits only)
                picked.append(self.physical[int(e)])
        return [] if len(set(map(id, picked))) != len(picked) else picked

    def is_available(self) -> bool:
        return bool(self.visible)

    def device_count(self) -> int:
        return len(self.visible)

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, k: int) -> types.SimpleNamespace:
        unit = self.visible[k]  # IndexError past the end, like torch's "Invalid device id" AssertionError would stop it
        name = unit.parent.name if isinstance(unit, FakeMig) else unit.name
        if not self.report_uuid:
            return types.SimpleNamespace(name=name)
        return types.SimpleNamespace(name=name, uuid=_CUuuid(unit.uuid))  # [CUUUID]: a MIG device reports its MIG UUID

    def install(self, monkeypatch: Any) -> FakeCuda:
        """Put this fake in place of torch.cuda's device queries for one test (pytest's monkeypatch)."""
        import torch

        for name in ("is_available", "device_count", "current_device", "get_device_properties"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self


# ---- one set of fake GPUs shared by several processes (module doc) ------------------------------------------------

SHARED_STATE_ENV = "DVFS_FAKE_NVML_STATE"  # the state file the shim's `pynvml` loads (testkit/fakes/nvml_shim)
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvml_shim")  # put first on a child's PYTHONPATH


@contextlib.contextmanager
def _locked_state(path: str, write: bool = False) -> Any:
    """The state file's JSON under an exclusive lock (a sidecar .lock file); with `write`, saved back after the block."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as f:
            state = json.load(f)
        yield state
        if write:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, path)


def write_shared_state(path: str, gpus: list[FakeGPU]) -> None:
    """Start a state file for `gpus` (their names, UUIDs and power levels; unlocked, no calls)."""
    state = {"gpus": [{"name": g.name, "uuid": g.uuid, "power_mw": g.power_mw, "locked": None, "processes": []} for g in gpus],
             "calls": []}
    with open(path, "w") as f:
        json.dump(state, f)


def read_shared_state(path: str) -> dict[str, Any]:
    """The state file now: `gpus` (each with `locked`: [lo, hi] or None, and `processes`: the PIDs that opened a compute
    context on it) and `calls` (every lock/reset in the order the processes made them: gpu index, call, arguments, pid,
    time)."""
    with _locked_state(path) as state:
        return state


class _SharedCalls:
    """A GPU's `calls` list whose `append` lands in the state file (with the calling process and time)."""

    def __init__(self, gpu: SharedGPU):
        self.gpu = gpu

    def append(self, call: tuple) -> None:
        with _locked_state(self.gpu.state_path, write=True) as state:
            state["calls"].append({"gpu": self.gpu.shared_index, "call": list(call), "pid": os.getpid(), "t": time.time()})

    def _mine(self) -> list[tuple]:
        calls = read_shared_state(self.gpu.state_path)["calls"]
        return [tuple(c["call"]) for c in calls if c["gpu"] == self.gpu.shared_index]

    def __iter__(self) -> Any:
        return iter(self._mine())

    def __eq__(self, other: object) -> bool:
        return self._mine() == other

    __hash__ = None  # type: ignore[assignment]


class SharedGPU(FakeGPU):
    """A `FakeGPU` whose clock lock and calls live in a state file every process shares (module doc)."""

    def __init__(self, state_path: str, index: int, **kw: Any):
        self.state_path, self.shared_index = state_path, None  # None while FakeGPU.__init__ sets its local defaults
        super().__init__(**kw)
        self.shared_index = index

    @property  # type: ignore[override]
    def locked(self) -> tuple[int, int] | None:
        if self.shared_index is None:
            return None
        value = read_shared_state(self.state_path)["gpus"][self.shared_index]["locked"]
        return tuple(value) if value else None

    @locked.setter
    def locked(self, value: tuple[int, int] | None) -> None:
        if self.shared_index is None:
            return
        with _locked_state(self.state_path, write=True) as state:
            state["gpus"][self.shared_index]["locked"] = list(value) if value else None

    @property  # type: ignore[override]
    def processes(self) -> list[int]:
        if self.shared_index is None:
            return []
        return list(read_shared_state(self.state_path)["gpus"][self.shared_index].get("processes", []))

    @processes.setter
    def processes(self, _value: list[int]) -> None:
        pass  # FakeGPU.__init__'s empty list: the shared list is the state file's (`use_gpu`)

    @property  # type: ignore[override]
    def calls(self) -> _SharedCalls:
        return _SharedCalls(self)

    @calls.setter
    def calls(self, _value: list) -> None:
        pass  # FakeGPU.__init__'s empty list: the shared list is the state file's


def use_gpu(path: str, index: int, pid: int | None = None) -> None:
    """Process `pid` (None: this one) opens a compute context on shared GPU `index` ([PROC]: listed while it runs)."""
    with _locked_state(path, write=True) as state:
        state["gpus"][index].setdefault("processes", []).append(os.getpid() if pid is None else int(pid))


def shared_module(path: str) -> types.ModuleType:
    """A fake `pynvml` whose GPUs are the state file's (`write_shared_state`), shared with every process that loads it."""
    gpus = [SharedGPU(path, i, name=g["name"], uuid=g["uuid"], power_mw=g["power_mw"])
            for i, g in enumerate(read_shared_state(path)["gpus"])]
    return make_module(list(gpus))
