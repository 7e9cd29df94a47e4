"""Time and power of one training step on the twin at a configuration: the GPU clock, and the CPU and memory (EMC) clocks.

Timing is a two-resource queue: the host dispatches ops one after another (15 us per kernel,
3 us per view op); kernel i starts at max(its launch time, end of kernel i-1) and runs for
max(compute, memory) + a fixed cost that scales as 1/f. That single rule makes small models
launch-bound (time barely falls with f, low utilisation) and large ones compute-bound.

The other two clocks act on that queue's two sides:
- CPU clock c: every host cost (each op's dispatch, the per-step overhead) is multiplied by
  `host_time_factor` = 1 - s + s (c_max - c0) / (c - c0) (s the CPU-bound share, c0 the clock other work takes).
- EMC clock m: DRAM bandwidth is `dram_bw_bytes_s` x m / m_max, so each kernel's memory-bound time grows as m_max / m.
Power, per rail (`rail_terms`): the GPU rail as before; the CPU rail's switching part follows (V(c) / V(c_max))^2 c / c_max
(`cpu_power_scale`); the DRAM rail's background part follows m / m_max and its traffic part the bytes moved per second.

A configuration is a GPU clock in MHz (CPU and EMC at their tables' tops) or a `Setting` (hw/replay.py; a clock left
None is at its table's top). At the tops every factor above is exactly 1, so every figure is the GPU-only twin's, bit for bit.

A step is described either by its kernels (`StepTrace`, captured from the model: `estimate_step`) or by its aggregate work
(`StepWork`, fitted to a measured grid that has no trace: `estimate_work`, `work_grid`); both use the same clock scalings
and the same rails.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.replay import Setting
from dvfs_mlops.hw.twin.params import FloatOrArray, OrinTwinParams
from dvfs_mlops.hw.twin.trace import KIND_KERNEL, StepTrace, StepWork

RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
Config = float | Setting


@dataclasses.dataclass(frozen=True)
class Clocks:
    """A configuration resolved on one twin's tables: every clock in MHz.

    Attributes:
        gpu_mhz: the GPU clock.
        cpu_mhz: the CPU clock (the table's top where the configuration left it out).
        emc_mhz: the memory (EMC) clock (the table's top where the configuration left it out).
    """

    gpu_mhz: float
    cpu_mhz: float
    emc_mhz: float


def resolve(config: Config, p: OrinTwinParams) -> Clocks:
    """The clocks of `config` on `p`'s tables.

    Args:
        config: a GPU clock in MHz, or a `Setting` whose None clocks mean their table's top.
        p: the twin's constants.

    Returns:
        The three clocks.

    Raises:
        DvfsError: a clock that is not positive, or a CPU clock at or below the clock other work takes (`cpu_reserved_mhz`).
    """
    if isinstance(config, Setting):
        gpu, cpu, emc = config.gpu_mhz, config.cpu_mhz, config.emc_mhz
    else:
        gpu, cpu, emc = config, None, None
    clocks = Clocks(gpu, p.cpu_max_mhz if cpu is None else cpu, p.emc_max_mhz if emc is None else emc)
    if not (clocks.gpu_mhz > 0 and clocks.emc_mhz > 0 and clocks.cpu_mhz > p.cpu_reserved_mhz):
        raise DvfsError(f"the twin cannot run at GPU {clocks.gpu_mhz:g} / CPU {clocks.cpu_mhz:g} / EMC {clocks.emc_mhz:g} MHz: "
                        f"every clock must be positive and the CPU's above {p.cpu_reserved_mhz:g} MHz")
    return clocks


def host_time_factor(cpu_mhz: FloatOrArray, p: OrinTwinParams) -> FloatOrArray:
    """How much longer the host's work takes at `cpu_mhz` than at the CPU table's top (exactly 1.0 there)."""
    top, reserved = p.cpu_max_mhz, p.cpu_reserved_mhz
    return 1.0 + p.cpu_bound_share * ((top - reserved) / (cpu_mhz - reserved) - 1.0)


def emc_share(emc_mhz: FloatOrArray, p: OrinTwinParams) -> FloatOrArray:
    """The DRAM bandwidth at `emc_mhz` as a share of the bandwidth at the EMC table's top (exactly 1.0 there)."""
    return emc_mhz / p.emc_max_mhz


def cpu_power_scale(cpu_mhz: FloatOrArray, p: OrinTwinParams) -> FloatOrArray:
    """The CPU's switching power at `cpu_mhz` relative to the top: (V(c) / V(c_max))^2 c / c_max (exactly 1.0 there)."""
    return (p.cpu_voltage(cpu_mhz) / p.cpu_voltage(p.cpu_max_mhz)) ** 2 * (cpu_mhz / p.cpu_max_mhz)


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """One training step at one configuration, noise-free.

    Attributes:
        freq_mhz: the GPU clock.
        time_s: the step's time.
        gpu_busy_s: the time the GPU computes.
        host_busy_s: the time the host works (dispatch and per-step overhead).
        gpu_util: gpu_busy_s / time_s (0..1).
        power_by_rail_w: watts per rail (`RAILS`).
        cpu_mhz: the CPU clock (None where the estimate was built without one).
        emc_mhz: the memory clock (None where the estimate was built without one).
    """

    freq_mhz: float
    time_s: float
    gpu_busy_s: float
    host_busy_s: float
    gpu_util: float  # 0..1
    power_by_rail_w: dict[str, float]
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    @property
    def energy_j(self) -> float:
        """CPU + GPU energy, as in the study."""
        return (self.power_by_rail_w["VDD_GPU_SOC"] + self.power_by_rail_w["VDD_CPU_CV"]) * self.time_s

    @property
    def energy_total_j(self) -> float:
        return sum(self.power_by_rail_w.values()) * self.time_s

    @property
    def total_power_w(self) -> float:
        return sum(self.power_by_rail_w.values())

    @property
    def avg_power_w(self) -> float:
        return self.total_power_w


def kernel_durations(trace: StepTrace, f_mhz: float, p: OrinTwinParams, bandwidth_share: float = 1.0) -> np.ndarray:
    """GPU time of each kernel of the trace at GPU clock f (s), with the DRAM at `bandwidth_share` of its top bandwidth."""
    k = trace.kinds == KIND_KERNEL
    peak = p.cuda_cores * p.flops_per_core_cycle * f_mhz * 1e6
    formula = trace.has_flop_formula[k]
    if trace.dtype in ("float16", "bfloat16"):
        peak_per_op = np.where(formula, peak * p.tensor_core_speedup, peak)
    else:
        peak_per_op = np.full(formula.shape, peak)
    eta = np.where(formula, p.eta_compute_flop_ops, p.eta_compute_other)
    compute = trace.flops[k] / (eta * peak_per_op)
    memory = trace.bytes[k] / (p.eta_memory * p.dram_bw_bytes_s * bandwidth_share)
    return np.maximum(compute, memory) + p.kernel_fixed_s * p.max_mhz / f_mhz


def estimate_step(trace: StepTrace, config: Config, p: OrinTwinParams) -> StepEstimate:
    """Simulate the launch queue and the rails for one step of `trace` at `config`.

    Args:
        trace: the step's ops.
        config: a GPU clock in MHz (CPU and EMC at their tops) or a `Setting`.
        p: the twin's constants.

    Returns:
        The step's time, busy times and watts per rail.
    """
    c = resolve(config, p)
    factor = host_time_factor(c.cpu_mhz, p)
    host_cost = np.where(trace.kinds == KIND_KERNEL, p.host_per_kernel_s, p.host_per_view_s) * factor
    launch_done = np.cumsum(host_cost)[trace.kinds == KIND_KERNEL]  # when each kernel is queued
    d = kernel_durations(trace, c.gpu_mhz, p, emc_share(c.emc_mhz, p))
    # end_i = max(launch_i, end_{i-1}) + d_i  ==  S_i + max_{j<=i}(launch_j - S_{j-1})
    s = np.cumsum(d)
    s_prev = np.concatenate(([0.0], s[:-1]))
    end_last = float(s[-1] + np.max(launch_done - s_prev)) if d.size else float(host_cost.sum())
    per_step = p.host_per_step_s * factor
    step_time = end_last + per_step
    busy = float(d.sum())
    host_busy = float(host_cost.sum()) + per_step
    u = min(1.0, busy / step_time)
    dram_share = float(trace.bytes.sum()) / (step_time * p.dram_bw_bytes_s)
    rails = rail_power(c, u, host_busy / step_time, dram_share, p)
    return StepEstimate(c.gpu_mhz, step_time, busy, host_busy, u, rails, c.cpu_mhz, c.emc_mhz)


def rail_terms(gpu_mhz: FloatOrArray, cpu_mhz: FloatOrArray, emc_mhz: FloatOrArray, gpu_util: FloatOrArray,
               host_share: FloatOrArray, dram_share: FloatOrArray, p: OrinTwinParams) -> dict[str, FloatOrArray]:
    """Watts per rail, for scalars or arrays of equal shape (the fit evaluates a whole grid at once).

    Args:
        gpu_mhz, cpu_mhz, emc_mhz: the clocks.
        gpu_util: the share of the time the GPU computes (clipped to 0..1).
        host_share: the share of the time the host works (at most 1).
        dram_share: the DRAM traffic per second as a share of the top bandwidth `dram_bw_bytes_s` (at most 1).
        p: the twin's constants.

    Returns:
        VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 and VDDQ_VDD2_1V8AO (the AGX Orin's rail names for the four terms).
    """
    u = np.minimum(1.0, np.maximum(0.0, gpu_util))
    dyn = p.gpu_k * p.voltage(gpu_mhz) ** 2 * (gpu_mhz / 1000.0)
    gpu_w = p.gpu_static_w + u * dyn + (1.0 - u) * p.gpu_idle_dynamic_share * dyn
    g = cpu_power_scale(cpu_mhz, p)
    cpu_w = p.cpu_base_w * (1.0 + p.cpu_clock_share * (g - 1.0)) + p.cpu_busy_w * np.minimum(1.0, host_share) * g
    ddr_w = p.ddr_base_w * (1.0 + p.ddr_clock_share * (emc_share(emc_mhz, p) - 1.0)) + p.ddr_per_bw_w * np.minimum(1.0, dram_share)
    sys_w = p.sys_5v0_w if np.ndim(gpu_w) == 0 else np.full(np.shape(gpu_w), p.sys_5v0_w)
    return {"VDD_GPU_SOC": gpu_w, "VDD_CPU_CV": cpu_w, "VIN_SYS_5V0": sys_w, "VDDQ_VDD2_1V8AO": ddr_w}


def rail_power(config: Config | Clocks, gpu_util: float, host_share: float, dram_share: float, p: OrinTwinParams) -> dict[str, float]:
    """Watts per rail at `config` with the GPU busy `gpu_util` of the time (0..1), the host `host_share` of it, and DRAM
    traffic at `dram_share` of the top bandwidth."""
    c = config if isinstance(config, Clocks) else resolve(config, p)
    return {rail: float(w) for rail, w in rail_terms(c.gpu_mhz, c.cpu_mhz, c.emc_mhz, gpu_util, host_share, dram_share, p).items()}


@dataclasses.dataclass(frozen=True)
class WorkGrid:
    """A `StepWork` at many configurations (arrays, one entry per configuration).

    Attributes:
        time_s: the step's time.
        gpu_util: the share of it the GPU computes.
        power_by_rail_w: watts per rail.
    """

    time_s: np.ndarray
    gpu_util: np.ndarray
    power_by_rail_w: dict[str, np.ndarray]

    @property
    def total_power_w(self) -> np.ndarray:
        return cast(np.ndarray, sum(self.power_by_rail_w.values()))

    @property
    def energy_total_j(self) -> np.ndarray:
        """Every rail's energy: what a grid measured on all four rails (BoFL's) holds."""
        return self.total_power_w * self.time_s


def overlap(a: FloatOrArray, b: FloatOrArray, order: float) -> FloatOrArray:
    """Two durations that overlap: (a^n + b^n)^(1/n) for n = `order` >= 1 (n = 1: one after the other; large n: max(a, b))."""
    top = np.maximum(a, b)
    safe = np.where(top > 0, top, 1.0)
    return top * ((a / safe) ** order + (b / safe) ** order) ** (1.0 / order)


def work_grid(work: StepWork, gpu_mhz: FloatOrArray, cpu_mhz: FloatOrArray, emc_mhz: FloatOrArray, p: OrinTwinParams) -> WorkGrid:
    """A step described by its aggregate work, at the configurations given as arrays of clocks (MHz).

    The step is the queue's condensed form: the host's serial part, then its dispatch overlapped with the GPU's work,
    that work being the compute time (scaling as 1/f_gpu) overlapped with the memory time (its bytes over the DRAM
    bandwidth at the EMC clock); how much each pair overlaps is the work's own (`StepWork`). Its power is `rail_terms`'.

    Args:
        work: the step's aggregate work.
        gpu_mhz, cpu_mhz, emc_mhz: the clocks, arrays of one shape (or scalars).
        p: the twin's constants.

    Returns:
        Time, GPU load and watts per rail at each configuration.
    """
    gpu, cpu, emc = (np.asarray(x, dtype=float) for x in (gpu_mhz, cpu_mhz, emc_mhz))
    factor = host_time_factor(cpu, p)
    compute = work.gpu_compute_s * p.max_mhz / gpu
    memory = work.dram_bytes / (p.eta_memory * p.dram_bw_bytes_s * emc_share(emc, p))
    gpu_s = overlap(compute, memory, work.kernel_overlap)
    host_serial, host_dispatch = work.host_serial_s * factor, work.host_dispatch_s * factor
    time_s = host_serial + overlap(host_dispatch, gpu_s, work.queue_overlap)
    util = np.minimum(1.0, gpu_s / time_s)
    rails = rail_terms(gpu, cpu, emc, util, (host_serial + host_dispatch) / time_s, work.dram_bytes / (time_s * p.dram_bw_bytes_s), p)
    return WorkGrid(time_s, util, rails)


def estimate_work(work: StepWork, config: Config, p: OrinTwinParams) -> StepEstimate:
    """One step described by its aggregate work (`work_grid`) at one configuration."""
    c = resolve(config, p)
    grid = work_grid(work, c.gpu_mhz, c.cpu_mhz, c.emc_mhz, p)
    time_s, util = float(grid.time_s), float(grid.gpu_util)
    host_busy = (work.host_serial_s + work.host_dispatch_s) * float(host_time_factor(c.cpu_mhz, p))
    return StepEstimate(c.gpu_mhz, time_s, util * time_s, host_busy, util,
                        {rail: float(w) for rail, w in grid.power_by_rail_w.items()}, c.cpu_mhz, c.emc_mhz)


@dataclasses.dataclass(frozen=True)
class MaxnEstimate:
    """The load-tracking default governor on one trace."""

    settled_mhz: float
    ramp_mhz: float | None  # the neighbour clock it dithers to, None at the top of the table
    time_s: float
    energy_j: float
    energy_total_j: float
    gpu_util: float
    power_by_rail_w: dict[str, float]

    @property
    def avg_power_w(self) -> float:
        return sum(self.power_by_rail_w.values())


def estimate_maxn(trace: StepTrace, p: OrinTwinParams, curve: dict[float, StepEstimate] | None = None) -> MaxnEstimate:
    """nvhost_podgov: the highest clock whose load stays >= target, else the lowest, plus ramping (on `curve`: the GPU
    clocks at one CPU and EMC clock, `energy_curve`'s; its tops where not given)."""
    freqs = sorted(p.frequencies_mhz)
    curve = curve or {f: estimate_step(trace, f, p) for f in freqs}
    busy_enough = [f for f in freqs if curve[f].gpu_util >= p.maxn_load_target]
    settled = max(busy_enough) if busy_enough else freqs[0]
    idx = freqs.index(settled)
    ramp = freqs[idx + 1] if idx + 1 < len(freqs) else None
    w = p.maxn_ramp_share if ramp is not None else 0.0
    a, b = curve[settled], curve[ramp] if ramp is not None else curve[settled]
    time_s = (1 - w) * a.time_s + w * b.time_s
    energy = (1 - w) * a.energy_j + w * b.energy_j
    energy_total = (1 - w) * a.energy_total_j + w * b.energy_total_j
    util = (1 - w) * a.gpu_util + w * b.gpu_util
    rails = {r: ((1 - w) * a.power_by_rail_w[r] * a.time_s + w * b.power_by_rail_w[r] * b.time_s) / time_s for r in RAILS}
    return MaxnEstimate(settled, ramp, time_s, energy, energy_total, util, rails)


def energy_curve(trace: StepTrace, p: OrinTwinParams, cpu_mhz: float | None = None,
                 emc_mhz: float | None = None) -> dict[float, StepEstimate]:
    """The step at every GPU clock of the table, with the CPU and EMC at `cpu_mhz` and `emc_mhz` (None: their tops)."""
    return {f: estimate_step(trace, Setting(f, cpu_mhz, emc_mhz), p) for f in p.frequencies_mhz}


# --- Which energy a comparison of GPU-only and joint (GPU, CPU, EMC) policies uses, per board -------------------------
# Tuning the CPU or the memory clock moves power on the rails those clocks feed, so a joint policy is judged on an energy
# that holds them, and the GPU-only policy beside it on the same one:
# - AGX Orin (VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO): the GPU/SoC rail (the memory controller is in the
#   SoC), VDD_CPU_CV for the CPU, VDDQ_VDD2_1V8AO for the DRAM. VIN_SYS_5V0 feeds VDDQ_VDD2_1V8AO (energymon/energymon
#   jetson/JetsonPowerRails.md, "AGX Orin Series", after the NVIDIA forum thread "Jetson AGX Orin INA3221 power monitor
#   layout"), so it is not added: the DRAM would count twice, and its other loads follow no clock.
# - Orin NX / Orin Nano (VDD_IN, VDD_CPU_GPU_CV, VDD_SOC): the DRAM has no rail of its own; VDD_IN, the module's input,
#   feeds it and every other rail, so the energy is VDD_IN's. The CPU's clock shows on VDD_CPU_GPU_CV.
# - AGX Xavier (jetson-stats' names GPU, CPU, SOC, CV, VDDRQ, SYS5V): the four rails BoFL's grid sums (GPU, CPU, DDR as
#   VDDRQ, SYS5V; benchmarks/data/public/README.md), so a replayed grid and a metered run compare.
@dataclasses.dataclass(frozen=True)
class JointEnergy:
    """The energy a comparison of GPU-only and joint policies uses on one board.

    Attributes:
        board: the rail set's board, in words.
        rails: the rails summed.
        cpu_rails: the rails the CPU clock's power shows on.
        dram_rails: the rails the memory (EMC) clock's DRAM power shows on.
    """

    board: str
    rails: tuple[str, ...]
    cpu_rails: tuple[str, ...]
    dram_rails: tuple[str, ...]

    def total(self, by_rail: Mapping[str, Any]) -> Any:
        """The sum of `rails` in `by_rail` (joules or watts per rail)."""
        return sum(by_rail[r] for r in self.rails)


_JOINT_ENERGY = (
    JointEnergy("AGX Orin", ("VDD_GPU_SOC", "VDD_CPU_CV", "VDDQ_VDD2_1V8AO"), ("VDD_CPU_CV",), ("VDDQ_VDD2_1V8AO",)),
    JointEnergy("Orin NX / Orin Nano", ("VDD_IN",), ("VDD_CPU_GPU_CV",), ("VDD_IN",)),
    JointEnergy("AGX Xavier", ("GPU", "CPU", "VDDRQ", "SYS5V"), ("CPU",), ("VDDRQ",)),
)


def joint_energy(rails: Iterable[str]) -> JointEnergy:
    """Which rails a GPU-only and a joint policy are both judged on, on the board whose meter reads `rails`.

    Args:
        rails: the rail names the board's meter reads (a twin's: `RAILS`).

    Returns:
        The rule of the first board whose rails are all among `rails`.

    Raises:
        DvfsError: no board's rule fits the rail set (one rail of a discrete GPU cannot hold the CPU's or the DRAM's power).
    """
    names = set(rails)
    for rule in _JOINT_ENERGY:
        if set(rule.rails) | set(rule.cpu_rails) | set(rule.dram_rails) <= names:
            return rule
    raise DvfsError(f"no rail among {', '.join(sorted(names)) or 'none'} carries the CPU's and the DRAM's power, so GPU-only and "
                    "joint policies cannot be compared on one energy here; compare them on a Jetson's rails or a replayed grid")
