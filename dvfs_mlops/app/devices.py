"""The device a command runs on, as the command line chose it (`DeviceChoice`), and `dvfs-mlops devices`.

`DeviceChoice` is what the device options (--device, --sample-hz, --gpu-index, --assume-unlocked, --torch-device,
--twin-profile, --twin-params, --device-id, --trace, --above-mode-cap) ask for; `load_twin` and `open_chosen` turn it into the twin's constants
and an open device, with the checks every command makes the same way. A replay device (`--device replay --trace FILE`)
plays a measured grid whose workloads may carry the governor's feature columns (`model.workload.FEATURE_COLUMNS`) and
a `split` column (train or eval: the workload's side of the governor's held-out split; default train).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.placement import check_torch_device

# --trace's help: the columns of a replay grid (hw/replay.py) and their units.
TRACE_HELP = ("replay: the measured grid to play: workload, gpu_mhz (MHz), time_s (s) and energy_j (J) of the same unit of work; "
              "optional cpu_mhz, emc_mhz (MHz), power_w (W), repeat, the governor's feature columns and split (train or eval).")
# A replay grid's per-workload columns besides the governor's features: the workload's side of the held-out split.
SPLIT_COLUMN = "split"

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device, DeviceInfo
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.hw.twin.params import OrinTwinParams


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Which device a command asks for.

    Attributes:
        backend: auto, jetson, nvml, sim or replay (`--device`).
        sample_hz: the power meter's sampling rate (jetson, nvml).
        gpu_index: nvml: which GPU, by NVML index.
        assume_unlocked: nvml: pin although NVML cannot tell whether the GPU's clocks are locked already (`NvmlDevice`).
        twin_profile: the twin's board profile (None: sim-orin).
        twin_params: a YAML of twin constants over the profile's (None: none).
        device_id: which board this is, for the runs' tags ('': the backend's own id).
        torch_device: where training runs instead of the backend's own GPU ('': the backend's).
        trace: replay: the measured grid's CSV (None: none given).
        above_mode_cap: jetson: allow a pin above the power mode's GPU, CPU or EMC cap (refused otherwise; recorded).
    """

    backend: str = "auto"
    sample_hz: float = 50.0
    gpu_index: int = 0
    assume_unlocked: bool = False
    twin_profile: str | None = None
    twin_params: str | None = None
    device_id: str = ""
    torch_device: str = ""
    trace: str | None = None
    above_mode_cap: bool = False

    def __post_init__(self) -> None:
        check_torch_device(self.torch_device)
        check_torch_device(settings.torch_device_override() or "", "DVFS_TORCH_DEVICE")
        if self.trace and self.backend != "replay":
            raise DvfsError(f"--trace is the grid a replay device plays; add --device replay (not {self.backend}) or drop --trace")


def load_twin(choice: DeviceChoice) -> OrinTwinParams | None:
    """The twin's constants for --twin-profile/--twin-params, checked before anything runs.

    Args:
        choice: the device choice.

    Returns:
        The twin's parameters; None when neither option is given.

    Raises:
        DvfsError: an unknown profile, or a parameter file that does not load.
    """
    if choice.twin_profile is None and not choice.twin_params:
        return None
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    return load_twin_params(choice.twin_profile, choice.twin_params)


def open_chosen(choice: DeviceChoice, twin: OrinTwinParams | None = None, announce: Callable[[str], None] | None = None) -> Device:
    """Open the chosen backend (with `twin`'s constants on the twin) and set its device id.

    Args:
        choice: the device choice.
        twin: the twin's constants (`load_twin`), None for the default twin or a real board.
        announce: where the 'device: ...' line goes; None says nothing.

    Returns:
        The open device.

    Raises:
        DvfsError: twin constants given for a real board, or the backend cannot be opened.
    """
    from dvfs_mlops.hw import open_device
    from dvfs_mlops.model.workload import FEATURE_COLUMNS

    if twin is not None and choice.backend not in ("auto", "sim"):
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin; drop them or use --device sim (not {choice.backend})")
    replay = choice.backend == "replay"
    dev = open_device(choice.backend, sample_hz=choice.sample_hz, gpu_index=choice.gpu_index, twin_params=twin,
                      announce=None if replay else announce, assume_unlocked=choice.assume_unlocked, trace=choice.trace,
                      trace_columns=(*FEATURE_COLUMNS, SPLIT_COLUMN))
    if replay:
        check_replay_features(cast("ReplayDevice", dev))  # before the device is announced: a bad grid is one line
        if announce is not None:
            announce(announcement(dev, choice))
    if twin is not None and not dev.simulated:
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin, but --device auto found {dev.name}; "
                        "drop them or use --device sim")
    if choice.device_id.strip():
        dev.device_id = choice.device_id.strip()
    if choice.above_mode_cap and dev.name == "jetson":
        cast("JetsonDevice", dev).above_mode_cap = True  # recorded by its sessions (context "above_mode_cap")
    return dev


def check_replay_features(device: ReplayDevice) -> None:
    """A replay grid's feature columns hold what the governor reads: numbers, except `model_type` (encoder or decoder)
    and `precision` (fp32, bf16 or fp16); its `split` column is train or eval.

    Args:
        device: an open replay device.

    Raises:
        DvfsError: a feature value of the wrong kind (one line naming the workload and the column).
    """
    choices = {"model_type": ("encoder", "decoder"), "precision": ("fp32", "bf16", "fp16"), SPLIT_COLUMN: ("train", "eval")}
    for workload, features in device.grid.features.items():
        for column, value in features.items():
            if column in choices:
                if value not in choices[column]:
                    raise DvfsError(f"{device.grid.path}: workload {workload!r} has {column} {value!r}; it is one of "
                                    f"{', '.join(choices[column])}")
                continue
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or number < 0:
                raise DvfsError(f"{device.grid.path}: workload {workload!r} has {column} {value!r}; it must be a number >= 0")


def refuse_replay(choice: DeviceChoice, what: str) -> None:
    """Refuse a command that runs or trains something on a replay device, which only plays what was measured.

    Args:
        choice: the device choice.
        what: what the command would do ('run', 'train').

    Raises:
        DvfsError: `choice` is a replay device.
    """
    if choice.backend == "replay":
        raise DvfsError(f"nothing to {what} on a replay device: it plays the measurements of a grid and runs nothing; "
                        "use --device jetson, nvml or sim")


def announcement(device: Device, choice: DeviceChoice) -> str:
    """The one-line 'device: ...' announcement of an open device ('[auto]' when --device auto picked it)."""
    from dvfs_mlops.hw import describe_device

    return describe_device(device, choice.backend)


def device_info(choice: DeviceChoice, announce: Callable[[str], None] | None = None) -> DeviceInfo:
    """`dvfs-mlops devices`: the chosen backend's frequency table, current clock and power rails.

    Args:
        choice: the device choice.
        announce: where the 'device: ...' line goes; None says nothing.

    Returns:
        The backend's `DeviceInfo`.

    Raises:
        DvfsError: the backend cannot be opened.
    """
    return open_chosen(choice, announce=announce).info()


def info_lines(info: DeviceInfo) -> list[str]:
    """The `DeviceInfo` as `dvfs-mlops devices` prints it (a simulated backend says so, and so does a replayed one)."""
    from dvfs_mlops.hw.replay import REPLAYED

    label = " (SIMULATED)" if info.simulated else f" ({REPLAYED})" if info.backend == "replay" else ""
    lines = [f"backend:      {info.backend}{label}",
             f"profile:      {info.profile}",
             f"frequencies:  {', '.join(f'{f:g}' for f in info.frequencies_mhz)} MHz",
             f"current:      {f'{info.current_mhz:g} MHz' if info.current_mhz else 'n/a'}",
             f"governor:     {info.governor or 'n/a'}",
             f"rails:        {', '.join(info.rails) or 'none found'}"]
    return lines + [f"{k + ':':13s} {v}" for k, v in info.detail.items()]
