"""The twin's built-in board profiles, and how a command picks one (`--twin-profile`, `--twin-params`).

- `sim-orin` (the default): the `OrinTwinParams` defaults. Its power constants (k, V(f), static and
  CPU terms) and the MAXN load target were searched until the study's results held, so it cannot
  judge the study on its own.
- `sim-orin-measured`: the same board with a GPU rail shaped after public Orin measurements
  instead: VDD_GPU_SOC at 306 MHz is about 43 % of its value at 1300.5 MHz under the same load
  (sim-orin: about 20 %). Nothing in it was tuned to the study's optima or savings; every constant
  that differs says why below, all the others (clock table, cores, DRAM, kernel and host timing,
  CPU/board rails, noise) are sim-orin's, whose sources are in `params.py`.

- The other Orin modules people own, each its own family (hw/jetson.py's module names): `sim-orin-32gb` (AGX Orin 32 GB),
  `sim-orin-nx-16gb`, `sim-orin-nx-8gb`, `sim-orin-nano-8gb` and `sim-orin-nano-8gb-super` (the same Nano module
  with JetPack 6.2's higher ceilings). Each is `_module(...)`: sim-orin-measured's untuned rail shape carried to the
  module's published SM count, GPU clock ceiling, memory bandwidth, CPU cores and power budget (sources beside each
  figure in `_MODULES`); how each constant follows from them is `_module`'s docstring. Nothing in them was tuned to
  any optimum, saving or governor result.

Each twin reports the rails of the module it describes (`rail_names`): AGX Orin's VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 and
VDDQ_VDD2_1V8AO, Orin NX/Nano's VDD_IN, VDD_CPU_GPU_CV and VDD_SOC (hw/meter.py's rail plan cites both sets), so its
`energy_j` and `energy_total_j` are the real module's sums (hw/sim.py maps the twin's power terms onto them).

A params file (`--twin-params FILE.yaml`) holds overrides on the chosen profile. Its `profile`
names the result; without one the name is `<base>+<digest of the constants>`, so runs of a
changed board never carry (or resume into a sweep of) a built-in profile's name. A file that
names a built-in profile must hold exactly that profile's constants.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.hw.twin.params import CPU_EMC_FIELDS, ORIN_EMC_TABLE_MHZ, OrinTwinParams, orin_cpu_table, read_yaml_mapping

DEFAULT_PROFILE = "sim-orin"

_MEASURED = OrinTwinParams(
    profile="sim-orin-measured",
    # V(f) = 0.60 + 0.20 (f/fmax)^2: 0.60 V at the bottom of the table, 0.80 V at 1300.5 MHz. Ampere
    # parts hold ~0.6 V near their lowest clocks and stay under ~0.85 V at the top; a gentler rise
    # than sim-orin's 0.63-0.90 V, which was widened to make low clocks cheap.
    volt_v0=0.60,
    volt_v1=0.20,
    # k and the static part are set by two figures, not by any optimum: GPU-rail power at full load
    # of ~35 W at 1300.5 MHz (bert-large training then draws ~46 W over all rails, inside the
    # ~45-65 W of public module-power measurements), and 306 MHz drawing 43 % of that (public
    # measurements: 15.2 W / 35.3 W here). With this V(f) the ratio fixes static = 0.4275 k.
    gpu_k=28.0,
    # VDD_GPU_SOC feeds the SoC fabric and memory controllers besides the GPU: that share does not
    # follow the GPU clock, so the rail keeps ~12 W at any clock under load.
    gpu_static_w=12.0,
    # nvhost_podgov's load target as DESIGN states it (~50 %); sim-orin raised it to 0.6 to bring
    # the study's savings into range.
    maxn_load_target=0.5,
)



@dataclasses.dataclass(frozen=True)
class _Module:
    """One Orin module's published figures (each cited where `_MODULES` lists it)."""

    family: str  # hw/jetson.py ORIN_MODULE_PROFILES' name of the real module
    sms: int  # Ampere GA10B SMs enabled (128 CUDA cores each)
    gpu_max_mhz: float  # the GPU's clock ceiling in the module's top power mode
    dram_bw_gb_s: float  # LPDDR5 bandwidth
    cpu_cores: int  # Cortex-A78AE cores
    max_power_w: float  # the top of the module's configurable power range
    cpu_max_mhz: float  # the CPU's clock ceiling in the module's top power mode (the top of its cpufreq table)
    emc_max_mhz: float  # the memory (EMC) clock ceiling: the LPDDR5 data rate over two


# Sources (figures as published; the AGX Orin 64 GB row is the twin's own, params.py):
# [AGX] NVIDIA Jetson AGX Orin Series data sheet and "Jetson AGX Orin Series Technical Brief" v1.2 (summarised at
#   http://mzph.cn/web/30785.shtml: two GPCs, 16 SMs x 128 = 2048 CUDA cores on the 64 GB module; 32 GB and 64 GB
#   modules): AGX Orin 32 GB: 1792 CUDA cores (14 SMs), GPU max 930 MHz, 256-bit LPDDR5 204.8 GB/s, 8-core CPU,
#   15-40 W.
# [NX] NVIDIA Jetson Orin NX Series data sheet (a copy: https://github.com/icub-tech-iit/cad-libraries/files/13056089/
#   JETSON-ORIN-NX-DATASHEET.pdf, "power configurable between 10W and 25W"): Orin NX 16 GB: 1024 CUDA cores (8 SMs,
#   32 tensor cores), GPU max 918 MHz, 128-bit LPDDR5 102.4 GB/s, 8-core CPU, 10-25 W; Orin NX 8 GB: 1024 CUDA cores,
#   GPU max 765 MHz, 102.4 GB/s, 6-core CPU, 10-20 W.
# [NANO] NVIDIA Jetson Orin Nano series data sheet and the Orin Nano Super Developer Kit data sheet (Dec 2024), as
#   summarised at https://www.brojogopalsapui.com/ai-foundations/sub_contents/AI_hardware/jetson_orin_nano_light.html:
#   Orin Nano 8 GB: 1024 CUDA cores, 8 SMs (1 GPC x 4 TPC x 2), GPU 625 MHz ("1.02 GHz, was 625 MHz" in Super mode),
#   128-bit LPDDR5 68 GB/s (102 GB/s Super), 6-core A78AE, 7-15 W (25 W Super, "15 W -> 25 W").
# CPU ceilings, the "CPU maximal frequency" of each module's top power mode in the same Developer Guide tables (below):
#   AGX Orin 64 GB 2201.6 MHz (MAXN; data sheet "2.2 GHz"), AGX Orin 32 GB 2.2 GHz in its data sheet (its top step taken as
#   the 64 GB module's 2201.6 MHz: no per-step table of the 32 GB module was found), Orin NX 16 GB and 8 GB 1984 MHz
#   (data sheet "2 GHz"), Orin Nano 8 GB 1510.4 MHz (data sheet "1.5 GHz"), Orin Nano Super 1728 MHz (MAXN_SUPER; "1.7 GHz").
#   Below the ceiling every module's cpufreq table is the A78AE's 76.8 MHz grid (params.py `orin_cpu_table`).
# EMC ceilings: the data sheets' LPDDR5 bandwidth over the bus width: 204.8 GB/s / (2 x 32 B) and 102.4 GB/s / (2 x 16 B)
#   = 3199 MHz (AGX Orin, Orin NX, Orin Nano Super), 68 GB/s / (2 x 16 B) = 2133 MHz (Orin Nano 8 GB), which nvpmodel
#   caps the same way (LineageOS/android_device_nvidia_concord nvpmodel/nvpmodel_p3767_0003.conf, Orin Nano: 7W mode
#   `EMC MAX_FREQ 2133000000`, nvpmodel_p3767_0000_super.conf's modes above 10 W uncapped). Below it, the Orin EMC table
#   (params.py `ORIN_EMC_TABLE_MHZ`) up to the ceiling.
# Per-mode GPU ceilings: Jetson Linux Developer Guide, "Jetson Orin Nano Series, Jetson Orin NX Series and Jetson AGX
#   Orin Series", Supported Modes and Power Efficiency (https://docs.nvidia.com/jetson/archives/r36.3/DeveloperGuide/SD/
#   PlatformPowerAndPerformance/JetsonOrinNanoSeriesJetsonOrinNxSeriesAndJetsonAgxOrinSeries.html).
_MODULES: dict[str, _Module] = {
    "sim-orin-32gb": _Module("jetson-agx-orin-32gb", 14, 930.0, 204.8, 8, 40.0, 2201.6, 3199.0),  # [AGX]
    "sim-orin-nx-16gb": _Module("jetson-orin-nx-16gb", 8, 918.0, 102.4, 8, 25.0, 1984.0, 3199.0),  # [NX]
    "sim-orin-nx-8gb": _Module("jetson-orin-nx-8gb", 8, 765.0, 102.4, 6, 20.0, 1984.0, 3199.0),  # [NX]
    "sim-orin-nano-8gb": _Module("jetson-orin-nano-8gb", 8, 625.0, 68.0, 6, 15.0, 1510.4, 2133.0),  # [NANO]
    "sim-orin-nano-8gb-super": _Module("jetson-orin-nano-8gb-super", 8, 1020.0, 102.4, 6, 25.0, 1728.0, 3199.0),  # [NANO], Super
}
# The AGX Orin 64 GB figures the module profiles are scaled from (params.py's sources; 15-60 W, 12-core CPU).
_AGX64 = _Module("jetson-agx-orin-64gb", 16, 1300.5, 204.8, 12, 60.0, 2201.6, 3199.0)


def _module(name: str, m: _Module, base: OrinTwinParams = _MEASURED, ref: _Module = _AGX64) -> OrinTwinParams:
    """A module's twin: `base` (sim-orin-measured, the AGX Orin 64 GB with its untuned rail shape) with the module's
    own figures, every other constant following from them as stated here:

    - clock table: the GPU devfreq steps are the same GA10B table on every Orin module; NVIDIA publishes only each
      module's ceiling, so the table is the AGX Orin 64 GB's truncated at the ceiling, plus the ceiling itself where it
      is not a step (DERIVED, not read from a module).
    - cuda_cores = 128 x SMs; dram_bw_bytes_s the module's LPDDR5 bandwidth.
    - kernel_fixed_s: the same cycles at the module's own top clock (params.py states it at the table top).
    - V(f): the same silicon's curve, read up to the module's ceiling: v0 unchanged, v1 x (ceiling / 1300.5)^2.
    - gpu_k (switched capacitance) in proportion to the SMs that switch.
    - gpu_static_w (the GPU/SoC rail's clock-independent part: SoC fabric, memory controllers) and the DRAM rail in
      proportion to the module's power budget and bandwidth; the CPU rail in proportion to its cores (ASSUMED scalings:
      no public per-rail figures per module were found).
    - CPU and EMC tables: `orin_cpu_table` up to the module's CPU ceiling, the Orin EMC table up to its EMC ceiling.
    - the CPU's V(f): the same A78AE curve read up to the module's CPU ceiling (v1 x (ceiling / 2201.6)^2, floor and v0
      unchanged), as the GPU's; the CPU and DRAM clock shares and the host's CPU-bound share are the base's.
    """
    share_f = m.gpu_max_mhz / ref.gpu_max_mhz
    table = (*(f for f in base.frequencies_mhz if f < m.gpu_max_mhz), m.gpu_max_mhz)
    bw = m.dram_bw_gb_s / ref.dram_bw_gb_s
    cpu = m.cpu_cores / ref.cpu_cores
    joint: dict[str, Any] = {"cpu_frequencies_mhz": orin_cpu_table(m.cpu_max_mhz),
             "emc_frequencies_mhz": tuple(f for f in ORIN_EMC_TABLE_MHZ if f <= m.emc_max_mhz),
             "cpu_volt_v1": base.cpu_volt_v1 * (m.cpu_max_mhz / ref.cpu_max_mhz) ** 2}
    return dataclasses.replace(
        base, profile=name, family=m.family, frequencies_mhz=table, cuda_cores=128 * m.sms, dram_bw_bytes_s=m.dram_bw_gb_s * 1e9,
        kernel_fixed_s=base.kernel_fixed_s / share_f, volt_v1=base.volt_v1 * share_f ** 2, gpu_k=base.gpu_k * m.sms / ref.sms,
        gpu_static_w=base.gpu_static_w * m.max_power_w / ref.max_power_w, ddr_base_w=base.ddr_base_w * bw,
        ddr_per_bw_w=base.ddr_per_bw_w * bw, cpu_base_w=base.cpu_base_w * cpu, cpu_busy_w=base.cpu_busy_w * cpu, **joint)


# The INA3221 rail sets (hw/meter.py's rail plan cites them): AGX Orin, and Orin NX / Orin Nano.
AGX_ORIN_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
ORIN_NX_RAILS = ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
# Families whose module carries the Orin NX / Nano rail set (p3767 modules: hw/jetson.py ORIN_MODULE_PROFILES).
_NX_RAIL_FAMILIES = ("jetson-orin-nx", "jetson-orin-nano")


def rail_names(params: OrinTwinParams) -> tuple[str, ...]:
    """The rails a twin reports: its family's module's (Orin NX/Nano: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC; else AGX Orin's)."""
    return ORIN_NX_RAILS if params.family.startswith(_NX_RAIL_FAMILIES) else AGX_ORIN_RAILS


BUILTIN_PROFILES: dict[str, OrinTwinParams] = {DEFAULT_PROFILE: OrinTwinParams(), "sim-orin-measured": _MEASURED,
                                                **{name: _module(name, m) for name, m in _MODULES.items()}}


def family_of(profile: str) -> str | None:
    """The board family of a built-in twin profile, or of a params file's twin built on one (`<base>+<digest>`); None
    for any other name."""
    params = BUILTIN_PROFILES.get(profile.split("+", 1)[0])
    return None if params is None else params.family


def builtin_profile(name: str) -> OrinTwinParams:
    if name not in BUILTIN_PROFILES:
        raise unknown("twin profile", name, list(BUILTIN_PROFILES))
    return BUILTIN_PROFILES[name]


def params_digest(params: OrinTwinParams) -> str:
    """A short digest of every constant but the name (what makes two boards the same board)."""
    d = params.to_dict()
    d.pop("profile")
    # The CPU and EMC constants count only where they are not a built-in profile's, so the twins of files written before
    # those constants existed (which left them at their base profile's) keep their digests, and their sweeps their ids.
    joint = {key: d[key] for key in CPU_EMC_FIELDS}
    if any(joint == {key: builtin.to_dict()[key] for key in CPU_EMC_FIELDS} for builtin in BUILTIN_PROFILES.values()):
        for key in CPU_EMC_FIELDS:
            d.pop(key)
    if d["family"] == OrinTwinParams.family:
        d.pop("family")  # the AGX Orin 64 GB's twins keep the digests they had before profiles named a family
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def twin_digest(params: OrinTwinParams) -> str:
    """'' for a built-in profile's exact constants, else `params_digest`: a YAML or fitted board is another board,
    and a sweep on it another sweep."""
    return "" if BUILTIN_PROFILES.get(params.profile) == params else params_digest(params)


def load_twin_params(profile: str | None = None, params_file: str | Path | None = None) -> OrinTwinParams:
    """The twin's constants for `--twin-profile NAME` and `--twin-params FILE` (overrides on that profile)."""
    base = builtin_profile(profile or DEFAULT_PROFILE)
    if not params_file:
        return base
    data = read_yaml_mapping(params_file)
    params = OrinTwinParams.from_dict(data, source=str(params_file), base=base)
    named = data.get("profile")
    if named is None:
        return dataclasses.replace(params, profile=f"{base.profile}+{params_digest(params)}")
    if named in BUILTIN_PROFILES:
        builtin = BUILTIN_PROFILES[named]
        differ = sorted(k for k, v in params.to_dict().items() if builtin.to_dict()[k] != v)
        if differ:
            raise DvfsError(f"{params_file} names the built-in profile {named!r} but changes {', '.join(differ)}; "
                            "give the board its own `profile:` name (or drop the key)")
    return params


__all__ = ["AGX_ORIN_RAILS", "BUILTIN_PROFILES", "DEFAULT_PROFILE", "ORIN_NX_RAILS", "builtin_profile", "family_of", "load_twin_params",
           "params_digest", "rail_names", "twin_digest"]
