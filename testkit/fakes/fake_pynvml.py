"""A fake `pynvml` (nvidia-ml-py) with the real module's names, return types and error classes.

Real behaviour mimicked: `NVMLError(value)` instantiates the subclass registered for that value
(`NVMLError_NoPermission`, `NVMLError_NotSupported`, ...); calls before `nvmlInit` raise
NVML_ERROR_UNINITIALIZED; clocks are ints in MHz; energy is a monotonically increasing mJ counter;
power is in mW; utilisation is a struct with `.gpu` and `.memory`.
"""
from __future__ import annotations

import time
import types

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
# clocks event reasons (nvml.h): bit 0x2 is "applications clocks setting", which locked clocks also raise
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2  # the older name, still exported

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
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
NVMLError_LibraryNotFound = _subclass("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int):
        self.gpu = gpu
        self.memory = memory


class FakeGPU:
    def __init__(self, name: str = "NVIDIA A100-SXM4-40GB", power_mw: int = 250_000, energy_counter: bool = True):
        self.name = name
        self.mem_clocks = [1215]
        self.graphics_clocks = list(range(1410, 200, -15))  # descending, as NVML returns them
        self.locked: tuple[int, int] | None = None
        self.power_mw = power_mw
        self.energy_counter = energy_counter
        self.util = 87
        self.permission = True
        self.uuid = "GPU-6b1f0c2e-8a1d-4c3b-9f6e-2d7a5b4c3e10"
        self.cap_mhz: int | None = None  # a thermal/power cap holding the clock below the lock
        self.temperature_c = 41
        self._t0 = time.monotonic()
        self.calls: list[tuple] = []

    def energy_mj(self) -> int:
        return int((time.monotonic() - self._t0) * self.power_mw) + 1_000_000


def make_module(gpus: list[FakeGPU] | None = None, driver_loaded: bool = True) -> types.ModuleType:
    """A fresh fake `pynvml` module holding `gpus` (attribute `_gpus` for assertions)."""
    gpus = gpus if gpus is not None else [FakeGPU()]
    m = types.ModuleType("pynvml")
    state = {"init": False}
    for k, v in dict(globals()).items():
        if k.startswith(("NVML", "c_nvml")):
            setattr(m, k, v)
    m._gpus = gpus

    def need_init():
        if not state["init"]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit():
        if not driver_loaded:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        state["init"] = True

    m._shutdowns = 0

    def nvmlShutdown():
        need_init()
        state["init"] = False
        m._shutdowns += 1

    def nvmlDeviceGetCount():
        need_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i):
        need_init()
        if not 0 <= i < len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpus[i]

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
        if lo > hi:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        h.locked = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(h):
        h.calls.append(("reset",))
        if not h.permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        h.locked = None

    def nvmlDeviceGetTotalEnergyConsumption(h):
        if not h.energy_counter:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.energy_mj()

    def nvmlDeviceGetPowerUsage(h):
        return h.power_mw

    def nvmlDeviceGetUtilizationRates(h):
        return c_nvmlUtilization_t(h.util, 30)

    def nvmlDeviceGetClockInfo(h, kind):
        clock = h.locked[1] if h.locked else max(h.graphics_clocks)
        return min(clock, h.cap_mhz) if h.cap_mhz else clock

    def nvmlDeviceGetUUID(h):
        return h.uuid

    def nvmlDeviceGetCurrentClocksEventReasons(h):
        reasons = nvmlClocksEventReasonApplicationsClocksSetting if h.locked else 0
        return reasons | (nvmlClocksEventReasonSwThermalSlowdown if h.cap_mhz else 0)

    def nvmlDeviceGetTemperature(h, sensor):
        return h.temperature_c

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(m, fn.__name__, fn)
    m.NVMLError = NVMLError
    return m
