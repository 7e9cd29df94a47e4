"""Where training runs: the torch device a backend names, checked before any clock is touched.

A pinned GPU clock is only worth anything if the model trains on that GPU. Each backend names
its torch device (jetson "cuda", nvml "cuda:<index>", sim "cpu"); `resolve_torch_device` checks
that torch can reach it and fails with one line when it cannot, so a run never trains silently
on the CPU while the GPU idles at the pinned clock. `--torch-device` overrides the choice (tests,
unusual set-ups).
"""
from __future__ import annotations

from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError


class TorchDeviceError(DvfsError):
    """The backend's GPU is not reachable from this torch build."""


def resolve_torch_device(device: Any, override: str | None = None) -> str:
    """The torch device to train on for `device`, checked; raises TorchDeviceError before any clock write."""
    wanted = override or settings.torch_device_override() or getattr(device, "torch_device", "cpu")
    if not str(wanted).startswith("cuda"):
        return str(wanted)
    import torch

    if not torch.cuda.is_available():
        backend = getattr(device, "name", "this")
        raise TorchDeviceError(
            f"torch {torch.__version__} cannot use CUDA (torch.cuda.is_available() is False), so the {backend} backend "
            "would pin the GPU clock while training on the CPU; install a CUDA build of torch "
            "(on a Jetson: NVIDIA's JetPack wheel, see the README) or pass --torch-device cpu to meter a CPU run on purpose"
        )
    index = int(str(wanted).split(":", 1)[1]) if ":" in str(wanted) else 0
    if index >= torch.cuda.device_count():
        raise TorchDeviceError(f"torch sees {torch.cuda.device_count()} CUDA device(s); {wanted} does not exist "
                               "(check CUDA_VISIBLE_DEVICES, or pass --torch-device)")
    return str(wanted)


def synchronize(torch_device: str) -> None:
    """Wait for queued GPU work, so a step boundary (and its meter mark) is where the work really ended."""
    if torch_device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch_device)
