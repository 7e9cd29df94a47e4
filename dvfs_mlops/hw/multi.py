"""Several GPUs of one job: the GPUs it runs on opened, pinned, metered and restored together.

A job started with `torchrun --nproc-per-node N` (or any program that spreads over GPUs) runs on the GPUs CUDA lets it
see (`placement.visible_gpus`: CUDA_VISIBLE_DEVICES, else all of them). `open_visible` opens one nvml device per such GPU,
`GpuSessions` enters one session per GPU in NVML index order (any failure restores those already pinned, through
`contextlib.ExitStack`) and `combine` adds their reports into one: the job's energy is the sum of its GPUs'. Each
GPU's session keeps its own lock and journal (`hw/guard.py`), so a process that dies leaves journals `dvfs-mlops
restore` puts back, one per GPU.

Where nothing says which GPUs a job uses (CUDA_VISIBLE_DEVICES unset on a box of several), `JobGpuSessions` finds them
while it runs: NVML lists the processes with a compute context on each GPU (nvmlDeviceGetComputeRunningProcesses), and
a GPU is pinned and metered from the moment one of the job's processes (the command or a descendant) appears on it; a
GPU the job never uses is never pinned and never enters the job's energy. A clock lock is device-global (CUPTI Clock
Control API: "Clock locking is device-global"), so pinning every GPU would change other users' jobs too.

Per-GPU figures are keyed by node and GPU (`GpuEnergy.key`: host name and UUID), never by NVML index alone: two nodes
both have a GPU 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.device import Device, FreqRequest, FreqSession, KnobKeywords, open_session
from dvfs_mlops.hw.guard import TerminationGuard
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.hw.placement import cuda_uuids, local_gpu, visible_gpus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from dvfs_mlops.hw.nvml import NvmlDevice


def host_name() -> str:
    """This node's name as a key part: socket.gethostname() with anything but letters, digits, '_', '.' and '-' made
    '-' (what MLflow accepts in metric and tag names besides '/', ':' and ' ')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()) or "localhost"


@dataclasses.dataclass(frozen=True)
class GpuEnergy:
    """One GPU's part of a job: its NVML index, its UUID, the launcher's rank that ran on it (None: no launcher), its
    `EnergyReport`, the node it is on and, where it was found by the job's use, how long after the start it was
    pinned.

    Attributes:
        index: NVML's index of the GPU on its node (not unique across nodes).
        uuid: the GPU's UUID (GPU-...).
        report: its `EnergyReport`.
        rank: the launcher's rank that trained on it (None: no launcher).
        host: the node's name (`host_name`), filled where the object is made: on a launcher, each rank's own node.
        attached_after_s: `JobGpuSessions`: seconds from the command's start until the GPU was pinned and metered (its
            energy before that is not in the report); None where it was metered from the start.
    """

    index: int
    uuid: str
    report: EnergyReport
    rank: int | None = None
    host: str = dataclasses.field(default_factory=host_name)
    attached_after_s: float | None = None

    @property
    def key(self) -> str:
        """The GPU's stable key across nodes: "<host>/<uuid>" (valid in MLflow metric and tag names)."""
        return f"{self.host}/{self.uuid}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: index, uuid, host, key, rank, attached_after_s and every field of the report."""
        return {"index": self.index, "uuid": self.uuid, "host": self.host, "key": self.key, "rank": self.rank,
                "attached_after_s": self.attached_after_s, **self.report.to_dict()}


def combine(reports: Sequence[EnergyReport]) -> EnergyReport:
    """One report for GPUs metered side by side over the same job.

    Energies add up (per rail name, so `energy_j` and `energy_total_j` are the sums); the duration is the longest;
    `avg_power_w` is the summed energy over it; `peak_power_w` is the sum of the GPUs' peaks (an upper bound of the
    job's peak: the GPUs' peaks need not coincide); utilisation and the measured clocks (GPU, memory) are the GPUs'
    means; a clock held only where every GPU held it; samples and failures add up; simulated where any is; the energy
    source is the GPUs' where they agree, else "mixed".

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
    emc_held = [r.emc_held for r in reports]
    sources = {r.energy_source for r in reports}
    return EnergyReport(
        duration_s=duration, energy_j=sum(r.energy_j for r in reports), energy_total_j=total, energy_by_rail_j=rails,
        avg_power_w=total / duration if duration > 0 else 0.0, peak_power_w=sum(r.peak_power_w for r in reports),
        gpu_util_pct=_mean([r.gpu_util_pct for r in reports]), samples=sum(r.samples for r in reports),
        simulated=any(r.simulated for r in reports), clock_mhz_measured=_mean([r.clock_mhz_measured for r in reports]),
        clock_held=None if None in held else all(held), samples_failed=sum(r.samples_failed for r in reports),
        energy_rails=reports[0].energy_rails, total_rails=reports[0].total_rails,
        cpu_gpu_combined=reports[0].cpu_gpu_combined, clock_source=reports[0].clock_source,
        energy_source=sources.pop() if len(sources) == 1 else "mixed", emc_mhz=_mean([r.emc_mhz for r in reports]),
        emc_held=None if None in emc_held else all(emc_held))


def _mean(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None) / len(values)


def _nvml_gpu_units(first: NvmlDevice) -> list[set[str]]:
    """For each NVML index, the bare UUIDs CUDA may report for that GPU (its own and its MIG devices')."""
    from dvfs_mlops.hw import open_device

    units: list[set[str]] = []
    for i in range(int(first.nvml.nvmlDeviceGetCount())):
        if i == first.index:
            units.append(set(first.cuda_uuids))
            continue
        dev = cast("NvmlDevice", open_device("nvml", nvml_module=first.nvml, gpu_index=i))
        try:
            units.append(set(dev.cuda_uuids))
        finally:
            dev.close()
    return units


def visible_indices(first: NvmlDevice, use_torch: bool = True) -> list[int]:
    """The NVML indices of every GPU the job can see (`placement.visible_gpus`), found through the open nvml device
    `first`; torch's own list where `use_torch` and torch has CUDA."""
    seen = cuda_uuids() if use_torch else None
    return visible_gpus(_nvml_gpu_units(first), settings.cuda_visible_devices(), seen)


def open_visible(first: NvmlDevice) -> list[NvmlDevice]:
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
    devices: list[NvmlDevice] = []
    try:
        for i in wanted:
            devices.append(first if i == first.index else cast("NvmlDevice", open_device(
                "nvml", nvml_module=first.nvml, gpu_index=i, sample_hz=first.sample_hz, assume_unlocked=first.assume_unlocked)))
    except BaseException:
        for dev in devices:
            dev.close()
        if first not in devices:
            first.close()
        raise
    if first not in devices:
        first.close()
    return devices


def rank_gpu_index(first: NvmlDevice, local_rank: int, model_uuid: str | None = None) -> int:
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

    def __init__(self, devices: Sequence[Device], freq: FreqRequest, observe: bool = False, label: str = "",
                 **knobs: Unpack[KnobKeywords]):
        self.devices = list(devices)
        self.sessions = [open_session(dev, freq, observe=observe, label=label, **knobs) for dev in self.devices]
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> GpuSessions:
        with contextlib.ExitStack() as stack:
            for session in self.sessions:
                stack.enter_context(session)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        stack, self._stack = self._stack, None
        return stack.__exit__(exc_type, exc, tb) if stack is not None else None

    def reports(self) -> list[GpuEnergy]:
        """Each GPU's `GpuEnergy`, in the sessions' order (after the block)."""
        return [GpuEnergy(int(getattr(dev, "index", 0)), str(getattr(dev, "device_id", "")), s.report())
                for dev, s in zip(self.devices, self.sessions, strict=True)]


class JobGpuSessions:
    """The GPUs a running job uses, each pinned and metered from the moment NVML lists one of the job's processes on it.

    Enter it, start the job, then call `attach` with the job's PID every poll until the job ends (`run.run_in_job` does);
    leaving restores every GPU attached (each session's own restore and journal). Every call runs on the caller's
    thread: a session installs signal handlers, which only the main thread may.

    Args:
        devices: the open nvml devices the job may use (each one's `running_pids`).
        freq: the clock to pin ("maxn": write nothing).
        observe: meter only.
        label: the sessions' label.
        knobs: the memory clock to pin on each GPU as well (`emc_mhz`; `Device.session` keywords).

    Attributes:
        attached: (device, session, seconds after the start) for each GPU the job was seen on, in the order seen.
        foreign_pids: PIDs NVML listed that this machine's /proc does not have (a PID namespace: in a container NVML
            reports the host's PIDs), so the job's use of those GPUs cannot be told.
    """

    def __init__(self, devices: Sequence[NvmlDevice], freq: FreqRequest, observe: bool = False, label: str = "",
                 **knobs: Unpack[KnobKeywords]):
        self.devices = list(devices)
        self.freq, self.observe, self.label = freq, observe, label
        self.knobs = knobs
        self.attached: list[tuple[NvmlDevice, FreqSession, float]] = []
        self.foreign_pids: set[int] = set()
        self._stack: contextlib.ExitStack | None = None
        self._signals = TerminationGuard()
        self._t0 = time.monotonic()
        self._classified: dict[int, bool] = {}  # pid -> one of the job's processes

    def check(self) -> None:
        """Refuse, before the job starts, where NVML cannot list a GPU's processes.

        Raises:
            DvfsError: one line naming --gpu-index, CUDA_VISIBLE_DEVICES and --all-gpus.
        """
        for dev in self.devices:
            if dev.running_pids() is None:
                raise DvfsError(f"CUDA_VISIBLE_DEVICES is unset on a box of {len(self.devices)} GPUs and NVML cannot list GPU "
                                f"{dev.index}'s processes, so the GPUs this command uses cannot be told; name them: "
                                "--gpu-index N, CUDA_VISIBLE_DEVICES=<UUID,...>, or --all-gpus to pin and meter every GPU")

    def __enter__(self) -> JobGpuSessions:
        self._signals.install()  # before any GPU is attached, SIGTERM/SIGHUP still end the job through `run_in_job`
        self._stack = contextlib.ExitStack()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        stack, self._stack = self._stack, None
        try:
            return stack.__exit__(exc_type, exc, tb) if stack is not None else None
        finally:
            self._signals.uninstall()

    @property
    def complete(self) -> bool:
        """Every GPU is attached: nothing is left to look for."""
        return len(self.attached) == len(self.devices)

    def attach(self, job_pid: int) -> list[NvmlDevice]:
        """Pin and meter each GPU not attached yet on which NVML lists a process of the job (`job_pid` or a descendant).

        Returns:
            The devices attached by this call.

        Raises:
            DvfsError: a GPU's pin was refused (the sessions attached before it stay, and are restored on leaving).
        """
        assert self._stack is not None, "enter JobGpuSessions first"
        done = {id(dev) for dev, _s, _t in self.attached}
        new: list[NvmlDevice] = []
        for dev in self.devices:
            if id(dev) in done:
                continue
            pids = dev.running_pids() or set()
            if any(self._is_job(pid, job_pid) for pid in pids):
                session = open_session(dev, self.freq, observe=self.observe, label=self.label, **self.knobs)
                self._stack.enter_context(session)
                self.attached.append((dev, session, time.monotonic() - self._t0))
                new.append(dev)
        return new

    def _is_job(self, pid: int, job_pid: int) -> bool:
        if pid not in self._classified:
            chain = _ancestors(pid)
            if chain is None:
                self.foreign_pids.add(pid)
            self._classified[pid] = chain is not None and job_pid in chain
        return self._classified[pid]

    def reports(self) -> list[GpuEnergy]:
        """Each attached GPU's `GpuEnergy`, in NVML index order (after the block)."""
        return sorted((GpuEnergy(int(dev.index), str(dev.device_id), s.report(), attached_after_s=round(t, 3))
                       for dev, s, t in self.attached), key=lambda g: g.index)


def _ancestors(pid: int, limit: int = 256) -> list[int] | None:
    """`pid` and its parents up to PID 1, from /proc/<pid>/stat (proc(5): field 4 is the parent's PID); None where
    /proc has no such process (a PID from another PID namespace, or one that ended)."""
    chain: list[int] = []
    while pid > 0 and len(chain) < limit:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return chain or None
        chain.append(pid)
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain

