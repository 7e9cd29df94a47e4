"""`OrinTwinParams`: every constant of the simulated Jetson AGX Orin 64 GB, with its source (the other Orin modules'
profiles, `profiles.py`, override the constants that differ, each with its own source).

Load another board's description with `OrinTwinParams.from_yaml(path)`; unknown keys are an error
so a typo can't silently fall back to a default.

The CPU and memory (EMC) clocks (`CPU_EMC_FIELDS`): their tables, how the host's time follows the CPU clock, and how the
CPU and DRAM rails follow theirs (hw/twin/physics.py says how each is used). At the tables' tops every figure is the
GPU-only twin's, exactly.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import numpy as np

from dvfs_mlops.errors import DvfsError

# A clock (or any quantity of the twin's formulas) as one number or an array of them (a fit evaluates a whole grid at
# once); a formula returns the kind it was given.
FloatOrArray = TypeVar("FloatOrArray", float, np.ndarray)


def orin_cpu_table(top_mhz: float) -> tuple[float, ...]:
    """An Orin module's cpufreq table (scaling_available_frequencies) up to its ceiling, in MHz.

    The Cortex-A78AE clusters step by 76.8 MHz from 115.2 MHz, and each module adds its ceiling where it is not a step:
    NVIDIA's nvpmodel files set every power mode's CPU cap on that grid (LineageOS/android_device_nvidia_concord
    nvpmodel/nvpmodel_p3701_0000.conf: MIN_FREQ 729600, caps 1113600, 1497600, 1728000 kHz; nvpmodel_p3767_0000_super.conf:
    1190400, 1420800 kHz), and the ceilings are the modes' "CPU maximal frequency" (twin/profiles.py cites each).
    """
    steps = [round(115.2 + 76.8 * k, 1) for k in range(64) if 115.2 + 76.8 * k < top_mhz - 1e-6]
    return (*steps, float(top_mhz))


# The AGX Orin 64 GB's CPU ceiling: "CPU maximal frequency" 2201.6 MHz in its MAXN mode (Jetson Linux Developer Guide r36,
# Supported Modes and Power Efficiency, https://docs.nvidia.com/jetson/archives/r36.3/DeveloperGuide/SD/
# PlatformPowerAndPerformance/JetsonOrinNanoSeriesJetsonOrinNxSeriesAndJetsonAgxOrinSeries.html; the data sheet's 2.2 GHz).
AGX_ORIN_CPU_MAX_MHZ = 2201.6
# The memory (EMC) clocks an Orin's BPMP locks (`/sys/kernel/debug/bpmp/debug/clk/emc/rate`), MHz. The top is the LPDDR5
# data rate over two: 3199 MHz x 2 x 256 bit / 8 = 204.7 GB/s, the AGX Orin data sheet's 204.8 GB/s (and nvpmodel's
# per-mode caps: nvpmodel_p3701_0000.conf MODE_15W `EMC MAX_FREQ 2133000000`, the other modes uncapped). NVIDIA publishes
# no EMC table. Below the top: 2133 MHz, the nvpmodel cap just cited; 204 MHz, the lowest rate of the Tegra EMC tables
# (the lowest of BoFL's AGX Xavier grid, benchmarks/data/public/bofl-agx-xavier.csv); 665.6 MHz is ASSUMED (the rate
# public Orin sweep scripts lock between those two; no NVIDIA document for it was found).
ORIN_EMC_TABLE_MHZ = (204.0, 665.6, 2133.0, 3199.0)
# Every CPU and EMC constant below: a board's digest leaves them out where they are all a built-in profile's, so boards
# described before they existed keep their digests (twin/profiles.py `params_digest`).
CPU_EMC_FIELDS = ("cpu_frequencies_mhz", "emc_frequencies_mhz", "cpu_bound_share", "cpu_reserved_mhz", "cpu_clock_share",
                  "cpu_volt_v0", "cpu_volt_v1", "cpu_volt_min", "ddr_clock_share")
_TABLES = ("frequencies_mhz", "cpu_frequencies_mhz", "emc_frequencies_mhz")
_SHARES = ("cpu_bound_share", "cpu_clock_share", "ddr_clock_share")


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
    # 256-bit LPDDR5 at 6400 MT/s = 204.8 GB/s at the EMC table's top; it does not scale with the GPU clock.
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
    # --- CPU and memory clocks (physics.py: `host_time_factor`, `cpu_power_scale`, `rail_power`) ---
    cpu_frequencies_mhz: tuple[float, ...] = orin_cpu_table(AGX_ORIN_CPU_MAX_MHZ)
    emc_frequencies_mhz: tuple[float, ...] = ORIN_EMC_TABLE_MHZ
    # The host's time (dispatch and per-step overhead) at CPU clock c: t(c_max) x (1 - s + s (c_max - c0) / (c - c0)), s the
    # CPU-bound share, c0 the CPU clock taken by other work. Fitted on BoFL's AGX Xavier grid (every CPU clock measured,
    # benchmarks/data/twin-bofl-agx-xavier.yaml): s = 1.0 there (host time scales fully with the clock); c0 there is about
    # 40 MHz, a property of that board and its measuring run, so the Orin twins keep 0 (nothing published for them).
    cpu_bound_share: float = 1.0
    cpu_reserved_mhz: float = 0.0
    # VDD_CPU_CV at CPU clock c: cpu_base_w x (1 - a + a g) + cpu_busy_w x host share x g, with g = (V(c) / V(c_max))^2 c / c_max
    # the CMOS switching power's shape (Linux Documentation/devicetree/bindings/arm/cpus.yaml, dynamic-power-coefficient:
    # "Pdyn = dynamic-power-coefficient * V^2 * f") and a the share of the waiting-cores power that switches with the clock
    # (the rest leaks). a = 0.95: an AGX Orin's CPU-stress rail readings (forums.developer.nvidia.com/t/323456: MAXN 15.2 W,
    # 50 W mode 6.0 W, 30 W mode 5.6 W, 15 W mode 1.6 W, with 12, 12, 8 and 4 cores online at 2201.6, 1497.6, 1728 and
    # 1113.6 MHz) are cores x (L + D g) with this V(f) for D = 15.3 W per 12 cores and a leak L of 0 to 0.4 W: at most
    # ~0.4 W of the twin's 6.7 W does not follow the clock (DERIVED from one user's readings; BoFL's grid cannot split its
    # CPU rail's constant from the other rails', hw/twin/fit.py).
    cpu_clock_share: float = 0.95
    # V(c) = max(v_min, v0 + v1 (c / c_max)^2). NVIDIA publishes no Orin CPU voltages; this is the Cortex-A76 cluster of
    # Rockchip's RK3588, an Arm big core of the same generation at a similar top clock (torvalds/linux
    # arch/arm64/boot/dts/rockchip/rk3588-opp.dtsi, opp-table-cluster1: 675 mV up to half the top clock, 1000 mV at the top):
    # v0 + v1 / 4 = 0.675 and v0 + v1 = 1.0, read against the AGX Orin's own ceiling. A cross-check: with it the CPU rail's
    # dynamic power at 1497.6 MHz is 0.40 of 2201.6 MHz's, and an AGX Orin's measured CPU-stress rail fell from 15.2 W (MAXN)
    # to 6.0 W (0.39) in the 50 W mode, the same 12 cores capped at 1497.6 MHz (forums.developer.nvidia.com/t/323456).
    cpu_volt_v0: float = 0.5667
    cpu_volt_v1: float = 0.4333
    cpu_volt_min: float = 0.675
    # VDDQ_VDD2_1V8AO at EMC clock m: ddr_base_w x (1 - b + b m / m_max) + ddr_per_bw_w x traffic / dram_bw_bytes_s: the
    # background (clocking, refresh) share b follows the clock, the traffic term the bytes moved (an energy per byte, as
    # LPDDR's I/O energy is per transfer). b = 0.5 is ASSUMED: no Orin figure was found, and a grid whose energy sums the
    # rails cannot split the DDR rail's constant from the others' (hw/twin/fit.py). The DRAM's bandwidth is
    # dram_bw_bytes_s x m / m_max. The memory controller's own power (on VDD_GPU_SOC) does not follow m here: no source.
    ddr_clock_share: float = 0.5
    # Run-to-run noise (multiplicative, seeded per run).
    noise_time: float = 0.01
    noise_power: float = 0.02
    # An external command under `dvfs-mlops run` on the twin has no step trace: its wall time is
    # charged at this assumed GPU load.
    external_gpu_util: float = 0.5

    @property
    def max_mhz(self) -> float:
        return max(self.frequencies_mhz)

    @property
    def cpu_max_mhz(self) -> float:
        """The top of the CPU table: the clock every GPU-only figure assumes."""
        return max(self.cpu_frequencies_mhz)

    @property
    def emc_max_mhz(self) -> float:
        """The top of the EMC table: the clock `dram_bw_bytes_s` is the bandwidth of."""
        return max(self.emc_frequencies_mhz)

    def cpu_voltage(self, cpu_mhz: FloatOrArray) -> FloatOrArray:
        """The CPU rail's voltage at `cpu_mhz` (the shape of `cpu_volt_*`)."""
        x = cpu_mhz / self.cpu_max_mhz
        return np.maximum(self.cpu_volt_min, self.cpu_volt_v0 + self.cpu_volt_v1 * x * x)

    def voltage(self, f_mhz: FloatOrArray) -> FloatOrArray:
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
        params = dataclasses.replace(base or cls(), **clean)
        if params.cpu_reserved_mhz >= min(params.cpu_frequencies_mhz):
            raise DvfsError(f"{source}: cpu_reserved_mhz ({params.cpu_reserved_mhz:g}) must be below the lowest CPU clock "
                            f"({min(params.cpu_frequencies_mhz):g} MHz)")
        return params

    def to_dict(self) -> dict[str, Any]:
        """Every constant, YAML-ready (loadable again by `from_dict`/`from_yaml`)."""
        d = dataclasses.asdict(self)
        for table in _TABLES:
            d[table] = list(getattr(self, table))
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


def _checked(key: str, value: object, source: str) -> str | float | int | tuple[float, ...]:
    """One override, converted to its field's type (a bool or a string where a number belongs is refused)."""
    default = getattr(OrinTwinParams, key, None) if key not in _TABLES else None
    if key in ("profile", "family"):
        if not isinstance(value, str) or not value.strip():
            raise DvfsError(f"{source}: {key} must be a non-empty name, got {value!r}")
        return value.strip()
    if key in _TABLES:
        if not isinstance(value, (list, tuple)) or not value or not all(_is_number(f) and f > 0 for f in value):
            raise DvfsError(f"{source}: {key} must be a non-empty list of clocks in MHz, got {value!r}")
        return tuple(sorted(float(f) for f in value))
    if not _is_number(value):
        raise DvfsError(f"{source}: {key} must be a number, got {value!r}")
    if value < 0:
        raise DvfsError(f"{source}: {key} must not be negative, got {value!r}")
    if key in _SHARES and value > 1:
        raise DvfsError(f"{source}: {key} is a share and must be at most 1, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        if float(value) != int(value):
            raise DvfsError(f"{source}: {key} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
