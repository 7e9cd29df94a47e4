"""NVML backend (nvidia-ml-py): locked graphics clocks, the graphics clock read back, the energy counter.

The `pynvml` module is injectable so tests run against a fake with the same names, return types and error classes
as the real one (testkit/fakes/fake_pynvml.py, which cites the source of each behaviour it models).

Which GPU. `index` is NVML's (nvidia-smi's); NVML's own reference warns that "the NVML index may not correlate with
other APIs, such as the CUDA device index" (nvmlDeviceGetIndex), and CUDA numbers GPUs fastest-first unless
CUDA_DEVICE_ORDER=PCI_BUS_ID, within what CUDA_VISIBLE_DEVICES leaves visible (CUDA Programming Guide, "CUDA
Environment Variables"). So the torch device is the visible CUDA device with this GPU's UUID (or one of its MIG
devices' UUIDs), and a GPU CUDA cannot see is refused with one line before any clock is touched (`torch_device`,
read when the board is resolved). A journal names its GPU by UUID, since "the order in which NVML enumerates devices
has no guarantees of consistency between reboots" (nvmlDeviceGetHandleByIndex, nvmlDeviceGetIndex).

Whose lock. NVML can set a locked clock range (nvmlDeviceSetGpuLockedClocks, `nvidia-smi -lgc`) but documents no
call that reads one back: nvmlDeviceGetClock's clock ids are CURRENT, APP_CLOCK_TARGET, APP_CLOCK_DEFAULT and
CUSTOMER_BOOST_MAX (application clocks and boost, not locks), and neither the NVML API reference nor nvidia-ml-py
13.615 has a getter of locked clocks. The ApplicationsClocksSetting event reason is documented as "GPU clocks are
limited by current setting of applications clocks" (`nvidia-smi -ac`), and a GPU locked with `nvidia-smi` has been
seen to read every reason clear at its locked 915 MHz (CUDA.jl, https://github.com/JuliaGPU/CUDA.jl/pull/2194). So:
application clocks are detected (that reason bit, or nvmlDeviceGetApplicationsClock differing from
nvmlDeviceGetDefaultApplicationsClock) and refused; a lock is undetectable, and since a session's restore
(nvmlDeviceResetGpuLockedClocks) would remove whatever lock was there, pinning needs the caller's word that there is
none (`assume_unlocked=True`). A "maxn" session writes nothing (an administrator's lock stays).

MIG. A locked clock is one for the whole GPU ("clock locking is device-global", CUPTI Clock Control API, which also
lists MIG-partitioned devices as unsupported), so a GPU in MIG mode (nvmlDeviceGetMigMode) is never pinned; observing
it is allowed and the session says its energy is the whole GPU's (`context["energy_scope"]`).

Power. nvmlDeviceGetPowerUsage "on Ampere (except GA100) or newer GPUs ... returns power averaged over 1 sec interval"
(NVML API reference); NVML_FI_DEV_POWER_INSTANT is the "current GPU power, supported on all architectures" (nvml.h)
and is what Zeus reads (zeus/device/gpu/nvidia.py, getInstantPowerUsage). The sampler reads the instantaneous field
where the driver answers it, else nvmlDeviceGetPowerUsage, and the session says which (`context["power_source"]`).

Energy. nvmlDeviceGetTotalEnergyConsumption is a counter that advances in steps: NVML's counters "can update as slow as
10 Hz depending on the GPU model" (Zeus, ml-energy/zeus zeus/monitor/power.py, infer_counter_update_period), and a
window shorter than a step can read zero (Zeus' zeus/monitor/energy.py warns of it). A window's counter difference is
off by up to one update period's energy, so the session infers the period once per device when it starts, as Zeus does
(`meter.infer_update_period`), and takes a window's energy from the counter only where the counter advanced and the
window spans at least `COUNTER_MIN_PERIODS` periods; else from the power samples integrated. Each report says which
(`EnergyReport.energy_source`), and so does the session for its "train" window (`context["energy_source"]`, with
`context["energy_counter_period_s"]`).

Which processes. nvmlDeviceGetComputeRunningProcesses lists the processes with a compute context on a GPU (NVML API
reference: "e.g. CUDA application which have active context"); `running_pids` reads it, so `run` can pin and meter only
the GPUs a job uses (hw/multi.py).

The memory clock (a session's `emc_mhz`). nvmlDeviceGetSupportedMemoryClocks lists the memory clocks a GPU runs at
("the list of possible memory clocks that can be used as an argument for nvmlDeviceSetMemoryLockedClocks"), and
nvmlDeviceSetMemoryLockedClocks "sets the device's memory clocks to the value in the range of minMemClockMHz to
maxMemClockMHz ... Requires root/admin permissions ... For Ampere or newer fully supported devices", undone by
nvmlDeviceResetMemoryLockedClocks ("Resets the memory clock to the default value"). A GPU that lists one memory clock
(a data-centre HBM part) has no memory knob: `emc_frequencies_mhz` is empty and a request is refused in one line. The
memory lock is its own clock domain (its own lock and journal, `pins.DomainPin`); the clock is read back with
nvmlDeviceGetClockInfo(NVML_CLOCK_MEM). NVML has no CPU clock: a CPU clock is refused in one line.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dvfs_mlops.errors import DeviceNotFoundError, DevicePermissionError, DvfsError
from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    PinnedSession,
    freq_label,
    parse_freq,
    parse_knob,
)
from dvfs_mlops.hw.guard import ClockOwnership, restore_failed
from dvfs_mlops.hw.meter import CLOCK_MEASURED, EnergyReport, KnobPins, PowerSampler, infer_update_period
from dvfs_mlops.hw.pins import DomainPin, claim_all, restore_all
from dvfs_mlops.hw.placement import UUID_PREFIXES, bare_uuid, cuda_device_of

log = logging.getLogger(__name__)
# nvml.h constants, used where an older nvidia-ml-py lacks the name
APPLICATIONS_CLOCKS_SETTING = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting: application clocks (-ac) in force
NVML_FI_DEV_POWER_INSTANT = 186  # "Current GPU power, supported on all architectures", mW
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_MIG_ENABLE = 1
NVML_ERROR_NOT_FOUND = 6
# The clocks event reasons that hold the clock below where it would run: someone else's cap (NVML "ClocksEventReasons":
# SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80), by the
# name a session records them under (`context["clock_limits_at_start"]`).
LIMITING_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown"}
# nvmlFieldValue_t.valueType -> the member of its value union that holds the value (nvml.h, nvmlValueType_t)
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
POWER_INSTANT = "instant"
POWER_AVERAGE_1S = "average_1s"
# A window's counter difference is off by at most one update period's energy: from this many periods on that is at most
# 5 %, below it the power samples integrated are the better figure.
COUNTER_MIN_PERIODS = 20
# How long the counter's update period is looked for at the start (`meter.infer_update_period`): long enough to see
# three steps of a 10 Hz counter.
COUNTER_PROBE_S = 0.5


def import_nvml() -> ModuleType:
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError as e:
        raise DeviceNotFoundError("nvidia-ml-py is not installed; pip install nvidia-ml-py") from e
    return pynvml


def _is_permission(nvml: ModuleType, err: Exception) -> bool:
    return getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)


def _is_not_supported(nvml: ModuleType, err: Exception) -> bool:
    return getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _shutdown(nvml: ModuleType) -> None:
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _mig_enabled(nvml: ModuleType, handle: object) -> bool:
    """nvmlDeviceGetMigMode's current mode is NVML_DEVICE_MIG_ENABLE (False where MIG is unsupported: before Ampere)."""
    with contextlib.suppress(nvml.NVMLError, AttributeError):
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
        return int(current) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE))
    return False


def _mig_uuids(nvml: ModuleType, handle: object) -> list[str]:
    """The UUIDs of a GPU's MIG devices: nvmlDeviceGetMigDeviceHandleByIndex over nvmlDeviceGetMaxMigDeviceCount slots (an
    empty slot answers NVML_ERROR_NOT_FOUND). NVML: "When used with MIG device handles the API returns globally unique
    UUIDs" (nvmlDeviceGetUUID); CUDA reports that MIG UUID for the device ("If the device is in MIG mode, returns its MIG
    UUID", cuDeviceGetUuid_v2)."""
    if not _mig_enabled(nvml, handle):
        return []
    found = []
    with contextlib.suppress(nvml.NVMLError, AttributeError):
        for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            with contextlib.suppress(nvml.NVMLError):
                found.append(_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))))
    return found


class NvmlDevice:
    """One NVIDIA GPU through NVML.

    Args:
        index: NVML's index of the GPU (nvidia-smi's), used where `uuid` is not given.
        nvml: a `pynvml`-compatible module (None: nvidia-ml-py).
        sample_hz: the meter thread's power/clock sampling rate.
        assume_unlocked: the caller vouches that nobody locked this GPU's clocks (`nvidia-smi -lgc`), which NVML
            cannot read: only then does a session pin (its restore resets locked clocks, whoever set them).
        uuid: open the GPU with this UUID instead of `index` (a journal's GPU, wherever NVML numbers it now).

    Raises:
        DeviceNotFoundError: NVML does not start, or there is no GPU at `index` / with `uuid`.
    """

    name = "nvml"
    simulated = False

    def __init__(self, index: int = 0, nvml: ModuleType | None = None, sample_hz: float = 50.0, assume_unlocked: bool = False,
                 uuid: str | None = None):
        self.nvml = nvml or import_nvml()
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
        except self.nvml.NVMLError as e:
            raise DeviceNotFoundError(f"NVML did not start ({e}); is the NVIDIA driver loaded?") from None
        # nvmlInit is reference-counted: one nvmlShutdown per device, at close() or at exit.
        self._finalizer = weakref.finalize(self, _shutdown, self.nvml)
        if uuid is not None:
            index = self._index_of_uuid(uuid, count)
        if index >= count:
            self.close()
            raise DeviceNotFoundError(f"NVML sees {count} GPU(s); index {index} does not exist (--gpu-index 0..{count - 1})")
        self.index = index
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        self.gpu_name = _text(self.nvml.nvmlDeviceGetName(self.handle))
        self.profile = "nvml-" + "-".join(self.gpu_name.lower().replace("nvidia", "").split())
        self.device_key = f"nvml-{index}"
        self.device_id = self._uuid() or self.device_key
        self.sample_hz = sample_hz
        self.assume_unlocked = assume_unlocked
        self._power_source: str | None = None
        self._field_power = False  # the instantaneous power field answered when power_source probed it
        self._counter_period: float | None = None  # the energy counter's update period once probed (None: no counter)
        self._counter_probed = False

    def _index_of_uuid(self, uuid: str, count: int) -> int:
        """NVML's index of the GPU with `uuid` now (nvmlDeviceGetHandleByUUID, then nvmlDeviceGetIndex); closes and raises
        DeviceNotFoundError where there is none ("NVML_ERROR_NOT_FOUND if uuid does not match a valid device")."""
        n = self.nvml
        try:
            return int(n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)))
        except n.NVMLError as e:
            error = e
        seen = ""
        with contextlib.suppress(n.NVMLError):
            seen = ", ".join(f"GPU {i} {_text(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)))}" for i in range(count))
        self.close()
        if getattr(error, "value", None) != getattr(n, "NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND):
            raise DeviceNotFoundError(f"NVML cannot look up GPU {uuid}: {error}") from None
        raise DeviceNotFoundError(f"no GPU with UUID {uuid} on this machine (NVML sees: {seen or 'none'}); if it was "
                                  "removed, its clocks went with it") from None

    @classmethod
    def for_journal(cls, settings: dict[str, Any], nvml: ModuleType | None = None) -> NvmlDevice:
        """The GPU a journal was written for: by the UUID it recorded, else (a journal without one) by its index.

        Raises:
            DeviceNotFoundError: that GPU is not on this machine any more.
        """
        uuid = str(settings.get("uuid") or "")
        if uuid.startswith("GPU-"):
            return cls(nvml=nvml, uuid=uuid)
        return cls(index=int(settings.get("index", 0)), nvml=nvml)

    def close(self) -> None:
        """nvmlShutdown (once). Sessions restore before their device is closed."""
        self._finalizer()

    def _uuid(self) -> str | None:
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            return _text(self.nvml.nvmlDeviceGetUUID(self.handle))
        return None

    # which GPU trains ------------------------------------------------------------------------------------
    def mig_enabled(self) -> bool:
        """Whether the GPU is in MIG mode now (nvmlDeviceGetMigMode's current mode; False where MIG is unsupported)."""
        return _mig_enabled(self.nvml, self.handle)

    @property
    def cuda_uuids(self) -> set[str]:
        """Every UUID CUDA may report for this GPU, bare (no GPU-/MIG- prefix, lower case): its own and its MIG devices'."""
        return {bare_uuid(u) for u in [self.device_id, *_mig_uuids(self.nvml, self.handle)] if u.startswith(UUID_PREFIXES)}

    def _nvml_names(self) -> dict[str, str]:
        """UUID -> "NVML GPU i" for every GPU NVML sees (and its MIG devices): how an error names a CUDA device."""
        names: dict[str, str] = {}
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            for i in range(int(self.nvml.nvmlDeviceGetCount())):
                handle = self.nvml.nvmlDeviceGetHandleByIndex(i)
                names[_text(self.nvml.nvmlDeviceGetUUID(handle))] = f"NVML GPU {i}"
                for mig in _mig_uuids(self.nvml, handle):
                    names[mig] = f"a MIG device of NVML GPU {i}"
        return names

    @property
    def torch_device(self) -> str:
        """`cuda:<k>` for the visible CUDA device with this GPU's UUID (or a MIG device's); `cuda:<index>` where torch
        has no CUDA (`resolve_torch_device` then refuses before any clock).

        Raises:
            TorchDeviceError: torch has CUDA but this GPU is not among its visible devices (CUDA_VISIBLE_DEVICES), or
                no visible device can be matched to it; one line naming the GPU and what is visible.
        """
        what = f"GPU {self.index} ({self.gpu_name}, {self.device_id})"
        found = cuda_device_of(self.cuda_uuids, what, self._nvml_names())
        return found or f"cuda:{self.index}"

    # clocks --------------------------------------------------------------------------------------------------
    @property
    def frequencies_mhz(self) -> list[float]:
        n = self.nvml
        mem = max(n.nvmlDeviceGetSupportedMemoryClocks(self.handle))
        return sorted(float(c) for c in set(n.nvmlDeviceGetSupportedGraphicsClocks(self.handle, mem)))

    # the memory clock --------------------------------------------------------------------------------------------
    @property
    def cpu_frequencies_mhz(self) -> list[float]:
        """NVML sets GPU clocks only: no CPU knob."""
        return []

    @property
    def emc_frequencies_mhz(self) -> list[float]:
        """The memory clocks a session can pin (nvmlDeviceGetSupportedMemoryClocks), ascending; [] where the GPU lists
        one (no memory knob), is older than Ampere (nvmlDeviceSetMemoryLockedClocks: "For Ampere or newer") or NVML
        cannot say."""
        if self._before_ampere():
            return []
        try:
            clocks = sorted({float(c) for c in self.nvml.nvmlDeviceGetSupportedMemoryClocks(self.handle)})
        except self.nvml.NVMLError:
            return []
        return clocks if len(clocks) > 1 else []

    def _before_ampere(self) -> bool:
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            ampere = getattr(self.nvml, "NVML_DEVICE_ARCH_AMPERE", NVML_DEVICE_ARCH_AMPERE)
            return int(self.nvml.nvmlDeviceGetArchitecture(self.handle)) < ampere
        return False

    @property
    def memory_key(self) -> str:
        """The memory clock domain's lock and journal key."""
        return f"{self.device_key}-memory"

    def memory_clock_mhz(self) -> float | None:
        """The memory clock now (nvmlDeviceGetClockInfo, NVML_CLOCK_MEM), None where NVML cannot say."""
        with contextlib.suppress(self.nvml.NVMLError):
            return float(self.nvml.nvmlDeviceGetClockInfo(self.handle, getattr(self.nvml, "NVML_CLOCK_MEM", 2)))
        return None

    def emc_unavailable(self) -> str:
        """Why this GPU's memory clock cannot be pinned, in one line with what to do."""
        if self._before_ampere():
            return (f"GPU {self.index} ({self.gpu_name}) is older than Ampere: NVML locks memory clocks on Ampere or newer "
                    "only (nvmlDeviceSetMemoryLockedClocks); drop --emc-freq")
        try:
            listed = sorted({float(c) for c in self.nvml.nvmlDeviceGetSupportedMemoryClocks(self.handle)})
        except self.nvml.NVMLError as e:
            return f"NVML cannot list the memory clocks of GPU {self.index} ({e}); drop --emc-freq"
        return (f"GPU {self.index} ({self.gpu_name}) offers one memory clock ({', '.join(f'{c:g}' for c in listed)} MHz, "
                "nvmlDeviceGetSupportedMemoryClocks): there is no other to pin; drop --emc-freq")

    def cpu_unavailable(self) -> str:
        return ("NVML sets GPU clocks only; the host CPU's clock is the operating system's (cpufreq), which the nvml "
                "backend does not pin: drop --cpu-freq")

    def lock_memory_clocks(self, mhz: float) -> None:
        """Lock the memory clock at `mhz`.

        Raises:
            DevicePermissionError, DvfsError: NVML refused it (`partial` False: a lock call NVML refused is undone, so
                nothing is left to restore).
        """
        try:
            self._call("lock the memory clock", self.nvml.nvmlDeviceSetMemoryLockedClocks, int(mhz), int(mhz))
        except DvfsError as e:
            with contextlib.suppress(Exception):  # a lock call that failed half-way: undo whatever it did
                self.reset_memory_clocks()
            e.partial = False  # type: ignore[attr-defined]
            raise

    def reset_memory_clocks(self) -> None:
        self._call("reset the locked memory clock", self.nvml.nvmlDeviceResetMemoryLockedClocks)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError as e:
            if _is_permission(self.nvml, e):
                raise DevicePermissionError(
                    f"NVML refused to {what} on GPU {self.index} (no permission); install the clock service once (sudo "
                    "dvfs-mlops clockd install) or run as root, or meter only with --observe"
                ) from None
            raise DvfsError(f"NVML could not {what} on GPU {self.index}: {e}") from None

    def clocks_event_reasons(self) -> int | None:
        """Why the clock is where it is (bit mask), or None where the driver cannot say."""
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            with contextlib.suppress(self.nvml.NVMLError):
                return int(fn(self.handle))
        return None

    def clock_limits(self) -> list[str]:
        """The limiting clocks event reasons in force now (`LIMITING_REASONS`), by name; [] where none (or unreadable)."""
        reasons = self.clocks_event_reasons() or 0
        return [name for bit, name in LIMITING_REASONS.items() if reasons & bit]

    def application_clocks_set(self) -> bool:
        """Whether someone set application clocks (`nvidia-smi -ac`), by what NVML documents: an applications clock ("the
        current setting of a clock that applications will use", nvmlDeviceGetApplicationsClock) other than the default
        one ("that GPU boots with or defaults to after nvmlDeviceResetApplicationsClocks"); where those deprecated getters
        do not answer (NOT_SUPPORTED on GeForce), the ApplicationsClocksSetting event reason ("GPU clocks are limited by
        current setting of applications clocks"), which says the clock is held at applications clocks, not whose they are."""
        graphics = getattr(self.nvml, "NVML_CLOCK_GRAPHICS", 0)
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            current = self.nvml.nvmlDeviceGetApplicationsClock(self.handle, graphics)
            return int(current) != int(self.nvml.nvmlDeviceGetDefaultApplicationsClock(self.handle, graphics))
        reasons = self.clocks_event_reasons()
        bit = getattr(self.nvml, "nvmlClocksEventReasonApplicationsClocksSetting",
                      getattr(self.nvml, "nvmlClocksThrottleReasonApplicationsClocksSetting", APPLICATIONS_CLOCKS_SETTING))
        return bool(reasons is not None and reasons & bit)

    def clocks_locked(self) -> bool | None:
        """True where NVML shows someone else's clock setting (application clocks); None otherwise, because a locked
        range (`nvidia-smi -lgc`) is not readable through NVML (module doc): never False."""
        return True if self.application_clocks_set() else None

    def check_can_pin(self, what: str = "pin the clock") -> None:
        """Refuse, before any write, to pin where the session could not restore exactly what it found.

        Raises:
            DvfsError: the GPU is in MIG mode, application clocks are set, or `assume_unlocked` was not given.
        """
        gpu = f"GPU {self.index} ({self.gpu_name})"
        if self.mig_enabled():
            raise DvfsError(f"cannot {what}: {gpu} is in MIG mode, and a locked clock is the whole GPU's, so it would change "
                            "every MIG tenant's clock; meter without pinning (--observe), which reports the whole GPU's energy")
        if self.application_clocks_set():
            raise DvfsError(f"cannot {what}: the clocks of {gpu} are already set by someone else (application clocks, "
                            f"nvidia-smi -ac); ask its administrator to reset them (nvidia-smi -i {self.index} -rac) "
                            "or meter without pinning (--observe)")
        if not self.assume_unlocked:
            raise DvfsError(f"cannot {what}: NVML cannot tell whether the clocks of {gpu} are already locked (nvidia-smi "
                            "-lgc leaves nothing NVML reads back), and this session's restore would remove such a lock; "
                            "if nobody locked them, pass --assume-unlocked (NvmlDevice(assume_unlocked=True)), "
                            "else meter without pinning (--observe)")

    def lock_clocks(self, mhz: float) -> None:
        self._call("lock the graphics clock", self.nvml.nvmlDeviceSetGpuLockedClocks, int(mhz), int(mhz))

    def reset_clocks(self) -> None:
        self._call("reset the locked clocks", self.nvml.nvmlDeviceResetGpuLockedClocks)

    def restore_settings(self, settings: dict[str, Any]) -> None:
        """Undo a session's own lock, on the GPU its journal names by UUID (NVML's index may have moved since).

        Raises:
            DeviceNotFoundError: the journal's GPU is not on this machine any more.
            DevicePermissionError, DvfsError: the reset failed.
        """
        memory = settings.get("action") == "reset_memory_locked_clocks"
        uuid = str(settings.get("uuid") or "")
        if uuid.startswith("GPU-") and uuid != self.device_id:
            other = NvmlDevice(nvml=self.nvml, uuid=uuid)
            try:
                other.reset_memory_clocks() if memory else other.reset_clocks()
            finally:
                other.close()
            return
        self.reset_memory_clocks() if memory else self.reset_clocks()

    # meter ---------------------------------------------------------------------------------------------------
    def energy_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError as e:
            if _is_not_supported(self.nvml, e):
                return None
            raise

    def counter_period_s(self) -> float | None:
        """The energy counter's update period, inferred once per device (`meter.infer_update_period`); None where there
        is no counter or it did not advance while it was watched."""
        if not self._counter_probed:
            self._counter_probed = True
            if self.energy_mj() is not None:
                self._counter_period = infer_update_period(self.energy_mj, limit_s=COUNTER_PROBE_S)
                if self._counter_period is None:
                    log.warning("GPU %d's energy counter did not advance in %g s: its windows are metered from the power "
                                "samples", self.index, COUNTER_PROBE_S)
        return self._counter_period

    def running_pids(self) -> set[int] | None:
        """The PIDs with a compute context on this GPU now (nvmlDeviceGetComputeRunningProcesses); None where NVML cannot
        list them (NOT_SUPPORTED, an old nvidia-ml-py)."""
        fn = getattr(self.nvml, "nvmlDeviceGetComputeRunningProcesses", None)
        if fn is None:
            return None
        try:
            return {int(p.pid) for p in fn(self.handle)}
        except self.nvml.NVMLError:
            return None

    def _instant_mw(self) -> float | None:
        """NVML_FI_DEV_POWER_INSTANT in mW (scope 0, the GPU), None where the driver or GPU does not answer it."""
        fid = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
        with contextlib.suppress(self.nvml.NVMLError, AttributeError, IndexError, TypeError):
            value = self.nvml.nvmlDeviceGetFieldValues(self.handle, [fid])[0]
            if int(value.nvmlReturn) == int(getattr(self.nvml, "NVML_SUCCESS", 0)):
                return float(getattr(value.value, _VALUE_MEMBER.get(int(value.valueType), "uiVal")))
        return None

    @property
    def power_source(self) -> str:
        """What `power_w` reads: "instant" (the instantaneous field, or nvmlDeviceGetPowerUsage before Ampere, which NVML
        documents as instantaneous there) or "average_1s" (nvmlDeviceGetPowerUsage on Ampere and later, a 1 s average;
        also where the architecture is unknown, and on GA100, which NVML names as instantaneous but cannot be told apart)."""
        if self._power_source is None:
            if self._instant_mw() is not None:
                self._power_source, self._field_power = POWER_INSTANT, True
            else:
                arch = None
                with contextlib.suppress(self.nvml.NVMLError, AttributeError):
                    arch = int(self.nvml.nvmlDeviceGetArchitecture(self.handle))
                ampere = getattr(self.nvml, "NVML_DEVICE_ARCH_AMPERE", NVML_DEVICE_ARCH_AMPERE)
                self._power_source = POWER_INSTANT if arch is not None and arch < ampere else POWER_AVERAGE_1S
        return self._power_source

    def power_w(self) -> float:
        if self.power_source == POWER_INSTANT and self._field_power:  # before Ampere without the field: PowerUsage itself
            mw = self._instant_mw()
            if mw is not None:
                return mw / 1000.0
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def util_pct(self) -> float | None:
        with contextlib.suppress(self.nvml.NVMLError):
            return float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        return None

    def current_mhz(self) -> float | None:
        with contextlib.suppress(self.nvml.NVMLError):
            return float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_GRAPHICS))
        return None

    def temperature_c(self) -> float | None:
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            return float(self.nvml.nvmlDeviceGetTemperature(self.handle, getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0)))
        return None

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "", *, cpu_mhz: float | None = None,
                emc_mhz: float | None = None) -> NvmlSession:
        """A session at `freq`, and at the memory clock `emc_mhz` where given (`label` names the measurement; real
        hardware needs nothing of it).

        Raises:
            UnknownNameError: a clock not in its table. DvfsError: a CPU clock, or a memory clock on a GPU that lists
                one memory clock, in one line before anything is touched.
        """
        if cpu_mhz is not None:
            raise DvfsError(self.cpu_unavailable())
        if emc_mhz is not None:
            table = self.emc_frequencies_mhz
            if not table:
                raise DvfsError(self.emc_unavailable())
            emc_mhz = parse_knob(emc_mhz, table, "emc_mhz")
        return NvmlSession(self, parse_freq(freq, self.frequencies_mhz), observe=observe, emc_mhz=emc_mhz)

    def info(self) -> DeviceInfo:
        counter = self.energy_mj() is not None
        try:
            where = self.torch_device
        except DvfsError as e:
            where = f"none: {e}"
        locked = self.clocks_locked()
        detail = {"gpu": self.gpu_name, "index": self.index, "uuid": self.device_id, "energy_counter": counter,
                  "clocks_locked": "application clocks (nvidia-smi -ac)" if locked else "unknown (NVML cannot read a -lgc lock)",
                  "mig_mode": self.mig_enabled(), "power_source": self.power_source, "torch_device": where}
        temp = self.temperature_c()
        if temp is not None:
            detail["gpu_temp_c"] = temp
        memory = self.emc_frequencies_mhz
        detail["memory_frequencies"] = (f"{', '.join(f'{f:g}' for f in memory)} MHz (nvmlDeviceGetSupportedMemoryClocks)"
                                        if memory else self.emc_unavailable())
        return DeviceInfo("nvml", self.profile, self.frequencies_mhz, self.current_mhz(), "default (nvml)", ["gpu"], False, detail)


class NvmlPin:
    """This process's own lock of the GPU's graphics clock: claim, check, journal, lock; reset on restore.

    The one place the NVML pin is spelt out: a session running as root uses it, and so does the clock service
    (`clockd.server`) for its clients, journalling the client's PID and uid.

    Args:
        device: the GPU.
        owner_pid: the PID the journal names (None: this process).
        owner_uid: the uid the journal names (None: this process's).
    """

    def __init__(self, device: NvmlDevice, owner_pid: int | None = None, owner_uid: int | None = None):
        self.device = device
        self._ownership = ClockOwnership("nvml", device.device_key, device.restore_settings)
        self._owner = (owner_pid, owner_uid)
        self._locked = False
        self._memory = DomainPin("nvml-memory", device.memory_key,
                                 lambda: {"index": device.index, "uuid": device.device_id, "action": "reset_memory_locked_clocks"},
                                 device.restore_settings, self._owner)

    @property
    def held(self) -> bool:
        return self._ownership.lock.held

    @property
    def domain_keys(self) -> list[str]:
        """The keys of the domains this pin holds (the GPU's first)."""
        return [k for k, held in ((self.device.device_key, self.held), (self.device.memory_key, self._memory.held)) if held]

    def _pin_memory(self, emc_mhz: float) -> None:
        """Lock the memory clock: claimed and journalled the first time, checked as the GPU's lock is."""
        dev = self.device
        if not self._memory.held:
            dev.check_can_pin("lock the memory clock")
            claim_all([self._memory])
            self._memory.record(freq_label(emc_mhz))
        self._memory.write(lambda: dev.lock_memory_clocks(emc_mhz))

    def repin_knobs(self, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Lock the memory clock at `emc_mhz` (a CPU clock is refused: NVML has none).

        Raises:
            DvfsError: a CPU clock, or the lock call failed.
        """
        if cpu_mhz is not None:
            raise DvfsError(self.device.cpu_unavailable())
        if emc_mhz is not None:
            self._pin_memory(emc_mhz)
        return {}

    def _record(self, requested: str) -> None:
        dev = self.device
        self._ownership.record({"index": dev.index, "uuid": dev.device_id, "action": "reset_locked_clocks"}, requested, *self._owner)

    def pin(self, freq: FreqRequest, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> dict[str, Any]:
        """Claim the GPU; for a clock of the table, check it can be restored exactly, journal, lock ("maxn": nothing);
        then the memory clock where `emc_mhz` is given (its own lock and journal).

        Returns:
            Nothing the session logs besides energy ({}).

        Raises:
            DeviceBusyError: another process holds the GPU. DvfsError: MIG, application clocks, no assume_unlocked, a
                CPU clock, or the lock call failed (DevicePermissionError without root).
        """
        if cpu_mhz is not None:
            raise DvfsError(self.device.cpu_unavailable())
        self._pin_gpu(freq)
        if emc_mhz is not None:
            self._pin_memory(emc_mhz)
        return {}

    def _pin_gpu(self, freq: FreqRequest) -> None:
        dev = self.device
        self._ownership.claim()
        if freq == MAXN:
            return  # the board's default as found: an administrator's lock stays as it is
        try:
            dev.check_can_pin()
        except DvfsError:
            self._ownership.release()
            raise
        self._record(freq_label(freq))
        try:
            dev.lock_clocks(float(freq))
        except DevicePermissionError:
            raise  # nothing was locked; the restore releases the claim
        except BaseException:
            with contextlib.suppress(Exception):  # a lock call that failed half-way: undo whatever it did
                dev.reset_clocks()
            raise
        self._locked = True

    def repin(self, mhz: float) -> None:
        """Lock another clock; a pin taken at maxn checks and journals first, as `pin` does."""
        dev = self.device
        if not self._locked:
            dev.check_can_pin("move the clock (refine; --refine 0 leaves it)")
            self._record(freq_label(mhz))
            self._locked = True  # from here on the restore resets, whether or not the lock call below completes
        dev.lock_clocks(mhz)

    def restore(self) -> None:
        """Reset the memory lock and then the GPU lock this pin set, remove each journal, unlock (a no-op when nothing
        is held).

        Raises:
            RestoreFailedError: a reset failed; its journal is kept and every lock released.
        """
        failed: DvfsError | None = None
        try:
            restore_all([self._memory])
        except DvfsError as e:
            failed = e
        self._restore_gpu()
        if failed is not None:
            raise failed

    def _restore_gpu(self) -> None:
        if not self._ownership.lock.held:
            return
        if self._locked:
            try:
                self.device.reset_clocks()
            except Exception as e:  # noqa: BLE001 - whatever failed, the journal must survive it
                self._locked = False
                self._ownership.abandon()
                raise restore_failed(self.device.device_key, e, self._ownership.journal_path) from None
            self._locked = False
        self._ownership.release()


class NvmlSession(PinnedSession):
    """Lock the graphics clock; meter power, utilisation and the clock through NVML; reset the lock on exit. Who
    locks: this process as root (`NvmlPin`), else the clock service where one runs (`clockd.client.route_pin`)."""

    device: NvmlDevice

    def __init__(self, device: NvmlDevice, freq: FreqRequest, observe: bool = False, *, emc_mhz: float | None = None):
        super().__init__(device, freq, observe=observe, emc_mhz=emc_mhz)
        self._sampler: PowerSampler | None = None
        self._marks: list[tuple[int, int | None]] = []
        self._period: float | None = None  # the energy counter's update period (None: no counter to trust)
        self._memory_table: tuple[float, ...] = ()

    def _new_pin(self) -> Any:
        from dvfs_mlops.hw.clockd.client import route_pin

        dev = self.device
        what = "the GPU clock" + (" and the memory clock" if self.pinned_emc_mhz is not None else "")
        return route_pin("nvml", lambda: NvmlPin(dev), gpu_uuid=dev.device_id, what=what)

    def _memory_pin(self, emc_mhz: float | None) -> KnobPins | None:
        return KnobPins(emc=(emc_mhz, self._memory_table)) if emc_mhz is not None else None

    def _repin_knobs(self, cpu_mhz: float | None, emc_mhz: float | None) -> None:
        super()._repin_knobs(cpu_mhz, emc_mhz)
        if self._sampler is not None and emc_mhz is not None:  # later windows are judged against the new pin
            self._sampler.knobs = self._memory_pin(emc_mhz)

    def _start_meter(self) -> None:
        dev = self.device
        temp = dev.temperature_c()
        if temp is not None:
            self.context["gpu_temp_c"] = temp
        self.context["power_source"] = dev.power_source  # "instant" or "average_1s" (module doc, Power)
        limits = dev.clock_limits()
        if limits:  # a cap someone else holds as the session starts (thermal, power): the NVML side of cap_at_start_mhz
            self.context["clock_limits_at_start"] = ",".join(limits)
        if dev.mig_enabled():  # NVML meters the physical GPU: every MIG tenant's draw is in it
            self.context["mig_mode"] = "enabled"
            self.context["energy_scope"] = "whole_gpu"
        self._period = dev.counter_period_s()  # once per device, before the meter starts
        if self._period is not None:
            self.context["energy_counter_period_s"] = self._period
        # nvmlDeviceGetClockInfo(NVML_CLOCK_GRAPHICS) is the clock the GPU runs at now (NVML API reference), not the
        # requested one: a measured clock
        # the memory clock, read back where the GPU has a memory knob (more than one memory clock)
        self._memory_table = tuple(dev.emc_frequencies_mhz)
        self._sampler = PowerSampler(lambda: (dev.power_w(),), ["gpu"], dev.util_pct, dev.sample_hz, read_clock=dev.current_mhz,
                                     clock_source=CLOCK_MEASURED, read_emc=dev.memory_clock_mhz if self._memory_table else None,
                                     knobs=self._memory_pin(self.pinned_emc_mhz))
        self._marks = []
        self._sampler.start()
        self._start = (0, dev.energy_mj())

    def _mark(self) -> tuple[int, int | None]:
        assert self._sampler is not None
        return (self._sampler.mark(), self.device.energy_mj())

    def _counter_j(self, start: tuple[int, int | None], end: tuple[int, int | None]) -> dict[str, float] | None:
        """A window's energy from the counter's difference where it advanced over at least `COUNTER_MIN_PERIODS` update
        periods; None (the samples integrated: `energy_source` "samples") where it did not."""
        (i0, e0), (i1, e1) = start, end
        if e0 is None or e1 is None or self._period is None or self._sampler is None:
            return None
        if e1 <= e0 or self._sampler.span_s(i0, i1) < COUNTER_MIN_PERIODS * self._period:
            return None
        return {"gpu": (e1 - e0) / 1000.0}

    def _energy_report(self, start: tuple[int, int | None], end: tuple[int, int | None]) -> EnergyReport:
        assert self._sampler is not None
        return self._sampler.report(start[0], end[0], energy_override_j=self._counter_j(start, end), **self._judge())

    def _stop_meter(self) -> EnergyReport:
        assert self._sampler is not None
        self._sampler.stop()  # first: the counter must cover the whole sampled interval
        end = (self._sampler.mark(), self.device.energy_mj())
        temp = self.device.temperature_c()
        if temp is not None:
            self.context["gpu_temp_c_end"] = temp
        report = self._energy_report(self._start, end)
        train = next(((a, b) for name, a, b in self._window_marks if name == "train"), None)
        self.context["energy_source"] = self._energy_report(*train).energy_source if train else report.energy_source
        return report

    def _window_report(self, start: tuple[int, int | None], end: tuple[int, int | None]) -> EnergyReport:
        return self._energy_report(start, end)

    def _judge(self) -> dict[str, Any]:
        return {"pinned_mhz": self.pinned_mhz, "table_mhz": self.device.frequencies_mhz}
