"""Time and power of a step trace on the twin at a given GPU clock.

Timing is a two-resource queue: the host dispatches ops one after another (15 us per kernel,
3 us per view op); kernel i starts at max(its launch time, end of kernel i-1) and runs for
max(compute, memory) + a fixed cost that scales as 1/f. That single rule makes small models
launch-bound (time barely falls with f, low utilisation) and large ones compute-bound.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.trace import KIND_KERNEL, StepTrace

RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """One training step at one clock, noise-free."""

    freq_mhz: float
    time_s: float
    gpu_busy_s: float
    host_busy_s: float
    gpu_util: float  # 0..1
    power_by_rail_w: dict[str, float]

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


def kernel_durations(trace: StepTrace, f_mhz: float, p: OrinTwinParams) -> np.ndarray:
    """GPU time of each kernel of the trace at clock f (s)."""
    k = trace.kinds == KIND_KERNEL
    peak = p.cuda_cores * p.flops_per_core_cycle * f_mhz * 1e6
    formula = trace.has_flop_formula[k]
    if trace.dtype in ("float16", "bfloat16"):
        peak_per_op = np.where(formula, peak * p.tensor_core_speedup, peak)
    else:
        peak_per_op = np.full(formula.shape, peak)
    eta = np.where(formula, p.eta_compute_flop_ops, p.eta_compute_other)
    compute = trace.flops[k] / (eta * peak_per_op)
    memory = trace.bytes[k] / (p.eta_memory * p.dram_bw_bytes_s)
    return np.maximum(compute, memory) + p.kernel_fixed_s * p.max_mhz / f_mhz


def estimate_step(trace: StepTrace, f_mhz: float, p: OrinTwinParams) -> StepEstimate:
    """Simulate the launch queue and the rails for one step at clock f."""
    host_cost = np.where(trace.kinds == KIND_KERNEL, p.host_per_kernel_s, p.host_per_view_s)
    launch_done = np.cumsum(host_cost)[trace.kinds == KIND_KERNEL]  # when each kernel is queued
    d = kernel_durations(trace, f_mhz, p)
    # end_i = max(launch_i, end_{i-1}) + d_i  ==  S_i + max_{j<=i}(launch_j - S_{j-1})
    s = np.cumsum(d)
    s_prev = np.concatenate(([0.0], s[:-1]))
    end_last = float(s[-1] + np.max(launch_done - s_prev)) if d.size else float(host_cost.sum())
    step_time = end_last + p.host_per_step_s
    busy = float(d.sum())
    host_busy = float(host_cost.sum()) + p.host_per_step_s
    return _with_power(trace, f_mhz, step_time, busy, host_busy, p)


def rail_power(f_mhz: float, gpu_util: float, host_share: float, dram_share: float, p: OrinTwinParams) -> dict[str, float]:
    """Watts per rail at clock f with the GPU busy `gpu_util` of the time (0..1)."""
    u = min(1.0, max(0.0, gpu_util))
    dyn = p.gpu_k * p.voltage(f_mhz) ** 2 * (f_mhz / 1000.0)
    gpu_w = p.gpu_static_w + u * dyn + (1.0 - u) * p.gpu_idle_dynamic_share * dyn
    cpu_w = p.cpu_base_w + p.cpu_busy_w * min(1.0, host_share)
    ddr_w = p.ddr_base_w + p.ddr_per_bw_w * min(1.0, dram_share)
    return {"VDD_GPU_SOC": gpu_w, "VDD_CPU_CV": cpu_w, "VIN_SYS_5V0": p.sys_5v0_w, "VDDQ_VDD2_1V8AO": ddr_w}


def _with_power(trace: StepTrace, f_mhz: float, step_time: float, busy: float, host_busy: float, p: OrinTwinParams) -> StepEstimate:
    u = min(1.0, busy / step_time)
    dram_share = float(trace.bytes.sum()) / (step_time * p.dram_bw_bytes_s)
    rails = rail_power(f_mhz, u, host_busy / step_time, dram_share, p)
    return StepEstimate(f_mhz, step_time, busy, host_busy, u, rails)


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
    """nvhost_podgov: the highest clock whose load stays >= target, else the lowest, plus ramping."""
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


def energy_curve(trace: StepTrace, p: OrinTwinParams) -> dict[float, StepEstimate]:
    return {f: estimate_step(trace, f, p) for f in p.frequencies_mhz}
