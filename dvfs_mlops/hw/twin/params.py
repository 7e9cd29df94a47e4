"""`OrinTwinParams`: every constant of the simulated Jetson AGX Orin 64 GB, with its source (the other Orin modules'
profiles, `profiles.py`, override the constants that differ, each with its own source).

Load another board's description with `OrinTwinParams.from_yaml(path)`; unknown keys are an error
so a typo can't silently fall back to a default.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError


@dataclasses.dataclass(frozen=True)
class OrinTwinParams:
    profile: str = "sim-orin"
    # The board family the profile describes (hw/jetson.py's ORIN_MODULE_PROFILES names, so a twin and the real module
    # share sweeps' families and governors). A `--twin-params` file inherits its base profile's unless it names one.
    family: str = "jetson-agx-orin-64gb"
    # JetPack 6 GPU devfreq table of the AGX Orin 64 GB (available_frequencies), MHz.
    frequencies_mhz: tuple[float, ...] = (306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5)
    # Ampere GA10B: 16 SMs x 128 = 2048 CUDA cores, 2 FP32 FLOP (FMA) per core per cycle.
    cuda_cores: int = 2048
    flops_per_core_cycle: float = 2.0
    # Dense fp16/bf16 tensor-core rate relative to FP32 CUDA cores (Ampere: ~4x with FP32 accumulate).
    tensor_core_speedup: float = 4.0
    # 256-bit LPDDR5 at 6400 MT/s = 204.8 GB/s; it does not scale with the GPU clock.
    dram_bw_bytes_s: float = 204.8e9
    eta_compute_flop_ops: float = 0.7  # matmul-like kernels reach ~70 % of peak
    eta_compute_other: float = 0.3  # elementwise/reduction kernels
    eta_memory: float = 0.7  # achievable share of DRAM bandwidth
    # Fixed per-kernel GPU cost (launch latency, tail, sync) at 1300.5 MHz; scales as 1/f.
    kernel_fixed_s: float = 8e-6
    # Host: eager PyTorch dispatch on the Cortex-A78AE per kernel launch / per view or metadata op.
    host_per_kernel_s: float = 15e-6
    host_per_view_s: float = 3e-6
    # Per-step host overhead: data collation, optimizer bookkeeping, Python (~10 ms).
    host_per_step_s: float = 10e-3
    # GPU rail: VDD_GPU_SOC = static + u*k*V^2*f + (1-u)*idle_share*k*V^2*f, f in GHz.
    gpu_static_w: float = 3.75
    gpu_k: float = 35.0  # effective switched capacitance (W / (V^2 GHz)); fitted to the §4 targets
    gpu_idle_dynamic_share: float = 0.135  # clock-tree/leakage share of dynamic power while idle
    # V(f) = v0 + v1 * (f / f_max)^2: smooth and convex; a sharp knee would put every optimum on it.
    # 0.63 V at the bottom, 0.90 V at 1300.5 MHz. k, V(f), the static and CPU terms were fitted by
    # a random search inside DESIGN §4's ranges until every calibration target holds with margin.
    volt_v0: float = 0.63
    volt_v1: float = 0.27
    # VDD_CPU_CV: ~6.7 W with the cores waiting on the GPU, ~8 W with the host fully busy.
    cpu_base_w: float = 6.7
    cpu_busy_w: float = 1.3
    sys_5v0_w: float = 2.5  # VIN_SYS_5V0: board, I/O
    ddr_base_w: float = 1.0  # VDDQ_VDD2_1V8AO = base + per_bw * DRAM bandwidth share
    ddr_per_bw_w: float = 4.0
    # MAXN = nvhost_podgov: settles at the highest clock whose load stays >= target, else the
    # lowest; while settled below the top it dithers to the next clock up for a share of the time.
    # The target sits a little above DESIGN's ~50 %: with 50 % the small models' oracle savings
    # averaged > 20 %, above the study's range (see testkit/calibration.py).
    maxn_load_target: float = 0.6
    maxn_ramp_share: float = 0.05
    # Run-to-run noise (multiplicative, seeded per run).
    noise_time: float = 0.01
    noise_power: float = 0.02
    # An external command under `dvfs-mlops run` on the twin has no step trace: its wall time is
    # charged at this assumed GPU load.
    external_gpu_util: float = 0.5

    @property
    def max_mhz(self) -> float:
        return max(self.frequencies_mhz)

    def voltage(self, f_mhz: Any) -> Any:
        x = f_mhz / self.max_mhz
        return self.volt_v0 + self.volt_v1 * x * x

    @classmethod
    def from_yaml(cls, path: str | Path, base: OrinTwinParams | None = None) -> OrinTwinParams:
        """A YAML mapping of overrides on `base` (default: the sim-orin constants)."""
        return cls.from_dict(read_yaml_mapping(path), source=str(path), base=base)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "parameters", base: OrinTwinParams | None = None) -> OrinTwinParams:
        """Overrides on `base`; a wrong name or a value of the wrong type is a DvfsError naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(data) - names)
        if bad:
            raise DvfsError(f"{source}: unknown twin parameter(s) {', '.join(bad)}; valid: {', '.join(sorted(names))}")
        clean: dict[str, Any] = {}
        for key, value in data.items():
            clean[key] = _checked(key, value, source)
        return dataclasses.replace(base or cls(), **clean)

    def to_dict(self) -> dict[str, Any]:
        """Every constant, YAML-ready (loadable again by `from_dict`/`from_yaml`)."""
        d = dataclasses.asdict(self)
        d["frequencies_mhz"] = list(self.frequencies_mhz)
        return d


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file that must hold a mapping; unreadable, malformed or another shape is one DvfsError."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise DvfsError(f"cannot read twin parameters {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise DvfsError(f"{path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}; fix it or regenerate it with `dvfs-mlops twin fit`") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DvfsError(f"{path} must hold a mapping of twin parameters (name: value), not a {type(data).__name__}")
    return data


def _checked(key: str, value: Any, source: str) -> Any:
    """One override, converted to its field's type (a bool or a string where a number belongs is refused)."""
    default = getattr(OrinTwinParams, key, None) if key != "frequencies_mhz" else None
    if key in ("profile", "family"):
        if not isinstance(value, str) or not value.strip():
            raise DvfsError(f"{source}: {key} must be a non-empty name, got {value!r}")
        return value.strip()
    if key == "frequencies_mhz":
        if not isinstance(value, (list, tuple)) or not value or not all(_is_number(f) and f > 0 for f in value):
            raise DvfsError(f"{source}: frequencies_mhz must be a non-empty list of clocks in MHz, got {value!r}")
        return tuple(sorted(float(f) for f in value))
    if not _is_number(value):
        raise DvfsError(f"{source}: {key} must be a number, got {value!r}")
    if value < 0:
        raise DvfsError(f"{source}: {key} must not be negative, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        if float(value) != int(value):
            raise DvfsError(f"{source}: {key} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
