"""Device backends behind one interface; `open_device("auto")` picks jetson, then nvml, then sim; `replay` plays a measured
grid (`hw/replay.py`) and is only ever opened by name."""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from dvfs_mlops.errors import DeviceNotFoundError, DvfsError, RestoreFailedError, unknown
from dvfs_mlops.hw.device import (
    MAXN,
    Device,
    DeviceInfo,
    FreqRequest,
    FreqSession,
    freq_label,
    parse_freq,
)

if TYPE_CHECKING:
    from dvfs_mlops.hw.guard import Journal
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.hw.nvml import NvmlDevice
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.params import OrinTwinParams

log = logging.getLogger(__name__)

BACKENDS = ("auto", "jetson", "nvml", "sim", "replay")


def open_device(name: str = "auto", *, sample_hz: float = 50.0, nvml_module: ModuleType | None = None,
                gpu_index: int = 0, twin_params: OrinTwinParams | None = None, seed: int = 0, announce: Callable[[str], None] | None = None,
                assume_unlocked: bool = False, trace: str | Path | None = None, trace_columns: Collection[str] = ()) -> Device:
    """Open a device backend by name.

    `auto` takes jetson where a Jetson GPU devfreq node exists, else nvml where NVML starts and sees
    GPU `gpu_index`, else the simulated twin; it never takes `replay`, which needs its `trace`.

    Args:
        name: `auto`, `jetson`, `nvml`, `sim` or `replay`.
        sample_hz: power/clock sampling rate of the meter thread (jetson, nvml).
        nvml_module: a `pynvml`-compatible module used instead of `nvidia-ml-py` (nvml; tests pass a fake).
        gpu_index: the NVML index of the GPU (nvml).
        twin_params: the twin's constants (sim; None: the default profile).
        seed: the twin's noise seed (sim).
        announce: called once with the one-line "device: ..." statement (`describe_device`); None says nothing.
        assume_unlocked: nvml: pin although NVML cannot tell whether the GPU's clocks are locked already (`NvmlDevice`).
        trace: replay: the measured grid's CSV (`hw/replay.py`).
        trace_columns: replay: the per-workload columns the grid may carry besides the format's (the governor's features).

    Returns:
        The open `Device`; `close()` it when done.

    Raises:
        UnknownNameError: `name` is not one of `BACKENDS`.
        DeviceNotFoundError: `jetson` or `nvml` was asked for explicitly and is not present.
        DvfsError: `replay` without a `trace`, or a trace that is not a valid grid (one line each).
    """
    if name not in BACKENDS:
        raise unknown("device", name, BACKENDS)
    if name == "replay":
        from dvfs_mlops.hw.replay import ReplayDevice

        if not trace:
            raise DvfsError("--device replay plays a measured grid: give it --trace FILE.csv (columns workload, gpu_mhz, time_s, energy_j)")
        dev: Device = ReplayDevice(trace, workload_columns=trace_columns)
        _say(announce, name, dev)
        return dev
    if name in ("auto", "jetson"):
        from dvfs_mlops.hw.jetson import JetsonDevice, find_gpu_devfreq

        if name == "jetson" or find_gpu_devfreq() is not None:
            dev = JetsonDevice(sample_hz=sample_hz)
            _say(announce, name, dev)
            return dev
    if name in ("auto", "nvml"):
        from dvfs_mlops.hw.nvml import NvmlDevice

        try:
            dev = NvmlDevice(index=gpu_index, nvml=nvml_module, sample_hz=sample_hz, assume_unlocked=assume_unlocked)
            _say(announce, name, dev)
            return dev
        except DeviceNotFoundError:
            if name == "nvml":
                raise
    from dvfs_mlops.hw.sim import SimDevice

    dev = SimDevice(params=twin_params, seed=seed)
    _say(announce, name, dev)
    return dev


def describe_device(dev: Device, requested: str = "") -> str:
    """The one-line "device: ..." statement of an open device; the twin's says its measurements are SIMULATED, a replay's
    that they are REPLAYED.

    Args:
        dev: an open `Device`.
        requested: the backend name it was opened with; `auto` appends " [auto]".

    Returns:
        The statement, e.g. "device: nvml (NVIDIA H100, GPU 0) [auto]".
    """
    if dev.name == "jetson":
        what = f"jetson ({dev.profile}, devfreq {cast('JetsonDevice', dev).node})"
    elif dev.name == "nvml":
        nvml = cast("NvmlDevice", dev)
        what = f"nvml ({nvml.gpu_name}, GPU {nvml.index})"
    elif dev.name == "replay":
        from dvfs_mlops.hw.replay import replay_statement

        what = replay_statement(cast("ReplayDevice", dev))
    else:
        what = f"sim ({dev.profile}: a simulated {cast('SimDevice', dev).params.family} twin, measurements are SIMULATED)"
    return f"device: {what}" + (" [auto]" if requested == "auto" else "")


def _say(announce: Callable[[str], None] | None, requested: str, dev: Device) -> None:
    if announce is not None:
        announce(describe_device(dev, requested))


def restore_journals(announce: Callable[[str], None] = log.info, directory: str | Path | None = None,
                     nvml_module: ModuleType | None = None) -> int:
    """Put back the clocks of every journal a dead process left (`dvfs-mlops restore`).

    A journal whose owner still runs is skipped (announced), and so is one of an unknown backend. A
    journal whose restore fails is kept and the others are still tried. A user other than root, where the clock
    service runs, asks the service, which keeps the journals (`clockd`).

    Args:
        announce: called with one line per journal restored or skipped, or "nothing to restore".
        directory: the journal folder (None: the default, `guard.journal_dir()`).
        nvml_module: a `pynvml`-compatible module for nvml journals (tests pass a fake).

    Returns:
        How many journals were restored.

    Raises:
        RestoreFailedError: a restore failed (the first failure is named; its journal is kept for a retry).
    """
    from pathlib import Path

    from dvfs_mlops.hw.guard import ClockOwnership, list_journals

    if directory is None:
        from dvfs_mlops.hw.clockd.client import restore_through_service, use_service

        service = use_service()
        if service is not None:
            return restore_through_service(service, announce)
    restored = 0
    failed: list[str] = []
    for _path, journal in list_journals(Path(directory) if directory else None):
        try:
            restorer = _restorer_for(journal, nvml_module)
        except DvfsError as e:
            announce(f"cannot restore {journal.device_key}: {e}")
            continue
        own = ClockOwnership(journal.backend, journal.device_key, restorer, Path(directory) if directory else None, announce=lambda _m: None)
        try:
            own.claim()  # applies the leftover journal; refuses if its owner still runs
        except RestoreFailedError as e:  # the journal is kept: a later `restore` retries it
            failed.append(str(e))
            continue
        except DvfsError as e:
            announce(f"skipped {journal.device_key}: {e}")
            continue
        try:
            if own.recovered is not None:
                announce(f"restored {journal.device_key} ({journal.backend}): {_describe(journal.settings)} (was pinned at {journal.requested} by PID {journal.pid})")
                restored += 1
        finally:
            own.release()
    if failed:
        raise RestoreFailedError(failed[0] if len(failed) == 1 else f"{len(failed)} restores failed; first: {failed[0]}")
    if restored == 0:
        announce("nothing to restore: no journal left by a killed run")
    return restored


def _restorer_for(journal: Journal, nvml_module: ModuleType | None = None) -> Callable[[dict], None]:
    if journal.backend == "jetson":
        from pathlib import Path

        from dvfs_mlops.hw.jetson import JetsonDevice

        return JetsonDevice(node=Path(journal.settings["node"])).restore_settings
    if journal.backend in ("cpufreq", "emc"):
        # The policies and BPMP's EMC clock found again under the sysfs root, never at a path the journal names.
        from dvfs_mlops.hw.cpufreq import CpuClocks
        from dvfs_mlops.hw.emc import EmcClock
        from dvfs_mlops.hw.jetson import read_power_mode
        from dvfs_mlops.hw.sysfs import sysfs_root

        root = sysfs_root()
        if journal.backend == "emc":
            return EmcClock(root).restore_settings
        return lambda settings: CpuClocks(root).restore_settings(settings, read_power_mode(root))
    if journal.backend in ("nvml", "nvml-memory"):
        from dvfs_mlops.hw.nvml import NvmlDevice

        def restore_nvml(settings: dict) -> None:
            # The GPU the journal names by UUID, wherever NVML numbers it now: NVML's index order "has no guarantees of
            # consistency between reboots" (NVML API reference, nvmlDeviceGetHandleByIndex), and a GPU removed or added
            # renumbers the others. Opened when the journal is applied (not for one from an earlier boot, which is
            # dropped unapplied); a GPU that is gone fails the restore in one line and the journal is kept.
            dev = NvmlDevice.for_journal(settings, nvml=nvml_module)
            try:
                dev.restore_settings(settings)
            finally:
                dev.close()

        return restore_nvml
    raise DvfsError(f"journal for unknown backend {journal.backend!r}")


def _describe(settings: dict) -> str:
    keys = [k for k in ("min_freq", "max_freq", "governor", "action", "mrq_rate_locked") if k in settings]
    parts = [f"{k}={settings[k]}" for k in keys]
    for name, entry in dict(settings.get("policies", {})).items():
        if isinstance(entry, dict):
            parts.append(f"{name} {entry.get('min_khz')}..{entry.get('max_khz')} kHz")
    return ", ".join(parts)


__all__ = ["BACKENDS", "MAXN", "Device", "DeviceInfo", "FreqRequest", "FreqSession", "describe_device", "freq_label", "open_device",
           "parse_freq", "restore_journals"]
