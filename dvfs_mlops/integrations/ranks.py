"""One job, several ranks (`torchrun`, `accelerate launch`: LOCAL_RANK is set): which GPU a rank pins, rank 0's one
decision for all, and every rank's report gathered for rank 0's run.

Each rank pins and meters its own GPU: the one whose UUID torch reports for the model's CUDA device, else (the model
on the CPU) the LOCAL_RANK-th GPU the job sees (`hw.multi.rank_gpu_index`). Where a process group is initialised
(Trainer does it under torchrun) rank 0 alone decides and broadcasts the decision (`torch.distributed.
broadcast_object_list`), so every rank runs at one clock; at the end the ranks' `GpuEnergy` are gathered
(`all_gather_object`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from types import ModuleType

    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.hw.multi import GpuEnergy
    from dvfs_mlops.hw.nvml import NvmlDevice
    from dvfs_mlops.mlops.launch import Decision


def process_group() -> ModuleType | None:
    """`torch.distributed` where a process group of several ranks is initialised (Trainer's, under torchrun), else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def rank_device(device: Device | str, sample_hz: float | None, uuid: str | None, say: Callable[[str], None]) -> Device:
    """The device this process pins: `device` (an open one, or a backend name to open), and under a launcher the
    rank's own GPU, opened like the one given.

    Args:
        device: an open `Device`, or a backend name for `open_device`.
        sample_hz: the meter's rate when `device` is a name (None: `open_device`'s).
        uuid: the UUID of the CUDA device the model is on (None: not on CUDA, or a torch device was named).
        say: where the one-line device statement goes.
    """
    from dvfs_mlops import settings
    from dvfs_mlops.hw import describe_device, open_device

    given = not isinstance(device, str)
    rate: dict[str, Any] = {} if sample_hz is None else {"sample_hz": sample_hz}
    local = settings.local_rank()
    if local is None:
        return device if not isinstance(device, str) else open_device(device, announce=say, **rate)
    dev = device if not isinstance(device, str) else open_device(device, **rate)
    if dev.name == "nvml":
        from dvfs_mlops.hw.multi import rank_gpu_index

        nvml = cast("NvmlDevice", dev)
        index = rank_gpu_index(nvml, local, uuid)
        if index != nvml.index:
            other = open_device("nvml", nvml_module=nvml.nvml, gpu_index=index, sample_hz=nvml.sample_hz,
                                assume_unlocked=nvml.assume_unlocked)
            if not given:
                nvml.close()
            dev = other
    say(describe_device(dev, "" if given else str(device)) + f" (LOCAL_RANK {local})")
    return dev


def decide_once(group: ModuleType | None, decide: Callable[[], Decision]) -> Decision:
    """`decide()` made by this process, or under a process group by rank 0 alone and broadcast, so every rank runs at
    one clock.

    Raises:
        DvfsError: the decision failed (on rank 0: its own error; elsewhere one line with rank 0's).
    """
    if group is None:
        return decide()
    shared: list[Any] = [None]
    if group.get_rank() == 0:
        try:
            shared = [decide()]
        except Exception as e:
            group.broadcast_object_list([{"error": f"{type(e).__name__}: {e}"}], src=0)
            raise
    group.broadcast_object_list(shared, src=0)
    got = shared[0]
    if isinstance(got, dict) and "error" in got:
        raise DvfsError(f"rank 0 could not decide the clock ({' '.join(got['error'].split())[:300]}); see its output")
    return got


def gather(group: ModuleType, device: Device, board: Board, report: EnergyReport) -> tuple[GpuEnergy, ...]:
    """Every rank's `GpuEnergy` (its power series left out), in rank order; a collective every rank calls."""
    from dvfs_mlops.hw.multi import GpuEnergy

    rank = group.get_rank()
    mine = GpuEnergy(int(getattr(device, "index", 0)), str(board.device_id), dataclasses.replace(report, power_series_w=[]), rank)
    every: list[Any] = [None] * group.get_world_size()
    group.all_gather_object(every, mine)
    return tuple(sorted(every, key=lambda g: g.rank))
