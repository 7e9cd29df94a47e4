"""NVML backend (nvidia-ml-py): locked graphics clocks and the board energy counter.

The `pynvml` module is injectable so tests run against a fake with the same names, return types
and error classes as the real one.
"""
from __future__ import annotations

import contextlib
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
        if index >= count:
            raise DeviceNotFoundError(f"NVML sees {count} GPU(s); index {index} does not exist")
        self.index = index
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        self.gpu_name = _text(self.nvml.nvmlDeviceGetName(self.handle))
        self.profile = "nvml-" + "-".join(self.gpu_name.lower().replace("nvidia", "").split())
        self.device_key = f"nvml-{index}"
        self.sample_hz = sample_hz

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
                    "'sudo nvidia-smi -acp UNRESTRICTED' where the driver allows"
                ) from None
            raise DvfsError(f"NVML could not {what} on GPU {self.index}: {e}") from None

    def lock_clocks(self, mhz: float) -> None:
        self._call("lock the graphics clock", self.nvml.nvmlDeviceSetGpuLockedClocks, int(mhz), int(mhz))

    def reset_clocks(self) -> None:
        self._call("reset the locked clocks", self.nvml.nvmlDeviceResetGpuLockedClocks)

    def restore_settings(self, settings: dict[str, Any]) -> None:
        """NVML cannot read back a previous lock; DVFS is restored by resetting it (the default)."""
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

    def session(self, freq: FreqRequest) -> NvmlSession:
        return NvmlSession(self, parse_freq(freq, self.frequencies_mhz))

    def info(self) -> DeviceInfo:
        counter = self.energy_mj() is not None
        return DeviceInfo(
            "nvml", self.profile, self.frequencies_mhz, self.current_mhz(), "default (nvml)", ["gpu"], False,
            {"gpu": self.gpu_name, "index": self.index, "energy_counter": counter},
        )


class NvmlSession(FreqSession):
    device: NvmlDevice

    def __init__(self, device: NvmlDevice, freq: FreqRequest):
        super().__init__(device, freq)
        self._ownership = ClockOwnership("nvml", device.device_key, device.restore_settings)
        self._locked = False
        self._sampler: PowerSampler | None = None
        self._e0: int | None = None

    def _apply(self) -> None:
        self._ownership.claim()
        self._ownership.record({"index": self.device.index, "action": "reset_locked_clocks"}, freq_label(self.freq))
        if self.freq != MAXN:
            self._locked = True  # set before the call: a half-done lock must still be reset
            self.device.lock_clocks(float(self.freq))
        else:
            self.device.reset_clocks()

    def _restore(self) -> None:
        if not self._ownership.lock.held:
            return
        try:
            if self._locked:
                self.device.reset_clocks()
        finally:
            self._locked = False
            self._ownership.release()

    def _start_meter(self) -> None:
        self._e0 = self.device.energy_mj()
        self._sampler = PowerSampler(lambda: (self.device.power_w(),), ["gpu"], self.device.util_pct, self.device.sample_hz)
        self._sampler.start()

    def _stop_meter(self) -> EnergyReport:
        assert self._sampler is not None
        self._sampler.stop()  # first: the counter must cover the whole sampled interval
        override = None
        if self._e0 is not None:
            e1 = self.device.energy_mj()
            if e1 is not None:
                override = {"gpu": (e1 - self._e0) / 1000.0}
        return self._sampler.report(energy_override_j=override)
