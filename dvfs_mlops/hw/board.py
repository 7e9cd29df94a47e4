"""The board a command runs on, as one record: `Board`.

Everything the pipeline needs to know about a board besides its live clock controls lives here, once: which board
it is (backend, profile, family, device id), its clock table, the shape of its voltage curve and its run-to-run
noise (what the curve model, the power prior, the adaptive sweep and refine fit with), its power rails, and the
torch device training runs on. A command resolves it once from the open device (`board_of`); a sweep logs it on
its parent run (`board.json`), and whatever later works on the sweep (`train`'s fill-ins, `curve fit
--sweep-id`) reads it back from there (`Board.from_json`) instead of re-deriving it from a profile name.

On the twin every constant is the profile's own (`twin/params.py`). A real board's voltage curve and noise are not
readable from the hardware, so they are the JetPack 6 AGX Orin's curve and the twin's default noise, marked as
assumed (`voltage_shape_known=False`): the governor's fill-ins then fit the shape across the sweep instead.

A Jetson's power mode (`PowerMode`: nvpmodel's id and name, its GPU range, its TPC power-gating mask) is read once
into the record: a mode caps the GPU clock and power-gates GPU units, so the same clock gives other throughput per mode
(`Board.power_mode_key` tells sweeps of different modes apart).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any, Protocol, cast

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.twin.params import OrinTwinParams

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device

_ORIN = OrinTwinParams()
# The JetPack 6 AGX Orin's voltage curve as the twin models it, V(f) = v0 + v1 (f/f_max)^2 (twin/params.py): only its
# shape r = v1 / v0 matters to the curve model, V(f) ~ 1 + r (f/f_max)^2.
ORIN_VOLTAGE_SHAPE = _ORIN.volt_v1 / _ORIN.volt_v0
# Relative run-to-run noise (time, power) of one measurement window where the board's own is not known: the twin's
# defaults, a floor under what the fits estimate from their residuals.
DEFAULT_NOISE = (_ORIN.noise_time, _ORIN.noise_power)
FORMAT = "dvfs-board/1"
ARTIFACT = "board.json"
# nvpmodel's names of the modes that restrict nothing (AGX Orin "MAXN", JetPack 6.2's "MAXN_SUPER"): their sweeps keep
# the identity of a board without a power mode.
UNRESTRICTED_MODE_PREFIX = "MAXN"


@dataclasses.dataclass(frozen=True)
class PowerMode:
    """A Jetson's power mode as nvpmodel set it (etc/nvpmodel.conf, var/lib/nvpmodel/status).

    nvpmodel writes a mode's `GPU MIN_FREQ`/`GPU MAX_FREQ` into the GPU devfreq node's min_freq/max_freq (there is no
    other GPU cap), its `TPC_POWER_GATING TPC_PG_MASK` into the GPU's TPC power-gating mask, each CPU cluster's
    `CPU_A78_<k> MIN_FREQ`/`MAX_FREQ` (kHz) into the scaling_min_freq/scaling_max_freq of the CPU its PARAM section
    names, and `EMC MAX_FREQ` (Hz) into /sys/kernel/nvpmodel_emc_cap/emc_iso_cap (NVIDIA's Orin nvpmodel template:
    mlcommons/inference_results_v3.0 closed/Neuchips/code/common/nvpmodel_orin.py).

    Attributes:
        mode_id: nvpmodel's mode id.
        name: its name (MAXN, MODE_30W, ...).
        gpu_min_mhz: the mode's GPU MIN_FREQ (None: no lower limit, `GPU MIN_FREQ 0`).
        gpu_max_mhz: the mode's GPU MAX_FREQ, its GPU cap (None: none, `GPU MAX_FREQ -1`).
        tpc_pg_mask: the GPU TPCs power-gated (a bit per TPC): the live value where readable, else the mode's; None
            where neither says.
        cpu_ranges: per CPU cluster the mode names, (the CPU its PARAM section's files belong to, MIN_FREQ kHz, MAX_FREQ
            kHz), None for no limit (0, -1).
        emc_max_mhz: the mode's EMC MAX_FREQ, its EMC cap (None: none, 0 or -1).
    """

    mode_id: int
    name: str
    gpu_max_mhz: float | None = None
    gpu_min_mhz: float | None = None
    tpc_pg_mask: int | None = None
    cpu_ranges: tuple[tuple[int, int | None, int | None], ...] = ()
    emc_max_mhz: float | None = None

    def cpu_range_khz(self, cpus: tuple[int, ...] | list[int]) -> tuple[int | None, int | None]:
        """The mode's (MIN_FREQ, MAX_FREQ) in kHz for the cpufreq policy of `cpus` (its related_cpus): the entry whose
        CPU is one of them; (None, None) where the mode names none of them."""
        for cpu, lo, hi in self.cpu_ranges:
            if cpu in cpus:
                return lo, hi
        return None, None

    def above_emc_cap(self, mhz: float) -> bool:
        """Whether a memory clock is above the mode's EMC cap (more than half a MHz)."""
        return self.emc_max_mhz is not None and mhz > self.emc_max_mhz + 0.5

    @property
    def label(self) -> str:
        """"<id>:<name>", as runs log it (param `nvpmodel_mode`)."""
        return f"{self.mode_id}:{self.name}"

    @property
    def unrestricted(self) -> bool:
        """MAXN (or MAXN_SUPER): the mode that caps nothing, whose sweeps keep the ids of boards without a mode."""
        return self.name.upper().startswith(UNRESTRICTED_MODE_PREFIX)

    def identity(self) -> str:
        """What a sweep's identity takes from the mode: '' for MAXN, else the mode, its GPU cap and its TPC mask."""
        if self.unrestricted:
            return ""
        cap = "none" if self.gpu_max_mhz is None else f"{self.gpu_max_mhz:g}"
        tpc = "unknown" if self.tpc_pg_mask is None else str(self.tpc_pg_mask)
        return f"nvpmodel {self.label} gpu_max_mhz={cap} tpc_pg_mask={tpc}"

    def above_cap(self, mhz: float) -> bool:
        """Whether a clock is above the mode's GPU cap (more than half a MHz: the table's own rounding)."""
        return self.gpu_max_mhz is not None and mhz > self.gpu_max_mhz + 0.5

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PowerMode:
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        if "cpu_ranges" in fields:  # JSON turns the tuples into lists
            fields["cpu_ranges"] = tuple(tuple(r) for r in fields["cpu_ranges"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class Board:
    """One board, as every part of the pipeline sees it.

    Attributes:
        backend: jetson, nvml or sim.
        profile: the device profile (jetson-agx-orin-64gb, nvml-a100-..., sim-orin, a fitted twin's name).
        family: the board's family (`board_family`): a real board's profile, or the board a twin profile describes.
        device_id: which board: the Jetson's serial, the NVML GPU's UUID, sim@HOST on the twin.
        simulated: True on the twin (everything it measures is SIMULATED).
        frequencies_mhz: the clock table, ascending.
        voltage_shape: r in V(f) ~ 1 + r (f/f_max)^2.
        voltage_shape_known: False where `voltage_shape` is an assumption (a real board), not the board's own.
        noise_time: relative run-to-run noise of one window's time.
        noise_power: relative run-to-run noise of one window's power.
        rails: the power rails the meter reads.
        torch_device: where training runs (cpu on the twin, cuda / cuda:<k> on hardware).
        twin_digest: a twin whose profile is not built in: a digest of its constants (part of a sweep's identity).
        min_window_s: the shortest window the meter tells apart (`board_of`); 0 on the twin, exact per step.
        power_average_s: the period each power sample is already an average over (NVML's ~1 s from Ampere on); 0 where
            samples are instantaneous. Samples closer than this are not independent.
        power_mode: the Jetson's power mode when the command started (None: no nvpmodel, NVML, the twin).
    """

    backend: str
    profile: str
    family: str
    device_id: str
    simulated: bool
    frequencies_mhz: tuple[float, ...]
    voltage_shape: float = ORIN_VOLTAGE_SHAPE
    voltage_shape_known: bool = False
    noise_time: float = DEFAULT_NOISE[0]
    noise_power: float = DEFAULT_NOISE[1]
    rails: tuple[str, ...] = ()
    torch_device: str = "cpu"
    twin_digest: str = ""
    min_window_s: float = 0.0
    power_average_s: float = 0.0
    power_mode: PowerMode | None = None

    @property
    def power_mode_key(self) -> str:
        """What the power mode adds to a sweep's identity: '' without a mode or in MAXN (`PowerMode.identity`)."""
        return self.power_mode.identity() if self.power_mode is not None else ""

    @property
    def f_max_mhz(self) -> float:
        """The top of the clock table: what the voltage curve is written against."""
        return max(self.frequencies_mhz)

    def noise(self, repeats: int = 1) -> tuple[float, float]:
        """(time, power) relative noise of a measurement that is the mean of `repeats` runs."""
        per_mean = math.sqrt(max(1, int(repeats)))
        return self.noise_time / per_mean, self.noise_power / per_mean

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        """board.json: the record as a sweep's parent run carries it."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Board:
        """The record `to_dict` wrote (keys a later version added are ignored).

        Raises:
            DvfsError: not a board record, or a field of the wrong kind.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DvfsError(f"not a board record (format {data.get('format') if isinstance(data, dict) else None!r}, "
                            f"expected {FORMAT!r})")
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            fields = {k: v for k, v in data.items() if k in known}
            fields["frequencies_mhz"] = tuple(float(f) for f in fields["frequencies_mhz"])
            fields["rails"] = tuple(str(r) for r in fields.get("rails", ()))
            if isinstance(fields.get("power_mode"), dict):
                fields["power_mode"] = PowerMode.from_dict(fields["power_mode"])
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as e:
            raise DvfsError(f"a board record is malformed ({e}); re-run the sweep to log it again") from None

    @classmethod
    def from_json(cls, text: str) -> Board:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise DvfsError(f"a board record is not JSON ({e})") from None
        return cls.from_dict(data)


def board_family(profile: str, params: OrinTwinParams | None = None) -> str:
    """The board family of a device profile: a twin's is the board its constants describe (`params.family`: a built-in
    profile's own, which a `--twin-params` file inherits unless it names another); by name alone, a built-in twin
    profile's (or a params file's twin on one, `<base>+<digest>`) and twins fitted from the AGX Orin (`sim-orin*`,
    `fit-*`) the AGX Orin 64 GB; any other profile (a real board's, a YAML twin's own name) is its family."""
    if params is not None and params.family:
        return params.family
    from dvfs_mlops.hw.twin.profiles import family_of

    builtin = family_of(profile)
    if builtin is not None:
        return builtin
    if profile.startswith(("sim-orin", "fit-")):
        return _ORIN.family
    return profile


def _twin_constants(params: OrinTwinParams) -> dict[str, Any]:
    """A twin profile's voltage shape and noise as Board fields, with the assumed ones where the profile states none
    that a fit can use (no noise, a voltage curve without a positive v0)."""
    known = params.volt_v0 > 0 and params.volt_v1 >= 0
    noisy = params.noise_time > 0 and params.noise_power > 0
    return {"voltage_shape": float(params.volt_v1) / float(params.volt_v0) if known else ORIN_VOLTAGE_SHAPE,
            "voltage_shape_known": known,
            "noise_time": float(params.noise_time) if noisy else DEFAULT_NOISE[0],
            "noise_power": float(params.noise_power) if noisy else DEFAULT_NOISE[1]}


class _ReadsPowerMode(Protocol):
    """A backend that reads the board's power mode (the jetson one)."""

    def power_mode(self) -> PowerMode | None: ...


def board_of(device: Device, torch_device: str | None = None) -> Board:
    """The `Board` of an open device, resolved once per command.

    Args:
        device: an open `Device` (jetson, nvml, sim).
        torch_device: where training runs instead of the backend's own (`--torch-device`); None: the backend's.

    Returns:
        The board record.

    Raises:
        TorchDeviceError: the backend trains on CUDA but torch has none (before any clock is touched).
    """
    from dvfs_mlops.hw.placement import resolve_torch_device

    where = resolve_torch_device(device, torch_device)
    params = getattr(device, "params", None) if device.simulated else None
    common: dict[str, Any] = {"backend": device.name, "profile": device.profile, "family": board_family(device.profile, params),
              "device_id": str(getattr(device, "device_id", "") or ""), "simulated": bool(device.simulated),
              "frequencies_mhz": tuple(float(f) for f in device.frequencies_mhz), "torch_device": where}
    if params is None:
        rails = tuple(device.info().rails) if device.name == "jetson" else ("gpu",) if device.name == "nvml" else ()
        mode = cast(_ReadsPowerMode, device).power_mode() if device.name == "jetson" and hasattr(device, "power_mode") else None
        return Board(**common, rails=rails, min_window_s=_min_window_s(device), power_average_s=_power_average_s(device),
                     power_mode=mode)
    from dvfs_mlops.hw.twin.profiles import rail_names, twin_digest

    return Board(**common, **_twin_constants(params), rails=rail_names(params), twin_digest=twin_digest(params))


# The shortest window a meter tells apart. Jetson: the sampler integrates the INA3221 rails at `sample_hz`; 20 samples
# make a mean (the INA3221 itself converts every ~1.1 ms by default, TI INA3221 data sheet, "Conversion time", so the
# sampler, not the sensor, is the limit). NVML: `nvmlDeviceGetPowerUsage` is averaged over about one second on Ampere
# and later (NVML API reference, nvmlDeviceGetPowerUsage; the energy counter is read at window edges, so a window
# under that period mostly measures the average's lag).
MIN_SAMPLES_PER_WINDOW = 20
NVML_POWER_AVERAGE_S = 1.0


def _min_window_s(device: Device) -> float:
    if device.name == "nvml":
        return NVML_POWER_AVERAGE_S
    rate = float(getattr(device, "sample_hz", 0.0) or 0.0)
    return MIN_SAMPLES_PER_WINDOW / rate if device.name == "jetson" and rate > 0 else 0.0


def _power_average_s(device: Device) -> float:
    return NVML_POWER_AVERAGE_S if device.name == "nvml" and getattr(device, "power_source", "") == "average_1s" else 0.0


def legacy_board(profile: str, frequencies_mhz: list[float] | tuple[float, ...]) -> Board:
    """The board of a sweep logged before sweeps carried board.json: rebuilt from its device profile (a built-in twin
    profile's constants, else a real board's assumed ones) and the clocks it measured."""
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES, rail_names

    params = BUILTIN_PROFILES.get(profile)
    if params is None:
        return Board("unknown", profile, board_family(profile), "", False, tuple(sorted(float(f) for f in frequencies_mhz)) or (1.0,))
    return Board("sim", profile, board_family(profile, params), "", True, tuple(params.frequencies_mhz), **_twin_constants(params),
                 rails=rail_names(params))
