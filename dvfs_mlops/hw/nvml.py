"""NVML backend (nvidia-ml-py): locked graphics clocks, the graphics clock read back, the energy counter.

The `pynvml` module is injectable so tests run against a fake with the same names, return types
and error classes as the real one. NVML cannot read back a locked clock range, so this backend
restores exactly what it found by never writing where it could not undo: a "maxn" session
writes nothing (an administrator's lock stays), and a pinned session refuses to start over an
existing lock. `index` is NVML's (nvidia-smi's, PCI bus order); the torch device is the CUDA
device with the same UUID, since CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

from dvfs_mlops.errors import DeviceNotFoundError, DevicePermissionError, DvfsError
from dvfs_mlops.hw.device import (
    MAXN,
    DeviceInfo,
    FreqRequest,
    FreqSession,
    freq_label,
    parse_freq,
)
from dvfs_mlops.hw.guard import ClockOwnership, restore_failed
from dvfs_mlops.hw.meter import EnergyReport, PowerSampler

log = logging.getLogger(__name__)
APPLICATIONS_CLOCKS_SETTING = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting: locked/app clocks active


def import_nvml() -> Any:
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError as e:
        raise DeviceNotFoundError("nvidia-ml-py is not installed; pip install nvidia-ml-py") from e
    return pynvml


def _is_permission(nvml: Any, err: Exception) -> bool:
    return getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)


def _is_not_supported(nvml: Any, err: Exception) -> bool:
    return getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


class NvmlDevice:
    name = "nvml"
    simulated = False

    def __init__(self, index: int = 0, nvml: Any = None, sample_hz: float = 50.0):
        self.nvml = nvml or import_nvml()
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
        except self.nvml.NVMLError as e:
            raise DeviceNotFoundError(f"NVML did not start ({e}); is the NVIDIA driver loaded?") from None
        # nvmlInit is reference-counted: one nvmlShutdown per device, at close() or at exit.
        self._finalizer = weakref.finalize(self, _shutdown, self.nvml)
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

    def close(self) -> None:
        """nvmlShutdown (once). Sessions restore before their device is closed."""
        self._finalizer()

    def _uuid(self) -> str | None:
        with contextlib.suppress(self.nvml.NVMLError, AttributeError):
            return _text(self.nvml.nvmlDeviceGetUUID(self.handle))
        return None

    @property
    def torch_device(self) -> str:
        """`cuda:<k>` for the CUDA device with this GPU's UUID; `cuda:<index>` where torch cannot tell."""
        try:
            import torch

            if torch.cuda.is_available():
                for k in range(torch.cuda.device_count()):
                    uuid = str(getattr(torch.cuda.get_device_properties(k), "uuid", ""))
                    if uuid and self.device_id.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                        return f"cuda:{k}"
        except Exception as e:  # noqa: BLE001 - an unusual torch build: fall back to the NVML index
            log.debug("cannot map GPU %s to a CUDA device: %s", self.device_id, e)
        return f"cuda:{self.index}"

    @property
    def frequencies_mhz(self) -> list[float]:
        n = self.nvml
        mem = max(n.nvmlDeviceGetSupportedMemoryClocks(self.handle))
        return sorted(float(c) for c in set(n.nvmlDeviceGetSupportedGraphicsClocks(self.handle, mem)))

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError as e:
            if _is_permission(self.nvml, e):
                raise DevicePermissionError(
                    f"NVML refused to {what} on GPU {self.index} (no permission); run as root or enable it with "
                    "'sudo nvidia-smi -acp UNRESTRICTED' where the driver allows, or meter only with --observe"
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

    def clocks_locked(self) -> bool:
        reasons = self.clocks_event_reasons()
        bit = getattr(self.nvml, "nvmlClocksEventReasonApplicationsClocksSetting",
                      getattr(self.nvml, "nvmlClocksThrottleReasonApplicationsClocksSetting", APPLICATIONS_CLOCKS_SETTING))
        return bool(reasons is not None and reasons & bit)

    def lock_clocks(self, mhz: float) -> None:
        self._call("lock the graphics clock", self.nvml.nvmlDeviceSetGpuLockedClocks, int(mhz), int(mhz))

    def reset_clocks(self) -> None:
        self._call("reset the locked clocks", self.nvml.nvmlDeviceResetGpuLockedClocks)

    def restore_settings(self, settings: dict[str, Any]) -> None:
        """Undo our own lock. Sessions only lock where no lock was found, so a reset is exact."""
        self.reset_clocks()

    def energy_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError as e:
            if _is_not_supported(self.nvml, e):
                return None
            raise

    def power_w(self) -> float:
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

    def session(self, freq: FreqRequest, observe: bool = False, label: str = "") -> NvmlSession:
        """A session at `freq` (`label` names the measurement; real hardware needs nothing of it)."""
        return NvmlSession(self, parse_freq(freq, self.frequencies_mhz), observe=observe)

    def info(self) -> DeviceInfo:
        counter = self.energy_mj() is not None
        detail = {"gpu": self.gpu_name, "index": self.index, "uuid": self.device_id, "energy_counter": counter,
                  "clocks_locked": self.clocks_locked(), "torch_device": self.torch_device}
        temp = self.temperature_c()
        if temp is not None:
            detail["gpu_temp_c"] = temp
        return DeviceInfo("nvml", self.profile, self.frequencies_mhz, self.current_mhz(), "default (nvml)", ["gpu"], False, detail)


class NvmlSession(FreqSession):
    device: NvmlDevice

    def __init__(self, device: NvmlDevice, freq: FreqRequest, observe: bool = False):
        super().__init__(device, freq, observe=observe)
        self._ownership = ClockOwnership("nvml", device.device_key, device.restore_settings)
        self._locked = False
        self._sampler: PowerSampler | None = None
        self._marks: list[tuple[int, int | None]] = []

    def _apply(self) -> None:
        dev = self.device
        self._ownership.claim()
        if self.freq == MAXN:
            return  # the board's default as found: an administrator's lock stays as it is
        if dev.clocks_locked():
            self._ownership.release()
            raise DvfsError(f"the clocks of GPU {dev.index} ({dev.gpu_name}) are already locked by someone else and NVML "
                            "cannot read that lock back to restore it; ask its administrator to unlock them "
                            "(nvidia-smi -i N -rgc) or meter without pinning (--observe)")
        self._ownership.record({"index": dev.index, "uuid": dev.device_id, "action": "reset_locked_clocks"}, freq_label(self.freq))
        try:
            dev.lock_clocks(float(self.freq))
        except DevicePermissionError:
            raise  # nothing was locked; __enter__ releases the claim
        except BaseException:
            with contextlib.suppress(Exception):  # a lock call that failed half-way: undo whatever it did
                dev.reset_clocks()
            raise
        self._locked = True

    def _repin(self, mhz: float) -> None:
        """Lock another clock; a session entered at maxn journals the reset first, as `_apply` does."""
        dev = self.device
        if not self._locked:
            if dev.clocks_locked():
                raise DvfsError(f"the clocks of GPU {dev.index} ({dev.gpu_name}) are already locked by someone else; "
                                "refine cannot move them (nvidia-smi -i N -rgc, or --refine 0)")
            self._ownership.record({"index": dev.index, "uuid": dev.device_id, "action": "reset_locked_clocks"}, freq_label(mhz))
            self._locked = True  # from here on the exit resets, whether or not the lock call below completes
        dev.lock_clocks(mhz)

    def _restore(self) -> None:
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

    def _start_meter(self) -> None:
        dev = self.device
        temp = dev.temperature_c()
        if temp is not None:
            self.context["gpu_temp_c"] = temp
        self._sampler = PowerSampler(lambda: (dev.power_w(),), ["gpu"], dev.util_pct, dev.sample_hz, read_clock=dev.current_mhz)
        self._marks = []
        self._sampler.start()
        self._start = (0, dev.energy_mj())

    def _mark(self) -> Any:
        assert self._sampler is not None
        return (self._sampler.mark(), self.device.energy_mj())

    def _counter_j(self, e0: int | None, e1: int | None) -> dict[str, float] | None:
        return {"gpu": (e1 - e0) / 1000.0} if e0 is not None and e1 is not None else None

    def _stop_meter(self) -> EnergyReport:
        assert self._sampler is not None
        self._sampler.stop()  # first: the counter must cover the whole sampled interval
        e1 = self.device.energy_mj()
        temp = self.device.temperature_c()
        if temp is not None:
            self.context["gpu_temp_c_end"] = temp
        return self._sampler.report(energy_override_j=self._counter_j(self._start[1], e1), **self._judge())

    def _window_report(self, start: Any, end: Any) -> EnergyReport:
        assert self._sampler is not None
        return self._sampler.report(start[0], end[0], energy_override_j=self._counter_j(start[1], end[1]), **self._judge())

    def _judge(self) -> dict[str, Any]:
        return {"pinned_mhz": self.pinned_mhz, "table_mhz": self.device.frequencies_mhz}
