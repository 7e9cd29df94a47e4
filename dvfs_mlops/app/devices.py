"""The device a command runs on, as the command line chose it (`DeviceChoice`), and `dvfs-mlops devices`.

`DeviceChoice` is what the device options (--device, --sample-hz, --gpu-index, --assume-unlocked, --torch-device,
--twin-profile, --twin-params, --device-id) ask for; `load_twin` and `open_chosen` turn it into the twin's constants and an open
device, with the checks every command makes the same way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.placement import check_torch_device

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device, DeviceInfo
    from dvfs_mlops.hw.twin.params import OrinTwinParams


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Which device a command asks for.

    Attributes:
        backend: auto, jetson, nvml or sim (`--device`).
        sample_hz: the power meter's sampling rate (jetson, nvml).
        gpu_index: nvml: which GPU, by NVML index.
        assume_unlocked: nvml: pin although NVML cannot tell whether the GPU's clocks are locked already (`NvmlDevice`).
        twin_profile: the twin's board profile (None: sim-orin).
        twin_params: a YAML of twin constants over the profile's (None: none).
        device_id: which board this is, for the runs' tags ('': the backend's own id).
        torch_device: where training runs instead of the backend's own GPU ('': the backend's).
    """

    backend: str = "auto"
    sample_hz: float = 50.0
    gpu_index: int = 0
    assume_unlocked: bool = False
    twin_profile: str | None = None
    twin_params: str | None = None
    device_id: str = ""
    torch_device: str = ""

    def __post_init__(self) -> None:
        check_torch_device(self.torch_device)
        check_torch_device(settings.torch_device_override() or "", "DVFS_TORCH_DEVICE")


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

    if twin is not None and choice.backend not in ("auto", "sim"):
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin; drop them or use --device sim (not {choice.backend})")
    dev = open_device(choice.backend, sample_hz=choice.sample_hz, gpu_index=choice.gpu_index, twin_params=twin, announce=announce,
                      assume_unlocked=choice.assume_unlocked)
    if twin is not None and not dev.simulated:
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin, but --device auto found {dev.name}; "
                        "drop them or use --device sim")
    if choice.device_id.strip():
        dev.device_id = choice.device_id.strip()
    return dev


def announcement(device: Any, choice: DeviceChoice) -> str:
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
    """The `DeviceInfo` as `dvfs-mlops devices` prints it (a simulated backend says so)."""
    label = " (SIMULATED)" if info.simulated else ""
    lines = [f"backend:      {info.backend}{label}",
             f"profile:      {info.profile}",
             f"frequencies:  {', '.join(f'{f:g}' for f in info.frequencies_mhz)} MHz",
             f"current:      {f'{info.current_mhz:g} MHz' if info.current_mhz else 'n/a'}",
             f"governor:     {info.governor or 'n/a'}",
             f"rails:        {', '.join(info.rails) or 'none found'}"]
    return lines + [f"{k + ':':13s} {v}" for k, v in info.detail.items()]
