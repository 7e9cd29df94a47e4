"""Several GPUs of one job: every GPU it can see opened, pinned, metered and restored together.

A job started with `torchrun --nproc-per-node N` (or any program that spreads over GPUs) runs on every GPU CUDA lets it
see (`placement.visible_gpus`: CUDA_VISIBLE_DEVICES, else all of them). `open_visible` opens one nvml device per such GPU,
`GpuSessions` enters one session per GPU in NVML index order (any failure restores those already pinned, through
`contextlib.ExitStack`) and `combine` adds their reports into one: the job's energy is the sum of its GPUs'. Each
GPU's session keeps its own lock and journal (`hw/guard.py`), so a process that dies leaves journals `dvfs-mlops
restore` puts back, one per GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.device import FreqRequest
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.hw.placement import cuda_uuids, local_gpu, visible_gpus


@dataclasses.dataclass(frozen=True)
class GpuEnergy:
    """One GPU's part of a job: its NVML index, its UUID, the launcher's rank that ran on it (None: no launcher) and
    its `EnergyReport`."""

    index: int
    uuid: str
    report: EnergyReport
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: index, uuid, rank and every field of the report."""
        return {"index": self.index, "uuid": self.uuid, "rank": self.rank, **self.report.to_dict()}


def combine(reports: Sequence[EnergyReport]) -> EnergyReport:
    """One report for GPUs metered side by side over the same job.

    Energies add up (per rail name, so `energy_j` and `energy_total_j` are the sums); the duration is the longest;
    `avg_power_w` is the summed energy over it; `peak_power_w` is the sum of the GPUs' peaks (an upper bound of the
    job's peak: the GPUs' peaks need not coincide); utilisation and the measured clock are the GPUs' means; the clock
    held only where every GPU held it; samples and failures add up; simulated where any is.

    Raises:
        ValueError: no reports.
    """
    if not reports:
        raise ValueError("no reports to combine")
    if len(reports) == 1:
        return reports[0]
    rails: dict[str, float] = {}
    for r in reports:
        for rail, joules in r.energy_by_rail_j.items():
            rails[rail] = rails.get(rail, 0.0) + joules
    duration = max(r.duration_s for r in reports)
    total = sum(r.energy_total_j for r in reports)
    held = [r.clock_held for r in reports]
    return EnergyReport(
        duration_s=duration, energy_j=sum(r.energy_j for r in reports), energy_total_j=total, energy_by_rail_j=rails,
        avg_power_w=total / duration if duration > 0 else 0.0, peak_power_w=sum(r.peak_power_w for r in reports),
        gpu_util_pct=_mean([r.gpu_util_pct for r in reports]), samples=sum(r.samples for r in reports),
        simulated=any(r.simulated for r in reports), clock_mhz_measured=_mean([r.clock_mhz_measured for r in reports]),
        clock_held=None if None in held else all(held), samples_failed=sum(r.samples_failed for r in reports),
        energy_rails=reports[0].energy_rails, total_rails=reports[0].total_rails,
        cpu_gpu_combined=reports[0].cpu_gpu_combined, clock_source=reports[0].clock_source)


def _mean(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None) / len(values)


def _nvml_gpu_units(first: Any) -> list[set[str]]:
    """For each NVML index, the bare UUIDs CUDA may report for that GPU (its own and its MIG devices')."""
    from dvfs_mlops.hw import open_device

    units: list[set[str]] = []
    for i in range(int(first.nvml.nvmlDeviceGetCount())):
        if i == first.index:
            units.append(set(first.cuda_uuids))
            continue
        dev = open_device("nvml", nvml_module=first.nvml, gpu_index=i)
        try:
            units.append(set(dev.cuda_uuids))
        finally:
            dev.close()
    return units


def visible_indices(first: Any, use_torch: bool = True) -> list[int]:
    """The NVML indices of every GPU the job can see (`placement.visible_gpus`), found through the open nvml device
    `first`; torch's own list where `use_torch` and torch has CUDA."""
    seen = cuda_uuids() if use_torch else None
    return visible_gpus(_nvml_gpu_units(first), settings.cuda_visible_devices(), seen)


def open_visible(first: Any) -> list[Any]:
    """One open nvml device per GPU the job can see, in NVML index order, opened like `first` (its NVML module,
    sampling rate and `assume_unlocked`); `first` is among them where it is visible, else closed.

    Torch is not asked (the `run` command starts no CUDA context of its own): CUDA_VISIBLE_DEVICES decides.

    Raises:
        DvfsError: the job can see no GPU, or CUDA_VISIBLE_DEVICES names some GPUs by index (`placement.visible_gpus`).
    """
    from dvfs_mlops.hw import open_device

    try:
        wanted = sorted(visible_indices(first, use_torch=False))
        if not wanted:
            raise DvfsError(f"CUDA_VISIBLE_DEVICES={settings.cuda_visible_devices()!r} leaves the job no GPU to pin; "
                            "unset it or name the GPUs (nvidia-smi -L)")
    except BaseException:
        first.close()
        raise
    devices: list[Any] = []
    try:
        for i in wanted:
            devices.append(first if i == first.index else open_device(
                "nvml", nvml_module=first.nvml, gpu_index=i, sample_hz=first.sample_hz, assume_unlocked=first.assume_unlocked))
    except BaseException:
        for dev in devices:
            dev.close()
        if first not in devices:
            first.close()
        raise
    if first not in devices:
        first.close()
    return devices


def rank_gpu_index(first: Any, local_rank: int, model_uuid: str | None = None) -> int:
    """The NVML index of the GPU a launcher's process trains on: the GPU whose UUID torch reports for the model's
    device where it is on CUDA, else the LOCAL_RANK-th GPU the job sees (`placement.local_gpu`).

    Raises:
        DvfsError: no NVML GPU has the model's UUID, or LOCAL_RANK has no GPU of its own.
    """
    units = _nvml_gpu_units(first)
    if model_uuid:
        for i, uuids in enumerate(units):
            if model_uuid in uuids:
                return i
        raise DvfsError(f"the model's CUDA device ({model_uuid}) is no GPU NVML sees")
    return local_gpu(visible_gpus(units, settings.cuda_visible_devices(), cuda_uuids()), local_rank)


class GpuSessions:
    """One clock session per device, entered in the given order and left in reverse, as one context manager.

    Any failure on the way in (a refused pin, a busy GPU) restores the sessions already entered before it propagates;
    leaving restores every one (each session's own restore and journal, `FreqSession`).
    """

    def __init__(self, devices: Sequence[Any], freq: FreqRequest, observe: bool = False, label: str = ""):
        self.devices = list(devices)
        self.sessions = [dev.session(freq, observe=observe, label=label) for dev in self.devices]
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> GpuSessions:
        with contextlib.ExitStack() as stack:
            for session in self.sessions:
                stack.enter_context(session)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> bool | None:
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc) if stack is not None else None

    def reports(self) -> list[GpuEnergy]:
        """Each GPU's `GpuEnergy`, in the sessions' order (after the block)."""
        return [GpuEnergy(int(getattr(dev, "index", 0)), str(getattr(dev, "device_id", "")), s.report())
                for dev, s in zip(self.devices, self.sessions, strict=True)]
