"""Where training runs: the torch device a backend names, checked before any clock is touched.

A pinned GPU clock is only worth anything if the model trains on that GPU. Each backend names
its torch device (jetson "cuda", nvml "cuda:<index>", sim "cpu"); `resolve_torch_device` checks
that torch can reach it and fails with one line when it cannot, so a run never trains silently
on the CPU while the GPU idles at the pinned clock. `--torch-device` overrides the choice (tests,
unusual set-ups).

Which CUDA device is which GPU is told by UUID, in both directions (`cuda_device_of`: a GPU's CUDA device; `cuda_uuid`:
a CUDA device's GPU): NVML warns that its index "may not correlate with other APIs, such as the CUDA device index"
(NVML API reference, nvmlDeviceGetIndex), CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and
CUDA_VISIBLE_DEVICES hides and reorders them (CUDA Programming Guide, "CUDA Environment Variables"). torch reports each
visible device's UUID (`torch.cuda.get_device_properties(k).uuid`, printed as 8-4-4-4-12 hex without nvidia-smi's
GPU-/MIG- prefix: torch/csrc/cuda/Module.cpp, `_CUuuid.__str__`), the MIG UUID for a MIG device (cuDeviceGetUuid_v2).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device


class TorchDeviceError(DvfsError):
    """The backend's GPU is not reachable from this torch build."""


# The device types torch names (torch.device's own list; `torch.device("x")` refuses any other), which a torch device
# override may name with an optional index: checked from the text alone, so a typo is one line before a store or a
# clock is touched and a command that never trains imports no torch for it.
TORCH_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "xla", "hpu", "meta", "ipu", "mtia", "privateuseone")


def check_torch_device(text: str, source: str = "--torch-device") -> None:
    """A torch device override: '' (the backend's own), or TYPE or TYPE:INDEX with a device type torch knows.

    Args:
        text: the override.
        source: where it came from, for the error (--torch-device, DVFS_TORCH_DEVICE, torch_device=).

    Raises:
        DvfsError: anything else, with the valid types.
    """
    if not text:
        return
    kind, sep, index = text.partition(":")
    if kind not in TORCH_DEVICE_TYPES or (sep and not index.isdigit()):
        raise DvfsError(f"{source} {text!r} is not a torch device; give TYPE or TYPE:INDEX with TYPE one of "
                        f"{', '.join(TORCH_DEVICE_TYPES)} (e.g. cpu, cuda:1)")


def resolve_torch_device(device: Device, override: str | None = None) -> str:
    """The torch device to train on for `device`, checked; raises TorchDeviceError (CUDA unreachable) or DvfsError
    (an override that names no torch device) before any clock write."""
    check_torch_device(override or "", "the torch device")
    check_torch_device(settings.torch_device_override() or "", "DVFS_TORCH_DEVICE")
    wanted = override or settings.torch_device_override() or getattr(device, "torch_device", "cpu")
    if not str(wanted).startswith("cuda"):
        return str(wanted)
    import torch

    if not torch.cuda.is_available():
        backend = getattr(device, "name", "this")
        raise TorchDeviceError(
            f"torch {torch.__version__} cannot use CUDA (torch.cuda.is_available() is False), so the {backend} backend "
            "would pin the GPU clock while training on the CPU; install a CUDA build of torch "
            "(on a Jetson: NVIDIA's JetPack wheel, see docs/devices/jetson.md) or pass --torch-device cpu to meter a CPU run on purpose"
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


UUID_PREFIXES = ("GPU-", "MIG-")  # nvidia-smi's forms, which CUDA_VISIBLE_DEVICES takes ("CUDA Environment Variables")


def bare_uuid(text: str) -> str:
    """A UUID as torch prints it: lower case, without nvidia-smi's GPU-/MIG- prefix."""
    t = str(text).strip()
    for prefix in UUID_PREFIXES:
        if t.upper().startswith(prefix):
            return t[len(prefix):].lower()
    return t.lower()


def visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES' entries as CUDA keeps them: None when unset (every GPU visible), [] when empty (none), else
    the entries up to the first that is neither an index nor a GPU-/MIG- UUID. CUDA Programming Guide, "CUDA Environment
    Variables": indices or UUID strings, "abbreviated forms are allowed" (enough leading digits to name one GPU), and
    "if an invalid index is encountered, only devices with indices that appear before the invalid index" are visible."""
    if value is None:
        return None
    kept: list[str] = []
    for entry in (e.strip() for e in value.split(",")) if value.strip() else ():
        if not (entry.isdigit() or entry.startswith(UUID_PREFIXES)):
            break
        kept.append(entry)
    return kept


def cuda_uuids() -> list[str | None] | None:
    """The bare UUID torch reports for each visible CUDA device, in CUDA's order (None for a device whose torch build
    reports none); None when torch has no CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    found: list[str | None] = []
    for k in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(k), "uuid", None)
        found.append(bare_uuid(str(uuid)) if uuid is not None and str(uuid) else None)
    return found


def cuda_uuid(torch_device: str) -> str | None:
    """The bare UUID of the CUDA device `torch_device` names ("cuda" is torch's current one); None where torch cannot
    tell (no CUDA, no such device, no UUID reported)."""
    seen = cuda_uuids()
    if not seen:
        return None
    import torch

    k = int(torch_device.split(":", 1)[1]) if ":" in torch_device else int(torch.cuda.current_device())
    return seen[k] if 0 <= k < len(seen) else None


def cuda_device_of(uuids: Collection[str], gpu: str, nvml_names: Mapping[str, str]) -> str | None:
    """`cuda:<k>` of the visible CUDA device that is the GPU with one of `uuids` (its own and its MIG devices').

    Where torch reports no UUID for a device, a CUDA_VISIBLE_DEVICES entry that names one of `uuids` by UUID or prefix
    tells it (entry k is cuda:k: visible devices "are enumerated in the order of the sequence"); an index entry cannot,
    since CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID.

    Args:
        uuids: the GPU's UUIDs (any form: GPU-/MIG- prefixed or bare).
        gpu: how the error names the GPU, e.g. "GPU 0 (NVIDIA A100, GPU-6b1f...)".
        nvml_names: every UUID NVML sees (prefixed) -> how the error names it, e.g. "NVML GPU 2".

    Returns:
        "cuda:<k>", or None when torch has no CUDA (`resolve_torch_device` says so).

    Raises:
        TorchDeviceError: torch has CUDA and none of its visible devices is this GPU (one line: the GPU, what is visible).
    """
    seen = cuda_uuids()
    if seen is None:
        return None
    wanted = {bare_uuid(u) for u in uuids}
    for k, uuid in enumerate(seen):
        if uuid is not None and uuid in wanted:
            return f"cuda:{k}"
    named = _entry_naming(wanted, nvml_names)
    if named is not None and named < len(seen) and seen[named] is None:
        return f"cuda:{named}"
    raise TorchDeviceError(_not_visible(gpu, seen, nvml_names))


def _entry_naming(wanted: set[str], nvml_names: Mapping[str, str]) -> int | None:
    """The position of the CUDA_VISIBLE_DEVICES entry that names one of `wanted` alone, by UUID or a prefix of one."""
    for k, entry in enumerate(visible_devices(settings.cuda_visible_devices()) or []):
        if not entry.startswith(UUID_PREFIXES):
            return None
        matches = [u for u in nvml_names if u.lower().startswith(entry.lower())]
        if len(matches) != 1:
            return None  # an entry naming no device, or several, ends CUDA's list there
        if bare_uuid(matches[0]) in wanted:
            return k
    return None


def _not_visible(gpu: str, seen: list[str | None], nvml_names: Mapping[str, str]) -> str:
    value = settings.cuda_visible_devices()
    env = "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"
    by_bare = {bare_uuid(u): name for u, name in nvml_names.items()}
    names = [by_bare.get(u, f"an unknown GPU ({u})") if u else "a device whose UUID torch does not report" for u in seen]
    devices = ", ".join(f"cuda:{k} is {name}" for k, name in enumerate(names)) or "no device"
    others = [n.removeprefix("NVML GPU ") for n in names if n.startswith("NVML GPU ")]
    pick = f"pass --gpu-index {others[0]} to pin the GPU that trains, or " if others else ""
    unmatched = (" torch reports no UUIDs here, and CUDA numbers CUDA_VISIBLE_DEVICES indices fastest-first unless "
                 "CUDA_DEVICE_ORDER=PCI_BUS_ID, so name the GPU by UUID there;" if None in seen else "")
    return (f"{gpu} is not a CUDA device torch can see ({env}; {devices}), so its clock would be pinned and metered while "
            f"another GPU trains;{unmatched} {pick}make it visible (its UUID in CUDA_VISIBLE_DEVICES)")


def visible_gpus(units: Sequence[Collection[str]], value: str | None, torch_uuids: Sequence[str | None] | None = None) -> list[int]:
    """The NVML indices of the GPUs a job can see, in CUDA's order where that is known.

    CUDA Programming Guide, "CUDA Environment Variables": CUDA_VISIBLE_DEVICES unset makes every GPU visible; its
    entries are indices or GPU-/MIG- UUIDs (or a prefix naming one device alone), enumerated "in the order of the
    sequence", and the list ends at the first entry that names none (`visible_devices`). Where torch has CUDA it has
    read the variable already, and its UUIDs (`cuda_uuids`, entry k is cuda:k) say which GPUs, in CUDA's order. Else a
    UUID entry names its GPU; an index entry does not, since CUDA numbers GPUs fastest-first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, and NVML's index "may not correlate with other APIs, such as the CUDA device index"
    (NVML API reference, nvmlDeviceGetIndex): index entries are taken only where they name every GPU (the set is then
    known, whatever the order).

    Args:
        units: for each NVML index, the bare UUIDs CUDA may report for that GPU (its own and its MIG devices').
        value: $CUDA_VISIBLE_DEVICES (None: unset).
        torch_uuids: torch's UUID per visible CUDA device (None: torch has no CUDA).

    Returns:
        NVML indices: CUDA's order (torch's, or the UUID entries'), else NVML's (every GPU visible).

    Raises:
        DvfsError: a device torch sees that no NVML GPU is, or index entries naming some GPUs but not all, with torch
            unable to tell which; one line saying to name the GPUs by UUID.
    """
    owner = {u: i for i, uuids in enumerate(units) for u in uuids}
    if torch_uuids is not None and all(u is not None for u in torch_uuids):
        unknown = [u for u in torch_uuids if u not in owner]
        if unknown:
            raise DvfsError(f"torch sees a CUDA device NVML does not ({unknown[0]}); check that torch and NVML see the same driver")
        return list(dict.fromkeys(owner[u] for u in torch_uuids if u is not None))
    entries = visible_devices(value)
    if entries is None:
        return list(range(len(units)))
    found: list[int] = []
    for entry in entries:
        if entry.isdigit():
            indices = {int(e) for e in entries if e.isdigit()}
            if len(entries) == len(units) and indices == set(range(len(units))):
                return list(range(len(units)))  # every GPU, in an order only CUDA knows
            raise DvfsError(f"CUDA_VISIBLE_DEVICES={value!r} names GPUs by CUDA index, and CUDA numbers them fastest-first "
                            "(unless CUDA_DEVICE_ORDER=PCI_BUS_ID), not as NVML does; name them by UUID (nvidia-smi -L) "
                            "so the GPUs the job sees are the ones pinned")
        matches = {owner[u] for u in owner if u.startswith(bare_uuid(entry))}
        if len(matches) != 1:
            break  # an entry naming no device, or several, ends CUDA's list there
        found.append(matches.pop())
    return list(dict.fromkeys(found))


def local_gpu(visible: Sequence[int], local_rank: int) -> int:
    """The NVML index of the GPU a launcher's process `local_rank` trains on: the LOCAL_RANK-th visible GPU, as
    `torch.cuda.set_device(local_rank)` (what Trainer and accelerate do under torchrun) makes it.

    Raises:
        DvfsError: fewer visible GPUs than local ranks.
    """
    if not 0 <= local_rank < len(visible):
        raise DvfsError(f"LOCAL_RANK {local_rank} has no GPU of its own: the job sees {len(visible)} GPU(s) "
                        "(CUDA_VISIBLE_DEVICES); start at most that many processes per node")
    return visible[local_rank]
